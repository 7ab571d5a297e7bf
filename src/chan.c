/*
 * chan.c - channels of fixed-size packets (select is in select.c, on the calls at the end).
 *
 * The design follows Go's runtime/chan.go, on weft's one parking primitive (wait.h).
 *
 * A channel is one allocation: a header (a lock, the counters, two waiter queues) and the
 * packet slots, each holding the sent length and up to packet_size bytes. A bounded channel
 * is a ring of `capacity` slots; an unbounded one is a list of segments of slots, growing at
 * the tail and keeping up to SPARE_MAX drained segments for reuse, so that a channel whose
 * backlog swings within that much stops allocating after warm-up. Capacity 0 has no slots.
 *
 * Everything is guarded by the channel's lock, held for a few dozen instructions and never
 * across a park, so no operation ever waits for another to be scheduled. It spins, and sleeps
 * on a futex only when it stays taken (see chan_lock below).
 *
 * Waiters. A task (or plain thread) that must wait puts a `struct waiter` node, living on its
 * own stack, at the tail of the channel's sendq or recvq. The node points to the caller's wait
 * record (wait_begin) and to its packet (sender) or buffer (receiver). Invariants:
 *   - a live sender waits only when no slot is free (the buffer is full, or capacity is 0);
 *   - a live receiver waits only when no packet is buffered;
 * so at most one of the two queues holds live waiters, and a waker always takes the head.
 *
 * Direct hand-off. Whoever finds a live waiter on the other side finishes the transfer for it,
 * so the waiter has nothing left to do when it runs:
 *   - send, receiver waiting: copy the packet straight into the receiver's buffer;
 *   - receive from a full buffer, sender waiting: take the head packet, move the waiting
 *     sender's packet into the slot just freed (FIFO is kept: it is the next one in order);
 *   - receive at capacity 0, sender waiting: copy straight out of the sender's packet.
 * Then it wakes the waiter with wait_finish after dropping the lock; the waiter goes onto the
 * waker's worker's `next` slot and runs right after it, with the packet still in cache.
 *
 * Claiming. A waiter's deadline or a weft_cancel races with wakers for the waiter's wait record
 * (wait_claim: one winner). Under the lock, a waker unlinks the head node and claims it: if the
 * claim fails the waiter is already leaving (timed out, cancelled, or a select woken through
 * another channel), so the waker drops the node and tries the next. If it succeeds, nobody
 * else can end that wait, so the node and its buffer stay valid until wait_finish: the waker
 * copies the data, then finishes. A waiter whose wait ended otherwise (-ETIMEDOUT,
 * -ECANCELED) takes the lock and unlinks its node if it is still queued; since transfers
 * happen only after a successful claim, no packet is lost or duplicated.
 *
 * Node lifetime. `queued` is cleared (release) by whoever unlinks a node, as their last touch
 * of it, except by a successful claimer, who keeps it until wait_finish. A woken waiter that
 * reads queued == false (acquire) knows nobody will touch its node again and need not take the
 * channel lock at all: the common path of a woken waiter never touches the channel, so a
 * channel may be freed as soon as its last waiter has been woken.
 *
 * Select (select.c) queues one node per case, all pointing to one wait record: the first
 * waker to claim the record wins; the others fail to claim and drop their nodes.
 *
 * Close wakes every waiter with -EPIPE. Claimed nodes are chained through their own `next`
 * pointer (the claim makes them ours until wait_finish), so the wake-ups happen after the lock
 * is dropped without any allocation.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdalign.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "asym.h"
#include "chan.h"
#include "futex.h"
#include "sched.h"
#include "spin.h"
#include "wait.h"
#include "waitq.h"
#include "weft.h"

/* Internal deadline of offer/poll: never wait, say -EAGAIN. */
#define NOWAIT INT64_MIN

/* A segment of an unbounded channel. */
struct seg {
	struct seg *next;
	alignas(16) char slots[];
};

/* The first cache line holds everything an operation writes; the second what it only reads
 * (and, when unbounded, the segment pointers, which change once per segment, and `bias`, at
 * each grant and revocation). Across cores each operation then moves one header line, plus the
 * slot it touches. */
