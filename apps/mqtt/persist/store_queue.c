/*
 * store_queue.c - the store's side that the broker's tasks run: a write copied into an `op`,
 * given its ticket and handed to the writer thread (store.c) through a channel, and the wait
 * for its durability. See store.c for the whole design.
 *
 * A write call never waits. The broker writes under its locks - a session's while it queues a
 * delivery, the session table's while the reaper drops a will - so a call that waited for the
 * writer to make room would stall every task that needs one of those locks, and through the
 * table's lock every CONNECT, for as long as the disk stays full. So the channel is unbounded,
 * and what bounds it is this:
 *
 * - While the store works, every connection waits at the end of its batch of packets for the
 *   writes it made (persist_wait): what the broker's clients can put ahead of the writer is a
 *   batch per connection.
 * - While it is failed, those waits return at once (-EIO), and a client that reconnects and
 *   resends can queue writes without end. Once QUEUE_MAX writes wait, the next write is
 *   refused at once (-EIO), and so is every later one: the store is *lost*. Lost is for good,
 *   until the store is opened again: a write refused leaves a hole, and committing anything
 *   after it would put a state on disk the broker never had (an acknowledgement kept without
 *   the delivery before it, half a group). So the writer commits nothing any more (store.c),
 *   store_failed stays true (the broker refuses persistent sessions), and a restart loads the
 *   last state that was durable - which holds everything the broker acknowledged, since no
 *   wait returned 0 past it.
 *
 * Rejected: waiting for room (the stall above); dropping the refused write and
 * going on (the hole); a queue bounded by memory with no end while failed (a disk full for an
 * hour takes the broker's memory); rewriting the broker's whole state once the store
 * recovers, which would let a lost store come back without a restart (every session's lock in
 * turn, for a snapshot that must be consistent with writes still coming: not done).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <weft.h>

#include "store_queue.h"

/* ---- submitting -------------------------------------------------------------------------- */

/*
 * The writer thread starts with the first write, not in store_open: weft's deadlock check
 * counts threads started after weft_run as ones that may wake a task, and a store opened
 * before weft_run would otherwise have its waiters reported as deadlocked. qlock held.
 */
static int64_t start_writer(store *st)
{
	int r = pthread_create(&st->writer, NULL, store_writer_main, st);
	if (r) {
		fprintf(stderr, "weft-mqtt: cannot start the store's writer thread: %s\n",
			strerror(r));
		return -EAGAIN;
	}
	st->started = true;
	return 0;
}

static op *op_new(int kind, const char *id, uint16_t id_len, const char *s, uint16_t s_len,
		  const void *props, uint32_t props_len, const void *payload, uint32_t payload_len)
{
	size_t n = sizeof(op) + id_len + s_len + (size_t)props_len + payload_len;
	op *o = malloc(n);
	if (!o)
		return NULL;
	memset(o, 0, sizeof *o);
	o->kind = kind;
	char *p = o->data;
	o->id = p, o->id_len = id_len;
	if (id_len)
		memcpy(p, id, id_len);
	p += id_len;
	o->s = p, o->s_len = s_len;
	if (s_len)
		memcpy(p, s, s_len);
	p += s_len;
	o->props = (uint8_t *)p, o->props_len = props_len;
	if (props_len)
		memcpy(p, props, props_len);
	p += props_len;
	o->payload = (uint8_t *)p, o->payload_len = payload_len;
	if (payload_len)
		memcpy(p, payload, payload_len);
	return o;
}

/* Where an enqueue's ids go: the row's, and the shared message's (may be NULL). */
typedef struct enq_ids {
	uint64_t *row;
	_Atomic uint64_t *shared;
} enq_ids;

/*
 * Whether o must be refused: the store is lost, or becomes lost with o (failed, and QUEUE_MAX
 * writes not durable). A group's end never is - the writer, inside the group, waits for it -
 * and the group it ends is not committed. qlock held.
 */
static bool refused(store *st, const op *o)
{
	if (o->kind == OP_GROUP_END)
		return false;
	if (atomic_load(&st->lost))
		return true;
	int64_t behind = st->next_ticket - atomic_load(&st->durable);
	if (!atomic_load(&st->failed) || behind < QUEUE_MAX)
		return false;
	atomic_store(&st->lost, true);
	fprintf(stderr, "weft-mqtt: store: %lld writes wait and it still cannot write: writes are "
			"refused from now on, and nothing more is made durable until a restart: %s\n",
		(long long)behind, st->path);
	return true;
}

/*
 * Hand o to the writer: its ticket, or -errno (o freed): -EIO when refused. For an enqueue,
 * the row id and (for a message not stored yet) the message id are handed out here too, and a
 * shared message whose id another task set meanwhile is only referred to (OP_ENQ becomes
 * OP_ENQ_MID). Never waits but for qlock, which nobody holds across a wait.
 */
