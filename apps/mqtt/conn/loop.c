/*
 * loop.c - a connection's read loop: read, decode, hand each packet to its handler
 * (handle_*.c), flush.
 *
 * The task reads as much as the socket has into a buffer from its worker's pool, handles every
 * whole packet in it, then flushes every session its publishes touched (route/delivery.c): the
 * batch of packets one read brought in becomes one write per receiver. Between batches the
 * task waits for the socket with no buffer at all (weft_fd_wait, then a read that does not
 * wait), so an idle connection costs its task's few stack pages and two small structs.
 *
 * Fairness: a connection whose read filled the buffer yields after handling it, so a client
 * that floods gets one bufferful at a time like everyone else on its worker; one over its
 * max_publish_rate is not read again until its debt is back within its burst.
 *
 * A read section of epoch.c spans each batch (topic matching reads the tree without locks,
 * and the sessions it finds stay valid until the flush), never the wait for input.
 *
 * Ending: a protocol error, a malformed or oversized packet, a keep-alive or connect timeout,
 * or a kick from another task (session take-over, shutdown) end the loop; conn_end (conn.c)
 * tears the connection down. Where a bridge's connection differs the loop asks c->role.
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <weft.h>

#include "codec.h"
#include "conf.h"
#include "conn.h"
#include "conn_public.h"
#include "epoch.h"
#include "persist.h"
#include "pool.h"
#include "records.h"
#include "scratch.h"
#include "session.h"
#include "stats.h"
#include "tls.h"
#include "ws.h"

#define RBUF 16384
#define CONNECT_TIMEOUT_S 10
#define PARTIAL_TIMEOUT_S 60  /* a half-sent packet with keep-alive off */

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
		return handle_connect(c, &pk, held) < 0 ? -1 : 0;
	}
	if (r < 0)
		return r;
	if (c->role->on_packet && (r = c->role->on_packet(c, &pk)) != CONN_PASS)
		return r;
	switch (pk.type) {
	case MQ_CONNECT:
		return -MQ_RC_PROTOCOL_ERROR; /* a second CONNECT */
	case MQ_PUBLISH:
		return handle_publish(c, &pk);
	case MQ_PUBACK:
		return handle_puback(c, &pk);
	case MQ_PUBREC:
		return handle_pubrec(c, &pk);
	case MQ_PUBREL:
		return handle_pubrel(c, &pk);
	case MQ_PUBCOMP:
		return handle_pubcomp(c, &pk);
	case MQ_SUBSCRIBE:
		return handle_subscribe(c, &pk);
	case MQ_UNSUBSCRIBE:
		return handle_unsubscribe(c, &pk);
	case MQ_PINGREQ:
		return handle_pingreq(c);
	case MQ_DISCONNECT:
		return handle_disconnect(c, &pk, will);
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
	scratch_buf *scratch[] = { &c->match, &c->front, &c->front_next, &c->dirty, &c->acks };
	for (size_t i = 0; i < sizeof scratch / sizeof scratch[0]; i++)
		if (scratch[i]->cap > 1024) {
			free(scratch[i]->v);
			*scratch[i] = (scratch_buf){ 0 };
		}
}

typedef struct read_buf {
	uint8_t *buf;
	uint32_t len, cap;
} read_buf;

/* Handle every whole packet in the buffer; returns as handle() (0: need more bytes). */
static int process(conn *c, read_buf *b, bool *will)
{
	uint32_t off = 0;
	int r = 0;
	epoch_enter(&c->reader);
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
	epoch_leave(&c->reader);
	if (off) {
		memmove(b->buf, b->buf + off, b->len - off);
		b->len -= off;
	}
	return r;
}

void conn_read_loop(void *arg)
{
	conn *c = arg;
	read_buf b = { NULL, 0, 0 };
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
			conn_ws_reply(c);
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
