/* wait.c - parking and waking (the protocol is described in wait.h). */
#define _GNU_SOURCE
#include "wait.h"

#include <errno.h>

#include "asym.h"
#include "futex.h"
#include "sched.h"
#include "task.h"
#include "trace.h"
#include "waitstat.h"
#include "weft.h"

atomic_int wait_foreign_parked;

static __thread struct wait thread_wait;

/*
 * Cancellation is a store-then-load race on both sides: weft_cancel stores `cancelled` and then
 * tries to claim the wait (PARKED -> CLAIMED); a waiter stores PARKED and then, in wait_park,
 * loads `cancelled`. Every wait takes part and cancels are rare, so the canceller pays for the
 * fence (asym.h): a cancel that finds no parked wait to claim runs asym_heavy and tries again.
 * Either the waiter's PARKED was visible by then (the second try claims it) or its load of
 * `cancelled` comes after (it sees the cancel). A cancel that finds the wait parked, the common
 * case (a task blocked in a call), needs no fence at all.
 */
static struct wait *arm(uint32_t state, const char *reason, const void *object)
{
	struct worker *w = worker_self();
	struct wait *wt = w && w->cur ? &w->cur->wait : &thread_wait;
	atomic_store_explicit(&wt->reason, reason, memory_order_relaxed);
	atomic_store_explicit(&wt->object, object, memory_order_relaxed);
	if (asym_on()) {
		atomic_store_explicit(&wt->state, state, memory_order_relaxed);
		asym_light(); /* before wait_park's load of cancelled */
	} else {
		atomic_exchange_explicit(&wt->state, state, memory_order_seq_cst);
	}
	return wt;
}

struct wait *wait_begin(const char *reason, const void *object)
{
	return arm(WAIT_PARKED, reason, object);
}

struct wait *wait_begin_nocancel(const char *reason, const void *object)
{
	return arm(WAIT_PARKED_NC, reason, object);
}

/* The waiter ends its own wait (deadline passed, cancelled, abandoned) if nobody has
 * claimed it yet. No wake-up is needed: the waiter is running. */
static bool settle(struct wait *w, int result)
{
	uint32_t s = atomic_load_explicit(&w->state, memory_order_relaxed);
	while (s == WAIT_PARKED || s == WAIT_PARKED_NC)
		if (atomic_compare_exchange_weak_explicit(&w->state, &s, (uint32_t)result,
							  memory_order_acquire, memory_order_relaxed))
			return true;
	return false;
}

static int result_of(struct wait *w)
{
	return (int)atomic_load_explicit(&w->state, memory_order_acquire);
}

static bool pending(uint32_t s)
{
	return s == WAIT_PARKED || s == WAIT_PARKED_NC || s == WAIT_CLAIMED;
}

static int park_thread(struct wait *w, int64_t deadline)
{
	int64_t since = atomic_load_explicit(&waitstat_on, memory_order_relaxed) ? weft_now() : 0;
	atomic_fetch_add(&wait_foreign_parked, 1);
	for (;;) {
		uint32_t s = atomic_load_explicit(&w->state, memory_order_acquire);
		if (!pending(s))
			break;
		/* Once claimed, the waker is committed: wait for it whatever the deadline. */
		int r = futex_wait(&w->state, s, s == WAIT_CLAIMED ? WEFT_FOREVER : deadline);
		if (r == -ETIMEDOUT && settle(w, -ETIMEDOUT))
			break;
	}
	atomic_fetch_sub(&wait_foreign_parked, 1);
	if (since)
		waitstat_add(atomic_load_explicit(&w->reason, memory_order_relaxed), weft_now() - since);
	return result_of(w);
}

/* exact: a deadline already past ends the wait without parking. Otherwise only one before the
 * coarse clock does (no clock read); a later one that has passed all the same is filed, and
 * expires at the worker's next look at its wheel. */
