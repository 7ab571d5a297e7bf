/*
 * mutex.c - weft_mutex, a task-aware lock built for contention.
 *
 * The seed's experiment (N tasks each taking one global lock 10^6 times around an increment)
 * is won or lost on two things: what a contended lock costs, and where the contenders run.
 *
 * The lock word. One 32-bit word holds the lock bit and the flags that say whether an unlock
 * has anything to do:
 *
 *   LOCKED    held.
 *   WAITERS   the queue of parked waiters is not empty.
 *   WOKEN     the head of the queue has been woken to retry, and retries on its own.
 *   STARVING  the head has waited a full turn (TURN_NS): the next unlock hands the lock to it.
 *   QLOCK     the queue (m->_head.._tail and the waiters' nodes) is being changed.
 *
 * lock is `lock bts` (fetch_or of LOCKED) and unlock is `lock xadd` (fetch_sub of LOCKED): one
 * atomic instruction each, whatever the flags, no system call. Only when the word shows waiters
 * does unlock do more, and then only if nobody has been woken yet.
 *
 * Waiting. A contender that finds the lock held spins a little (reading, not writing) if the
 * holder is on another core and nobody is queued; when it sees the lock free it tries once,
 * and parks if it loses (the holder took it back at once: it is not letting go). It parks
 * (wait.h) in a FIFO of nodes that live on the waiters' own stacks. The queue is guarded by
 * the QLOCK bit of the same word, so that "the lock is still held" and "there is a waiter"
 * become true in one compare-and-swap: an unlock either sees the waiter or the waiter sees the
 * lock free, never neither. Having published WAITERS while the lock was held, a new waiter
 * parks even if the lock comes free a moment later: whoever released it has seen WAITERS and
 * wakes the head. It does not grab it: a contender that gives up should stay given up.
 *
 * Waking, and where the woken run. An unlock that finds waiters and no WOKEN head wakes the
 * head with wait_finish, which puts it in the unlocking task's worker's `next` slot: it will
 * run on the unlocker's core, right after it. It does not get the lock; the unlocker keeps
 * running and usually takes the lock again at once (barging), since handing a lock to a
 * parked task costs a switch per acquisition and serialises everyone behind the slowest
 * (a lock convoy). So while one task holds the lock and runs, its contenders collect, parked
 * or runnable, on its worker, the lock's cache line stays in one core's cache, and the
 * other cores go idle or do other work. This is how contention can cost little more than the
 * uncontended lock: in the steady state nobody else touches the lock word at all.
 *
 * The woken head. While WOKEN is set no unlock wakes anybody: at most one waiter at a time is
 * out of the queue's sleep, and the holder's unlocks stay at one instruction. The woken head
 * runs when the holder's core lets it, or at once on an idle core that steals it from the
 * `next` slot (sched.c's idle workers do). There it must not fight the holder: a holder that
 * takes the lock again and again leaves it free for a few ns between two increments, and a
 * head on another core that grabbed it then would start both cores bouncing the line at
 * ~100 ns a transfer. So the head takes a free lock only if nobody has unlocked since it
 * last looked (_ticks, counted by unlocks while waiters are queued, has not moved: the holder
 * has gone quiet) or if the last taker is on its own worker (not running now). Otherwise,
 * and whenever it finds the lock held, it parks again with a timer (BACKOFF_MIN..MAX,
 * doubling) rather than asking to be woken at the next unlock, which would repeat the round
 * trip at every unlock. It touches the lock word a few times per turn, at no measurable cost
 * to the holder, and waits for its turn. (Its timer lives on the worker it parked on, so a
 * worker that never switches, such as one whose task only ever yields, delays its retry.)
 *
 * Fairness (Go's sync.Mutex starvation mode, as a turn). Barging alone can starve the queue.
 * So the head of the queue gets the lock at most TURN_NS after it became the head: the holder
 * looks at the clock every CHECK_EVERY unlocks while there are waiters (a task that never
 * blocks on one worker gives nobody else a chance to look), and a woken head that has waited
 * a turn sets STARVING, which the next unlock sees. Then unlock does not release the lock
 * but hands it to the head (grant_head): LOCKED stays set, so nobody can barge in between,
 * and the granted waiter resumes owning it. The turn clock restarts for the next head, so
 * with k waiters each waits about k turns at most, and the lock rotates among contenders in
 * ~1 ms slices at a cost of one switch per slice.
 *
 * Deadlines and cancellation. A waiter that wakes for its own deadline or a cancel takes the
 * queue lock and unlinks itself; if it was the woken head and the lock is free, it wakes the
 * next head in its place (an unlock that saw WOKEN set woke nobody). A grant and a deadline
 * race for the claim of wait.h: if the grant's claim loses, the waiter finds `granted` set
 * when it takes the queue lock and returns owning the lock. Nodes are only touched under the
 * queue lock while linked, and a waker reads what it needs from a node before releasing it:
 * no node is touched after its owner may have returned.
 *
 * Plain threads run the same code: wait_begin gives them the thread's wait record, wait_park
 * sleeps on a futex, and a task woken by a thread goes through the global queue.
 */
