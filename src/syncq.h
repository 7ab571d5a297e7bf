/*
 * syncq.h - what the synchronisation primitives (sync.c, cond.c, rwlock.c, group.c) share:
 * the lock of spin.h, the queue of waitq.h used as a FIFO, and the park/grant steps of wait.h
 * written once. Internal to weft. (weft_mutex, which is built for contention, has a protocol
 * of its own on the same lock and queue: mutex.c.)
 *
 * The pattern, for a primitive P guarded by P->_lock with a queue P->_q:
 *
 *   waiter:  spin_lock(&P->_lock);
 *            if (it can go on) { ...; spin_unlock(&P->_lock); return 0; }
 *            struct sync_waiter n = { 0 };
 *            r = syncq_wait(&P->_lock, &P->_q, &n, "what", P, deadline, cancellable);
 *            -- r == 0: granted, P->_lock NOT held; the granter already did the bookkeeping
 *            -- r < 0:  -ETIMEDOUT/-ECANCELED/-ENOMEM, n unlinked, P->_lock held: undo, unlock
 *
 *   granter: spin_lock(&P->_lock);
 *            n = syncq_claim(&P->_q);      -- first waiter still waiting, unlinked and claimed
 *            ...bookkeeping for it...;  spin_unlock(&P->_lock);
 *            syncq_finish(n);              -- it resumes with 0
 *
 * Every wake-up is a grant: a waiter resumed with 0 has got what it waited for, so there are
 * no spurious wake-ups and nothing to re-check. A grant and a deadline (or weft_cancel) race
 * for the claim of wait.h and exactly one wins: a waiter whose claim was lost to its deadline
 * is skipped (and unlinked) by the granter, which then grants the next one, so nothing granted
 * is ever lost. A claimed waiter cannot return before it is finished, so its node stays valid
 * until syncq_finish; the granter touches no node after that.
 */
#ifndef WEFT_SYNCQ_H
#define WEFT_SYNCQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "spin.h"
#include "wait.h"
#include "waitq.h"
#include "weft.h"

/* Debug builds check misuse (destroying a primitive that has waiters, ...). On unless NDEBUG;
 * -DWEFT_DEBUG forces it on. */
#if !defined(NDEBUG) && !defined(WEFT_DEBUG)
#define WEFT_DEBUG 1
#endif

struct sync_waiter {
	union {
		struct waitq_link link;    /* while queued (waitq.h) */
		struct sync_waiter *next;  /* once claimed: the chain syncq_claim_all returns (a
					    * claimed waiter resumes with 0, so nobody asks
					    * syncq_linked of it afterwards) */
	};
	struct wait *w;
	uintptr_t want;   /* what it waits for, per primitive (rwlock: reader/writer; barrier: round) */
};
_Static_assert(offsetof(struct sync_waiter, link) == 0, "waitq.h: the link comes first");

/* ---- the queue (guarded by the primitive's lock) ----------------------------------------- */

static inline bool syncq_empty(struct weft_waitq *q)
{
	return waitq_empty(WAITQ_OF(q));
}

static inline void syncq_push(struct weft_waitq *q, struct sync_waiter *n)
{
	waitq_push_back(WAITQ_OF(q), &n->link);
}

static inline void syncq_remove(struct weft_waitq *q, struct sync_waiter *n)
{
	waitq_remove(WAITQ_OF(q), &n->link);
}

static inline bool syncq_linked(const struct sync_waiter *n)
{
	return waitq_linked(&n->link);
}

/* The first waiter still waiting, unlinked and claimed; NULL when there is none. Waiters that
 * lost their claim to a deadline or a cancel are unlinked on the way (they are leaving). */
static inline struct sync_waiter *syncq_claim(struct weft_waitq *q)
{
	struct sync_waiter *n;
	while ((n = (struct sync_waiter *)waitq_pop_front_unmarked(WAITQ_OF(q)))) {
		waitq_mark_off(&n->link); /* a waiter that lost its claim asks syncq_linked */
		if (wait_claim(n->w))
			return n;
	}
	return NULL;
}

/* Claim every waiter; returns them chained through `next` (NULL-terminated), count in *n. */
static inline struct sync_waiter *syncq_claim_all(struct weft_waitq *q, unsigned *count)
{
	struct sync_waiter *chain = NULL, **tail = &chain, *n;
	*count = 0;
	while ((n = syncq_claim(q))) {
		*tail = n;
		tail = &n->next;
		++*count;
	}
	*tail = NULL;
	return chain;
}

/* Resume a claimed waiter (after the primitive's lock is released). */
static inline void syncq_finish(struct sync_waiter *n)
{
	if (n)
		wait_finish(n->w, 0);
}

/* Resume a chain from syncq_claim_all. Reads each link before waking its node: a node is gone
 * the moment its waiter runs. */
static inline void syncq_finish_all(struct sync_waiter *n)
{
	while (n) {
		struct sync_waiter *next = n->next;
		wait_finish(n->w, 0);
		n = next;
	}
}

/* Called with *lock held, having decided to wait: queue n, park until granted, the deadline or
 * a cancel. 0: granted, *lock released. <0: n unlinked, *lock held. */
static inline int syncq_wait(spinlock *lock, struct weft_waitq *q, struct sync_waiter *n,
			     const char *reason, const void *obj, int64_t deadline, bool cancellable)
{
	n->w = cancellable ? wait_begin(reason, obj) : wait_begin_nocancel(reason, obj);
	syncq_push(q, n);
	spin_unlock(lock);
	int r = wait_park(n->w, deadline);
	if (r == 0)
		return 0;
	spin_lock(lock);
	if (syncq_linked(n))
		syncq_remove(q, n);
	return r;
}

static inline bool deadline_passed(int64_t deadline)
{
	return deadline != WEFT_FOREVER && deadline <= weft_now();
}

/* A misuse that debug builds catch: "weft: <what> (<object>)" on stderr, then abort. */
__attribute__((noreturn, cold)) static inline void sync_misuse(const char *what, const void *obj)
{
	char msg[200];
	int n = snprintf(msg, sizeof msg, "weft: %s (%p)\n", what, obj);
	if (write(2, msg, (size_t)n) < 0) {
	}
	abort();
}
/* Debug builds: abort with "weft: <what>" if q still has waiters (destroying a busy object). */
static inline void syncq_check_idle(spinlock *lock, struct weft_waitq *q, const char *what,
				    const void *obj)
{
#ifdef WEFT_DEBUG
	spin_lock(lock);
	bool waiters = !syncq_empty(q);
	spin_unlock(lock);
	if (waiters)
		sync_misuse(what, obj);
#else
	(void)lock, (void)q, (void)what, (void)obj;
#endif
}
/* How weft_mutex_unlock releases (mutex.c): 0 with a fence, 1 by plain store (membarrier on
 * the waiters' side), 2 the tests' model of a reordered release. */
int mutex_release_kind(void);

#endif
