/*
 * codec.h - MQTT 3.1.1 and 5.0 packets: framing, decoding with the specifications' MUST
 * checks, properties, and encoders for what a broker sends.
 *
 * Decoding is zero-copy: strings and binary fields of a decoded packet point into the buffer
 * that was decoded, which must outlive the mq_packet. Every function that can reject input
 * returns a negative MQTT 5.0 reason code (-MQ_RC_MALFORMED, -MQ_RC_PROTOCOL_ERROR, ...), so a
 * broker can put it straight into the DISCONNECT it sends to a 5.0 client.
 */
#ifndef WEFT_MQTT_CODEC_H
#define WEFT_MQTT_CODEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum mq_type {
	MQ_CONNECT = 1, MQ_CONNACK, MQ_PUBLISH, MQ_PUBACK, MQ_PUBREC, MQ_PUBREL, MQ_PUBCOMP,
	MQ_SUBSCRIBE, MQ_SUBACK, MQ_UNSUBSCRIBE, MQ_UNSUBACK, MQ_PINGREQ, MQ_PINGRESP,
	MQ_DISCONNECT, MQ_AUTH,
};

/* Reason codes (MQTT 5.0, 2.4). */
enum {
	MQ_RC_SUCCESS = 0x00, MQ_RC_GRANTED_QOS1 = 0x01, MQ_RC_GRANTED_QOS2 = 0x02,
	MQ_RC_DISCONNECT_WITH_WILL = 0x04, MQ_RC_NO_MATCHING_SUBSCRIBERS = 0x10,
	MQ_RC_NO_SUBSCRIPTION_EXISTED = 0x11, MQ_RC_CONTINUE_AUTH = 0x18, MQ_RC_REAUTHENTICATE = 0x19,
	MQ_RC_UNSPECIFIED = 0x80, MQ_RC_MALFORMED = 0x81, MQ_RC_PROTOCOL_ERROR = 0x82,
	MQ_RC_IMPL_SPECIFIC = 0x83, MQ_RC_UNSUPPORTED_VERSION = 0x84, MQ_RC_CLIENT_ID_INVALID = 0x85,
	MQ_RC_BAD_USER_OR_PASSWORD = 0x86, MQ_RC_NOT_AUTHORIZED = 0x87,
	MQ_RC_SERVER_UNAVAILABLE = 0x88, MQ_RC_SERVER_BUSY = 0x89, MQ_RC_BANNED = 0x8A,
	MQ_RC_SERVER_SHUTTING_DOWN = 0x8B, MQ_RC_BAD_AUTH_METHOD = 0x8C,
	MQ_RC_KEEP_ALIVE_TIMEOUT = 0x8D, MQ_RC_SESSION_TAKEN_OVER = 0x8E,
	MQ_RC_TOPIC_FILTER_INVALID = 0x8F, MQ_RC_TOPIC_NAME_INVALID = 0x90,
	MQ_RC_PACKET_ID_IN_USE = 0x91, MQ_RC_PACKET_ID_NOT_FOUND = 0x92,
	MQ_RC_RECEIVE_MAX_EXCEEDED = 0x93, MQ_RC_TOPIC_ALIAS_INVALID = 0x94,
	MQ_RC_PACKET_TOO_LARGE = 0x95, MQ_RC_MESSAGE_RATE_TOO_HIGH = 0x96,
	MQ_RC_QUOTA_EXCEEDED = 0x97, MQ_RC_ADMIN_ACTION = 0x98, MQ_RC_PAYLOAD_FORMAT_INVALID = 0x99,
	MQ_RC_RETAIN_NOT_SUPPORTED = 0x9A, MQ_RC_QOS_NOT_SUPPORTED = 0x9B,
	MQ_RC_USE_ANOTHER_SERVER = 0x9C, MQ_RC_SERVER_MOVED = 0x9D,
	MQ_RC_SHARED_SUBS_NOT_SUPPORTED = 0x9E, MQ_RC_CONNECTION_RATE_EXCEEDED = 0x9F,
	MQ_RC_MAX_CONNECT_TIME = 0xA0, MQ_RC_SUB_IDS_NOT_SUPPORTED = 0xA1,
	MQ_RC_WILDCARD_SUBS_NOT_SUPPORTED = 0xA2,
};

/* 3.1.1 CONNACK return codes. */
enum {
	MQ_V3_ACCEPTED = 0, MQ_V3_BAD_VERSION = 1, MQ_V3_ID_REJECTED = 2, MQ_V3_UNAVAILABLE = 3,
	MQ_V3_BAD_USER_OR_PASSWORD = 4, MQ_V3_NOT_AUTHORIZED = 5,
};

