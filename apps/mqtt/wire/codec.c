/*
 * codec.c - framing and decoding of MQTT 3.1.1 and 5.0 packets.
 *
 * A packet is decoded in one pass over a buffer that holds it whole (mq_frame finds its end
 * first), with a cursor that never reads past the packet: every field read checks the bytes
 * left, so a short or lying packet fails as Malformed instead of reading beyond it. Strings
 * and binary fields are returned as spans into the buffer: decoding allocates nothing, which
 * keeps the broker's read path free of the allocator.
 *
 * The checks are the specifications' MUST rules a receiver can see: fixed-header flags, the
 * minimal encoding of variable byte integers, well-formed UTF-8 without U+0000 or surrogates,
 * non-zero packet identifiers, reserved bits, which property may appear in which packet and
 * how often, the values a property may take, the reason codes each packet may carry, and that
 * the packet ends exactly where its remaining length says. Checks that need the connection's
 * state (topic aliases, receive maximum, filter syntax in a SUBSCRIBE) are the broker's.
 */
#include "codec.h"

#include <string.h>

typedef struct cur {
	const uint8_t *p, *end;
	int err;
} cur;

static int fail(cur *c, int rc)
{
	if (!c->err)
		c->err = rc;
	c->p = c->end;
	return 0;
}

static size_t left(const cur *c)
{
	return (size_t)(c->end - c->p);
}

static uint8_t get8(cur *c)
{
	if (left(c) < 1)
		return (uint8_t)fail(c, -MQ_RC_MALFORMED);
	return *c->p++;
}

static uint16_t get16(cur *c)
{
	if (left(c) < 2)
		return (uint16_t)fail(c, -MQ_RC_MALFORMED);
	uint16_t v = (uint16_t)(c->p[0] << 8 | c->p[1]);
	c->p += 2;
	return v;
}

static uint32_t get32(cur *c)
{
	if (left(c) < 4)
		return (uint32_t)fail(c, -MQ_RC_MALFORMED);
	uint32_t v = (uint32_t)c->p[0] << 24 | (uint32_t)c->p[1] << 16 | (uint32_t)c->p[2] << 8 |
		     c->p[3];
	c->p += 4;
	return v;
}

/* A variable byte integer: at most 4 bytes, and no longer than needed [MQTT-1.5.5-1]. */
static uint32_t getvar(cur *c)
{
	uint32_t v = 0;
	for (int i = 0; i < 4; i++) {
		if (left(c) < 1)
			return (uint32_t)fail(c, -MQ_RC_MALFORMED);
		uint8_t b = *c->p++;
		if (i > 0 && b == 0)
			return (uint32_t)fail(c, -MQ_RC_MALFORMED); /* non-minimal */
		v |= (uint32_t)(b & 127) << (7 * i);
		if (!(b & 128))
			return v;
	}
	return (uint32_t)fail(c, -MQ_RC_MALFORMED);
}

static mq_bytes getbin(cur *c)
{
	mq_bytes b = { 0, 0 };
	uint16_t n = get16(c);
	if (c->err)
		return b;
	if (left(c) < n) {
		fail(c, -MQ_RC_MALFORMED);
		return b;
	}
	b.p = c->p;
	b.len = n;
	c->p += n;
	return b;
}

static mq_bytes getstr(cur *c)
{
	mq_bytes b = getbin(c);
	if (!c->err && mq_utf8_check(b.p, b.len) < 0)
		fail(c, -MQ_RC_MALFORMED);
	return b;
}