struct weft_chan {
	_Atomic uint32_t lock;   /* see chan_lock */
	bool closed;
	uint8_t by_bias;         /* 1 + the id of the worker holding it through its bias, or 0 */
	uint8_t streak;          /* how far `cand` leads the other lockers (see bias_after_lock) */
	size_t count;            /* packets buffered */
	size_t head, tail;       /* next slot to read, to write (within the segment if unbounded) */
	struct weft_waitq sendq, recvq; /* waitq.h */
	alignas(64) char *slots; /* bounded: the ring */
	size_t cap;              /* slots: capacity, or slots per segment when unbounded */
	size_t psize;            /* packet_size */
	size_t stride;           /* bytes per slot: the length word, then the packet */
	bool unbounded;
	_Atomic int bias;        /* 1 + the id of the worker whose tasks lock without atomics, or 0 */
	struct seg *hseg, *tseg; /* unbounded: the segments read and written */
	struct seg *spare;       /* unbounded: drained segments kept for reuse */
	size_t nspare;
	int cand;                /* the next owner (as `bias`), once it leads by BIAS_STREAK */
	int64_t granted_at, regrant_at, backoff; /* coarse times of the bias (see bias_revoke) */
	char name[CHAN_NAME_MAX]; /* for dumps (weft_chan_set_name, chan_name.c) */
	_Atomic int64_t hot_at;  /* coarse time its lock was last found taken: see wake() */
};

_Static_assert(offsetof(struct weft_chan, slots) == 64, "the hot fields fill one line");
_Static_assert(offsetof(struct weft_chan, tseg) < 128, "what every operation reads: one line");

#define HDR sizeof(size_t)

/* ---- the channel lock (chan_lock) ---------------------------------------------------------
 * A spinlock that sleeps on a futex once it has stayed taken for about a microsecond:
 * Drepper's mutex, like Go's runtime lock. 0 free, LOCK_HELD held, LOCK_SLEEPERS held and
 * somebody may sleep; LOCK_BY_THREAD beside LOCK_HELD says a plain thread holds it, which tells
 * a contending task it is not fighting another task (see lock_slow).
 * Critical sections are a few dozen instructions and never park, so the spin nearly always
 * wins. But when two workers hammer one channel, the line crossing cores on each operation
 * costs more than the operation; letting the loser sleep gives the winner long runs with the
 * line in its own cache, and costs nothing on one worker.
 *
 * Why not spin.h's lock, the one every other short section in weft takes: that one never
 * sleeps, since its holders hold it rarely and for a few instructions, while a channel's lock
 * is taken at every send and receive by tasks on every worker and by plain threads, and is
 * contended for as long as a program's traffic lasts. Its word also says more than held/free
 * (sleepers, held by a plain thread), and the bias below takes it without an atomic at all. */

#define LOCK_SPINS 30
enum { LOCK_HELD = 1, LOCK_SLEEPERS = 2, LOCK_STATE = 3, LOCK_BY_THREAD = 4 };
/* What weft_chan_free leaves in the lock word. After free() the allocator may write its own
 * pointers there instead; either way the word is no lock value, and lock_slow says so rather
 * than waiting on it for ever. */
#define LOCK_FREED 0xdeadf4eeu

#define HOT_NS 2000000 /* a channel contended this recently is hot */

static inline int64_t coarse_now(void)
{
	return atomic_load_explicit(&sched_coarse_now, memory_order_relaxed);
}

static bool hot(weft_chan *c)
{
	return coarse_now() - atomic_load_explicit(&c->hot_at, memory_order_relaxed) <= HOT_NS;
}

/* The caller found c's lock word `held`: is it a task, and does another task hold c (not a
 * plain thread, and not unknown because a sleeper has marked it)? Then tasks on two cores are
 * fighting over c. */
static inline bool tasks_fight(uint32_t held)
{
	return held == LOCK_HELD && sched_on_a_worker();
}

/* Tasks on several cores are using c: it becomes hot, its home the worker the scheduler
 * gathers contended channels on (sched_gather_worker), or `home` after a quiet spell. */
static void note_contention(weft_chan *c, int home)
{
	sched_note_contention(home);
	int64_t now = coarse_now();
	if (atomic_load_explicit(&c->hot_at, memory_order_relaxed) != now)
		atomic_store_explicit(&c->hot_at, now, memory_order_relaxed);
}

static inline uint32_t held_by_me(void)
{
	return sched_on_a_worker() ? LOCK_HELD : LOCK_HELD | LOCK_BY_THREAD;
}

static void lock_wait(_Atomic uint32_t *l)
{
	uint32_t me = held_by_me();
	for (int i = 0; i < LOCK_SPINS; i++) {
		cpu_relax();
		uint32_t zero = 0;
		if (atomic_load_explicit(l, memory_order_relaxed) == 0 &&
		    atomic_compare_exchange_strong_explicit(l, &zero, me, memory_order_acquire,
							    memory_order_relaxed))
			return;
	}
	while (atomic_exchange_explicit(l, LOCK_SLEEPERS, memory_order_acquire) != 0)
		futex_wait(l, LOCK_SLEEPERS, INT64_MAX);
}

