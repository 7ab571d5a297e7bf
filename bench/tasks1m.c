/*
 * bench/tasks1m: 10^6 tasks alive at once, each parked in a sleep; peak resident memory per
 * task, and the time to spawn them all. All of them must wake and finish.
 */
#include <stdatomic.h>

#include "bench.h"
#include "weft.h"

#define N 1000000

static atomic_long parked, finished;
static int64_t wake_at;

static long rss_kib(const char *field)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long v = -1;
	size_t n = strlen(field);
	while (f && fgets(line, sizeof line, f))
		if (strncmp(line, field, n) == 0)
			v = atol(line + n + 1);
	if (f)
		fclose(f);
	return v;
}

static void sleeper(void *arg)
{
	(void)arg;
	atomic_fetch_add(&parked, 1);
	weft_sleep_until(wake_at);
	atomic_fetch_add(&finished, 1);
}

static int main_task(void *arg)
{
	(void)arg;
	long before = rss_kib("VmRSS:");
	wake_at = weft_now() + 3LL * 1000000000; /* long enough to spawn them all */
	weft_spawn_opts o = { .detached = 1 };
	int64_t t0 = bench_now();
	for (int i = 0; i < N; i++)
		if (!weft_spawn_opt(sleeper, NULL, &o)) {
			fprintf(stderr, "spawn %d failed\n", i);
			return 1;
		}
	while (atomic_load(&parked) < N)
		weft_sleep_until(weft_now() + 1000000);
	double spawn_s = (double)(bench_now() - t0) / 1e9;
	long peak = rss_kib("VmHWM:");
	bench_emit("tasks-1m", "spawn 10^6 sleepers", "s", spawn_s, "workers=default");
	bench_emit("tasks-1m", "resident memory per parked task", "KiB", (double)(peak - before) / N,
		   "target<=8");
	/* They wake at wake_at: wait for them. */
	fprintf(stderr, "  waiting for the sleepers...\n");
	while (atomic_load(&finished) < N)
		weft_sleep_until(weft_now() + 10000000);
	bench_emit("tasks-1m", "all finished", "tasks", (double)atomic_load(&finished), "");
	return 0;
}

int main(void)
{
	bench_progress("tasks-1m: 10^6 parked tasks");
	return weft_run(main_task, NULL);
}
