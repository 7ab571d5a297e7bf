/*
 * group.c - task groups (weft_group_*): tasks spawned into a group, waited for together,
 * cancelled together, the first failure kept; groups owned by the task that made them, so
 * that cancelling a task cancels what it started; deadlines that members inherit.
 *
 * A group is a lock word and a few fields: its live members in a list linked through their
 * records (group_next, group_prev), their count, the first error, a cancelled flag, the
 * deadline, its owner (the record of the task that made it) with its place in the owner's list
 * (t->groups), and a FIFO of waiters (syncq.h, whose every wake-up is a grant: the last member
 * to end hands each waiter the group's error). Members are detached tasks whose function
 * returns int; task_main passes the result to group_leave.
 *
 * Invariants:
 *  - A record on a group's member list is alive: a member unlinks itself, under the group's
 *    lock, before it exits. So whoever holds g->lock may touch every member.
 *  - A group lives while it has members or waiters (weft_group_free aborts otherwise), and a
 *    member's last access to it is its unlock after counting itself out.
 *  - g->owner, while set, is alive: a task disowns its groups, under its join_lock and then
 *    each group's lock, before it exits.
 *  - Locks are taken top-down: a task's join_lock, then the locks of the groups it owns, then
 *    the join_locks of their members, and so on. The one path upwards (weft_group_free
 *    unlinking g from its owner while holding g->lock) only tries the owner's lock, and lets
 *    go of g->lock and tries again when it is taken.
 *
 * Cancelling a tree (weft_cancel of a task, weft_group_cancel, a member's failure): every task
 * below gets its `cancelled` flag and, when parked, its wait claimed, in one walk under those
 * locks. A task found not parked may be just starting a wait, which is the store-then-load
 * race of wait.c: as weft_cancel always did, the canceller then passes the heavy half of the
 * asymmetric fence (asym.h) and claims again; but once for the whole tree (a second walk), not
 * once per task, and with no lock held across the membarrier. A member spawned after the walk
 * finds its group cancelled and is not started; a group made by a task after the walk marked
 * it starts cancelled (weft_group_new reads the flag under the join_lock the walk takes).
 *
 * Deadlines: a member's record carries its group's deadline as `limit`. wait.c ends a
 * cancellable wait that reaches it with -ECANCELED and marks the task cancelled; weft_cancelled
 * compares the clock with it. So nothing runs at the deadline: a parked member wakes through
 * its own timed wait, one that computes sees it at its next blocking call or look at
 * weft_cancelled. A group made by a task takes the earlier of its own deadline and the task's
 * limit, and so on down. Rejected: a timer or a helper task per group that cancels it at the
 * deadline (a task and a wake-up per group, a teardown race with weft_group_free, and the
 * timing wheel files only tasks' own waits); copying the deadline into each blocking call's
 * argument, which would turn the calls' documented -ECANCELED into -ETIMEDOUT (and a sleep's
 * into success).
 *
 * The owner's wait (weft_group_wait by the task that made the group) is not cut short by a
 * cancel: the cancel reaches the members through the owner, and the wait goes on, without
 * cancellation, until they have ended. That is the point of owning: a closer that is cancelled
 * does not return while its workers still run (Trio's nurseries behave the same way).
 * Rejected: returning -ECANCELED at once, which leaves the members running with nobody to wait
 * for them (the bug this was written against).
 */
#define _GNU_SOURCE
#include "group.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "asym.h"
#include "sched.h"
#include "syncq.h"
#include "weft.h"

struct weft_group {
	spinlock lock;             /* guards every field below */
	bool cancelled;
	int error;                 /* the first non-zero result of a member; 0 while none */
	int64_t live;              /* members spawned and not yet ended (read unlocked: len) */
	int64_t deadline;          /* fixed at weft_group_new */
	weft_task *members;        /* live members, through group_next and group_prev */
	weft_task *owner;          /* the record of its maker while that lives; NULL: none */
	weft_group *owned_next, *owned_prev; /* in owner->groups */
	struct weft_waitq waiters;
};

/* ---- cancelling a tree -------------------------------------------------------------------- */

static bool mark_task(weft_task *t);

/* g->lock held. True when some task below was not parked (see mark_task). */
static bool mark_group(weft_group *g)
{
	bool unparked = false;
	g->cancelled = true;
	for (weft_task *m = g->members; m; m = m->group_next)
		unparked |= mark_task(m);
	return unparked;
}

