/*
 * task.c - the life of a task: spawn, run, exit, join, cancel, sleep; weft_execute.
 *
 * A task's record sits at the top of its own stack slot (stack.c), so spawning takes a slot
 * from the worker's cache, writes the record and the first frame, and queues the task: no
 * allocation, no lock. A joinable task's slot is released by weft_join once the task is off
 * its CPU; a detached task's by the context that switches in after it exits.
 *
 * Handles. Slots are reused, so a handle kept after its task was joined (or after a detached
 * task ended) would name whatever task took the slot next. Each record therefore keeps `ref`,
 * a generation bumped whenever its slot is freed, and a handle carries the generation it was
 * made at (task.h: in the address bits a record leaves zero). A call on a handle whose
 * generation is not the record's returns -ESRCH. Checking is not enough for a caller that then
 * acts on the record while its task may end and the slot be taken over (weft_cancel of a
 * detached task): such callers pin the record, a count in the same word, and a release that
 * finds pins marks the record RELEASING instead and leaves the freeing to the last unpin.
 * Pins are held for a few instructions, never across a wait. weft_join takes none: only the
 * joiner frees a joinable task, and `ref` also says whether the task is detached, so a join
 * reads nothing else of a record that may be freed under it (two callers joining one task at
 * once remain a misuse, as with pthread_join). The generation has TASK_GEN_BITS
 * (22) bits: a handle is taken for a live one only if its slot was reused a multiple of 2^22
 * times since. Rejected: handles as indexes into a table of (slot, generation) pairs, which
 * would cost a lookup in every call and a table to grow; a reference count that keeps the slot
 * until every handle is dropped, which C handles cannot tell us.
 */
#define _GNU_SOURCE
#include "task.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "group.h"
#include "sanitizer.h"
#include "sched.h"
#include "trace.h"
#include "weft.h"

weft_task *task_prepare(struct worker *w, void (*fn)(void *), void *arg,
			const struct weft_spawn_opts *opts, void *spawned_at)
{
	struct stack *s = stack_get(&w->stacks, opts ? opts->stack_size : 0);
	if (!s)
		return NULL;
	weft_task *t = (weft_task *)s;
	/* Not ref: stale handles may be reading it (see "Handles"). */
	memset(&t->cancelled, 0, sizeof *t - offsetof(weft_task, cancelled));
	t->fn = fn;
	t->arg = arg;
	t->id = sched_new_id(w);
	t->wait.task = t;
	t->timer.idx = -1;
	t->limit = WEFT_FOREVER;
	t->detached = opts && opts->detached;
	/* The slot is free: no pin can be taken on it, since every handle to it is stale. */
	uint32_t ref = atomic_load_explicit(&t->ref, memory_order_relaxed);
	atomic_store_explicit(&t->ref, (ref & ~(TASK_PINS | TASK_RELEASING | TASK_DETACHED)) |
						(t->detached ? TASK_DETACHED : 0),
			      memory_order_relaxed);
	t->spawned_at = spawned_at;
	const char *name = opts && opts->name ? opts->name : "task";
	size_t len = strnlen(name, sizeof t->name - 1);
	memcpy(t->name, name, len); /* the record was zeroed: the name ends there */
	ctx_init(&t->ctx, s->lo, s->size, task_main, t);
#ifdef WEFT_TSAN
	t->tsan_fiber = __tsan_create_fiber(0);
#endif
	return t;
}

void task_start(weft_task *t)
{
	struct worker *w = worker_self();
	counter_inc(&w->spawned);
	trace_spawn(t);
	sched_ready_tail(t);
}

void task_discard(weft_task *t)
{
	task_release(t);
}

weft_task *task_spawn(struct worker *w, void (*fn)(void *), void *arg,
		      const struct weft_spawn_opts *opts, void *spawned_at)
{
	weft_task *t = task_prepare(w, fn, arg, opts, spawned_at);
	if (!t)
		return NULL;
	weft_task *h = task_handle(t); /* before it may run, end and free the slot */
	task_start(t);
	return h;
}

static weft_task *spawn_checked(void (*fn)(void *), void *arg, const weft_spawn_opts *opts,
				void *spawned_at)
{
	struct worker *w = worker_self();
	if (!fn || !w || (opts && opts->stack_size && opts->stack_size < WEFT_STACK_MIN)) {
		errno = EINVAL;
		return NULL;
	}
	return task_spawn(w, fn, arg, opts, spawned_at);
}

weft_task *weft_spawn_opt(void (*fn)(void *), void *arg, const weft_spawn_opts *opts)
{
	return spawn_checked(fn, arg, opts, __builtin_return_address(0));
}

weft_task *weft_spawn(void (*fn)(void *), void *arg)
{
	return spawn_checked(fn, arg, NULL, __builtin_return_address(0));
}

