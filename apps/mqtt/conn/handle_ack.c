/*
 * handle_ack.c - the acknowledgements of QoS 1 and 2: PUBACK, PUBREC and PUBCOMP from the
 * client for what the broker sent (the session's inflight window, delivery.c), and PUBREL for
 * what the client sent (the inbound QoS 2 id, answered with PUBCOMP).
 */
#include <stdbool.h>

#include "codec.h"
#include "conn.h"
#include "persist.h"
#include "records.h"
#include "session.h"

int handle_puback(conn *c, const mq_packet *pk)
{
	session_puback(c->s, pk->packet_id, c);
	return 0;
}

int handle_pubrec(conn *c, const mq_packet *pk)
{
	session_pubrec(c->s, pk->packet_id, pk->reason, c);
	return 0;
}

/* PUBCOMP once the id is forgotten on disk too (an unknown one by an earlier write, maybe): the
 * client may reuse it, and a stale id would swallow its next message. */
int handle_pubrel(conn *c, const mq_packet *pk)
{
	bool had = session_rel_del(c->s, pk->packet_id);
	if (had)
		persist_rel(c->s, pk->packet_id, false, c);
	ack_earlier(c, MQ_PUBCOMP, pk->packet_id, had ? 0 : MQ_RC_PACKET_ID_NOT_FOUND);
	return 0;
}

int handle_pubcomp(conn *c, const mq_packet *pk)
{
	session_pubcomp(c->s, pk->packet_id, c);
	return 0;
}
