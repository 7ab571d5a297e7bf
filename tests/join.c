/*
 * Tests of a task's handle and the waits around it: joining with a deadline (from tasks and
 * plain threads, racing the task's exit), handles that outlive their task (generations: a
 * call on one returns -ESRCH and never acts on the task that took its slot), and the relative
 * sleep.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "task.h" /* task_record: to check that a slot was in fact reused */
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

/* ---- generations ------------------------------------------------------------------------- */

static weft_task *_Atomic reused_self;
static atomic_int reused_cancelled = -1;

static void record_self(void *chan)
{
	atomic_store(&reused_self, weft_self());
	CHECK_EQ(weft_chan_take(chan, NULL, 0), -EPIPE);
	atomic_store(&reused_cancelled, weft_cancelled());
}

static int stale_handles(void *arg)
{
	(void)arg;
	weft_task *old = weft_spawn(nothing, NULL);
	CHECK(old);
	uint64_t old_id = weft_task_id(old);
	CHECK(old_id > 0);
	CHECK_EQ(weft_join(old), 0);
	weft_chan *c = weft_chan_new(0, 1);
	weft_task *now = weft_spawn(record_self, c); /* takes the slot old's join gave back */
	uint32_t g_old, g_now;
	CHECK(task_record(old, &g_old) == task_record(now, &g_now));
	CHECK(g_old != g_now);
	CHECK(old != now);
	while (!atomic_load(&reused_self))
		weft_yield();
	CHECK(atomic_load(&reused_self) == now); /* weft_self is the handle weft_spawn gave */
	CHECK_EQ(weft_join_until(old, weft_now() + 50 * MS), -ESRCH);
	CHECK_EQ(weft_join(old), -ESRCH);
	CHECK_EQ(weft_cancel(old), -ESRCH);
	CHECK_EQ(weft_task_id(old), 0);
	CHECK(weft_task_name(old)[0] == 0);
	CHECK(weft_task_id(now) > 0 && weft_task_id(now) != old_id);
	weft_chan_close(c);
	CHECK_EQ(weft_join(now), 0);
	CHECK_EQ(atomic_load(&reused_cancelled), 0); /* the cancel of old did not reach it */
	CHECK_EQ(weft_join(now), -ESRCH);
	weft_chan_free(c);
	return 0;
}

TEST(a_handle_whose_slot_was_reused_names_no_task)
{
	RUN(stale_handles);
}

/*
 * Stale handles under churn: on every worker, spawners start detached tasks that end at once
 * (blips) and publish their handles, and joinable keepers that take the blips' slots over;
 * meanwhile tasks and plain threads cancel, join and ask the id of random published blips,
 * live or long gone. Every call on a blip's handle gets 0 (cancel of a blip still alive),
 * -EINVAL (join of a detached task still alive) or -ESRCH, and no keeper is ever cancelled
 * or joined by anyone but its spawner.
 */
enum { CHURN_SPAWNERS = 4, CHURN_ROUNDS = SLOW ? 400 : 20000, BLIPS = 64,
       STALE_TASKS = 4, STALE_THREADS = 2 };
static weft_task *_Atomic blip[BLIPS];
static atomic_int churn_done, keepers_cancelled, stale_calls;

static void blip_fn(void *arg)
{
	(void)arg;
	if (weft_cancelled()) /* cancelled before it ran: fine, it is a blip */
		return;
	weft_yield();
}

static void keeper(void *arg)
{
	(void)arg;
	weft_yield();
	weft_yield();
	if (weft_cancelled())
		atomic_fetch_add(&keepers_cancelled, 1);
}

static void churn(void *arg)
{
	unsigned k = (unsigned)(uintptr_t)arg;
	weft_spawn_opts det = { .detached = 1 };
	for (int i = 0; i < CHURN_ROUNDS; i++) {
		weft_task *b = weft_spawn_opt(blip_fn, NULL, &det);
		CHECK(b);
		atomic_store(&blip[(k * 31 + (unsigned)i) % BLIPS], b);
		weft_task *t = weft_spawn(keeper, NULL);
		CHECK(t);
		if (i % 4 == 3)
			weft_yield();
		CHECK_EQ(weft_join(t), 0);
	}
	atomic_fetch_add(&churn_done, 1);
}

static void poke_stale(uint64_t *seed)
{
	while (atomic_load(&churn_done) < CHURN_SPAWNERS) {
		*seed = *seed * 6364136223846793005ULL + 1442695040888963407ULL;
		weft_task *h = atomic_load(&blip[(*seed >> 33) % BLIPS]);
		if (!h) {
			weft_yield();
			continue;
		}
		int r;
		switch ((*seed >> 40) % 3) {
		case 0:
			r = weft_cancel(h);
			CHECK(r == 0 || r == -ESRCH);
			break;
		case 1:
			r = weft_join_until(h, 0);
			CHECK(r == -EINVAL || r == -ESRCH);
			break;
		default:
			(void)weft_task_id(h); /* 0 or its id: nothing to check but that it is safe */
		}
		atomic_fetch_add(&stale_calls, 1);
	}
}

static void stale_task(void *arg)
{
	uint64_t seed = (uint64_t)(uintptr_t)arg;
	poke_stale(&seed);
}

static void *stale_thread(void *arg)
{
	uint64_t seed = (uint64_t)(uintptr_t)arg;
	poke_stale(&seed);
	return NULL;
}

static int churn_main(void *arg)
{
	(void)arg;
	weft_task *sp[CHURN_SPAWNERS], *st[STALE_TASKS];
	pthread_t th[STALE_THREADS];
	for (int k = 0; k < CHURN_SPAWNERS; k++)
		CHECK((sp[k] = weft_spawn(churn, (void *)(uintptr_t)k)));
	for (int k = 0; k < STALE_TASKS; k++)
		CHECK((st[k] = weft_spawn(stale_task, (void *)(uintptr_t)(k + 1))));
	for (int k = 0; k < STALE_THREADS; k++)
		CHECK_EQ(pthread_create(&th[k], NULL, stale_thread, (void *)(uintptr_t)(k + 100)), 0);
	for (int k = 0; k < CHURN_SPAWNERS; k++)
		CHECK_EQ(weft_join(sp[k]), 0);
	for (int k = 0; k < STALE_TASKS; k++)
		CHECK_EQ(weft_join(st[k]), 0);
	for (int k = 0; k < STALE_THREADS; k++)
		CHECK_EQ(pthread_join(th[k], NULL), 0);
	CHECK_EQ(atomic_load(&keepers_cancelled), 0);
	CHECK(atomic_load(&stale_calls) > 0);
	return 0;
}

TEST(stale_handles_never_reach_the_task_that_took_their_slot)
{
	RUN(churn_main);
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
