/* Tests of weft-mqtt's packet codec: valid packets of every type decode to the right fields,
 * malformed ones are rejected with the reason code the specification names. */
#include <string.h>

#include "codec.h"
#include "test.h"

static int dec(const char *h, int version, mq_packet *pk)
{
	static uint8_t buf[1024];
	size_t n = test_unhex(h, buf);
	return mq_decode(buf, n, version, pk);
}

static int eq(mq_bytes b, const char *s)
{
	return b.len == strlen(s) && !memcmp(b.p, s, b.len);
}

TEST(frame_lengths)
{
	uint8_t b[8] = { 0x30, 0x80, 0x01 };
	int hdr;
	CHECK_EQ(mq_frame(b, 3, &hdr), 128 + 3);
	CHECK_EQ(hdr, 3);
	CHECK_EQ(mq_frame(b, 2, &hdr), 0); /* incomplete */
	uint8_t bad[6] = { 0x30, 0xff, 0xff, 0xff, 0xff, 0x01 };
	CHECK_EQ(mq_frame(bad, 6, &hdr), -MQ_RC_MALFORMED); /* 5-byte length */
	uint8_t nonmin[3] = { 0x30, 0x80, 0x00 };
	CHECK_EQ(mq_frame(nonmin, 3, &hdr), -MQ_RC_MALFORMED);
	uint8_t v[4];
	CHECK_EQ(mq_varint_put(v, 268435455), 4);
	CHECK_EQ(mq_varint_len(127), 1);
	CHECK_EQ(mq_varint_len(128), 2);
}

TEST(connect_311)
{
	mq_packet pk;
	/* MQTT 4, clean, will qos1 retain, user+pass, keepalive 60, id "c1", will t/"bye" */
	CHECK_EQ(dec("10 22 0004 4d515454 04 ee 003c 0002 6331 0001 74 0003 627965 0001 75 0002 7077", 4, &pk), -MQ_RC_MALFORMED);
	CHECK_EQ(dec("10 1d 0004 4d515454 04 ee 003c 0002 6331 0001 74 0003 627965 0001 75 0002 7077", 4, &pk), 0);
	CHECK_EQ(pk.type, MQ_CONNECT);
	CHECK_EQ(pk.connect.version, 4);
	CHECK_EQ(pk.connect.clean, 1);
	CHECK_EQ(pk.connect.will, 1);
	CHECK_EQ(pk.connect.will_qos, 1);
	CHECK_EQ(pk.connect.will_retain, 1);
	CHECK_EQ(pk.connect.keep_alive, 60);
	CHECK(eq(pk.connect.client_id, "c1"));
	CHECK(eq(pk.connect.will_topic, "t"));
	CHECK(eq(pk.connect.will_payload, "bye"));
	CHECK(eq(pk.connect.username, "u"));
	CHECK(eq(pk.connect.password, "pw"));
}

TEST(connect_rejects)
{
	mq_packet pk;
	/* reserved flag bit set */
	CHECK_EQ(dec("10 0e 0004 4d515454 04 03 003c 0002 6331", 4, &pk), -MQ_RC_MALFORMED);
	/* will qos without will flag */
	CHECK_EQ(dec("10 0e 0004 4d515454 04 0a 003c 0002 6331", 4, &pk), -MQ_RC_MALFORMED);
	/* password without user name in 3.1.1 */
	CHECK_EQ(dec("10 12 0004 4d515454 04 42 003c 0002 6331 0002 7077", 4, &pk), -MQ_RC_MALFORMED);
	/* unknown level */
	CHECK_EQ(dec("10 0e 0004 4d515454 07 02 003c 0002 6331", 4, &pk), -MQ_RC_UNSUPPORTED_VERSION);
	CHECK_EQ(pk.connect.version, 7);
	/* wrong protocol name */
	CHECK_EQ(dec("10 0e 0004 4d515458 04 02 003c 0002 6331", 4, &pk), -MQ_RC_UNSUPPORTED_VERSION);
	/* client id with U+0000 */
	CHECK_EQ(dec("10 0e 0004 4d515454 04 02 003c 0002 6300", 4, &pk), -MQ_RC_MALFORMED);
	/* string longer than the packet */
	CHECK_EQ(dec("10 0e 0004 4d515454 04 02 003c 0009 6331", 4, &pk), -MQ_RC_MALFORMED);
	/* flags on the fixed header */
	CHECK_EQ(dec("11 0e 0004 4d515454 04 02 003c 0002 6331", 4, &pk), -MQ_RC_MALFORMED);
}

