/*
 * retained.c - the retained messages a SUBSCRIBE sends [MQTT-3.3.1-6]: every one that matches,
 * however many, at the pace the client takes them.
 *
 * A SUBSCRIBE's retained messages are a backlog of the session: the matching retained
 * messages as they were at the SUBSCRIBE, taken from the tree as references (msg.c: a
 * pointer each, no copy), and a cursor. The backlog is drained into the session's output as
 * room frees: a QoS 0 delivery while less than RETAINED_CHUNK bytes wait in the output
 * buffer, a QoS 1/2 one while the inflight window has room and no live message is queued.
 * What frees room drains it again: the writer finishing a write (session_flush, and the
 * writer task, which gives its worker back between chunks), an acknowledgement freeing the
 * window (fill_window), the client coming back to its session (session_resume). So a client
 * that reads nothing holds a chunk in its output and one in its writer, the socket pushes
 * back, and the backlog costs a pointer per message not yet sent (and, once a live message
 * comes while it is pending, a slot of its topic index). The pointers are references: a
 * retained message replaced or cleared after the snapshot stays in memory until it is sent or
 * the backlog ends, so a pending backlog can hold as much as its filter matched in the store
 * at the SUBSCRIBE, beside the store.
 *
 * The limits on live deliveries (qos0_queue_bytes, max_queued_messages, max_queued_bytes) do
 * not cut a backlog: it must be complete, and draining bounds what it adds to a chunk and a
 * window. Rejected: pushing the whole backlog through session_deliver at once (mosquitto's
 * way), where those limits drop all but a window and a queue of it; queueing it as
 * deliveries (a record per message per subscriber, where the snapshot is a pointer); a
 * resumable walk of the tree (its nodes are freed through epoch.c and its hash tables rebuilt
 * as they grow: a cursor into it between batches would need both pinned).
 * An entry a live message pulls ahead (retained_overtake, below) is another matter: it goes on
 * the live message's account, within those limits, or not at all. Rejected: sending it past
 * them, which let a client that pings but never reads take a copy of every retained message
 * its filters match into its output for each SUBSCRIBE, as live messages came on their topics.
 *
 * Choices (docs/weft-mqtt.md, "Retained messages on subscribe", says what is promised):
 *  - What is sent is the snapshot: a retained message replaced or cleared after the SUBSCRIBE
 *    is still sent as it was, as if the whole backlog had been queued at once. The newer one
 *    was delivered live, the subscription being in place before the snapshot.
 *  - Order on a topic: a live message to the session whose topic has an entry still pending
 *    in a backlog takes that entry out and delivers it first (retained_overtake), so no live
 *    message on a topic is overtaken by its older retained one. If the limits of live delivery
 *    leave the entry no room, it stays, and a live message of its QoS is dropped at that limit
 *    instead of overtaking it (of another QoS it goes on: [MQTT-4.6.0-6] orders messages of
 *    one QoS). Live messages queued go
 *    before the backlog's QoS 1/2 entries: the backlog takes the room live traffic leaves,
 *    and a live message waits behind at most a chunk and a window of it. Rejected: the
 *    backlog first, as if queued at the SUBSCRIBE (mosquitto's order), which makes live
 *    QoS 1/2 messages drop at max_queued_messages while a long backlog takes the window.
 *  - Expiry and the ACL are checked as each entry is sent.
 *  - UNSUBSCRIBE ends the filter's backlog; a session that ends drops its backlogs. A
 *    persistent session that goes offline keeps them (references) and goes on when its client
 *    comes back; they are not written to the store: a restart loses what was not sent.
 *  - A second SUBSCRIBE to the filter that sends retained messages (retain handling 0, or 1 for
 *    a subscription that did not exist; always in 3.1.1) starts the backlog over from a new
 *    snapshot, as the specification wants them all sent again; one that does not (retain
 *    handling 1 or 2) lets a pending backlog go on under the new options, since what the
 *    first SUBSCRIBE asked for is owed still.
 *
 * What backlogs may hold (the budgets). A backlog costs its slots (a pointer, and once a live
 * message comes a slot of its topic index: ENTRY_BYTES with their slack) and keeps alive every
 * message it references: a retained message replaced or cleared after the snapshot stays in
 * memory for it. So each entry is counted as its slots and its whole message (retained_cost),
 * as if every message it references were to be replaced - which a publisher can do at will -
 * and what is counted goes against the session's budget (conf.backlog_bytes) and every
 * session's together (conf.backlog_bytes_total) from the SUBSCRIBE until the entry is sent or
 * the backlog ends. A SUBSCRIBE whose backlog would pass either is refused (handle_subscribe.c:
 * retained_admit is asked before the filter is subscribed, and reserves the cost). Rejected:
 *  - counting a message only when the store lets go of it while a backlog still holds it:
 *    closer to what memory is held (overlapping filters over messages that do not change cost
 *    their slots only), but the cost then comes after the SUBSCRIBE was granted, from another
 *    client's PUBLISH, and is not any one session's (several backlogs may hold one message),
 *    so it could only be refused to the next SUBSCRIBE of anyone, and one client could use up
 *    the broker's budget for all;
 *  - counting slots only (8 to 16 bytes an entry): it leaves the replaced versions, the
 *    larger part, unbounded.
 * The price is that a client with many overlapping filters over a large store is refused
 * sooner than the memory it holds would demand; the budgets are sized for the store a single
 * `#` subscriber takes whole (docs/weft-mqtt.md, Limits).
 *
 * Everything here runs under the session's lock. topic_send_retained takes the snapshot under
 * the tree's lock and takes the session's before letting the tree's go (lock order: the tree,
 * then a session), so that no retained message can change, and be delivered live, between the
 * snapshot and the backlog being in place for retained_overtake to see.
 */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <weft.h>