/* The lock was found as `held`. A task that finds another task holding it may first move to
 * c's home worker, when the caller allows (may_move: a send or receive that may wait, by a
 * task holding no other lock). Waking c's waiters onto its home (wake()) gathers only the
 * tasks that park; tasks that seldom do (100 producers and 100 consumers on a channel of 1024)
 * would otherwise keep running on both cores, fighting for the lock at every packet. A plain
 * thread holding c is no reason to move: tasks that feed one (a log writer, weft-mqtt's store)
 * are better spread. offer and poll never move: a task moves only at calls that may block
 * (weft.h). */
static __attribute__((noinline)) void lock_slow(weft_chan *c, uint32_t held, bool may_move)
{
	if (held != LOCK_HELD && held != LOCK_SLEEPERS && held != (LOCK_HELD | LOCK_BY_THREAD)) {
		fprintf(stderr, "weft: channel %p used after weft_chan_free (or overwritten): its "
				"lock word is %#x\n", (void *)c, held);
		abort();
	}
	if (tasks_fight(held)) {
		note_contention(c, weft_worker_id());
		if (may_move)
			sched_move(sched_gather_worker());
	}
	lock_wait(&c->lock);
}

/* 0 when taken, else the lock word that stopped us. */
static inline uint32_t try_lock(_Atomic uint32_t *l)
{
	uint32_t seen = 0;
	atomic_compare_exchange_strong_explicit(l, &seen, held_by_me(), memory_order_acquire,
						memory_order_relaxed);
	return seen;
}

/* ---- the bias ----------------------------------------------------------------------------
 * The lock word costs two atomic read-modify-writes per operation (the CAS that takes it, the
 * exchange that drops it), most of an operation's time when the channel's tasks run on one
 * worker, as contended channels do once gathered. So a channel locked over and over from one
 * worker is biased to it, as JVMs bias a monitor to a thread: that worker's tasks then take
 * and drop the lock with plain stores, and everyone else pays for it, with an asymmetric fence
 * (asym.h).
 *
 * Dekker's game again. The owner says which channel it is entering in its own slot of
 * bias_in, then looks at the lock word (bias_enter); any other locker takes the lock word as
 * usual, then runs asym_heavy and waits until the owner's slot no longer names the channel
 * (bias_revoke). One of the two sees the other. The slot is the worker's, not the channel's:
 * a worker that read `bias` just before a revocation may write its slot long after it (its
 * thread preempted in between), and a flag in the channel would then be cleared under the
 * feet of the next owner. And the owner checks `bias` again after looking at the lock word:
 * one that read it before a revocation would otherwise walk in beside a later locker, which no
 * longer looks at its slot. A worker holds one channel at most through its bias: select takes
 * the lock words.
 *
 * A locker from elsewhere revokes the bias at once: a fence costs a microsecond or two, so
 * paying it at every operation from another worker or thread would cost far more than the
 * bias saves. The bias comes back once one worker leads the others by BIAS_STREAK lockings (a
 * majority vote in `cand` and `streak`, which writes only the line the lock already writes),
 * and no sooner than `backoff` after the revocation; the backoff doubles each time a bias
 * lasts less than BIAS_SHORT_NS, so a channel whose lockers keep alternating pays for a fence
 * at most once per BIAS_BACKOFF_MAX_NS. */

#define BIAS_STREAK 64
#define BIAS_SHORT_NS 10000000      /* 10 ms */
#define BIAS_BACKOFF_MIN_NS 1000000 /* 1 ms */
#define BIAS_BACKOFF_MAX_NS 1000000000
#define BIAS_WORKERS 255            /* workers from this id on are never granted a bias */

/* The channel each worker is entering or holds through its bias, a line each. Not in struct
 * worker: a revoker may look at the slot of a worker long gone (a bias from an earlier
 * weft_run). */
static struct {
	alignas(64) _Atomic(weft_chan *) c;
} bias_in[BIAS_WORKERS];

/* Set before main from WEFT_CHAN_BIAS: "0" turns the bias off; "eager" (tests/chan.c) grants
 * it after two lockings, with no backoff, so that revocations race with owners all the time. */
static enum chan_bias_mode bias_mode;
static int bias_streak = BIAS_STREAK;
static int64_t bias_backoff_min = BIAS_BACKOFF_MIN_NS;
static _Atomic long bias_revocations;

__attribute__((constructor)) static void bias_init(void)
{
	const char *e = getenv("WEFT_CHAN_BIAS");
	if (!asym_on() || (e && strcmp(e, "0") == 0)) {
		bias_mode = CHAN_BIAS_OFF;
	} else if (e && strcmp(e, "eager") == 0) {
		bias_mode = CHAN_BIAS_EAGER;
		bias_streak = 1;
		bias_backoff_min = 0;
	} else {
		bias_mode = CHAN_BIAS_ON;
	}
}

enum chan_bias_mode chan_bias_mode(void)
{
	return bias_mode;
}