TEST(connect_5_properties)
{
	mq_packet pk;
	/* props: session expiry 300, receive max 10, topic alias max 5, user prop a=b */
	CHECK_EQ(dec("10 21 0004 4d515454 05 02 001e 12 11 0000012c 21 000a 22 0005 26 0001 61 0001 62 0002 6331", 5, &pk), 0);
	CHECK_EQ(pk.connect.version, 5);
	CHECK_EQ(pk.props.session_expiry, 300);
	CHECK_EQ(pk.props.receive_max, 10);
	CHECK_EQ(pk.props.topic_alias_max, 5);
	CHECK(MQ_HAS(&pk.props, MQ_P_USER_PROPERTY));
	CHECK(eq(pk.connect.client_id, "c1"));
	/* duplicate session expiry: protocol error */
	CHECK_EQ(dec("10 1c 0004 4d515454 05 02 001e 0d 11 0000012c 11 0000012c 21 000a 0002 6331", 5, &pk), -MQ_RC_PROTOCOL_ERROR);
	/* receive maximum 0: protocol error */
	CHECK_EQ(dec("10 12 0004 4d515454 05 02 001e 03 21 0000 0002 6331", 5, &pk), -MQ_RC_PROTOCOL_ERROR);
	/* topic alias (PUBLISH only) in CONNECT: protocol error */
	CHECK_EQ(dec("10 12 0004 4d515454 05 02 001e 03 23 0001 0002 6331", 5, &pk), -MQ_RC_PROTOCOL_ERROR);
	/* unknown property id 0x7f: malformed */
	CHECK_EQ(dec("10 11 0004 4d515454 05 02 001e 02 7f 00 0002 6331", 5, &pk), -MQ_RC_MALFORMED);
	/* property length past the packet */
	CHECK_EQ(dec("10 0f 0004 4d515454 05 02 001e 09 0002 6331", 5, &pk), -MQ_RC_MALFORMED);
	/* will with will delay and a message expiry */
	CHECK_EQ(dec("10 20 0004 4d515454 05 06 001e 00 0002 6331 0a 18 0000000a 02 00000005 0001 74 0001 78", 5, &pk), 0);
	CHECK_EQ(pk.connect.will_props.will_delay, 10);
	CHECK_EQ(pk.connect.will_props.message_expiry, 5);
	/* will delay in CONNECT's own properties: protocol error */
	CHECK_EQ(dec("10 14 0004 4d515454 05 02 001e 05 18 0000000a 0002 6331", 5, &pk), -MQ_RC_PROTOCOL_ERROR);
}

