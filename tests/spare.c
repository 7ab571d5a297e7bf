/*
 * Tests of the monitor's spare workers (src/monitor.c): tasks held in calls the
 * shim does not cover get threads of their own as fast as they block, up to a cap that is a
 * setting ($WEFT_MAX_SPARES) and says so once it is reached.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "test.h"

/* A system call the shim does not see (nor would it, preloaded): the thread blocks in the
 * kernel for ms milliseconds, holding its worker. */
static void block_raw(int64_t ns)
{
	struct timespec ts = { ns / 1000000000, ns % 1000000000 };
	syscall(SYS_nanosleep, &ts, NULL);
}

static atomic_int blocked_done;

static void block_20ms(void *arg)
{
	(void)arg;
	block_raw(20 * MS);
	atomic_fetch_add(&blocked_done, 1);
}

/* Sleeps 1 ms at a time until `want` tasks are done, keeping the worst lateness. */
static _Atomic int64_t worst_late;

static void heartbeat(void *arg)
{
	int want = (int)(intptr_t)arg;
	int64_t next = weft_now();
	while (atomic_load(&blocked_done) < want) {
		next += MS;
		CHECK_EQ(weft_sleep_until(next), 0);
		int64_t late = weft_now() - next;
		if (late > atomic_load(&worst_late))
			atomic_store(&worst_late, late);
		if (late > 0)
			next = weft_now(); /* one late beat, not a burst of overdue ones */
	}
}

/* ---- 200 tasks each blocked 20 ms finish together --------------------------------------- */

enum { BLOCKERS = 200 };

static int two_hundred_blocked(void *arg)
{
	(void)arg;
	int64_t t0 = weft_now();
	weft_task *h = weft_spawn(heartbeat, (void *)(intptr_t)BLOCKERS), *t[BLOCKERS];
	CHECK(h);
	for (int i = 0; i < BLOCKERS; i++)
		CHECK((t[i] = weft_spawn(block_20ms, NULL)));
	for (int i = 0; i < BLOCKERS; i++)
		CHECK_EQ(weft_join(t[i]), 0);
	int64_t took = weft_now() - t0;
	CHECK_EQ(weft_join(h), 0);
	fprintf(stderr, "%d tasks x 20 ms blocked in the kernel: %.1f ms, heartbeat %.1f ms late "
			"at worst, %d workers\n",
		BLOCKERS, took / 1e6, atomic_load(&worst_late) / 1e6, weft_stats(NULL, 0, NULL));
	/* Each on a thread of its own: 20 ms, plus the 1-2 ms a spare takes to be started for
	 * each worker that blocks, doubling the threads each time (45-60 ms on 2 loaded cores).
	 * With spares capped at max(4, workers): 700 ms, the heartbeat 240-480 ms late. */
	bool slow = SLOW || test_emulated();
	CHECK(took < (slow ? 1500 : 350) * MS);
	CHECK(atomic_load(&worst_late) < (slow ? 500 : 100) * MS);
	return 0;
}

TEST(tasks_blocked_in_calls_the_shim_does_not_cover_each_get_a_thread)
{
	RUN(two_hundred_blocked);
}

/* After the burst the spares beyond max(4, workers) go to standby at once, not after the
 * second that the first few wait ($WEFT_SPARE_MS, here 10 s): left on the idle list, a hundred
 * of them took the next work between them and the kernel time-sliced them. */
static int working_after_burst(void *arg)
{
	int workers = *(int *)arg;
	weft_task *t[BLOCKERS];
	for (int i = 0; i < BLOCKERS; i++)
		CHECK((t[i] = weft_spawn(block_20ms, NULL)));
	for (int i = 0; i < BLOCKERS; i++)
		CHECK_EQ(weft_join(t[i]), 0);
	int kept = workers > 4 ? workers : 4, all = 0, working = 0;
	int64_t t0 = weft_now();
	static weft_worker_stats st[BLOCKERS + 64];
	for (;;) {
		all = weft_stats(st, BLOCKERS + 64, NULL);
		working = 0;
		for (int i = 0; i < all && i < BLOCKERS + 64; i++)
			working += !st[i].standby;
		if (working <= workers + kept || weft_now() - t0 > 800 * MS)
			break;
		weft_sleep_until(weft_now() + MS);
	}
	fprintf(stderr, "%d workers, %d of them working %.1f ms after the burst\n", all, working,
		(weft_now() - t0) / 1e6);
	CHECK(all > workers + kept); /* a burst it was */
	CHECK(working <= workers + kept);
	return 0;
}

TEST(after_a_burst_spares_beyond_the_first_few_go_to_standby_at_once)
{
	setenv("WEFT_WORKERS", "2", 1);
	setenv("WEFT_SPARE_MS", "10000", 1);
	int workers = 2;
	CHECK_EQ(weft_run(working_after_burst, &workers), 0);
}

/* ---- the cap is a setting, said once when reached ------------------------------------------ */

static int most_workers(void)
{
	weft_worker_stats st[8];
	return weft_stats(st, 8, NULL);
}

static int capped_run(void *arg)
{
	(void)arg;
	CHECK_EQ(weft_worker_max(), 1 + 2);
	weft_task *t[20];
	for (int i = 0; i < 20; i++)
		CHECK((t[i] = weft_spawn(block_20ms, NULL)));
	int most = 0;
	while (atomic_load(&blocked_done) < 20) {
		int n = most_workers();
		most = n > most ? n : most;
		weft_sleep_until(weft_now() + MS);
	}
	for (int i = 0; i < 20; i++)
		CHECK_EQ(weft_join(t[i]), 0);
	CHECK(most <= 1 + 2);
	return 0;
}

