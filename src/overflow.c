/*
 * overflow.c - which task overflowed its stack: the SIGSEGV handler for the guard pages, and
 * the message.
 *
 * The task to name is the one whose stack pointer left its stack, which is not always the one
 * whose guard page was hit: a frame bigger than a page (a large local array, compiled without
 * -fstack-clash-protection) moves the stack pointer past the task's own guard page, and its
 * first writes land below it, in other tasks' slots (their stacks, which do not fault, or their
 * guard pages) or below the region (unmapped memory). So the handler reads the stack pointer
 * from the signal's context:
 *  - in a guard page of the task running here, or of the task it is switching away from
 *    (switch_to sets the worker's cur to the next task while still on the last one's stack,
 *    and the context swap, a frame pointer or a sanitizer's fiber switch may push there): that
 *    task overflowed;
 *  - else outside the running task's stack, and outside the one it is leaving: the running
 *    task overflowed, with a frame bigger than a page, wherever the fault was;
 *  - else, with the fault in a guard page: that page's task overflowed when no task runs here
 *    (the idle loop, a plain thread) or when it is the running one, and the running task wrote
 *    through a wild pointer when it is another;
 *  - any other fault is not weft's: it goes to the handler installed before.
 * Rejected: naming the owner of the page hit, which named an innocent neighbour (often main,
 * whose slot is below) for a large frame, and let a bare "Segmentation fault" through when the
 * frame reached below every stack.
 *
 * Everything here is async-signal-safe in practice: snprintf of integers and strings (glibc
 * allocates nothing for them) into a local buffer, write(2), abort().
 */
#define _GNU_SOURCE
#include "overflow.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <ucontext.h>
#include <unistd.h>

#include "sched.h"
#include "stack.h"

static struct sigaction old_segv;

_Noreturn static void say_and_abort(const char *msg, int n)
{
	if (write(2, msg, (size_t)n) < 0) {
	}
	abort();
}

_Noreturn void overflow_abort(weft_task *t)
{
	char msg[160];
	int n = snprintf(msg, sizeof msg, "weft: task %llu (%s) overflowed its %zu-byte stack\n",
			 (unsigned long long)t->id, t->name, t->stk.size);
	say_and_abort(msg, n);
}

static char *fault_sp(void *uc)
{
	mcontext_t *m = &((ucontext_t *)uc)->uc_mcontext;
#if defined(__x86_64__)
	return (char *)m->gregs[REG_RSP];
#elif defined(__aarch64__)
	return (char *)m->sp;
#else
	(void)m;
	return NULL;
#endif
}

static bool on_stack(const weft_task *t, const char *sp)
{
	return t && sp >= (const char *)t->stk.lo && sp < (const char *)t->stk.lo + t->stk.size;
}

static void on_segv(int sig, siginfo_t *si, void *uc)
{
	(void)sig;
	struct worker *w = worker_tls;
	weft_task *t = w ? w->cur : NULL, *from = w ? w->prev : NULL;
	char *sp = fault_sp(uc);
	if (t && sp) {
		weft_task *g = (weft_task *)stack_of_guard(sp);
		if (g && (g == t || g == from))
			overflow_abort(g);
		if (!on_stack(t, sp) && !on_stack(from, sp))
			overflow_abort(t);
	}
	weft_task *o = (weft_task *)stack_of_guard(si->si_addr);
	if (!o) {
		sigaction(SIGSEGV, &old_segv, NULL); /* not ours: fault again, the old way */
		return;
	}
	if (!t || t == o)
		overflow_abort(o);
	char msg[320];
	int n = snprintf(msg, sizeof msg,
			 "weft: task %llu (%s) touched the guard page below task %llu (%s)'s stack "
			 "at %p: a wild pointer\n",
			 (unsigned long long)t->id, t->name, (unsigned long long)o->id, o->name,
			 si->si_addr);
	say_and_abort(msg, n);
}

void overflow_install(void)
{
	struct sigaction sa = { .sa_sigaction = on_segv, .sa_flags = SA_SIGINFO | SA_ONSTACK };
	sigaction(SIGSEGV, &sa, &old_segv);
}

void overflow_uninstall(void)
{
	sigaction(SIGSEGV, &old_segv, NULL);
}