long chan_bias_revocations(void)
{
	return atomic_load_explicit(&bias_revocations, memory_order_relaxed);
}

int chan_bias_owner(weft_chan *c)
{
	return atomic_load_explicit(&c->bias, memory_order_relaxed);
}

/* The caller as a possible owner: 1 + its worker's id, or 0 (a plain thread, or a worker
 * beyond BIAS_WORKERS). */
static inline int bias_self(void)
{
	struct worker *w = worker_self();
	return w && w->id < BIAS_WORKERS ? w->id + 1 : 0;
}

/* The owner's way in (the caller is `owner`): true when it holds the lock. */
static inline bool bias_enter(weft_chan *c, int owner)
{
	_Atomic(weft_chan *) *slot = &bias_in[owner - 1].c;
	atomic_store_explicit(slot, c, memory_order_relaxed);
	asym_light();
	if (atomic_load_explicit(&c->lock, memory_order_acquire) == 0 &&
	    atomic_load_explicit(&c->bias, memory_order_relaxed) == owner) {
		c->by_bias = (uint8_t)owner;
		return true;
	}
	atomic_store_explicit(slot, NULL, memory_order_release);
	return false;
}

/* A task on another worker wants c: tasks on two cores are using it, so it is contended, its
 * home the owner's worker unless tasks already gather elsewhere. A task that may move goes to
 * the gathering worker first, and takes the bias's way in if that is the owner's: moving costs
 * less than the fence of a revocation. Returns true when it holds the lock. */
static __attribute__((noinline)) bool bias_fight(weft_chan *c, int owner, bool may_move)
{
	if (!sched_on_a_worker())
		return false;
	note_contention(c, owner - 1);
	if (!may_move)
		return false;
	sched_move(sched_gather_worker());
	owner = atomic_load_explicit(&c->bias, memory_order_relaxed); /* as it is now */
	return owner && owner == bias_self() && bias_enter(c, owner);
}

/* Holding the lock word of a channel biased to another worker: wait until the owner is out,
 * and take the bias away. */
static __attribute__((noinline)) void bias_revoke(weft_chan *c, int owner)
{
	asym_heavy_retry();
	for (int i = 0; atomic_load_explicit(&bias_in[owner - 1].c, memory_order_acquire) == c; i++)
		if (i < LOCK_SPINS)
			cpu_relax();
		else
			sched_yield(); /* the owner's thread was preempted inside */
	int64_t now = coarse_now();
	bool short_lived = now - c->granted_at < BIAS_SHORT_NS;
	c->backoff = short_lived && c->backoff ? c->backoff * 2 : bias_backoff_min;
	if (c->backoff > BIAS_BACKOFF_MAX_NS)
		c->backoff = BIAS_BACKOFF_MAX_NS;
	c->regrant_at = now + c->backoff;
	c->streak = 0;
	atomic_store_explicit(&c->bias, 0, memory_order_relaxed);
	atomic_fetch_add_explicit(&bias_revocations, 1, memory_order_relaxed);
}

/* Holding the lock word: revoke another worker's bias, or count a vote for our own. */
static inline void bias_after_lock(weft_chan *c)
{
	int me = bias_self(), owner = atomic_load_explicit(&c->bias, memory_order_relaxed);
	if (owner) {
		if (owner != me)
			bias_revoke(c, owner);
		return;
	}
	if (!me || c->cand != me) { /* a vote against: plain threads are never granted a bias */
		if (c->streak)
			c->streak--;
		else if (me)
			c->cand = me;
		return;
	}
	if (c->streak < bias_streak) {
		c->streak++;
		return;
	}
	int64_t now = coarse_now();
	if (bias_mode != CHAN_BIAS_OFF && now >= c->regrant_at) {
		c->granted_at = now;
		atomic_store_explicit(&c->bias, me, memory_order_relaxed);
	}
}

/* Take the lock word, whoever has the bias. */
static inline void lock_word(weft_chan *c, bool may_move)
{
	uint32_t held = try_lock(&c->lock);
	if (held)
		lock_slow(c, held, may_move);
	bias_after_lock(c);
}

/* may_move: see lock_slow. */
static inline __attribute__((always_inline)) void chan_lock(weft_chan *c, bool may_move)
{
	int owner = atomic_load_explicit(&c->bias, memory_order_relaxed);
	if (owner) {
		if (owner == bias_self() ? bias_enter(c, owner) : bias_fight(c, owner, may_move))
			return;
	}
	lock_word(c, may_move);
}