#include "access.h"
#include "conf.h"
#include "msg.h"
#include "pool.h"
#include "records.h"
#include "retained.h"
#include "session.h"
#include "topic.h"

/* QoS 0 entries are drained while the output holds less than this: big enough for few
 * writes, small next to qos0_queue_bytes, which then stays the room of live QoS 0 traffic */
#define RETAINED_CHUNK 65536

/* What an entry's slots cost at most: its pointer in the snapshot (an array grown by
 * doubling: up to 2 slots of 8 bytes an entry) and its topic index (4-byte slots, up to 4 an
 * entry: twice the entries pending, rounded up to a power of 2) */
#define ENTRY_BYTES 32

/* What every session's backlogs and reservations cost together (retained_cost of each entry
 * pending, as s->backlog_bytes is for one session) */
static _Atomic uint64_t total;

struct rbacklog {
	struct rbacklog *next;
	msg **v;          /* the snapshot; an entry is NULL once sent or taken out */
	uint32_t n, at;   /* entries; the next to drain (all before it are NULL) */
	uint32_t *index;  /* topic -> entry + 1, open addressing, built on first use; 0: empty */
	uint64_t cost;    /* retained_cost of the entries pending */
	uint32_t mask;
	uint32_t subid;
	uint8_t max_qos;
	uint16_t len;
	char filter[];
};

uint64_t retained_cost(const msg *m)
{
	return ENTRY_BYTES + pool_size(m);
}

uint64_t retained_backlog_bytes(void)
{
	return atomic_load_explicit(&total, memory_order_relaxed);
}

static void charge(session *s, uint64_t c)
{
	s->backlog_bytes += c;
	atomic_fetch_add_explicit(&total, c, memory_order_relaxed);
}

static void uncharge(session *s, uint64_t c)
{
	s->backlog_bytes -= c;
	atomic_fetch_sub_explicit(&total, c, memory_order_relaxed);
}

/* Entry m leaves b (sent, or taken out to be). */
static void entry_gone(session *s, rbacklog *b, const msg *m)
{
	uint64_t c = retained_cost(m);
	b->cost -= c;
	uncharge(s, c);
}

