/*
 * overflow.h - naming the task that overflowed its stack (overflow.c). Internal to weft.
 */
#ifndef WEFT_OVERFLOW_H
#define WEFT_OVERFLOW_H

#include "task.h"

/* "weft: task <id> (<name>) overflowed its <size>-byte stack" on stderr, and abort. Safe in a
 * signal handler. The canary check (sched.c) calls it; so does the SIGSEGV handler. */
_Noreturn void overflow_abort(weft_task *t);
/* weft_run's SIGSEGV handler, on each worker's alternate signal stack; and its removal. */
void overflow_install(void);
void overflow_uninstall(void);

#endif
