/*
 * delivery.c - how messages get to a session: its output buffer, packet ids, the inflight
 * window, the queue beyond it, and the client's acknowledgements. Every function here runs
 * under the session's lock (taken here, or held by the caller where it says so).
 *
 * Delivery. A publisher's task encodes each delivery straight into the receiving session's
 * output buffer (QoS 0, or QoS 1/2 within the client's receive window) or queues a reference
 * to the shared message (QoS 1/2 beyond the window, or while the client is offline, up to
 * max_queued_messages and max_queued_bytes of payload, whichever comes first; QoS 0 beyond
 * qos0_queue_bytes of unsent output is dropped and counted). So what a client that reads
 * nothing costs is bounded: qos0_queue_bytes plus a window of messages in its output (and
 * as much again in the buffer its writer task holds), plus its queue's references.
 * It then notes the session as dirty in its own connection; at the end of the batch of
 * packets it read, the publisher flushes every dirty session: one write() carries every
 * message queued for that client since its last write. Under load a batch holds many
 * messages, so the broker makes far fewer system calls than messages.
 *
 * Writing the buffer to the socket is writer.c's.
 *
 * Retained messages a SUBSCRIBE sends are a backlog of the session (retained.c): references
 * to them, drained into the output and the window as room frees (after each write, each
 * acknowledgement, on resume), past the limits above, since it must be complete; the drain
 * bounds it (64 KiB more in the output of a client that reads nothing, and the window). A
 * retained message a live one pulls ahead of it goes within the limits (session_limit), so the
 * bound above holds while a backlog is pending too.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <weft.h>

#include "access.h"
#include "codec.h"
#include "conf.h"
#include "msg.h"
#include "peer.h"
#include "persist.h"
#include "pool.h"
#include "records.h"
#include "retained.h"
#include "session.h"
#include "stats.h"

/* ---- output --------------------------------------------------------------------------------- */

/* Whether s's connection still takes output: attached and not being torn down. Output added
 * once it closes would be discarded unwritten, and a QoS 1/2 delivery with it would stay inflight
 * as if sent: resent on the client's return even after its message expired. Lock held. */
static bool taking_output(const session *s)
{
	return s->conn && !s->conn->closing;
}

bool session_taking_output(const session *s)
{
	return taking_output(s);
}

uint8_t *session_take_out(session *s, size_t *len, int64_t *need)
{
	uint8_t *buf = s->out;
	*len = s->out_len;
	*need = s->out_ticket;
	s->out = NULL;
	s->out_len = s->out_cap = 0;
	return buf;
}

/* Room for n more bytes at the end of s's output (lock held). Its length and capacity are
 * size_t: what bounds them is the limits of delivery (above), never a counter's width; a window
 * of large QoS 1/2 messages to a client that reads nothing (20 of 256 MB, the defaults) passes
 * 4 GiB. Rejected: 32-bit counters under a ceiling, which every writer of the output, the
 * acknowledgements too, would have to be able to refuse at. */
uint8_t *session_out_room(session *s, size_t n)
{
	if (s->out_len + n > s->out_cap) {
		size_t want = (s->out_len + n) * 2;
		if (want < 4096 - 16)
			want = 4096 - 16;
		uint8_t *b = pool_alloc(want);
		if (s->out_len)
			memcpy(b, s->out, s->out_len);
		pool_free(s->out);
		s->out = b;
		s->out_cap = pool_size(b);
	}
	uint8_t *p = s->out + s->out_len;
	s->out_len += n;
	return p;
}

/* The topic alias to use for topic on c (0: none); *fresh when the mapping is new (the topic
 * must then be sent with it). */
static uint16_t alias_for(conn *c, const msg *m, bool *fresh)
{
	*fresh = false;
	if (!c->out_alias_max)
		return 0;
	uint32_t h = 2166136261u;
	for (uint16_t i = 0; i < m->topic_len; i++)
		h = (h ^ (uint8_t)m->topic[i]) * 16777619u;
	for (uint16_t i = 0; i < c->out_alias_n; i++) {
		alias_ent *a = &c->out_alias[i];
		if (a->hash == h && a->len == m->topic_len && !memcmp(a->topic, m->topic, a->len))
			return (uint16_t)(i + 1);
	}
	if (c->out_alias_n >= c->out_alias_max)
		return 0;
	if (!c->out_alias) {
		c->out_alias = calloc(c->out_alias_max, sizeof(alias_ent));
		if (!c->out_alias)
			abort();
	}
	alias_ent *a = &c->out_alias[c->out_alias_n];
	a->topic = malloc(m->topic_len + 1u);
	if (!a->topic)
		abort();
	memcpy(a->topic, m->topic, m->topic_len);
	a->hash = h;
	a->len = m->topic_len;
	*fresh = true;
	return ++c->out_alias_n;
}

