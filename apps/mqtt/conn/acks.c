/*
 * acks.c - the acknowledgements of a connection's PUBLISHes and PUBRELs (PUBACK, PUBREC,
 * PUBCOMP), held until what they vouch for is durable.
 *
 * With persistence off an acknowledgement goes to the session's output at once. With it on it
 * waits in c->acks for the end of the batch; then acks_release waits once for the store
 * (persist_wait: the batch's highest ticket) and sends them in order, as MQTT wants PUBACKs in
 * the order of their PUBLISHes: one fsync, shared with every connection waiting at the same
 * time, covers the whole batch. If the store failed none is sent, and the client sends the
 * messages again. The rule and the store's side are in persist.c.
 */
#include <stddef.h>
#include <stdint.h>

#include "codec.h"
#include "conn.h"
#include "persist.h"
#include "records.h"
#include "scratch.h"
#include "session.h"

static void send_ack(conn *c, int type, uint16_t pid, int rc)
{
	uint8_t b[8];
	session_send(c->s, b, mq_enc_ack(b, c->version, type, pid, rc, NULL), c);
}

/* A PUBLISH's acknowledgement. With persistence on it waits in c->acks for the end of the
 * batch, when what the batch wrote to the store is durable; in order, since MQTT wants
 * PUBACKs in the order of their PUBLISHes. */
typedef struct held_ack {
	uint8_t type, rc;
	uint16_t pid;
} held_ack;

void ack_pub(conn *c, int type, uint16_t pid, int rc)
{
	if (!persist_on) {
		send_ack(c, type, pid, rc);
		return;
	}
	held_ack *v = scratch_grow(&c->acks, sizeof *v, c->acks.n + 1);
	v[c->acks.n++] = (held_ack){ (uint8_t)type, (uint8_t)rc, pid };
}

/* End of a batch with persistence on: wait for the store, then acknowledge. -1 when the
 * store failed: nothing is acknowledged (the client will send the messages again). */
int acks_release(conn *c)
{
	int r = persist_wait(c);
	held_ack *v = c->acks.v;
	for (uint32_t i = 0; r == 0 && i < c->acks.n; i++)
		send_ack(c, v[i].type, v[i].pid, v[i].rc);
	c->acks.n = 0;
	return r < 0 ? -1 : 0;
}

/* An acknowledgement whose write was made by an earlier batch (persist_cover_earlier says
 * why every write so far covers it): held like any other. */
void ack_earlier(conn *c, int type, uint16_t pid, int rc)
{
	persist_cover_earlier(c);
	ack_pub(c, type, pid, rc);
}