int mq_utf8_check(const uint8_t *p, size_t n)
{
	size_t i = 0;
	while (i < n) {
		uint8_t b = p[i];
		if (b < 0x80) {
			if (b == 0)
				return -MQ_RC_MALFORMED;
			i++;
			continue;
		}
		int k;
		uint32_t cp, min;
		if ((b & 0xE0) == 0xC0)
			k = 1, cp = b & 0x1F, min = 0x80;
		else if ((b & 0xF0) == 0xE0)
			k = 2, cp = b & 0x0F, min = 0x800;
		else if ((b & 0xF8) == 0xF0)
			k = 3, cp = b & 0x07, min = 0x10000;
		else
			return -MQ_RC_MALFORMED;
		if (n - i <= (size_t)k)
			return -MQ_RC_MALFORMED;
		for (int j = 1; j <= k; j++) {
			if ((p[i + j] & 0xC0) != 0x80)
				return -MQ_RC_MALFORMED;
			cp = cp << 6 | (p[i + j] & 0x3F);
		}
		if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
			return -MQ_RC_MALFORMED;
		i += (size_t)k + 1;
	}
	return 0;
}

int mq_topic_name_check(const uint8_t *p, size_t n)
{
	if (n == 0)
		return -MQ_RC_TOPIC_NAME_INVALID;
	if (memchr(p, '+', n) || memchr(p, '#', n))
		return -MQ_RC_TOPIC_NAME_INVALID;
	return 0;
}

/* '#' only as the whole last level, '+' only as a whole level; $share/group/filter with a
 * group name of at least one character without wildcards or '/', and a filter after it. */
int mq_topic_filter_check(const uint8_t *p, size_t n)
{
	if (n == 0)
		return -MQ_RC_TOPIC_FILTER_INVALID;
	if (n >= 7 && !memcmp(p, "$share/", 7)) {
		const uint8_t *g = p + 7, *slash = memchr(g, '/', n - 7);
		if (!slash || slash == g || slash + 1 == p + n)
			return -MQ_RC_TOPIC_FILTER_INVALID;
		if (memchr(g, '+', (size_t)(slash - g)) || memchr(g, '#', (size_t)(slash - g)))
			return -MQ_RC_TOPIC_FILTER_INVALID;
		return mq_topic_filter_check(slash + 1, (size_t)(p + n - slash - 1));
	}
	for (size_t i = 0; i < n; i++) {
		int start = i == 0 || p[i - 1] == '/';
		int end = i + 1 == n || p[i + 1] == '/';
		if (p[i] == '#' && !(start && i + 1 == n))
			return -MQ_RC_TOPIC_FILTER_INVALID;
		if (p[i] == '+' && !(start && end))
			return -MQ_RC_TOPIC_FILTER_INVALID;
	}
	return 0;
}

long mq_frame(const uint8_t *buf, size_t len, int *hdr)
{
	uint32_t v = 0;
	for (int i = 1; i <= 4; i++) {
		if (len <= (size_t)i)
			return 0;
		uint8_t b = buf[i];
		if (i > 1 && b == 0)
			return -MQ_RC_MALFORMED;
		v |= (uint32_t)(b & 127) << (7 * (i - 1));
		if (!(b & 128)) {
			*hdr = i + 1;
			return (long)v + i + 1;
		}
	}
	return -MQ_RC_MALFORMED;
}

/* ---- properties ---------------------------------------------------------------------------- */

enum { T_BYTE = 1, T_U16, T_U32, T_VAR, T_STR, T_BIN, T_PAIR };

#define PK(t) (1u << (t))
#define WILL PK(0) /* will properties travel in a CONNECT; bit 0 stands for them */
#define ACKS (PK(MQ_PUBACK) | PK(MQ_PUBREC) | PK(MQ_PUBREL) | PK(MQ_PUBCOMP))

