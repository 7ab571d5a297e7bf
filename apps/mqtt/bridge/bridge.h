/*
 * bridge.h - bridges: weft-mqtt as a client of another broker (bridge.c; the options and the
 * design are in docs/weft-mqtt-bridges.md).
 *
 * A bridge's connection is a conn (conn.c) like a client's, whose role (conn_role) and peer
 * (peer_ops) are bridge.c's: after the CONNECT/CONNACK prelude it speaks the same packets both
 * ways, so conn/ and route/ run it and call those tables where a bridge differs (topic
 * remapping, no ACL, keep-alive pings, the acknowledgements a server sends).
 */
#ifndef WEFT_MQTT_BRIDGE_H
#define WEFT_MQTT_BRIDGE_H

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

/* metrics.c: the bridges' lines of the Prometheus text (malloc'd), or NULL when none. */
char *bridge_metrics_text(void);

#endif
