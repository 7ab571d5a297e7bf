/*
 * mutex.c - weft_mutex, a task-aware lock built for contention.
 *
 * A lock that many tasks take over and over (N tasks each incrementing a shared counter under
 * it, say) is fast or slow for two reasons: what a contended lock costs, and where the
 * contenders run.
 *
 * The state. Three bytes side by side, in one cache line with the queue:
 *
 *   _locked   1 while held.
 *   _flags    what an unlock has to look at: WAITERS (the queue of parked waiters is not
 *             empty), WOKEN (its head has been woken to retry, and retries on its own),
 *             STARVING (the head has waited a full turn, TURN_NS: the next unlock hands the
 *             lock to it). Written only under _qlock, from the queue as it is (publish).
 *   _qlock    a spinlock held for a few instructions around changes to the queue
 *             (m->_head.._tail and the waiters' nodes).
 *
 * lock is `xchg` of _locked; unlock is a plain store of 0 to _locked and a plain load of
 * _flags (see "Release without a read-modify-write" below): one atomic instruction per
 * lock/unlock pair, no system call. Only when the flags show waiters does unlock do more, and
 * then only if nobody has been woken yet.
 *
 * Waiting. A contender that finds the lock held spins a little (reading, not writing) if the
 * holder is on another core and nobody is queued; when it sees the lock free it tries once,
 * and parks if it loses (the holder took it back at once: it is not letting go). It parks
 * (wait.h) in a FIFO of nodes that live on the waiters' own stacks. A new head, having
 * published WAITERS, makes sure an unlock will see it (recheck, below) and parks; it does not
 * grab a lock that came free meanwhile: a contender that gives up should stay given up.
 *
 * Waking, and where the woken run. An unlock that finds waiters and no WOKEN head wakes the
 * head with wait_finish, which puts it in the unlocking task's worker's `next` slot: it will
 * run on the unlocker's core, right after it. It does not get the lock; the unlocker keeps
 * running and usually takes the lock again at once (barging), since handing a lock to a
 * parked task costs a switch per acquisition and serialises everyone behind the slowest
 * (a lock convoy). So while one task holds the lock and runs, its contenders collect, parked
 * or runnable, on its worker, the lock's cache line stays in one core's cache, and the
 * other cores go idle or do other work. This is how contention can cost little more than the
 * uncontended lock: in the steady state nobody else touches the lock's cache line at all.
 *
 * The woken head. While WOKEN is set no unlock wakes anybody: at most one waiter at a time is
 * out of the queue's sleep, and the holder's unlocks stay plain stores and loads. The woken head
 * runs when the holder's core lets it, or at once on an idle core that steals it from the
 * `next` slot (idle workers do: idle.c). There it must not fight the holder: a holder that
 * takes the lock again and again leaves it free for a few ns between two increments, and a
 * head on another core that grabbed it then would start both cores bouncing the line, a
 * cross-core transfer per increment. So the head takes a free lock only if nobody has unlocked
 * since it last looked (_ticks, counted by unlocks while waiters are queued, has not moved:
 * the holder has gone quiet) or if the last taker is on its own worker (not running now).
 * Otherwise,
 * and whenever it finds the lock held, it parks again with a timer (BACKOFF_MIN..MAX,
 * doubling) rather than asking to be woken at the next unlock, which would repeat the round
 * trip at every unlock. It touches the lock a few times per turn, at no measurable cost
 * to the holder, and waits for its turn. (Its timer lives on the worker it parked on, so a
 * worker that never switches, such as one whose task only ever yields, delays its retry.)
 *
 * Fairness (Go's sync.Mutex starvation mode). Barging alone can starve the queue. So a waiter
 * that has been queued TURN_NS gets the lock handed to it as soon as it is at the head: the
 * holder looks at the clock every CHECK_EVERY unlocks while there are waiters (a task that
 * never blocks on one worker gives nobody else a chance to look), and a woken head that has
 * waited that long sets STARVING, which the next unlock sees. Then unlock does not release the
 * lock but hands it to the head (grant_head): _locked stays 1, so nobody can barge in between,
 * and the granted waiter resumes owning it. The head's clock (_turn) is the time it joined
 * the queue, not the time it reached the head: behind a head that was served late, the next
 * ones have waited as long, and each gets the lock after at most CHECK_EVERY unlocks of the
 * one before. So the queue drains in one pass, a switch per waiter, and then barging resumes.
 * No waiter waits much more than TURN_NS plus one such pass; a clock started when a waiter
 * reached the head would make it wait a turn per waiter ahead of it.
 *
 * Deadlines and cancellation. A waiter that wakes for its own deadline or a cancel takes the
 * queue lock and unlinks itself; if it was the woken head and the lock is free, it wakes the
 * next head in its place (an unlock that saw WOKEN set woke nobody). A grant and a deadline
 * race for the claim of wait.h: if the grant's claim loses, the waiter finds `granted` set
 * when it takes the queue lock and returns owning the lock. Nodes are only touched under the
 * queue lock while linked, and a waker reads what it needs from a node before releasing it:
 * no node is touched after its owner may have returned.
 *
 * Release without a read-modify-write. An unlock that stores 0 to _locked and then loads
 * _flags is a store followed by a load, which the processor may reorder (x86's store buffer):
 * the load can read flags from before a waiter published WAITERS, while the waiter still sees
 * the lock held, and then nobody wakes that waiter. It is Dekker's problem, and the usual cure
 * is a full fence in every unlock (a locked instruction, about half of what a pair costs).
 * weft puts the whole fence on the waiter's side instead, as liburcu does: the unlock has only
 * a compiler barrier, and a waiter about to park on the promise that an unlock will wake it
 * first runs membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED), which makes every running thread of
 * the program pass a full barrier (recheck). After it, every unlock whose store the waiter's
 * look at _locked does not see will see its flags (or newer ones); and if the waiter sees the
 * lock free, the unlock that freed it may have missed them, so the waiter does what it would
 * have done. The barrier costs from a fraction of a microsecond to several (an interrupt to
 * each other core running the program, the holder's included, and more inside a VM), paid
 * once per wait by a waiter that parks at the head without a timer. A waiter parking behind
 * the head needs none: its node changes no flag an unlock reads, and whoever makes it the head
 * holds the lock (a grant, a woken head taking it) or, leaving, rechecks for it. Where
 * membarrier is missing (an old kernel, a seccomp filter), or with WEFT_MUTEX_FAST_RELEASE=0,
 * both sides use a seq_cst fence instead; should it fail later on (-ENOMEM), that head parks
 * with a timer and looks again.
 *
 * The price: unlock reads _flags after the lock is free, when another task may already have
 * taken it, unlocked it and freed its memory. So a weft_mutex must outlive every unlock call
 * on it (weft.h), as in Go; glibc's pthread_mutex_unlock touches nothing after the release.
 *
 * Plain threads run the same code: wait_begin gives them the thread's wait record, wait_park
 * sleeps on a futex, and a task woken by a thread goes through the global queue.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stddef.h>
#include <string.h>

#include "asym.h"
#include "sched.h"
#include "syncq.h"
#include "wait.h"
#include "waitq.h"
#include "weft.h"

enum { /* _flags */
	M_WOKEN = 1u,
	M_STARVING = 2u,
	M_WAITERS = 4u,
};

