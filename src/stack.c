/*
 * stack.c - mmap'd task stacks with guard pages, cached per worker.
 *
 * The kernel allows vm.max_map_count mappings per process (65,530 by default), and a
 * PROT_NONE guard page between two stacks costs two of them. One mapping per guarded stack
 * would cap a program near 32,000 tasks; weft must run 10^6. So:
 *
 *  - Default-size stacks are carved from regions of REGION_SLOTS slots, one mmap each
 *    (MAP_NORESERVE: only touched pages cost memory, so a parked task costs about one page).
 *  - The first `guard_budget` slots get a real guard page (mprotect), sized from
 *    vm.max_map_count so that half of the mappings stay for the program, or set by
 *    $WEFT_STACK_GUARDS (the tests set 0 to reach what follows). A task that overflows
 *    one of them faults on the guard page and weft names it (see task.c).
 *  - Beyond the budget a slot has no guard page. At every switch away from such a task weft
 *    checks that its stack pointer is inside the stack, and that the slot's lowest word (the
 *    canary) is still zero: when the task ends or parks with no deadline (it may never switch
 *    again), else at every CANARY_EVERY-th switch. Reading an untouched page maps the kernel's
 *    zero page, so the check costs no memory, where writing a canary value would cost a page
 *    per task. It does cost a TLB miss, the canary's page being one the task seldom touches,
 *    so it is not read at every switch (rejected: that miss on every switch is a sizeable
 *    share of the time of a program of sleeping tasks). An overflow is caught after the fact:
 *    at the task's next untimed park or end, or within CANARY_EVERY switches. The page the
 *    guard would have been still lies between the stack and the slot below, so an overflow by
 *    less than a page has harmed nothing else by then; a deeper one may have scribbled on the
 *    top of the slot below. The message is the same.
 *
 * Each worker carves new slots from a region of its own, without the lock: carving a slot
 * arms its guard (mprotect) and faults in the page of its record, a system call and a page
 * fault, and under one shared lock two workers spawning at once would each wait for the
 * other's (rejected: one region for all, under the lock).
 *
 * Slots are recycled through a per-worker cache (no lock, no system call in steady state): an
 * array of up to two magazines of STACK_MAGAZINE slots, as in Bonwick's slab allocator. A full
 * cache hands its older magazine to the global depot, an empty one takes a magazine from it:
 * a copy of 512 pointers and a lock, so that a worker spawning tasks that end on other
 * workers goes there once every 512 spawns and touches no record doing so. (Rejected: free
 * lists linked through the records, which make every move of a slot, and every spawn, wait
 * on a record long out of cache, one dependent miss after another.) An array also shows which
 * slots come next, and stack_get prefetches the record of the one STACK_PREFETCH spawns ahead.
 *
 * The depot keeps DEPOT_WARM magazines as they are; a magazine spilled beyond them has its
 * slots' pages given back to the kernel (MADV_DONTNEED, the guard pages untouched) before it
 * joins the depot's cold list, and its records are written anew when a worker takes it. Every
 * slot keeps the pages its tasks touched, one at least (the record's), so without this a
 * program would keep, for good, 4 KB or more for every task it once had at the same time
 * (400 MB after a peak of 100,000 tasks); with it, what freed slots hold is bounded by the
 * workers' caches and the warm magazines. A stale handle to a purged slot reads a zeroed
 * record, whose size 0 says "free" as before. The cost falls only on a load that leaves: tasks
 * that end on one worker and start on another pass one magazine back and forth through the
 * depot, never more than DEPOT_WARM.
 *
 * Odd-sized stacks get a mapping of their own, kept on a global free list for the next spawn
 * of the same size. No slot is unmapped before weft_run ends, so a stale task handle still
 * points at readable memory (task.c reads the generation there to reject it).
 */
#define _GNU_SOURCE
#include "stack.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "sanitizer.h"

#define REGION_SLOTS 256
#define STACK_PREFETCH 4 /* see stack_get */
#define DEPOT_WARM 1     /* magazines the depot keeps with their pages */

struct magazine {
	struct magazine *next;
	bool purged;                     /* the slots' pages were given back (see top) */
	bool guarded[STACK_MAGAZINE];    /* purged: which slots have a guard page */
	struct stack *slot[STACK_MAGAZINE];
};

/* The dump and the overflow handler walk regions and the odd list without the lock: both are
 * only ever prepended to, and a region's `used` grows only once the new slot's record is
 * written (release; they read with acquire). Only the worker carving a region writes `used`. */
