/*
 * bridge.c - bridges: weft-mqtt joins another broker (mosquitto, EMQX, HiveMQ...) as a client of
 * it, configured with mosquitto's "connection" blocks (docs/weft-mqtt-bridges.md).
 *
 * Each bridge is one task that loops: connect to the next address (TCP through weft, TLS as a
 * client through tls.c), send CONNECT (3.1.1, with the 0x80 "bridge" bit in the protocol level
 * under try_private, or 5.0), read the CONNACK, then hand the socket to conn/ as a conn whose
 * role and peer are the bridge's (bridge_role, bridge_peer below), attached to a local session
 * named local_clientid. From then on the bridge is a connection like any other, run by
 * conn_run() in this same task:
 *
 *   out   the local session subscribes the out/both filters (local prefix + pattern) with
 *         no-local and retain-as-published: a local publish reaches it through topic.c like
 *         any subscriber, queued, windowed and redelivered by route/, and encode_pub asks
 *         bridge_out_topic for the remote topic (local prefix off, remote prefix on);
 *   in    the remote is sent a SUBSCRIBE per in/both filter (remote prefix + pattern); its
 *         PUBLISHes go through handle_publish.c as a client's would, the topic mapped back
 *         by bridge_in_topic, with no ACL and no $SYS check (a bridge is trusted).
 *
 * Loops. A message that came in is published locally with the bridge's session as its
 * publisher, so the bridge's own no-local subscriptions never send it back out (a "both"
 * pattern is safe locally). At the remote, a 5.0 bridge subscribes with no-local; a 3.1.1 one
 * relies on try_private, which tells mosquitto (and weft-mqtt: handle_connect.c's
 * peer_bridge) not to echo our messages back.
 *
 * Reconnecting. When the connection ends (the remote went away, refused, stopped answering
 * pings) the task publishes the "0" notification locally, waits restart_timeout and tries the
 * next address. With a cap ("restart_timeout 5 30") the wait is mosquitto's decorrelated
 * jitter: each failed attempt waits a random time between the base and three times the last
 * wait, capped; a CONNACK accepted sets it back to the base. The local session outlives the
 * connection unless local_cleansession: QoS 1/2 messages published while the remote is away
 * are queued there (max_queued_messages) and go out on reconnect, inflight ones resent.
 *
 * The configuration (the "connection" blocks) is bridge_conf.c's.
 *
 * Stopping. main.c kicks every connection (conns_shutdown): a bridge's last words are the
 * "0" notification and a DISCONNECT (bridge_goodbye), so the remote does not publish the will
 * for a clean stop. bridges_stop() then cancels the tasks (in a back-off sleep, or connecting)
 * and joins them.
 */
#include <errno.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <weft.h>

#include "bridge.h"
#include "bridge_conf.h"
#include "codec.h"
#include "conf.h"
#include "conn_public.h"
#include "msg.h"
#include "peer.h"
#include "persist.h"
#include "records.h"
#include "session.h"
#include "stats.h"
#include "tls.h"
#include "topic.h"

#define CONNECT_TIMEOUT_NS 10000000000LL /* TCP, TLS and the CONNACK, each */
/* ---- topic filters -------------------------------------------------------------------------- */

/* Swap prefix `from` for prefix `to` on topic t: a malloc'd NUL-terminated topic, or NULL
 * when the result would be too long. */
static char *remap(const char *t, size_t n, const char *from, const char *to, uint16_t *len)
{
	size_t nf = from && n >= strlen(from) && !memcmp(t, from, strlen(from)) ? strlen(from) : 0;
	size_t nt = to ? strlen(to) : 0, total = nt + n - nf;
	if (total > 65535 || total == 0)
		return NULL;
	char *r = malloc(total + 1);
	if (!r)
		abort();
	memcpy(r, to ? to : "", nt);
	memcpy(r + nt, t + nf, n - nf);
	r[total] = 0;
	*len = (uint16_t)total;
	return r;
}