static const struct {
	uint8_t type;
	uint16_t where;
} ptab[64] = {
	[MQ_P_PAYLOAD_FORMAT] = { T_BYTE, PK(MQ_PUBLISH) | WILL },
	[MQ_P_MESSAGE_EXPIRY] = { T_U32, PK(MQ_PUBLISH) | WILL },
	[MQ_P_CONTENT_TYPE] = { T_STR, PK(MQ_PUBLISH) | WILL },
	[MQ_P_RESPONSE_TOPIC] = { T_STR, PK(MQ_PUBLISH) | WILL },
	[MQ_P_CORRELATION_DATA] = { T_BIN, PK(MQ_PUBLISH) | WILL },
	[MQ_P_SUBSCRIPTION_ID] = { T_VAR, PK(MQ_PUBLISH) | PK(MQ_SUBSCRIBE) },
	[MQ_P_SESSION_EXPIRY] = { T_U32, PK(MQ_CONNECT) | PK(MQ_CONNACK) | PK(MQ_DISCONNECT) },
	[MQ_P_ASSIGNED_CLIENT_ID] = { T_STR, PK(MQ_CONNACK) },
	[MQ_P_SERVER_KEEP_ALIVE] = { T_U16, PK(MQ_CONNACK) },
	[MQ_P_AUTH_METHOD] = { T_STR, PK(MQ_CONNECT) | PK(MQ_CONNACK) | PK(MQ_AUTH) },
	[MQ_P_AUTH_DATA] = { T_BIN, PK(MQ_CONNECT) | PK(MQ_CONNACK) | PK(MQ_AUTH) },
	[MQ_P_REQUEST_PROBLEM_INFO] = { T_BYTE, PK(MQ_CONNECT) },
	[MQ_P_WILL_DELAY] = { T_U32, WILL },
	[MQ_P_REQUEST_RESPONSE_INFO] = { T_BYTE, PK(MQ_CONNECT) },
	[MQ_P_RESPONSE_INFO] = { T_STR, PK(MQ_CONNACK) },
	[MQ_P_SERVER_REFERENCE] = { T_STR, PK(MQ_CONNACK) | PK(MQ_DISCONNECT) },
	[MQ_P_REASON_STRING] = { T_STR, PK(MQ_CONNACK) | ACKS | PK(MQ_SUBACK) | PK(MQ_UNSUBACK) |
						PK(MQ_DISCONNECT) | PK(MQ_AUTH) },
	[MQ_P_RECEIVE_MAX] = { T_U16, PK(MQ_CONNECT) | PK(MQ_CONNACK) },
	[MQ_P_TOPIC_ALIAS_MAX] = { T_U16, PK(MQ_CONNECT) | PK(MQ_CONNACK) },
	[MQ_P_TOPIC_ALIAS] = { T_U16, PK(MQ_PUBLISH) },
	[MQ_P_MAX_QOS] = { T_BYTE, PK(MQ_CONNACK) },
	[MQ_P_RETAIN_AVAILABLE] = { T_BYTE, PK(MQ_CONNACK) },
	[MQ_P_USER_PROPERTY] = { T_PAIR, 0xFFFF },
	[MQ_P_MAX_PACKET_SIZE] = { T_U32, PK(MQ_CONNECT) | PK(MQ_CONNACK) },
	[MQ_P_WILDCARD_SUB_AVAILABLE] = { T_BYTE, PK(MQ_CONNACK) },
	[MQ_P_SUB_ID_AVAILABLE] = { T_BYTE, PK(MQ_CONNACK) },
	[MQ_P_SHARED_SUB_AVAILABLE] = { T_BYTE, PK(MQ_CONNACK) },
};

