/*
 * conn.c - one task per client connection: read, decode, run the protocol.
 *
 * The task reads as much as the socket has into a buffer from its worker's pool, handles every
 * whole packet in it, then flushes every session its publishes touched (see session.c): the
 * batch of packets one read brought in becomes one write per receiver. Between batches the
 * task waits for the socket with no buffer at all (weft_fd_wait, then a read that does not
 * wait), so an idle connection costs its task's few stack pages and two small structs.
 *
 * Fairness: a connection whose read filled the buffer yields after handling it, so a client
 * that floods gets one bufferful at a time like everyone else on its worker.
 *
 * A read section of epoch.c spans each batch (topic matching reads the tree without locks,
 * and the sessions it finds stay valid until the flush), never the wait for input.
 *
 * Ending: a protocol error, a malformed or oversized packet, a keep-alive or connect timeout,
 * or a kick from another task (session take-over, shutdown) end the connection; a 5.0 client
 * gets a DISCONNECT with the reason first. The task then detaches from its session (which
 * publishes or schedules the will unless the client said goodbye properly) and closes.
 *
 * Bridges. A bridge to another broker (bridge.c) is a conn too, with the roles reversed:
 * bridge.c connects and reads the CONNACK, then runs this loop in its own task (conn_run).
 * The packets are the same both ways; where they differ the loop asks c->role (conn_role,
 * broker.h: a client's is here, a bridge's in bridge.c): the topic of incoming PUBLISHes
 * (ACL, or mapping), the acknowledgements a server sends, keep-alive (a deadline, or pinging
 * as a client), and the goodbye when the broker stops.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include "acl.h"
#include "auth.h"
#include "broker.h"
#include "tls.h"
#include "ws.h"

#define RBUF 16384
#define CONNECT_TIMEOUT_S 10
#define PARTIAL_TIMEOUT_S 60  /* a half-sent packet with keep-alive off */
#define IN_ALIAS_MAX 10       /* topic aliases a client may set (as mosquitto) */
/* The largest first packet: five strings of 64 KiB (client id, will topic and payload,
 * username, password) and the properties of any client library leave a CONNECT far from
 * this; without a cap before CONNECT, any stranger could make a connection hold 256 MB. */
#define MAX_CONNECT (512u << 10)


static weft_mutex list_lock = WEFT_MUTEX_INIT;
static conn *all;
static long nconns;

long conns_count(void)
{
	long n = 0;
	WEFT_WITH_LOCK(&list_lock)
		n = nconns;
	return n;
}

void conns_shutdown(void)
{
	WEFT_WITH_LOCK(&list_lock)
		for (conn *c = all; c; c = c->next)
			conn_kick(c, MQ_RC_SERVER_SHUTTING_DOWN);
	for (int i = 0; i < 300 && conns_count(); i++)
		weft_sleep_until(weft_now() + 10000000);
}

/* ---- sending -------------------------------------------------------------------------------- */

ssize_t conn_write(conn *c, const void *buf, size_t n, int64_t deadline)
{
	if (c->tls)
		return tls_write(c->tls, buf, n, deadline);
	return weft_write(c->fd, buf, n, deadline);
}

uint8_t *conn_frame(conn *c, uint8_t *buf, size_t *len)
{
	if (!c->ws)
		return buf;
	uint8_t h[10];
	size_t hl = ws_frame_header(h, *len);
	uint8_t *f = pool_alloc(*len + hl);
	memcpy(f, h, hl);
	memcpy(f + hl, buf, *len);
	pool_free(buf);
	*len += hl;
	return f;
}

/* A write outside the session's output (before CONNECT is accepted): framed for WebSockets. */
static void write_now(conn *c, const void *p, size_t n)
{
	if (c->ws) {
		uint8_t h[10];
		size_t hl = ws_frame_header(h, n);
		if (conn_write(c, h, hl, weft_now() + 1000000000) != (ssize_t)hl)
			return;
	}
	conn_write(c, p, n, weft_now() + 1000000000);
}

