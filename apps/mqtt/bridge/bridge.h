/*
 * bridge.h - bridges: weft-mqtt as a client of another broker (bridge.c; the options and the
 * design are in docs/weft-mqtt-bridges.md).
 *
 * A bridge's connection is a conn (conn.c) like a client's, with c->bridge set: after the
 * CONNECT/CONNACK prelude it speaks the same packets both ways, so conn.c and session.c run it
 * and call the hooks below where a bridge differs (topic remapping, no ACL, keep-alive pings,
 * the acknowledgements a server sends).
 */
#ifndef WEFT_MQTT_BRIDGE_H
#define WEFT_MQTT_BRIDGE_H

#include "broker.h"

struct bridge;
struct tls_conn;

/* ---- configuration (config.c hands the lines over) ----------------------------------------- */

/* One configuration line: 1 when it is not a bridge option (config.c goes on), 0 when taken,
 * -1 after printing "file:line: ..." on stderr. */
int bridge_option(const char *file, int line, char **w, int nw);
/* After the whole file: every bridge complete (an address, a topic). 0, or -1 with a message. */
int bridge_conf_end(const char *file);

/* ---- running (main.c) ------------------------------------------------------------------------ */

/* Start a task per configured bridge: 0, or -1 with a message (a bad TLS file, ...). */
int bridges_start(void);
/* At shutdown, after conns_shutdown(): stop reconnecting, wait for the tasks, free all. */
void bridges_stop(void);

/* ---- hooks in conn.c and session.c ----------------------------------------------------------- */

/* conn.c: a connection to a remote broker, its CONNACK already read; registered like an
 * accepted one and not yet running. NULL when out of memory. */
conn *conn_open_bridge(int fd, struct tls_conn *t, struct bridge *b, int version,
		       uint16_t keep_alive);
/* Run c's read loop in the calling task until the connection ends (c is freed then); with no
 * session attached (c->s NULL), only end it. */
void conn_run(conn *c);

#define BRIDGE_PASS 2
/* A packet from the remote: BRIDGE_PASS when conn.c handles it as a client's (PUBLISH and
 * the acknowledgements), 0 when handled here (SUBACK, UNSUBACK, PINGRESP), or a negative
 * reason code for one a server must not send. */
int bridge_packet(conn *c, const mq_packet *pk);
/* An incoming PUBLISH's topic in local terms: *topic and *tlen replaced when a prefix maps
 * it (*mapped then holds memory to free). Counts the message. */
void bridge_in_topic(conn *c, const uint8_t **topic, uint16_t *tlen, char **mapped);
/* An outgoing PUBLISH's topic in remote terms, as above, and its retain flag. 0, or -1 when
 * the topic cannot be sent (too long once mapped). Counts the message. */
int bridge_out_topic(conn *c, const msg *m, const char **topic, uint16_t *tlen, char **mapped,
		     int *retain);
/* Keep-alive as a client: when to wake without input (last: when bytes last came in), and on
 * waking, send a PINGREQ (0) or give up because the last one went unanswered (-1). */
int64_t bridge_ping_deadline(conn *c, int64_t last);
int bridge_ping(conn *c, int64_t last);
/* The last packets of a clean stop (the broker shutting down): the "0" notification and a
 * DISCONNECT, written to out (cap bytes). Returns their length. */
size_t bridge_goodbye(conn *c, uint8_t *out, size_t cap);

/* metrics.c: the bridges' lines of the Prometheus text (malloc'd), or NULL when none. */
char *bridge_metrics_text(void);

#endif
