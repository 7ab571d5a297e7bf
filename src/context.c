/*
 * context.c - building the first frame of a new context (see context.h). With the assembly
 * switch, a new stack is made to look as if weft_ctx_swap had saved it while inside
 * weft_ctx_start, so the first switch to it "returns" there.
 */
#include "context.h"

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && !defined(WEFT_SAVE_FPU_CONTROL)
void weft_ctx_begin(void);

/* The first switch jumps to weft_ctx_begin with the stack as ctx_switch leaves it: an rbp on
 * top (0, the end of the frame chain), then (our addition) the argument and the entry. */
void ctx_init(weft_ctx *c, void *lo, size_t size, void (*entry)(void *), void *arg)
{
	uintptr_t top = ((uintptr_t)lo + size) & ~(uintptr_t)15;
	uint64_t *sp = (uint64_t *)(top - 40); /* after three pops: 16-byte aligned for a call */
	sp[0] = 0;                          /* rbp */
	sp[1] = (uint64_t)(uintptr_t)arg;
	sp[2] = (uint64_t)(uintptr_t)entry;
	sp[3] = sp[4] = 0;
	c->sp = sp;
	c->pc = (void *)weft_ctx_begin;
}

#elif defined(__x86_64__)
void weft_ctx_start(void);

void ctx_init(weft_ctx *c, void *lo, size_t size, void (*entry)(void *), void *arg)
{
	uintptr_t top = ((uintptr_t)lo + size) & ~(uintptr_t)15;
	/* After weft_ctx_swap's ret the stack is 16-byte aligned, as weft_ctx_start's call needs. */
	uint64_t *sp = (uint64_t *)(top - 24);
	sp[0] = (uint64_t)weft_ctx_start;   /* return address */
	sp[1] = sp[2] = 0;                  /* padding */
	sp -= 6;                            /* r15 r14 r13 r12 rbx rbp */
	memset(sp, 0, 6 * sizeof *sp);
	sp[3] = (uint64_t)(uintptr_t)arg;   /* r12 */
	sp[2] = (uint64_t)(uintptr_t)entry; /* r13 */
#ifdef WEFT_SAVE_FPU_CONTROL
	sp--;
	/* Default MXCSR (all exceptions masked, round to nearest) and x87 control word. */
	uint32_t ctl[2] = { 0x1f80, 0x037f };
	memcpy(sp, ctl, sizeof ctl);
#endif
	c->sp = sp;
}

#elif defined(__aarch64__)
void weft_ctx_start(void);

void ctx_init(weft_ctx *c, void *lo, size_t size, void (*entry)(void *), void *arg)
{
	uintptr_t top = ((uintptr_t)lo + size) & ~(uintptr_t)15;
	uint64_t *sp = (uint64_t *)(top - 160);
	memset(sp, 0, 160);
	sp[0] = (uint64_t)(uintptr_t)arg;   /* x19 */
	sp[1] = (uint64_t)(uintptr_t)entry; /* x20 */
	sp[11] = (uint64_t)weft_ctx_start;  /* x30 */
	c->sp = sp;
}

#else
#include <stdlib.h>

/* makecontext passes int arguments only: split the pointers in two halves. */
static void start(unsigned elo, unsigned ehi, unsigned alo, unsigned ahi)
{
	void (*entry)(void *) = (void (*)(void *))(((uintptr_t)ehi << 32) | elo);
	void *arg = (void *)(((uintptr_t)ahi << 32) | alo);
	entry(arg);
	abort();
}

void ctx_init(weft_ctx *c, void *lo, size_t size, void (*entry)(void *), void *arg)
{
	uint64_t e = (uintptr_t)entry, a = (uintptr_t)arg;
	getcontext(&c->uc);
	c->uc.uc_stack.ss_sp = lo;
	c->uc.uc_stack.ss_size = size;
	c->uc.uc_link = NULL;
	makecontext(&c->uc, (void (*)(void))start, 4, (unsigned)e, (unsigned)(e >> 32),
		    (unsigned)a, (unsigned)(a >> 32));
}

void ctx_switch(weft_ctx *from, weft_ctx *to)
{
	swapcontext(&from->uc, &to->uc);
}
#endif