/* Take back the alias alias_for has just made (fresh): the PUBLISH goes without it. */
static void alias_unmake(conn *c)
{
	free(c->out_alias[--c->out_alias_n].topic);
}

/* Encode a PUBLISH of m into s's output. Lock held, s->conn set. Returns 0, or -1 when the
 * client's maximum packet size does not allow it (dropped). */
static int encode_pub(session *s, msg *m, int qos, uint16_t pid, int dup, int retain,
		      const uint32_t *subids, int nsub, int64_t now)
{
	conn *c = s->conn;
	uint8_t pre[64];
	mq_pb pb = { pre, 0, sizeof pre, 0 };
	const char *topic = m->topic;
	uint16_t tlen = m->topic_len;
	char *mapped = NULL; /* a bridge's: the topic in the remote's terms */
	if (c->peer->out_topic && c->peer->out_topic(c, m, &topic, &tlen, &mapped, &retain) < 0)
		return -1;
	mq_pub_enc e = { s->version, qos, dup, retain, pid, topic, tlen, NULL, 0,
			 m->payload, m->payload_len, NULL, 0 };
	if (s->version == 5) {
		if (m->expiry) {
			int64_t left = (m->expiry - now + 999999999) / 1000000000;
			mq_pb_u32(&pb, MQ_P_MESSAGE_EXPIRY, (uint32_t)(left > 0 ? left : 1));
		}
		for (int i = 0; i < nsub; i++)
			mq_pb_varint(&pb, MQ_P_SUBSCRIPTION_ID, subids[i]);
		e.props = pre;
		e.props_len = pb.len;
		e.props2 = m->props;
		e.props2_len = m->props_len;
		if (s->max_packet && mq_enc_publish_len(&e) > s->max_packet) {
			free(mapped);
			return -1;
		}
		bool fresh;
		uint16_t alias = c->out_alias_max ? alias_for(c, m, &fresh) : 0;
		if (alias) {
			size_t plain = pb.len;
			mq_pb_u16(&pb, MQ_P_TOPIC_ALIAS, alias);
			e.props_len = pb.len;
			if (!fresh)
				e.topic_len = 0;
			/* a new alias travels with the topic, 3 bytes more: never past the
			 * client's maximum for it (fitting without, checked above) */
			else if (s->max_packet && mq_enc_publish_len(&e) > s->max_packet) {
				alias_unmake(c);
				pb.len = plain;
				e.props_len = plain;
			}
		}
	}
	size_t n = mq_enc_publish_len(&e);
	/* the maximum packet size of the peer: a 5.0 client's, or a bridge's remote's */
	if (s->max_packet && n > s->max_packet) {
		free(mapped);
		return -1;
	}
	mq_enc_publish(session_out_room(s, n), &e);
	free(mapped);
	stats_add(ST_PUB_SENT, 1);
	stats_add(ST_MSG_SENT, 1);
	return 0;
}

static uint16_t new_pid(session *s)
{
	for (;;) {
		uint16_t p = s->next_pid++;
		if (!s->next_pid)
			s->next_pid = 1;
		bool used = false;
		for (delivery *d = s->inflight; d && !used; d = d->next)
			used = d->pid == p;
		if (!used)
			return p;
	}
}

/* The two lists of a session (inflight, queue) are singly linked with a tail. */
static void list_append(delivery **head, delivery **tail, delivery *d)
{
	d->next = NULL;
	if (*tail)
		(*tail)->next = d;
	else
		*head = d;
	*tail = d;
}

static void inflight_append(session *s, delivery *d)
{
	list_append(&s->inflight, &s->inflight_tail, d);
	s->ninflight++;
}

/* Take d, which follows prev (NULL: d is first), out of the inflight list. */
static void inflight_unlink(session *s, delivery *prev, delivery *d)
{
	if (prev)
		prev->next = d->next;
	else
		s->inflight = d->next;
	if (s->inflight_tail == d)
		s->inflight_tail = prev;
	s->ninflight--;
}