static void task_exit(weft_task *t, int result)
{
	/* Unlocked: only t adds to its list, others only take from it (weft_group_free). */
	if (__atomic_load_n(&t->groups, __ATOMIC_RELAXED))
		group_disown(t);
	if (t->member)
		group_leave(t, result);
	else if (!t->detached) {
		spin_lock(&t->join_lock);
		t->done = true;
		if (t->joiner) /* it takes itself out of the slot (see "Joiners" below) */
			wait_wake(t->joiner, 0);
		spin_unlock(&t->join_lock);
	}
	sched_exit();
}

void task_main(void *p)
{
	weft_task *t = p;
	sched_finish_switch();
	int result = 0;
	if (t->member)
		result = t->member_fn(t->arg);
	else
		t->fn(t->arg);
	task_exit(t, result);
}

/* ---- handles (see the top of this file) ---------------------------------------------- */

static uint32_t next_generation(uint32_t ref)
{
	return ((ref >> TASK_GEN_SHIFT) + 1) << TASK_GEN_SHIFT;
}

static void slot_free(weft_task *t)
{
#ifdef WEFT_TSAN
	__tsan_destroy_fiber(t->tsan_fiber);
#endif
	struct worker *w = worker_self();
	stack_put(w ? &w->stacks : NULL, &t->stk);
}

/* Free t's slot, or leave that to the last pin. */
void task_release(weft_task *t)
{
	uint32_t r = atomic_load_explicit(&t->ref, memory_order_relaxed), next;
	do
		next = r & TASK_PINS ? r | TASK_RELEASING : next_generation(r);
	while (!atomic_compare_exchange_weak_explicit(&t->ref, &r, next, memory_order_acq_rel,
						      memory_order_relaxed));
	if (!(r & TASK_PINS))
		slot_free(t);
}

weft_task *task_pin(const weft_task *h)
{
	uint32_t gen;
	weft_task *t = task_record(h, &gen);
	uint32_t r = atomic_load_explicit(&t->ref, memory_order_relaxed);
	for (;;) {
		if (task_gen(r) != gen || (r & TASK_RELEASING))
			return NULL;
		if ((r & TASK_PINS) == TASK_PINS) { /* hundreds of callers at once: wait for one */
			cpu_relax();
			r = atomic_load_explicit(&t->ref, memory_order_relaxed);
			continue;
		}
		if (atomic_compare_exchange_weak_explicit(&t->ref, &r, r + 1, memory_order_acquire,
							  memory_order_relaxed))
			return t;
	}
}

void task_unpin(weft_task *t)
{
	uint32_t r = atomic_fetch_sub_explicit(&t->ref, 1, memory_order_acq_rel);
	if ((r & TASK_PINS) == 1 && (r & TASK_RELEASING)) { /* its release waited for us */
		atomic_store_explicit(&t->ref, next_generation(r), memory_order_release);
		slot_free(t);
	}
}

/* ---- join and cancel --------------------------------------------------------------------- */

/*
 * Joiners. The `joiner` slot holds the wait of the one caller joining t: a weft_join, or a
 * weft_select with t in a case (select.c). The exiting task wakes it but leaves it in the slot,
 * and the joiner takes itself out: so a slot that is taken says "someone is joining t" until
 * that caller has decided, and a second caller (weft_join or select alike) gets -EBUSY
 * rather than joining and freeing a task that the first is about to look at. A select whose
 * join case lost leaves t joinable.
 */
static int join_check(const weft_task *h, weft_task **rec)
{
	if (!h)
		return -EINVAL;
	uint32_t gen;
	weft_task *t = task_record(h, &gen);
	uint32_t ref = atomic_load_explicit(&t->ref, memory_order_acquire);
	if (task_gen(ref) != gen || (ref & TASK_RELEASING))
		return -ESRCH;
	struct worker *self = worker_self();
	if ((ref & TASK_DETACHED) || (self && t == self->cur))
		return -EINVAL;
	*rec = t;
	return 0;
}

/* t has exited and is ours: free it once it is off its stack. */
static void join_release(weft_task *t)
{
	/* It has exited but may still be switching away from its stack. */
	while (atomic_load_explicit(&t->on_cpu, memory_order_acquire))
		cpu_relax();
	task_release(t);
}

int weft_join_until(weft_task *h, int64_t deadline)
{
	weft_task *t;
	int r = join_check(h, &t);
	if (r)
		return r;
	spin_lock(&t->join_lock);
	if (t->joined) { /* another caller joined it meanwhile: gone, or about to be */
		spin_unlock(&t->join_lock);
		return -ESRCH;
	}
	if (t->joiner) { /* another caller is joining it: a state, not a wrong argument */
		spin_unlock(&t->join_lock);
		return -EBUSY;
	}
	if (!t->done) {
		struct wait *w = wait_begin("join", t);
		t->joiner = w;
		spin_unlock(&t->join_lock);
		r = wait_park(w, deadline);
		/* The exiting task claims the wait under join_lock, so once we hold it nobody
		 * touches w any more; the slot is ours to clear. */
		spin_lock(&t->join_lock);
		t->joiner = NULL;
		if (r < 0) { /* timed out or cancelled: t stays joinable */
			spin_unlock(&t->join_lock);
			return r;
		}
	}
	t->joined = true;
	spin_unlock(&t->join_lock);
	join_release(t);
	return 0;
}

