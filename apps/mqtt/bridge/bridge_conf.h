/*
 * bridge_conf.h - a bridge as configured (bridge_conf.c parses mosquitto's "connection" blocks
 * into it) and as it runs (bridge.c: its task, its connection's role and peer). Only bridge/
 * sees it; the rest of the broker sees bridge.h.
 */
#ifndef WEFT_MQTT_BRIDGE_CONF_H
#define WEFT_MQTT_BRIDGE_CONF_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <weft.h>

#include "bridge.h"
#include "tls.h"

#define MAX_BRIDGES 64
#define MAX_ADDRS 8

enum { DIR_OUT = 1, DIR_IN = 2, DIR_BOTH = 3 };

typedef struct btopic {
	int dir, qos;
	char *lprefix, *rprefix; /* NULL: none */
	char *local, *remote;    /* the filters on each side: prefix + pattern */
	size_t nlocal, nremote;  /* their lengths, matched against every message */
} btopic;

typedef struct bridge {
	char *name;
	int line;                /* of its connection line, for errors found at the end */
	char *host[MAX_ADDRS];
	int port[MAX_ADDRS];
	int naddr;
	btopic *topics;
	int ntopics;
	char *remote_user, *remote_pass, *remote_id, *local_id, *notif_topic;
	int clean, local_clean;  /* local_clean -1: as clean */
	int keepalive, version, try_private, notifications, notif_local_only;
	int restart_base, restart_cap; /* seconds; cap 0: constant */
	char *cafile, *capath, *certfile, *keyfile;
	int insecure, tls_version, outgoing_retain, attempt_unsubscribe;
	long max_packet;
	/* running */
	tls_ctx *tls[MAX_ADDRS]; /* per address: each checks its own host name */
	weft_task *task;
	int cur;                 /* the address tried next */
	int wait_s;              /* the back-off's current wait */
	uint32_t seed;
	int64_t ping_at;         /* a PINGREQ unanswered since (only the bridge's task) */
	atomic_int retain_ok;    /* the remote takes retained messages (a 5.0 CONNACK may say no) */
	atomic_int connected;
	_Atomic uint64_t msgs_in, msgs_out, connects, failures;
} bridge;

/* every configured bridge, in the order of the file (bridge_conf.c fills it before start) */
extern bridge *bridges[MAX_BRIDGES];
extern int nbridges;

#endif