static void send_pkt(conn *c, const void *p, size_t n)
{
	if (c->s)
		session_send(c->s, p, n, c);
	else
		write_now(c, p, n);
}

/* What the WebSocket layer must send itself (the upgrade's answer, a pong, a close frame).
 * Once a session writes to the socket it must not be interleaved with a frame being written:
 * it goes out only while no writer runs (waiting a little), and a pong that cannot is dropped
 * (the client pings again). */
static void ws_send_reply(conn *c)
{
	uint8_t r[WS_REPLY_MAX];
	size_t n = ws_reply(c->ws, r);
	if (!n)
		return;
	session *s = c->s;
	if (!s) {
		conn_write(c, r, n, weft_now() + 1000000000);
		return;
	}
	WEFT_WITH_LOCK(&s->lock) {
		int64_t dl = weft_now() + 100000000;
		while (s->writing && weft_cond_wait_until(&s->idle, &s->lock, dl) != -ETIMEDOUT)
			;
		if (!s->writing && s->conn == c)
			conn_write(c, r, n, 0);
	}
}

/* A CONNACK refusing the connection (before any session). */
void conn_refuse(conn *c, int version, int rc5, int rc3)
{
	uint8_t b[8];
	size_t n = mq_enc_connack(b, version == 5 ? 5 : 4, 0, version == 5 ? rc5 : rc3, NULL);
	write_now(c, b, n);
}

/* ---- packet handlers ------------------------------------------------------------------------ */

/* The largest packet a connected client may send: the message size limit and room for a
 * PUBLISH's topic and properties, or what the protocol allows. */
static uint32_t in_packet_limit(void)
{
	return conf.message_size_limit ? (uint32_t)conf.message_size_limit + 65536 + 1024
				       : 268435460;
}

/* held: the read buffer the CONNECT is in, which a wait for its password's turn keeps */
static int on_connect(conn *c, mq_packet *pk, size_t held)
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
	c->max_in_packet = in_packet_limit();

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

/* A client's PUBLISH: not to the broker's own $SYS topics, and as its ACL allows. */
static bool client_in_topic(conn *c, const uint8_t **topic, uint16_t *tlen, char **mapped)
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

/* Whether c owes more than its burst of PUBLISHes (max_publish_rate): its next packet waits.
 * Not once the client has closed its end (throttle): what is left is finite. */
static bool over_rate(conn *c)
{
	return conf.pub_rate > 0 && c->role->publish_rate && !c->peer_gone &&
	       c->pub_tat - weft_now() > (int64_t)conf.pub_burst * (int64_t)(1e9 / conf.pub_rate);
}