/* Read a property block for packet type `where` (0: will properties) into pr. */
static void getprops(cur *c, int where, mq_props *pr)
{
	memset(pr, 0, sizeof *pr);
	uint32_t n = getvar(c);
	if (c->err)
		return;
	if (left(c) < n) {
		fail(c, -MQ_RC_MALFORMED);
		return;
	}
	pr->raw.p = c->p;
	pr->raw.len = n;
	cur in = { c->p, c->p + n, 0 };
	c->p += n;
	while (in.p < in.end && !in.err) {
		uint32_t id = getvar(&in);
		if (in.err)
			break;
		if (id >= 64 || !ptab[id].type) {
			fail(&in, -MQ_RC_MALFORMED);
			break;
		}
		if (!(ptab[id].where & PK(where))) {
			fail(&in, -MQ_RC_PROTOCOL_ERROR);
			break;
		}
		int again = MQ_HAS(pr, id);
		if (again && id != MQ_P_USER_PROPERTY &&
		    !(id == MQ_P_SUBSCRIPTION_ID && where == MQ_PUBLISH)) {
			fail(&in, -MQ_RC_PROTOCOL_ERROR);
			break;
		}
		pr->has |= 1ull << id;
		uint32_t v = 0;
		mq_bytes s = { 0, 0 };
		switch (ptab[id].type) {
		case T_BYTE: v = get8(&in); break;
		case T_U16: v = get16(&in); break;
		case T_U32: v = get32(&in); break;
		case T_VAR: v = getvar(&in); break;
		case T_STR: s = getstr(&in); break;
		case T_BIN: s = getbin(&in); break;
		case T_PAIR: getstr(&in); getstr(&in); break;
		}
		if (in.err)
			break;
		int bad = 0;
		switch (id) {
		case MQ_P_PAYLOAD_FORMAT: pr->payload_format = (uint8_t)v; bad = v > 1; break;
		case MQ_P_REQUEST_PROBLEM_INFO: pr->request_problem_info = (uint8_t)v; bad = v > 1; break;
		case MQ_P_REQUEST_RESPONSE_INFO: pr->request_response_info = (uint8_t)v; bad = v > 1; break;
		case MQ_P_MAX_QOS: pr->max_qos = (uint8_t)v; bad = v > 1; break;
		case MQ_P_RETAIN_AVAILABLE: pr->retain_available = (uint8_t)v; bad = v > 1; break;
		case MQ_P_WILDCARD_SUB_AVAILABLE: pr->wildcard_sub_available = (uint8_t)v; bad = v > 1; break;
		case MQ_P_SUB_ID_AVAILABLE: pr->sub_id_available = (uint8_t)v; bad = v > 1; break;
		case MQ_P_SHARED_SUB_AVAILABLE: pr->shared_sub_available = (uint8_t)v; bad = v > 1; break;
		case MQ_P_SERVER_KEEP_ALIVE: pr->server_keep_alive = (uint16_t)v; break;
		case MQ_P_RECEIVE_MAX: pr->receive_max = (uint16_t)v; bad = v == 0; break;
		case MQ_P_TOPIC_ALIAS_MAX: pr->topic_alias_max = (uint16_t)v; break;
		case MQ_P_TOPIC_ALIAS: pr->topic_alias = (uint16_t)v; bad = v == 0; break;
		case MQ_P_MESSAGE_EXPIRY: pr->message_expiry = v; break;
		case MQ_P_SESSION_EXPIRY: pr->session_expiry = v; break;
		case MQ_P_WILL_DELAY: pr->will_delay = v; break;
		case MQ_P_MAX_PACKET_SIZE: pr->max_packet_size = v; bad = v == 0; break;
		case MQ_P_SUBSCRIPTION_ID:
			if (!again)
				pr->subscription_id = v;
			bad = v == 0;
			break;
		case MQ_P_CONTENT_TYPE: pr->content_type = s; break;
		case MQ_P_RESPONSE_TOPIC:
			pr->response_topic = s;
			if (mq_topic_name_check(s.p, s.len) < 0)
				bad = 1;
			break;
		case MQ_P_CORRELATION_DATA: pr->correlation_data = s; break;
		case MQ_P_ASSIGNED_CLIENT_ID: pr->assigned_client_id = s; break;
		case MQ_P_AUTH_METHOD: pr->auth_method = s; break;
		case MQ_P_AUTH_DATA: pr->auth_data = s; break;
		case MQ_P_RESPONSE_INFO: pr->response_info = s; break;
		case MQ_P_SERVER_REFERENCE: pr->server_reference = s; break;
		case MQ_P_REASON_STRING: pr->reason_string = s; break;
		}
		if (bad)
			fail(&in, -MQ_RC_PROTOCOL_ERROR);
	}
	if (in.err)
		fail(c, in.err);
	else if (MQ_HAS(pr, MQ_P_AUTH_DATA) && !MQ_HAS(pr, MQ_P_AUTH_METHOD))
		fail(c, -MQ_RC_PROTOCOL_ERROR);
}