static int64_t submit(store *st, op *o, const enq_ids *e)
{
	if (!o)
		return -ENOMEM;
	int64_t t = -EPIPE;
	uint64_t mid = 0;
	weft_mutex_lock(&st->qlock);
	if (!st->closed && !st->started) /* see start_writer */
		t = start_writer(st);
	if (!st->closed && t != -EAGAIN && refused(st, o)) {
		t = -EIO;
	} else if (!st->closed && t != -EAGAIN) {
		o->ticket = st->next_ticket + 1;
		if (e) {
			o->seq = st->next_seq + 1;
			if (o->kind == OP_ENQ && e->shared && atomic_load(e->shared))
				o->kind = OP_ENQ_MID, o->mid = atomic_load(e->shared);
			if (o->kind == OP_ENQ)
				o->mid = mid = st->next_mid + 1;
		}
		int r = weft_chan_offer(st->ch, &o, sizeof o); /* unbounded: no wait */
		if (r == 0) { /* o is the writer's now (and may be freed) */
			t = ++st->next_ticket;
			atomic_store(&st->issued, t);
			if (e) {
				*e->row = ++st->next_seq;
				if (mid) {
					st->next_mid = mid;
					if (e->shared)
						atomic_store(e->shared, mid);
				}
			}
		} else {
			t = r;
		}
	}
	weft_mutex_unlock(&st->qlock);
	if (t < 0)
		free(o);
	return t;
}

static bool bad_msg(const store_msg *m)
{
	return !m || (m->topic_len && !m->topic) || (m->props_len && !m->props) ||
	       (m->payload_len && !m->payload);
}

int64_t store_put_retained(store *st, const store_msg *m)
{
	if (bad_msg(m))
		return -EINVAL;
	if (m->payload_len == 0)
		return store_del_retained(st, m->topic, m->topic_len);
	op *o = op_new(OP_PUT_RET, NULL, 0, m->topic, m->topic_len, m->props, m->props_len,
		       m->payload, m->payload_len);
	if (o)
		o->qos = m->qos, o->time = m->expiry;
	return submit(st, o, NULL);
}

int64_t store_del_retained(store *st, const char *topic, uint16_t topic_len)
{
	return submit(st, op_new(OP_DEL_RET, NULL, 0, topic, topic_len, NULL, 0, NULL, 0), NULL);
}

int64_t store_put_session(store *st, const store_session *s)
{
	if (!s || (s->id_len && !s->id))
		return -EINVAL;
	if (s->owner_len && !s->owner)
		return -EINVAL;
	op *o = op_new(OP_PUT_SES, s->id, s->id_len, s->owner, s->owner_len, NULL, 0, NULL, 0);
	if (o) {
		o->version = s->version, o->u32 = s->expiry_interval, o->time = s->disconnected_at;
		o->anon = !s->owner, o->owned = s->owner_known;
	}
	return submit(st, o, NULL);
}

int64_t store_del_session(store *st, const char *id, uint16_t id_len)
{
	return submit(st, op_new(OP_DEL_SES, id, id_len, NULL, 0, NULL, 0, NULL, 0), NULL);
}

int64_t store_put_sub(store *st, const char *id, uint16_t id_len, const char *filter,
		      uint16_t filter_len, uint8_t opts, uint32_t subid)
{
	op *o = op_new(OP_PUT_SUB, id, id_len, filter, filter_len, NULL, 0, NULL, 0);
	if (o)
		o->opts = opts, o->u32 = subid;
	return submit(st, o, NULL);
}

int64_t store_del_sub(store *st, const char *id, uint16_t id_len, const char *filter,
		      uint16_t filter_len)
{
	return submit(st, op_new(OP_DEL_SUB, id, id_len, filter, filter_len, NULL, 0, NULL, 0),
		      NULL);
}

int64_t store_enqueue(store *st, const char *id, uint16_t id_len, const store_msg *m,
		      const store_dlv *d, uint64_t *row, _Atomic uint64_t *shared)
{
	if (bad_msg(m) || !d || !row || d->nsubid > 4)
		return -EINVAL;
	op *o;
	if (shared && atomic_load(shared)) /* stored already: a queue row is all it takes */
		o = op_new(OP_ENQ_MID, id, id_len, NULL, 0, NULL, 0, NULL, 0);
	else
		o = op_new(OP_ENQ, id, id_len, m->topic, m->topic_len, m->props, m->props_len,
			   m->payload, m->payload_len);
	if (o) {
		o->qos = d->qos, o->retain = d->retain, o->nsubid = d->nsubid, o->pid = d->pid;
		memcpy(o->subid, d->subid, sizeof o->subid);
		o->mqos = m->qos, o->opts = m->retain, o->time = m->expiry, o->pin = shared != NULL;
		if (o->kind == OP_ENQ_MID)
			o->mid = atomic_load(shared);
	}
	enq_ids e = { row, shared };
	return submit(st, o, &e);
}