struct region {
	struct region *next;
	char *base;
	_Atomic size_t used;  /* slots carved so far */
};

static struct {
	pthread_mutex_t lock;
	size_t page, slot, record, dflt;
	atomic_long guard_budget;
	struct region *_Atomic regions;
	struct magazine *depot; /* full magazines */
	int warm;               /* ... of which not purged (at most DEPOT_WARM) */
	struct stack *free;   /* single pooled slots: put by plain threads, left by a worker going
			       * to standby, or spilled without memory for a magazine */
	struct stack *_Atomic odd; /* every odd-sized stack, linked through next */
	struct stack *odd_free; /* those not in use, linked through free_next */
	bool valgrind;        /* running under valgrind: register stacks with it */
} g = { .lock = PTHREAD_MUTEX_INITIALIZER };

size_t stack_default_size(void)
{
#ifdef WEFT_ASAN
	return 4 * 64 * 1024; /* ASan's redzones make frames several times larger */
#else
	return 64 * 1024;
#endif
}

static long read_max_map_count(void)
{
	long v = 65530;
	FILE *f = fopen("/proc/sys/vm/max_map_count", "r");
	if (f) {
		if (fscanf(f, "%ld", &v) != 1)
			v = 65530;
		fclose(f);
	}
	return v;
}

void stack_init(size_t record_size)
{
	pthread_mutex_lock(&g.lock);
	g.page = (size_t)sysconf(_SC_PAGESIZE);
	g.record = (record_size + 63) & ~(size_t)63;
	g.dflt = stack_default_size();
	g.slot = g.page + g.dflt;
#ifdef WEFT_VALGRIND
	g.valgrind = RUNNING_ON_VALGRIND;
#endif
	const char *e = getenv("WEFT_STACK_GUARDS");
	char *end = NULL;
	long n = e && *e ? strtol(e, &end, 10) : 0;
	n = end && !*end ? n : read_max_map_count() / 4 - 2048; /* unset or not a number */
	atomic_store(&g.guard_budget, n > 0 ? n : 0);
	pthread_mutex_unlock(&g.lock);
}

/* Fill in the record at the top of [map, map + map_size) and arm the guard. */
static struct stack *setup(char *map, size_t map_size, bool pooled)
{
	struct stack *s = (struct stack *)(map + map_size - g.record);
	bool guarded = false;
	long budget = atomic_load_explicit(&g.guard_budget, memory_order_relaxed);
	while (budget > 0 && !atomic_compare_exchange_weak(&g.guard_budget, &budget, budget - 1))
		;
	if (budget > 0) {
		guarded = mprotect(map, g.page, PROT_NONE) == 0;
		if (!guarded)
			atomic_fetch_add(&g.guard_budget, 1);
	}
	*s = (struct stack){ .lo = map + g.page, .size = (size_t)((char *)s - map) - g.page,
			     .map = map, .map_size = map_size, .guarded = guarded, .pooled = pooled };
	return s;
}

static struct region *new_region(void)
{
	struct region *r = malloc(sizeof *r);
	if (!r)
		return NULL;
	void *m = mmap(NULL, g.slot * REGION_SLOTS, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (m == MAP_FAILED) {
		free(r);
		return NULL;
	}
	/* A huge page would turn each parked task's one touched page into 2 MiB. */
	madvise(m, g.slot * REGION_SLOTS, MADV_NOHUGEPAGE);
	pthread_mutex_lock(&g.lock);
	*r = (struct region){ .next = atomic_load_explicit(&g.regions, memory_order_relaxed),
			      .base = m };
	atomic_store_explicit(&g.regions, r, memory_order_release);
	pthread_mutex_unlock(&g.lock);
	return r;
}

/* A new slot from c's own region. No lock: only c's worker carves it. */
static struct stack *carve(struct stack_cache *c)
{
	struct region *r = c->carving;
	if (!r || atomic_load_explicit(&r->used, memory_order_relaxed) == REGION_SLOTS) {
		if (!(r = new_region()))
			return NULL;
		c->carving = r;
	}
	size_t i = atomic_load_explicit(&r->used, memory_order_relaxed);
	struct stack *s = setup(r->base + g.slot * i, g.slot, true);
	atomic_store_explicit(&r->used, i + 1, memory_order_release);
	return s;
}

static struct stack *reuse_odd(size_t len)
{
	pthread_mutex_lock(&g.lock);
	struct stack **p = &g.odd_free;
	while (*p && (*p)->map_size != len)
		p = &(*p)->free_next;
	struct stack *s = *p;
	if (s)
		*p = s->free_next;
	pthread_mutex_unlock(&g.lock);
	return s;
}

static struct stack *get_odd(size_t size)
{
	size_t len = (g.page + size + g.record + g.page - 1) & ~(g.page - 1);
	struct stack *s = reuse_odd(len);
	if (s)
		return s;
	void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
		       -1, 0);
	if (m == MAP_FAILED)
		return NULL;
	madvise(m, len, MADV_NOHUGEPAGE);
	pthread_mutex_lock(&g.lock);
	s = setup(m, len, false);
	s->next = atomic_load_explicit(&g.odd, memory_order_relaxed);
	atomic_store_explicit(&g.odd, s, memory_order_release);
	pthread_mutex_unlock(&g.lock);
	return s;
}