TEST(publish)
{
	mq_packet pk;
	CHECK_EQ(dec("30 07 0003 612f62 6869", 4, &pk), 0);
	CHECK(eq(pk.publish.topic, "a/b"));
	CHECK(eq(pk.publish.payload, "hi"));
	CHECK_EQ(pk.publish.qos, 0);
	CHECK_EQ(dec("3b 09 0003 612f62 0007 6869", 4, &pk), 0);
	CHECK_EQ(pk.publish.qos, 1);
	CHECK_EQ(pk.publish.dup, 1);
	CHECK_EQ(pk.publish.retain, 1);
	CHECK_EQ(pk.packet_id, 7);
	CHECK_EQ(dec("32 07 0003 612f62 0000", 4, &pk), -MQ_RC_PROTOCOL_ERROR); /* id 0 */
	CHECK_EQ(dec("32 05 0003 612f62", 4, &pk), -MQ_RC_MALFORMED);          /* no id */
	CHECK_EQ(dec("38 05 0003 612f62", 4, &pk), -MQ_RC_MALFORMED);          /* dup at qos 0 */
	CHECK_EQ(dec("35 07 0003 612f62 0001", 4, &pk), 0);                    /* qos 2, retain */
	CHECK_EQ(dec("32 07 0003 612f2b 0001", 4, &pk), -MQ_RC_TOPIC_NAME_INVALID); /* '+' */
	CHECK_EQ(dec("30 04 0000 6869", 4, &pk), -MQ_RC_TOPIC_NAME_INVALID);   /* empty topic */
	/* 5.0: empty topic with an alias is fine; without one it is a protocol error */
	CHECK_EQ(dec("30 08 0000 03 230001 6869", 5, &pk), 0);
	CHECK_EQ(pk.props.topic_alias, 1);
	CHECK_EQ(dec("30 03 0000 00", 5, &pk), -MQ_RC_PROTOCOL_ERROR);
	/* 5.0 props: expiry 10, content type "t", two user props, two subscription ids */
	CHECK_EQ(dec("30 20 0001 78 1b 02 0000000a 03 0001 74 26 0001 61 0001 62 26 0001 61 0001 63 0b 01 0b 02 ff", 5, &pk), 0);
	CHECK_EQ(pk.props.message_expiry, 10);
	CHECK(eq(pk.props.content_type, "t"));
	CHECK_EQ(pk.props.subscription_id, 1);
	CHECK(eq(pk.publish.payload, "\xff"));
	int users = 0, subids = 0, id;
	uint32_t pos = 0, num;
	mq_bytes v, v2;
	while (mq_props_next(&pk.props.raw, &pos, &id, &num, &v, &v2)) {
		users += id == MQ_P_USER_PROPERTY;
		subids += id == MQ_P_SUBSCRIPTION_ID;
	}
	CHECK_EQ(users, 2);
	CHECK_EQ(subids, 2);
	/* payload format indicator 2: protocol error */
	CHECK_EQ(dec("30 06 0001 78 02 0102", 5, &pk), -MQ_RC_PROTOCOL_ERROR);
	/* bytes beyond the packet's length */
	CHECK_EQ(dec("30 04 0001 78 61 62", 4, &pk), -MQ_RC_MALFORMED);
}

TEST(publish_qos3)
{
	mq_packet pk;
	CHECK_EQ(dec("36 07 0003 612f62 0001", 4, &pk), -MQ_RC_MALFORMED);
}

TEST(acks)
{
	mq_packet pk;
	CHECK_EQ(dec("40 02 0005", 4, &pk), 0);
	CHECK_EQ(pk.type, MQ_PUBACK);
	CHECK_EQ(pk.packet_id, 5);
	CHECK_EQ(dec("40 03 0005 00", 4, &pk), -MQ_RC_MALFORMED); /* 3.1.1: exactly 2 */
	CHECK_EQ(dec("40 03 0005 10", 5, &pk), 0);
	CHECK_EQ(pk.reason, 0x10);
	CHECK_EQ(dec("40 03 0005 92", 5, &pk), -MQ_RC_PROTOCOL_ERROR); /* not a PUBACK code */
	CHECK_EQ(dec("62 02 0005", 4, &pk), 0);
	CHECK_EQ(pk.type, MQ_PUBREL);
	CHECK_EQ(dec("60 02 0005", 4, &pk), -MQ_RC_MALFORMED); /* PUBREL flags must be 0010 */
	CHECK_EQ(dec("62 03 0005 92", 5, &pk), 0);
	CHECK_EQ(dec("70 07 0005 00 03 1f 0005", 5, &pk), -MQ_RC_MALFORMED); /* props short */
	CHECK_EQ(dec("70 08 0005 00 04 1f 0001 78", 5, &pk), 0);
	CHECK(eq(pk.props.reason_string, "x"));
	CHECK_EQ(dec("50 02 0000", 4, &pk), -MQ_RC_PROTOCOL_ERROR); /* id 0 */
}

