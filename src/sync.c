/*
 * sync.c - the counting primitives: semaphore, wait group, once, barrier.
 *
 * Each is a few words guarded by a lock word of its own, with a FIFO of parked waiters
 * (syncq.h). None of them is on anybody's hot path the way weft_mutex is, so each takes the
 * simple road: state changes under the lock, and every wake-up is a grant that has already
 * done the waiter's bookkeeping (the semaphore's unit is handed over, not put back for the
 * woken waiter to race for), so a woken waiter never re-checks and never loops. Waiters are
 * woken after the lock is released, so that a woken task does not spin on the lock its waker
 * still holds.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>

#include "syncq.h"
#include "weft.h"

/* ---- semaphore ---------------------------------------------------------------------------
 * post hands its unit straight to the longest waiter; the count only grows when nobody waits,
 * so a unit cannot be taken by a newcomer from under a waiter that was woken for it. */

int weft_sem_init(weft_sem *s, unsigned int value)
{
	*s = (weft_sem)WEFT_SEM_INIT(value);
	return 0;
}

int weft_sem_trywait(weft_sem *s)
{
	if (__atomic_load_n(&s->_count, __ATOMIC_RELAXED) == 0)
		return -EAGAIN;
	int r = -EAGAIN;
	spin_lock(&s->_lock);
	if (s->_count > 0) {
		__atomic_store_n(&s->_count, s->_count - 1, __ATOMIC_RELAXED);
		r = 0;
	}
	spin_unlock(&s->_lock);
	return r;
}

int weft_sem_wait_until(weft_sem *s, int64_t deadline)
{
	spin_lock(&s->_lock);
	if (s->_count > 0) {
		__atomic_store_n(&s->_count, s->_count - 1, __ATOMIC_RELAXED);
		spin_unlock(&s->_lock);
		return 0;
	}
	if (deadline_passed(deadline)) {
		spin_unlock(&s->_lock);
		return -ETIMEDOUT;
	}
	struct sync_waiter n = { 0 };
	int r = syncq_wait(&s->_lock, &s->_q, &n, "semaphore", s, deadline, true);
	if (r < 0)
		spin_unlock(&s->_lock);
	return r;
}

int weft_sem_wait(weft_sem *s)
{
	return weft_sem_wait_until(s, WEFT_FOREVER);
}

int weft_sem_post(weft_sem *s)
{
	spin_lock(&s->_lock);
	struct sync_waiter *n = syncq_claim(&s->_q);
	if (!n) {
		if (s->_count == UINT_MAX) {
			spin_unlock(&s->_lock);
			return -EOVERFLOW;
		}
		__atomic_store_n(&s->_count, s->_count + 1, __ATOMIC_RELAXED);
	}
	spin_unlock(&s->_lock);
	syncq_finish(n);
	return 0;
}

unsigned int weft_sem_value(weft_sem *s)
{
	return __atomic_load_n(&s->_count, __ATOMIC_RELAXED);
}

void weft_sem_destroy(weft_sem *s)
{
	syncq_check_idle(&s->_lock, &s->_q, "weft_sem_destroy: semaphore has waiters", s);
}

/* ---- wait group --------------------------------------------------------------------------- */

void weft_waitgroup_init(weft_waitgroup *wg)
{
	*wg = (weft_waitgroup)WEFT_WAITGROUP_INIT;
}

int weft_waitgroup_add(weft_waitgroup *wg, int64_t delta)
{
	struct sync_waiter *all = NULL;
	unsigned n;
	spin_lock(&wg->_lock);
	int64_t c = wg->_count + delta;
	if (c < 0) {
		spin_unlock(&wg->_lock);
		sync_misuse("weft_waitgroup_add: negative count", wg);
	}
	wg->_count = c;
	if (c == 0)
		all = syncq_claim_all(&wg->_q, &n);
	spin_unlock(&wg->_lock);
	syncq_finish_all(all);
	return 0;
}

int weft_waitgroup_done(weft_waitgroup *wg)
{
	return weft_waitgroup_add(wg, -1);
}