/* Write the record of a purged slot anew: the pages read as zeros since. Its size stays 0
 * (free, for stack_each_live and a stale weft_join) until stack_get hands it out. */
static void unpurge(struct stack *s, bool guarded)
{
	char *map = (char *)s + g.record - g.slot;
	*s = (struct stack){ .lo = map + g.page, .size = 0, .map = map, .map_size = g.slot,
			     .guarded = guarded, .pooled = true };
}

/* Refill an empty cache: a magazine from the depot, else single slots, else a new slot. The
 * depot's warm magazines are at its head (spill). */
static void refill(struct stack_cache *c)
{
	pthread_mutex_lock(&g.lock);
	struct magazine *m = g.depot;
	if (m) {
		g.depot = m->next;
		if (!m->purged)
			g.warm--;
	}
	while (!m && g.free && c->n < STACK_MAGAZINE) { /* seldom: see g.free */
		c->slot[c->n++] = g.free;
		g.free = g.free->next;
	}
	pthread_mutex_unlock(&g.lock);
	if (m) {
		memcpy(c->slot, m->slot, sizeof m->slot);
		c->n = STACK_MAGAZINE;
		for (int i = 0; m->purged && i < STACK_MAGAZINE; i++)
			unpurge(c->slot[i], m->guarded[i]);
	}
	free(m);
	struct stack *s = c->n ? NULL : carve(c);
	if (s)
		c->slot[c->n++] = s;
	c->cold = c->n;
}

/* A full cache hands its older half to the depot; without memory for a magazine, to the list
 * of single slots. */
static void spill(struct stack_cache *c)
{
	struct magazine *m = malloc(sizeof *m);
	if (m) {
		memcpy(m->slot, c->slot, sizeof m->slot);
		m->purged = false;
	}
	pthread_mutex_lock(&g.lock);
	if (m && g.warm >= DEPOT_WARM) { /* beyond the warm ones: give its pages back */
		pthread_mutex_unlock(&g.lock);
		for (int i = 0; i < STACK_MAGAZINE; i++) {
			struct stack *s = m->slot[i];
			m->guarded[i] = s->guarded;
			madvise((char *)s->map + g.page, g.slot - g.page, MADV_DONTNEED);
		}
		m->purged = true;
		pthread_mutex_lock(&g.lock);
	}
	if (m && !m->purged) { /* warm ones first: refill takes from the head */
		m->next = g.depot;
		g.depot = m;
		g.warm++;
	} else if (m) {
		struct magazine **pp = &g.depot;
		for (int i = 0; i < g.warm && *pp; i++)
			pp = &(*pp)->next;
		m->next = *pp;
		*pp = m;
	} else {
		for (int i = 0; i < STACK_MAGAZINE; i++) {
			c->slot[i]->next = g.free;
			g.free = c->slot[i];
		}
	}
	pthread_mutex_unlock(&g.lock);
	c->n -= STACK_MAGAZINE;
	c->cold = c->cold > STACK_MAGAZINE ? c->cold - STACK_MAGAZINE : 0;
	memmove(c->slot, c->slot + STACK_MAGAZINE, (size_t)c->n * sizeof c->slot[0]);
}

/* Start loading the record of the slot to be handed out STACK_PREFETCH spawns from now, which
 * task_spawn writes whole: its lines (a task's record is five), and the top of the stack below
 * them. Only for slots from the depot: those this worker put back are still in its cache.
 * Always inlined: gcc 12 finds a function that only prefetches free of side effects, and drops
 * the call. */