TEST(subscribe)
{
	mq_packet pk;
	CHECK_EQ(dec("82 0c 0001 0003 612f23 01 0001 62 02", 4, &pk), 0);
	uint32_t pos = 0;
	mq_bytes f;
	uint8_t o;
	CHECK(mq_sub_next(&pk, &pos, &f, &o));
	CHECK(eq(f, "a/#"));
	CHECK_EQ(o, 1);
	CHECK(mq_sub_next(&pk, &pos, &f, &o));
	CHECK(eq(f, "b"));
	CHECK_EQ(o, 2);
	CHECK(!mq_sub_next(&pk, &pos, &f, &o));
	CHECK_EQ(dec("82 02 0001", 4, &pk), -MQ_RC_PROTOCOL_ERROR);          /* no filter */
	CHECK_EQ(dec("80 06 0001 0001 62 00", 4, &pk), -MQ_RC_MALFORMED);    /* flags */
	CHECK_EQ(dec("82 06 0001 0001 62 03", 4, &pk), -MQ_RC_MALFORMED);    /* qos 3 */
	CHECK_EQ(dec("82 06 0001 0001 62 04", 4, &pk), -MQ_RC_MALFORMED);    /* 3.1.1 reserved */
	CHECK_EQ(dec("82 07 0001 00 0001 62 2e", 5, &pk), 0);                /* nl rap rh=2 */
	CHECK_EQ(dec("82 07 0001 00 0001 62 30", 5, &pk), -MQ_RC_PROTOCOL_ERROR); /* rh 3 */
	CHECK_EQ(dec("82 07 0001 00 0001 62 40", 5, &pk), -MQ_RC_MALFORMED); /* reserved bit */
	CHECK_EQ(dec("82 09 0001 02 0b 07 0001 62 00", 5, &pk), 0);
	CHECK_EQ(pk.props.subscription_id, 7);
	CHECK_EQ(dec("82 0b 0001 04 0b 07 0b 08 0001 62 00", 5, &pk), -MQ_RC_PROTOCOL_ERROR);
	CHECK_EQ(dec("82 09 0001 02 0b 00 0001 62 00", 5, &pk), -MQ_RC_PROTOCOL_ERROR); /* id 0 */
	CHECK_EQ(dec("a2 08 0002 0001 61 0001 62", 4, &pk), 0);
	CHECK_EQ(pk.type, MQ_UNSUBSCRIBE);
	pos = 0;
	CHECK(mq_sub_next(&pk, &pos, &f, NULL));
	CHECK(eq(f, "a"));
	CHECK_EQ(dec("a2 02 0002", 4, &pk), -MQ_RC_PROTOCOL_ERROR);
}

TEST(server_packets)
{
	mq_packet pk;
	CHECK_EQ(dec("20 02 00 00", 4, &pk), 0);
	CHECK_EQ(dec("20 02 02 00", 4, &pk), -MQ_RC_MALFORMED);
	CHECK_EQ(dec("20 02 00 06", 4, &pk), -MQ_RC_PROTOCOL_ERROR);
	CHECK_EQ(dec("20 03 01 00 00", 5, &pk), 0);
	CHECK_EQ(pk.connack.session_present, 1);
	CHECK_EQ(dec("20 03 00 86 00", 5, &pk), 0);
	CHECK_EQ(dec("20 03 00 05 00", 5, &pk), -MQ_RC_PROTOCOL_ERROR);
	CHECK_EQ(dec("90 04 0001 00 80", 4, &pk), 0);
	CHECK_EQ(dec("90 04 0001 00 87", 4, &pk), -MQ_RC_PROTOCOL_ERROR);
	CHECK_EQ(dec("90 05 0001 00 00 87", 5, &pk), 0);
	CHECK_EQ(dec("b0 02 0001", 4, &pk), 0);
	CHECK_EQ(dec("b0 04 0001 00 11", 5, &pk), 0);
	CHECK_EQ(dec("c0 00", 4, &pk), 0);
	CHECK_EQ(dec("c0 01 00", 4, &pk), -MQ_RC_MALFORMED);
	CHECK_EQ(dec("d0 00", 4, &pk), 0);
	CHECK_EQ(dec("e0 00", 4, &pk), 0);
	CHECK_EQ(dec("e0 01 00", 4, &pk), -MQ_RC_MALFORMED);
	CHECK_EQ(dec("e0 01 8e", 5, &pk), 0);
	CHECK_EQ(pk.reason, 0x8e);
	CHECK_EQ(dec("e0 01 10", 5, &pk), -MQ_RC_PROTOCOL_ERROR);
	CHECK_EQ(dec("e0 07 00 05 11 0000000a", 5, &pk), 0);
	CHECK_EQ(pk.props.session_expiry, 10);
	CHECK_EQ(dec("f0 00", 5, &pk), 0);
	CHECK_EQ(dec("f0 00", 4, &pk), -MQ_RC_MALFORMED);
	CHECK_EQ(dec("00 00", 4, &pk), -MQ_RC_MALFORMED);
}