#define _GNU_SOURCE
#include <errno.h>

#include "sched.h"
#include "syncq.h"
#include "wait.h"
#include "weft.h"

enum {
	M_LOCKED = 1u,
	M_WOKEN = 2u,
	M_STARVING = 4u,
	M_WAITERS = 8u,
	M_QLOCK = 16u,
};

#define TURN_NS 1000000         /* the head waiter gets the lock after this at most */
#define CHECK_EVERY 256         /* unlocks (with waiters) between two looks at the clock */
#define SPIN_MAX 64             /* polls of the lock word before parking */
#define BACKOFF_MIN_NS 2000     /* first retry of a woken head that lost */
#define BACKOFF_MAX_NS 50000    /* longest: also the worst delay a lost head adds */
#define HAMMER_NS 250           /* a holder unlocking more often than this is not letting go */

struct mutex_waiter {
	struct mutex_waiter *next, *prev;
	struct wait *w;
	bool woken;     /* head, woken to retry: retries on a timer, no unlock wakes it again */
	bool starving;  /* head for a whole turn: the next unlock hands the lock over */
	bool granted;   /* the lock was handed to it: it owns it when it runs */
	unsigned seen;  /* m->_ticks when it last looked, */
	int64_t seen_at; /* and when */
};

/* ---- the word ----------------------------------------------------------------------------- */

static inline unsigned load_state(weft_mutex *m)
{
	return __atomic_load_n(&m->_state, __ATOMIC_RELAXED);
}

static inline bool cas_state(weft_mutex *m, unsigned *expect, unsigned want, int order)
{
	return __atomic_compare_exchange_n(&m->_state, expect, want, true, order, __ATOMIC_RELAXED);
}

static inline bool take(weft_mutex *m)
{
	return !(__atomic_fetch_or(&m->_state, M_LOCKED, __ATOMIC_ACQUIRE) & M_LOCKED);
}

/* Who holds it, for the spinning decision only: the taker's worker (NULL: a plain thread). */
static inline void own(weft_mutex *m)
{
	__atomic_store_n(&m->_owner, (void *)worker_self(), __ATOMIC_RELAXED);
}

/* Unlocks made while waiters were queued. Written by holders only; read by the woken head to
 * tell a holder that is still taking the lock over and over from one that has gone. */
static inline unsigned ticks(weft_mutex *m)
{
	return __atomic_load_n(&m->_ticks, __ATOMIC_RELAXED);
}

static void set_turn(weft_mutex *m)
{
	__atomic_store_n(&m->_turn, weft_now(), __ATOMIC_RELAXED);
}

/* ---- the queue (under QLOCK) -------------------------------------------------------------- */

static unsigned qlock(weft_mutex *m)
{
	unsigned s = load_state(m);
	for (;;) {
		if (s & M_QLOCK) {
			cpu_relax();
			s = load_state(m);
		} else if (cas_state(m, &s, s | M_QLOCK, __ATOMIC_ACQUIRE)) {
			return s | M_QLOCK;
		}
	}
}

/* The flags the word must show for the queue as it is. */
static unsigned qflags(weft_mutex *m)
{
	struct mutex_waiter *h = m->_head;
	if (!h)
		return 0;
	return M_WAITERS | (h->woken ? M_WOKEN : 0) | (h->starving ? M_STARVING : 0);
}

