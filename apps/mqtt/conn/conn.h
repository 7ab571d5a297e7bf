/*
 * conn.h - what the files of conn/ share among themselves; the layers above see conn/ through
 * conn_public.h (conn_serve, conn_kick, the role table...). See conn.c for which file does
 * what.
 */
#ifndef WEFT_MQTT_CONN_H
#define WEFT_MQTT_CONN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "codec.h"
#include "conn_public.h"
#include "records.h"

/* conn.c */
/* The largest packet a connected client may send: the message size limit and room for a
 * PUBLISH's topic and properties, or what the protocol allows. */
uint32_t conn_in_packet_limit(void);
/* Tear c down (rc: the reason a 5.0 client is told; will: publish the will) and free it. */
void conn_end(conn *c, int rc, bool will);

/* loop.c: the body of a connection's task (arg: the conn), until it ends. */
void conn_read_loop(void *arg);

/* output.c */
/* Write p now, outside the session's output (before CONNECT is accepted): framed for
 * WebSockets. */
void conn_write_now(conn *c, const void *p, size_t n);
/* A packet to the client: in its session's output, or at once when there is no session. */
void conn_send(conn *c, const void *p, size_t n);
/* Send what the WebSocket layer must answer itself (the upgrade, a pong, a close). */
void conn_ws_reply(conn *c);
/* A WebSocket client's last frame, once the upgrade is done. */
void conn_ws_close(conn *c);

/* handle_*.c: one per packet, after CONNECT; 0 to go on, 1 to end the connection as asked
 * (DISCONNECT), or a negative reason code to end it with. handle_connect: 0, or -1 once
 * refused (held: the read buffer the CONNECT is in, kept while its password waits). */
int handle_connect(conn *c, mq_packet *pk, size_t held);
int handle_publish(conn *c, mq_packet *pk);
int handle_puback(conn *c, const mq_packet *pk);
int handle_pubrec(conn *c, const mq_packet *pk);
int handle_pubrel(conn *c, const mq_packet *pk);
int handle_pubcomp(conn *c, const mq_packet *pk);
int handle_subscribe(conn *c, mq_packet *pk);
int handle_unsubscribe(conn *c, mq_packet *pk);
int handle_pingreq(conn *c);
int handle_disconnect(conn *c, const mq_packet *pk, bool *will);
/* A client's PUBLISH topic: not the broker's own $SYS, and as its ACL allows (its role's
 * in_topic). */
bool conn_client_in_topic(conn *c, const uint8_t **topic, uint16_t *tlen, char **mapped);

/* output.c, login.c */
/* A CONNACK refusing the connection (before any session): rc5 for 5.0, rc3 for 3.1.1. */
void conn_refuse(conn *c, int version, int rc5, int rc3);
/* Establish who pk's client is (password file, certificate, anonymous), waiting for its
 * password's turn (pace.c) while keeping `held` bytes: 0, or -1 once refused (CONNACK sent)
 * or kicked (login.c). Sets c->user and c->user_proven. */
int conn_login(conn *c, const mq_packet *pk, long held);

/* acks.c */
/* A PUBACK, PUBREC or PUBCOMP of c's: sent at once with persistence off, else held until the
 * end of the batch; then acks_release waits for the batch's writes and sends them in order
 * (0), or, the store failed, sends none (-1). */
void ack_pub(struct conn *c, int type, uint16_t pid, int rc);
int acks_release(struct conn *c);
/* ack_pub for a PUBREC of a resent QoS 2 PUBLISH, or a PUBCOMP of a PUBREL for an id not
 * known: what it vouches for was written by an earlier batch, so it waits for every write
 * made so far, not only its own batch's. */
void ack_earlier(struct conn *c, int type, uint16_t pid, int rc);

#endif