TEST(utf8)
{
	CHECK_EQ(mq_utf8_check((const uint8_t *)"h\xc3\xa9llo", 6), 0);
	CHECK_EQ(mq_utf8_check((const uint8_t *)"\xf0\x9f\x98\x80", 4), 0);
	CHECK(mq_utf8_check((const uint8_t *)"\xc0\xaf", 2) < 0);       /* overlong */
	CHECK(mq_utf8_check((const uint8_t *)"\xed\xa0\x80", 3) < 0);   /* surrogate */
	CHECK(mq_utf8_check((const uint8_t *)"\xc3", 1) < 0);           /* truncated */
	CHECK(mq_utf8_check((const uint8_t *)"\xf4\x90\x80\x80", 4) < 0); /* > U+10FFFF */
}

TEST(filters)
{
#define F(s) mq_topic_filter_check((const uint8_t *)(s), strlen(s))
	CHECK_EQ(F("a/b"), 0);
	CHECK_EQ(F("#"), 0);
	CHECK_EQ(F("a/#"), 0);
	CHECK_EQ(F("+/+/c"), 0);
	CHECK_EQ(F("+"), 0);
	CHECK_EQ(F("/"), 0);
	CHECK(F("a/#/b") < 0);
	CHECK(F("a#") < 0);
	CHECK(F("a+/b") < 0);
	CHECK(F("") < 0);
	CHECK_EQ(F("$share/g/a/+"), 0);
	CHECK(F("$share/g") < 0);
	CHECK(F("$share//a") < 0);
	CHECK(F("$share/g+/a") < 0);
	CHECK(F("$share/g/") < 0);
#undef F
}

