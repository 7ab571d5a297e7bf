/*
 * handle_disconnect.c - a client's DISCONNECT: the end of the connection it asks for. A 5.0
 * client may change its session's expiry interval here (not from 0 [MQTT-3.14.2-2]) and ask
 * for its will to be published all the same (reason 0x04); otherwise a DISCONNECT discards
 * the will. Returns 1 (the read loop ends the connection) or a negative reason code.
 */
#include <stdbool.h>

#include <weft.h>

#include "codec.h"
#include "conn.h"
#include "records.h"

int handle_disconnect(conn *c, const mq_packet *pk, bool *will)
{
	if (c->version == 5 && MQ_HAS(&pk->props, MQ_P_SESSION_EXPIRY)) {
		session *s = c->s;
		bool bad = false;
		WEFT_WITH_LOCK(&s->lock) {
			if (s->expiry_interval == 0 && pk->props.session_expiry)
				bad = true; /* [MQTT-3.14.2-2] */
			else
				s->expiry_interval = pk->props.session_expiry;
		}
		if (bad)
			return -MQ_RC_PROTOCOL_ERROR;
	}
	*will = c->version == 5 && pk->reason == MQ_RC_DISCONNECT_WITH_WILL;
	return 1;
}
