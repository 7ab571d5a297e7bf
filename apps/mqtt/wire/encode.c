/*
 * encode.c - writing MQTT packets.
 *
 * Every encoder works in two passes over the same code: with out NULL it only counts, so a
 * caller can size (or reserve room in) its output buffer and then write the packet straight
 * into it, with no intermediate copy. The broker encodes each delivery directly into the
 * receiving connection's output buffer this way.
 */
#include "codec.h"

#include <stdbool.h>
#include <string.h>

int mq_varint_len(uint32_t v)
{
	return v < 128 ? 1 : v < 16384 ? 2 : v < 2097152 ? 3 : 4;
}

int mq_varint_put(uint8_t *out, uint32_t v)
{
	int n = 0;
	do {
		uint8_t b = v & 127;
		v >>= 7;
		out[n++] = (uint8_t)(b | (v ? 128 : 0));
	} while (v);
	return n;
}

/* ---- property builder ---------------------------------------------------------------------- */

static uint8_t *pb_room(mq_pb *b, uint32_t n)
{
	if (b->overflow || b->cap - b->len < n) {
		b->overflow = 1;
		return NULL;
	}
	uint8_t *p = b->buf + b->len;
	b->len += n;
	return p;
}

void mq_pb_byte(mq_pb *b, int id, uint8_t v)
{
	uint8_t *p = pb_room(b, 2);
	if (p)
		p[0] = (uint8_t)id, p[1] = v;
}

void mq_pb_u16(mq_pb *b, int id, uint16_t v)
{
	uint8_t *p = pb_room(b, 3);
	if (p)
		p[0] = (uint8_t)id, p[1] = (uint8_t)(v >> 8), p[2] = (uint8_t)v;
}

void mq_pb_u32(mq_pb *b, int id, uint32_t v)
{
	uint8_t *p = pb_room(b, 5);
	if (p) {
		p[0] = (uint8_t)id;
		p[1] = (uint8_t)(v >> 24), p[2] = (uint8_t)(v >> 16);
		p[3] = (uint8_t)(v >> 8), p[4] = (uint8_t)v;
	}
}

void mq_pb_varint(mq_pb *b, int id, uint32_t v)
{
	uint8_t *p = pb_room(b, 1 + (uint32_t)mq_varint_len(v));
	if (p) {
		p[0] = (uint8_t)id;
		mq_varint_put(p + 1, v);
	}
}

static void put_bin(uint8_t *p, const void *s, uint16_t n)
{
	p[0] = (uint8_t)(n >> 8), p[1] = (uint8_t)n;
	if (n)
		memcpy(p + 2, s, n);
}

void mq_pb_bytes(mq_pb *b, int id, const void *s, uint32_t n)
{
	if (n > 65535) {
		b->overflow = 1;
		return;
	}
	uint8_t *p = pb_room(b, 3 + n);
	if (p) {
		p[0] = (uint8_t)id;
		put_bin(p + 1, s, (uint16_t)n);
	}
}

void mq_pb_pair(mq_pb *b, const void *k, uint16_t kn, const void *v, uint16_t vn)
{
	uint8_t *p = pb_room(b, 5u + kn + vn);
	if (p) {
		p[0] = MQ_P_USER_PROPERTY;
		put_bin(p + 1, k, kn);
		put_bin(p + 3 + kn, v, vn);
	}
}

void mq_pb_raw(mq_pb *b, const void *s, uint32_t n)
{
	uint8_t *p = pb_room(b, n);
	if (p && n)
		memcpy(p, s, n);
}

/* ---- packets ------------------------------------------------------------------------------- */

/* Writing cursor: with out NULL it only counts. */
typedef struct wr {
	uint8_t *p;
	size_t n;
} wr;

static void w8(wr *w, uint8_t v)
{
	if (w->p)
		w->p[w->n] = v;
	w->n++;
}

static void w16(wr *w, uint16_t v)
{
	w8(w, (uint8_t)(v >> 8));
	w8(w, (uint8_t)v);
}

static void wmem(wr *w, const void *s, size_t n)
{
	if (w->p && n)
		memcpy(w->p + w->n, s, n);
	w->n += n;
}

static void wvar(wr *w, uint32_t v)
{
	if (w->p)
		mq_varint_put(w->p + w->n, v);
	w->n += (size_t)mq_varint_len(v);
}

static void wstr(wr *w, const void *s, uint16_t n)
{
	w16(w, n);
	wmem(w, s, n);
}

static void wprops(wr *w, const mq_pb *pr)
{
	uint32_t n = pr ? pr->len : 0;
	wvar(w, n);
	if (n)
		wmem(w, pr->buf, n);
}

static uint32_t props_size(const mq_pb *pr)
{
	uint32_t n = pr ? pr->len : 0;
	return (uint32_t)mq_varint_len(n) + n;
}

static void fixed(wr *w, uint8_t b0, uint32_t rem)
{
	w8(w, b0);
	wvar(w, rem);
}

size_t mq_enc_connack(uint8_t *out, int version, int session_present, int rc,
		      const mq_pb *props)
{
	wr w = { out, 0 };
	uint32_t rem = 2 + (version == 5 ? props_size(props) : 0);
	fixed(&w, MQ_CONNACK << 4, rem);
	w8(&w, (uint8_t)(session_present ? 1 : 0));
	w8(&w, (uint8_t)rc);
	if (version == 5)
		wprops(&w, props);
	return w.n;
}