/* The queue beyond the inflight window, counted in messages and payload bytes (the two limits
 * of max_queued_messages and max_queued_bytes). Lock held. */
static void queue_append(session *s, delivery *d)
{
	list_append(&s->queue, &s->queue_tail, d);
	s->nqueued++;
	s->queued_bytes += d->m->payload_len;
	stats_add(ST_QUEUED, 1);
}

static delivery *queue_pop(session *s)
{
	delivery *d = s->queue;
	s->queue = d->next;
	if (!s->queue)
		s->queue_tail = NULL;
	s->nqueued--;
	s->queued_bytes -= d->m->payload_len;
	stats_add(ST_QUEUED, -(uint64_t)1);
	return d;
}

/* s's output from now on goes out once store write t is durable (failed: never). A stored QoS 2
 * PUBLISH with id X waits for X to be on disk (else a crash frees X while the client holds it:
 * the next message with X is taken for a resend and lost), a PUBREL for its PUBREC (else the
 * PUBLISH is resent after a crash to a client done with X: delivered twice). QoS 1 may be
 * resent anyway: it does not wait. Lock held. */
static void out_after(session *s, int qos, int64_t t)
{
	if (qos != 2)
		return;
	if (t < 0)
		t = INT64_MAX;
	if (t > s->out_ticket)
		s->out_ticket = t;
}

static delivery *dlv_new(msg *m, int qos, int retain, const uint32_t *subids, int nsub)
{
	delivery *d = pool_alloc(sizeof *d);
	*d = (delivery){ NULL, msg_ref(m), 0, (uint8_t)qos, (uint8_t)retain, 0, (uint8_t)nsub, { 0 }, 0 };
	memcpy(d->subid, subids, (size_t)nsub * sizeof *subids);
	return d;
}

/* Send d now: it becomes inflight (or is dropped when too large). Lock held, connected. */
/* A stored delivery dropped (expired, too large for the client): the store forgets it too.
 * The store deletes deliveries by packet id, so one that never had an id gets one first. */
static void forget(session *s, delivery *d)
{
	if (!d->mid)
		return;
	if (!d->pid) {
		d->pid = new_pid(s);
		persist_inflight(s, d);
	}
	persist_ack(s, d->pid);
}

static void start(session *s, delivery *d, int64_t now)
{
	bool known = d->pid != 0; /* given before it was stored: the store has it already */
	if (!known)
		d->pid = new_pid(s);
	d->state = 0;
	if (d->mid && !known)
		out_after(s, d->qos, persist_inflight(s, d));
	if (encode_pub(s, d->m, d->qos, d->pid, 0, d->retain, d->subid, d->nsub, now) < 0) {
		stats_add(ST_PUB_DROPPED, 1);
		if (d->mid)
			persist_ack(s, d->pid);
		msg_unref(d->m);
		pool_free(d);
		return;
	}
	inflight_append(s, d);
}

/* Move queued messages into the window. Lock held. */
static void fill_window(session *s)
{
	if (!taking_output(s))
		return;
	int64_t now = weft_now();
	while (s->queue && s->ninflight < s->window) {
		delivery *d = queue_pop(s);
		/* checked against the client's rules again as it goes out: they were the session's
		 * binding when it was queued, and may have been reloaded since */
		bool expired = msg_expired(d->m, now);
		if (expired || !access_read(s, d->m)) {
			stats_add(expired ? ST_DROP_EXPIRED : ST_PUB_DROPPED, 1);
			forget(s, d);
			msg_unref(d->m);
			pool_free(d);
			continue;
		}
		start(s, d, now);
	}
	if (s->backlog) /* what room live messages leave */
		retained_drain(s);
}

/* After output was added under the lock: should `by` flush s at the end of its batch? */
static bool want_flush(session *s, conn *by)
{
	if (!taking_output(s) || !s->out_len || s->writing)
		return false;
	if (!by)
		return true;
	if (s->dirty_owner == by && s->dirty_batch == by->batch)
		return false; /* already in by's list */
	s->dirty_owner = by;
	s->dirty_batch = by->batch;
	return true;
}

static void after(session *s, conn *by, bool flush)
{
	if (!flush)
		return;
	if (by)
		conn_mark_dirty(by, s);
	else
		session_flush(s);
}

