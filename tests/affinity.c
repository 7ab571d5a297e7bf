/* Tests of pinning: one worker per CPU of weft_run's caller's set, each on its own CPU
 * (src/affinity.c), and the threads that must not stay pinned. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "test.h"

static cpu_set_t set; /* the CPUs this test gave itself */

/* Confine this thread (weft_run's caller) to its first k allowed CPUs; false if it has fewer. */
static bool use_cpus(int k)
{
	cpu_set_t have;
	CHECK(sched_getaffinity(0, sizeof have, &have) == 0);
	CPU_ZERO(&set);
	for (int c = 0, n = 0; c < CPU_SETSIZE && n < k; c++)
		if (CPU_ISSET(c, &have)) {
			CPU_SET(c, &set);
			n++;
		}
	if (CPU_COUNT(&set) < k) {
		printf("not tested: %d CPU(s) here, the test needs %d\n", CPU_COUNT(&set), k);
		return false;
	}
	CHECK(sched_setaffinity(0, sizeof set, &set) == 0);
	return true;
}

/* WEFT_WORKERS and WEFT_PIN as given (NULL: unset), on 2 CPUs; false where there are fewer. */
static bool on_two_cpus(const char *workers, const char *pin)
{
	if (workers)
		setenv("WEFT_WORKERS", workers, 1);
	else
		unsetenv("WEFT_WORKERS");
	if (pin)
		setenv("WEFT_PIN", pin, 1);
	else
		unsetenv("WEFT_PIN");
	return use_cpus(2);
}

static int my_cpus(int *only)
{
	cpu_set_t m;
	CHECK(sched_getaffinity(0, sizeof m, &m) == 0);
	for (int c = 0; c < CPU_SETSIZE; c++)
		if (CPU_ISSET(c, &m))
			*only = c;
	return CPU_COUNT(&m);
}

/* What tasks saw of workers 0 and 1: how many CPUs each may use, and the last of them. */
static atomic_int ncpus[2], cpu[2];

static void look(void *arg)
{
	(void)arg;
	for (int i = 0; i < 1000 && !(atomic_load(&ncpus[0]) && atomic_load(&ncpus[1])); i++) {
		int id = weft_worker_id(), c = -1, n = my_cpus(&c);
		if (id == 0 || id == 1) {
			atomic_store(&cpu[id], c);
			atomic_store(&ncpus[id], n);
		}
		weft_sleep_until(weft_now() + 10000); /* park, so that the other worker steals */
	}
}

static void see_both_workers(void)
{
	CHECK_EQ(weft_execute(64, look, NULL), 0);
	CHECK(atomic_load(&ncpus[0]) && atomic_load(&ncpus[1]));
}

static atomic_int thread_before, thread_after;

static void *plain_thread(void *arg)
{
	(void)arg;
	int c;
	atomic_store(&thread_before, my_cpus(&c));
	CHECK_EQ(weft_unpin(), 0);
	atomic_store(&thread_after, my_cpus(&c));
	return NULL;
}

static atomic_int pool_cpus;

static void in_pool(void *arg)
{
	(void)arg;
	int c;
	atomic_store(&pool_cpus, my_cpus(&c));
}

static int pinned_main(void *arg)
{
	(void)arg;
	CHECK_EQ(weft_stats(NULL, 0, NULL), 2);
	see_both_workers();
	for (int i = 0; i < 2; i++) {
		CHECK_EQ(atomic_load(&ncpus[i]), 1);
		CHECK(CPU_ISSET(atomic_load(&cpu[i]), &set));
	}
	CHECK(atomic_load(&cpu[0]) != atomic_load(&cpu[1]));
	/* started by a task: on its worker's CPU until it unpins; unless the task runs on a spare
	 * worker (the monitor starts one for a worker it finds stuck, as on a loaded machine under
	 * TSan), which is not pinned */
	int id = weft_worker_id();
	pthread_t th;
	CHECK_EQ(pthread_create(&th, NULL, plain_thread, NULL), 0);
	CHECK_EQ(weft_blocking(in_pool, NULL), 0);
	pthread_join(th, NULL);
	CHECK_EQ(atomic_load(&thread_before), id < 2 ? 1 : 2);
	CHECK_EQ(atomic_load(&thread_after), 2);
	CHECK_EQ(atomic_load(&pool_cpus), 2);
	return 0;
}

TEST(one_worker_pinned_per_cpu)
{
	if (!on_two_cpus(NULL, NULL))
		return;
	RUN(pinned_main);
	cpu_set_t after; /* the caller has its set back */
	CHECK(sched_getaffinity(0, sizeof after, &after) == 0);
	CHECK(CPU_EQUAL(&after, &set));
}

/* arg: how many workers weft must have started, none of them pinned. */
static int unpinned_main(void *arg)
{
	int n = *(int *)arg, c;
	CHECK_EQ(weft_stats(NULL, 0, NULL), n);
	if (n == 1) {
		CHECK_EQ(my_cpus(&c), 2);
	} else {
		see_both_workers();
		CHECK_EQ(atomic_load(&ncpus[0]), 2);
		CHECK_EQ(atomic_load(&ncpus[1]), 2);
	}
	CHECK_EQ(weft_unpin(), 0);
	return 0;
}

TEST(pin_0_leaves_workers_unpinned)
{
	int n = 2;
	if (on_two_cpus(NULL, "0"))
		CHECK_EQ(weft_run(unpinned_main, &n), 0);
}

/* More workers than CPUs: cores are shared anyway, and nothing is pinned. */
TEST(more_workers_than_cpus_unpinned)
{
	int n = 3;
	if (on_two_cpus("3", NULL))
		CHECK_EQ(weft_run(unpinned_main, &n), 0);
}

/* One worker on a machine with more CPUs: pinning it would stack every such program on the
 * first CPU. */
TEST(one_worker_unpinned)
{
	int n = 1;
	if (on_two_cpus("1", NULL))
		CHECK_EQ(weft_run(unpinned_main, &n), 0);
}

/* The default count follows the caller's CPU set, not the machine's online CPUs. */
static int count_main(void *arg)
{
	CHECK_EQ(weft_stats(NULL, 0, NULL), *(int *)arg);
	return 0;
}

TEST(default_workers_follow_the_cpu_set)
{
	unsetenv("WEFT_WORKERS");
	/* the monitor may start a spare beside a worker it finds held (as a slow emulator makes
	 * it), which weft_stats counts: none here, so that the count is the default's */
	setenv("WEFT_MAX_SPARES", "0", 1);
	for (int k = 2; k >= 1; k--) /* each set inside the one before */
		if (use_cpus(k))
			CHECK_EQ(weft_run(count_main, &k), 0);
}