size_t mq_enc_ack(uint8_t *out, int version, int type, uint16_t id, int rc, const mq_pb *props)
{
	wr w = { out, 0 };
	int has_props = version == 5 && props && props->len;
	uint32_t rem = 2;
	if (version == 5 && (rc || has_props))
		rem += 1 + (has_props ? props_size(props) : 0);
	fixed(&w, (uint8_t)(type << 4 | (type == MQ_PUBREL ? 2 : 0)), rem);
	w16(&w, id);
	if (rem > 2) {
		w8(&w, (uint8_t)rc);
		if (has_props)
			wprops(&w, props);
	}
	return w.n;
}

size_t mq_enc_suback(uint8_t *out, int version, int type, uint16_t id, const uint8_t *codes,
		     int n, const mq_pb *props)
{
	wr w = { out, 0 };
	int codes_sent = version == 5 || type == MQ_SUBACK;
	uint32_t rem = 2 + (version == 5 ? props_size(props) : 0) + (codes_sent ? (uint32_t)n : 0);
	fixed(&w, (uint8_t)(type << 4), rem);
	w16(&w, id);
	if (version == 5)
		wprops(&w, props);
	if (codes_sent)
		wmem(&w, codes, (size_t)n);
	return w.n;
}

size_t mq_enc_disconnect(uint8_t *out, int version, int rc, const mq_pb *props)
{
	wr w = { out, 0 };
	if (version < 5) {
		fixed(&w, MQ_DISCONNECT << 4, 0);
		return w.n;
	}
	int has_props = props && props->len;
	fixed(&w, MQ_DISCONNECT << 4, 1 + (has_props ? props_size(props) : 0));
	w8(&w, (uint8_t)rc);
	if (has_props)
		wprops(&w, props);
	return w.n;
}

size_t mq_enc_simple(uint8_t *out, int type)
{
	wr w = { out, 0 };
	fixed(&w, (uint8_t)(type << 4), 0);
	return w.n;
}

static uint32_t publish_rem(const mq_pub_enc *e)
{
	uint32_t rem = 2 + e->topic_len + (e->qos ? 2 : 0) + e->payload_len;
	if (e->version == 5)
		rem += (uint32_t)mq_varint_len(e->props_len + e->props2_len) + e->props_len +
		       e->props2_len;
	return rem;
}

size_t mq_enc_publish_len(const mq_pub_enc *e)
{
	uint32_t rem = publish_rem(e);
	return 1 + (size_t)mq_varint_len(rem) + rem;
}

size_t mq_enc_publish(uint8_t *out, const mq_pub_enc *e)
{
	wr w = { out, 0 };
	uint8_t b0 = (uint8_t)(MQ_PUBLISH << 4 | (e->dup ? 8 : 0) | e->qos << 1 | (e->retain ? 1 : 0));
	fixed(&w, b0, publish_rem(e));
	wstr(&w, e->topic, e->topic_len);
	if (e->qos)
		w16(&w, e->packet_id);
	if (e->version == 5) {
		wvar(&w, e->props_len + e->props2_len);
		wmem(&w, e->props, e->props_len);
		wmem(&w, e->props2, e->props2_len);
	}
	wmem(&w, e->payload, e->payload_len);
	return w.n;
}

/* The CONNECT's variable header and payload (counted only when w->p is NULL). */
static void connect_body(wr *w, const mq_connect_enc *e)
{
	bool will = e->will_topic, user = e->username, pass = user && e->password;
	wstr(w, "MQTT", 4);
	w8(w, e->level ? e->level : (uint8_t)e->version);
	w8(w, (uint8_t)((e->clean ? 0x02 : 0) |
			(will ? 0x04 | e->will_qos << 3 | (e->will_retain ? 0x20 : 0) : 0) |
			(pass ? 0x40 : 0) | (user ? 0x80 : 0)));
	w16(w, e->keep_alive);
	if (e->version == 5)
		wprops(w, e->props);
	wstr(w, e->client_id, (uint16_t)strlen(e->client_id));
	if (will) {
		if (e->version == 5)
			wprops(w, NULL);
		wstr(w, e->will_topic, (uint16_t)strlen(e->will_topic));
		wstr(w, e->will_payload, e->will_len);
	}
	if (user)
		wstr(w, e->username, (uint16_t)strlen(e->username));
	if (pass)
		wstr(w, e->password, (uint16_t)strlen(e->password));
}

size_t mq_enc_connect(uint8_t *out, const mq_connect_enc *e)
{
	wr body = { NULL, 0 }, w = { out, 0 };
	connect_body(&body, e);
	fixed(&w, MQ_CONNECT << 4, (uint32_t)body.n);
	connect_body(&w, e);
	return w.n;
}

size_t mq_enc_subscribe(uint8_t *out, int version, uint16_t id, const char *filter,
			uint8_t opts, const mq_pb *props)
{
	wr w = { out, 0 };
	uint16_t fn = (uint16_t)strlen(filter);
	uint32_t rem = 2 + (version == 5 ? props_size(props) : 0) + 2 + fn + 1;
	fixed(&w, MQ_SUBSCRIBE << 4 | 2, rem);
	w16(&w, id);
	if (version == 5)
		wprops(&w, props);
	wstr(&w, filter, fn);
	w8(&w, opts);
	return w.n;
}

size_t mq_enc_unsubscribe(uint8_t *out, int version, uint16_t id, const char *filter)
{
	wr w = { out, 0 };
	uint16_t fn = (uint16_t)strlen(filter);
	fixed(&w, MQ_UNSUBSCRIBE << 4 | 2, 2 + (version == 5 ? 1u : 0u) + 2 + fn);
	w16(&w, id);
	if (version == 5)
		wprops(&w, NULL);
	wstr(&w, filter, fn);
	return w.n;
}