/* Whether the client has closed its end of c's TCP connection (Linux's TCP_INFO). */
static bool peer_closed(conn *c)
{
	struct tcp_info ti;
	socklen_t len = sizeof ti;
	if (getsockopt(c->fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0)
		return false;
	return ti.tcpi_state == TCP_CLOSE_WAIT || ti.tcpi_state == TCP_CLOSE ||
	       ti.tcpi_state == TCP_LAST_ACK;
}

/* A client over its rate is not read again until its debt is back within the burst, its next
 * packet included: TCP's window then holds its publishing back, and nothing it sent is
 * dropped. A flood so costs the broker what the limit allows, and every other client keeps its
 * share of the workers. A kick (a take-over by the same client id, the broker's shutdown) ends
 * the wait at once. So does a client closing its end (looked for every second): the rest of
 * what it sent, no more than its socket holds, is handled at once, so that its DISCONNECT (or
 * its will, without one) comes in its turn and not after the backlog at the rate. Rejected:
 * dropping that rest, which made a client's "publish, DISCONNECT, close" look like its death.
 * Returns 0, or -1 when it is to end. */
static int throttle(conn *c)
{
	int64_t until = c->pub_tat - (int64_t)conf.pub_burst * (int64_t)(1e9 / conf.pub_rate);
	for (int64_t now = weft_now(); now < until && !c->peer_gone; now = weft_now()) {
		if (conn_nap_until(c, until - now > 1000000000 ? now + 1000000000 : until) < 0)
			return -1;
		c->peer_gone = peer_closed(c);
	}
	return 0;
}

/* How much to read: a client publishing at its max_publish_rate (half its burst owed) gets
 * small reads, so that a worker handles its flood in slices of a few dozen packets, and
 * another connection's packet never waits behind a whole bufferful of it. */
static size_t read_size(conn *c, size_t room)
{
	if (conf.pub_rate <= 0 || room <= 2048)
		return room;
	int64_t t = (int64_t)(1e9 / conf.pub_rate);
	return c->pub_tat - weft_now() > (int64_t)conf.pub_burst * t / 2 ? 2048 : room;
}

static int on_publish(conn *c, mq_packet *pk)
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

/* A client's keep-alive: one and a half times its interval without a packet ends it
 * [MQTT-3.1.2-24]. */
static int64_t client_keepalive_deadline(conn *c, int64_t last)
{
	return last + (int64_t)c->keep_alive * 1500000000LL;
}

static int client_keepalive_expired(conn *c, int64_t last)
{
	(void)c, (void)last;
	return -1;
}

const conn_role conn_client_role = {
	.publish_rate = true,
	.on_packet = NULL,
	.in_topic = client_in_topic,
	.keepalive_deadline = client_keepalive_deadline,
	.keepalive_expired = client_keepalive_expired,
	.goodbye = NULL,
};

const peer_ops conn_client_peer = {
	.write = conn_write,
	.frame = conn_frame,
	.kick = conn_kick,
	.out_topic = NULL,
};

/* Returns 0 to go on, 1 for a client's DISCONNECT, or a negative reason code. */
/* Handle the packet p[0..n), in a read buffer of held bytes. */
static int handle(conn *c, const uint8_t *p, size_t n, size_t held, bool *will)
{
	mq_packet pk;
	int r = mq_decode(p, n, c->connected ? c->version : 5, &pk);
	stats_add(ST_MSG_RECV, 1);
	if (!c->connected) {
		if ((p[0] >> 4) != MQ_CONNECT)
			return -MQ_RC_PROTOCOL_ERROR;
		if (r < 0) {
			if (r == -MQ_RC_UNSUPPORTED_VERSION)
				conn_refuse(c, 4, 0, MQ_V3_BAD_VERSION);
			else if (pk.connect.version == 5)
				conn_refuse(c, 5, -r, 0);
			return -1;
		}
		return on_connect(c, &pk, held) < 0 ? -1 : 0;
	}
	if (r < 0)
		return r;
	if (c->role->on_packet && (r = c->role->on_packet(c, &pk)) != CONN_PASS)
		return r;
	switch (pk.type) {
	case MQ_CONNECT:
		return -MQ_RC_PROTOCOL_ERROR; /* a second CONNECT */
	case MQ_PUBLISH:
		return on_publish(c, &pk);
	case MQ_PUBACK:
		session_puback(c->s, pk.packet_id, c);
		return 0;
	case MQ_PUBREC:
		session_pubrec(c->s, pk.packet_id, pk.reason, c);
		return 0;
	case MQ_PUBREL: {
		/* PUBCOMP once the id is forgotten on disk too (an unknown one by an earlier write,
		 * maybe): the client may reuse it, and a stale id would swallow its next message */
		bool had = session_rel_del(c->s, pk.packet_id);
		if (had)
			persist_rel(c->s, pk.packet_id, false, c);
		ack_earlier(c, MQ_PUBCOMP, pk.packet_id, had ? 0 : MQ_RC_PACKET_ID_NOT_FOUND);
		return 0;
	}
	case MQ_PUBCOMP:
		session_pubcomp(c->s, pk.packet_id, c);
		return 0;
	case MQ_SUBSCRIBE:
		return subscribe_packet(c, &pk);
	case MQ_UNSUBSCRIBE:
		return unsubscribe_packet(c, &pk);
	case MQ_PINGREQ: {
		uint8_t b[2];
		send_pkt(c, b, mq_enc_simple(b, MQ_PINGRESP));
		return 0;
	}
	case MQ_DISCONNECT:
		if (c->version == 5 && MQ_HAS(&pk.props, MQ_P_SESSION_EXPIRY)) {
			session *s = c->s;
			bool bad = false;
			WEFT_WITH_LOCK(&s->lock) {
				if (s->expiry_interval == 0 && pk.props.session_expiry)
					bad = true; /* [MQTT-3.14.2-2] */
				else
					s->expiry_interval = pk.props.session_expiry;
			}
			if (bad)
				return -MQ_RC_PROTOCOL_ERROR;
		}
		*will = c->version == 5 && pk.reason == MQ_RC_DISCONNECT_WITH_WILL;
		return 1;
	default: /* AUTH without an authentication method, or a server's packet */
		return -MQ_RC_PROTOCOL_ERROR;
	}
}

/* Flush every session this batch wrote to. */
static void flush_dirty(conn *c)
{
	/* Let the other connections this worker has ready run their batches first: under
	 * fan-in they append to the same receivers, and one write then carries them all. */
	if (c->dirty.n)
		weft_yield();
	session **v = c->dirty.v;
	for (uint32_t i = 0; i < c->dirty.n; i++)
		session_flush(v[i]);
	c->dirty.n = 0;
	c->batch++;
	/* After a burst (a publish to thousands of subscribers: 24 bytes of match per hit), give
	 * the scratch back rather than keep it for the connection's life. Nothing in it is live
	 * at the end of a batch (the acks were released, the matches delivered). */
	route_buf *scratch[] = { &c->match, &c->front, &c->front2, &c->dirty, &c->acks };
	for (size_t i = 0; i < sizeof scratch / sizeof scratch[0]; i++)
		if (scratch[i]->cap > 1024) {
			free(scratch[i]->v);
			*scratch[i] = (route_buf){ 0 };
		}
}

typedef struct rd {
	uint8_t *buf;
	uint32_t len, cap;
} rd;

/* Handle every whole packet in the buffer; returns as handle() (0: need more bytes). */
static int process(conn *c, rd *b, bool *will)
{
	uint32_t off = 0;
	int r = 0;
	ebr_enter(&c->rd);
	/* a kick (shutdown, take-over) stops the batch between packets: a bufferful of pipelined
	 * SUBSCRIBEs, each a snapshot of the retained messages, would hold a shutdown for long */
	while (!r && off < b->len && !atomic_load_explicit(&c->kick_rc, memory_order_relaxed) &&
	       !over_rate(c)) {
		int hdr;
		long total = mq_frame(b->buf + off, b->len - off, &hdr);
		if (total < 0) {
			r = (int)total;
			break;
		}
		if (total == 0)
			break;
		if ((uint64_t)total > c->max_in_packet) {
			/* a CONNECT too large: 5.0 has a CONNACK saying so, 3.1.1 just closes; the
			 * protocol level follows the fixed header and "\0\4MQTT" */
			bool connect = !c->connected && (b->buf[off] >> 4) == MQ_CONNECT;
			if (connect && b->len - off <= (uint32_t)hdr + 6)
				break; /* its level is yet to come */
			if (connect && b->buf[off + hdr + 6] == 5)
				conn_refuse(c, 5, MQ_RC_PACKET_TOO_LARGE, 0);
			r = -MQ_RC_PACKET_TOO_LARGE;
			break;
		}
		if ((uint32_t)total > b->len - off) {
			if (b->len - off == b->cap) { /* a packet larger than the buffer: grow it, four
						       * times at a time, so a length announced is
						       * not memory taken before the bytes come */
				size_t want = (size_t)b->cap * 4;
				if (want > (size_t)total)
					want = (size_t)total;
				uint8_t *nb = pool_alloc(want);
				memcpy(nb, b->buf + off, b->len - off);
				pool_free(b->buf);
				b->buf = nb;
				b->len -= off;
				b->cap = (uint32_t)pool_size(nb);
				off = 0;
			}
			break;
		}
		r = handle(c, b->buf + off, (size_t)total, b->cap, will);
		off += (uint32_t)total;
	}
	if (persist_on && (c->acks.n || c->ticket)) {
		if (r < 0)
			c->acks.n = 0; /* the connection ends: the client resends what it has not seen acknowledged */
		else if (acks_release(c) < 0)
			r = -MQ_RC_UNSPECIFIED;
	}
	flush_dirty(c);
	ebr_leave(&c->rd);
	if (off) {
		memmove(b->buf, b->buf + off, b->len - off);
		b->len -= off;
	}
	return r;
}

static void conn_end(conn *c, int rc, bool will);

static void serve(void *arg)
{
	conn *c = arg;
	rd b = { NULL, 0, 0 };
	bool will = true;
	int rc = 0;
	int64_t start = weft_now(), last = start;
	if (c->tls) { /* in this task, waiting on the socket as reads do: no worker blocks */
		int h = tls_handshake(c->tls, start + CONNECT_TIMEOUT_S * 1000000000LL);
		if (h < 0) {
			if (conf.verbose)
				fprintf(stderr, "weft-mqtt: TLS handshake failed: %s\n",
					h == -EPROTO ? tls_error(c->tls) : strerror(-h));
			conn_end(c, 0, false);
			return;
		}
		c->tls_user = tls_username(c->tls);
	}
	for (;;) {
		int64_t dl = WEFT_FOREVER;
		if (!c->connected)
			dl = start + CONNECT_TIMEOUT_S * 1000000000LL;
		else if (c->keep_alive)
			dl = c->role->keepalive_deadline(c, last);
		else if (b.len)
			dl = last + PARTIAL_TIMEOUT_S * 1000000000LL;
		if (!b.buf || b.len == 0) {
			if (b.buf) { /* nothing pending: wait without a buffer */
				pool_free(b.buf);
				b.buf = NULL;
			}
			int w = c->tls ? tls_wait_readable(c->tls, dl) : weft_fd_wait(c->fd, EPOLLIN, dl);
			if (w == -ETIMEDOUT && c->keep_alive && c->role->keepalive_expired(c, last) == 0)
				continue;
			if (w == -ETIMEDOUT) {
				rc = c->connected ? MQ_RC_KEEP_ALIVE_TIMEOUT : 0;
				break;
			}
			if (w < 0)
				break;
			b.buf = pool_alloc(RBUF - 16);
			b.cap = (uint32_t)pool_size(b.buf);
		}
		size_t want = read_size(c, b.cap - b.len);
		ssize_t n = c->tls ? tls_read(c->tls, b.buf + b.len, want, b.len ? dl : 0)
				   : weft_read(c->fd, b.buf + b.len, want, b.len ? dl : 0);
		bool full = n > 0 && (size_t)n == want;
		if (n == -ETIMEDOUT) {
			if (b.len) { /* a packet half sent and then nothing */
				rc = c->connected ? MQ_RC_KEEP_ALIVE_TIMEOUT : 0;
				break;
			}
			continue;
		}
		if (n <= 0)
			break;
		stats_add(ST_BYTES_RECV, (uint64_t)n);
		last = weft_now();
		int wr = WS_OK;
		if (c->ws) { /* unframe in place: the MQTT bytes are never more than those read */
			size_t m = 0;
			wr = ws_feed(c->ws, b.buf + b.len, (size_t)n, b.buf + b.len, &m);
			ws_send_reply(c);
			n = (ssize_t)m;
		}
		b.len += (uint32_t)n;
		int r = process(c, &b, &will);
		while (!r && over_rate(c)) /* the rest waits for the client's turn */
			r = throttle(c) < 0 ? 1 : process(c, &b, &will);
		if (wr != WS_OK && !r) /* the client closed, or broke the framing */
			r = wr == WS_PEER_CLOSED ? 1 : -MQ_RC_PROTOCOL_ERROR;
		if (r == 1) {
			break;
		}
		if (r < 0) {
			rc = -r;
			will = true;
			break;
		}
		/* A read that filled the buffer means more is waiting: a client that always has
		 * more (a flood) would keep this worker to itself, its other connections and its
		 * timers waiting. Let them have a turn after each bufferful. */
		if (full)
			weft_yield();
	}
	pool_free(b.buf);
	conn_end(c, rc, will);
}

/* A WebSocket client's last frame: the close the client asked for (or one for an error),
 * else a normal close. Only once the upgrade is done. */
static void ws_close(conn *c)
{
	if (!c->ws)
		return;
	uint8_t r[WS_REPLY_MAX];
	size_t n = ws_reply(c->ws, r);
	if (!n && c->ws->state == WS_OPEN)
		n = ws_close_frame(r, 1000);
	if (n)
		conn_write(c, r, n, weft_now() + 200000000);
}

/* Tear down: last words to a 5.0 client, detach from the session, close. */
static void conn_end(conn *c, int rc, bool will)
{
	int kick = atomic_load(&c->kick_rc);
	if (kick)
		rc = kick;
	session *s = c->s;
	if (s) {
		uint8_t *buf = NULL;
		size_t len = 0;
		int64_t need = 0;
		WEFT_WITH_LOCK(&s->lock) {
			/* From here on, deliveries queue in the session (taking_output, session.c):
			 * what is not written by the end of this would be lost to the client. */
			c->closing = true;
			/* A writer task blocked on a client that reads nothing would wait forever:
			 * after half a second, shut the socket under it. */
			int64_t dl = weft_now() + 500000000;
			while (s->writing)
				if (weft_cond_wait_until(&s->idle, &s->lock, dl) == -ETIMEDOUT &&
				    s->writing) {
					shutdown(c->fd, SHUT_RDWR);
					dl = WEFT_FOREVER;
				}
			/* a bridge stopped by the broker says goodbye to its remote as a client does */
			uint8_t dd[8], *d = dd;
			size_t n = 0;
			if (c->role->goodbye && kick == MQ_RC_SERVER_SHUTTING_DOWN) {
				d = malloc(65536 + 64);
				if (!d)
					abort();
				n = c->role->goodbye(c, d, 65536 + 64);
			} else if (c->version == 5 && rc && rc != 1) {
				n = mq_enc_disconnect(d, 5, rc, NULL);
			}
			if (n)
				memcpy(session_out_room(s, n), d, n);
			if (d != dd)
				free(d);
			buf = session_take_out(s, &len, &need);
		}
		/* QoS 2 state in it goes only once durable (session.c, out_after); else the client
		 * gets it all again on its return */
		if (len && persist_wait_ticket(need, weft_now() + 1000000000) == 0) {
			buf = conn_frame(c, buf, &len);
			conn_write(c, buf, len, weft_now() + 200000000);
		}
		pool_free(buf);
		ws_close(c);
		if (c->tls)
			tls_shutdown(c->tls, weft_now() + 200000000);
		shutdown(c->fd, SHUT_RDWR);
		session_detach(c, will);
	} else {
		ws_close(c);
		shutdown(c->fd, SHUT_RDWR);
	}
	WEFT_WITH_LOCK(&list_lock) {
		if (c->prev)
			c->prev->next = c->next;
		else
			all = c->next;
		if (c->next)
			c->next->prev = c->prev;
		nconns--;
	}
	tls_free(c->tls);
	weft_close(c->fd);
	ebr_unregister(&c->rd);
	for (uint16_t i = 0; c->in_alias && i < c->in_alias_max; i++)
		free(c->in_alias[i]);
	free(c->in_alias);
	for (uint16_t i = 0; i < c->out_alias_n; i++)
		free(c->out_alias[i].topic);
	free(c->out_alias);
	free(c->match.v);
	free(c->front.v);
	free(c->front2.v);
	free(c->dirty.v);
	free(c->acks.v);
	free(c->user);
	if (c->ws) {
		ws_free(c->ws);
		free(c->ws);
	}
	free(c);
}

static bool is_loopback(int fd)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof ss;
	if (getpeername(fd, (struct sockaddr *)&ss, &len) < 0)
		return false;
	if (ss.ss_family == AF_INET)
		return (ntohl(((struct sockaddr_in *)&ss)->sin_addr.s_addr) >> 24) == 127;
	if (ss.ss_family == AF_INET6) {
		struct in6_addr *a = &((struct sockaddr_in6 *)&ss)->sin6_addr;
		if (IN6_IS_ADDR_LOOPBACK(a))
			return true;
		return IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127;
	}
	return ss.ss_family == AF_UNIX;
}