int mq_props_next(const mq_bytes *raw, uint32_t *pos, int *id, uint32_t *num, mq_bytes *v,
		  mq_bytes *v2)
{
	if (*pos >= raw->len)
		return 0;
	cur c = { raw->p + *pos, raw->p + raw->len, 0 };
	uint32_t i = getvar(&c);
	if (c.err || i >= 64 || !ptab[i].type)
		return 0;
	*id = (int)i;
	*num = 0;
	v->p = v2->p = 0;
	v->len = v2->len = 0;
	switch (ptab[i].type) {
	case T_BYTE: *num = get8(&c); break;
	case T_U16: *num = get16(&c); break;
	case T_U32: *num = get32(&c); break;
	case T_VAR: *num = getvar(&c); break;
	case T_STR:
	case T_BIN: *v = getbin(&c); break;
	case T_PAIR: *v = getbin(&c); *v2 = getbin(&c); break;
	}
	if (c.err)
		return 0;
	*pos = (uint32_t)(c.p - raw->p);
	return 1;
}

/* ---- packets ------------------------------------------------------------------------------- */

static int rc_allowed(int type, int version, uint8_t rc)
{
	static const char connack[] = "\x00\x80\x81\x82\x83\x84\x85\x86\x87\x88\x89\x8a\x8c\x90"
				      "\x95\x97\x99\x9a\x9b\x9c\x9d\x9f";
	static const char puback[] = "\x00\x10\x80\x83\x87\x90\x91\x97\x99";
	static const char pubrel[] = "\x00\x92";
	static const char suback[] = "\x00\x01\x02\x80\x83\x87\x8f\x91\x97\x9e\xa1\xa2";
	static const char unsuback[] = "\x00\x11\x80\x83\x87\x8f\x91";
	static const char disconnect[] = "\x00\x04\x80\x81\x82\x83\x87\x89\x8b\x8d\x8e\x8f\x90"
					 "\x93\x94\x95\x96\x97\x98\x99\x9a\x9b\x9c\x9d\x9e\x9f"
					 "\xa0\xa1\xa2";
	static const char auth[] = "\x00\x18\x19";
	const char *set;
	size_t n;
#define SET(s) (set = (s), n = sizeof(s) - 1)
	switch (type) {
	case MQ_CONNACK:
		if (version < 5)
			return rc <= 5;
		SET(connack);
		break;
	case MQ_PUBACK:
	case MQ_PUBREC: SET(puback); break;
	case MQ_PUBREL:
	case MQ_PUBCOMP: SET(pubrel); break;
	case MQ_SUBACK:
		if (version < 5)
			return rc <= 2 || rc == 0x80;
		SET(suback);
		break;
	case MQ_UNSUBACK: SET(unsuback); break;
	case MQ_DISCONNECT: SET(disconnect); break;
	case MQ_AUTH: SET(auth); break;
	default: return 0;
	}
#undef SET
	return memchr(set, rc, n) != NULL;
}

