/*
 * context.h - switching between task stacks.
 *
 * A context is the machine state a task needs to resume: on x86-64 and aarch64 just a stack
 * pointer, with the callee-saved registers pushed on the stack by weft_ctx_swap (a dozen
 * instructions, context_<arch>.S). Other targets use ucontext (context_portable.c), which is
 * correct but makes a system call per switch.
 */
#ifndef WEFT_CONTEXT_H
#define WEFT_CONTEXT_H

#include <stddef.h>

#if defined(__x86_64__) || defined(__aarch64__)
#define WEFT_CTX_ASM 1
typedef struct weft_ctx {
	void *sp;
} weft_ctx;

/* Save the callee-saved registers on the current stack, store the stack pointer in *save,
 * load `load` and resume whatever context had saved it there. */
void weft_ctx_swap(void **save, void *load);

static inline void ctx_switch(weft_ctx *from, weft_ctx *to)
{
	weft_ctx_swap(&from->sp, to->sp);
}
#else
#include <ucontext.h>
typedef struct weft_ctx {
	ucontext_t uc;
} weft_ctx;

void ctx_switch(weft_ctx *from, weft_ctx *to);
#endif

/* Prepare c so that switching to it calls entry(arg) on the stack [lo, lo + size).
 * entry must never return. */
void ctx_init(weft_ctx *c, void *lo, size_t size, void (*entry)(void *), void *arg);

#endif
