/*
 * bench/sleepers: 10^5 tasks each call plain usleep(1000) ten times, through the shim (this
 * program re-runs itself with libweft-shim.so preloaded). Ideal wall time: 10 ms.
 */
#define _GNU_SOURCE
#include <libgen.h>
#include <unistd.h>

#include "bench.h"
#include "weft.h"

#define N 100000

static void sleepy(void *arg)
{
	(void)arg;
	for (int i = 0; i < 10; i++)
		usleep(1000); /* plain libc name: the shim makes it a task sleep */
}

int main(int argc, char **argv)
{
	(void)argc;
	if (!getenv("WEFT_BENCH_SHIM")) {
		char dir[1024], lib[1100];
		snprintf(dir, sizeof dir, "%s", argv[0]);
		snprintf(lib, sizeof lib, "%s/../libweft-shim.so", dirname(dir));
		setenv("LD_PRELOAD", lib, 1);
		setenv("WEFT_BENCH_SHIM", "1", 1);
		execv(argv[0], argv);
		perror("exec");
		return 1;
	}
	bench_progress("sleepers: 10^5 tasks x 10 x usleep(1000) through the shim");
	double v[REPEAT];
	for (int r = 0; r < REPEAT; r++) {
		int64_t t0 = bench_now();
		weft_execute(N, sleepy, NULL);
		v[r] = (double)(bench_now() - t0) / 1e6;
	}
	double m = bench_quantile(v, REPEAT, 0.5);
	bench_emit("sleepers", "10^5 tasks x 10 x usleep(1ms)", "ms", m, "ideal 10, target<=20");
	bench_emit("sleepers", "wall / ideal", "x", m / 10.0, "target<=2");
	return 0;
}
