/* futex.h - the two futex calls plain threads and idle workers sleep on. */
#ifndef WEFT_FUTEX_H
#define WEFT_FUTEX_H

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* Sleep while *addr == val, until woken or until the absolute CLOCK_MONOTONIC deadline
 * (INT64_MAX: none). Returns 0, or -ETIMEDOUT, -EAGAIN (value changed), -EINTR. */
static inline int futex_wait(_Atomic uint32_t *addr, uint32_t val, int64_t deadline)
{
	struct timespec ts, *tp = NULL;
	if (deadline != INT64_MAX) {
		if (deadline < 0)
			deadline = 0;
		ts.tv_sec = deadline / 1000000000;
		ts.tv_nsec = deadline % 1000000000;
		tp = &ts;
	}
	long r = syscall(SYS_futex, addr, FUTEX_WAIT_BITSET | FUTEX_PRIVATE_FLAG, val, tp, NULL,
			 FUTEX_BITSET_MATCH_ANY);
	return r == 0 ? 0 : -errno;
}

static inline void futex_wake(_Atomic uint32_t *addr, int n)
{
	syscall(SYS_futex, addr, FUTEX_WAKE | FUTEX_PRIVATE_FLAG, n, NULL, NULL, 0);
}
#endif