static inline void chan_unlock(weft_chan *c)
{
	int owner = c->by_bias;
	if (owner) {
		c->by_bias = 0;
		atomic_store_explicit(&bias_in[owner - 1].c, NULL, memory_order_release);
		return;
	}
	if ((atomic_exchange_explicit(&c->lock, 0, memory_order_release) & LOCK_STATE) ==
	    LOCK_SLEEPERS)
		futex_wake(&c->lock, 1);
}

/* ---- waiter queues ---------------------------------------------------------------------- */

static void enqueue(struct waitq q, struct waiter *n)
{
	waitq_push_back(q, &n->link);
	atomic_store_explicit(&n->queued, true, memory_order_relaxed);
}

static inline struct waiter *first_waiter(struct waitq q)
{
	return (struct waiter *)waitq_first(q);
}

static inline void let_go(struct waiter *n)
{
	atomic_store_explicit(&n->queued, false, memory_order_release);
}

/* The first waiter of q that we could claim, unlinked, or NULL. Nodes whose wait has ended
 * otherwise are dropped on the way. */
static inline struct waiter *claim_first(struct waitq q)
{
	struct waiter *n;
	while ((n = (struct waiter *)waitq_pop_front_unmarked(q))) {
		if (wait_claim(n->w)) {
			atomic_store_explicit(&n->queued, false, memory_order_relaxed);
			return n; /* ours until wait_finish */
		}
		let_go(n);
	}
	return NULL;
}

static bool is_parked(struct wait *w)
{
	uint32_t s = atomic_load_explicit(&w->state, memory_order_relaxed);
	return s == WAIT_PARKED || s == WAIT_PARKED_NC;
}

/* Whether q has a waiter that might be claimed; drops dead nodes at its head. */
static bool has_live(struct waitq q)
{
	struct waiter *n;
	while ((n = first_waiter(q)) && !is_parked(n->w)) {
		waitq_pop_front_unmarked(q);
		let_go(n);
	}
	return n != NULL;
}

/* After a wait that no waker finished (timeout, cancel, or a select's other nodes): make sure
 * n is off its queue before its frame goes away. */
static void leave(struct waiter *n, struct waitq q)
{
	if (!atomic_load_explicit(&n->queued, memory_order_acquire))
		return;
	chan_lock(n->c, false);
	if (atomic_load_explicit(&n->queued, memory_order_relaxed)) {
		waitq_remove(q, &n->link);
		atomic_store_explicit(&n->queued, false, memory_order_relaxed);
	}
	chan_unlock(n->c);
}

static inline struct waitq queue_of(struct waiter *n)
{
	return WAITQ_OF(n->send ? &n->c->sendq : &n->c->recvq);
}

/* ---- packet storage --------------------------------------------------------------------- */

/* memcpy for packets: those of a word or two (the common case) without a call. */
static inline void copy(void *dst, const void *src, size_t n)
{
	if (n <= 16 && n >= 8) { /* two overlapping words */
		uint64_t a, b;
		memcpy(&a, src, 8);
		memcpy(&b, (const char *)src + n - 8, 8);
		memcpy(dst, &a, 8);
		memcpy((char *)dst + n - 8, &b, 8);
	} else if (n < 8 && n >= 4) { /* two overlapping half-words */
		uint32_t a, b;
		memcpy(&a, src, 4);
		memcpy(&b, (const char *)src + n - 4, 4);
		memcpy(dst, &a, 4);
		memcpy((char *)dst + n - 4, &b, 4);
	} else if (n) { /* memcpy's pointers must not be NULL, even for 0 bytes */
		memcpy(dst, src, n);
	}
}

/* Copy a packet of len bytes into a buffer of cap bytes: crop, or pad with zeros. */
static inline void copy_out(void *dst, size_t cap, const void *src, size_t len)
{
	size_t n = len < cap ? len : cap;
	copy(dst, src, n);
	if (n < cap)
		memset((char *)dst + n, 0, cap - n);
}

static inline void slot_store(char *slot, const void *p, size_t len)
{
	memcpy(slot, &len, HDR);
	copy(slot + HDR, p, len);
}

static inline size_t slot_load(const char *slot, void *buf, size_t cap)
{
	size_t len;
	memcpy(&len, slot, HDR);
	copy_out(buf, cap, slot + HDR, len);
	return len;
}

static size_t seg_bytes(const weft_chan *c)
{
	return sizeof(struct seg) + c->cap * c->stride;
}

/* Append a packet; there is room (bounded), or room can be made (unbounded: -ENOMEM). */
static inline int buf_put(weft_chan *c, const void *p, size_t len)
{
	char *base = c->slots;
	if (c->unbounded) {
		if (c->tail == c->cap) {
			struct seg *s = c->spare;
			if (s) {
				c->spare = s->next;
				c->nspare--;
			} else if (!(s = malloc(seg_bytes(c))))
				return -ENOMEM;
			s->next = NULL;
			c->tseg->next = s;
			c->tseg = s;
			c->tail = 0;
		}
		base = c->tseg->slots;
	}
	slot_store(base + c->tail * c->stride, p, len);
	if (++c->tail == c->cap && !c->unbounded)
		c->tail = 0;
	c->count++;
	return 0;
}