static inline __attribute__((always_inline)) int park_until(struct wait *w, weft_task *t,
							     int64_t deadline, bool exact)
{
	if (deadline != WEFT_FOREVER) {
		int64_t now = exact ? weft_now()
				    : atomic_load_explicit(&sched_coarse_now, memory_order_relaxed);
		if (deadline <= now) {
			if (settle(w, -ETIMEDOUT))
				return -ETIMEDOUT;
		} else if (timer_add(&worker_self()->timers, &t->timer, deadline) < 0) {
			if (settle(w, -ENOMEM))
				return -ENOMEM;
		}
	}
	if (__builtin_expect(atomic_load_explicit(&waitstat_on, memory_order_relaxed), 0)) {
		int64_t since = weft_now();
		sched_park();
		waitstat_add(atomic_load_explicit(&w->reason, memory_order_relaxed), weft_now() - since);
	} else {
		sched_park();
	}
	int r = result_of(w);
	if (r == -ETIMEDOUT)
		t->timer.wheel = NULL; /* expiry took it out of the wheel: no lock needed */
	else if (t->timer.wheel) /* only we set it: no lock to look */
		timer_del(&t->timer);
	return r;
}

/* A cancellable wait of a task whose limit (its group's deadline, task.h) comes before the
 * wait's own deadline waits until the limit, and ends there with -ECANCELED: from then on the
 * task counts as cancelled. Out of line, so that the common path keeps nothing more live
 * across the switch. */
static __attribute__((noinline)) int park_limited(struct wait *w, weft_task *t, bool exact)
{
	int r = park_until(w, t, t->limit, exact);
	if (r != -ETIMEDOUT)
		return r;
	atomic_store(&t->cancelled, 1);
	return -ECANCELED;
}

static int park_task(struct wait *w, int64_t deadline, bool exact)
{
	weft_task *t = w->task;
	if (atomic_load(&t->cancelled) &&
	    atomic_load_explicit(&w->state, memory_order_relaxed) == WAIT_PARKED &&
	    settle(w, -ECANCELED))
		return -ECANCELED;
	if (__builtin_expect(t->limit < deadline, 0) &&
	    atomic_load_explicit(&w->state, memory_order_relaxed) == WAIT_PARKED)
		return park_limited(w, t, exact);
	return park_until(w, t, deadline, exact);
}

int wait_park(struct wait *w, int64_t deadline)
{
	if (!w->task)
		return park_thread(w, deadline);
	return park_task(w, deadline, true);
}

int wait_sleep(struct wait *w, int64_t deadline)
{
	if (!w->task)
		return park_thread(w, deadline);
	return park_task(w, deadline, false);
}

int wait_abandon(struct wait *w)
{
	if (settle(w, 0))
		return 0;
	return wait_park(w, WEFT_FOREVER);
}

void wait_finish(struct wait *w, int result)
{
	weft_task *t = w->task;
	if (t)
		trace_wake(t, false); /* before it can run, so the arrow points forward in time */
	atomic_store_explicit(&w->state, (uint32_t)result, memory_order_release);
	if (t)
		sched_ready(t);
	else
		futex_wake(&w->state, 1);
}

void wait_finish_on(struct wait *w, int result, int home)
{
	weft_task *t = w->task;
	if (!t) {
		wait_finish(w, result);
		return;
	}
	trace_wake(t, false);
	atomic_store_explicit(&w->state, (uint32_t)result, memory_order_release);
	sched_ready_on(t, home);
}

bool wait_cancel_parked(weft_task *t)
{
	uint32_t expect = WAIT_PARKED;
	if (!atomic_compare_exchange_strong(&t->wait.state, &expect, WAIT_CLAIMED))
		return false;
	wait_finish(&t->wait, -ECANCELED);
	return true;
}

/* Deadlines: the timer is the task's own (task.h). */
static bool timer_claim(struct timer *tm)
{
	weft_task *t = (weft_task *)((char *)tm - offsetof(weft_task, timer));
	return wait_claim(&t->wait);
}

/* The tasks of a batch are made runnable together (sched_ready_batch): one run-queue
 * operation and one look for an idle worker. */
static void timer_fire(struct timer **batch, int n)
{
	weft_task *tasks[TIMER_FIRE_BATCH];
	for (int i = 0; i < n; i++) {
		weft_task *t = (weft_task *)((char *)batch[i] - offsetof(weft_task, timer));
		trace_wake(t, true);
		atomic_store_explicit(&t->wait.state, (uint32_t)-ETIMEDOUT, memory_order_release);
		tasks[i] = t;
	}
	struct worker *w = worker_self(); /* timers fire on workers only */
	atomic_store_explicit(&w->wakes, atomic_load_explicit(&w->wakes, memory_order_relaxed) + n,
			      memory_order_relaxed);
	sched_ready_batch(tasks, n);
}

int wait_expire(struct timer_wheel *h, int64_t now, bool try)
{
	return timer_expire(h, now, try, timer_claim, timer_fire);
}
