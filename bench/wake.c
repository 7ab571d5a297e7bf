/*
 * bench/wake: how long a parked task takes to run again once woken (p50/p99 over many
 * samples), and how late a 100 us sleep ends, against usleep(100) in the same run.
 *
 *  - task -> task: the waker cancels a parked task and parks itself at once; the woken task
 *    was parked on whichever worker it last ran and resumes on the waker's (direct hand-off).
 *  - thread -> task: a plain thread wakes a task; the task goes through the global queue and
 *    a sleeping worker is woken by futex.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "bench.h"
#include "weft.h"

#define SAMPLES 2000

static _Atomic int64_t t_wake;
static atomic_int ready;
static double lat[SAMPLES];

static void parked(void *arg)
{
	double *out = arg;
	atomic_store(&ready, 1);
	weft_sleep_until(WEFT_FOREVER); /* -ECANCELED */
	*out = (double)(bench_now() - atomic_load(&t_wake));
}

static void settle(void)
{
	while (!atomic_load(&ready))
		weft_yield();
	atomic_store(&ready, 0);
	weft_sleep_until(weft_now() + 20000); /* let it park, and the workers go quiet */
}

static int task_to_task(void *arg)
{
	(void)arg;
	for (int i = 0; i < SAMPLES; i++) {
		weft_task *t = weft_spawn(parked, &lat[i]);
		settle();
		atomic_store(&t_wake, bench_now());
		weft_cancel(t);
		weft_join(t);
	}
	return 0;
}

static weft_task *target;
static atomic_int go;

static void *waker_thread(void *arg)
{
	(void)arg;
	for (int i = 0; i < SAMPLES; i++) {
		while (atomic_load(&go) != i + 1)
			usleep(50);
		atomic_store(&t_wake, bench_now());
		weft_cancel(target);
	}
	return NULL;
}

static int thread_to_task(void *arg)
{
	(void)arg;
	pthread_t th;
	pthread_create(&th, NULL, waker_thread, NULL);
	for (int i = 0; i < SAMPLES; i++) {
		target = weft_spawn(parked, &lat[i]);
		settle();
		atomic_store(&go, i + 1);
		weft_join(target);
	}
	pthread_join(th, NULL);
	return 0;
}

static int sleeps(void *arg)
{
	(void)arg;
	for (int i = 0; i < SAMPLES; i++) {
		int64_t d = weft_now() + 100000;
		weft_sleep_until(d);
		lat[i] = (double)(weft_now() - d);
	}
	return 0;
}

static void report(const char *name, const char *params)
{
	char p[128];
	snprintf(p, sizeof p, "p99=%.1fus %s", bench_quantile(lat, SAMPLES, 0.99) / 1e3, params);
	bench_emit("wake", name, "us p50", bench_quantile(lat, SAMPLES, 0.5) / 1e3, p);
}

int main(void)
{
	bench_progress("wake: wake-up latency and sleep lateness");
	weft_run(task_to_task, NULL);
	report("wake task->task", "workers=default");
	weft_run(thread_to_task, NULL);
	report("wake thread->task", "workers=default");
	weft_run(sleeps, NULL);
	report("sleep 100us: late by", "target p50<=30us");
	for (int i = 0; i < SAMPLES; i++) {
		int64_t t0 = bench_now();
		usleep(100);
		lat[i] = (double)(bench_now() - t0 - 100000);
	}
	report("usleep(100): late by", "baseline");
	return 0;
}
