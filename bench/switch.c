/*
 * bench/switch: two tasks yielding to each other on one worker, ns per switch; and the same
 * ping-pong with swapcontext(3), the portable way to switch stacks, in the same run.
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
	double wm = bench_quantile(w, REPEAT, 0.5), um = bench_quantile(u, REPEAT, 0.5);
	bench_emit("switch", "weft yield", "ns/switch", wm, "workers=1 target<=10");
	bench_emit("switch", "swapcontext", "ns/switch", um, "baseline");
	bench_emit("switch", "swapcontext / weft", "x", um / wm, "target>=30");
	return 0;
}
