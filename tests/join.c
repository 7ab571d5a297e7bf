/*
 * Tests of a task's handle and the waits around it: joining with a deadline (from tasks and
 * plain threads, racing the task's exit), handles that outlive their task (generations), and
 * the relative sleep.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "test.h"

/* A task that waits until the channel it is given is closed. */
static void wait_for_close(void *arg)
{
	CHECK_EQ(weft_chan_take(arg, NULL, 0), -EPIPE);
}

static int join_until_times_out(void *arg)
{
	(void)arg;
	weft_chan *c = weft_chan_new(0, 1);
	CHECK(c);
	weft_task *t = weft_spawn(wait_for_close, c);
	CHECK(t);
	int64_t start = weft_now();
	CHECK_EQ(weft_join_until(t, start + 5 * MS), -ETIMEDOUT);
	CHECK(weft_now() >= start + 5 * MS);
	CHECK_EQ(weft_join_until(t, weft_now() - 1), -ETIMEDOUT); /* past: only looks */
	CHECK_EQ(weft_join_until(t, 0), -ETIMEDOUT);
	weft_chan_close(c);
	CHECK_EQ(weft_join_until(t, weft_now() + 60000 * MS), 0); /* still joinable */
	weft_chan_free(c);
	return 0;
}

TEST(join_until_times_out_and_the_task_stays_joinable)
{
	RUN(join_until_times_out);
}

static void nothing(void *arg)
{
	(void)arg;
}

static int join_until_finished(void *arg)
{
	(void)arg;
	weft_task *t = weft_spawn(nothing, NULL);
	CHECK(t);
	while (weft_join_until(t, weft_now() - 1) == -ETIMEDOUT) /* polls until it has ended */
		weft_yield();
	t = weft_spawn(nothing, NULL);
	CHECK_EQ(weft_join_until(t, weft_now() + 60000 * MS), 0);
	return 0;
}

TEST(join_until_with_a_past_deadline_joins_a_finished_task)
{
	RUN(join_until_finished);
}

/* The joiner is cancelled while it waits: -ECANCELED, and the target can be joined later. */
static void join_and_expect_cancel(void *arg)
{
	CHECK_EQ(weft_join_until(arg, weft_now() + 60000 * MS), -ECANCELED);
}

static int join_until_cancelled(void *arg)
{
	(void)arg;
	weft_chan *c = weft_chan_new(0, 1);
	weft_task *target = weft_spawn(wait_for_close, c);
	weft_task *joiner = weft_spawn(join_and_expect_cancel, target);
	while (weft_chan_waiting(c) == 0) /* the target is parked */
		weft_yield();
	CHECK_EQ(weft_join_until(joiner, weft_now() + 2 * MS), -ETIMEDOUT); /* joiner waits too */
	CHECK_EQ(weft_cancel(joiner), 0);
	CHECK_EQ(weft_join(joiner), 0);
	weft_chan_close(c);
	CHECK_EQ(weft_join(target), 0);
	weft_chan_free(c);
	return 0;
}

TEST(join_until_cancelled_leaves_the_target_joinable)
{
	RUN(join_until_cancelled);
}

/* Plain threads join with deadlines too: they time out while the task waits, then join it. */
static void *thread_join_until(void *arg)
{
	int64_t start = weft_now();
	CHECK_EQ(weft_join_until(arg, start + 3 * MS), -ETIMEDOUT);
	CHECK(weft_now() >= start + 3 * MS);
	return NULL;
}

static void *thread_join(void *arg)
{
	return (void *)(intptr_t)weft_join(arg);
}

static int thread_joins(void *arg)
{
	(void)arg;
	weft_chan *c = weft_chan_new(0, 1);
	weft_task *t = weft_spawn(wait_for_close, c);
	pthread_t th;
	CHECK_EQ(pthread_create(&th, NULL, thread_join_until, t), 0);
	CHECK_EQ(pthread_join(th, NULL), 0);
	weft_chan_close(c);
	CHECK_EQ(pthread_create(&th, NULL, thread_join, t), 0);
	void *r;
	CHECK_EQ(pthread_join(th, &r), 0);
	CHECK_EQ((int)(intptr_t)r, 0);
	weft_chan_free(c);
	return 0;
}

TEST(plain_threads_join_until_a_deadline)
{
	RUN(thread_joins);
}