#define TURN_NS 1000000         /* a waiter queued this long gets the lock handed to it */
#define CHECK_EVERY 1024        /* unlocks (with waiters) between two looks at the clock */
#define SPIN_MAX 64             /* polls of the lock before parking */
#define BACKOFF_MIN_NS 2000     /* first retry of a woken head that lost */
#define BACKOFF_MAX_NS 50000    /* longest: also the worst delay a lost head adds */
#define HAMMER_NS 250           /* a holder unlocking more often than this is not letting go */

struct mutex_waiter {
	struct waitq_link link; /* in m's queue (waitq.h), whose ends are m->_head and m->_tail */
	struct wait *w;
	bool woken;     /* head, woken to retry: retries on a timer, no unlock wakes it again */
	bool starving;  /* head for a whole turn: the next unlock hands the lock over */
	bool granted;   /* the lock was handed to it: it owns it when it runs */
	unsigned seen;  /* m->_ticks when it last looked, */
	int64_t seen_at; /* and when */
	int64_t since;  /* when it joined the queue */
};
_Static_assert(offsetof(struct mutex_waiter, link) == 0, "waitq.h: the link comes first");

/* ---- the release's fence ------------------------------------------------------------------ */

/* Set once, before main. REORDERED is for tests (tests/mutex.c, no_lost_wakeups): the fast
 * release with a model of a store buffer that makes the reordering it must survive likely. */