/* Drop the drained head segment of an unbounded channel: keep it for reuse, up to SPARE_MAX
 * (64 KiB of 16-byte slots), so that a backlog swinging within that allocates nothing. */
#define SPARE_MAX 16

static void seg_advance(weft_chan *c)
{
	struct seg *old = c->hseg;
	c->hseg = old->next;
	c->head = 0;
	if (c->nspare < SPARE_MAX) {
		old->next = c->spare;
		c->spare = old;
		c->nspare++;
	} else {
		free(old); /* under the lock, but only once a backlog of thousands drains */
	}
}

/* Take the oldest packet (there is one) into buf; returns its sent length. */
static inline size_t buf_get(weft_chan *c, void *buf, size_t cap)
{
	char *base = c->slots;
	if (c->unbounded) {
		if (c->head == c->cap)
			seg_advance(c);
		base = c->hseg->slots;
	}
	size_t len = slot_load(base + c->head * c->stride, buf, cap);
	c->count--;
	if (++c->head == c->cap && !c->unbounded)
		c->head = 0;
	if (c->unbounded && c->count == 0 && c->hseg == c->tseg)
		c->head = c->tail = 0; /* empty: start the segment over rather than grow */
	return len;
}

/* ---- the operations, under the lock ---------------------------------------------------- */

/* send_now and recv_now are the whole of an operation that does not wait: inlined into
 * chan_send and chan_recv whatever the compiler's size estimate says, so that none of them
 * costs a call. */

/* Send without waiting if possible. Returns 0, -EPIPE, -ENOMEM, or -EAGAIN (must wait).
 * *wake: a claimed waiter to finish once the lock is dropped. */
static inline __attribute__((always_inline)) int send_now(weft_chan *c, const void *p, size_t len,
							  struct waiter **wake)
{
	if (c->closed)
		return -EPIPE;
	struct waiter *r = claim_first(WAITQ_OF(&c->recvq));
	if (r) { /* a receiver waits: the buffer is empty, hand the packet over */
		copy_out(r->dst, r->len, p, len);
		r->got = len;
		*wake = r;
		return 0;
	}
	if (c->count < c->cap || c->unbounded)
		return buf_put(c, p, len);
	return -EAGAIN;
}

/* Receive without waiting if possible. Returns the sent length, -EPIPE or -EAGAIN. */
static inline __attribute__((always_inline)) int recv_now(weft_chan *c, void *buf, size_t cap,
							  struct waiter **wake)
{
	if (c->count) {
		size_t len = buf_get(c, buf, cap);
		struct waiter *s = claim_first(WAITQ_OF(&c->sendq));
		if (s) { /* the buffer was full: the first waiting sender's packet takes the slot */
			buf_put(c, s->src, s->len);
			*wake = s;
		}
		return (int)len;
	}
	struct waiter *s = claim_first(WAITQ_OF(&c->sendq));
	if (s) { /* capacity 0: take the packet straight from the sender */
		copy_out(buf, cap, s->src, s->len);
		*wake = s;
		return (int)s->len;
	}
	return c->closed ? -EPIPE : -EAGAIN;
}

/* Wake a waiter claimed under the lock (after dropping it). Reads the node before finishing:
 * afterwards it may be gone.
 *
 * Normally the waiter runs next on the waker's worker. But tasks spread over several workers
 * that all use one channel spend their time moving its lock and buffers between caches, and
 * can be many times slower on two workers than on one. So while c is
 * hot, its waiters are woken onto its home worker, and its traffic collects on one core. */
static inline void wake(weft_chan *c, struct waiter *n, int result)
{
	struct wait *w = n->w;
	*n->won = n;
	if (__builtin_expect(hot(c), 0))
		wait_finish_on(w, result, sched_gather_worker());
	else
		wait_finish(w, result);
}

/* Can we wait at all? Called under the lock; 0 when we may park. */
static int may_wait(int64_t deadline)
{
	if (deadline == NOWAIT)
		return -EAGAIN;
	if (deadline != WEFT_FOREVER && deadline <= weft_now())
		return -ETIMEDOUT;
	return 0;
}

/* ---- public operations ------------------------------------------------------------------ */

/* The waiting half of a send or receive, called with the lock held: queue a waiter, drop the
 * lock, park, and clean up after a wait nobody finished. Out of line: the waiter record and the
 * registers it needs would otherwise make every send and receive pay for a large frame. */