static void dec_connect(cur *c, mq_packet *pk)
{
	mq_bytes name = getstr(c);
	uint8_t level = get8(c);
	if (c->err)
		return;
	int mqtt = name.len == 4 && !memcmp(name.p, "MQTT", 4);
	pk->connect.bridge = mqtt && level == 0x84;
	if (pk->connect.bridge)
		level = 4;
	pk->connect.version = level;
	int mqisdp = name.len == 6 && !memcmp(name.p, "MQIsdp", 6);
	if (!mqtt && !mqisdp) {
		fail(c, -MQ_RC_UNSUPPORTED_VERSION);
		return;
	}
	if ((mqtt && level != 4 && level != 5) || (mqisdp && level != 3) || level == 3) {
		fail(c, -MQ_RC_UNSUPPORTED_VERSION);
		return;
	}
	uint8_t f = get8(c);
	pk->connect.keep_alive = get16(c);
	if (c->err)
		return;
	if (f & 1) {
		fail(c, -MQ_RC_MALFORMED);
		return;
	}
	pk->connect.clean = (f >> 1) & 1;
	pk->connect.will = (f >> 2) & 1;
	pk->connect.will_qos = (f >> 3) & 3;
	pk->connect.will_retain = (f >> 5) & 1;
	pk->connect.has_password = (f >> 6) & 1;
	pk->connect.has_username = (f >> 7) & 1;
	if (pk->connect.will_qos == 3 ||
	    (!pk->connect.will && (pk->connect.will_qos || pk->connect.will_retain)) ||
	    (level == 4 && pk->connect.has_password && !pk->connect.has_username)) {
		fail(c, -MQ_RC_MALFORMED);
		return;
	}
	if (level == 5)
		getprops(c, MQ_CONNECT, &pk->props);
	pk->connect.client_id = getstr(c);
	if (pk->connect.will) {
		if (level == 5)
			getprops(c, 0, &pk->connect.will_props);
		pk->connect.will_topic = getstr(c);
		pk->connect.will_payload = getbin(c);
		if (!c->err && mq_topic_name_check(pk->connect.will_topic.p,
						   pk->connect.will_topic.len) < 0)
			fail(c, -MQ_RC_TOPIC_NAME_INVALID);
	}
	if (pk->connect.has_username)
		pk->connect.username = getstr(c);
	if (pk->connect.has_password)
		pk->connect.password = getbin(c);
}

static void dec_publish(cur *c, mq_packet *pk, int version)
{
	pk->publish.dup = (pk->flags >> 3) & 1;
	pk->publish.qos = (pk->flags >> 1) & 3;
	pk->publish.retain = pk->flags & 1;
	if (pk->publish.qos == 3 || (pk->publish.qos == 0 && pk->publish.dup)) {
		fail(c, -MQ_RC_MALFORMED);
		return;
	}
	pk->publish.topic = getstr(c);
	if (pk->publish.qos) {
		pk->packet_id = get16(c);
		if (!c->err && !pk->packet_id)
			fail(c, -MQ_RC_PROTOCOL_ERROR);
	}
	if (version == 5)
		getprops(c, MQ_PUBLISH, &pk->props);
	if (c->err)
		return;
	mq_bytes t = pk->publish.topic;
	if (memchr(t.p ? t.p : (const uint8_t *)"", '+', t.len) ||
	    memchr(t.p ? t.p : (const uint8_t *)"", '#', t.len))
		fail(c, -MQ_RC_TOPIC_NAME_INVALID);
	else if (t.len == 0 && (version < 5 || !MQ_HAS(&pk->props, MQ_P_TOPIC_ALIAS)))
		fail(c, version < 5 ? -MQ_RC_TOPIC_NAME_INVALID : -MQ_RC_PROTOCOL_ERROR);
	pk->publish.payload.p = c->p;
	pk->publish.payload.len = (uint32_t)left(c);
	c->p = c->end;
}

/* PUBACK, PUBREC, PUBREL, PUBCOMP; in 5.0 also the tail of DISCONNECT and AUTH (no id). */
static void dec_ack(cur *c, mq_packet *pk, int version, int has_id)
{
	if (has_id) {
		pk->packet_id = get16(c);
		if (!c->err && !pk->packet_id)
			fail(c, -MQ_RC_PROTOCOL_ERROR);
	}
	if (version < 5 || c->err)
		return;
	if (left(c) == 0)
		return; /* reason 0, no properties */
	pk->reason = get8(c);
	if (!rc_allowed(pk->type, version, pk->reason))
		fail(c, -MQ_RC_PROTOCOL_ERROR);
	if (left(c) > 0)
		getprops(c, pk->type, &pk->props);
}