static bool bridge_in_topic(conn *c, const uint8_t **topic, uint16_t *tlen, char **mapped)
{
	bridge *b = c->bridge;
	atomic_fetch_add_explicit(&b->msgs_in, 1, memory_order_relaxed);
	for (int i = 0; i < b->ntopics; i++) {
		btopic *t = &b->topics[i];
		if (!(t->dir & DIR_IN) ||
		    !mq_topic_match(t->remote, t->nremote, (const char *)*topic, *tlen))
			continue;
		if (t->lprefix || t->rprefix) {
			uint16_t n;
			char *r = remap((const char *)*topic, *tlen, t->rprefix, t->lprefix, &n);
			if (r) {
				*mapped = r;
				*topic = (const uint8_t *)r;
				*tlen = n;
			}
		}
		return true;
	}
	return true; /* trusted: no ACL, no $SYS check */
}

static int bridge_out_topic(conn *c, const msg *m, const char **topic, uint16_t *tlen,
			    char **mapped, int *retain)
{
	bridge *b = c->bridge;
	if (!b->outgoing_retain || !atomic_load_explicit(&b->retain_ok, memory_order_relaxed))
		*retain = 0;
	atomic_fetch_add_explicit(&b->msgs_out, 1, memory_order_relaxed);
	for (int i = 0; i < b->ntopics; i++) {
		btopic *t = &b->topics[i];
		if (!(t->dir & DIR_OUT) ||
		    !mq_topic_match(t->local, t->nlocal, m->topic, m->topic_len))
			continue;
		if (t->lprefix || t->rprefix) {
			uint16_t n;
			char *r = remap(m->topic, m->topic_len, t->lprefix, t->rprefix, &n);
			if (!r)
				return -1;
			*mapped = r;
			*topic = r;
			*tlen = n;
		}
		return 0;
	}
	return 0;
}

/* ---- packets a server sends ----------------------------------------------------------------- */

static int bridge_packet(conn *c, const mq_packet *pk)
{
	switch (pk->type) {
	case MQ_PUBLISH:
	case MQ_PUBACK:
	case MQ_PUBREC:
	case MQ_PUBREL:
	case MQ_PUBCOMP:
	case MQ_DISCONNECT:
		return CONN_PASS;
	case MQ_SUBACK: {
		/* a refused filter (0x80 and up) is logged: the bridge goes on without it */
		for (uint32_t i = 0; i < pk->sub.list.len; i++)
			if (pk->sub.list.p[i] >= 0x80)
				fprintf(stderr, "weft-mqtt: bridge %s: the remote refused a subscription "
						"(reason 0x%02x)\n",
					c->bridge->name, pk->sub.list.p[i]);
		return 0;
	}
	case MQ_UNSUBACK:
	case MQ_PINGRESP:
		return 0;
	default:
		return -MQ_RC_PROTOCOL_ERROR;
	}
}

/* ---- keep-alive ----------------------------------------------------------------------------- */

static int64_t bridge_ping_deadline(conn *c, int64_t last)
{
	bridge *b = c->bridge;
	int64_t ka = (int64_t)c->keep_alive * 1000000000;
	return (b->ping_at > last ? b->ping_at : last) + ka;
}

static int bridge_ping(conn *c, int64_t last)
{
	bridge *b = c->bridge;
	if (b->ping_at > last)
		return -1; /* a whole interval without an answer */
	uint8_t p[2];
	session_send(c->s, p, mq_enc_simple(p, MQ_PINGREQ), NULL);
	b->ping_at = weft_now();
	return 0;
}

/* ---- encoding what only a client sends ------------------------------------------------------ */

