/*
 * timer.h - deadlines of parked tasks. Each worker keeps a hierarchical timing wheel of the
 * timed waits that started on it (the algorithm is described in timer.c); its idle loop
 * sleeps until the earliest one (futex timeout, 1 ns timer slack), and a busy worker checks it
 * every few dozen switches.
 *
 * A task may be woken early on another worker; it then removes its entry from the wheel it
 * was put in, so each wheel has a spinlock. Expiry claims the waiter while holding that lock
 * (see wait.h), so an entry is never touched after its task has moved on.
 */
#ifndef WEFT_TIMER_H
#define WEFT_TIMER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "spin.h"

#define WHEEL_BITS 6
#define WHEEL_SLOTS (1 << WHEEL_BITS)
#define WHEEL_LEVELS 9 /* 9 x 6 bits of ticks cover every int64_t deadline (timer.c) */
#define TIMER_FIRE_BATCH 32 /* at most this many timers are handed to fire() at once */
#define TIMER_EXPIRE_MAX 256 /* and about this many in one timer_expire (timer.c) */

struct timer_wheel;

struct timer {
	int64_t when;
	struct timer_wheel *wheel; /* the wheel it was added to; NULL when none */
	int idx;                   /* position in its slot, -1 when not queued */
	uint16_t slot;             /* level * WHEEL_SLOTS + slot index, while queued */
};

/* Entries carry their deadline, so expiry and cascades decide within the slot's array and
 * touch a timer only to claim it or note its new place. */
struct timer_entry {
	int64_t when;
	struct timer *t;
};

struct timer_slot {
	int n, cap;
	int64_t min;   /* no later than its earliest deadline (equal unless that was cancelled) */
	struct timer_entry *a;
};

struct timer_wheel {
	/* Other workers read `first` whenever they look for work: it has a line of its own, which
	 * filing a timer later than it leaves alone. */
	_Alignas(64) _Atomic int64_t first; /* the earliest deadline (or earlier, after a
					     * cancel), INT64_MAX when empty; read without lock */
	_Alignas(64) spinlock lock;
	int n;                    /* timers queued */
	uint64_t elapsed;         /* the tick expiry has reached (timer.c) */
	int busy;                 /* level * WHEEL_SLOTS + slot of a slot expiry is part way
				   * through, or -1 (timer_expire) */
	uint64_t occupied[WHEEL_LEVELS];           /* bit s: slot s of that level is not empty */
	struct timer_slot slot[WHEEL_LEVELS][WHEEL_SLOTS];
};

void timer_wheel_init(struct timer_wheel *h);
void timer_wheel_destroy(struct timer_wheel *h);
/* Returns 0 or -ENOMEM. */
int timer_add(struct timer_wheel *h, struct timer *t, int64_t when);
/* Remove t from its wheel if it is still there. */
void timer_del(struct timer *t);
/* Take out every timer due at `now`. claim() runs under the wheel's lock and says whether the
 * timer still means something; fire() runs with the lock dropped, on batches of up to
 * TIMER_FIRE_BATCH claimed ones (slot by slot in deadline order; within one tick of 1 us, in
 * no particular order). With `try`, gives up when the lock is taken (then returns what it
 * fired so far). Stops once it has fired TIMER_EXPIRE_MAX, leaving `first` at or before the
 * rest. Returns the number fired. */
int timer_expire(struct timer_wheel *h, int64_t now, bool try, bool (*claim)(struct timer *),
		 void (*fire)(struct timer **batch, int n));
#endif