/*
 * The task's exit races the joiner's deadline: tasks that live a random few microseconds,
 * joined by tasks on every worker and by plain threads with deadlines just as short, again and
 * again until the join succeeds. Every join ends in 0 exactly once or in -ETIMEDOUT, never
 * anything else, and every task is joined.
 */
enum { RACERS = TEST_CAP(400), RACE_JOINERS = 8, RACE_THREADS = 2 };
static weft_task *racer[RACERS];
static atomic_int racers_joined;

static void short_life(void *arg)
{
	int64_t end = weft_now() + (int64_t)(uintptr_t)arg;
	while (weft_now() < end)
		weft_yield();
}

static void join_some(int from, int step)
{
	uint64_t s = (uint64_t)from * 2654435761u + 1;
	for (int i = from; i < RACERS; i += step) {
		for (;;) {
			s = s * 6364136223846793005ULL + 1442695040888963407ULL;
			int r = weft_join_until(racer[i], weft_now() + (int64_t)(s >> 33) % 20000);
			if (r == 0)
				break;
			CHECK_EQ(r, -ETIMEDOUT);
		}
		atomic_fetch_add(&racers_joined, 1);
	}
}

static void task_joiner(void *arg)
{
	join_some((int)(intptr_t)arg, RACE_JOINERS + RACE_THREADS);
}

static void *thread_joiner(void *arg)
{
	join_some((int)(intptr_t)arg, RACE_JOINERS + RACE_THREADS);
	return NULL;
}

static int exit_races_deadline(void *arg)
{
	(void)arg;
	for (int i = 0; i < RACERS; i++)
		CHECK((racer[i] = weft_spawn(short_life, (void *)(uintptr_t)(i * 7919 % 50000))));
	weft_task *j[RACE_JOINERS];
	pthread_t th[RACE_THREADS];
	for (int k = 0; k < RACE_JOINERS; k++)
		CHECK((j[k] = weft_spawn(task_joiner, (void *)(intptr_t)k)));
	for (int k = 0; k < RACE_THREADS; k++)
		CHECK_EQ(pthread_create(&th[k], NULL, thread_joiner,
					(void *)(intptr_t)(RACE_JOINERS + k)),
			 0);
	for (int k = 0; k < RACE_JOINERS; k++)
		CHECK_EQ(weft_join(j[k]), 0);
	for (int k = 0; k < RACE_THREADS; k++)
		CHECK_EQ(pthread_join(th[k], NULL), 0);
	CHECK_EQ(atomic_load(&racers_joined), RACERS);
	return 0;
}

TEST(join_until_races_the_exit_on_every_worker_and_thread)
{
	RUN(exit_races_deadline);
}

/* ---- weft_sleep ---------------------------------------------------------------------------- */

static int relative_sleeps(void *arg)
{
	(void)arg;
	for (int i = 0; i < 50; i++) {
		int64_t start = weft_now();
		CHECK_EQ(weft_sleep(200000), 0);
		CHECK(weft_now() - start >= 200000); /* never early */
	}
	CHECK_EQ(weft_sleep(0), 0);
	CHECK_EQ(weft_sleep(-5), 0);
	CHECK_EQ(weft_sleep(INT64_MIN), 0);
	return 0;
}

TEST(sleep_for_a_duration_is_never_early)
{
	RUN(relative_sleeps);
	int64_t start = weft_now(); /* a plain thread sleeps too */
	CHECK_EQ(weft_sleep(2 * MS), 0);
	CHECK(weft_now() - start >= 2 * MS);
}

/* A duration that would overflow the clock sleeps forever, until cancelled. */
static atomic_int long_sleeper_started;

static void sleep_longest(void *arg)
{
	(void)arg;
	atomic_store(&long_sleeper_started, 1);
	CHECK_EQ(weft_sleep(INT64_MAX), -ECANCELED);
}

static int longest_sleep(void *arg)
{
	(void)arg;
	weft_task *t = weft_spawn(sleep_longest, NULL);
	while (!atomic_load(&long_sleeper_started))
		weft_yield();
	CHECK_EQ(weft_join_until(t, weft_now() + 5 * MS), -ETIMEDOUT); /* it did not wake at once */
	CHECK_EQ(weft_cancel(t), 0);
	CHECK_EQ(weft_join(t), 0);
	return 0;
}

TEST(sleep_of_the_longest_duration_waits_until_cancelled)
{
	RUN(longest_sleep);
}
