/*
 * writer.c - writing a session's output to its client's socket.
 *
 * Whoever flushes takes the buffer (the `writing` flag makes one writer at a time), writes it
 * without waiting (a deadline already past), and loops while more arrived. If the socket does
 * not take everything, the rest goes to a writer task spawned for the purpose, which waits
 * for the socket and keeps draining until the buffer is empty, then ends: an idle connection
 * has no writer task and no output buffer. The same task waits when the buffer holds QoS 2
 * state of a stored session that is not yet durable (out_after, session.c).
 *
 * A retained backlog (retained.c) is drained each time a write completes. After a flush's
 * write it goes on in a writer task spawned with nothing in hand, which takes a chunk at a
 * time and yields between chunks: a backlog of 100,000 messages to a client that reads fast
 * neither holds its worker nor runs on the time of a publisher flushing that session.
 *
 * Invariants: while `writing` is set, c->wbuf, wlen, woff and wneed are the writer's alone and
 * nobody else writes to the socket; clearing it signals `idle`, which conn_end and
 * session_detach wait for before they take the output buffer or the connection goes.
 */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include <weft.h>

#include "epoch.h"
#include "peer.h"
#include "persist.h"
#include "pool.h"
#include "records.h"
#include "retained.h"
#include "session.h"
#include "stats.h"

static void writer(void *arg);

void session_flush(session *s)
{
	weft_mutex_lock(&s->lock);
	conn *c = s->conn;
	if (s->writing || !c || !s->out_len || c->closing) {
		weft_mutex_unlock(&s->lock);
		return;
	}
	s->writing = true;
	for (;;) {
		size_t len;
		int64_t need;
		uint8_t *buf = session_take_out(s, &len, &need);
		weft_mutex_unlock(&s->lock);
		buf = c->peer->frame(c, buf, &len);
		/* QoS 2 state not yet durable (out_after): the writer task waits for it, not us */
		ssize_t n = persist_durable(need) ? c->peer->write(c, buf, len, 0) : 0;
		weft_mutex_lock(&s->lock);
		if (n == (ssize_t)len) {
			stats_add(ST_BYTES_SENT, len);
			pool_free(buf);
			if (s->out_len && s->conn == c && !c->closing)
				continue;
			/* a retained backlog goes on in a writer task, which lets the
			 * worker's other tasks run between its chunks: never a whole
			 * backlog on the time of whoever flushed */
			if (!s->backlog || s->conn != c || !retained_drain(s) || !s->out_len)
				break;
			buf = NULL;
			len = 0;
			n = 0;
		}
		if (n >= 0 || n == -ETIMEDOUT) { /* the socket is full: a writer task waits */
			c->wbuf = buf;
			c->wlen = len;
			c->woff = n > 0 ? (size_t)n : 0;
			c->wneed = need;
			weft_spawn_opts o = { .name = "mqtt-writer", .detached = 1 };
			if (weft_spawn_opt(writer, c, &o)) {
				weft_mutex_unlock(&s->lock);
				return;
			}
			pool_free(c->wbuf);
			c->wbuf = NULL;
		} else {
			pool_free(buf);
		}
		shutdown(c->fd, SHUT_RDWR); /* broken: the reader will see it and end */
		break;
	}
	s->writing = false;
	weft_cond_broadcast(&s->idle);
	weft_mutex_unlock(&s->lock);
}

/* Drain c's session output while the socket pushes back, or once the store has what it waits
 * for (a store that failed: the connection ends, the client gets it all again on its return),
 * and its retained backlog (c->wbuf NULL at the start: nothing in hand yet); ends when both
 * are empty. Draining checks the ACL, whose rules are freed through epoch.c: it is a read
 * section, of a reader registered the first time (no cost to a writer without a backlog). */
static void writer(void *arg)
{
	conn *c = arg;
	session *s = c->s;
	epoch_reader rd = { 0 };
	for (;;) {
		size_t left = c->wlen - c->woff;
		ssize_t n = left ? -EIO : 0;
		if (left && persist_wait_ticket(c->wneed, WEFT_FOREVER) == 0)
			n = c->peer->write(c, c->wbuf + c->woff, left, WEFT_FOREVER);
		if (n > 0)
			stats_add(ST_BYTES_SENT, (uint64_t)n);
		pool_free(c->wbuf);
		c->wbuf = NULL;
		weft_mutex_lock(&s->lock);
		if (n != (ssize_t)left) {
			shutdown(c->fd, SHUT_RDWR);
		} else if (!c->closing) {
			bool more = false;
			if (s->backlog) {
				if (!rd.registered) /* epoch.c's lock is a leaf: fine under s's */
					epoch_register(&rd);
				epoch_enter(&rd);
				more = retained_drain(s);
				epoch_leave(&rd);
			}
			if (s->out_len) {
				size_t len;
				uint8_t *buf = session_take_out(s, &len, &c->wneed);
				weft_mutex_unlock(&s->lock);
				c->wbuf = c->peer->frame(c, buf, &len);
				c->wlen = len;
				c->woff = 0;
				if (more) /* a long backlog: the worker's other tasks get a turn */
					weft_yield();
				continue;
			}
		}
		s->writing = false;
		weft_cond_broadcast(&s->idle);
		weft_mutex_unlock(&s->lock);
		epoch_unregister(&rd);
		return;
	}
}
