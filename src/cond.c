/*
 * cond.c - condition variables for weft_mutex.
 *
 * A waiter queues itself on the condition (under the condition's own lock) before it releases
 * the mutex, so a signal sent after that, with or without the mutex held, finds it: no lost
 * wake-ups. A signal claims the first waiter still waiting and wakes it; a waiter whose
 * deadline or cancel won its claim first is skipped, so the signal goes to the next one and is
 * not wasted. Hence a wait returns 0 only when a signal or broadcast was meant for it: never a
 * spurious wake-up, and k signals wake exactly min(k, waiters) waiters.
 *
 * The woken waiter runs on the signaller's worker (wait_finish puts it in the `next` slot) and
 * takes the mutex again with weft_mutex_lock, whatever ended its wait, so the caller always
 * holds the mutex on return, as with pthread_cond_wait.
 */
#define _GNU_SOURCE
#include <errno.h>

#include "syncq.h"
#include "weft.h"

void weft_cond_init(weft_cond *c)
{
	*c = (weft_cond)WEFT_COND_INIT;
}

int weft_cond_wait_until(weft_cond *c, weft_mutex *m, int64_t deadline)
{
	if (deadline_passed(deadline))
		return -ETIMEDOUT;
	struct sync_waiter n = { 0 };
	spin_lock(&c->_lock);
	n.w = wait_begin("condition", c);
	syncq_push(&c->_q, &n);
	spin_unlock(&c->_lock);
	weft_mutex_unlock(m);
	int r = wait_park(n.w, deadline);
	if (r != 0) { /* deadline or cancel: leave the queue if no signal unlinked us */
		spin_lock(&c->_lock);
		if (syncq_linked(&n))
			syncq_remove(&c->_q, &n);
		spin_unlock(&c->_lock);
	}
	weft_mutex_lock(m);
	return r;
}

int weft_cond_wait(weft_cond *c, weft_mutex *m)
{
	return weft_cond_wait_until(c, m, WEFT_FOREVER);
}

int weft_cond_signal(weft_cond *c)
{
	if (waitq_maybe_empty(WAITQ_OF(&c->_q)))
		return 0; /* nobody queued before this call started (see weft_cond_broadcast) */
	spin_lock(&c->_lock);
	struct sync_waiter *n = syncq_claim(&c->_q);
	spin_unlock(&c->_lock);
	syncq_finish(n);
	return n != NULL;
}

/* The unlocked look at the queue is enough: a waiter that matters queued itself, under the
 * condition's lock, before releasing the mutex under which the signaller changed the state. */
int weft_cond_broadcast(weft_cond *c)
{
	if (waitq_maybe_empty(WAITQ_OF(&c->_q)))
		return 0;
	unsigned k;
	spin_lock(&c->_lock);
	struct sync_waiter *all = syncq_claim_all(&c->_q, &k);
	spin_unlock(&c->_lock);
	syncq_finish_all(all);
	return (int)k;
}

void weft_cond_destroy(weft_cond *c)
{
	syncq_check_idle(&c->_lock, &c->_q, "weft_cond_destroy: condition variable has waiters", c);
}