/* Property identifiers (MQTT 5.0, 2.2.2.2). */
enum {
	MQ_P_PAYLOAD_FORMAT = 0x01, MQ_P_MESSAGE_EXPIRY = 0x02, MQ_P_CONTENT_TYPE = 0x03,
	MQ_P_RESPONSE_TOPIC = 0x08, MQ_P_CORRELATION_DATA = 0x09, MQ_P_SUBSCRIPTION_ID = 0x0B,
	MQ_P_SESSION_EXPIRY = 0x11, MQ_P_ASSIGNED_CLIENT_ID = 0x12, MQ_P_SERVER_KEEP_ALIVE = 0x13,
	MQ_P_AUTH_METHOD = 0x15, MQ_P_AUTH_DATA = 0x16, MQ_P_REQUEST_PROBLEM_INFO = 0x17,
	MQ_P_WILL_DELAY = 0x18, MQ_P_REQUEST_RESPONSE_INFO = 0x19, MQ_P_RESPONSE_INFO = 0x1A,
	MQ_P_SERVER_REFERENCE = 0x1C, MQ_P_REASON_STRING = 0x1F, MQ_P_RECEIVE_MAX = 0x21,
	MQ_P_TOPIC_ALIAS_MAX = 0x22, MQ_P_TOPIC_ALIAS = 0x23, MQ_P_MAX_QOS = 0x24,
	MQ_P_RETAIN_AVAILABLE = 0x25, MQ_P_USER_PROPERTY = 0x26, MQ_P_MAX_PACKET_SIZE = 0x27,
	MQ_P_WILDCARD_SUB_AVAILABLE = 0x28, MQ_P_SUB_ID_AVAILABLE = 0x29,
	MQ_P_SHARED_SUB_AVAILABLE = 0x2A,
};

/* A span of bytes inside a decoded buffer (strings are not NUL-terminated). */
typedef struct mq_bytes {
	const uint8_t *p;
	uint32_t len;
} mq_bytes;

/*
 * The properties of one packet. `has` has bit (1 << id) set for each property present (ids
 * are below 64). Subscription identifiers may repeat in a PUBLISH (the broker sends several);
 * user properties may repeat anywhere: both are left in `raw`, walked with mq_props_next.
 */
typedef struct mq_props {
	uint64_t has;
	mq_bytes raw;           /* the whole property block, without its length */
	uint8_t payload_format, request_problem_info, request_response_info, max_qos,
		retain_available, wildcard_sub_available, sub_id_available, shared_sub_available;
	uint16_t server_keep_alive, receive_max, topic_alias_max, topic_alias;
	uint32_t message_expiry, session_expiry, will_delay, max_packet_size;
	uint32_t subscription_id; /* the first one */
	mq_bytes content_type, response_topic, correlation_data, assigned_client_id,
		auth_method, auth_data, response_info, server_reference, reason_string;
} mq_props;

#define MQ_HAS(pr, id) (((pr)->has >> (id)) & 1)

typedef struct mq_packet {
	uint8_t type, flags;
	uint16_t packet_id;
	uint8_t reason;          /* acks, DISCONNECT, AUTH, CONNACK */
	mq_props props;
	union {
		struct {
			uint8_t version; /* 3 (3.1), 4 (3.1.1) or 5 */
			uint8_t clean, will, will_qos, will_retain, has_username, has_password;
			uint8_t bridge; /* level 0x84: a 3.1.1 bridge (mosquitto's try_private) */
			uint16_t keep_alive;
			mq_bytes client_id, will_topic, will_payload, username, password;
			mq_props will_props;
		} connect;
		struct {
			uint8_t session_present;
		} connack;
		struct {
			uint8_t dup, qos, retain;
			mq_bytes topic, payload;
		} publish;
		struct {
			mq_bytes list;   /* SUBSCRIBE/UNSUBSCRIBE: filters; SUBACK/UNSUBACK: codes */
		} sub;
	};
} mq_packet;

/*
 * Find the first packet in buf[0..len): returns its total length (fixed header included) and
 * sets *hdr to the fixed header's length; 0 when more bytes are needed; -MQ_RC_MALFORMED
 * when the remaining length is badly encoded.
 */
long mq_frame(const uint8_t *buf, size_t len, int *hdr);

/*
 * Decode the one packet in buf[0..len) (a length mq_frame returned). version is the
 * connection's protocol level (4 or 5; for a CONNECT it is ignored: the packet says). Returns 0,
 * or a negative reason code: -MQ_RC_MALFORMED, -MQ_RC_PROTOCOL_ERROR,
 * -MQ_RC_UNSUPPORTED_VERSION (CONNECT of another protocol), -MQ_RC_TOPIC_NAME_INVALID.
 */
int mq_decode(const uint8_t *buf, size_t len, int version, mq_packet *pk);

/*
 * Walk the entries of a decoded SUBSCRIBE (with options) or UNSUBSCRIBE (opts NULL): returns 1
 * with the next filter, 0 at the end. *pos starts at 0.
 */
int mq_sub_next(const mq_packet *pk, uint32_t *pos, mq_bytes *filter, uint8_t *opts);

/* Walk every property of a block: returns 1 with the id and the value's bytes (for varints
 * and integers, the decoded number in *num), 0 at the end. *pos starts at 0. Only for blocks
 * mq_decode accepted. User properties come as key in *v and value in *v2. */