int task_join_enter(const weft_task *h, struct wait *w, weft_task **rec)
{
	weft_task *t;
	int r = join_check(h, &t);
	if (r)
		return r;
	/* Pinned while we look: a caller joining t at the same time (a misuse) cannot free the
	 * slot under us. Once w holds the slot, nobody else frees t. */
	if (!(t = task_pin(h)))
		return -ESRCH;
	spin_lock(&t->join_lock);
	if (t->joined)
		r = -ESRCH;
	else if (t->joiner)
		r = t->joiner == w ? -EINVAL : -EBUSY; /* ours: the task is in two cases */
	else
		t->joiner = w;
	spin_unlock(&t->join_lock);
	task_unpin(t);
	*rec = t;
	return r;
}

bool task_join_ready(weft_task *t)
{
	spin_lock(&t->join_lock);
	bool done = t->done;
	spin_unlock(&t->join_lock);
	return done;
}

void task_join_leave(weft_task *t, bool take)
{
	spin_lock(&t->join_lock);
	t->joiner = NULL;
	if (take)
		t->joined = true;
	spin_unlock(&t->join_lock);
	if (take)
		join_release(t);
}

int weft_join(weft_task *t)
{
	return weft_join_until(t, WEFT_FOREVER);
}

int weft_cancel(weft_task *h)
{
	if (!h)
		return -EINVAL;
	weft_task *t = task_pin(h);
	if (!t)
		return -ESRCH;
	group_cancel_task(t);
	task_unpin(t);
	return 0;
}

int weft_cancelled(void)
{
	struct worker *w = worker_self();
	weft_task *t = w ? w->cur : NULL;
	if (!t)
		return 0;
	if (atomic_load(&t->cancelled))
		return 1;
	if (t->limit != WEFT_FOREVER && weft_now() >= t->limit) { /* its group's deadline */
		atomic_store(&t->cancelled, 1);
		return 1;
	}
	return 0;
}

uint64_t weft_task_id(const weft_task *h)
{
	weft_task *t = h ? task_pin(h) : NULL;
	if (!t)
		return 0;
	uint64_t id = t->id;
	task_unpin(t);
	return id;
}

const char *weft_task_name(const weft_task *h)
{
	weft_task *t = h ? task_pin(h) : NULL;
	if (!t)
		return "";
	task_unpin(t); /* the name stays in the record until the task is joined */
	return t->name;
}

int weft_sleep_until(int64_t deadline)
{
	if (!weft_self()) {
		struct timespec ts = { deadline / 1000000000, deadline % 1000000000 };
		while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
			;
		return 0;
	}
	int r = wait_sleep(wait_begin("sleep", NULL), deadline);
	return r == -ETIMEDOUT ? 0 : r;
}

int weft_sleep(int64_t ns)
{
	int64_t now = weft_now();
	return weft_sleep_until(ns <= 0 ? 0 : ns > WEFT_FOREVER - now ? WEFT_FOREVER : now + ns);
}

/* ---- weft_execute: n tasks of one function, and wait for all --------------------------- */

struct execution {
	void (*fn)(void *);
	void *arg;
	spinlock lock;      /* guards left and waiter: the last task wakes the caller under it */
	int left;
	struct wait *waiter;
};

static void execute_one(void *p)
{
	struct execution *e = p;
	e->fn(e->arg);
	spin_lock(&e->lock);
	if (--e->left == 0 && e->waiter)
		wait_wake(e->waiter, 0);
	spin_unlock(&e->lock);
}

/* Not cancellable: the tasks use `e`, which lives on this stack until all are done. */
static void execute_wait(struct execution *e)
{
	for (;;) {
		spin_lock(&e->lock);
		if (e->left == 0) {
			spin_unlock(&e->lock);
			return;
		}
		e->waiter = wait_begin_nocancel("execute", e);
		spin_unlock(&e->lock);
		wait_park(e->waiter, WEFT_FOREVER);
		spin_lock(&e->lock);
		e->waiter = NULL;
		spin_unlock(&e->lock);
	}
}

struct execute_args {
	int n;
	void (*fn)(void *);
	void *arg;
};

static int execute_main(void *p)
{
	struct execute_args *a = p;
	return weft_execute(a->n, a->fn, a->arg);
}

int weft_execute(int n, void (*fn)(void *), void *arg)
{
	if (n <= 0 || !fn)
		return -EINVAL;
	if (!weft_self()) /* from plain code: run the whole thing under weft_run */
		return weft_run(execute_main, &(struct execute_args){ n, fn, arg });
	struct execution e = { .fn = fn, .arg = arg, .left = n };
	weft_spawn_opts o = { .name = "execute", .detached = 1 };
	int err = 0;
	for (int i = 0; i < n; i++) {
		if (!weft_spawn_opt(execute_one, &e, &o)) {
			err = -errno;
			spin_lock(&e.lock);
			e.left -= n - i;
			spin_unlock(&e.lock);
			break;
		}
	}
	execute_wait(&e);
	return err;
}
