/*
 * asym.h - asymmetric fences: a store-then-load race where one side runs millions of times a
 * second and the other seldom, paid for by the seldom side.
 *
 * Dekker's pattern (each side stores its flag, then loads the other's; one of the two must see
 * the other) needs a full barrier on both sides, an atomic read-modify-write on x86. With
 * membarrier(2) the frequent side keeps its accesses in program order with a compiler barrier
 * alone (asym_light), and the seldom side runs MEMBARRIER_CMD_PRIVATE_EXPEDITED (asym_heavy),
 * which passes every running thread of the process through a full barrier: whatever the
 * frequent side stored before that point is visible once asym_heavy returns, and whatever it
 * loads after that point sees what the seldom side stored before calling it.
 *
 * Users: the mutex's release (mutex.c: every unlock against a waiter about to park),
 * cancellation (wait.c: every wait against weft_cancel) and stealing (a worker's own queue
 * operations in sched.c against thieves in steal.c). Where membarrier is refused (old kernels,
 * seccomp filters) asym_on() is false and both sides use full barriers, as the callers say.
 */
#ifndef WEFT_ASYM_H
#define WEFT_ASYM_H

#include <stdatomic.h>
#include <stdbool.h>

extern atomic_bool asym_enabled __attribute__((visibility("hidden")));

/* Whether the frequent side may use asym_light: fixed before main. */
static inline bool asym_on(void)
{
	return atomic_load_explicit(&asym_enabled, memory_order_relaxed);
}

/* The frequent side, between its store and its load (only when asym_on()). */
static inline void asym_light(void)
{
	atomic_signal_fence(memory_order_seq_cst);
}

/* The seldom side, between its store and its load (only when asym_on()): a few microseconds,
 * and an interrupt on every core running one of the process's threads. False when there was no
 * barrier: membarrier can still fail after registering (-ENOMEM), and the caller must then not
 * rely on the other side's store (try again, or take a slower path). */
bool asym_heavy(void);
/* asym_heavy, tried again (yielding the core) until there was a barrier: for a side that
 * cannot go on without one. */
void asym_heavy_retry(void);

#endif
