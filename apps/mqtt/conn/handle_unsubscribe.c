/*
 * handle_unsubscribe.c - an UNSUBSCRIBE: each filter removed from the topic tree and from the
 * session's list (which ends a retained backlog pending for it), forgotten by the store for a
 * persistent session, and answered with an UNSUBACK, which goes out with the batch's output
 * once that is durable. 5.0 says which filters had no subscription, or could have had none.
 */
#include <stdint.h>
#include <stdlib.h>

#include "codec.h"
#include "conn.h"
#include "persist.h"
#include "records.h"
#include "session.h"
#include "topic.h"

int handle_unsubscribe(conn *c, mq_packet *pk)
{
	uint32_t pos = 0, n = 0;
	mq_bytes f;
	while (mq_sub_next(pk, &pos, &f, NULL))
		n++;
	uint8_t *codes = malloc(n + 16), *out = malloc(n + 16);
	if (!codes || !out)
		abort();
	pos = n = 0;
	while (mq_sub_next(pk, &pos, &f, NULL)) {
		/* a filter nobody could have subscribed: 5.0 says so; 3.1.1 has no code for it,
		 * and there is nothing to unsubscribe */
		if (mq_topic_filter_check(f.p, f.len) < 0) {
			codes[n++] = MQ_RC_TOPIC_FILTER_INVALID;
			continue;
		}
		int found = topic_unsubscribe(c->s, (const char *)f.p, (uint16_t)f.len);
		if (found) {
			subrec_del(c->s, f.p, (uint16_t)f.len);
			/* the UNSUBACK goes out with the batch's output, once this is durable */
			persist_unsub(c->s, (const char *)f.p, (uint16_t)f.len, c);
		}
		codes[n++] = found ? 0 : MQ_RC_NO_SUBSCRIPTION_EXISTED;
	}
	size_t len = mq_enc_suback(out, c->version, MQ_UNSUBACK, pk->packet_id, codes, (int)n, NULL);
	session_send(c->s, out, len, c);
	free(codes);
	free(out);
	return 0;
}
