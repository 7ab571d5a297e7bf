/*
 * spin.h - weft's one spinlock, for critical sections of a few instructions between workers:
 * timer wheels, join hand-offs, fd records, the queues of the synchronisation primitives
 * (syncq.h, group.c) and of weft_mutex. Never held across a switch, a park or a system call,
 * so a waiter waits for a few dozen instructions of a running holder and nothing else.
 *
 * Algorithm: test-and-test-and-set. Exchange 1 into the word (acquire); if it was held, read
 * it (a load, not a write: the holder keeps the cache line) with a pause between reads until
 * it looks free, then exchange again. Release is a store of 0. Invariant: the word is 0 (free)
 * or 1 (held), and is written only by these functions.
 *
 * The word is a plain integer written through the __atomic builtins, not a C11 _Atomic, so
 * that weft.h's public structs, which cannot include this header, can hold one: they declare
 * it `unsigned _lock`, which is a `spinlock`. weft_mutex packs its queue lock in one byte
 * beside two others (weft.h), so the algorithm is written once, as SPIN_ACQUIRE and friends
 * on a word of any width, and the byte form (spin_lock_byte) differs in the width only.
 *
 * Rejected: a ticket or queue lock (fair, but these sections are too short for fairness to
 * matter, and each waiter would write the line); sleeping on a futex when the holder takes
 * long (none does here; a channel's lock, taken at every operation by tasks on every worker
 * and by plain threads, does sleep, and has its own word for that: chan.c, chan_lock).
 */
#ifndef WEFT_SPIN_H
#define WEFT_SPIN_H

#include <stdbool.h>

/* 0 free, 1 held. */
typedef unsigned spinlock;

#define SPIN_INIT 0

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield" ::: "memory");
#endif
}

/* The algorithm, for a pointer to a lock word of any integer type. */
#define SPIN_ACQUIRE(word)                                                   \
	do {                                                                 \
		while (__atomic_exchange_n((word), 1, __ATOMIC_ACQUIRE))     \
			while (__atomic_load_n((word), __ATOMIC_RELAXED))    \
				cpu_relax();                                 \
	} while (0)
/* Read first: a failed try must not take the line away from the holder. */
#define SPIN_TRY(word)                                                       \
	(!__atomic_load_n((word), __ATOMIC_RELAXED) &&                       \
	 !__atomic_exchange_n((word), 1, __ATOMIC_ACQUIRE))
#define SPIN_RELEASE(word) __atomic_store_n((word), 0, __ATOMIC_RELEASE)

static inline void spin_lock(spinlock *l)
{
	SPIN_ACQUIRE(l);
}

static inline bool spin_trylock(spinlock *l)
{
	return SPIN_TRY(l);
}

static inline void spin_unlock(spinlock *l)
{
	SPIN_RELEASE(l);
}

/* The same lock in one byte (weft_mutex's _qlock). */
static inline void spin_lock_byte(unsigned char *l)
{
	SPIN_ACQUIRE(l);
}

static inline void spin_unlock_byte(unsigned char *l)
{
	SPIN_RELEASE(l);
}
#endif
