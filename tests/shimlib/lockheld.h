/*
 * lockheld.h - a small library written for threads, as sqlite is: each handle has a pthread
 * mutex (recursive, as sqlite's connections have, or error-checking), held across the blocking
 * calls it makes. It knows nothing of weft; tests/shimlib/locks.c runs it inside tasks under
 * the shim.
 */
#ifndef LOCKHELD_H
#define LOCKHELD_H

#include <stddef.h>
#include <sys/types.h>

struct lh;
/* kind: PTHREAD_MUTEX_RECURSIVE or PTHREAD_MUTEX_ERRORCHECK. NULL when out of memory. */
struct lh *lh_open(int kind);
void lh_close(struct lh *h);
/* With h's mutex held, usleep(us). Returns 0, or what went wrong with the mutex: EDEADLK or
 * EPERM from pthreads, EBUSY when another holder was inside at the same time, EXDEV when the
 * call ended on another thread than it began on. */
int lh_nap(struct lh *h, unsigned us);
/* With h's mutex held, read(fd, buf, n). Returns read's result, or -1 with errno one of those
 * above when the mutex went wrong. */
ssize_t lh_read(struct lh *h, int fd, void *buf, size_t n);
/* The calls made on h so far. */
long lh_calls(struct lh *h);
#endif