TEST(encode_roundtrip)
{
	uint8_t buf[256], pb[64];
	mq_pb props = { pb, 0, sizeof pb, 0 };
	mq_pb_u32(&props, MQ_P_SESSION_EXPIRY, 60);
	mq_pb_u16(&props, MQ_P_RECEIVE_MAX, 20);
	mq_pb_bytes(&props, MQ_P_ASSIGNED_CLIENT_ID, "auto-1", 6);
	mq_pb_pair(&props, "k", 1, "v", 1);
	size_t n = mq_enc_connack(buf, 5, 1, 0, &props);
	CHECK_EQ(n, mq_enc_connack(NULL, 5, 1, 0, &props));
	mq_packet pk;
	CHECK_EQ(mq_decode(buf, n, 5, &pk), 0);
	CHECK_EQ(pk.props.session_expiry, 60);
	CHECK(eq(pk.props.assigned_client_id, "auto-1"));
	mq_pub_enc e = { 5, 2, 1, 1, 99, "x/y", 3, pb, props.len, "payload", 7, NULL, 0 };
	mq_pb p2 = { pb, 0, sizeof pb, 0 };
	mq_pb_varint(&p2, MQ_P_SUBSCRIPTION_ID, 300);
	mq_pb_varint(&p2, MQ_P_SUBSCRIPTION_ID, 2);
	e.props_len = p2.len;
	n = mq_enc_publish(buf, &e);
	CHECK_EQ(n, mq_enc_publish_len(&e));
	CHECK_EQ(mq_decode(buf, n, 5, &pk), 0);
	CHECK_EQ(pk.publish.qos, 2);
	CHECK_EQ(pk.packet_id, 99);
	CHECK_EQ(pk.props.subscription_id, 300);
	CHECK(eq(pk.publish.payload, "payload"));
	n = mq_enc_ack(buf, 5, MQ_PUBREL, 4, 0x92, NULL);
	CHECK_EQ(mq_decode(buf, n, 5, &pk), 0);
	CHECK_EQ(pk.reason, 0x92);
	n = mq_enc_ack(buf, 4, MQ_PUBACK, 4, 0, NULL);
	CHECK_EQ(n, 4);
	uint8_t codes[2] = { 1, 0x80 };
	n = mq_enc_suback(buf, 4, MQ_SUBACK, 3, codes, 2, NULL);
	CHECK_EQ(mq_decode(buf, n, 4, &pk), 0);
	n = mq_enc_suback(buf, 4, MQ_UNSUBACK, 3, codes, 2, NULL);
	CHECK_EQ(n, 4);
	CHECK_EQ(mq_decode(buf, n, 4, &pk), 0);
	n = mq_enc_disconnect(buf, 5, 0x8e, NULL);
	CHECK_EQ(mq_decode(buf, n, 5, &pk), 0);
	CHECK_EQ(pk.reason, 0x8e);
	n = mq_enc_connect(buf, &(mq_connect_enc){
			.version = 5, .client_id = "me", .clean = 1, .keep_alive = 10 });
	CHECK_EQ(mq_decode(buf, n, 5, &pk), 0);
	CHECK(eq(pk.connect.client_id, "me"));
	/* everything a CONNECT may carry, as a bridge sends it, and back */
	uint8_t pb2[16];
	mq_pb cp = { pb2, 0, sizeof pb2, 0 };
	mq_pb_u32(&cp, MQ_P_SESSION_EXPIRY, 77);
	for (int v = 4; v <= 5; v++) {
		mq_connect_enc e = { .version = v, .client_id = "br", .keep_alive = 30,
				     .props = &cp, .will_topic = "n/br", .will_payload = "0",
				     .will_len = 1, .will_qos = 1, .will_retain = 1,
				     .username = "u", .password = "pw" };
		n = mq_enc_connect(buf, &e);
		CHECK_EQ(n, mq_enc_connect(NULL, &e));
		CHECK_EQ(mq_decode(buf, n, 5, &pk), 0);
		CHECK_EQ(pk.connect.version, v);
		CHECK(!pk.connect.clean && pk.connect.will && pk.connect.will_qos == 1);
		CHECK(pk.connect.will_retain && pk.connect.has_username && pk.connect.has_password);
		CHECK(eq(pk.connect.will_topic, "n/br") && eq(pk.connect.will_payload, "0"));
		CHECK(eq(pk.connect.username, "u") && eq(pk.connect.password, "pw"));
		CHECK_EQ(pk.connect.keep_alive, 30);
		CHECK_EQ(v == 5 ? pk.props.session_expiry : 77, 77);
	}
	mq_connect_enc b84 = { .version = 4, .level = 0x84, .client_id = "br", .clean = 1 };
	n = mq_enc_connect(buf, &b84);
	CHECK_EQ(mq_decode(buf, n, 5, &pk), 0);
	CHECK(pk.connect.bridge && pk.connect.version == 4);
	n = mq_enc_subscribe(buf, 4, 1, "a/+", 1, NULL);
	CHECK_EQ(mq_decode(buf, n, 4, &pk), 0);
	for (int v = 4; v <= 5; v++) {
		n = mq_enc_unsubscribe(buf, v, 9, "a/#");
		CHECK(n <= strlen("a/#") + 16);
		CHECK_EQ(mq_decode(buf, n, v, &pk), 0);
		CHECK(pk.type == MQ_UNSUBSCRIBE && pk.packet_id == 9);
	}
	mq_pb tiny = { pb, 0, 2, 0 };
	mq_pb_u32(&tiny, MQ_P_SESSION_EXPIRY, 1);
	CHECK(tiny.overflow);
}

/* Every prefix of a valid packet is incomplete, never an error or a crash. */
TEST(truncations)
{
	uint8_t buf[64];
	size_t n = test_unhex("10 21 0004 4d515454 05 02 001e 12 11 0000012c 21 000a 22 0005 26 0001 61 0001 62 0002 6331", buf);
	for (size_t k = 0; k < n; k++) {
		int hdr;
		CHECK_EQ(mq_frame(buf, k, &hdr), k < 2 ? 0 : (long)n);
		mq_packet pk;
		CHECK(mq_decode(buf, k, 5, &pk) < 0);
	}
}
