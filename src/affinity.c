/*
 * affinity.c - one worker per core, and each worker kept on its own.
 *
 * Why. Left to the kernel, two workers can end up sharing one core while another idles. A
 * worker that queues a second runnable task wakes an idle worker to help (idle.c,
 * sched_wake_idle); on a busy machine the kernel often places the wakee on the waker's own CPU
 * (wake-affine) and lets it preempt the waker. The task the waker was running then sits,
 * runnable and not running, until the load balancer moves one of them, milliseconds later: a
 * latency tail that one worker alone would not have. Pinned, a woken worker runs on its own
 * core; it may preempt some other thread there, never a fellow worker. (Rejected: SCHED_BATCH
 * on the workers, which forbids wake-up preemption and so avoids the stacking too, but then a
 * worker woken onto a core busy with any other program waits for the scheduler's tick.)
 *
 * When. Only when there are exactly as many workers as CPUs the calling thread may use (the
 * default count): then each worker has a CPU of its own, the i-th of that set. With fewer
 * workers (WEFT_WORKERS=1 on a larger machine) pinning would stack several programs' workers
 * on the first CPUs; with more, cores would be shared anyway. WEFT_PIN=0 turns it off.
 *
 * Threads. A thread inherits its creator's CPU set, so a plain thread started by a task would
 * be confined to that task's worker's CPU. The threads weft starts for itself (the monitor,
 * spare workers, the blocking pool) take back the whole set as they start; a program's own
 * can do the same with weft_unpin(). weft_run gives the calling thread its set back when it
 * returns.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "affinity.h"
#include "weft.h"

static cpu_set_t all;         /* the set weft_run's caller had: what unpinned threads get */
static bool have_all;         /* `all` was read */
static _Atomic int npinned;   /* workers 0..npinned-1 are pinned; 0: none */
static int cpu_of[CPU_SETSIZE];

int affinity_init(void)
{
	CPU_ZERO(&all);
	atomic_store(&npinned, 0);
	have_all = sched_getaffinity(0, sizeof all, &all) == 0;
	return have_all ? CPU_COUNT(&all) : 0;
}

int affinity_workers(int cpus)
{
	const char *e = getenv("WEFT_WORKERS");
	long n = e && *e ? strtol(e, NULL, 10) : cpus > 0 ? cpus : sysconf(_SC_NPROCESSORS_ONLN);
	if (n < 1)
		n = 1;
	return n > 1024 ? 1024 : (int)n;
}

void affinity_plan(int workers)
{
	const char *e = getenv("WEFT_PIN");
	if (!have_all || (e && !strcmp(e, "0")) || workers < 2 || workers != CPU_COUNT(&all))
		return;
	int n = 0;
	for (int c = 0; c < CPU_SETSIZE && n < workers; c++)
		if (CPU_ISSET(c, &all))
			cpu_of[n++] = c;
	atomic_store(&npinned, n);
}

void affinity_worker(int id)
{
	if (id >= atomic_load(&npinned)) { /* a spare: it inherited a pinned creator's set */
		weft_unpin();
		return;
	}
	cpu_set_t one;
	CPU_ZERO(&one);
	CPU_SET(cpu_of[id], &one);
	sched_setaffinity(0, sizeof one, &one); /* on failure the worker floats: still correct */
}

void affinity_restore(void)
{
	weft_unpin();
	atomic_store(&npinned, 0);
}

int weft_unpin(void)
{
	if (!atomic_load(&npinned)) /* set after `all` was read, cleared before it is again */
		return 0;
	return sched_setaffinity(0, sizeof all, &all) ? -errno : 0;
}
