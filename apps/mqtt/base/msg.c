/*
 * msg.c - messages, decoded once and shared.
 *
 * A PUBLISH becomes one msg: topic, the properties that travel with it to subscribers, and the
 * payload, in one block from the worker's pool. Every place that keeps it (an inflight or
 * queued delivery, the retained store, a will) holds a reference; QoS 0 deliveries are
 * encoded straight into the receivers' output buffers and hold none. The last unref returns
 * the block to the pool of whichever worker drops it.
 *
 * Properties are kept as the raw bytes the publisher sent, but only those that travel with an
 * application message to its subscribers (MQTT 5.0, 3.3.2.3): payload format, content type,
 * response topic, correlation data and user properties. The others are per hop - the topic
 * alias (each connection has its own), the message expiry interval (kept as an absolute
 * deadline, and sent to each subscriber as what is left of it), subscription ids (the broker's
 * to add) - or do not belong in a PUBLISH at all: a will's properties come from the CONNECT,
 * where the will delay interval sits among them, and a client that finds it in a PUBLISH may
 * treat it as a protocol error (Python paho-mqtt's network thread dies on it). So this is a
 * list of what is kept, not of what is dropped.
 */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include <weft.h>

#include "codec.h"
#include "msg.h"
#include "pool.h"

void (*msg_stored_release)(uint64_t smid);

static uint32_t filter_props(const mq_bytes *in, uint8_t *out)
{
	uint32_t pos = 0, prev = 0, n = 0, num;
	int id;
	mq_bytes v, v2;
	while (mq_props_next(in, &pos, &id, &num, &v, &v2)) {
		if (id == MQ_P_PAYLOAD_FORMAT || id == MQ_P_CONTENT_TYPE ||
		    id == MQ_P_RESPONSE_TOPIC || id == MQ_P_CORRELATION_DATA ||
		    id == MQ_P_USER_PROPERTY) {
			if (out)
				memcpy(out + n, in->p + prev, pos - prev);
			n += pos - prev;
		}
		prev = pos;
	}
	return n;
}

msg *msg_new(const void *topic, uint16_t topic_len, const mq_bytes *props, const void *payload,
	     uint32_t payload_len, int qos, int retain, uint32_t expiry_s)
{
	uint32_t plen = props && props->len ? filter_props(props, NULL) : 0;
	msg *m = pool_alloc(sizeof *m + topic_len + 1u + plen + payload_len);
	atomic_init(&m->refs, 1);
	atomic_init(&m->smid, 0);
	m->qos = (uint8_t)qos;
	m->retain = (uint8_t)retain;
	m->topic_len = topic_len;
	m->props_len = plen;
	m->payload_len = payload_len;
	m->expiry = expiry_s ? weft_now() + (int64_t)expiry_s * 1000000000 : 0;
	m->topic = (char *)m->data;
	memcpy(m->topic, topic, topic_len);
	m->topic[topic_len] = 0;
	m->props = m->data + topic_len + 1;
	if (plen)
		filter_props(props, m->props);
	m->payload = m->props + plen;
	if (payload_len)
		memcpy(m->payload, payload, payload_len);
	return m;
}

void msg_unref(msg *m)
{
	if (m && atomic_fetch_sub_explicit(&m->refs, 1, memory_order_acq_rel) == 1) {
		uint64_t smid = atomic_load_explicit(&m->smid, memory_order_relaxed);
		if (smid) /* nobody can queue it for another session now */
			msg_stored_release(smid);
		pool_free(m);
	}
}

bool msg_expired(const msg *m, int64_t now)
{
	return m->expiry && now >= m->expiry;
}
