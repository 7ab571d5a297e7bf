/*
 * peer.h - peer_ops, the table by which route/ reaches whoever a session's output goes to: a
 * client's connection (conn/) or a bridge's (bridge/), both above it. route/ (writer.c,
 * delivery.c, session.c) is the lowest layer that calls through it, so it is declared here.
 */
#ifndef WEFT_MQTT_PEER_H
#define WEFT_MQTT_PEER_H

#include <stdint.h>
#include <sys/types.h>

#include "msg.h"
#include "records.h"

/* What route/ needs of whoever a session's output goes to (s->conn->peer). route/ sits below
 * the connections (conn/) and the bridges (bridge/) and reaches them only through this table:
 * one indirect call where a direct call was (a flush's write, a take-over's kick). A client's
 * table is conn.c's (conn_client_peer); a bridge's is bridge.c's, which maps topics. */
typedef struct peer_ops {
	/* write to the socket as weft_write does (conn_write) */
	ssize_t (*write)(struct conn *c, const void *buf, size_t n, int64_t deadline);
	/* out[], taken whole, as it goes to the socket (conn_frame) */
	uint8_t *(*frame)(struct conn *c, uint8_t *buf, size_t *len);
	/* ask the connection to end (conn_kick) */
	void (*kick)(struct conn *c, int reason);
	/* an outgoing PUBLISH's topic in the peer's terms and its retain flag: 0, or -1 when it
	 * cannot be sent (bridge_out_topic). NULL: the topic as it is. */
	int (*out_topic)(struct conn *c, const msg *m, const char **topic, uint16_t *tlen,
			 char **mapped, int *retain);
} peer_ops;

#endif
