/* spin.h - a test-and-test-and-set lock for short critical sections between workers (timer
 * heaps, join hand-offs). Never held across a switch or a system call. */
#ifndef WEFT_SPIN_H
#define WEFT_SPIN_H

#include <stdatomic.h>
#include <stdbool.h>

typedef struct {
	atomic_int v;
} spinlock;

#define SPIN_INIT { 0 }

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield" ::: "memory");
#endif
}

static inline void spin_lock(spinlock *l)
{
	while (atomic_exchange_explicit(&l->v, 1, memory_order_acquire))
		while (atomic_load_explicit(&l->v, memory_order_relaxed))
			cpu_relax();
}

static inline bool spin_trylock(spinlock *l)
{
	return !atomic_load_explicit(&l->v, memory_order_relaxed) &&
	       !atomic_exchange_explicit(&l->v, 1, memory_order_acquire);
}

static inline void spin_unlock(spinlock *l)
{
	atomic_store_explicit(&l->v, 0, memory_order_release);
}
#endif