static enum { FENCED_RELEASE, FAST_RELEASE, REORDERED_RELEASE } release;

__attribute__((constructor)) static void release_init(void)
{
	const char *e = getenv("WEFT_MUTEX_FAST_RELEASE");
	if ((e && strcmp(e, "0") == 0) || !asym_on())
		return;
	release = e && strcmp(e, "reordered") == 0 ? REORDERED_RELEASE : FAST_RELEASE;
}

/* REORDERED_RELEASE's store buffer: an unlock's store to _locked waits in it, after the load
 * of _flags that follows it, for up to ~20 us, or until a heavy barrier drains it, as
 * membarrier's interrupt drains a real one. */
static struct {
	atomic_int buffered; /* unlocks whose store is not visible yet */
	atomic_int barriers; /* heavy barriers waiting for them */
} model;

static void model_drain(void)
{
	atomic_fetch_add(&model.barriers, 1);
	while (atomic_load(&model.buffered))
		cpu_relax();
	atomic_fetch_sub(&model.barriers, 1);
}

/* The waiter's half of the fence, between its publication of _flags and its look at _locked
 * (the unlock's half is in weft_mutex_unlock). False if there was none: membarrier can fail
 * after it registered (-ENOMEM, or a seccomp filter installed since). Not inlined: GCC's
 * -Wtsan objects to an inlined fence. */
static __attribute__((noinline)) bool heavy_barrier(void)
{
	if (release == FENCED_RELEASE) {
		atomic_thread_fence(memory_order_seq_cst);
		return true;
	}
	if (release == REORDERED_RELEASE)
		model_drain();
	return asym_heavy();
}

int mutex_release_kind(void)
{
	return (int)release;
}

/* ---- the state ---------------------------------------------------------------------------- */

static inline bool locked(weft_mutex *m)
{
	return __atomic_load_n(&m->_locked, __ATOMIC_RELAXED);
}

static inline unsigned flags(weft_mutex *m)
{
	return __atomic_load_n(&m->_flags, __ATOMIC_RELAXED);
}