static void dec_subscribe(cur *c, mq_packet *pk, int version)
{
	pk->packet_id = get16(c);
	if (!c->err && !pk->packet_id)
		fail(c, -MQ_RC_PROTOCOL_ERROR);
	if (version == 5)
		getprops(c, pk->type, &pk->props);
	if (c->err)
		return;
	pk->sub.list.p = c->p;
	pk->sub.list.len = (uint32_t)left(c);
	if (left(c) == 0)
		fail(c, -MQ_RC_PROTOCOL_ERROR); /* at least one filter [MQTT-3.8.3-2] */
	while (left(c) > 0 && !c->err) {
		getstr(c);
		if (pk->type != MQ_SUBSCRIBE)
			continue;
		uint8_t o = get8(c);
		if (c->err)
			break;
		if ((version < 5 && (o & 0xFC)) || (o & 0xC0) || (o & 3) == 3)
			fail(c, -MQ_RC_MALFORMED);
		else if (((o >> 4) & 3) == 3)
			fail(c, -MQ_RC_PROTOCOL_ERROR);
	}
}

static void dec_suback(cur *c, mq_packet *pk, int version)
{
	pk->packet_id = get16(c);
	if (!c->err && !pk->packet_id)
		fail(c, -MQ_RC_PROTOCOL_ERROR);
	if (version == 5)
		getprops(c, pk->type, &pk->props);
	if (c->err)
		return;
	pk->sub.list.p = c->p;
	pk->sub.list.len = (uint32_t)left(c);
	if (pk->type == MQ_UNSUBACK && version < 5) {
		if (left(c))
			fail(c, -MQ_RC_MALFORMED);
		return;
	}
	if (left(c) == 0)
		fail(c, -MQ_RC_PROTOCOL_ERROR);
	for (; left(c) > 0; c->p++)
		if (!rc_allowed(pk->type, version, *c->p)) {
			fail(c, -MQ_RC_PROTOCOL_ERROR);
			break;
		}
}

int mq_decode(const uint8_t *buf, size_t len, int version, mq_packet *pk)
{
	memset(pk, 0, sizeof *pk);
	int hdr;
	long total = mq_frame(buf, len, &hdr);
	if (total <= 0 || (size_t)total != len)
		return -MQ_RC_MALFORMED;
	pk->type = buf[0] >> 4;
	pk->flags = buf[0] & 15;
	cur c = { buf + hdr, buf + len, 0 };
	uint8_t want = (pk->type == MQ_PUBREL || pk->type == MQ_SUBSCRIBE ||
			pk->type == MQ_UNSUBSCRIBE) ? 2 : 0;
	if (pk->type == 0 || (pk->type == MQ_AUTH && version < 5))
		return -MQ_RC_MALFORMED;
	if (pk->type != MQ_PUBLISH && pk->flags != want)
		return -MQ_RC_MALFORMED;
	if (pk->type != MQ_CONNECT && version != 4 && version != 5)
		return -MQ_RC_PROTOCOL_ERROR;
	switch (pk->type) {
	case MQ_CONNECT:
		dec_connect(&c, pk);
		break;
	case MQ_CONNACK:
		pk->connack.session_present = get8(&c);
		pk->reason = get8(&c);
		if (!c.err && (pk->connack.session_present & 0xFE))
			fail(&c, -MQ_RC_MALFORMED);
		if (!c.err && !rc_allowed(MQ_CONNACK, version, pk->reason))
			fail(&c, -MQ_RC_PROTOCOL_ERROR);
		if (version == 5)
			getprops(&c, MQ_CONNACK, &pk->props);
		break;
	case MQ_PUBLISH:
		dec_publish(&c, pk, version);
		break;
	case MQ_PUBACK:
	case MQ_PUBREC:
	case MQ_PUBREL:
	case MQ_PUBCOMP:
		dec_ack(&c, pk, version, 1);
		break;
	case MQ_SUBSCRIBE:
	case MQ_UNSUBSCRIBE:
		dec_subscribe(&c, pk, version);
		break;
	case MQ_SUBACK:
	case MQ_UNSUBACK:
		dec_suback(&c, pk, version);
		break;
	case MQ_PINGREQ:
	case MQ_PINGRESP:
		break;
	case MQ_DISCONNECT:
	case MQ_AUTH:
		dec_ack(&c, pk, version, 0);
		break;
	}
	if (c.err)
		return c.err;
	if (c.p != c.end)
		return -MQ_RC_MALFORMED; /* bytes left over: the lengths disagree */
	return 0;
}

