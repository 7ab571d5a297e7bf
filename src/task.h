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

/* The record, in five cache lines: the first four are what a park, a wake-up and a switch
 * touch; the fifth is for group members and the sanitizers. */
struct weft_task {
	struct stack stk;          /* first: stack.c finds the record through it */
	_Atomic uint32_t ref;      /* generation and pins of the handles (task.c, "Handles"):
				    * outlives the task, so task_spawn leaves it alone */
	atomic_int cancelled;      /* first field task_spawn clears */
	weft_ctx ctx;
	weft_task *link;           /* in a worker's inbox (sched.c) */
	atomic_int on_cpu;         /* set while some worker runs on this stack */
	atomic_int state;          /* enum task_state; see task_state() */
	struct wait wait;          /* the one wait record the task parks on */
	struct timer timer;        /* deadline of its current timed wait */
	union {
		void (*fn)(void *);
		int (*member_fn)(void *); /* a group member's (group.c) */
	};
	void *arg;
	uint64_t id;
	spinlock join_lock;        /* guards done, joined, joiner and groups */
	bool detached;
	bool done;                 /* it has exited */
	bool joined;               /* a joiner has taken it and will release it */
	bool member;               /* it belongs to `group` (group.c) */
	struct wait *joiner;
	int64_t parked_at;         /* coarse time of its last park (dumps) */
	int64_t limit;             /* its group's deadline: cancelled from then on (wait.c) */
	struct weft_group *groups; /* the groups it owns (group.c); written under join_lock */
	void *spawned_at;          /* return address in the code that spawned it (dumps) */
	char name[32];
	struct weft_group *group;  /* the group it is a member of, and its links there */
	weft_task *group_next, *group_prev;
	void *asan_fake_stack;     /* sanitizer.h: ASan's saved fake stack */
	void *tsan_fiber;          /* sanitizer.h: TSan's fiber */
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
/* weft_spawn_opt on worker w (no argument checks): the new task's handle (see task_handle). */
weft_task *task_spawn(struct worker *w, void (*fn)(void *), void *arg,
		      const struct weft_spawn_opts *opts, void *spawned_at);
/* The first half of task_spawn: a task ready to start but not yet runnable, its record (not
 * a handle), or NULL with errno ENOMEM. The caller finishes it with task_start, or gives it up
 * with task_discard. */
weft_task *task_prepare(struct worker *w, void (*fn)(void *), void *arg,
			const struct weft_spawn_opts *opts, void *spawned_at);
void task_start(weft_task *t);
void task_discard(weft_task *t);
/* Entry point of every task (runs fn, then exits). */
void task_main(void *task);
/* Release a finished task's slot; called once it is off its CPU. The slot is reused once no
 * caller holds a pin on it (task.c, "Handles"). */
void task_release(weft_task *t);

/*
 * A handle (what weft_spawn and weft_self return) is the record's address with the low
 * TASK_GEN_BITS of the slot's generation in bits the address leaves zero: the record is 64-byte
 * aligned (6 bits) and below 2^48 (16 bits), as every mmap without an address hint is on the
 * 64-bit Linux targets. On a 32-bit target only the 6 low bits carry it.
 */
#if UINTPTR_MAX > 0xffffffffu
#define TASK_GEN_BITS 22
#else
#define TASK_GEN_BITS 6
#endif
#define TASK_PINS 0xffu          /* ref: pins held by callers acting on a handle */
#define TASK_DETACHED 0x100u     /* ref: the task is detached (readable by stale handles) */
#define TASK_RELEASING 0x200u    /* ref: released while pinned; the last unpin frees it */
#define TASK_GEN_SHIFT 10        /* ref: the generation, bumped whenever the slot is freed */

static inline uint32_t task_gen(uint32_t ref)
{
	return (ref >> TASK_GEN_SHIFT) & ((1u << TASK_GEN_BITS) - 1);
}

static inline weft_task *task_handle(weft_task *t)
{
	uintptr_t g = task_gen(atomic_load_explicit(&t->ref, memory_order_relaxed));
	uintptr_t h = (uintptr_t)t | (g & 63);
#if UINTPTR_MAX > 0xffffffffu
	h |= (g >> 6) << 48;
#endif
	return (weft_task *)h;
}

/* The record a handle names, and the generation it carries. */
static inline weft_task *task_record(const weft_task *h, uint32_t *gen)
{
	uintptr_t v = (uintptr_t)h;
	uintptr_t g = v & 63;
#if UINTPTR_MAX > 0xffffffffu
	g |= (v >> 48) << 6;
	v &= ((uintptr_t)1 << 48) - 1;
#endif
	*gen = (uint32_t)g;
	return (weft_task *)(v & ~(uintptr_t)63);
}

/* A join case of weft_select (select.c; task.c, "Joiners"). task_join_enter takes h's joiner
 * slot for w: 0, *rec set to its record; -ESRCH (gone), -EINVAL (detached, or the caller
 * itself) or -EBUSY (another caller is joining it). While the slot is held, the task's exit
 * wakes w (if it is parked then) and nobody else joins or frees the task. task_join_ready:
 * whether it has exited. task_join_leave gives the slot back; with `take` (it has exited), the
 * caller has joined it and it is released. */
int task_join_enter(const weft_task *h, struct wait *w, weft_task **rec);
bool task_join_ready(weft_task *t);
void task_join_leave(weft_task *t, bool take);

/* The record h names, pinned: it is not freed (nor its slot reused) until task_unpin. NULL when
 * h's task is gone: its slot was freed since h was made. */
weft_task *task_pin(const weft_task *h);
void task_unpin(weft_task *t);
#endif