/* Publish the queue's flags and release QLOCK. Only LOCKED changes under our feet. */
static void qunlock(weft_mutex *m)
{
	unsigned f = qflags(m), s = load_state(m);
	while (!cas_state(m, &s, (s & M_LOCKED) | f, __ATOMIC_RELEASE))
		;
}

static void link_tail(weft_mutex *m, struct mutex_waiter *n)
{
	struct mutex_waiter *t = m->_tail;
	n->next = NULL;
	n->prev = t;
	if (t) {
		t->next = n;
	} else {
		m->_head = n;
		set_turn(m);
	}
	m->_tail = n;
}

static void unlink_node(weft_mutex *m, struct mutex_waiter *n)
{
	if (n->prev) {
		n->prev->next = n->next;
	} else {
		m->_head = n->next;
		if (n->next)
			set_turn(m); /* a new head starts its turn */
	}
	if (n->next)
		n->next->prev = n->prev;
	else
		m->_tail = n->prev;
}

/* ---- waking (QLOCK held; both release it) -------------------------------------------------- */

/* Wake the head to retry (it does not get the lock). */
static void wake_head(weft_mutex *m)
{
	struct mutex_waiter *h = m->_head;
	h->woken = true;
	h->seen = ticks(m);
	h->seen_at = weft_now();
	struct wait *w = h->w;
	bool claimed = wait_claim(w); /* lost: it is leaving, and will pass WOKEN on (leave) */
	qunlock(m);
	if (claimed)
		wait_finish(w, 0);
}

/* Hand the lock, which the caller holds, to the head. */
static void grant_head(weft_mutex *m)
{
	struct mutex_waiter *h = m->_head;
	unlink_node(m, h);
	h->granted = true;
	struct wait *w = h->w;
	/* Lost if it is already awake (woken earlier, deadline, cancel): it sees `granted` when
	 * it takes the queue lock. */
	bool claimed = wait_claim(w);
	own(m); /* it will run on this worker, from our `next` slot */
	qunlock(m);
	if (claimed)
		wait_finish(w, 0);
}

/* ---- lock --------------------------------------------------------------------------------- */

/* Poll the word while the holder is likely to let go soon: it runs on another core (or is a
 * plain thread) and nobody is queued already. */
static bool spin(weft_mutex *m)
{
	void *me = worker_self();
	for (int i = 0; i < SPIN_MAX; i++) {
		unsigned s = load_state(m);
		if (!(s & M_LOCKED))
			return take(m); /* lost: the holder took it back at once, it is not letting go */
		if (s & (M_WAITERS | M_STARVING))
			return false;
		if (me && __atomic_load_n(&m->_owner, __ATOMIC_RELAXED) == me)
			return false; /* the holder is on our worker: it cannot run while we spin */
		cpu_relax();
	}
	return false;
}

/* Join the queue, or take the lock if it is free. True: taken. False: queued, QLOCK held. */
static bool enqueue(weft_mutex *m, struct mutex_waiter *n)
{
	unsigned s = load_state(m);
	for (;;) {
		if (!(s & M_LOCKED)) {
			if (take(m))
				return true;
			s = load_state(m);
		} else if (s & M_QLOCK) {
			cpu_relax();
			s = load_state(m);
		} else if (cas_state(m, &s, s | M_QLOCK | M_WAITERS, __ATOMIC_ACQUIRE)) {
			break; /* still LOCKED: its unlock will see WAITERS */
		}
	}
	link_tail(m, n);
	return false;
}

/* Should the woken head n take the lock, which it sees free? Not if the holder is still at
 * work on another core taking it again and again, more than once per HAMMER_NS since n last
 * looked (the free moment it sees is between two increments): fighting it for the cache line
 * would cost both of them more than n's wait, so n waits for its turn. It takes it if the
 * holder has gone quiet or unlocks only now and then, or if the last taker is on n's own
 * worker (and so is not running now). */