int mq_sub_next(const mq_packet *pk, uint32_t *pos, mq_bytes *filter, uint8_t *opts)
{
	if (*pos >= pk->sub.list.len)
		return 0;
	cur c = { pk->sub.list.p + *pos, pk->sub.list.p + pk->sub.list.len, 0 };
	*filter = getbin(&c);
	if (opts)
		*opts = get8(&c);
	if (c.err)
		return 0;
	*pos = (uint32_t)(c.p - pk->sub.list.p);
	return 1;
}

/* ---- matching one filter ------------------------------------------------------------------- */

static size_t lvl_end(const char *s, size_t i, size_t n)
{
	const char *p = memchr(s + i, '/', n - i);
	return p ? (size_t)(p - s) : n;
}

static bool lvl_is(const char *s, size_t i, size_t e, char c)
{
	return e - i == 1 && s[i] == c;
}

/* The rest of s from i (at a '/') is exactly "/#". */
static bool lvl_rest_hash(const char *s, size_t i, size_t n)
{
	return n - i == 2 && s[i] == '/' && s[i + 1] == '#';
}

bool mq_topic_match(const char *f, size_t fl, const char *t, size_t tl)
{
	if (!fl || !tl || (f[0] == '$') != (t[0] == '$')) /* a leading wildcard is no '$' */
		return false;
	size_t i = 0, j = 0;
	for (;;) {
		size_t fe = lvl_end(f, i, fl), te = lvl_end(t, j, tl);
		if (lvl_is(f, i, fe, '#'))
			return true;
		if (!lvl_is(f, i, fe, '+') && (fe - i != te - j || memcmp(f + i, t + j, fe - i)))
			return false;
		i = fe;
		j = te;
		if (i == fl && j == tl)
			return true;
		if (j == tl)
			return lvl_rest_hash(f, i, fl); /* "a/#" matches "a" */
		if (i == fl)
			return false;
		i++;
		j++;
	}
}

/* Whether a filter's topics can start with '$': only if its first character is a literal '$'. */
static bool dollar(const char *f)
{
	return f[0] == '$';
}

bool mq_filter_covers(const char *c, size_t cl, const char *f, size_t fl)
{
	if (!cl || !fl || dollar(c) != dollar(f))
		return false;
	size_t i = 0, j = 0;
	for (;;) {
		size_t ce = lvl_end(c, i, cl), fe = lvl_end(f, j, fl);
		if (lvl_is(c, i, ce, '#'))
			return true;
		if (lvl_is(f, j, fe, '#'))
			return false; /* f reaches deeper than c does */
		if (!lvl_is(c, i, ce, '+') &&
		    (lvl_is(f, j, fe, '+') || ce - i != fe - j || memcmp(c + i, f + j, ce - i)))
			return false;
		i = ce;
		j = fe;
		if (i == cl && j == fl)
			return true;
		if (j == fl)
			return lvl_rest_hash(c, i, cl);
		if (i == cl)
			return false;
		i++;
		j++;
	}
}

bool mq_filter_overlaps(const char *a, size_t al, const char *b, size_t bl)
{
	if (!al || !bl || dollar(a) != dollar(b))
		return false;
	size_t i = 0, j = 0;
	for (;;) {
		size_t ae = lvl_end(a, i, al), be = lvl_end(b, j, bl);
		if (lvl_is(a, i, ae, '#') || lvl_is(b, j, be, '#'))
			return true;
		if (!lvl_is(a, i, ae, '+') && !lvl_is(b, j, be, '+') &&
		    (ae - i != be - j || memcmp(a + i, b + j, ae - i)))
			return false;
		i = ae;
		j = be;
		if (i == al && j == bl)
			return true;
		if (i == al)
			return lvl_rest_hash(b, j, bl);
		if (j == bl)
			return lvl_rest_hash(a, i, al);
		i++;
		j++;
	}
}
