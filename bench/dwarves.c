/*
 * bench/dwarves: Snow White and the dwarves, timers under load. Runs build/bin/dwarves and
 * dwarves-detached (examples/dwarves: 10,000 apples, each eaten by a Dwarf in ten
 * usleep(100) naps) and reports their dwarves/s against, measured in the same run:
 *
 *   bound    a bare loop of 10,000 usleep(100): Snow White's own pace, the kernel's default
 *            timer slack (50 us) included;
 *   stretch  the same loop with the timer slack set to 1 ns (prctl PR_SET_TIMERSLACK), which
 *            is what weft's timers give a task;
 *   threads  a C baseline that starts a thread per apple;
 *   pool64   a C baseline that hands apples to a pool of 64 threads.
 *
 * Then the CPU variant: each Dwarf also spins 50 us after each nap (DWARF_WORK_US=50), 2,000
 * apples, for the flows and both baselines. This one is bound by the cores (0.5 ms of CPU per
 * apple), so it shows the run-time's overhead rather than sleep precision. Medians of 3 runs.
 */
#define _GNU_SOURCE
#include <libgen.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "bench.h"

#define APPLES 10000
#define CPU_APPLES 2000
#define RUNS 3

static long work_ns; /* CPU work per nap in the baselines */

static void spin_for(long ns)
{
	int64_t t = bench_now();
	while (bench_now() - t < ns)
		;
}

static void dwarf(void)
{
	for (int i = 0; i < 10; i++) {
		usleep(100);
		if (work_ns)
			spin_for(work_ns);
	}
}

/* ---- bounds ---------------------------------------------------------------------------- */

static void *bound_thread(void *arg)
{
	double *rate = arg;
	if (rate[1] > 0)
		prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
	int64_t t = bench_now();
	for (int i = 0; i < APPLES; i++)
		usleep(100);
	rate[0] = APPLES / ((double)(bench_now() - t) / 1e9);
	return NULL;
}

/* A fresh thread, so that the slack set for the stretch bound stays with it. */
static double bound(int stretch)
{
	double r[2] = { 0, stretch };
	pthread_t th;
	pthread_create(&th, NULL, bound_thread, r);
	pthread_join(th, NULL);
	return r[0];
}

/* ---- baselines ------------------------------------------------------------------------- */

static atomic_int eaten, live;

static void *apple_thread(void *arg)
{
	(void)arg;
	atomic_fetch_add(&eaten, 1);
	dwarf();
	atomic_fetch_sub(&live, 1);
	return NULL;
}

static double threads(int apples)
{
	pthread_attr_t a;
	pthread_attr_init(&a);
	pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&a, 64 * 1024);
	atomic_store(&eaten, 0);
	int64_t t = bench_now();
	for (int i = 0; i < apples; i++) {
		pthread_t th;
		atomic_fetch_add(&live, 1);
		if (pthread_create(&th, &a, apple_thread, NULL))
			atomic_fetch_sub(&live, 1);
		usleep(100);
	}
	while (atomic_load(&live))
		usleep(100);
	pthread_attr_destroy(&a);
	return atomic_load(&eaten) / ((double)(bench_now() - t) / 1e9);
}

static struct {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int queued, done;
} Q = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0 };

static void *pool_thread(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&Q.lock);
	for (;;) {
		while (!Q.queued && !Q.done)
			pthread_cond_wait(&Q.cond, &Q.lock);
		if (!Q.queued)
			break;
		Q.queued--;
		pthread_mutex_unlock(&Q.lock);
		atomic_fetch_add(&eaten, 1);
		dwarf();
		pthread_mutex_lock(&Q.lock);
	}
	pthread_mutex_unlock(&Q.lock);
	return NULL;
}

