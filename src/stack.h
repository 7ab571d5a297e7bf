/*
 * stack.h - task stacks, each with its task record at the top. See stack.c for how 10^6
 * stacks fit under vm.max_map_count.
 */
#ifndef WEFT_STACK_H
#define WEFT_STACK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Lives at the start of the task record, at the top of the slot it describes. */
struct stack {
	void *lo;            /* lowest usable byte; the canary word lives here */
	size_t size;         /* usable bytes from lo up to the record */
	void *map;           /* the slot: guard page + usable bytes + record */
	size_t map_size;
	struct stack *next;  /* free list (pooled) or list of all odd-sized stacks */
	struct stack *free_next; /* free odd-sized stacks */
	bool guarded;        /* a PROT_NONE page sits just below lo */
	bool pooled;         /* a default-size slot carved from a region */
	uint8_t switches;    /* unguarded: switches away since the canary was last read */
	unsigned valgrind_id;
};

/* A worker's free default-size slots (see stack.c): up to two magazines' worth. */
#define STACK_MAGAZINE 512

struct region;

struct stack_cache {
	int n;
	int cold; /* slot[0..cold) came from elsewhere (the depot, the global list, a new region):
		   * long out of this worker's cache */
	struct region *carving; /* the region this worker carves new slots from */
	struct stack *slot[2 * STACK_MAGAZINE];
};

/* Once per weft_run, before any stack_get: record_size bytes at the top of each slot hold
 * the caller's record, which starts with struct stack. */
void stack_init(size_t record_size);
/* A stack of at least `size` usable bytes (0: the default), or NULL with errno ENOMEM. */
struct stack *stack_get(struct stack_cache *c, size_t size);
/* c may be NULL (a plain thread): the slot goes to the global list. */
void stack_put(struct stack_cache *c, struct stack *s);  /* marks it free: size = 0 */
void stack_cache_drain(struct stack_cache *c);
/* The record of the slot that contains addr's guard page, or NULL. */
struct stack *stack_of_guard(const void *addr);
/* How often the canary of an unguarded stack is read: at every CANARY_EVERY-th switch away
 * from its task, and whenever the caller says it must be (see stack.c). */
#define CANARY_EVERY 16

/* The caller's stack pointer. Not __builtin_frame_address(0), which makes gcc give the caller a
 * frame pointer: sched_park is on every switch's path. */
static inline __attribute__((always_inline)) const void *stack_pointer(void)
{
#if defined(__x86_64__)
	const void *sp;
	__asm__("movq %%rsp, %0" : "=r"(sp));
	return sp;
#elif defined(__aarch64__)
	const void *sp;
	__asm__("mov %0, sp" : "=r"(sp));
	return sp;
#else
	return __builtin_frame_address(0);
#endif
}

/* False when a stack without guard page has overflowed (see stack.c); sp is the stack
 * pointer of its task, taken at a switch away from it (`now`: read the canary whatever the
 * count). Called only by the worker running that task. */
static inline bool stack_intact(struct stack *s, const void *sp, bool now)
{
	if (s->guarded)
		return true;
	if ((const char *)sp <= (const char *)s->lo)
		return false;
	if (!now && ++s->switches < CANARY_EVERY)
		return true;
	s->switches = 0;
	return *(const uint64_t *)s->lo == 0;
}
/* Call fn on every record handed out and not yet put back. Takes no lock: other threads may be
 * handing records out and putting them back meanwhile, so fn sees a snapshot of each. */
void stack_each_live(void (*fn)(struct stack *s, void *ctx), void *ctx);
/* Unmap every stack; after the workers have stopped. */
void stack_release_all(void);
size_t stack_default_size(void);
#endif