static inline __attribute__((always_inline)) void prefetch_ahead(struct stack_cache *c)
{
	if (c->n >= c->cold)
		return;
	c->cold = c->n;
	if (c->n < STACK_PREFETCH)
		return;
	const char *r = (const char *)c->slot[c->n - STACK_PREFETCH];
#pragma GCC unroll 6
	for (int l = -1; l < 5; l++)
		__builtin_prefetch(r + 64 * l, 1);
}

struct stack *stack_get(struct stack_cache *c, size_t size)
{
	struct stack *s;
	if (size == 0 || size == g.dflt) {
		if (!c->n)
			refill(c);
		s = c->n ? c->slot[--c->n] : NULL;
		prefetch_ahead(c);
	} else {
		s = get_odd(size);
	}
	if (!s) {
		errno = ENOMEM;
		return NULL;
	}
	s->size = (size_t)((char *)s - (char *)s->lo);
	san_unpoison(s->lo, s->size);
#ifdef WEFT_VALGRIND
	if (g.valgrind)
		s->valgrind_id = VALGRIND_STACK_REGISTER(s->lo, (char *)s->lo + s->size);
#endif
	return s;
}

void stack_put(struct stack_cache *c, struct stack *s)
{
#ifdef WEFT_VALGRIND
	if (g.valgrind)
		VALGRIND_STACK_DEREGISTER(s->valgrind_id);
#endif
	/* Marks the record free (stack_each_live). Atomic: the dump reads it from other threads
	 * at any time. */
	__atomic_store_n(&s->size, 0, __ATOMIC_RELAXED);
	if (!s->pooled) {
		pthread_mutex_lock(&g.lock);
		s->free_next = g.odd_free;
		g.odd_free = s;
		pthread_mutex_unlock(&g.lock);
		return;
	}
	if (!c) { /* a plain thread joined the task */
		pthread_mutex_lock(&g.lock);
		s->next = g.free;
		g.free = s;
		pthread_mutex_unlock(&g.lock);
		return;
	}
	if (c->n == 2 * STACK_MAGAZINE)
		spill(c);
	c->slot[c->n++] = s;
}

/* A worker stops taking tasks: hand its whole cache back. */
void stack_cache_drain(struct stack_cache *c)
{
	while (c->n >= STACK_MAGAZINE)
		spill(c);
	pthread_mutex_lock(&g.lock);
	while (c->n) {
		struct stack *s = c->slot[--c->n];
		s->next = g.free;
		g.free = s;
	}
	pthread_mutex_unlock(&g.lock);
	c->cold = 0;
}

struct stack *stack_of_guard(const void *addr)
{
	const char *a = addr;
	for (struct region *r = atomic_load_explicit(&g.regions, memory_order_acquire); r;
	     r = r->next) {
		if (a >= r->base &&
		    a < r->base + g.slot * atomic_load_explicit(&r->used, memory_order_acquire)) {
			char *map = r->base + (size_t)(a - r->base) / g.slot * g.slot;
			if (a >= map + g.page)
				return NULL;
			return (struct stack *)(map + g.slot - g.record);
		}
	}
	for (struct stack *s = atomic_load_explicit(&g.odd, memory_order_acquire); s; s = s->next)
		if (a >= (char *)s->map && a < (char *)s->map + g.page)
			return s;
	return NULL;
}

void stack_each_live(void (*fn)(struct stack *s, void *ctx), void *ctx)
{
	for (struct region *r = atomic_load_explicit(&g.regions, memory_order_acquire); r;
	     r = r->next) {
		size_t used = atomic_load_explicit(&r->used, memory_order_acquire);
		for (size_t i = 0; i < used; i++) {
			struct stack *s = (struct stack *)(r->base + g.slot * (i + 1) - g.record);
			if (s->size)
				fn(s, ctx);
		}
	}
	for (struct stack *s = atomic_load_explicit(&g.odd, memory_order_acquire); s; s = s->next)
		if (s->size)
			fn(s, ctx);
}

void stack_release_all(void)
{
	pthread_mutex_lock(&g.lock);
	while (g.regions) {
		struct region *r = g.regions;
		g.regions = r->next;
		san_unpoison(r->base, g.slot * REGION_SLOTS);
		munmap(r->base, g.slot * REGION_SLOTS);
		free(r);
	}
	while (g.odd) {
		struct stack *s = g.odd;
		g.odd = s->next;
		san_unpoison(s->map, s->map_size);
		munmap(s->map, s->map_size);
	}
	while (g.depot) {
		struct magazine *m = g.depot;
		g.depot = m->next;
		free(m);
	}
	g.free = NULL;
	g.odd_free = NULL;
	g.warm = 0;
	pthread_mutex_unlock(&g.lock);
}