static uint8_t *enc_connect(bridge *b, size_t *len)
{
	uint8_t pb_buf[32];
	mq_pb pb = { pb_buf, 0, sizeof pb_buf, 0 };
	if (b->version == 5) {
		if (!b->clean) /* the remote keeps our session (subscriptions, queued messages) */
			mq_pb_u32(&pb, MQ_P_SESSION_EXPIRY, UINT32_MAX);
		if (conf.max_inflight_messages < 65535)
			mq_pb_u16(&pb, MQ_P_RECEIVE_MAX, (uint16_t)conf.max_inflight_messages);
		if (conf.message_size_limit)
			mq_pb_u32(&pb, MQ_P_MAX_PACKET_SIZE,
				  (uint32_t)conf.message_size_limit + 65536 + 1024);
	}
	/* the remote's notification of our end: "0", retained, QoS 1 */
	bool will = b->notifications && !b->notif_local_only;
	mq_connect_enc e = {
		.version = b->version,
		.level = b->version == 4 && b->try_private ? 0x84 : 0,
		.client_id = b->remote_id,
		.clean = b->clean,
		.keep_alive = (uint16_t)b->keepalive,
		.props = &pb,
		.will_topic = will ? b->notif_topic : NULL,
		.will_payload = "0",
		.will_len = 1,
		.will_qos = 1,
		.will_retain = 1,
		.username = b->remote_user,
		.password = b->remote_pass,
	};
	uint8_t *p = malloc(mq_enc_connect(NULL, &e));
	if (!p)
		abort();
	*len = mq_enc_connect(p, &e);
	return p;
}

/* A SUBSCRIBE of one filter, or with opts -1 an UNSUBSCRIBE. */
static uint8_t *enc_subscribe(bridge *b, uint16_t pid, const char *filter, int opts, size_t *len)
{
	uint8_t *p = malloc(strlen(filter) + 16);
	if (!p)
		abort();
	*len = opts >= 0 ? mq_enc_subscribe(p, b->version, pid, filter, (uint8_t)opts, NULL)
			 : mq_enc_unsubscribe(p, b->version, pid, filter);
	return p;
}

/* A retained notification (payload "1" or "0"), as a QoS 0 PUBLISH for the remote. */
static size_t enc_notification(bridge *b, uint8_t *out, size_t cap, char state)
{
	mq_pub_enc e = { b->version, 0, 0, 1, 0, b->notif_topic, (uint16_t)strlen(b->notif_topic),
			 NULL, 0, &state, 1, NULL, 0 };
	size_t n = mq_enc_publish_len(&e);
	if (n > cap)
		return 0;
	return mq_enc_publish(out, &e);
}

static size_t bridge_goodbye(conn *c, uint8_t *out, size_t cap)
{
	bridge *b = c->bridge;
	size_t n = 0;
	if (b->notifications && !b->notif_local_only)
		n = enc_notification(b, out, cap, '0');
	if (n + 8 <= cap)
		n += mq_enc_disconnect(out + n, b->version, 0, NULL);
	return n;
}

/* A bridge's connection as conn/'s read loop sees it (conn_role): the remote is a server, so
 * no max_publish_rate and no ACL on what it sends (its topics are mapped instead), its
 * SUBACK/UNSUBACK/PINGRESP handled here, keep-alive by pinging it, and a goodbye at shutdown. */
static const conn_role bridge_role = {
	.publish_rate = false,
	.on_packet = bridge_packet,
	.in_topic = bridge_in_topic,
	.keepalive_deadline = bridge_ping_deadline,
	.keepalive_expired = bridge_ping,
	.goodbye = bridge_goodbye,
};

/* ... and as route/ sees it (peer_ops): a connection like a client's whose outgoing topics are
 * mapped to the remote's terms. */
static const peer_ops bridge_peer = {
	.write = conn_write,
	.frame = conn_frame,
	.kick = conn_kick,
	.out_topic = bridge_out_topic,
};

/* ---- the bridge's task ---------------------------------------------------------------------- */

static void notify_local(bridge *b, char state)
{
	if (!b->notifications)
		return;
	msg *m = msg_new(b->notif_topic, (uint16_t)strlen(b->notif_topic), NULL, &state, 1, 1, 1,
			 0);
	topic_retain(m);
	persist_retained(m, NULL);
	topic_publish(m, NULL, NULL);
	msg_unref(m);
}

