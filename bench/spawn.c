/* bench/spawn: spawn and join 10^6 tiny tasks (in batches of 1,000): ns per task. */
#include <stdlib.h>

#include "bench.h"
#include "weft.h"

#ifndef N
#define N 1000000
#endif
#define BATCH 1000

static void tiny(void *arg)
{
	(void)arg;
}

static double per_task;

static int spawner(void *arg)
{
	(void)arg;
	static weft_task *t[BATCH];
	for (int i = 0; i < BATCH; i++) /* warm the stack cache */
		t[i] = weft_spawn(tiny, NULL);
	for (int i = 0; i < BATCH; i++)
		weft_join(t[i]);
	int64_t t0 = bench_now();
	for (int k = 0; k < N / BATCH; k++) {
		for (int i = 0; i < BATCH; i++)
			t[i] = weft_spawn(tiny, NULL);
		for (int i = 0; i < BATCH; i++)
			weft_join(t[i]);
	}
	per_task = (double)(bench_now() - t0) / N;
	return 0;
}

static void measure(const char *workers, const char *params, const char *target)
{
	double v[REPEAT];
	if (workers)
		setenv("WEFT_WORKERS", workers, 1);
	else
		unsetenv("WEFT_WORKERS");
	for (int r = 0; r < REPEAT; r++) {
		weft_run(spawner, NULL);
		v[r] = per_task;
	}
	char p[64];
	snprintf(p, sizeof p, "%s%s", params, target);
	bench_emit("spawn", "spawn+join", "ns/task", bench_quantile(v, REPEAT, 0.5), p);
}

int main(void)
{
	bench_progress("spawn: 10^6 spawn+join");
	measure("1", "workers=1", " target<=100");
	measure(NULL, "workers=default", "");
	return 0;
}
