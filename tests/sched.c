/*
 * Tests of the scheduler itself (src/sched.c, steal.c, idle.c): where work runs, who takes it,
 * who wakes whom, and what the counters say. Each test holds one behaviour a program relies on;
 * the monitor's rescues and spares are tested in tests/monitor.c and tests/spare.c, asking a
 * spawning worker for work in tests/task.c.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sched.h" /* sched_next_gather_period, SCHED_CONTENDED_NS */
#include "test.h"

/* ---- stealing: work spawned on one worker is taken by an idle one ------------------------- */

enum { STEAL_TASKS = 64 };
static atomic_int ran_on[64];

static void compute_and_note_worker(void *arg)
{
	(void)arg;
	spin_for(SLOW ? 200000 : 500000); /* long enough for an idle worker to come for it */
	int id = weft_worker_id();
	CHECK(id >= 0 && id < 64);
	atomic_fetch_add(&ran_on[id], 1);
}

static int spawn_then_join(void *arg)
{
	(void)arg;
	weft_task *t[STEAL_TASKS];
	int me = weft_worker_id();
	for (int i = 0; i < STEAL_TASKS; i++)
		CHECK((t[i] = weft_spawn(compute_and_note_worker, NULL)));
	for (int i = 0; i < STEAL_TASKS; i++)
		CHECK_EQ(weft_join(t[i]), 0);
	int all = 0;
	for (int i = 0; i < 64; i++)
		all += atomic_load(&ran_on[i]);
	CHECK_EQ(all, STEAL_TASKS);
	/* every task was queued on this worker: those that ran elsewhere were taken from it */
	CHECK(atomic_load(&ran_on[me]) < STEAL_TASKS);
	weft_worker_stats st[8];
	int n = weft_stats(st, 8, NULL);
	uint64_t taken = 0;
	for (int i = 0; i < n; i++)
		if (i != me)
			taken += st[i].steals;
	CHECK(taken > 0);
	return 0;
}

TEST(work_spawned_on_one_worker_is_taken_by_an_idle_one)
{
	setenv("WEFT_WORKERS", "2", 1);
	setenv("WEFT_PARK", "0", 1); /* both workers at work, whatever the load */
	RUN(spawn_then_join);
	unsetenv("WEFT_PARK");
	unsetenv("WEFT_WORKERS");
}

/* ---- waking: a plain thread's wake-up reaches a sleeping worker --------------------------- */

static weft_sem plain_sem;
static atomic_int plain_woken;

static void *post_after_everyone_sleeps(void *arg)
{
	(void)arg;
	struct timespec ts = { 0, 30 * MS }; /* every worker is asleep by then */
	nanosleep(&ts, NULL);
	CHECK_EQ(weft_sem_post(&plain_sem), 0);
	return NULL;
}

static void wait_for_plain_thread(void *arg)
{
	(void)arg;
	CHECK_EQ(weft_sem_wait(&plain_sem), 0);
	atomic_store(&plain_woken, 1);
}

static int woken_by_plain_thread(void *arg)
{
	(void)arg;
	CHECK_EQ(weft_sem_init(&plain_sem, 0), 0);
	atomic_store(&plain_woken, 0);
	weft_task *t = weft_spawn(wait_for_plain_thread, NULL);
	CHECK(t);
	pthread_t th;
	CHECK_EQ(pthread_create(&th, NULL, post_after_everyone_sleeps, NULL), 0);
	CHECK_EQ(weft_join(t), 0); /* the main task parks too: all workers sleep */
	CHECK_EQ(atomic_load(&plain_woken), 1);
	CHECK_EQ(pthread_join(th, NULL), 0);
	uint64_t foreign = 0;
	CHECK(weft_stats(NULL, 0, &foreign) >= 1);
	CHECK(foreign >= 1); /* counted as a wake-up from a plain thread */
	weft_sem_destroy(&plain_sem);
	return 0;
}

TEST(a_wake_from_a_plain_thread_reaches_a_sleeping_worker)
{
	for (int workers = 1; workers <= 2; workers++) {
		char n[4];
		snprintf(n, sizeof n, "%d", workers);
		setenv("WEFT_WORKERS", n, 1);
		RUN(woken_by_plain_thread);
	}
	unsetenv("WEFT_WORKERS");
}

/* Many tasks readied from plain threads all run (the global queue, then a woken worker). */
enum { FOREIGN_TASKS = 200, FOREIGN_THREADS = 4 };
static weft_sem foreign_sems[FOREIGN_TASKS];
static atomic_int foreign_ran;

static void wait_on_own_sem(void *arg)
{
	CHECK_EQ(weft_sem_wait(&foreign_sems[(intptr_t)arg]), 0);
	atomic_fetch_add(&foreign_ran, 1);
}

static void *post_share(void *arg)
{
	for (intptr_t i = (intptr_t)arg; i < FOREIGN_TASKS; i += FOREIGN_THREADS) {
		CHECK_EQ(weft_sem_post(&foreign_sems[i]), 0);
		if (i % 16 == 0)
			test_pause();
	}
	return NULL;
}