static bool may_take(weft_mutex *m, struct mutex_waiter *n)
{
	void *me = worker_self();
	if (me && __atomic_load_n(&m->_owner, __ATOMIC_RELAXED) == me)
		return true;
	unsigned unlocks = ticks(m) - n->seen;
	return unlocks == 0 || (int64_t)unlocks * HAMMER_NS < weft_now() - n->seen_at;
}

/* About to park (QLOCK held, n queued): publish the queue's flags and release QLOCK. A waiter
 * that has not been woken may park even if the lock came free: WAITERS was published while
 * the lock was held, so whoever released it must wake the head. The woken head is on its own
 * (unlocks do not wake it again), so it takes the lock if it may, and otherwise parks only
 * while the lock is held, so that a release after this sees the flags (a polite one parks
 * with a timer and looks again). True: taken. */
static bool park_or_take(weft_mutex *m, struct mutex_waiter *n)
{
	unsigned f = qflags(m), s = load_state(m);
	/* A starving head parks without a timer: it must not be polite about a free lock. */
	bool polite = n->woken && !n->starving && !may_take(m, n);
	for (;;) {
		if ((s & M_LOCKED) || !n->woken || polite) {
			n->seen = ticks(m); /* what its next retry compares with */
			n->seen_at = weft_now();
			if (cas_state(m, &s, (s & M_LOCKED) | f, __ATOMIC_RELEASE))
				return false;
		} else if (cas_state(m, &s, s | M_LOCKED, __ATOMIC_ACQUIRE)) {
			unlink_node(m, n);
			qunlock(m);
			return true;
		}
	}
}

/* Give up waiting (deadline or cancel; QLOCK held, n queued; releases QLOCK). */
static void leave(weft_mutex *m, struct mutex_waiter *n)
{
	bool was_woken = n->woken;
	unlink_node(m, n);
	struct mutex_waiter *h = m->_head;
	if (!was_woken || !h) {
		qunlock(m);
		return;
	}
	/* n was the woken head, so unlocks woke nobody. If the lock is free now, nobody may come
	 * to wake the new head: wake it in n's place. */
	struct wait *w = NULL;
	unsigned s = load_state(m);
	for (;;) {
		if (!(s & M_LOCKED) && !h->woken) {
			h->woken = true;
			w = wait_claim(h->w) ? h->w : NULL;
		}
		if (cas_state(m, &s, (s & M_LOCKED) | qflags(m), __ATOMIC_RELEASE))
			break;
	}
	if (w)
		wait_finish(w, 0);
}

static bool gave_up(int r, int64_t deadline)
{
	if (r == 0)
		return false;
	if (r == -ECANCELED)
		return true;
	/* -ETIMEDOUT or -ENOMEM (no timer) on a backoff: retry; on the caller's deadline: stop. */
	return deadline != WEFT_FOREVER && (r != -ETIMEDOUT || weft_now() >= deadline);
}

static int64_t min64(int64_t a, int64_t b)
{
	return a < b ? a : b;
}

/* Park in the queue until the lock is ours (0) or the deadline or a cancel ends the wait. */
static int lock_wait(weft_mutex *m, int64_t deadline, bool cancellable)
{
	struct mutex_waiter n = { 0 };
	int64_t backoff = BACKOFF_MIN_NS;
	if (enqueue(m, &n)) {
		own(m);
		return 0;
	}
	for (;;) { /* QLOCK held, n queued */
		n.w = cancellable ? wait_begin("mutex", m) : wait_begin_nocancel("mutex", m);
		int64_t d = deadline;
		if (n.woken && !n.starving) {
			d = min64(d, weft_now() + backoff);
			backoff = min64(2 * backoff, BACKOFF_MAX_NS);
		}
		if (park_or_take(m, &n)) {
			wait_abandon(n.w); /* a cancel may have claimed it meanwhile: the lock wins */
			own(m);
			return 0;
		}
		int r = wait_park(n.w, d);
		qlock(m);
		if (n.granted) {
			qunlock(m);
			own(m);
			return 0;
		}
		if (gave_up(r, deadline)) {
			leave(m, &n);
			return r;
		}
		if (n.woken && weft_now() - __atomic_load_n(&m->_turn, __ATOMIC_RELAXED) >= TURN_NS)
			n.starving = true; /* published by park_or_take while the lock is held */
	}
}

