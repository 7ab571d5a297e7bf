/* blocking.h - what the scheduler needs to know of the blocking pool (blocking.c). */
#ifndef WEFT_BLOCKING_H
#define WEFT_BLOCKING_H

/* Jobs queued or running: while there are any, a parked task may still be woken. */
int blocking_jobs(void);
/* The pool's threads, which are weft's own and not "foreign" wakers. */
int blocking_threads(void);
#endif
