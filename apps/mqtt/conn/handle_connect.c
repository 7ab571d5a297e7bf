/*
 * handle_connect.c - a client's CONNECT: who it is (login.c), the protocol's checks (keep-alive,
 * will size, a persistent session only while the store can keep it), the session it gets
 * (session_attach: new, resumed, or taken over from another connection), its will and its ACL
 * binding, and the CONNACK with what the broker grants (receive maximum, topic aliases,
 * keep-alive, packet size). Anything refused is answered with a CONNACK saying why and ends
 * the connection.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include <weft.h>

#include "access.h"
#include "acl.h"
#include "codec.h"
#include "conf.h"
#include "conn.h"
#include "msg.h"
#include "persist.h"
#include "records.h"
#include "session.h"
#include "stats.h"

#define IN_ALIAS_MAX 10       /* topic aliases a client may set (as mosquitto) */

/* held: the read buffer the CONNECT is in, which a wait for its password's turn keeps */
int handle_connect(conn *c, mq_packet *pk, size_t held)
{
	int v = pk->connect.version;
	c->version = (uint8_t)v;
	c->peer_bridge = pk->connect.bridge;
	if (conn_login(c, pk, (long)held) < 0)
		return -1;
	if (v == 5 && MQ_HAS(&pk->props, MQ_P_AUTH_METHOD)) {
		conn_refuse(c, v, MQ_RC_BAD_AUTH_METHOD, MQ_V3_NOT_AUTHORIZED);
		return -1;
	}
	if (v < 5 && pk->connect.client_id.len == 0 && !pk->connect.clean) {
		conn_refuse(c, v, MQ_RC_CLIENT_ID_INVALID, MQ_V3_ID_REJECTED);
		return -1;
	}
	uint16_t ka = pk->connect.keep_alive;
	bool ka_changed = false;
	if (conf.max_keepalive && (ka == 0 || ka > conf.max_keepalive)) {
		if (v < 5) {
			conn_refuse(c, v, 0, MQ_V3_ID_REJECTED);
			return -1;
		}
		ka = (uint16_t)conf.max_keepalive;
		ka_changed = true;
	}
	if (conf.message_size_limit && pk->connect.will &&
	    pk->connect.will_payload.len > conf.message_size_limit) {
		conn_refuse(c, v, MQ_RC_PACKET_TOO_LARGE, MQ_V3_UNAVAILABLE);
		return -1;
	}
	bool persistent = v == 5 ? pk->props.session_expiry > 0 : !pk->connect.clean;
	if (persistent && !persist_ok()) { /* its state could not be kept: until the store can */
		conn_refuse(c, v, MQ_RC_SERVER_UNAVAILABLE, MQ_V3_UNAVAILABLE);
		return -1;
	}
	c->keep_alive = ka;
	msg *will = NULL;
	if (pk->connect.will) {
		mq_props *wp = &pk->connect.will_props;
		will = msg_new(pk->connect.will_topic.p, (uint16_t)pk->connect.will_topic.len,
			       &wp->raw, pk->connect.will_payload.p, pk->connect.will_payload.len,
			       pk->connect.will_qos, pk->connect.will_retain, 0);
	}
	bool present = false;
	int why;
	session *s = session_attach(c, (const char *)pk->connect.client_id.p,
				    (uint16_t)pk->connect.client_id.len, pk->connect.clean, &present,
				    &why);
	if (!s) {
		msg_unref(will);
		if (conf.verbose && why == MQ_RC_NOT_AUTHORIZED)
			fprintf(stderr, "weft-mqtt: CONNECT refused (client id %.*s belongs to "
					"another user)\n",
				(int)pk->connect.client_id.len, pk->connect.client_id.p);
		conn_refuse(c, v, why,
		       why == MQ_RC_NOT_AUTHORIZED ? MQ_V3_NOT_AUTHORIZED : MQ_V3_UNAVAILABLE);
		return -1;
	}
	c->s = s;
	if (access_acl_on) {
		access_bind(s, c->user, c->user_len);
		/* a will to a topic the client may not write is dropped, as its PUBLISH would be */
		if (will && !acl_check(access_binding(s), will->topic, will->topic_len,
				       ACL_WRITE)) {
			msg_unref(will);
			will = NULL;
		}
	}
	uint16_t window = (uint16_t)conf.max_inflight_messages;
	if (v == 5 && pk->props.receive_max && pk->props.receive_max < window)
		window = pk->props.receive_max;
	WEFT_WITH_LOCK(&s->lock) {
		s->version = (uint8_t)v;
		s->expiry_interval = v == 5 ? pk->props.session_expiry
					    : (pk->connect.clean ? 0 : UINT32_MAX);
		s->window = window ? window : 1;
		s->max_packet = v == 5 ? pk->props.max_packet_size : 0;
		msg_unref(s->will);
		s->will = will;
		s->will_delay = pk->connect.will_props.will_delay;
		s->will_expiry = pk->connect.will_props.message_expiry;
		if (!present)
			s->nrel = 0;
		persist_session(s, true, c);
	}
	c->out_alias_max = v == 5 ? pk->props.topic_alias_max : 0;
	if (c->out_alias_max > 64)
		c->out_alias_max = 64;
	c->in_alias_max = v == 5 ? IN_ALIAS_MAX : 0;
	c->max_in_packet = conn_in_packet_limit();

	uint8_t pb_buf[128 + 64], pkt[256];
	mq_pb pb = { pb_buf, 0, sizeof pb_buf, 0 };
	if (v == 5) {
		if (!pk->connect.client_id.len)
			mq_pb_bytes(&pb, MQ_P_ASSIGNED_CLIENT_ID, s->client_id, s->id_len);
		if (conf.max_inflight_messages < 65535)
			mq_pb_u16(&pb, MQ_P_RECEIVE_MAX, (uint16_t)conf.max_inflight_messages);
		mq_pb_u16(&pb, MQ_P_TOPIC_ALIAS_MAX, IN_ALIAS_MAX);
		if (ka_changed)
			mq_pb_u16(&pb, MQ_P_SERVER_KEEP_ALIVE, ka);
		if (conf.message_size_limit)
			mq_pb_u32(&pb, MQ_P_MAX_PACKET_SIZE, c->max_in_packet);
	}
	size_t n = mq_enc_connack(pkt, v, present, 0, &pb);
	session_send(s, pkt, n, c);
	c->connected = true;
	stats_add(ST_CONNECTS, 1);
	session_resume(s, c);
	return 0;
}
