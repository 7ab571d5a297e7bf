/*
 * bench/switch: two tasks yielding to each other on one worker, ns per switch; and the same
 * ping-pong with swapcontext(3), the portable way to switch stacks, in the same run; and the
 * weft ping-pong again with tracing on.
 */
#define _GNU_SOURCE
#include <ucontext.h>

#include "bench.h"
#include "weft.h"

#ifndef N
#define N 10000000
#endif

static void yielder(void *arg)
{
	(void)arg;
	for (int i = 0; i < N; i++)
		weft_yield();
}

static double weft_run_once;

static int weft_main(void *arg)
{
	(void)arg;
	weft_task *a = weft_spawn(yielder, NULL), *b = weft_spawn(yielder, NULL);
	int64_t t0 = bench_now();
	weft_join(a);
	weft_join(b);
	weft_run_once = (double)(bench_now() - t0) / (2.0 * N);
	return 0;
}

static ucontext_t uc_main, uc_a, uc_b;

static void uc_loop(int which)
{
	for (int i = 0; i < N / 10; i++)
		swapcontext(which ? &uc_b : &uc_a, which ? &uc_a : &uc_b);
	setcontext(&uc_main);
}

static double swapcontext_once(void)
{
	static char sa[65536], sb[65536];
	getcontext(&uc_a);
	uc_a.uc_stack = (stack_t){ .ss_sp = sa, .ss_size = sizeof sa };
	makecontext(&uc_a, (void (*)(void))uc_loop, 1, 0);
	getcontext(&uc_b);
	uc_b.uc_stack = (stack_t){ .ss_sp = sb, .ss_size = sizeof sb };
	makecontext(&uc_b, (void (*)(void))uc_loop, 1, 1);
	int64_t t0 = bench_now();
	swapcontext(&uc_main, &uc_a);
	return (double)(bench_now() - t0) / (2.0 * (N / 10));
}

int main(void)
{
	setenv("WEFT_WORKERS", "1", 1);
	double w[REPEAT], u[REPEAT];
	bench_progress("switch: weft_yield and swapcontext ping-pong");
	for (int r = 0; r < REPEAT; r++) {
		weft_run(weft_main, NULL);
		w[r] = weft_run_once;
		u[r] = swapcontext_once();
	}
	/* The cost of tracing when on: rings of 2^16 events wrap many times, so this is the
	 * steady cost of recording (the file, written after the timing, goes to /dev/null). */
	double tr[REPEAT];
	setenv("WEFT_TRACE", "/dev/null", 1);
	setenv("WEFT_TRACE_EVENTS", "65536", 1);
	for (int r = 0; r < REPEAT; r++) {
		weft_run(weft_main, NULL);
		tr[r] = weft_run_once;
	}
	unsetenv("WEFT_TRACE");
	double wm = bench_quantile(w, REPEAT, 0.5), um = bench_quantile(u, REPEAT, 0.5);
	double tm = bench_quantile(tr, REPEAT, 0.5);
	bench_emit("switch", "weft yield", "ns/switch", wm, "workers=1 target<=10");
	bench_emit("switch", "swapcontext", "ns/switch", um, "baseline");
	bench_emit("switch", "swapcontext / weft", "x", um / wm, "target>=30");
	bench_emit("switch", "weft yield, trace on", "ns/switch", tm, "WEFT_TRACE");
	return 0;
}