static __attribute__((noinline)) int wait_for(weft_chan *c, bool send, const void *src,
					      void *dst, size_t len, int64_t deadline)
{
	int r = may_wait(deadline);
	if (r) {
		chan_unlock(c);
		return r;
	}
	/* chan_park's steps for one node, written out: its loops and its look at *won after the
	 * park cost a parked send or receive about a dozen instructions more. */
	struct waitq q = WAITQ_OF(send ? &c->sendq : &c->recvq);
	struct waiter *won = NULL;
	struct waiter me = { .len = len, .won = &won, .c = c, .send = send };
	if (send)
		me.src = src;
	else
		me.dst = dst;
	me.w = wait_begin(send ? "chan send" : "chan recv", c);
	enqueue(q, &me);
	chan_unlock(c);
	r = wait_park(me.w, deadline);
	if (r != 0 && r != -EPIPE) /* no waker completed it (they finish with 0 or -EPIPE) */
		leave(&me, q);
	return r != 0 || send ? r : (int)me.got;
}

static int chan_send(weft_chan *c, const void *p, size_t len, int64_t deadline)
{
	if (!c || (!p && len))
		return -EINVAL;
	if (len > c->psize)
		return -EMSGSIZE;
	struct waiter *wk = NULL;
	chan_lock(c, deadline != NOWAIT);
	int r = send_now(c, p, len, &wk);
	if (r == -EAGAIN)
		return wait_for(c, true, p, NULL, len, deadline);
	chan_unlock(c);
	if (wk)
		wake(c, wk, 0);
	if (deadline != NOWAIT) /* a call that may wait, which did not: see sched_slice */
		sched_slice();
	return r;
}

static int chan_recv(weft_chan *c, void *buf, size_t cap, int64_t deadline)
{
	if (!c || (!buf && cap))
		return -EINVAL;
	struct waiter *wk = NULL;
	chan_lock(c, deadline != NOWAIT);
	int r = recv_now(c, buf, cap, &wk);
	if (r == -EAGAIN)
		return wait_for(c, false, NULL, buf, cap, deadline);
	chan_unlock(c);
	if (wk)
		wake(c, wk, 0);
	if (deadline != NOWAIT) /* a call that may wait, which did not: see sched_slice */
		sched_slice();
	return r;
}

int weft_chan_send(weft_chan *c, const void *p, size_t len, int64_t deadline)
{
	return chan_send(c, p, len, deadline == NOWAIT ? NOWAIT + 1 : deadline);
}

int weft_chan_recv(weft_chan *c, void *buf, size_t cap, int64_t deadline)
{
	return chan_recv(c, buf, cap, deadline == NOWAIT ? NOWAIT + 1 : deadline);
}

int weft_chan_put(weft_chan *c, const void *p, size_t len)
{
	return chan_send(c, p, len, WEFT_FOREVER);
}

int weft_chan_take(weft_chan *c, void *buf, size_t cap)
{
	return chan_recv(c, buf, cap, WEFT_FOREVER);
}

int weft_chan_offer(weft_chan *c, const void *p, size_t len)
{
	return chan_send(c, p, len, NOWAIT);
}

int weft_chan_poll(weft_chan *c, void *buf, size_t cap)
{
	return chan_recv(c, buf, cap, NOWAIT);
}

/* ---- life of a channel ------------------------------------------------------------------ */

weft_chan *weft_chan_new(size_t capacity, size_t packet_size)
{
	if (packet_size == 0 || packet_size > INT_MAX) {
		errno = EINVAL;
		return NULL;
	}
	size_t stride = (HDR + packet_size + 15) & ~(size_t)15;
	bool unbounded = capacity == WEFT_UNBOUNDED;
	size_t slots = capacity;
	if (unbounded) /* segments of about 4 KiB, at least 16 packets */
		slots = stride * 16 > 4096 ? 16 : 4096 / stride;
	size_t header = (sizeof(weft_chan) + 63) & ~(size_t)63; /* the ring starts on a line */
	size_t ring = unbounded ? 0 : slots * stride;
	if (!unbounded && slots && ring / slots != stride) {
		errno = EINVAL;
		return NULL;
	}
	if (ring > SIZE_MAX - header - 64) {
		errno = ENOMEM;
		return NULL;
	}
	weft_chan *c = aligned_alloc(64, (header + ring + 63) & ~(size_t)63);
	if (!c) {
		errno = ENOMEM;
		return NULL;
	}
	memset(c, 0, sizeof *c);
	c->cap = slots;
	c->psize = packet_size;
	c->stride = stride;
	c->unbounded = unbounded;
	c->slots = (char *)c + header;
	if (unbounded) {
		c->slots = NULL;
		if (!(c->hseg = c->tseg = malloc(seg_bytes(c)))) {
			free(c);
			errno = ENOMEM;
			return NULL;
		}
		c->hseg->next = NULL;
	}
	return c;
}