/* Cancel t and everything in the groups it owns. True when some task of the tree was found
 * not parked: its cancel may have crossed the start of a wait (see the top of this file). */
static bool mark_task(weft_task *t)
{
	atomic_store(&t->cancelled, 1);
	bool unparked = !wait_cancel_parked(t);
	spin_lock(&t->join_lock);
	for (weft_group *g = t->groups; g; g = g->owned_next) {
		spin_lock(&g->lock);
		unparked |= mark_group(g);
		spin_unlock(&g->lock);
	}
	spin_unlock(&t->join_lock);
	return unparked;
}

void group_cancel_task(weft_task *t)
{
	if (mark_task(t) && asym_on()) {
		asym_heavy_retry();
		mark_task(t);
	}
}

/* g is alive (the caller is a member, a waiter, or holds it); g->lock is not held. */
static void cancel_group(weft_group *g)
{
	spin_lock(&g->lock);
	if (g->cancelled) { /* marked already: later members are refused */
		spin_unlock(&g->lock);
		return;
	}
	bool unparked = mark_group(g);
	spin_unlock(&g->lock);
	if (unparked && asym_on()) {
		asym_heavy_retry();
		spin_lock(&g->lock);
		mark_group(g);
		spin_unlock(&g->lock);
	}
}

/* ---- a member's life ---------------------------------------------------------------------- */

static void link_member(weft_group *g, weft_task *t)
{
	t->group_prev = NULL;
	t->group_next = g->members;
	if (g->members)
		g->members->group_prev = t;
	g->members = t;
	__atomic_store_n(&g->live, g->live + 1, __ATOMIC_RELAXED);
}

static void unlink_member(weft_group *g, weft_task *t)
{
	if (t->group_prev)
		t->group_prev->group_next = t->group_next;
	else
		g->members = t->group_next;
	if (t->group_next)
		t->group_next->group_prev = t->group_prev;
}

/* g->lock held: count one member out; when it was the last, claim every waiter and hand each
 * the group's error. Returns the chain to finish once the lock is released. */
static struct sync_waiter *count_out(weft_group *g)
{
	__atomic_store_n(&g->live, g->live - 1, __ATOMIC_RELAXED);
	if (g->live)
		return NULL;
	unsigned n;
	struct sync_waiter *all = syncq_claim_all(&g->waiters, &n);
	for (struct sync_waiter *w = all; w; w = w->next)
		w->want = (uintptr_t)(intptr_t)g->error;
	return all;
}

void group_leave(weft_task *t, int result)
{
	weft_group *g = t->group;
	spin_lock(&g->lock);
	unlink_member(g, t);
	bool cancel = result != 0 && g->error == 0 && !g->cancelled;
	if (result != 0 && g->error == 0)
		g->error = result;
	struct sync_waiter *all = NULL;
	if (!cancel)
		all = count_out(g);
	spin_unlock(&g->lock);
	if (cancel) { /* the first failure: still counted in, so g stays alive meanwhile */
		cancel_group(g);
		spin_lock(&g->lock);
		all = count_out(g);
		spin_unlock(&g->lock);
	}
	syncq_finish_all(all);
}

void group_disown(weft_task *t)
{
	spin_lock(&t->join_lock);
	for (weft_group *g = t->groups, *next; g; g = next) {
		next = g->owned_next;
		spin_lock(&g->lock);
		g->owner = NULL;
		g->owned_next = g->owned_prev = NULL;
		spin_unlock(&g->lock);
	}
	__atomic_store_n(&t->groups, NULL, __ATOMIC_RELAXED);
	spin_unlock(&t->join_lock);
}

/* ---- the API ------------------------------------------------------------------------------ */

weft_group *weft_group_new(int64_t deadline)
{
	weft_group *g = calloc(1, sizeof *g);
	if (!g) {
		errno = ENOMEM;
		return NULL;
	}
	g->deadline = deadline;
	struct worker *w = worker_self();
	weft_task *t = w ? w->cur : NULL;
	if (!t)
		return g;
	if (t->limit < g->deadline) /* the maker's own group's deadline comes first */
		g->deadline = t->limit;
	spin_lock(&t->join_lock);
	g->cancelled = atomic_load(&t->cancelled); /* see the top: a walk marks it, or we see it */
	g->owner = t;
	g->owned_next = t->groups;
	if (t->groups)
		t->groups->owned_prev = g;
	__atomic_store_n(&t->groups, g, __ATOMIC_RELAXED);
	spin_unlock(&t->join_lock);
	return g;
}