static ssize_t sock_read(int fd, tls_conn *t, void *p, size_t n, int64_t dl)
{
	return t ? tls_read(t, p, n, dl) : weft_read(fd, p, n, dl);
}

static ssize_t sock_write(int fd, tls_conn *t, const void *p, size_t n, int64_t dl)
{
	return t ? tls_write(t, p, n, dl) : weft_write(fd, p, n, dl);
}

static int read_full(int fd, tls_conn *t, uint8_t *p, size_t n, int64_t dl)
{
	for (size_t got = 0; got < n;) {
		ssize_t r = sock_read(fd, t, p + got, n - got, dl);
		if (r <= 0)
			return r < 0 ? (int)r : -ECONNRESET;
		got += (size_t)r;
	}
	return 0;
}

/* Read exactly one packet (the CONNACK), byte by byte through its header so that nothing
 * after it is taken from the socket: the read loop (conn/loop.c) reads the rest. Returns its
 * length or -errno. */
static long read_packet(int fd, tls_conn *t, uint8_t *buf, size_t cap, int64_t dl)
{
	size_t n = 0;
	int hdr;
	long total;
	do {
		if (n == 5 || read_full(fd, t, buf + n, 1, dl) < 0)
			return -ECONNRESET;
		n++;
	} while (n < 2 || (total = mq_frame(buf, n, &hdr)) == 0);
	if (total < 0 || (size_t)total > cap)
		return -EPROTO;
	if (read_full(fd, t, buf + n, (size_t)total - n, dl) < 0)
		return -ECONNRESET;
	return total;
}

static const char *connack_reason(int v, int rc)
{
	if (v == 5)
		return rc == MQ_RC_BAD_USER_OR_PASSWORD ? "bad username or password"
		     : rc == MQ_RC_NOT_AUTHORIZED       ? "not authorized"
		     : rc == MQ_RC_CLIENT_ID_INVALID    ? "client id refused"
							: "refused";
	static const char *const v3[] = { "accepted", "unacceptable protocol version",
					  "client id refused", "server unavailable",
					  "bad username or password", "not authorized" };
	return rc >= 0 && rc <= 5 ? v3[rc] : "refused";
}

/* The packet ids of our SUBSCRIBEs: from the top down, skipping those inflight, so they do
 * not meet the session's PUBLISH ids (which count up from 1). */
static uint16_t free_pid(session *s, uint16_t from)
{
	for (uint16_t p = from;; p--) {
		bool used = false;
		WEFT_WITH_LOCK(&s->lock)
			for (delivery *d = s->inflight; d && !used; d = d->next)
				used = d->pid == p;
		if (!used)
			return p;
	}
}

/* Does an in/both topic subscribe filter f at the remote? (Then it is not unsubscribed.) */
static bool comes_in(const bridge *b, const char *f)
{
	for (int i = 0; i < b->ntopics; i++)
		if ((b->topics[i].dir & DIR_IN) && !strcmp(b->topics[i].remote, f))
			return true;
	return false;
}

/* Everything after the CONNACK: the local session, subscriptions both sides, resending what
 * was inflight, notifications; then run the connection until it ends. */
