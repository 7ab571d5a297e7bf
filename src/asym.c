/* asym.c - asymmetric fences through membarrier(2) (see asym.h). */
#define _GNU_SOURCE
#include "asym.h"

#include <linux/membarrier.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

atomic_bool asym_enabled;

/* Before main, and before the other constructors (mutex.c's reads asym_on()): plain threads
 * use weft's locks before any weft_run, and all users must agree on asym_on() from the start. */
__attribute__((constructor(101))) static void asym_init(void)
{
	long cmds = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
	atomic_store(&asym_enabled,
		     cmds >= 0 && (cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED) &&
			     syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0);
}

bool asym_heavy(void)
{
	return syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0;
}

void asym_heavy_retry(void)
{
	while (!asym_heavy()) /* -ENOMEM: the other side's store may still be unseen */
		sched_yield();
}