TEST(child_capped)
{
	setenv("WEFT_WORKERS", "1", 1);
	setenv("WEFT_MAX_SPARES", "2", 1);
	RUN(capped_run);
}

TEST(the_spare_cap_is_a_setting_and_reaching_it_is_said_once)
{
	char cmd[512], err[4096];
	snprintf(cmd, sizeof cmd, "%s child_capped", test_argv0);
	int st = test_spawn(cmd, err, sizeof err);
	if (st)
		fprintf(stderr, "child: status %d\n%s", st, err);
	CHECK_EQ(st, 0);
	const char *line = "weft: all 2 spare workers are in use (WEFT_MAX_SPARES)";
	const char *first = strstr(err, line);
	CHECK(first);
	CHECK(!strstr(first + 1, line));
}

static int max_of_run(void *arg)
{
	*(int *)arg = weft_worker_max();
	return 0;
}

/* Without the setting: 10,000 spares, or fewer when RLIMIT_NPROC allows fewer threads. */
TEST(the_default_cap_is_ten_thousand_spares_or_what_rlimit_nproc_allows)
{
	setenv("WEFT_WORKERS", "2", 1);
	unsetenv("WEFT_MAX_SPARES");
	struct rlimit r;
	CHECK_EQ(getrlimit(RLIMIT_NPROC, &r), 0);
	long want = r.rlim_cur == RLIM_INFINITY || r.rlim_cur > 10000 ? 10000 : (long)r.rlim_cur;
	int max = 0;
	CHECK_EQ(weft_run(max_of_run, &max), 0);
	CHECK_EQ(max, 2 + want);
	if (r.rlim_cur > 500) { /* one worker: the lower limit may leave no room for threads */
		struct rlimit lower = { 500, r.rlim_max };
		CHECK_EQ(setrlimit(RLIMIT_NPROC, &lower), 0);
		setenv("WEFT_WORKERS", "1", 1);
		CHECK_EQ(weft_run(max_of_run, &max), 0);
		CHECK_EQ(max, 1 + 500);
		CHECK_EQ(setrlimit(RLIMIT_NPROC, &r), 0);
		setenv("WEFT_WORKERS", "2", 1);
	}
	setenv("WEFT_MAX_SPARES", "0", 1);
	CHECK_EQ(weft_run(max_of_run, &max), 0);
	CHECK_EQ(max, 2);
}

/* ---- stress: bursts of blocked tasks beside channels, spawns and plain threads ------------ */

/* Round after round, tasks on every worker block in the kernel for 1-4 ms, so that spares
 * start (their records made while the other workers steal from them and look them over) and
 * go to standby between rounds (WEFT_SPARE_MS=20) to be called back, while other tasks and
 * plain threads feed one channel and tasks spawn tasks. Everything sent is received once. */
enum { ROUNDS = 20, BURST = 60, THREADS = 3, PER_THREAD = 200 };
static weft_chan *sink;
static atomic_int spawned_kids;

static void kid(void *arg)
{
	(void)arg;
	atomic_fetch_add(&spawned_kids, 1);
}

static void burst_task(void *arg)
{
	int i = (int)(intptr_t)arg;
	block_raw((1 + i % 4) * MS);
	weft_task *k = weft_spawn(kid, NULL);
	CHECK(k);
	weft_yield();
	CHECK_EQ(weft_join(k), 0);
	int v = 1;
	CHECK_EQ(weft_chan_put(sink, &v, sizeof v), 0);
}

static void *feeder(void *arg)
{
	(void)arg;
	for (int i = 0; i < PER_THREAD; i++) {
		int v = 1;
		CHECK_EQ(weft_chan_put(sink, &v, sizeof v), 0);
		if (i % 16 == 0)
			usleep(500);
	}
	return NULL;
}

static void collector(void *arg)
{
	long *got = arg;
	for (int n = 0; n < ROUNDS * BURST + THREADS * PER_THREAD; n++) {
		int v;
		CHECK_EQ(weft_chan_take(sink, &v, sizeof v), (int)sizeof v);
		*got += v;
	}
}

static int bursts(void *arg)
{
	(void)arg;
	CHECK((sink = weft_chan_new(16, sizeof(int))));
	long got = 0;
	weft_task *c = weft_spawn(collector, &got);
	CHECK(c);
	pthread_t th[THREADS];
	for (int i = 0; i < THREADS; i++)
		CHECK_EQ(pthread_create(&th[i], NULL, feeder, NULL), 0);
	for (int round = 0; round < ROUNDS; round++) {
		weft_task *t[BURST];
		for (int i = 0; i < BURST; i++)
			CHECK((t[i] = weft_spawn(burst_task, (void *)(intptr_t)i)));
		for (int i = 0; i < BURST; i++)
			CHECK_EQ(weft_join(t[i]), 0);
		if (round % 5 == 4) /* long enough for some spares to go to standby */
			weft_sleep_until(weft_now() + 30 * MS);
	}
	CHECK_EQ(weft_join(c), 0);
	for (int i = 0; i < THREADS; i++)
		pthread_join(th[i], NULL);
	CHECK_EQ(got, ROUNDS * BURST + THREADS * PER_THREAD);
	CHECK_EQ(atomic_load(&spawned_kids), ROUNDS * BURST);
	int v;
	CHECK_EQ(weft_chan_poll(sink, &v, sizeof v), -EAGAIN);
	weft_chan_free(sink);
	fprintf(stderr, "%d workers at the end\n", weft_stats(NULL, 0, NULL));
	return 0;
}

TEST(bursts_of_blocked_tasks_beside_channels_spawns_and_threads)
{
	setenv("WEFT_SPARE_MS", "20", 1);
	RUN(bursts);
}
