/*
 * handle_publish.c - an incoming PUBLISH: max_publish_rate's debt, topic aliases, the payload
 * format and size checks, who may publish where (a client's ACL, or a bridge's topic mapping:
 * c->role->in_topic), the inbound QoS 2 id, retaining, routing (topic_publish), and the
 * acknowledgement (acks.c, which holds it until the store has what it vouches for).
 *
 * An inbound QoS 2 id and the message's copies for persistent sessions are one store group
 * (persist_group_begin): a crash keeps both or neither, so the client's resend is either known
 * or new. A resend is acknowledged once durable and not delivered again.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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
#include "topic.h"

/* A client's PUBLISH: not to the broker's own $SYS topics, and as its ACL allows. */
bool conn_client_in_topic(conn *c, const uint8_t **topic, uint16_t *tlen, char **mapped)
{
	(void)mapped;
	if (*tlen >= 4 && !memcmp(*topic, "$SYS", 4))
		return false;
	acl_client *a = access_binding(c->s);
	return !a || acl_check(a, (const char *)*topic, *tlen, ACL_WRITE);
}

/* max_publish_rate, a GCRA cell per connection: each PUBLISH moves pub_tat (when the client's
 * debt is paid) on by one interval. */
static void publish_debt(conn *c)
{
	int64_t now = weft_now(), t = (int64_t)(1e9 / conf.pub_rate);
	c->pub_tat = (c->pub_tat > now ? c->pub_tat : now) + t;
}

int handle_publish(conn *c, mq_packet *pk)
{
	session *s = c->s;
	if (conf.pub_rate > 0 && c->role->publish_rate)
		publish_debt(c);
	const uint8_t *topic = pk->publish.topic.p;
	uint16_t tlen = (uint16_t)pk->publish.topic.len;
	int qos = pk->publish.qos;
	int ack = qos == 1 ? MQ_PUBACK : MQ_PUBREC;
	if (c->version == 5) {
		mq_props *pr = &pk->props;
		if (MQ_HAS(pr, MQ_P_SUBSCRIPTION_ID))
			return -MQ_RC_PROTOCOL_ERROR;
		if (MQ_HAS(pr, MQ_P_TOPIC_ALIAS)) {
			uint16_t a = pr->topic_alias;
			if (a > c->in_alias_max)
				return -MQ_RC_TOPIC_ALIAS_INVALID;
			if (!c->in_alias) {
				c->in_alias = calloc(c->in_alias_max, sizeof(char *));
				if (!c->in_alias)
					abort();
			}
			char **slot = &c->in_alias[a - 1];
			if (tlen) {
				free(*slot);
				*slot = malloc(tlen + 1u);
				if (!*slot)
					abort();
				memcpy(*slot, topic, tlen);
				(*slot)[tlen] = 0;
			} else if (!*slot) {
				return -MQ_RC_PROTOCOL_ERROR;
			} else {
				topic = (const uint8_t *)*slot;
				tlen = (uint16_t)strlen(*slot);
			}
		}
		if (pr->payload_format == 1 &&
		    mq_utf8_check(pk->publish.payload.p, pk->publish.payload.len) < 0) {
			if (qos)
				ack_pub(c, ack, pk->packet_id, MQ_RC_PAYLOAD_FORMAT_INVALID);
			return 0;
		}
	}
	if (conf.message_size_limit && pk->publish.payload.len > conf.message_size_limit) {
		stats_add(ST_PUB_DROPPED, 1);
		if (qos)
			ack_pub(c, ack, pk->packet_id, MQ_RC_QUOTA_EXCEEDED);
		return 0;
	}
	char *mapped = NULL; /* a bridge's remote topic in local terms; no ACL for a bridge */
	if (!c->role->in_topic(c, &topic, &tlen, &mapped)) {
		stats_add(ST_PUB_DROPPED, 1);
		if (qos)
			ack_pub(c, ack, pk->packet_id, c->version == 5 ? MQ_RC_NOT_AUTHORIZED : 0);
		return 0;
	}
	bool group = false;
	if (qos == 2) {
		int max = c->version == 5 ? conf.max_inflight_messages : 65535;
		int r = session_rel_add(s, pk->packet_id, max);
		if (r < 0) {
			free(mapped);
			return -MQ_RC_RECEIVE_MAX_EXCEEDED;
		}
		if (r == 1) { /* a resend: acknowledged once durable, not delivered again */
			ack_earlier(c, MQ_PUBREC, pk->packet_id, 0);
			free(mapped);
			return 0;
		}
		/* the id and the message's copies: one unit on disk, so that a crash leaves the
		 * client's resend either known (stored everywhere) or new (stored nowhere) */
		group = persist_group_begin(s);
		persist_rel(s, pk->packet_id, true, c);
	}
	stats_add(ST_PUB_RECV, 1);
	msg *m = msg_new(topic, tlen, &pk->props.raw, pk->publish.payload.p, pk->publish.payload.len,
			 qos, pk->publish.retain, pk->props.message_expiry);
	free(mapped);
	if (m->retain) {
		topic_retain(m);
		persist_retained(m, c);
	}
	int n = topic_publish(m, s, c);
	if (group)
		persist_group_end();
	msg_unref(m);
	if (qos)
		ack_pub(c, ack, pk->packet_id, n || c->version < 5 ? 0 : MQ_RC_NO_MATCHING_SUBSCRIBERS);
	return 0;
}