int session_limit(const session *s, int qos, uint32_t payload_len)
{
	if (qos == 0) {
		bool full = !taking_output(s) || s->out_len > (size_t)conf.qos0_queue_bytes;
		return full ? ST_DROP_QOS0 : -1;
	}
	if (taking_output(s) && !s->queue && s->ninflight < s->window)
		return -1;
	if (s->nqueued >= (uint32_t)conf.max_queued_messages)
		return ST_DROP_QUEUE_FULL;
	if (conf.max_queued_bytes &&
	    s->queued_bytes + payload_len > (uint64_t)conf.max_queued_bytes)
		return ST_DROP_QUEUE_BYTES;
	return -1;
}

void session_dropped(int why)
{
	stats_add(why, 1);
	stats_add(ST_PUB_DROPPED, 1);
}

void session_put(session *s, msg *m, int qos, int retain, const uint32_t *subids, int nsub,
		 conn *by, int64_t now, bool capped)
{
	int why = capped ? session_limit(s, qos, m->payload_len)
			 : qos == 0 && !taking_output(s) ? ST_DROP_QOS0 : -1;
	if (why >= 0) {
		session_dropped(why);
	} else if (qos == 0) {
		if (encode_pub(s, m, 0, 0, 0, retain, subids, nsub, now) < 0)
			stats_add(ST_PUB_DROPPED, 1);
	} else if (taking_output(s) && !s->queue && s->ninflight < s->window) {
		delivery *d = dlv_new(m, qos, retain, subids, nsub);
		if (s->stored) { /* stored as sent already: one write instead of two */
			d->pid = new_pid(s);
			out_after(s, qos, persist_enqueue(s, d, by));
		}
		start(s, d, now);
	} else {
		delivery *d = dlv_new(m, qos, retain, subids, nsub);
		if (s->stored)
			persist_enqueue(s, d, by);
		queue_append(s, d);
	}
}

void session_deliver(session *s, msg *m, int qos, int retain, const uint32_t *subids, int nsub,
		     conn *by)
{
	int64_t now = m->expiry ? weft_now() : 0;
	weft_mutex_lock(&s->lock);
	if (s->dead) {
		weft_mutex_unlock(&s->lock);
		return;
	}
	/* a retained message of m's topic still to send goes first, or holds m back */
	int held = s->backlog ? retained_overtake(s, m, qos, by) : -1;
	if (held >= 0)
		session_dropped(held);
	else
		session_put(s, m, qos, retain, subids, nsub, by, now, true);
	bool flush = want_flush(s, by);
	weft_mutex_unlock(&s->lock);
	after(s, by, flush);
}

void session_retained(session *s, const char *f, uint16_t len, msg **v, uint32_t n, int max_qos,
		      uint32_t subid, uint64_t reserved, conn *by)
{
	retained_start(s, f, len, v, n, max_qos, subid, reserved);
	bool flush = want_flush(s, by);
	weft_mutex_unlock(&s->lock);
	after(s, by, flush);
}

void session_send(session *s, const void *pkt, size_t n, conn *by)
{
	bool flush = false;
	WEFT_WITH_LOCK(&s->lock) {
		if (!taking_output(s))
			break;
		memcpy(session_out_room(s, n), pkt, n);
		flush = want_flush(s, by);
	}
	stats_add(ST_MSG_SENT, 1);
	after(s, by, flush);
}

/* ---- acknowledgements ----------------------------------------------------------------------- */

/* Unlink and return the inflight delivery with pid (and qos, state), or NULL. Lock held. */
static delivery *inflight_find(session *s, uint16_t pid, int qos, int state, bool unlink)
{
	delivery *prev = NULL;
	for (delivery *d = s->inflight; d; prev = d, d = d->next) {
		if (d->pid != pid)
			continue;
		if (d->qos != qos || d->state != state)
			return NULL;
		if (unlink)
			inflight_unlink(s, prev, d);
		return d;
	}
	return NULL;
}

static void done(session *s, delivery *d)
{
	if (d->mid)
		persist_ack(s, d->pid);
	msg_unref(d->m);
	pool_free(d);
	fill_window(s);
}

/* The last acknowledgement of an outbound flow (PUBACK of QoS 1, PUBCOMP of QoS 2 after
 * PUBREC): the delivery is done. */
static void flow_ends(session *s, uint16_t pid, int qos, int state, conn *by)
{
	bool flush = false;
	WEFT_WITH_LOCK(&s->lock) {
		delivery *d = inflight_find(s, pid, qos, state, true);
		if (d)
			done(s, d);
		flush = want_flush(s, by);
	}
	after(s, by, flush);
}

