/*
 * rwlock.c - reader-writer locks in which neither side starves.
 *
 * State (under the lock word): the number of readers holding it, whether a writer holds it,
 * a queue of waiting readers and one of waiting writers. The rules:
 *
 *  - a reader enters at once if no writer holds the lock and no writer waits; otherwise it
 *    queues, so a stream of readers cannot keep a writer out;
 *  - a writer enters if nobody holds the lock; otherwise it queues;
 *  - when a writer leaves, every reader then waiting enters together, before the next
 *    writer, so a stream of writers cannot keep readers out; if no reader waits, the next
 *    writer enters;
 *  - when the last reader leaves, the next writer enters.
 *
 * Entering is a grant made by whoever leaves (syncq.h): the leaver counts the readers in or
 * marks the writer before waking them, so the state never shows a writer with readers, and a
 * woken waiter owns its hold when it runs. A writer that gives up waiting may have been the
 * only reason readers queued; it lets them in on its way out.
 */
#define _GNU_SOURCE
#include <errno.h>

#include "syncq.h"
#include "weft.h"

enum { READ, WRITE };

void weft_rwlock_init(weft_rwlock *rw)
{
	*rw = (weft_rwlock)WEFT_RWLOCK_INIT;
}

/* Let in whoever may enter now (lock held); returns the chain to wake after unlocking.
 * readers_first: a writer just left, waiting readers go before waiting writers. */
static struct sync_waiter *admit(weft_rwlock *rw, bool readers_first)
{
	unsigned k;
	if (rw->_writer)
		return NULL;
	if (readers_first || syncq_empty(&rw->_wq)) {
		struct sync_waiter *all = syncq_claim_all(&rw->_rq, &k);
		rw->_readers += k;
		if (k)
			return all;
	}
	if (rw->_readers == 0) {
		struct sync_waiter *w = syncq_claim(&rw->_wq);
		if (w) {
			rw->_writer = 1;
			w->next = NULL;
			return w;
		}
	}
	if (syncq_empty(&rw->_wq)) { /* the writers readers queued behind have all given up */
		struct sync_waiter *all = syncq_claim_all(&rw->_rq, &k);
		rw->_readers += k;
		return all;
	}
	return NULL;
}

static int lock_until(weft_rwlock *rw, int kind, int64_t deadline, bool cancellable)
{
	spin_lock(&rw->_lock);
	bool enter = kind == READ ? !rw->_writer && syncq_empty(&rw->_wq)
				  : !rw->_writer && rw->_readers == 0;
	if (enter) {
		if (kind == READ)
			rw->_readers++;
		else
			rw->_writer = 1;
		spin_unlock(&rw->_lock);
		return 0;
	}
	int r = -ETIMEDOUT;
	if (!deadline_passed(deadline)) {
		struct sync_waiter n = { 0 };
		r = syncq_wait(&rw->_lock, kind == READ ? &rw->_rq : &rw->_wq, &n,
			       kind == READ ? "rwlock read" : "rwlock write", rw, deadline, cancellable);
		if (r == 0)
			return 0;
	}
	struct sync_waiter *wake = kind == WRITE ? admit(rw, false) : NULL;
	spin_unlock(&rw->_lock);
	syncq_finish_all(wake);
	return r;
}

int weft_rwlock_rdlock_until(weft_rwlock *rw, int64_t deadline)
{
	return lock_until(rw, READ, deadline, true);
}

int weft_rwlock_wrlock_until(weft_rwlock *rw, int64_t deadline)
{
	return lock_until(rw, WRITE, deadline, true);
}

void weft_rwlock_rdlock(weft_rwlock *rw)
{
	lock_until(rw, READ, WEFT_FOREVER, false);
}

void weft_rwlock_wrlock(weft_rwlock *rw)
{
	lock_until(rw, WRITE, WEFT_FOREVER, false);
}

/* A deadline already past: enter or fail without waiting. */
int weft_rwlock_tryrdlock(weft_rwlock *rw)
{
	return lock_until(rw, READ, 0, false) ? -EAGAIN : 0;
}

int weft_rwlock_trywrlock(weft_rwlock *rw)
{
	return lock_until(rw, WRITE, 0, false) ? -EAGAIN : 0;
}

void weft_rwlock_unlock(weft_rwlock *rw)
{
	struct sync_waiter *wake = NULL;
	spin_lock(&rw->_lock);
	if (rw->_writer) {
		rw->_writer = 0;
		wake = admit(rw, true);
	} else if (rw->_readers > 0) {
		if (--rw->_readers == 0)
			wake = admit(rw, false);
	} else {
		spin_unlock(&rw->_lock);
		sync_misuse("weft_rwlock_unlock: rwlock is not locked", rw);
	}
	spin_unlock(&rw->_lock);
	syncq_finish_all(wake);
}

void weft_rwlock_destroy(weft_rwlock *rw)
{
#ifdef WEFT_DEBUG
	spin_lock(&rw->_lock);
	bool waiters = !syncq_empty(&rw->_rq) || !syncq_empty(&rw->_wq);
	bool held = rw->_writer || rw->_readers;
	spin_unlock(&rw->_lock);
	if (waiters)
		sync_misuse("weft_rwlock_destroy: rwlock has waiters", rw);
	if (held)
		sync_misuse("weft_rwlock_destroy: rwlock is held", rw);
#else
	(void)rw;
#endif
}