static void run(bridge *b, int fd, tls_conn *t, const mq_packet *ack)
{
	/* what a 5.0 remote says of itself: its keep-alive wins, its QoS and retain limits hold */
	const mq_props *pr = &ack->props;
	bool v5 = b->version == 5;
	int ka = v5 && MQ_HAS(pr, MQ_P_SERVER_KEEP_ALIVE) ? pr->server_keep_alive : b->keepalive;
	int max_qos = v5 && MQ_HAS(pr, MQ_P_MAX_QOS) ? pr->max_qos : 2;
	bool no_retain = v5 && MQ_HAS(pr, MQ_P_RETAIN_AVAILABLE) && !pr->retain_available;
	atomic_store(&b->retain_ok, !no_retain);
	conn *c = conn_open_bridge(fd, t, b, b->version, (uint16_t)ka, &bridge_peer,
				   &bridge_role);
	if (!c) {
		tls_free(t);
		weft_close(fd);
		return;
	}
	bool present;
	int why;
	session *s = session_attach(c, b->local_id, (uint16_t)strlen(b->local_id), b->local_clean,
				    &present, &why);
	if (!s) { /* a local client holds local_clientid and would not let go, or owns it */
		fprintf(stderr, "weft-mqtt: bridge %s: the local session %s is %s\n", b->name,
			b->local_id,
			why == MQ_RC_NOT_AUTHORIZED ? "a user's (bridges are anonymous)" : "busy");
		conn_run(c); /* ends it */
		return;
	}
	c->s = s;
	uint16_t window = (uint16_t)conf.max_inflight_messages;
	if (b->version == 5 && ack->props.receive_max && ack->props.receive_max < window)
		window = ack->props.receive_max;
	uint32_t maxp = (uint32_t)b->max_packet;
	if (b->version == 5 && ack->props.max_packet_size &&
	    (!maxp || ack->props.max_packet_size < maxp))
		maxp = ack->props.max_packet_size;
	WEFT_WITH_LOCK(&s->lock) {
		s->version = (uint8_t)b->version;
		s->expiry_interval = b->local_clean ? 0 : UINT32_MAX;
		s->window = window ? window : 1;
		s->max_packet = maxp;
		if (!present)
			s->nrel = 0;
		persist_session(s, true, c);
	}
	b->ping_at = 0;
	/* in: subscribe at the remote (no-local and retain-as-published for 5.0); out only:
	 * unsubscribe there, as mosquitto, so that a session the remote kept from a configuration
	 * where the topic came in does not go on sending it */
	uint16_t pid = 65535;
	for (int i = 0; i < b->ntopics; i++) {
		btopic *tp = &b->topics[i];
		int opts = tp->qos | (b->version == 5 ? SUB_NL | SUB_RAP : 0);
		if (!(tp->dir & DIR_IN) && (!b->attempt_unsubscribe || comes_in(b, tp->remote)))
			continue;
		pid = free_pid(s, pid);
		size_t n;
		uint8_t *p = enc_subscribe(b, pid--, tp->remote, tp->dir & DIR_IN ? opts : -1, &n);
		session_send(s, p, n, NULL);
		free(p);
	}
	/* out: the local session subscribes, never to its own messages */
	for (int i = 0; i < b->ntopics; i++) {
		btopic *tp = &b->topics[i];
		if (!(tp->dir & DIR_OUT))
			continue;
		uint16_t n = (uint16_t)strlen(tp->local);
		uint8_t opts = (uint8_t)((tp->qos < max_qos ? tp->qos : max_qos) | SUB_NL | SUB_RAP);
		topic_subscribe(s, tp->local, n, opts, 0);
		subrec_add(s, (const uint8_t *)tp->local, n);
		persist_sub(s, tp->local, n, opts, 0, c);
	}
	if (persist_on && c->ticket)
		persist_wait(c);
	session_resume(s, NULL);
	for (int i = 0; i < b->ntopics; i++) /* retained messages go out, as mosquitto's do */
		if (b->topics[i].dir & DIR_OUT)
			topic_send_retained(s, b->topics[i].local,
					    (uint16_t)strlen(b->topics[i].local),
					    b->topics[i].qos < max_qos ? b->topics[i].qos : max_qos, 0,
					    0, NULL); /* charged, not refused: the operator's */
	if (b->notifications && !b->notif_local_only) {
		size_t cap = strlen(b->notif_topic) + 32;
		uint8_t *p = malloc(cap);
		if (!p)
			abort();
		size_t n = enc_notification(b, p, cap, '1');
		if (n)
			session_send(s, p, n, NULL);
		free(p);
	}
	notify_local(b, '1');
	atomic_store(&b->connected, 1);
	atomic_fetch_add(&b->connects, 1);
	if (atomic_load(&broker_stopping)) /* conns_shutdown may have walked past us */
		conn_kick(c, MQ_RC_SERVER_SHUTTING_DOWN);
	conn_run(c);
	atomic_store(&b->connected, 0);
	notify_local(b, '0');
}