void weft_chan_close(weft_chan *c)
{
	if (!c)
		return;
	struct waiter *woken = NULL, *n;
	chan_lock(c, false);
	if (!c->closed) {
		c->closed = true;
		while ((n = claim_first(WAITQ_OF(&c->recvq))) ||
		       (n = claim_first(WAITQ_OF(&c->sendq)))) {
			n->next = woken;
			woken = n;
		}
	}
	chan_unlock(c);
	while ((n = woken)) {
		woken = n->next;
		wake(c, n, -EPIPE);
	}
}

static size_t queue_len(struct weft_waitq *q)
{
	size_t n = 0;
	for (const struct waitq_link *l = waitq_first(WAITQ_OF(q)); l; l = l->next)
		n++;
	return n;
}

void weft_chan_free(weft_chan *c)
{
	if (!c)
		return;
	chan_lock(c, false);
	size_t n = queue_len(&c->sendq) + queue_len(&c->recvq);
	chan_unlock(c);
	if (n) {
		fprintf(stderr, "weft: weft_chan_free on a channel with %zu waiter%s\n", n,
			n == 1 ? "" : "s");
		abort();
	}
	if (c->name[0])
		chan_name_forget(c);
	if (c->unbounded) {
		for (struct seg *s = c->hseg, *next; s; s = next) {
			next = s->next;
			free(s);
		}
		for (struct seg *s = c->spare, *next; s; s = next) {
			next = s->next;
			free(s);
		}
	}
	/* poisoned, so that a use after this finds no lock to take and no owner to take it
	 * without one (lock_slow reports it); best effort: the memory may be reused */
	atomic_store_explicit(&c->bias, 0, memory_order_relaxed);
	atomic_store_explicit(&c->lock, LOCK_FREED, memory_order_relaxed);
	free(c);
}

size_t weft_chan_len(weft_chan *c)
{
	if (!c)
		return 0;
	chan_lock(c, false);
	size_t n = c->count;
	chan_unlock(c);
	return n;
}

size_t weft_chan_waiting(weft_chan *c)
{
	if (!c)
		return 0;
	chan_lock(c, false);
	size_t n = queue_len(&c->sendq) + queue_len(&c->recvq);
	chan_unlock(c);
	return n;
}

/* c's name (chan_name.c): its storage, sizeof c->name bytes. */
char *chan_name_buf(const weft_chan *c)
{
	return (char *)c->name;
}

/* ---- for select (select.c) -------------------------------------------------------------- */

/* By the lock word: a worker holds one channel at most through its bias. */
void chan_select_lock(weft_chan *c)
{
	lock_word(c, false);
}

void chan_select_unlock(weft_chan *c)
{
	chan_unlock(c);
}

size_t chan_packet_size(const weft_chan *c)
{
	return c->psize;
}

bool chan_ready(weft_chan *c, bool send)
{
	if (c->closed)
		return true;
	if (send)
		return c->count < c->cap || c->unbounded || has_live(WAITQ_OF(&c->recvq));
	return c->count || has_live(WAITQ_OF(&c->sendq));
}

int chan_try(weft_chan *c, bool send, void *p, size_t len, struct waiter **wk)
{
	return send ? send_now(c, p, len, wk) : recv_now(c, p, len, wk);
}

void chan_wake(weft_chan *c, struct waiter *n, int result)
{
	wake(c, n, result);
}

int chan_may_wait(int64_t deadline)
{
	return may_wait(deadline);
}

/* The waiting half of a select (select.c); wait_for takes the same steps for its one
 * node, written out (see there). Called with the channels locked[0..nlocked) locked, nothing
 * ready, and the caller allowed to wait (may_wait): queue every node that has a channel
 * (node->c, on its sendq or recvq as node->send says; all on the one wait record w), drop the
 * locks (the last taken first), park with `park` (wait_park, or a select's own, which counts
 * it among the waiters on fds), then take off its queue every node that no waker completed.
 * Returns park's result; a waker that completed a node has stored it in *node->won. */
int chan_park(struct waiter *nodes, int n, weft_chan *const *locked, int nlocked,
	      struct wait *w, int64_t deadline, int (*park)(struct wait *, int64_t))
{
	for (int i = 0; i < n; i++)
		if (nodes[i].c)
			enqueue(queue_of(&nodes[i]), &nodes[i]);
	for (int i = nlocked - 1; i >= 0; i--)
		chan_unlock(locked[i]);
	int r = park(w, deadline);
	for (int i = 0; i < n; i++)
		if (nodes[i].c && &nodes[i] != *nodes[i].won)
			leave(&nodes[i], queue_of(&nodes[i]));
	return r;
}
