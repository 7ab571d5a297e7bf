/*
 * context_x86_64.S - weft_ctx_swap for the System V x86-64 ABI.
 *
 * Saves the registers the ABI makes callee-saved: rbx, rbp, r12-r15. The ABI also makes the
 * MXCSR control bits and the x87 control word callee-saved, but saving them (stmxcsr, fnstcw)
 * costs more than all the rest of the switch, and all tasks of a process share one setting
 * unless a task changes it, so, as Go's runtime does, weft leaves them to the worker thread.
 * Build with -DWEFT_SAVE_FPU_CONTROL for per-task floating-point control state.
 *
 *   void weft_ctx_swap(void **save, void *load)   rdi = save, rsi = load
 */
#if defined(__x86_64__)
	.text
	.globl	weft_ctx_swap
	.hidden	weft_ctx_swap
	.type	weft_ctx_swap, @function
	.p2align 4
weft_ctx_swap:
	.cfi_startproc
	pushq	%rbp
	pushq	%rbx
	pushq	%r12
	pushq	%r13
	pushq	%r14
	pushq	%r15
#ifdef WEFT_SAVE_FPU_CONTROL
	subq	$8, %rsp
	stmxcsr	(%rsp)
	fnstcw	4(%rsp)
#endif
	movq	%rsp, (%rdi)
	movq	%rsi, %rsp
#ifdef WEFT_SAVE_FPU_CONTROL
	ldmxcsr	(%rsp)
	fldcw	4(%rsp)
	addq	$8, %rsp
#endif
	popq	%r15
	popq	%r14
	popq	%r13
	popq	%r12
	popq	%rbx
	popq	%rbp
	ret
	.cfi_endproc
	.size	weft_ctx_swap, .-weft_ctx_swap

/* First code a new context runs: ctx_init left the argument in r12 and the entry in r13. */
	.globl	weft_ctx_start
	.hidden	weft_ctx_start
	.type	weft_ctx_start, @function
	.p2align 4
weft_ctx_start:
	.cfi_startproc
	.cfi_undefined rip
	movq	%r12, %rdi
	callq	*%r13
	ud2
	.cfi_endproc
	.size	weft_ctx_start, .-weft_ctx_start

/* First code of a new context under the inlined switch (context.h): ctx_init left rbp, the
 * argument and the entry on the stack. */
	.globl	weft_ctx_begin
	.hidden	weft_ctx_begin
	.type	weft_ctx_begin, @function
	.p2align 4
weft_ctx_begin:
	.cfi_startproc
	.cfi_undefined rip
	popq	%rbp
	popq	%rdi
	popq	%rax
	callq	*%rax
	ud2
	.cfi_endproc
	.size	weft_ctx_begin, .-weft_ctx_begin
#endif
	.section .note.GNU-stack,"",@progbits