int weft_waitgroup_wait_until(weft_waitgroup *wg, int64_t deadline)
{
	spin_lock(&wg->_lock);
	if (wg->_count == 0) {
		spin_unlock(&wg->_lock);
		return 0;
	}
	if (deadline_passed(deadline)) {
		spin_unlock(&wg->_lock);
		return -ETIMEDOUT;
	}
	struct sync_waiter n = { 0 };
	int r = syncq_wait(&wg->_lock, &wg->_q, &n, "waitgroup", wg, deadline, true);
	if (r < 0)
		spin_unlock(&wg->_lock);
	return r;
}

int weft_waitgroup_wait(weft_waitgroup *wg)
{
	return weft_waitgroup_wait_until(wg, WEFT_FOREVER);
}

/* ---- once ---------------------------------------------------------------------------------
 * The first caller marks it running and runs fn with the lock released; later callers park
 * until it is done. The done state is read with acquire first, so that after the first run a
 * call costs one load. */

enum { ONCE_NEW, ONCE_RUNNING, ONCE_DONE };

/* Who runs fn: the task, or for a plain thread the address of a thread-local. */
static const void *me(void)
{
	static __thread char thread_id;
	weft_task *t = weft_self();
	return t ? (const void *)t : (const void *)&thread_id;
}

int weft_call_once(weft_once *o, void (*fn)(void *), void *arg)
{
	if (__atomic_load_n(&o->_state, __ATOMIC_ACQUIRE) == ONCE_DONE)
		return 0;
	spin_lock(&o->_lock);
	if (o->_state == ONCE_NEW) {
		o->_state = ONCE_RUNNING;
		o->_runner = me();
		spin_unlock(&o->_lock);
		fn(arg);
		unsigned n;
		spin_lock(&o->_lock);
		__atomic_store_n(&o->_state, ONCE_DONE, __ATOMIC_RELEASE);
		struct sync_waiter *all = syncq_claim_all(&o->_q, &n);
		spin_unlock(&o->_lock);
		syncq_finish_all(all);
		return 0;
	}
	if (o->_state == ONCE_DONE) {
		spin_unlock(&o->_lock);
		return 0;
	}
#ifdef WEFT_DEBUG
	if (o->_runner == me()) {
		spin_unlock(&o->_lock);
		sync_misuse("weft_call_once: called again from inside its own function", o);
	}
#endif
	struct sync_waiter n = { 0 };
	int r = syncq_wait(&o->_lock, &o->_q, &n, "once", o, WEFT_FOREVER, true);
	if (r < 0)
		spin_unlock(&o->_lock);
	return r;
}

/* ---- barrier ------------------------------------------------------------------------------
 * The caller that completes a round starts the next one (arrived back to 0, round + 1) and
 * releases the round's waiters. A waiter that gives up (deadline, cancel) no longer counts,
 * unless its round completed in the meantime: then it has passed, and says so. */

int weft_barrier_init(weft_barrier *b, unsigned int n)
{
	if (n == 0)
		return -EINVAL;
	*b = (weft_barrier)WEFT_BARRIER_INIT(n);
	return 0;
}

int weft_barrier_wait_until(weft_barrier *b, int64_t deadline)
{
	spin_lock(&b->_lock);
	if (++b->_arrived >= b->_n) {
		unsigned n;
		b->_arrived = 0;
		b->_round++;
		struct sync_waiter *all = syncq_claim_all(&b->_q, &n);
		spin_unlock(&b->_lock);
		syncq_finish_all(all);
		return WEFT_BARRIER_LAST;
	}
	unsigned round = b->_round;
	int r = -ETIMEDOUT;
	struct sync_waiter n = { 0 };
	if (!deadline_passed(deadline)) {
		r = syncq_wait(&b->_lock, &b->_q, &n, "barrier", b, deadline, true);
		if (r == 0)
			return 0;
	}
	if (b->_round == round)
		b->_arrived--; /* leaves the round, which has not completed */
	else
		r = 0; /* completed while we were giving up: we passed */
	spin_unlock(&b->_lock);
	return r;
}

int weft_barrier_wait(weft_barrier *b)
{
	return weft_barrier_wait_until(b, WEFT_FOREVER);
}

void weft_barrier_destroy(weft_barrier *b)
{
	syncq_check_idle(&b->_lock, &b->_q, "weft_barrier_destroy: barrier has waiters", b);
}