static void backlog_free(session *s, rbacklog *b)
{
	uncharge(s, b->cost);
	for (uint32_t i = b->at; i < b->n; i++)
		msg_unref(b->v[i]);
	free(b->v);
	free(b->index);
	free(b);
}

static int granted(const rbacklog *b, const msg *m)
{
	return m->qos < b->max_qos ? m->qos : b->max_qos;
}

/* Send entry m of b now (taken out of b already; the reference is dropped here). */
static void send_entry(session *s, rbacklog *b, msg *m, conn *by, int64_t now)
{
	if (!msg_expired(m, now) && access_read(s, m))
		session_put(s, m, granted(b, m), 1, &b->subid, b->subid ? 1 : 0, by, now, false);
	msg_unref(m);
}

static rbacklog **find(session *s, const char *f, uint16_t len)
{
	rbacklog **pp = &s->backlog;
	while (*pp && ((*pp)->len != len || memcmp((*pp)->filter, f, len)))
		pp = &(*pp)->next;
	return pp;
}

void retained_forget(session *s, const char *f, uint16_t len)
{
	rbacklog **pp = find(s, f, len), *b = *pp;
	if (b) {
		*pp = b->next;
		backlog_free(s, b);
	}
}

void retained_drop_all(session *s)
{
	while (s->backlog) {
		rbacklog *b = s->backlog;
		s->backlog = b->next;
		backlog_free(s, b);
	}
}

bool retained_drain(session *s)
{
	if (!session_taking_output(s))
		return false;
	bool added = false;
	int64_t now = weft_now();
	rbacklog *b;
	while ((b = s->backlog)) {
		for (; b->at < b->n; b->at++) {
			msg *m = b->v[b->at];
			if (!m)
				continue;
			if (granted(b, m) ? s->queue || s->ninflight >= s->window
					  : s->out_len >= RETAINED_CHUNK)
				return added;
			b->v[b->at] = NULL;
			entry_gone(s, b, m);
			send_entry(s, b, m, NULL, now);
			added = true;
		}
		s->backlog = b->next;
		backlog_free(s, b);
	}
	return added;
}

static uint64_t budget(long b)
{
	return b > 0 ? (uint64_t)b : UINT64_MAX;
}

/* What s may add now, within its budget and the broker's, its backlog for f counted as gone. */
static uint64_t room(session *s, const char *f, uint16_t len)
{
	rbacklog *b = *find(s, f, len);
	uint64_t gone = b ? b->cost : 0, own = s->backlog_bytes - gone;
	uint64_t all = retained_backlog_bytes();
	all = all > gone ? all - gone : 0;
	uint64_t bs = budget(conf.backlog_bytes), bt = budget(conf.backlog_bytes_total);
	uint64_t rs = own < bs ? bs - own : 0, rt = all < bt ? bt - all : 0;
	return rs < rt ? rs : rt;
}

bool retained_admit(session *s, const char *f, uint16_t len, uint64_t *reserved)
{
	*reserved = 0;
	if (conf.backlog_bytes <= 0 && conf.backlog_bytes_total <= 0)
		return true; /* no budget: nothing to count (the walk holds the tree's lock) */
	uint64_t limit = 0;
	WEFT_WITH_LOCK(&s->lock)
		limit = room(s, f, len);
	uint64_t cost = topic_retained_cost(f, len, limit);
	if (!cost)
		return true;
	bool ok = false;
	WEFT_WITH_LOCK(&s->lock) {
		/* again: other sessions charged meanwhile. Added, then checked, so that two
		 * SUBSCRIBEs at once cannot both take the broker's last room */
		rbacklog *b = *find(s, f, len);
		uint64_t gone = b ? b->cost : 0;
		if (s->backlog_bytes - gone + cost > budget(conf.backlog_bytes))
			break;
		uint64_t t = atomic_fetch_add_explicit(&total, cost, memory_order_relaxed) + cost;
		if (t - gone > budget(conf.backlog_bytes_total)) {
			atomic_fetch_sub_explicit(&total, cost, memory_order_relaxed);
			break;
		}
		s->backlog_bytes += cost;
		ok = true;
	}
	if (ok)
		*reserved = cost;
	return ok;
}