/* Set up c (fd and its TLS or WebSocket layer done) and add it to the list. */
static void conn_register(conn *c, int fd)
{
	c->fd = fd;
	c->loopback = is_loopback(fd);
	c->version = 4;
	uint32_t limit = in_packet_limit();
	c->max_in_packet = limit < MAX_CONNECT ? limit : MAX_CONNECT;
	/* batch numbers unique across connections: a new conn at a freed one's address must not
	 * match the dirty marks that one left in sessions */
	static _Atomic uint64_t serial;
	c->batch = (atomic_fetch_add(&serial, 1) + 1) << 32;
	atomic_init(&c->kick_rc, 0);
	atomic_init(&c->napping, false);
	ebr_register(&c->rd);
	WEFT_WITH_LOCK(&list_lock) {
		c->next = all;
		if (all)
			all->prev = c;
		all = c;
		nconns++;
	}
}

conn *conn_open_bridge(int fd, tls_conn *t, struct bridge *b, int version, uint16_t keep_alive,
		       const peer_ops *peer, const conn_role *role)
{
	conn *c = calloc(1, sizeof *c);
	if (!c)
		return NULL;
	c->peer = peer;
	c->role = role;
	conn_register(c, fd);
	c->tls = t;
	c->bridge = b;
	c->version = (uint8_t)version;
	c->connected = true; /* the CONNACK was read by bridge.c */
	c->keep_alive = keep_alive;
	c->max_in_packet = in_packet_limit();
	c->in_alias_max = 0; /* the CONNECT offered the remote no topic aliases */
	return c;
}

void conn_run(conn *c)
{
	if (!c->s) { /* no local session: end before reading what the remote sent */
		conn_end(c, 0, false);
		return;
	}
	serve(c);
}

void conn_serve(int fd, int protocol, tls_ctx *tls)
{
	conn *c = calloc(1, sizeof *c);
	if (!c) {
		weft_close(fd);
		return;
	}
	c->peer = &conn_client_peer;
	c->role = &conn_client_role;
	if (tls && !(c->tls = tls_conn_new(tls, fd))) {
		free(c);
		weft_close(fd);
		return;
	}
	if (protocol == PROTO_WEBSOCKETS) {
		c->ws = malloc(sizeof *c->ws);
		if (!c->ws)
			abort();
		ws_limits lim = { 0 };
		if (conf.message_size_limit) /* no frame larger than the largest packet */
			lim.max_frame = (uint64_t)conf.message_size_limit + 65536 + 1024;
		ws_init(c->ws, conf.message_size_limit ? &lim : NULL);
	}
	conn_register(c, fd);
	weft_spawn_opts o = { .name = "mqtt-conn", .detached = 1 };
	if (!weft_spawn_opt(serve, c, &o)) {
		conn_end(c, 0, false);
	}
}
