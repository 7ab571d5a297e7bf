/*
 * timer.h - deadlines of parked tasks. Each worker keeps a binary min-heap of the timed waits
 * that started on it; its idle loop sleeps exactly until the earliest one (futex timeout,
 * 1 ns timer slack), and a busy worker checks it every few dozen switches.
 *
 * A task may be woken early on another worker; it then removes its entry from the heap it
 * was put in, so each heap has a spinlock. Expiry claims the waiter while holding that lock
 * (see wait.h), so an entry is never touched after its task has moved on.
 */
#ifndef WEFT_TIMER_H
#define WEFT_TIMER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "spin.h"

struct timer_heap;

struct timer {
	int64_t when;
	int idx;                  /* position in heap->a, -1 when not queued */
	struct timer_heap *heap;  /* the heap it was added to; NULL when none */
	struct timer *fired;      /* list link used by timer_expire */
};

/* Heap entries carry their deadline, so sifting compares within the array and touches a
 * timer only to update its index: with 10^5 sleepers that is most of the cost. */
struct timer_slot {
	int64_t when;
	struct timer *t;
};

struct timer_heap {
	spinlock lock;
	int n, cap;
	struct timer_slot *a;   /* a 4-ary min-heap: half the depth of a binary one */
	_Atomic int64_t first;   /* earliest deadline, INT64_MAX when empty; read without lock */
};

void timer_heap_init(struct timer_heap *h);
void timer_heap_destroy(struct timer_heap *h);
/* Returns 0 or -ENOMEM. */
int timer_add(struct timer_heap *h, struct timer *t, int64_t when);
/* Remove t from its heap if it is still there. */
void timer_del(struct timer *t);
/* Pop every timer due at `now`. claim() runs under the heap's lock and says whether the timer
 * still means something; fire() runs afterwards, unlocked, on each claimed one. Returns the
 * number fired. */
int timer_expire(struct timer_heap *h, int64_t now, bool (*claim)(struct timer *),
		 void (*fire)(struct timer *));
#endif
