/*
 * broker.h - the program's glue: what main.c calls of the files on top of the layers (config.c,
 * restore.c, sys.c, metrics.c). Nothing in a folder includes it.
 *
 * The folders are layers, lowest first; a folder uses only the folders below it, and includes
 * only their headers (apps/mqtt/tests/layers.sh checks both; docs/weft-mqtt.md, "Folders"):
 *
 *   wire/    codec.h: the protocol's bytes, no broker state
 *   base/    conf.h, pool.h, msg.h, epoch.h, scratch.h, stats.h, ratelimit.h, textfile.h, and
 *            records.h: the session and connection records the layers above share
 *   access/  access.h (the broker's questions), acl.h, auth.h
 *   persist/ persist.h (what goes to the store, when acknowledgements wait), store.h,
 *            store_queue.h
 *   route/   peer.h (peer_ops), session.h, topic.h, retained.h
 *   conn/    conn_public.h (conn_role, serving a client, a bridge's connection), conn.h (conn/'s
 *            own), tls.h, ws.h
 *   bridge/  bridge.h, bridge_conf.h
 *   top      main.c, config.c, metrics.c, sys.c, restore.c: this header
 *
 * Where a lower layer must reach a higher one, it calls through a table the higher one fills,
 * declared in the lowest layer that calls through it: msg_stored_release (base/msg.h: base/ ->
 * persist/), peer_ops (route/peer.h: route/ -> a session's connection, a client's or a
 * bridge's), conn_role (conn/conn_public.h: conn/ -> a client's or a bridge's role).
 */
#ifndef WEFT_MQTT_BROKER_H
#define WEFT_MQTT_BROKER_H

#include "conf.h"

#define WEFT_MQTT_VERSION "weft-mqtt 0.1.0"

/* config.c: parse a mosquitto-syntax file. 0, or -1 with a message "file:line: ..." on
 * stderr. */
int conf_load(broker_conf *c, const char *path);
/* config.c: parse the command line; returns 0 to run, 1 when --help/--version was handled, -1
 * on error. */
int conf_args(broker_conf *c, int argc, char **argv);

/* restore.c: at start, open the store and rebuild the sessions, subscriptions, queues, wills
 * and retained messages it holds: 0, or -1 with a message. */
int restore_open(void);

/* sys.c: the $SYS publisher task's body (runs until shutdown). */
void stats_task(void *arg);

/* metrics.c: listen on conf.metrics_port (when set) and serve GET /metrics: 0, or -1 with a
 * message. */
int metrics_start(void);
/* Stop listening and wait for the clients being served (their sockets are shut). */
void metrics_stop(void);

#endif
