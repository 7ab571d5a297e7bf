/*
 * runq.h - a worker's local run queue: a bounded ring, as in Go's runtime (proc.go runqput,
 * runqget, runqgrab). Only the owner pushes (at tail); the owner and thieves take from head
 * with a CAS, so stealing needs no lock; while no thief is at it, the owner takes without one
 * (runq_pop_alone; see own_begin in sched_state.h). A full ring spills half of itself to the global
 * queue.
 */
#ifndef WEFT_RUNQ_H
#define WEFT_RUNQ_H

#include <stdatomic.h>
#include <stdint.h>

typedef struct weft_task weft_task;

#define RUNQ_SIZE 256

struct runq {
	_Atomic uint32_t head;
	char pad0[60];
	_Atomic uint32_t tail;
	char pad1[60];
	weft_task *_Atomic ring[RUNQ_SIZE];
};

static inline uint32_t runq_len(struct runq *q)
{
	uint32_t h = atomic_load_explicit(&q->head, memory_order_acquire);
	uint32_t t = atomic_load_explicit(&q->tail, memory_order_acquire);
	return t - h;
}

/* Owner only. False when full. */
static inline int runq_push(struct runq *q, weft_task *task)
{
	uint32_t h = atomic_load_explicit(&q->head, memory_order_acquire);
	uint32_t t = atomic_load_explicit(&q->tail, memory_order_relaxed);
	if (t - h >= RUNQ_SIZE)
		return 0;
	atomic_store_explicit(&q->ring[t % RUNQ_SIZE], task, memory_order_relaxed);
	atomic_store_explicit(&q->tail, t + 1, memory_order_release);
	return 1;
}

/* Owner or thief: one task from the head, or NULL. */
static inline weft_task *runq_pop(struct runq *q)
{
	uint32_t h = atomic_load_explicit(&q->head, memory_order_acquire);
	for (;;) {
		uint32_t t = atomic_load_explicit(&q->tail, memory_order_acquire);
		if (t == h)
			return 0;
		weft_task *task = atomic_load_explicit(&q->ring[h % RUNQ_SIZE], memory_order_relaxed);
		if (atomic_compare_exchange_weak_explicit(&q->head, &h, h + 1, memory_order_acq_rel,
							  memory_order_acquire))
			return task;
	}
}

/* Owner only, while no thief can take from q (sched_state.h, own_begin): runq_pop without the CAS. */
static inline weft_task *runq_pop_alone(struct runq *q)
{
	uint32_t h = atomic_load_explicit(&q->head, memory_order_relaxed);
	if (atomic_load_explicit(&q->tail, memory_order_relaxed) == h)
		return 0;
	weft_task *task = atomic_load_explicit(&q->ring[h % RUNQ_SIZE], memory_order_relaxed);
	atomic_store_explicit(&q->head, h + 1, memory_order_release);
	return task;
}

/* Take up to half of q (at most max) into out[]; returns the count. */
static inline uint32_t runq_grab(struct runq *q, weft_task **out, uint32_t max)
{
	for (;;) {
		uint32_t h = atomic_load_explicit(&q->head, memory_order_acquire);
		uint32_t t = atomic_load_explicit(&q->tail, memory_order_acquire);
		uint32_t n = t - h;
		n -= n / 2;
		if (n > RUNQ_SIZE / 2 || n > RUNQ_SIZE) /* read a torn head/tail pair: retry */
			continue;
		if (n > max)
			n = max;
		if (n == 0)
			return 0;
		for (uint32_t i = 0; i < n; i++)
			out[i] = atomic_load_explicit(&q->ring[(h + i) % RUNQ_SIZE], memory_order_relaxed);
		if (atomic_compare_exchange_weak_explicit(&q->head, &h, h + n, memory_order_acq_rel,
							  memory_order_relaxed))
			return n;
	}
}
#endif