/* One attempt: returns 1 when the remote accepted us (the connection has ended since). */
static int attempt(bridge *b)
{
	const char *host = b->host[b->cur];
	int port = b->port[b->cur];
	int64_t dl = weft_now() + CONNECT_TIMEOUT_NS;
	int fd = weft_tcp_connect(host, port, dl);
	if (fd < 0) {
		if (conf.verbose)
			fprintf(stderr, "weft-mqtt: bridge %s: %s:%d: %s\n", b->name, host, port,
				strerror(-fd));
		return 0;
	}
	tls_conn *t = NULL;
	if (b->tls[b->cur]) {
		int h = -ENOMEM;
		if (!(t = tls_conn_new(b->tls[b->cur], fd)) || (h = tls_handshake(t, dl)) < 0) {
			fprintf(stderr, "weft-mqtt: bridge %s: %s:%d: TLS: %s\n", b->name, host, port,
				h == -EPROTO ? tls_error(t) : strerror(-h));
			tls_free(t);
			weft_close(fd);
			return 0;
		}
	}
	size_t n;
	uint8_t *p = enc_connect(b, &n);
	ssize_t w = sock_write(fd, t, p, n, dl);
	free(p);
	uint8_t buf[4096]; /* a CONNACK: a few bytes, or a 5.0 one's properties */
	long len = w == (ssize_t)n ? read_packet(fd, t, buf, sizeof buf, dl) : -ECONNRESET;
	mq_packet ack;
	int r = len > 0 ? mq_decode(buf, (size_t)len, b->version, &ack) : (int)len;
	if (r == 0 && ack.type != MQ_CONNACK)
		r = -EPROTO;
	if (r == 0 && ack.reason) {
		fprintf(stderr, "weft-mqtt: bridge %s: %s:%d refused the connection: %s\n", b->name,
			host, port, connack_reason(b->version, ack.reason));
		r = -EACCES;
	} else if (r < 0 && conf.verbose) {
		fprintf(stderr, "weft-mqtt: bridge %s: %s:%d: no CONNACK\n", b->name, host, port);
	}
	if (r < 0) {
		if (t)
			tls_shutdown(t, weft_now() + 100000000);
		tls_free(t);
		weft_close(fd);
		return 0;
	}
	if (conf.verbose)
		fprintf(stderr, "weft-mqtt: bridge %s: connected to %s:%d\n", b->name, host, port);
	run(b, fd, t, &ack);
	return 1;
}

/* The next wait, in seconds: constant, or mosquitto's decorrelated jitter up to the cap. */
static int backoff(bridge *b, bool was_up)
{
	if (!b->restart_cap || was_up)
		return b->wait_s = b->restart_base;
	b->seed = b->seed * 1103515245u + 12345u;
	int hi = b->wait_s * 3;
	int w = b->restart_base;
	if (hi > b->restart_base)
		w += (int)((b->seed >> 8) % (uint32_t)(hi - b->restart_base));
	return b->wait_s = w < b->restart_cap ? w : b->restart_cap;
}

static void bridge_task(void *arg)
{
	bridge *b = arg;
	b->wait_s = b->restart_base;
	while (!atomic_load(&broker_stopping) && !weft_cancelled()) {
		bool up = attempt(b);
		if (!up)
			atomic_fetch_add(&b->failures, 1);
		if (atomic_load(&broker_stopping))
			break;
		b->cur = (b->cur + 1) % b->naddr; /* try the others in turn */
		if (up && b->naddr > 1)
			b->cur = 0;
		int s = backoff(b, up);
		if (weft_sleep_until(weft_now() + (int64_t)s * 1000000000) < 0)
			break;
	}
}

