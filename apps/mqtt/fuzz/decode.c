/*
 * decode.c - libFuzzer target for weft-mqtt's packet decoder.
 *
 * The input is a byte stream as a client would send it: it is cut into packets with mq_frame
 * exactly as the broker's read loop does, and each packet is decoded as 3.1.1 and as 5.0.
 * Whatever decodes is then walked the way the broker walks it (subscription lists, every
 * property, the filters' syntax, the strings' UTF-8) and re-encoded where the broker would
 * echo it, so that a span the decoder accepted but that points outside the packet shows up
 * under ASan. The first byte picks the protocol level of the stream.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"

static void walk(const mq_packet *pk, int version)
{
	uint32_t pos = 0, num;
	int id;
	mq_bytes v, v2, f;
	while (mq_props_next(&pk->props.raw, &pos, &id, &num, &v, &v2))
		if (v.len)
			(void)mq_utf8_check(v.p, v.len);
	uint8_t opts;
	pos = 0;
	if (pk->type == MQ_SUBSCRIBE || pk->type == MQ_UNSUBSCRIBE)
		while (mq_sub_next(pk, &pos, &f, pk->type == MQ_SUBSCRIBE ? &opts : NULL))
			(void)mq_topic_filter_check(f.p, f.len);
	if (pk->type == MQ_PUBLISH) {
		mq_pub_enc e = { version, pk->publish.qos, pk->publish.dup, pk->publish.retain,
				 pk->packet_id, pk->publish.topic.p, (uint16_t)pk->publish.topic.len,
				 pk->props.raw.p, pk->props.raw.len, pk->publish.payload.p,
				 pk->publish.payload.len, NULL, 0 };
		size_t n = mq_enc_publish_len(&e);
		uint8_t *out = malloc(n);
		if (mq_enc_publish(out, &e) != n)
			abort();
		mq_packet again;
		if (mq_decode(out, n, version, &again) != 0)
			abort(); /* what we accepted, re-encoded, must decode */
		free(out);
	}
	if (pk->type == MQ_CONNECT && pk->connect.will) {
		pos = 0;
		while (mq_props_next(&pk->connect.will_props.raw, &pos, &id, &num, &v, &v2))
			;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	int version = data[0] & 1 ? 5 : 4;
	data++, size--;
	while (size > 0) {
		int hdr;
		long n = mq_frame(data, size, &hdr);
		if (n <= 0 || (size_t)n > size)
			break;
		/* a copy of exactly the packet, so ASan sees any read past its end */
		uint8_t *pkt = malloc((size_t)n);
		memcpy(pkt, data, (size_t)n);
		mq_packet pk;
		if (mq_decode(pkt, (size_t)n, version, &pk) == 0)
			walk(&pk, pk.type == MQ_CONNECT ? (pk.connect.version == 5 ? 5 : 4) : version);
		free(pkt);
		data += n, size -= (size_t)n;
	}
	return 0;
}
