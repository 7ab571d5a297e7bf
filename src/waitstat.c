/*
 * waitstat.c - how often, and how long, tasks and threads parked, by what they waited for.
 *
 * Every wait names its reason ("mutex", "channel recv", "sleep", ...: a static string given to
 * wait_begin), so wait_park can count the wait and its length under that name. Each worker
 * owns a small table it alone writes (relaxed atomics, only so that weft_stats_waits may read
 * while it runs); plain threads share one table under a lock, as they park rarely. Timing a
 * wait costs two clock reads, a sizeable part of a channel hand-off, so it happens only when
 * asked for: WEFT_STATS=1 (which prints the table at exit) or WEFT_TRACE.
 */
#define _GNU_SOURCE
#include "waitstat.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched.h"
#include "weft.h"

#define KINDS 32 /* distinct reasons weft uses: about 16 */

struct table {
	struct entry {
		const char *_Atomic what;
		_Atomic uint64_t n;
		_Atomic int64_t ns;
	} v[KINDS];
};

atomic_bool waitstat_on;
static struct table *per_worker, foreign;
static int nworkers;
static pthread_mutex_t foreign_lock = PTHREAD_MUTEX_INITIALIZER;

static bool env_set(const char *name)
{
	const char *e = getenv(name);
	return e && *e && strcmp(e, "0") != 0;
}

void waitstat_start(int workers)
{
	memset(&foreign, 0, sizeof foreign);
	if (!env_set("WEFT_STATS") && !env_set("WEFT_TRACE"))
		return;
	if (!(per_worker = calloc((size_t)workers, sizeof *per_worker)))
		return;
	nworkers = workers;
	atomic_store(&waitstat_on, true);
}

void waitstat_stop(void)
{
	atomic_store(&waitstat_on, false);
	free(per_worker);
	per_worker = NULL;
	nworkers = 0;
}

/* Only t's owner adds entries, so a plain search and append is enough. Reasons that are equal
 * strings at different addresses get entries of their own; weft_stats_waits merges them. */
static void add(struct table *t, const char *what, int64_t ns)
{
	for (int i = 0; i < KINDS; i++) {
		struct entry *e = &t->v[i];
		const char *w = atomic_load_explicit(&e->what, memory_order_relaxed);
		if (!w)
			atomic_store_explicit(&e->what, w = what, memory_order_release);
		if (w == what) {
			atomic_store_explicit(&e->n, atomic_load_explicit(&e->n, memory_order_relaxed) + 1,
					      memory_order_relaxed);
			atomic_store_explicit(&e->ns, atomic_load_explicit(&e->ns, memory_order_relaxed) + ns,
					      memory_order_relaxed);
			return;
		}
	}
}

void waitstat_add(const char *what, int64_t ns)
{
	struct worker *w = worker_self();
	if (w && w->id < nworkers) {
		add(&per_worker[w->id], what, ns);
		return;
	}
	pthread_mutex_lock(&foreign_lock);
	add(&foreign, what, ns);
	pthread_mutex_unlock(&foreign_lock);
}

static int merge(weft_wait_stats *out, int n, int max, const struct table *t)
{
	for (int i = 0; i < KINDS; i++) {
		const char *what = atomic_load_explicit(&t->v[i].what, memory_order_acquire);
		if (!what)
			break;
		int k = 0;
		while (k < n && strcmp(out[k].what, what) != 0)
			k++;
		if (k == n) {
			if (n == max)
				continue;
			out[n++] = (weft_wait_stats){ .what = what };
		}
		out[k].waits += atomic_load_explicit(&t->v[i].n, memory_order_relaxed);
		out[k].wait_ns += atomic_load_explicit(&t->v[i].ns, memory_order_relaxed);
	}
	return n;
}

int weft_stats_waits(weft_wait_stats *out, int max)
{
	if (max < 0 || (max && !out))
		return -EINVAL;
	if (!atomic_load(&waitstat_on))
		return 0;
	int n = 0;
	for (int i = 0; i < nworkers; i++)
		n = merge(out, n, max, &per_worker[i]);
	pthread_mutex_lock(&foreign_lock);
	n = merge(out, n, max, &foreign);
	pthread_mutex_unlock(&foreign_lock);
	return n;
}

void waitstat_print(void)
{
	weft_wait_stats st[KINDS];
	int n = weft_stats_waits(st, KINDS);
	if (n <= 0)
		return;
	fprintf(stderr, "  waited for             waits    total ms   mean us\n");
	for (int i = 0; i < n; i++)
		fprintf(stderr, "  %-16s %12llu %11.1f %9.1f\n", st[i].what,
			(unsigned long long)st[i].waits, (double)st[i].wait_ns / 1e6,
			(double)st[i].wait_ns / 1e3 / (double)st[i].waits);
}