int64_t store_release(store *st, uint64_t mid)
{
	op *o = op_new(OP_RELEASE, NULL, 0, NULL, 0, NULL, 0, NULL, 0);
	if (o)
		o->mid = mid;
	return submit(st, o, NULL);
}

int64_t store_inflight(store *st, const char *id, uint16_t id_len, uint64_t row, uint16_t pid,
		       uint8_t state)
{
	op *o = op_new(OP_INFLIGHT, id, id_len, NULL, 0, NULL, 0, NULL, 0);
	if (o)
		o->seq = row, o->pid = pid, o->state = state;
	return submit(st, o, NULL);
}

int64_t store_put_will(store *st, const char *id, uint16_t id_len, const store_msg *m,
		       uint32_t delay, int64_t at)
{
	if (bad_msg(m))
		return -EINVAL;
	op *o = op_new(OP_PUT_WILL, id, id_len, m->topic, m->topic_len, m->props, m->props_len,
		       m->payload, m->payload_len);
	if (o)
		o->mqos = m->qos, o->retain = m->retain, o->time = m->expiry, o->u32 = delay,
		o->time2 = at;
	return submit(st, o, NULL);
}

int64_t store_del_will(store *st, const char *id, uint16_t id_len)
{
	return submit(st, op_new(OP_DEL_WILL, id, id_len, NULL, 0, NULL, 0, NULL, 0), NULL);
}

int64_t store_group_begin(store *st)
{
	op *o = op_new(OP_GROUP, NULL, 0, NULL, 0, NULL, 0, NULL, 0);
	op *end = op_new(OP_GROUP_END, NULL, 0, NULL, 0, NULL, 0, NULL, 0);
	if (!o || !end) {
		free(o);
		free(end);
		return -ENOMEM;
	}
	weft_mutex_lock(&st->glock);
	int64_t t = submit(st, o, NULL);
	if (t < 0) {
		weft_mutex_unlock(&st->glock);
		free(end);
		return t;
	}
	st->gend = end;
	return t;
}

int64_t store_group_end(store *st)
{
	int64_t t = submit(st, st->gend, NULL);
	st->gend = NULL;
	weft_mutex_unlock(&st->glock);
	return t;
}

static int64_t by_pid(store *st, int kind, const char *id, uint16_t id_len, uint16_t pid)
{
	if (pid == 0)
		return -EINVAL;
	op *o = op_new(kind, id, id_len, NULL, 0, NULL, 0, NULL, 0);
	if (o)
		o->pid = pid;
	return submit(st, o, NULL);
}

int64_t store_ack(store *st, const char *id, uint16_t id_len, uint16_t pid)
{
	return by_pid(st, OP_ACK, id, id_len, pid);
}

int64_t store_rel_add(store *st, const char *id, uint16_t id_len, uint16_t pid)
{
	return by_pid(st, OP_REL_ADD, id, id_len, pid);
}

int64_t store_rel_del(store *st, const char *id, uint16_t id_len, uint16_t pid)
{
	return by_pid(st, OP_REL_DEL, id, id_len, pid);
}

/* ---- durability -------------------------------------------------------------------------- */

int64_t store_durable(store *st)
{
	return atomic_load(&st->durable);
}

int64_t store_issued(store *st)
{
	return atomic_load(&st->issued);
}

int store_wait(store *st, int64_t ticket, int64_t deadline)
{
	if (ticket <= 0 || ticket > atomic_load(&st->issued))
		return -EINVAL;
	if (atomic_load(&st->durable) >= ticket)
		return 0;
	int r = 0;
	weft_mutex_lock(&st->dlock);
	st->waiters++;
	while (atomic_load(&st->durable) < ticket && r == 0) {
		if (atomic_load(&st->failed) || atomic_load(&st->lost))
			r = -EIO;
		else if (st->closing)
			r = -EPIPE;
		else
			r = weft_cond_wait_until(&st->dcond, &st->dlock, deadline);
	}
	if (--st->waiters == 0 && st->closing) /* store_close waits for the last to leave */
		weft_cond_broadcast(&st->dcond);
	weft_mutex_unlock(&st->dlock);
	return atomic_load(&st->durable) >= ticket ? 0 : r;
}

void store_stats_get(store *st, store_stats *out)
{
	out->writes = atomic_load_explicit(&st->writes, memory_order_relaxed);
	out->commits = atomic_load_explicit(&st->commits, memory_order_relaxed);
	out->commit_ns = atomic_load_explicit(&st->commit_ns, memory_order_relaxed);
}
