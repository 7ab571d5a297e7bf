/*
 * context_aarch64.S - weft_ctx_swap for the AAPCS64 ABI.
 *
 * Saves only what the ABI makes callee-saved: x19-x28, the frame pointer x29, the link
 * register x30 and the low halves of v8-v15 (d8-d15).
 *
 *   void weft_ctx_swap(void **save, void *load)   x0 = save, x1 = load
 */
#if defined(__aarch64__)
	.text
	.globl	weft_ctx_swap
	.hidden	weft_ctx_swap
	.type	weft_ctx_swap, %function
	.p2align 4
weft_ctx_swap:
	sub	sp, sp, #160
	stp	x19, x20, [sp, #0]
	stp	x21, x22, [sp, #16]
	stp	x23, x24, [sp, #32]
	stp	x25, x26, [sp, #48]
	stp	x27, x28, [sp, #64]
	stp	x29, x30, [sp, #80]
	stp	d8, d9, [sp, #96]
	stp	d10, d11, [sp, #112]
	stp	d12, d13, [sp, #128]
	stp	d14, d15, [sp, #144]
	mov	x2, sp
	str	x2, [x0]
	mov	sp, x1
	ldp	x19, x20, [sp, #0]
	ldp	x21, x22, [sp, #16]
	ldp	x23, x24, [sp, #32]
	ldp	x25, x26, [sp, #48]
	ldp	x27, x28, [sp, #64]
	ldp	x29, x30, [sp, #80]
	ldp	d8, d9, [sp, #96]
	ldp	d10, d11, [sp, #112]
	ldp	d12, d13, [sp, #128]
	ldp	d14, d15, [sp, #144]
	add	sp, sp, #160
	ret
	.size	weft_ctx_swap, .-weft_ctx_swap

/* First code a new context runs: ctx_init left the argument in x19 and the entry in x20. */
	.globl	weft_ctx_start
	.hidden	weft_ctx_start
	.type	weft_ctx_start, %function
	.p2align 4
weft_ctx_start:
	mov	x0, x19
	blr	x20
	brk	#0
	.size	weft_ctx_start, .-weft_ctx_start
#endif
	.section .note.GNU-stack,"",%progbits