static inline bool take(weft_mutex *m)
{
	return !__atomic_exchange_n(&m->_locked, 1, __ATOMIC_ACQUIRE);
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

/* The head's turn runs from when it joined the queue: see Fairness. */
static void set_turn(weft_mutex *m, struct mutex_waiter *head)
{
	__atomic_store_n(&m->_turn, head->since, __ATOMIC_RELAXED);
}

/* ---- the queue (under _qlock) ------------------------------------------------------------- */

/* spin.h's lock, in the byte weft.h gives it beside _locked and _flags. */
static void qlock(weft_mutex *m)
{
	spin_lock_byte(&m->_qlock);
}

static inline struct waitq queue(weft_mutex *m)
{
	return (struct waitq){ &m->_head, &m->_tail };
}

static inline struct mutex_waiter *head_of(weft_mutex *m)
{
	return (struct mutex_waiter *)waitq_first(queue(m));
}

/* The flags for the queue as it is. */
static unsigned qflags(weft_mutex *m)
{
	struct mutex_waiter *h = head_of(m);
	if (!h)
		return 0;
	return M_WAITERS | (h->woken ? M_WOKEN : 0) | (h->starving ? M_STARVING : 0);
}

/* Publish the queue's flags and release _qlock. */
static void qunlock(weft_mutex *m)
{
	__atomic_store_n(&m->_flags, (unsigned char)qflags(m), __ATOMIC_RELAXED);
	spin_unlock_byte(&m->_qlock);
}

static inline void link_tail(weft_mutex *m, struct mutex_waiter *n)
{
	n->since = weft_now();
	waitq_push_back(queue(m), &n->link);
	if (head_of(m) == n)
		set_turn(m, n);
}

static inline void unlink_node(weft_mutex *m, struct mutex_waiter *n)
{
	bool was_head = head_of(m) == n;
	waitq_remove(queue(m), &n->link);
	struct mutex_waiter *h = head_of(m);
	if (was_head && h)
		set_turn(m, h);
}

/* ---- waking (_qlock held; both release it) ------------------------------------------------ */

/* Wake the head to retry (it does not get the lock). */
static void wake_head(weft_mutex *m)
{
	struct mutex_waiter *h = head_of(m);
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
	struct mutex_waiter *h = head_of(m);
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

/* Whether an unlock that saw flags f has anything to do: waiters, and the head not already
 * woken (unless it is starving, when the unlock hands the lock over). */
static inline bool unlock_acts(unsigned f)
{
	return (f & M_WAITERS) && (f & (M_WOKEN | M_STARVING)) != M_WOKEN;
}

/* With the lock just released and f the flags seen after: wake the head, or hand it the lock
 * if it is starving. Nothing to do if nobody waits, the head is already woken, or a barger
 * holds the lock (its own unlock will see the flags: see recheck). */
static __attribute__((noinline)) void unlock_slow(weft_mutex *m, unsigned f)
{
	if (!unlock_acts(f))
		return;
	qlock(m);
	struct mutex_waiter *h = head_of(m);
	if (!h || locked(m) || (h->woken && !h->starving)) {
		qunlock(m);
	} else if (!h->starving) {
		wake_head(m);
	} else if (take(m)) { /* take it back, for the head */
		grant_head(m);
	} else {
		qunlock(m);
	}
}

/* A waiter has published flags that ask an unlock to act and is about to park on that
 * promise. After the heavy half of the fence, every unlock whose store our look at _locked
 * does not see will see these flags (or newer ones); if we see the lock free, the unlock that
 * freed it may have missed them, so we do what it would have done (which may wake ourselves).
 * False if there was no barrier: then nothing may rely on an unlock, and the caller must look
 * again later (a look without the barrier may be stale, but not forever). */
static bool recheck(weft_mutex *m)
{
	bool fenced = heavy_barrier();
	if (!locked(m))
		unlock_slow(m, flags(m));
	return fenced;
}

/* ---- lock --------------------------------------------------------------------------------- */

/* Poll the lock while the holder is likely to let go soon: it runs on another core (or is a
 * plain thread) and nobody is queued already. */
static bool spin(weft_mutex *m)
{
	void *me = worker_self();
	for (int i = 0; i < SPIN_MAX; i++) {
		if (!locked(m))
			return take(m); /* lost: the holder took it back at once, it is not letting go */
		if (flags(m) & (M_WAITERS | M_STARVING))
			return false;
		if (me && __atomic_load_n(&m->_owner, __ATOMIC_RELAXED) == me)
			return false; /* the holder is on our worker: it cannot run while we spin */
		cpu_relax();
	}
	return false;
}

/* Join the queue, or take the lock if it is free. True: taken. False: queued, _qlock held. */
static bool enqueue(weft_mutex *m, struct mutex_waiter *n)
{
	for (;;) {
		if (!locked(m) && take(m))
			return true;
		qlock(m);
		if (locked(m))
			break;
		qunlock(m); /* came free meanwhile: try again */
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

/* About to park (_qlock held, n queued). A woken head takes the lock if it may and can;
 * otherwise publish the queue's flags and release _qlock. True: taken. */
static bool park_or_take(weft_mutex *m, struct mutex_waiter *n)
{
	/* A starving head is not polite about a free lock. */
	bool polite = n->woken && !n->starving && !may_take(m, n);
	if (n->woken && !polite && !locked(m) && take(m)) {
		unlink_node(m, n);
		qunlock(m);
		return true;
	}
	n->seen = ticks(m); /* what its next retry compares with */
	n->seen_at = weft_now();
	qunlock(m);
	return false;
}

/* Give up waiting (deadline or cancel; _qlock held, n queued; releases _qlock). If n was the
 * woken head, unlocks woke nobody; if it was a head not woken, its successor parked relying on
 * n's recheck, which may have had no barrier (lock_wait). Either way the new head must not be
 * left relying on an unlock that has already passed. */
static void leave(weft_mutex *m, struct mutex_waiter *n)
{
	bool hands_on = n->woken || (head_of(m) == n && n->link.next);
	unlink_node(m, n);
	qunlock(m);
	if (!hands_on || recheck(m))
		return;
	qlock(m); /* no barrier: wake the new head, which then retries on its own timer */
	struct mutex_waiter *h = head_of(m);
	if (h && !h->woken)
		wake_head(m);
	else
		qunlock(m);
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
	for (;;) { /* _qlock held, n queued */
		n.w = cancellable ? wait_begin("mutex", m) : wait_begin_nocancel("mutex", m);
		int64_t d = deadline;
		bool retries = n.woken && !n.starving; /* on a timer: no unlock has to wake it */
		if (retries) {
			d = min64(d, weft_now() + backoff);
			backoff = min64(2 * backoff, BACKOFF_MAX_NS);
		}
		/* Only a head's flags tell an unlock to act: behind it our node changes nothing an
		 * unlock reads, and whoever makes us the head later holds the lock (a grant, a woken
		 * head taking it) or rechecks (leave). */
		bool head = head_of(m) == &n;
		if (park_or_take(m, &n)) {
			wait_abandon(n.w); /* a cancel may have claimed it meanwhile: the lock wins */
			own(m);
			return 0;
		}
		if (!retries && head && !recheck(m))
			d = min64(d, weft_now() + BACKOFF_MAX_NS); /* no barrier: look again */
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
			n.starving = true; /* published by park_or_take */
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

/* Both ends of the pair start a cache line: otherwise where the linker happens to put them
 * moves the cost of the uncontended pair from build to build. */
__attribute__((aligned(64))) void weft_mutex_lock(weft_mutex *m)
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
	if (locked(m) || !take(m))
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

/* The release as the processor may run it (REORDERED_RELEASE): the load of _flags done, the
 * store to _locked not yet visible. */
static __attribute__((noinline)) unsigned reordered_release(weft_mutex *m)
{
	atomic_fetch_add(&model.buffered, 1);
	unsigned f = __atomic_load_n(&m->_flags, __ATOMIC_SEQ_CST);
	for (int i = 0; i < 1000 && !atomic_load(&model.barriers); i++)
		cpu_relax();
	__atomic_store_n(&m->_locked, 0, __ATOMIC_SEQ_CST);
	atomic_fetch_sub(&model.buffered, 1);
	return f;
}

/* Every release but the fast one. */
static __attribute__((noinline)) void release_slowly(weft_mutex *m)
{
	unsigned f;
	if (release == REORDERED_RELEASE) {
		f = reordered_release(m);
	} else {
		__atomic_store_n(&m->_locked, 0, __ATOMIC_RELEASE);
		atomic_thread_fence(memory_order_seq_cst);
		f = flags(m);
	}
	unlock_slow(m, f);
}

/* Let go of the lock and look whether an unlock has anything to do. */
static inline void let_go(weft_mutex *m)
{
	if (__builtin_expect(release != FAST_RELEASE, 0)) {
		release_slowly(m);
		return;
	}
	__atomic_store_n(&m->_locked, 0, __ATOMIC_RELEASE);
	__atomic_signal_fence(__ATOMIC_SEQ_CST); /* the heavy half is in recheck */
	unsigned f = flags(m);
	if (__builtin_expect(unlock_acts(f), 0))
		unlock_slow(m, f);
}

/* An unlock at a look at the clock (every CHECK_EVERY unlocks with waiters queued) or with a
 * starving head: if the head has waited its turn, hand it the lock instead of releasing it. */
static __attribute__((noinline)) void unlock_at_turn(weft_mutex *m, unsigned f)
{
	if ((f & M_STARVING) ||
	    weft_now() - __atomic_load_n(&m->_turn, __ATOMIC_RELAXED) >= TURN_NS) {
		qlock(m);
		if (head_of(m)) {
			grant_head(m);
			return;
		}
		qunlock(m);
	}
	let_go(m);
}

/* The common cases, contended or not, call nothing but in tail position, so they need no stack
 * frame: every store before the next lock's `xchg` is one more it waits for. */
__attribute__((aligned(64))) void weft_mutex_unlock(weft_mutex *m)
{
	if (__builtin_expect(!locked(m), 0))
		sync_misuse("weft_mutex_unlock: mutex is not locked", m);
	unsigned f = flags(m);
	if (__builtin_expect(f & M_WAITERS, 0)) {
		/* _ticks is the holder's (the lock guards it); the woken head reads it */
		unsigned t = ticks(m) + 1;
		__atomic_store_n(&m->_ticks, t, __ATOMIC_RELAXED);
		if (__builtin_expect((f & M_STARVING) || t % CHECK_EVERY == 0, 0)) {
			unlock_at_turn(m, f);
			return;
		}
	}
	let_go(m);
}

void weft_mutex_destroy(weft_mutex *m)
{
#ifdef WEFT_DEBUG
	if (flags(m) & M_WAITERS)
		sync_misuse("weft_mutex_destroy: mutex has waiters", m);
	if (locked(m))
		sync_misuse("weft_mutex_destroy: mutex is locked", m);
#else
	(void)m;
#endif
}