static int readied_from_plain_threads(void *arg)
{
	(void)arg;
	weft_task *t[FOREIGN_TASKS];
	atomic_store(&foreign_ran, 0);
	for (intptr_t i = 0; i < FOREIGN_TASKS; i++) {
		CHECK_EQ(weft_sem_init(&foreign_sems[i], 0), 0);
		CHECK((t[i] = weft_spawn(wait_on_own_sem, (void *)i)));
	}
	pthread_t th[FOREIGN_THREADS];
	for (intptr_t k = 0; k < FOREIGN_THREADS; k++)
		CHECK_EQ(pthread_create(&th[k], NULL, post_share, (void *)k), 0);
	for (int i = 0; i < FOREIGN_TASKS; i++)
		CHECK_EQ(weft_join(t[i]), 0);
	for (int k = 0; k < FOREIGN_THREADS; k++)
		CHECK_EQ(pthread_join(th[k], NULL), 0);
	CHECK_EQ(atomic_load(&foreign_ran), FOREIGN_TASKS);
	return 0;
}

TEST(tasks_readied_from_plain_threads_all_run)
{
	setenv("WEFT_WORKERS", "2", 1);
	RUN(readied_from_plain_threads);
	unsetenv("WEFT_WORKERS");
}

/* ---- idling: an idle worker sleeps, and new work wakes it --------------------------------- */

static atomic_int helper_ran_while_held;
static atomic_bool holding;

static void note_if_held(void *arg)
{
	(void)arg;
	if (atomic_load(&holding))
		atomic_store(&helper_ran_while_held, 1);
}

static int idle_then_work(void *arg)
{
	(void)arg;
	atomic_store(&helper_ran_while_held, 0);
	CHECK_EQ(weft_sleep(20 * MS), 0); /* both workers sleep */
	int other = 1 - weft_worker_id();
	/* Two tasks queued here while this task holds its worker: the second spawn finds work
	 * already queued and wakes the sleeping worker, which takes them (no spare may start). */
	atomic_store(&holding, true);
	weft_task *a = weft_spawn(note_if_held, NULL), *b = weft_spawn(note_if_held, NULL);
	CHECK(a && b);
	int64_t until = weft_now() + 2000 * MS;
	while (!atomic_load(&helper_ran_while_held) && weft_now() < until)
		; /* holds the worker: only the other one can run them */
	atomic_store(&holding, false);
	CHECK_EQ(atomic_load(&helper_ran_while_held), 1);
	CHECK_EQ(weft_join(a), 0);
	CHECK_EQ(weft_join(b), 0);
	weft_worker_stats st[8];
	CHECK_EQ(weft_stats(st, 8, NULL), 2);
	CHECK(st[other].idle_ns > 0); /* it had slept (counted once it woke) */
	return 0;
}

TEST(an_idle_worker_sleeps_and_new_work_wakes_it)
{
	setenv("WEFT_WORKERS", "2", 1);
	setenv("WEFT_PARK", "0", 1); /* a wake-up, not the monitor's unpark */
	setenv("WEFT_MAX_SPARES", "0", 1); /* nor a spare started beside the held worker */
	RUN(idle_then_work);
	unsetenv("WEFT_PARK");
	unsetenv("WEFT_WORKERS");
}

/* ---- switching: weft_yield lets the other tasks of its worker run ------------------------- */

static atomic_int yield_flag;

static void wait_by_yielding(void *arg)
{
	(void)arg;
	while (!atomic_load(&yield_flag))
		weft_yield(); /* on one worker, only a yield lets set_flag run */
}

static void set_flag(void *arg)
{
	(void)arg;
	atomic_store(&yield_flag, 1);
}

static int yield_to_others(void *arg)
{
	(void)arg;
	atomic_store(&yield_flag, 0);
	weft_task *a = weft_spawn(wait_by_yielding, NULL), *b = weft_spawn(set_flag, NULL);
	CHECK(a && b);
	CHECK_EQ(weft_join(a), 0);
	CHECK_EQ(weft_join(b), 0);
	/* from the main task too */
	atomic_store(&yield_flag, 0);
	CHECK((b = weft_spawn(set_flag, NULL)));
	while (!atomic_load(&yield_flag))
		weft_yield();
	CHECK_EQ(weft_join(b), 0);
	return 0;
}

TEST(weft_yield_lets_the_other_tasks_of_its_worker_run)
{
	setenv("WEFT_WORKERS", "1", 1);
	RUN(yield_to_others);
	unsetenv("WEFT_WORKERS");
}

/* ---- queues: a full run queue spills to the global queue, and nothing is lost ------------- */

enum { SPILL_TASKS = TEST_CAP(20000) };
static atomic_int spill_runs[20000];
static weft_task *spill_tasks[20000];

static void run_once(void *arg)
{
	atomic_fetch_add(&spill_runs[(intptr_t)arg], 1);
}