static int spawn_member(weft_group *g, int (*fn)(void *), void *arg, const weft_spawn_opts *opts,
			void *spawned_at)
{
	struct worker *w = worker_self();
	if (!g || !fn || !w ||
	    (opts && (opts->detached || (opts->stack_size && opts->stack_size < WEFT_STACK_MIN))))
		return -EINVAL;
	if (g->deadline != WEFT_FOREVER && weft_now() >= g->deadline)
		return -ECANCELED;
	weft_spawn_opts o = opts ? *opts : (weft_spawn_opts){ 0 };
	o.detached = 1;
	weft_task *t = task_prepare(w, NULL, arg, &o, spawned_at);
	if (!t)
		return -ENOMEM;
	t->member = true;
	t->member_fn = fn;
	t->group = g;
	t->limit = g->deadline;
	spin_lock(&g->lock);
	if (g->cancelled) {
		spin_unlock(&g->lock);
		task_discard(t);
		return -ECANCELED;
	}
	link_member(g, t);
	spin_unlock(&g->lock);
	task_start(t); /* a cancel walk that found it first has marked it: it starts cancelled */
	return 0;
}

int weft_group_spawn(weft_group *g, int (*fn)(void *), void *arg)
{
	return spawn_member(g, fn, arg, NULL, __builtin_return_address(0));
}

int weft_group_spawn_opt(weft_group *g, int (*fn)(void *), void *arg, const weft_spawn_opts *opts)
{
	return spawn_member(g, fn, arg, opts, __builtin_return_address(0));
}

int weft_group_wait_until(weft_group *g, int64_t deadline)
{
	if (!g)
		return -EINVAL;
	struct worker *w = worker_self();
	weft_task *self = w ? w->cur : NULL;
	bool cancellable = true;
	spin_lock(&g->lock);
	for (;;) {
		if (g->live == 0) {
			int e = g->error;
			spin_unlock(&g->lock);
			return e;
		}
		if (deadline_passed(deadline)) {
			spin_unlock(&g->lock);
			return -ETIMEDOUT;
		}
		struct sync_waiter n = { 0 };
		int r = syncq_wait(&g->lock, &g->waiters, &n, "group", g, deadline, cancellable);
		if (r == 0)
			return (int)(intptr_t)n.want;
		if (r != -ECANCELED || !self || g->owner != self) {
			spin_unlock(&g->lock);
			return r;
		}
		/* The owner is cancelled (or reached its own deadline): so is the group, and the
		 * wait goes on until its members have wound up. */
		cancellable = false;
		spin_unlock(&g->lock);
		cancel_group(g);
		spin_lock(&g->lock);
	}
}

int weft_group_wait(weft_group *g)
{
	return weft_group_wait_until(g, WEFT_FOREVER);
}

int weft_group_cancel(weft_group *g)
{
	if (!g)
		return -EINVAL;
	cancel_group(g);
	return 0;
}

size_t weft_group_len(const weft_group *g)
{
	return g ? (size_t)__atomic_load_n(&g->live, __ATOMIC_RELAXED) : 0;
}

void weft_group_free(weft_group *g)
{
	if (!g)
		return;
	for (;;) {
		spin_lock(&g->lock);
		if (g->live || !syncq_empty(&g->waiters)) {
			long long n = (long long)g->live;
			spin_unlock(&g->lock);
			if (n)
				fprintf(stderr, "weft: weft_group_free on a group with %lld member%s\n",
					n, n == 1 ? "" : "s");
			else
				fprintf(stderr, "weft: weft_group_free on a group with waiters\n");
			abort();
		}
		weft_task *o = g->owner;
		if (!o) {
			spin_unlock(&g->lock);
			break;
		}
		/* Upwards in the lock order: only try (see the top of this file). */
		if (spin_trylock(&o->join_lock)) {
			if (g->owned_prev)
				g->owned_prev->owned_next = g->owned_next;
			else
				__atomic_store_n(&o->groups, g->owned_next, __ATOMIC_RELAXED);
			if (g->owned_next)
				g->owned_next->owned_prev = g->owned_prev;
			spin_unlock(&o->join_lock);
			spin_unlock(&g->lock);
			break;
		}
		spin_unlock(&g->lock);
		cpu_relax();
	}
	free(g);
}