int mq_props_next(const mq_bytes *raw, uint32_t *pos, int *id, uint32_t *num, mq_bytes *v,
		  mq_bytes *v2);

/* Checks (0 or a negative reason code). */
int mq_utf8_check(const uint8_t *p, size_t n);      /* well-formed, no U+0000, no surrogate */
int mq_topic_name_check(const uint8_t *p, size_t n); /* no wildcards, not empty */
int mq_topic_filter_check(const uint8_t *p, size_t n); /* wildcards placed right */
/* Whether topic t matches filter f (both checked already): '+' one level, '#' the rest
 * ("a/#" matches "a" too), and a topic starting with '$' matches only a filter whose first
 * level starts with a literal '$' [MQTT-4.7.2-1]. The one matcher of one filter (the ACL's
 * rules, the bridges' topics); the subscription tree (topic.c) matches all filters at once. */
bool mq_topic_match(const char *f, size_t fl, const char *t, size_t tl);
/* Relations of two filters, by the same rules: every topic f matches, cover matches; some
 * topic matches both (the ACL's SUBSCRIBE checks). */
bool mq_filter_covers(const char *cover, size_t clen, const char *f, size_t flen);
bool mq_filter_overlaps(const char *a, size_t alen, const char *b, size_t blen);

/* ---- encoding ------------------------------------------------------------------------------ */

/* Length of the variable byte integer for v (1..4), and writing it. */
int mq_varint_len(uint32_t v);
int mq_varint_put(uint8_t *out, uint32_t v);

/*
 * A property block builder: properties are appended to buf (cap bytes); mq_pb_* return 0 or
 * -1 when it would overflow (the caller sized it).
 */
typedef struct mq_pb {
	uint8_t *buf;
	uint32_t len, cap;
	int overflow;
} mq_pb;

void mq_pb_byte(mq_pb *b, int id, uint8_t v);
void mq_pb_u16(mq_pb *b, int id, uint16_t v);
void mq_pb_u32(mq_pb *b, int id, uint32_t v);
void mq_pb_varint(mq_pb *b, int id, uint32_t v);
void mq_pb_bytes(mq_pb *b, int id, const void *p, uint32_t n);  /* string or binary */
void mq_pb_pair(mq_pb *b, const void *k, uint16_t kn, const void *v, uint16_t vn);
void mq_pb_raw(mq_pb *b, const void *p, uint32_t n);

/*
 * Encoders write a whole packet to out and return its length; out must hold at least the
 * length returned by passing out NULL (a sizing pass). props is a property block built with
 * mq_pb (5.0 only; ignored for version 4).
 */
size_t mq_enc_connack(uint8_t *out, int version, int session_present, int rc,
		      const mq_pb *props);
size_t mq_enc_ack(uint8_t *out, int version, int type, uint16_t id, int rc, const mq_pb *props);
size_t mq_enc_suback(uint8_t *out, int version, int type, uint16_t id, const uint8_t *codes,
		     int n, const mq_pb *props);
size_t mq_enc_disconnect(uint8_t *out, int version, int rc, const mq_pb *props);
size_t mq_enc_simple(uint8_t *out, int type); /* PINGREQ, PINGRESP */

/* A PUBLISH: topic may be empty when a topic alias stands for it (5.0). props is the whole
 * property block (already built, may be empty); payload is copied after it. */
typedef struct mq_pub_enc {
	int version, qos, dup, retain;
	uint16_t packet_id;
	const void *topic;
	uint16_t topic_len;
	const void *props;
	uint32_t props_len;
	const void *payload;
	uint32_t payload_len;
	const void *props2;       /* more properties, written after props */
	uint32_t props2_len;
} mq_pub_enc;

size_t mq_enc_publish_len(const mq_pub_enc *e);
size_t mq_enc_publish(uint8_t *out, const mq_pub_enc *e);

/* Client-side encoders: a bridge's (bridge.c), and for tests and the fuzz corpus. */
typedef struct mq_connect_enc {
	int version;             /* 4 or 5 */
	uint8_t level;           /* the protocol level sent, if not version (0x84: a 3.1.1 bridge) */
	const char *client_id;
	int clean;
	uint16_t keep_alive;
	const mq_pb *props;      /* 5.0; NULL: none */
	const char *will_topic;  /* NULL: no will (5.0: sent with no will properties) */
	const void *will_payload;
	uint16_t will_len;
	uint8_t will_qos, will_retain;
	const char *username, *password; /* NULL: none */
} mq_connect_enc;

/* A CONNECT; with out NULL only its length. */
size_t mq_enc_connect(uint8_t *out, const mq_connect_enc *e);
/* A SUBSCRIBE of one filter, or an UNSUBSCRIBE (no opts); at most strlen(filter) + 16 bytes
 * when props is NULL. */
size_t mq_enc_subscribe(uint8_t *out, int version, uint16_t id, const char *filter,
			uint8_t opts, const mq_pb *props);
size_t mq_enc_unsubscribe(uint8_t *out, int version, uint16_t id, const char *filter);

#endif