int bridges_start(void)
{
	for (int i = 0; i < nbridges; i++) {
		bridge *b = bridges[i];
		for (int k = 0; (b->cafile || b->capath) && k < b->naddr; k++) {
			tls_opts o = {
				.certfile = b->certfile, .keyfile = b->keyfile, .cafile = b->cafile,
				.capath = b->capath, .tls_version = b->tls_version,
				.servername = b->insecure ? NULL : b->host[k],
			};
			char e[512];
			if (!(b->tls[k] = tls_ctx_client(&o, e, sizeof e))) {
				fprintf(stderr, "weft-mqtt: bridge %s: %s\n", b->name, e);
				return -1;
			}
		}
		b->seed = (uint32_t)weft_now() ^ (uint32_t)i * 2654435761u;
		weft_spawn_opts o = { .name = "mqtt-bridge" };
		if (!(b->task = weft_spawn_opt(bridge_task, b, &o))) {
			fprintf(stderr, "weft-mqtt: bridge %s: cannot start its task\n", b->name);
			return -1;
		}
	}
	return 0;
}

void bridges_stop(void)
{
	for (int i = 0; i < nbridges; i++) {
		bridge *b = bridges[i];
		if (b->task) {
			weft_cancel(b->task);
			weft_join(b->task);
		}
		for (int k = 0; k < b->naddr; k++)
			tls_ctx_free(b->tls[k]);
		for (int k = 0; k < b->ntopics; k++) {
			btopic *t = &b->topics[k];
			free(t->lprefix), free(t->rprefix), free(t->local), free(t->remote);
		}
		for (int k = 0; k < b->naddr; k++)
			free(b->host[k]);
		free(b->topics), free(b->name), free(b->remote_user), free(b->remote_pass);
		free(b->remote_id), free(b->local_id), free(b->notif_topic);
		free(b->cafile), free(b->capath), free(b->certfile), free(b->keyfile);
		free(b);
		bridges[i] = NULL;
	}
	nbridges = 0;
}

/* ---- metrics -------------------------------------------------------------------------------- */

char *bridge_metrics_text(void)
{
	if (!nbridges)
		return NULL;
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	if (!f)
		return NULL;
	static const struct {
		const char *name, *type, *help;
	} m[] = {
		{ "weft_mqtt_bridge_up", "gauge", "1 while the bridge is connected to its remote" },
		{ "weft_mqtt_bridge_messages_received_total", "counter",
		  "PUBLISH packets the bridge received from its remote" },
		{ "weft_mqtt_bridge_messages_sent_total", "counter",
		  "PUBLISH packets the bridge sent to its remote (resends included)" },
		{ "weft_mqtt_bridge_connects_total", "counter", "connections the remote accepted" },
		{ "weft_mqtt_bridge_connect_failures_total", "counter",
		  "attempts that did not reach an accepted CONNACK" },
	};
	for (int k = 0; k < 5; k++) {
		fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", m[k].name, m[k].help, m[k].name, m[k].type);
		for (int i = 0; i < nbridges; i++) {
			bridge *b = bridges[i];
			uint64_t v = k == 0 ? (uint64_t)atomic_load(&b->connected)
				   : k == 1 ? atomic_load(&b->msgs_in)
				   : k == 2 ? atomic_load(&b->msgs_out)
				   : k == 3 ? atomic_load(&b->connects)
					    : atomic_load(&b->failures);
			fprintf(f, "%s{bridge=\"", m[k].name);
			for (const char *c = b->name; *c; c++) /* the exposition format's escapes */
				fprintf(f, *c == '"' || *c == '\\' ? "\\%c" : "%c", *c);
			fprintf(f, "\"} %llu\n", (unsigned long long)v);
		}
	}
	fclose(f);
	return text;
}
