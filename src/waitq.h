/*
 * waitq.h - weft's one queue of waiters: an intrusive doubly linked list whose nodes live on
 * the waiters' own stacks, guarded by its owner's lock. Channels (chan.c: a sendq and a recvq),
 * weft_mutex (mutex.c), the synchronisation primitives (syncq.h) and the observers of an fd
 * (poll.c) all queue their waiters on it.
 *
 * A waiter's node type starts with a struct waitq_link (`link`, at offset 0, which each user
 * checks with a _Static_assert), so a link converts to its node by a cast. The queue's two ends
 * live wherever their owner keeps them, as void pointers (weft.h's struct weft_waitq, or
 * weft_mutex's _head and _tail: public structs cannot name struct waitq_link); struct waitq
 * points at them, and costs nothing once these functions are inlined.
 *
 * Invariants, while the owner's lock is held:
 *   - first == NULL exactly when last == NULL (empty);
 *   - first->prev == NULL, last->next == NULL, and along the list x->next->prev == x;
 *   - a node taken off by waitq_remove points to itself both ways, which a linked node never
 *     does: waitq_linked() says whether a node that was once pushed is still queued.
 *     waitq_pop_front_unmarked, as its name says, leaves that mark to its caller
 *     (waitq_mark_off): a channel's waker, which pops at
 *     every hand-off, knows its nodes' state by their `queued` flag and would pay two stores
 *     for nothing; syncq.h, whose leaving waiters ask waitq_linked, marks what it pops. (A
 *     node never pushed carries no mark, nor does one whose link was reused after it was taken
 *     off, as a chain of claimed waiters reuses it in syncq.h and chan.c.)
 * `first` is stored atomically (relaxed), so that a look without the lock - weft_cond_signal's
 * "anyone waiting?" (waitq_maybe_empty) - is a race the program tolerates, not a data race.
 * Everything else is read and written under the lock only.
 *
 * The queue does not claim or wake anyone: who may be taken off, and when a node's memory may
 * go, is its user's protocol (the claim of wait.h; see chan.c, mutex.c, syncq.h, poll.c).
 * Rejected: a singly linked list (a waiter leaving on its deadline must unlink itself from the
 * middle in O(1)); a circular list with a sentinel (the ends sit in public structs that are
 * copied by value, as WEFT_MUTEX_INIT and friends are, so no node may point back at them).
 */
#ifndef WEFT_WAITQ_H
#define WEFT_WAITQ_H

#include <stdbool.h>
#include <stddef.h>

struct waitq_link {
	struct waitq_link *next, *prev;
};

/* Where a queue's ends are kept. */
struct waitq {
	void **first, **last;
};

/* The queue whose ends are (ends)->_first and _last (a struct weft_waitq). */
#define WAITQ_OF(ends) ((struct waitq){ &(ends)->_first, &(ends)->_last })

static inline struct waitq_link *waitq_first(struct waitq q)
{
	return (struct waitq_link *)*q.first;
}

static inline bool waitq_empty(struct waitq q)
{
	return *q.first == NULL;
}

/* Without the lock: true may already be stale, as may false. */
static inline bool waitq_maybe_empty(struct waitq q)
{
	return __atomic_load_n(q.first, __ATOMIC_RELAXED) == NULL;
}

static inline void waitq_set_first(struct waitq q, struct waitq_link *n)
{
	__atomic_store_n(q.first, (void *)n, __ATOMIC_RELAXED);
}

static inline void waitq_push_back(struct waitq q, struct waitq_link *n)
{
	struct waitq_link *tail = (struct waitq_link *)*q.last;
	n->next = NULL;
	n->prev = tail;
	if (tail)
		tail->next = n;
	else
		waitq_set_first(q, n);
	*q.last = n;
}

static inline void waitq_push_front(struct waitq q, struct waitq_link *n)
{
	struct waitq_link *head = waitq_first(q);
	n->prev = NULL;
	n->next = head;
	if (head)
		head->prev = n;
	else
		*q.last = n;
	waitq_set_first(q, n);
}

/* Take n, which is queued on q, off it. */
static inline void waitq_remove(struct waitq q, struct waitq_link *n)
{
	if (n->prev)
		n->prev->next = n->next;
	else
		waitq_set_first(q, n->next);
	if (n->next)
		n->next->prev = n->prev;
	else
		*q.last = n->prev;
	n->next = n->prev = n;
}

/* Take the first node off q and return it; NULL when q is empty. Its links are left as they
 * were: see waitq_mark_off. */
static inline struct waitq_link *waitq_pop_front_unmarked(struct waitq q)
{
	struct waitq_link *n = waitq_first(q);
	if (!n)
		return NULL;
	struct waitq_link *next = n->next;
	waitq_set_first(q, next);
	if (next)
		next->prev = NULL;
	else
		*q.last = NULL;
	return n;
}

/* Mark n, taken off its queue, as waitq_remove does: waitq_linked(n) is false from now on. */
static inline void waitq_mark_off(struct waitq_link *n)
{
	n->next = n->prev = n;
}

/* Whether n, pushed once, is still queued. */
static inline bool waitq_linked(const struct waitq_link *n)
{
	return n->next != n;
}
#endif
