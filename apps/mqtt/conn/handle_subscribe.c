/*
 * handle_subscribe.c - a SUBSCRIBE: each filter checked (syntax, ACL, the retained backlog's
 * budget), subscribed in the topic tree and noted in the session's list (session.c), stored
 * for a persistent session, answered with a SUBACK once durable, and followed by the retained
 * messages it asks for.
 *
 * A SUBSCRIBE that sends retained messages (retain handling 0, or 1 for a subscription that
 * did not exist; always in 3.1.1) must send every one its filter matches [MQTT-3.3.1-6]
 * (5.0: [MQTT-3.3.1-9]), and they wait as a backlog of the session (retained.c) for the client
 * to take them. Whether that backlog fits the client's budget and the broker's is decided here
 * before the filter is subscribed (retained_admit): a filter whose backlog does not fit is
 * refused in the SUBACK (5.0: 0x97 Quota exceeded; 3.1.1: 0x80) and changes nothing - a
 * subscription it would have replaced stays as it was, with its backlog. Rejected:
 *  - granting the subscription without its retained messages, which [MQTT-3.3.1-9] forbids
 *    for retain handling 0 and 3.1.1 does for every SUBSCRIBE; a client told "granted" would
 *    believe it had the current state of every topic;
 *  - sending only those that fit, which [MQTT-3.3.1-6] forbids as well;
 *  - deciding after the snapshot, which is taken after the subscription is in place (so that
 *    no retained message changed meanwhile is missed): refusing then would take back a
 *    subscription that live messages may already have used.
 * So the backlog is costed twice: counted (no references taken) before the subscription,
 * reserved, and charged as it is when the snapshot is taken. What is retained between the two
 * may pass the budget by that much; the next SUBSCRIBE sees it.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "access.h"
#include "acl.h"
#include "codec.h"
#include "conn.h"
#include "persist.h"
#include "records.h"
#include "retained.h"
#include "session.h"
#include "stats.h"
#include "topic.h"

/* What became of one filter of a SUBSCRIBE. */
typedef struct subans {
	uint8_t code;      /* the SUBACK's */
	uint8_t want;      /* 2: send its retained messages after the SUBACK; 1: let a backlog of
			    * them still pending go on under the new options (retained.c) */
	uint64_t reserved; /* of the backlog budget, for want 2 (retained_admit) */
} subans;

static void unreserve_all(session *s, subans *a, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		if (a[i].reserved)
			retained_unreserve(s, a[i].reserved);
}

int handle_subscribe(conn *c, mq_packet *pk)
{
	session *s = c->s;
	uint32_t n = 0, pos = 0;
	mq_bytes f;
	uint8_t o;
	while (mq_sub_next(pk, &pos, &f, &o))
		n++;
	subans small[32], *a = n <= 32 ? small : malloc(n * sizeof *a);
	uint8_t *codes = malloc(n + 16);
	if (!a || !codes)
		abort();
	uint32_t subid = c->version == 5 ? pk->props.subscription_id : 0;
	pos = 0;
	for (uint32_t i = 0; mq_sub_next(pk, &pos, &f, &o); i++) {
		const char *fs = (const char *)f.p;
		uint16_t flen = (uint16_t)f.len;
		bool shared = f.len >= 7 && !memcmp(f.p, "$share/", 7);
		a[i] = (subans){ 0 };
		if (mq_topic_filter_check(f.p, f.len) < 0) {
			a[i].code = c->version == 5 ? MQ_RC_TOPIC_FILTER_INVALID : 0x80;
			continue;
		}
		if (shared && (o & SUB_NL)) { /* [MQTT-3.8.3-4] */
			unreserve_all(s, a, i);
			if (a != small)
				free(a);
			free(codes);
			return -MQ_RC_PROTOCOL_ERROR;
		}
		acl_client *acl = access_binding(s);
		if (acl && !acl_check_subscribe(acl, fs, f.len)) {
			a[i].code = c->version == 5 ? MQ_RC_NOT_AUTHORIZED : 0x80;
			continue;
		}
		int rh = (o >> 4) & 3;
		/* the subscription list says whether it exists for rh 1 (topic_subscribe says it
		 * for sure below; what they disagree on is only reserved and given back) */
		bool sends = !shared && (rh == 0 || (rh == 1 && !subrec_has(s, f.p, flen)));
		if (sends && !retained_admit(s, fs, flen, &a[i].reserved)) {
			a[i].code = c->version == 5 ? MQ_RC_QUOTA_EXCEEDED : 0x80;
			stats_add(ST_REFUSED_BACKLOG, 1);
			continue;
		}
		if (c->peer_bridge && !shared) /* as mosquitto: its own messages never go back */
			o |= SUB_NL | SUB_RAP;
		int existed = topic_subscribe(s, fs, flen, (uint8_t)(o & 0x3F), subid);
		subrec_add(s, f.p, flen);
		persist_sub(s, fs, flen, (uint8_t)(o & 0x3F), subid, c);
		a[i].code = (uint8_t)(o & 3);
		a[i].want = shared ? 0 : rh == 0 || (rh == 1 && !existed) ? 2 : 1;
		if (a[i].want != 2 && a[i].reserved) {
			retained_unreserve(s, a[i].reserved);
			a[i].reserved = 0;
		}
	}
	if (persist_on && c->ticket && persist_wait(c) < 0) { /* SUBACK once durable */
		unreserve_all(s, a, n);
		if (a != small)
			free(a);
		free(codes);
		return -MQ_RC_UNSPECIFIED;
	}
	for (uint32_t i = 0; i < n; i++)
		codes[i] = a[i].code;
	uint8_t *out = malloc(16 + (size_t)n);
	if (!out)
		abort();
	size_t len = mq_enc_suback(out, c->version, MQ_SUBACK, pk->packet_id, codes, (int)n, NULL);
	session_send(s, out, len, c);
	free(out);
	pos = 0;
	for (uint32_t i = 0; mq_sub_next(pk, &pos, &f, &o); i++)
		if (a[i].want == 2)
			topic_send_retained(s, (const char *)f.p, (uint16_t)f.len, o & 3, subid,
					    a[i].reserved, c);
		else if (a[i].want)
			retained_resubscribed(s, (const char *)f.p, (uint16_t)f.len, o & 3, subid);
	if (a != small)
		free(a);
	free(codes);
	return 0;
}