void session_puback(session *s, uint16_t pid, conn *by)
{
	flow_ends(s, pid, 1, 0, by);
}

void session_pubrec(session *s, uint16_t pid, int reason, conn *by)
{
	bool flush = false;
	WEFT_WITH_LOCK(&s->lock) {
		delivery *d = inflight_find(s, pid, 2, 0, reason >= 0x80);
		if (d && reason >= 0x80) {
			done(s, d); /* the client refused it: the flow ends here */
		} else {
			if (d) {
				d->state = 1;
				if (d->mid) /* the PUBREL waits for it */
					out_after(s, 2, persist_inflight(s, d));
			}
			if (!taking_output(s))
				break; /* the PUBREL goes out when the client is back (session_resume) */
			uint8_t pkt[8];
			size_t n = mq_enc_ack(pkt, s->version, MQ_PUBREL, pid,
					      d ? 0 : MQ_RC_PACKET_ID_NOT_FOUND, NULL);
			memcpy(session_out_room(s, n), pkt, n);
		}
		flush = want_flush(s, by);
	}
	after(s, by, flush);
}

void session_pubcomp(session *s, uint16_t pid, conn *by)
{
	flow_ends(s, pid, 2, 1, by);
}

void session_resume(session *s, conn *by)
{
	bool flush = false;
	int64_t now = weft_now();
	WEFT_WITH_LOCK(&s->lock) {
		delivery *prev = NULL;
		for (delivery *d = s->inflight; d;) {
			delivery *next = d->next;
			int r = 0;
			/* not checked against the rules again, as queued ones are (fill_window): a
			 * PUBLISH already sent may be held by the client awaiting PUBREL, and its id
			 * must not be given to another message */
			if (d->state == 0) {
				r = encode_pub(s, d->m, d->qos, d->pid, 1, d->retain, d->subid, d->nsub, now);
			} else {
				uint8_t pkt[8];
				size_t n = mq_enc_ack(pkt, s->version, MQ_PUBREL, d->pid, 0, NULL);
				memcpy(session_out_room(s, n), pkt, n);
			}
			if (r < 0) { /* too large for this connection: dropped */
				if (d->mid)
					persist_ack(s, d->pid);
				inflight_unlink(s, prev, d);
				msg_unref(d->m);
				pool_free(d);
			} else {
				prev = d;
			}
			d = next;
		}
		fill_window(s);
		flush = want_flush(s, by);
	}
	after(s, by, flush);
}

int session_rel_add(session *s, uint16_t pid, int max)
{
	int r = 0;
	WEFT_WITH_LOCK(&s->lock) {
		for (uint16_t i = 0; i < s->nrel; i++)
			if (s->rel_ids[i] == pid) {
				r = 1;
				break;
			}
		if (r)
			break;
		if (s->nrel >= max) {
			r = -1;
			break;
		}
		if (s->nrel == s->rel_cap) {
			uint16_t cap = s->rel_cap ? (uint16_t)(s->rel_cap * 2) : 8;
			uint16_t *v = realloc(s->rel_ids, cap * sizeof *v);
			if (!v)
				abort();
			s->rel_ids = v;
			s->rel_cap = cap;
		}
		s->rel_ids[s->nrel++] = pid;
	}
	return r;
}

bool session_rel_del(session *s, uint16_t pid)
{
	bool found = false;
	WEFT_WITH_LOCK(&s->lock) {
		for (uint16_t i = 0; i < s->nrel; i++)
			if (s->rel_ids[i] == pid) {
				s->rel_ids[i] = s->rel_ids[--s->nrel];
				found = true;
				break;
			}
	}
	return found;
}

/* ---- restoring (persist.c, at start) ------------------------------------------------------ */

void session_restore_delivery(session *s, const delivery *proto)
{
	delivery *d = pool_alloc(sizeof *d);
	*d = *proto;
	msg_ref(d->m);
	uint16_t pid = d->pid;
	WEFT_WITH_LOCK(&s->lock) {
		if (pid) {
			inflight_append(s, d);
			if (pid >= s->next_pid)
				s->next_pid = (uint16_t)(pid + 1) ? (uint16_t)(pid + 1) : 1;
		} else {
			queue_append(s, d);
		}
	}
}