void retained_unreserve(session *s, uint64_t reserved)
{
	WEFT_WITH_LOCK(&s->lock)
		uncharge(s, reserved);
}

void retained_start(session *s, const char *f, uint16_t len, msg **v, uint32_t n, int max_qos,
		    uint32_t subid, uint64_t reserved)
{
	retained_forget(s, f, len);
	uncharge(s, reserved);
	if (s->dead || !n) {
		for (uint32_t i = 0; i < n; i++)
			msg_unref(v[i]);
		free(v);
		return;
	}
	rbacklog *b = calloc(1, sizeof *b + len);
	if (!b)
		abort();
	b->v = v;
	b->n = n;
	for (uint32_t i = 0; i < n; i++)
		b->cost += retained_cost(v[i]);
	charge(s, b->cost);
	b->subid = subid;
	b->max_qos = (uint8_t)max_qos;
	b->len = len;
	memcpy(b->filter, f, len);
	rbacklog **pp = &s->backlog;
	while (*pp) /* at the end: backlogs drain in the order of their SUBSCRIBEs */
		pp = &(*pp)->next;
	*pp = b;
	retained_drain(s);
}

void retained_resubscribed(session *s, const char *f, uint16_t len, int max_qos, uint32_t subid)
{
	WEFT_WITH_LOCK(&s->lock) {
		rbacklog *b = *find(s, f, len);
		if (b) {
			b->max_qos = (uint8_t)max_qos;
			b->subid = subid;
		}
	}
}

/* The index of b's pending entries by topic (twice as many slots as entries, at least). */
static void index_build(rbacklog *b)
{
	uint32_t size = 8;
	while (size < 2 * (b->n - b->at))
		size *= 2;
	b->index = calloc(size, sizeof *b->index);
	if (!b->index)
		abort();
	b->mask = size - 1;
	for (uint32_t i = b->at; i < b->n; i++) {
		if (!b->v[i])
			continue;
		uint32_t k = topic_hash(b->v[i]->topic, b->v[i]->topic_len) & b->mask;
		while (b->index[k])
			k = (k + 1) & b->mask;
		b->index[k] = i + 1;
	}
}

/* m's topic's entry pending in b (a topic is in a snapshot once), or NULL. */
static msg **lookup(rbacklog *b, const msg *m, uint32_t h)
{
	if (!b->index)
		index_build(b);
	for (uint32_t k = h & b->mask; b->index[k]; k = (k + 1) & b->mask) {
		msg **e = &b->v[b->index[k] - 1];
		if (*e && (*e)->topic_len == m->topic_len &&
		    !memcmp((*e)->topic, m->topic, m->topic_len))
			return e;
	}
	return NULL;
}

int retained_overtake(session *s, const msg *m, int qos, conn *by)
{
	bool online = session_taking_output(s);
	uint32_t h = topic_hash(m->topic, m->topic_len);
	int64_t now = 0;
	int held = -1;
	for (rbacklog *b = s->backlog; b; b = b->next) {
		msg **e = lookup(b, m, h);
		if (!e)
			continue;
		int g = granted(b, *e);
		/* offline, a QoS 0 entry stays for the client's return: a live QoS 0 message is
		 * dropped then, and messages of different QoS are not ordered [MQTT-4.6.0-6] */
		if (!online && !g)
			continue;
		/* it goes on the live message's account, so within the limits of live delivery:
		 * else it stays for its turn in the drain, and a live message of its QoS, which
		 * would overtake it, is dropped at the limit it met (one of the same QoS would
		 * meet it too, but for a smaller payload under max_queued_bytes) */
		int why = session_limit(s, g, (*e)->payload_len);
		if (why >= 0) {
			if (g == qos)
				held = why;
			continue;
		}
		msg *r = *e;
		*e = NULL;
		entry_gone(s, b, r);
		if (!now)
			now = weft_now();
		send_entry(s, b, r, by, now);
	}
	return held;
}