static int overflow_the_ring(void *arg)
{
	(void)arg;
	/* Spawned without a switch in between: far more than a ring holds (RUNQ_SIZE). */
	for (intptr_t i = 0; i < SPILL_TASKS; i++)
		CHECK((spill_tasks[i] = weft_spawn(run_once, (void *)i)));
	for (int i = 0; i < SPILL_TASKS; i++)
		CHECK_EQ(weft_join(spill_tasks[i]), 0);
	for (int i = 0; i < SPILL_TASKS; i++)
		CHECK_EQ(atomic_load(&spill_runs[i]), 1);
	return 0;
}

TEST(a_full_run_queue_spills_to_the_global_queue_and_loses_nothing)
{
	CHECK(SPILL_TASKS > 4 * RUNQ_SIZE);
	for (int workers = 1; workers <= 2; workers++) {
		char n[4];
		snprintf(n, sizeof n, "%d", workers);
		setenv("WEFT_WORKERS", n, 1);
		memset(spill_runs, 0, sizeof spill_runs);
		RUN(overflow_the_ring);
	}
	unsetenv("WEFT_WORKERS");
}

/* ---- statistics: weft_stats counts switches, parks and wakes ------------------------------ */

enum { STAT_TASKS = 100 };

static void park_twice(void *arg)
{
	(void)arg;
	CHECK_EQ(weft_sleep(1000), 0);
	CHECK_EQ(weft_sleep(1000), 0);
}

static int count_things(void *arg)
{
	(void)arg;
	weft_worker_stats before[8], after[8];
	int n = weft_stats(before, 8, NULL);
	CHECK(n >= 1 && n <= 8);
	CHECK(weft_stats(NULL, 0, NULL) >= n); /* the count alone (a spare may have started) */
	CHECK_EQ(weft_stats(NULL, 1, NULL), -EINVAL);
	CHECK_EQ(weft_stats(before, -1, NULL), -EINVAL);
	weft_task *t[STAT_TASKS];
	for (int i = 0; i < STAT_TASKS; i++)
		CHECK((t[i] = weft_spawn(park_twice, NULL)));
	for (int i = 0; i < STAT_TASKS; i++)
		CHECK_EQ(weft_join(t[i]), 0);
	/* the monitor may have started a spare meanwhile (a worker that looked held): it counts
	 * from 0 */
	int now = weft_stats(after, 8, NULL);
	CHECK(now >= n && now <= 8);
	memset(before + n, 0, (size_t)(8 - n) * sizeof *before);
	uint64_t switches = 0, parks = 0, wakes = 0;
	for (int i = 0; i < now; i++) {
		CHECK(after[i].switches >= before[i].switches);
		switches += after[i].switches - before[i].switches;
		parks += after[i].parks - before[i].parks;
		wakes += after[i].wakes - before[i].wakes;
		CHECK(after[i].idle_ns >= before[i].idle_ns);
	}
	/* each task ran at least three times (start, after each sleep) and parked twice, woken
	 * by its deadline; the main task parked in the joins it waited in */
	CHECK(switches >= 3 * STAT_TASKS);
	CHECK(parks >= 2 * STAT_TASKS);
	CHECK(wakes >= 2 * STAT_TASKS);
	return 0;
}

TEST(weft_stats_counts_switches_parks_and_wakes)
{
	weft_worker_stats st[1];
	CHECK_EQ(weft_stats(st, 1, NULL), -EINVAL); /* weft is not running */
	setenv("WEFT_WORKERS", "2", 1);
	RUN(count_things);
	unsetenv("WEFT_WORKERS");
}

/* ---- how long contended tasks stay gathered -----------------------------------------------
 * Gathering lasts a period after the last contention (steal.c, sched_note_contention). A period
 * that lapsed with contention back within another period was too short: the next is twice as
 * long, up to SCHED_GATHER_MAX_NS. A quiet time over two periods brings it back to the start. */

TEST(the_gathering_period_doubles_when_it_lapsed_too_soon_and_resets_after_quiet)
{
	const int64_t start = SCHED_CONTENDED_NS;
	CHECK_EQ(sched_next_gather_period(start + 1, start), 2 * start);
	CHECK_EQ(sched_next_gather_period(2 * start, start), 2 * start);
	CHECK_EQ(sched_next_gather_period(2 * start + 1, start), start);
	int64_t period = start;
	for (int i = 0; i < 20; i++)
		period = sched_next_gather_period(period + 1, period);
	CHECK_EQ(period, SCHED_GATHER_MAX_NS);
	CHECK_EQ(sched_next_gather_period(3 * SCHED_GATHER_MAX_NS / 2, SCHED_GATHER_MAX_NS),
		 SCHED_GATHER_MAX_NS);
	CHECK_EQ(sched_next_gather_period(2 * SCHED_GATHER_MAX_NS + 1, SCHED_GATHER_MAX_NS), start);
	CHECK_EQ(sched_next_gather_period(SCHED_GATHER_MAX_NS, 3 * SCHED_GATHER_MAX_NS / 4),
		 SCHED_GATHER_MAX_NS); /* never past the cap */
}
