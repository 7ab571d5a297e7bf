/*
 * conn_public.h - what the layers above conn/ (bridge/, the program) see of it: serving a
 * client, a bridge's connection and the role table, ending connections. What conn/'s files
 * share among themselves is conn.h.
 *
 * conn_role is declared here because conn/'s read loop (loop.c, handle_*.c) is the lowest
 * code that calls through it; bridge/ fills one.
 */
#ifndef WEFT_MQTT_CONN_PUBLIC_H
#define WEFT_MQTT_CONN_PUBLIC_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <weft.h>

#include "codec.h"
#include "records.h"
#include "peer.h"

/* What conn/'s read loop asks of a connection's role: a client's (conn.c, conn_client_role)
 * or a bridge's (bridge.c: we are the client of a remote broker). conn/ sits below bridge/ and
 * calls it only through this table, instead of branching on "is it a bridge". */
#define CONN_PASS 2
typedef struct conn_role {
	/* max_publish_rate applies to what the peer publishes */
	bool publish_rate;
	/* a packet after the CONNECT/CONNACK prelude: CONN_PASS to handle it as a client's, 0
	 * when handled, or a negative reason code. NULL: every packet is a client's. */
	int (*on_packet)(struct conn *c, const mq_packet *pk);
	/* required: an incoming PUBLISH's topic: whether it may be published (false: dropped, counted and
	 * acknowledged as not authorized); *topic, *tlen replaced when it is mapped (*mapped
	 * then holds memory to free) */
	bool (*in_topic)(struct conn *c, const uint8_t **topic, uint16_t *tlen, char **mapped);
	/* keep-alive (c->keep_alive set), both required: when to wake without input, last being
	 * when bytes last came in; and on waking then, 0 to go on (a PINGREQ was sent) or -1 to
	 * end */
	int64_t (*keepalive_deadline)(struct conn *c, int64_t last);
	int (*keepalive_expired)(struct conn *c, int64_t last);
	/* the last packets when the broker stops (written to out, cap bytes; their length).
	 * NULL: a 5.0 DISCONNECT with the reason, as for any end. */
	size_t (*goodbye)(struct conn *c, uint8_t *out, size_t cap);
} conn_role;

/* A connection to a remote broker (bridge.c), its CONNACK already read, with the bridge's peer
 * and role; registered like an accepted one and not yet running. NULL when out of memory. */
struct bridge;
conn *conn_open_bridge(int fd, struct tls_conn *t, struct bridge *b, int version,
		       uint16_t keep_alive, const peer_ops *peer, const conn_role *role);
/* Run c's read loop in the calling task until the connection ends (c is freed then); with no
 * session attached (c->s NULL), only end it. */
void conn_run(conn *c);
extern const peer_ops conn_client_peer;
extern const conn_role conn_client_role;
/* Serve a client on fd (accepted from a listener speaking `protocol`, over TLS when tls is
 * not NULL) in a task of its own. */
struct tls_ctx;
void conn_serve(int fd, int protocol, struct tls_ctx *tls);
/* Write to c's socket (through TLS on a TLS listener) as weft_write does. */
ssize_t conn_write(conn *c, const void *buf, size_t n, int64_t deadline);
/* What goes to the socket from out[] (taken whole, from the pool): as it is, or for a WebSocket
 * client in one binary frame (a new pool buffer; buf is freed). *len is updated. */
uint8_t *conn_frame(conn *c, uint8_t *buf, size_t *len);
void conns_shutdown(void);
long conns_count(void);
/* Ask c to end (session take-over, shutdown): its task sees the socket shut (kick.c). */
void conn_kick(conn *c, int reason);
/* Wait until `until` (weft_now's clock), holding nothing of the broker but the connection,
 * unless it is kicked or its task cancelled: 0, or -1 when it is to end (kick.c). */
int conn_nap_until(conn *c, int64_t until);

#endif
