/*
 * bench/tasks1m: 10^6 tasks alive at once, each parked in a 60-second sleep; peak resident
 * memory per task, and the time to spawn them all. Then all are cancelled (which ends their
 * sleeps) and joined: all of them must finish.
 */
#include <stdatomic.h>

#include "bench.h"
#include "weft.h"

#define N 1000000

static atomic_long parked, finished;
static int64_t wake_at;
static weft_task *tasks[N];

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
	wake_at = weft_now() + 60LL * 1000000000;
	int64_t t0 = bench_now();
	for (int i = 0; i < N; i++)
		if (!(tasks[i] = weft_spawn(sleeper, NULL))) {
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
	int64_t t1 = bench_now();
	for (int i = 0; i < N; i++)
		weft_cancel(tasks[i]);
	for (int i = 0; i < N; i++)
		weft_join(tasks[i]);
	bench_emit("tasks-1m", "cancel+join 10^6 sleepers", "s", (double)(bench_now() - t1) / 1e9,
		   "");
	bench_emit("tasks-1m", "all finished", "tasks", (double)atomic_load(&finished), "");
	return 0;
}

int main(void)
{
	bench_progress("tasks-1m: 10^6 parked tasks");
	return weft_run(main_task, NULL);
}
