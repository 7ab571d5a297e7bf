/* task.h - the task record. It lives at the top of the task's own stack slot (stack.c), so a
 * spawn allocates nothing beyond the recycled slot. */
#ifndef WEFT_TASK_H
#define WEFT_TASK_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "context.h"
#include "spin.h"
#include "stack.h"
#include "timer.h"
#include "wait.h"

enum task_state { TASK_RUNNABLE, TASK_RUNNING, TASK_PARKED, TASK_DONE };

struct weft_task {
	struct stack stk;          /* first: stack.c finds the record through it */
	weft_ctx ctx;
	weft_task *link;           /* in a worker's inbox (sched.c) */
	atomic_int on_cpu;         /* set while some worker runs on this stack */
	atomic_int state;          /* enum task_state; see task_state() */
	struct wait wait;          /* the one wait record the task parks on */
	struct timer timer;        /* deadline of its current timed wait */
	void (*fn)(void *);
	void *arg;
	uint64_t id;
	atomic_int cancelled;
	bool detached;
	spinlock join_lock;        /* guards done and joiner */
	bool done;
	struct wait *joiner;
	int64_t parked_at;         /* coarse time of its last park (dumps) */
	void *spawned_at;          /* return address in the code that spawned it (dumps) */
	void *asan_fake_stack;     /* sanitizer.h: ASan's saved fake stack */
	void *tsan_fiber;          /* sanitizer.h: TSan's fiber */
	char name[32];
};

/* A task's state is written by the task, its wakers and its worker; it steers nothing but
 * finish_switch (written and read by one thread there), so relaxed accesses do. */
static inline int task_state(const weft_task *t)
{
	return atomic_load_explicit(&t->state, memory_order_relaxed);
}

static inline void task_set_state(weft_task *t, int s)
{
	atomic_store_explicit(&t->state, s, memory_order_relaxed);
}

struct worker;
struct weft_spawn_opts;
/* weft_spawn_opt on worker w (no argument checks). */
weft_task *task_spawn(struct worker *w, void (*fn)(void *), void *arg,
		      const struct weft_spawn_opts *opts, void *spawned_at);
/* Entry point of every task (runs fn, then exits). */
void task_main(void *task);
/* Release a finished task's slot; called once it is off its CPU. */
void task_release(weft_task *t);
#endif