static int lock_slow(weft_mutex *m, int64_t deadline, bool cancellable)
{
	if (deadline != WEFT_FOREVER && deadline <= weft_now())
		return -ETIMEDOUT; /* already past: do not block */
	if (spin(m)) {
		own(m);
		return 0;
	}
	if (cancellable && weft_cancelled())
		return -ECANCELED;
	return lock_wait(m, deadline, cancellable);
}

void weft_mutex_init(weft_mutex *m)
{
	*m = (weft_mutex)WEFT_MUTEX_INIT;
}

void weft_mutex_lock(weft_mutex *m)
{
	if (__builtin_expect(take(m), 1)) {
		own(m);
		return;
	}
	lock_slow(m, WEFT_FOREVER, false);
}

int weft_mutex_trylock(weft_mutex *m)
{
	/* Read first: a failed try must not take the line away from the holder. */
	if ((load_state(m) & M_LOCKED) || !take(m))
		return -EAGAIN;
	own(m);
	return 0;
}

int weft_mutex_lock_until(weft_mutex *m, int64_t deadline)
{
	if (take(m)) {
		own(m);
		return 0;
	}
	return lock_slow(m, deadline, true);
}

/* ---- unlock ------------------------------------------------------------------------------- */

/* After the release, with s the word after it: wake the head, or hand it the lock if it is
 * starving and the lock is still free. Nothing to do if nobody waits, a barger holds the lock
 * (its unlock will do this), or the head is already woken. */
static __attribute__((noinline)) void unlock_slow(weft_mutex *m, unsigned s)
{
	for (;;) {
		if (!(s & M_WAITERS) || (s & M_LOCKED))
			return;
		if ((s & (M_WOKEN | M_STARVING)) == M_WOKEN)
			return;
		if (s & M_QLOCK) {
			cpu_relax();
			s = load_state(m);
			continue;
		}
		unsigned grab = s & M_STARVING ? M_LOCKED : 0; /* take it back, for the head */
		if (cas_state(m, &s, s | M_QLOCK | grab, __ATOMIC_ACQUIRE)) {
			if (grab)
				grant_head(m);
			else
				wake_head(m);
			return;
		}
	}
}

/* The holder, with waiters queued: has the head waited its turn? Looks at the clock only
 * every CHECK_EVERY unlocks (_ticks is the holder's: the lock guards it). */
static bool turn_over(weft_mutex *m, unsigned s)
{
	if (s & M_STARVING)
		return true;
	unsigned t = ticks(m) + 1;
	__atomic_store_n(&m->_ticks, t, __ATOMIC_RELAXED);
	if (t % CHECK_EVERY)
		return false;
	return weft_now() - __atomic_load_n(&m->_turn, __ATOMIC_RELAXED) >= TURN_NS;
}

/* Hand the lock to the head instead of releasing it. False if the queue emptied meanwhile. */
static __attribute__((noinline)) bool handoff(weft_mutex *m)
{
	qlock(m);
	if (!m->_head) {
		qunlock(m);
		return false;
	}
	grant_head(m);
	return true;
}

void weft_mutex_unlock(weft_mutex *m)
{
	unsigned s = load_state(m);
	if (__builtin_expect(!(s & M_LOCKED), 0))
		sync_misuse("weft_mutex_unlock: mutex is not locked", m);
	if (__builtin_expect(s & M_WAITERS, 0) && turn_over(m, s) && handoff(m))
		return;
	unsigned old = __atomic_fetch_sub(&m->_state, M_LOCKED, __ATOMIC_RELEASE);
	if (__builtin_expect(old != M_LOCKED, 0))
		unlock_slow(m, old - M_LOCKED);
}

void weft_mutex_destroy(weft_mutex *m)
{
#ifdef WEFT_DEBUG
	unsigned s = load_state(m);
	if (s & M_WAITERS)
		sync_misuse("weft_mutex_destroy: mutex has waiters", m);
	if (s & M_LOCKED)
		sync_misuse("weft_mutex_destroy: mutex is locked", m);
#else
	(void)m;
#endif
}