static double pool64(int apples)
{
	pthread_t th[64];
	Q.done = 0;
	atomic_store(&eaten, 0);
	for (int i = 0; i < 64; i++)
		pthread_create(&th[i], NULL, pool_thread, NULL);
	int64_t t = bench_now();
	for (int i = 0; i < apples; i++) {
		pthread_mutex_lock(&Q.lock);
		Q.queued++;
		pthread_cond_signal(&Q.cond);
		pthread_mutex_unlock(&Q.lock);
		usleep(100);
	}
	pthread_mutex_lock(&Q.lock);
	Q.done = 1;
	pthread_cond_broadcast(&Q.cond);
	pthread_mutex_unlock(&Q.lock);
	for (int i = 0; i < 64; i++)
		pthread_join(th[i], NULL);
	return atomic_load(&eaten) / ((double)(bench_now() - t) / 1e9);
}

/* ---- the flows ------------------------------------------------------------------------- */

static char bindir[1024];

/* Run a dwarves program and return its dwarves/s (0 on failure). */
static double flow(const char *prog, int apples, int work_us)
{
	char cmd[1400], line[256];
	snprintf(cmd, sizeof cmd, "DWARVES_APPLES=%d DWARF_WORK_US=%d '%s/%s'", apples, work_us,
		 bindir, prog);
	FILE *p = popen(cmd, "r");
	double rate = 0;
	while (p && fgets(line, sizeof line, p)) {
		char *d = strstr(line, "dispatched ");
		if (d)
			rate = atof(d + strlen("dispatched "));
	}
	if (!p || pclose(p) != 0 || rate <= 0) {
		fprintf(stderr, "  dwarves: %s failed\n", cmd);
		return 0;
	}
	return rate;
}

static double median(double *v)
{
	return bench_quantile(v, RUNS, 0.5);
}

static void emit(const char *name, double rate, double b, double s)
{
	char params[160];
	snprintf(params, sizeof params, "x_bound=%.3f x_stretch=%.3f target>=0.98 of bound", rate / b,
		 rate / s);
	bench_emit("dwarves", name, "dwarves/s", rate, params);
}

int main(int argc, char **argv)
{
	(void)argc;
	char d[1024];
	snprintf(d, sizeof d, "%s", argv[0]);
	snprintf(bindir, sizeof bindir, "%s/../bin", dirname(d));
	bench_progress("dwarves: 10,000 apples x 10 x usleep(100), weft flows vs bounds and threads");
	double b[RUNS], s[RUNS], w[RUNS], wd[RUNS], th[RUNS], pl[RUNS];
	for (int r = 0; r < RUNS; r++) {
		b[r] = bound(0);
		s[r] = bound(1);
		w[r] = flow("dwarves", APPLES, 0);
		wd[r] = flow("dwarves-detached", APPLES, 0);
		th[r] = threads(APPLES);
		pl[r] = pool64(APPLES);
	}
	double B = median(b), S = median(s);
	bench_emit("dwarves", "bound: loop of usleep(100)", "apples/s", B, "default timer slack");
	bench_emit("dwarves", "stretch: loop, slack 1 ns", "apples/s", S, "PR_SET_TIMERSLACK=1");
	emit("weft flow", median(w), B, S);
	emit("weft flow, detached Dwarf", median(wd), B, S);
	emit("thread per apple", median(th), B, S);
	emit("pool of 64 threads", median(pl), B, S);

	bench_progress("dwarves: the same with 50 us of CPU work after each nap (2,000 apples)");
	work_ns = 50000;
	for (int r = 0; r < RUNS; r++) {
		w[r] = flow("dwarves", CPU_APPLES, 50);
		wd[r] = flow("dwarves-detached", CPU_APPLES, 50);
		th[r] = threads(CPU_APPLES);
		pl[r] = pool64(CPU_APPLES);
	}
	double T = median(th);
	char params[160];
	const char *names[] = { "cpu 50us: weft flow", "cpu 50us: weft flow, detached",
				"cpu 50us: thread per apple", "cpu 50us: pool of 64 threads" };
	double *vals[] = { w, wd, th, pl };
	for (int i = 0; i < 4; i++) {
		double m = median(vals[i]);
		snprintf(params, sizeof params, "x_threads=%.3f x_bound=%.3f", m / T, m / B);
		bench_emit("dwarves", names[i], "dwarves/s", m, params);
	}
	return 0;
}
