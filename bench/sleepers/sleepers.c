/*
 * bench/sleepers: 10^5 tasks each call plain usleep(1000) ten times, through the shim (this
 * program re-runs itself with libweft-shim.so preloaded). Ideal wall time: 10 ms. Baselines:
 * sleepers-floor (floor.c), the least a runtime with a stack per task can do, resuming 10^5
 * stacks ten times each with nothing else; and where Go is installed, the same program with
 * goroutines and time.Sleep (bench/peers/sleepers.go).
 */
#define _GNU_SOURCE
#include <libgen.h>
#include <limits.h>
#include <stdlib.h>
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

/* The runs, in one weft_run as Go's baseline runs in one process: the first maps and faults
 * in the stacks (about 10^4: the first tasks end while weft_execute still spawns; see
 * docs/design.md, Timers), the later ones reuse them. */
static int repeats(void *arg)
{
	double *v = arg;
	for (int r = 0; r < REPEAT; r++) {
		int64_t t0 = bench_now();
		weft_execute(N, sleepy, NULL);
		v[r] = (double)(bench_now() - t0) / 1e6;
	}
	return 0;
}

/* The `ms=` figure a command prints, or 0 when it prints none. */
static double ms_of(const char *cmd)
{
	char line[128];
	double ms = 0;
	FILE *p = popen(cmd, "r");
	while (p && fgets(line, sizeof line, p))
		sscanf(line, "ms=%lf", &ms);
	if (p)
		pclose(p);
	return ms;
}

/* Go's time for the same program, or 0 when Go is not installed. */
static double go_ms(const char *dir)
{
	if (system("command -v go >/dev/null 2>&1") != 0) {
		fprintf(stderr, "  sleepers: go not installed (make bench-peers): no baseline\n");
		return 0;
	}
	char cmd[1200];
	snprintf(cmd, sizeof cmd, "cd '%s/../../bench/peers' 2>/dev/null || cd bench/peers; "
		 "env -u LD_PRELOAD go run sleepers.go", dir);
	return ms_of(cmd);
}

static double floor_ms(const char *dir)
{
	char cmd[1200];
	snprintf(cmd, sizeof cmd, "env -u LD_PRELOAD '%s/../bin/sleepers-floor'", dir);
	return ms_of(cmd);
}

int main(int argc, char **argv)
{
	(void)argc;
	char path[1024];
	snprintf(path, sizeof path, "%s", argv[0]);
	const char *dir = dirname(path);
	if (!getenv("WEFT_BENCH_SHIM")) {
		char lib[1100], abs[PATH_MAX];
		snprintf(lib, sizeof lib, "%s/../libweft-shim.so", dir);
		/* absolute: the children started below change directory */
		setenv("LD_PRELOAD", realpath(lib, abs) ? abs : lib, 1);
		setenv("WEFT_BENCH_SHIM", "1", 1);
		execv(argv[0], argv);
		perror("exec");
		return 1;
	}
	bench_progress("sleepers: 10^5 tasks x 10 x usleep(1000) through the shim");
	double v[REPEAT];
	weft_run(repeats, v);
	double cold = v[0], m = bench_quantile(v, REPEAT, 0.5);
	bench_emit("sleepers", "10^5 tasks x 10 x usleep(1ms)", "ms", m, "ideal 10, target<=20");
	bench_emit("sleepers", "the same, first run", "ms", cold, "stacks mapped and faulted in");
	bench_emit("sleepers", "wall / ideal", "x", m / 10.0, "target<=2");
	double floor = floor_ms(dir);
	if (floor > 0) {
		bench_emit("sleepers", "floor: 10^5 stacks resumed 10 times", "ms", floor,
			   "sleepers-floor: no timers, no queues");
		bench_emit("sleepers", "weft / floor", "x", m / floor, "");
	}
	double go = go_ms(dir);
	if (go > 0) {
		bench_emit("sleepers", "go: 10^5 goroutines x 10 x time.Sleep(1ms)", "ms", go,
			   "GOMAXPROCS=default");
		bench_emit("sleepers", "weft / go wall time", "x", m / go, "lower is better");
	}
	return 0;
}
