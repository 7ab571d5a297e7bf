/*
 * context.h - switching between task stacks.
 *
 * A context is the machine state a task needs to resume: on x86-64 and aarch64 just a stack
 * pointer, with the callee-saved registers pushed on the stack by weft_ctx_swap (a dozen
 * instructions, context_<arch>.S). Other targets use ucontext (the fallback at the end of this
 * file), which is correct but makes a system call per switch.
 */
#ifndef WEFT_CONTEXT_H
#define WEFT_CONTEXT_H

#include <stddef.h>

#if defined(__x86_64__) && !defined(WEFT_SAVE_FPU_CONTROL)
/*
 * x86-64: the switch is inlined where it is used. It saves only a resume address (and rbp
 * when it is the frame pointer); every other register is declared clobbered, so the compiler
 * saves just the ones that are live across the switch (in the caller's frame, once) instead of
 * a separate function saving all six callee-saved registers again. It resumes the other
 * context with an indirect jump, which the branch predictor learns, where a `ret` into another
 * call chain would miss. The push of rbp goes below the stack pointer: safe because every
 * function that switches also makes calls, and GCC puts nothing in the red zone of a function
 * that does.
 *
 * Without frame pointers rbp is declared clobbered too, rather than pushed: the compiler kept
 * a constant in it (a thread-local offset) across the switch, and reading it back from the
 * other context's stack puts a load on the path of every resumed task, where a clobber lets
 * the compiler keep it elsewhere or recompute it. Where rbp is the frame pointer it cannot be
 * declared clobbered, and is pushed: at -O0, and wherever the Makefile builds with frame
 * pointers (it then defines WEFT_FRAME_POINTERS).
 */
#if defined(__OPTIMIZE__) && !defined(WEFT_FRAME_POINTERS)
#define CTX_PUSH_RBP ""
#define CTX_POP_RBP ""
#define CTX_RBP_CLOBBER "rbp",
#else
#define CTX_PUSH_RBP "pushq %%rbp\n\t"
#define CTX_POP_RBP "popq %%rbp\n\t"
#define CTX_RBP_CLOBBER
#endif
typedef struct weft_ctx {
	void *sp;
	void *pc;
} weft_ctx;

static inline __attribute__((always_inline)) void ctx_switch(weft_ctx *from, weft_ctx *to)
{
	__asm__ __volatile__(CTX_PUSH_RBP
			     "movq %%rsp, (%%rdi)\n\t"
			     "leaq 1f(%%rip), %%rax\n\t"
			     "movq %%rax, 8(%%rdi)\n\t"
			     "movq (%%rsi), %%rsp\n\t"
			     "jmpq *8(%%rsi)\n"
			     "1:\n\t"
			     CTX_POP_RBP
			     : "+D"(from), "+S"(to)
			     :
			     : CTX_RBP_CLOBBER "rax", "rbx", "rcx", "rdx", "r8", "r9", "r10", "r11",
			       "r12", "r13", "r14", "r15", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4",
			       "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12",
			       "xmm13", "xmm14", "xmm15", "st", "st(1)", "st(2)", "st(3)", "st(4)",
			       "st(5)", "st(6)", "st(7)", "memory", "cc");
}
#elif defined(__x86_64__) || defined(__aarch64__)
#define WEFT_CTX_SWAP 1
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
