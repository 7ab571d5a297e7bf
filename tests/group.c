/*
 * Tests of task groups (weft_group_*): members all waited for, the first error kept and the
 * others cancelled, cancelling a group and cancelling its owner (down nested groups), no member
 * outliving a cancelled closer, deadlines and their inheritance, waiters on tasks and threads,
 * misuse; then stress across every worker with plain threads cancelling and waiting.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "test.h"

static atomic_int alive, ended;

/* Every member counts itself in and out, so a test can see that none is left. */
static int park_forever(void *arg)
{
	(void)arg;
	atomic_fetch_add(&alive, 1);
	int r = weft_sleep_until(WEFT_FOREVER);
	atomic_fetch_sub(&alive, 1);
	atomic_fetch_add(&ended, 1);
	return r;
}

static int count_and_yield(void *arg)
{
	(void)arg;
	atomic_fetch_add(&alive, 1);
	weft_yield();
	atomic_fetch_sub(&alive, 1);
	atomic_fetch_add(&ended, 1);
	return 0;
}

/* Wait (with a bound) until n members have counted themselves in. */
static void await_alive(int n)
{
	test_await(&alive, n);
}

static int all_joined(void *arg)
{
	(void)arg;
	enum { N = 1000 };
	weft_group *g = weft_group_new(WEFT_FOREVER);
	CHECK(g);
	for (int i = 0; i < N; i++)
		CHECK_EQ(weft_group_spawn(g, count_and_yield, NULL), 0);
	CHECK_EQ(weft_group_wait(g), 0);
	CHECK_EQ(atomic_load(&ended), N);
	CHECK_EQ(atomic_load(&alive), 0);
	CHECK_EQ(weft_group_len(g), 0);
	CHECK_EQ(weft_group_wait(g), 0); /* again: nothing left to wait for */
	weft_group_free(g);
	return 0;
}

TEST(group_wait_returns_once_every_member_has_ended)
{
	RUN(all_joined);
}

/* ---- the first error ---------------------------------------------------------------------- */

static weft_group *failing_group;

static int fail_once_the_others_wait(void *arg)
{
	await_alive((int)(intptr_t)arg);
	return -EIO;
}

static int first_error(void *arg)
{
	(void)arg;
	enum { N = 50 };
	weft_group *g = failing_group = weft_group_new(WEFT_FOREVER);
	for (int i = 0; i < N; i++)
		CHECK_EQ(weft_group_spawn(g, park_forever, NULL), 0);
	CHECK_EQ(weft_group_spawn(g, fail_once_the_others_wait, (void *)(intptr_t)N), 0);
	/* The others return -ECANCELED after the -EIO: the first failure is kept. */
	CHECK_EQ(weft_group_wait(g), -EIO);
	CHECK_EQ(atomic_load(&ended), N);
	CHECK_EQ(weft_group_spawn(g, count_and_yield, NULL), -ECANCELED); /* cancelled by it */
	CHECK_EQ(weft_group_wait(g), -EIO);
	weft_group_free(g);
	return 0;
}

TEST(first_error_is_kept_and_cancels_the_other_members)
{
	RUN(first_error);
}

/* ---- cancelling a group --------------------------------------------------------------------- */

static int cancel_all(void *arg)
{
	(void)arg;
	enum { N = 200 };
	weft_group *g = weft_group_new(WEFT_FOREVER);
	for (int i = 0; i < N; i++)
		CHECK_EQ(weft_group_spawn(g, park_forever, NULL), 0);
	CHECK_EQ(weft_group_spawn(g, count_and_yield, NULL), 0);
	await_alive(N);
	CHECK_EQ(weft_group_wait_until(g, weft_now() + 2 * MS), -ETIMEDOUT);
	CHECK_EQ(weft_group_cancel(g), 0);
	CHECK_EQ(weft_group_cancel(g), 0);
	CHECK_EQ(weft_group_spawn(g, count_and_yield, NULL), -ECANCELED);
	CHECK_EQ(weft_group_wait(g), -ECANCELED); /* what the cancelled sleepers returned */
	CHECK_EQ(atomic_load(&ended), N + 1);
	CHECK_EQ(atomic_load(&alive), 0);
	weft_group_free(g);
	CHECK_EQ(weft_group_cancel(NULL), -EINVAL);
	CHECK_EQ(weft_group_wait(NULL), -EINVAL);
	CHECK_EQ(weft_group_spawn(NULL, count_and_yield, NULL), -EINVAL);
	weft_group_free(NULL);
	return 0;
}

TEST(cancel_cancels_every_member_and_refuses_new_ones)
{
	RUN(cancel_all);
}

/* Members that had not started when the group was cancelled start cancelled. (With one
 * worker the spawner keeps it until the cancel, so most have not started; a spare worker, when
 * the spawning is slow, may start some, and they are not judged.) */
static atomic_bool cancel_returned;
static atomic_int started_after_cancel;

static int check_cancelled_at_start(void *arg)
{
	(void)arg;
	bool after = atomic_load(&cancel_returned);
	atomic_fetch_add(&ended, 1);
	if (!after)
		return 0;
	atomic_fetch_add(&started_after_cancel, 1);
	return weft_cancelled() ? 0 : -EINVAL;
}

static int cancel_before_start(void *arg)
{
	(void)arg;
	weft_group *g = weft_group_new(WEFT_FOREVER);
	for (int i = 0; i < 100; i++)
		CHECK_EQ(weft_group_spawn(g, check_cancelled_at_start, NULL), 0);
	CHECK_EQ(weft_group_cancel(g), 0);
	atomic_store(&cancel_returned, true);
	CHECK_EQ(weft_group_wait(g), 0);
	CHECK_EQ(atomic_load(&ended), 100);
	CHECK(atomic_load(&started_after_cancel) > 0);
	weft_group_free(g);
	return 0;
}

TEST(members_not_yet_started_start_cancelled)
{
	setenv("WEFT_WORKERS", "1", 1);
	RUN(cancel_before_start);
}

/* ---- owners ---------------------------------------------------------------------------------- */

static atomic_int left_at_owner_return = -1;
static atomic_int owner_result;

/* The closer: starts a group of workers and waits for them; it is itself cancelled. */
static void closer(void *arg)
{
	int n = (int)(intptr_t)arg;
	weft_group *g = weft_group_new(WEFT_FOREVER);
	for (int i = 0; i < n; i++)
		CHECK_EQ(weft_group_spawn(g, park_forever, NULL), 0);
	atomic_store(&owner_result, weft_group_wait(g));
	atomic_store(&left_at_owner_return, atomic_load(&alive));
	CHECK_EQ(weft_group_len(g), 0);
	weft_group_free(g);
}

static int cancel_owner(void *arg)
{
	(void)arg;
	enum { N = 300 };
	weft_task *t = weft_spawn(closer, (void *)(intptr_t)N);
	await_alive(N);
	CHECK_EQ(weft_cancel(t), 0);
	CHECK_EQ(weft_join(t), 0);
	CHECK_EQ(atomic_load(&owner_result), -ECANCELED);
	CHECK_EQ(atomic_load(&left_at_owner_return), 0); /* no member outlived the closer */
	CHECK_EQ(atomic_load(&ended), N);
	return 0;
}

TEST(cancelling_the_owner_cancels_its_groups_and_waits_for_their_members)
{
	RUN(cancel_owner);
}

/* The worker-pool shape of the issue: a closer feeding jobs to a pool through a channel, each
 * worker in the middle of a job when the closer is cancelled. When the closer returns, no
 * worker is left (with weft_spawn and a weft_waitgroup, the cancelled closer's wait returned at
 * once and the workers went on). */
static weft_chan *jobs;
static atomic_int jobs_started;

static int pool_worker(void *arg)
{
	(void)arg;
	atomic_fetch_add(&alive, 1);
	int job, r;
	while ((r = weft_chan_take(jobs, &job, sizeof job)) >= 0) {
		atomic_fetch_add(&jobs_started, 1);
		r = weft_sleep(WEFT_FOREVER); /* a job that takes as long as it is let */
		if (r < 0)
			break;
	}
	atomic_fetch_sub(&alive, 1);
	atomic_fetch_add(&ended, 1);
	return r == -EPIPE ? 0 : r;
}

static void pool_closer(void *arg)
{
	int workers = (int)(intptr_t)arg;
	weft_group *g = weft_group_new(WEFT_FOREVER);
	for (int i = 0; i < workers; i++)
		CHECK_EQ(weft_group_spawn(g, pool_worker, NULL), 0);
	for (int job = 0; job < workers; job++)
		if (weft_chan_put(jobs, &job, sizeof job) < 0)
			break;
	weft_chan_close(jobs);
	atomic_store(&owner_result, weft_group_wait(g));
	atomic_store(&left_at_owner_return, atomic_load(&alive));
	weft_group_free(g);
}

static int pool_cancelled(void *arg)
{
	(void)arg;
	enum { WORKERS = 64 };
	jobs = weft_chan_new(0, sizeof(int));
	weft_task *c = weft_spawn(pool_closer, (void *)(intptr_t)WORKERS);
	test_await(&jobs_started, WORKERS); /* every worker in the middle of a job */
	CHECK_EQ(weft_cancel(c), 0);
	CHECK_EQ(weft_join(c), 0);
	CHECK_EQ(atomic_load(&left_at_owner_return), 0);
	CHECK_EQ(atomic_load(&owner_result), -ECANCELED);
	CHECK_EQ(atomic_load(&ended), WORKERS);
	weft_chan_free(jobs);
	return 0;
}

TEST(no_worker_outlives_a_cancelled_closer)
{
	RUN(pool_cancelled);
}

/* Nested: the owner's group's members own groups of their own; cancelling the owner reaches
 * the leaves. */
static int own_a_group(void *arg)
{
	int n = (int)(intptr_t)arg;
	weft_group *g = weft_group_new(WEFT_FOREVER);
	for (int i = 0; i < n; i++)
		CHECK_EQ(weft_group_spawn(g, park_forever, NULL), 0);
	int r = weft_group_wait(g);
	weft_group_free(g);
	return r;
}

static void tree_owner(void *arg)
{
	(void)arg;
	weft_group *g = weft_group_new(WEFT_FOREVER);
	for (int i = 0; i < 10; i++)
		CHECK_EQ(weft_group_spawn(g, own_a_group, (void *)(intptr_t)10), 0);
	atomic_store(&owner_result, weft_group_wait(g));
	atomic_store(&left_at_owner_return, atomic_load(&alive));
	weft_group_free(g);
}

static int cancel_tree(void *arg)
{
	(void)arg;
	weft_task *t = weft_spawn(tree_owner, NULL);
	await_alive(100);
	CHECK_EQ(weft_cancel(t), 0);
	CHECK_EQ(weft_join(t), 0);
	CHECK_EQ(atomic_load(&owner_result), -ECANCELED);
	CHECK_EQ(atomic_load(&left_at_owner_return), 0);
	CHECK_EQ(atomic_load(&ended), 100);
	return 0;
}

TEST(cancelling_the_owner_reaches_groups_nested_below_it)
{
	RUN(cancel_tree);
}

/* A task already cancelled makes a group: it starts cancelled. */
static void make_when_cancelled(void *arg)
{
	(void)arg;
	CHECK_EQ(weft_sleep_until(WEFT_FOREVER), -ECANCELED);
	weft_group *g = weft_group_new(WEFT_FOREVER);
	CHECK(g);
	CHECK_EQ(weft_group_spawn(g, count_and_yield, NULL), -ECANCELED);
	CHECK_EQ(weft_group_wait(g), 0);
	weft_group_free(g);
}

static int cancelled_maker(void *arg)
{
	(void)arg;
	weft_task *t = weft_spawn(make_when_cancelled, NULL);
	weft_sleep(MS);
	CHECK_EQ(weft_cancel(t), 0);
	CHECK_EQ(weft_join(t), 0);
	return 0;
}

TEST(a_group_made_by_a_cancelled_task_starts_cancelled)
{
	RUN(cancelled_maker);
}

/* The owner ends before its group: the group goes on without one, and a cancel of the old
 * owner's handle reaches nobody. */
static weft_group *orphan;

static void make_and_leave(void *arg)
{
	(void)arg;
	orphan = weft_group_new(WEFT_FOREVER);
	for (int i = 0; i < 10; i++)
		CHECK_EQ(weft_group_spawn(orphan, park_forever, NULL), 0);
}

static int owner_ends_first(void *arg)
{
	(void)arg;
	weft_task *t = weft_spawn(make_and_leave, NULL);
	CHECK_EQ(weft_join(t), 0);
	await_alive(10);
	CHECK_EQ(weft_cancel(t), -ESRCH);
	CHECK_EQ(weft_group_wait_until(orphan, weft_now() + MS), -ETIMEDOUT);
	CHECK_EQ(weft_group_len(orphan), 10);
	CHECK_EQ(weft_group_cancel(orphan), 0);
	CHECK_EQ(weft_group_wait(orphan), -ECANCELED);
	weft_group_free(orphan);
	return 0;
}

TEST(a_group_outlives_its_owner_without_one)
{
	RUN(owner_ends_first);
}

/* ---- waiters ------------------------------------------------------------------------------ */

static weft_group *shared;
static atomic_int waiter_results;

static void *thread_waits(void *arg)
{
	(void)arg;
	CHECK_EQ(weft_group_wait(shared), -EIO);
	atomic_fetch_add(&waiter_results, 1);
	return NULL;
}

static void task_waits(void *arg)
{
	(void)arg;
	CHECK_EQ(weft_group_wait(shared), -EIO);
	atomic_fetch_add(&waiter_results, 1);
}

static void waiter_cancelled(void *arg)
{
	(void)arg;
	CHECK_EQ(weft_group_wait(shared), -ECANCELED); /* not the owner: gives up */
	atomic_fetch_add(&waiter_results, 1);
}

static int many_waiters(void *arg)
{
	(void)arg;
	enum { THREADS = 3, TASKS = 5, N = 20 };
	shared = weft_group_new(WEFT_FOREVER);
	for (int i = 0; i < N; i++)
		CHECK_EQ(weft_group_spawn(shared, park_forever, NULL), 0);
	pthread_t th[THREADS];
	weft_task *t[TASKS];
	for (int i = 0; i < THREADS; i++)
		CHECK_EQ(pthread_create(&th[i], NULL, thread_waits, NULL), 0);
	for (int i = 0; i < TASKS; i++)
		CHECK((t[i] = weft_spawn(task_waits, NULL)));
	weft_task *quitter = weft_spawn(waiter_cancelled, NULL);
	await_alive(N);
	CHECK_EQ(weft_cancel(quitter), 0);
	CHECK_EQ(weft_join(quitter), 0);
	CHECK_EQ(atomic_load(&alive), N); /* the members go on */
	CHECK_EQ(weft_group_spawn(shared, fail_once_the_others_wait, (void *)(intptr_t)N), 0);
	for (int i = 0; i < THREADS; i++)
		CHECK_EQ(pthread_join(th[i], NULL), 0);
	for (int i = 0; i < TASKS; i++)
		CHECK_EQ(weft_join(t[i]), 0);
	CHECK_EQ(atomic_load(&waiter_results), 1 + THREADS + TASKS);
	CHECK_EQ(weft_group_wait(shared), -EIO);
	weft_group_free(shared);
	return 0;
}

TEST(every_waiter_task_or_thread_gets_the_first_error)
{
	RUN(many_waiters);
}

/* ---- deadlines ---------------------------------------------------------------------------- */

/* Deadlines far enough away that spawning a dozen tasks usually comes first. On a machine
 * loaded enough that it does not, a spawn after the deadline is refused, as it should be. */
enum { DEADLINE_MS = SLOW ? 2000 : 300 };

static bool spawn_before(weft_group *g, int (*fn)(void *), void *arg, int64_t due)
{
	int r = weft_group_spawn(g, fn, arg);
	CHECK(r == 0 || (r == -ECANCELED && weft_now() >= due));
	return r == 0;
}
static atomic_int cancelled_early;
static int64_t group_deadline;

static int sleep_past_deadline(void *arg)
{
	(void)arg;
	int r = weft_sleep(60000 * MS);
	if (weft_now() < group_deadline)
		atomic_fetch_add(&cancelled_early, 1);
	return r;
}

static int compute_until_cancelled(void *arg)
{
	(void)arg;
	while (!weft_cancelled())
		weft_yield();
	if (weft_now() < group_deadline)
		atomic_fetch_add(&cancelled_early, 1);
	CHECK_EQ(weft_sleep(0), -ECANCELED); /* it counts as cancelled now */
	return -ECANCELED;
}

static int quick(void *arg)
{
	(void)arg;
	return weft_sleep(100000); /* well within the deadline */
}

static int deadline(void *arg)
{
	(void)arg;
	group_deadline = weft_now() + DEADLINE_MS * MS;
	weft_group *g = weft_group_new(group_deadline);
	bool sleepers = false;
	for (int i = 0; i < 20; i++)
		sleepers |= spawn_before(g, sleep_past_deadline, NULL, group_deadline);
	spawn_before(g, compute_until_cancelled, NULL, group_deadline);
	spawn_before(g, quick, NULL, group_deadline);
	CHECK_EQ(weft_group_wait(g), sleepers ? -ECANCELED : 0);
	CHECK(weft_now() >= group_deadline);
	CHECK_EQ(atomic_load(&cancelled_early), 0);
	CHECK_EQ(weft_group_spawn(g, quick, NULL), -ECANCELED); /* past its deadline */
	weft_group_free(g);
	CHECK(!weft_cancelled()); /* the maker is not a member: it is not cancelled */
	return 0;
}

TEST(members_are_cancelled_at_the_group_deadline_and_not_before)
{
	RUN(deadline);
}

/* A member's own group inherits the outer deadline (when earlier than its own), down two
 * levels; an inner deadline that is earlier wins. */
static int64_t inner_deadline;
static atomic_int inner_late, inner_early;

static int leaf_sleeper(void *arg)
{
	int64_t due = (int64_t)(intptr_t)arg;
	int r = weft_sleep_until(WEFT_FOREVER);
	int64_t now = weft_now();
	if (now < due)
		atomic_fetch_add(&inner_early, 1);
	if (now > due + 10000 * MS)
		atomic_fetch_add(&inner_late, 1);
	return r;
}

static int middle(void *arg)
{
	int64_t own = (int64_t)(intptr_t)arg;
	weft_group *g = weft_group_new(own); /* the outer deadline comes first unless own does */
	int64_t due = own < group_deadline ? own : group_deadline;
	bool leaves = false;
	for (int i = 0; i < 5; i++)
		leaves |= spawn_before(g, leaf_sleeper, (void *)(intptr_t)due, due);
	CHECK_EQ(weft_group_wait(g), leaves ? -ECANCELED : 0);
	weft_group_free(g);
	return 0; /* not a failure of the outer group, which would cancel it at once */
}

static int inherited(void *arg)
{
	(void)arg;
	group_deadline = weft_now() + DEADLINE_MS * MS;
	inner_deadline = weft_now() + DEADLINE_MS / 2 * MS;
	weft_group *g = weft_group_new(group_deadline);
	spawn_before(g, middle, (void *)(intptr_t)WEFT_FOREVER, group_deadline);
	spawn_before(g, middle, (void *)(intptr_t)inner_deadline, group_deadline);
	CHECK_EQ(weft_group_wait(g), 0);
	CHECK(weft_now() >= group_deadline);
	CHECK_EQ(atomic_load(&inner_early), 0);
	CHECK_EQ(atomic_load(&inner_late), 0);
	weft_group_free(g);
	return 0;
}

TEST(nested_groups_inherit_the_earlier_deadline)
{
	RUN(inherited);
}

/* ---- misuse -------------------------------------------------------------------------------- */

static int free_busy(void *arg)
{
	(void)arg;
	weft_group *g = weft_group_new(WEFT_FOREVER);
	CHECK_EQ(weft_group_spawn(g, park_forever, NULL), 0);
	CHECK_EQ(weft_group_spawn(g, park_forever, NULL), 0);
	weft_group_free(g);
	return 0;
}

TEST(child_free_busy_group)
{
	RUN(free_busy);
}

TEST(freeing_a_group_with_members_aborts)
{
	test_expect_abort("child_free_busy_group", "weft: weft_group_free on a group with 2 members");
}

static int bad_spawns(void *arg)
{
	(void)arg;
	weft_group *g = weft_group_new(WEFT_FOREVER);
	CHECK_EQ(weft_group_spawn(g, NULL, NULL), -EINVAL);
	weft_spawn_opts det = { .detached = 1 }, small = { .stack_size = WEFT_STACK_MIN - 1 };
	CHECK_EQ(weft_group_spawn_opt(g, count_and_yield, NULL, &det), -EINVAL);
	CHECK_EQ(weft_group_spawn_opt(g, count_and_yield, NULL, &small), -EINVAL);
	weft_spawn_opts named = { .name = "member", .stack_size = 128 * 1024 };
	CHECK_EQ(weft_group_spawn_opt(g, count_and_yield, NULL, &named), 0);
	CHECK_EQ(weft_group_wait(g), 0);
	weft_group_free(g);
	return 0;
}

TEST(bad_spawns_get_einval)
{
	RUN(bad_spawns);
	weft_group *g = weft_group_new(WEFT_FOREVER); /* a plain thread: no owner, no spawns */
	CHECK(g);
	CHECK_EQ(weft_group_spawn(g, count_and_yield, NULL), -EINVAL);
	CHECK_EQ(weft_group_wait(g), 0);
	weft_group_free(g);
}

/* ---- stress --------------------------------------------------------------------------------- */

/*
 * Rounds of one group fed by spawners on every worker (themselves members of another group),
 * with members that yield, sleep, own a nested group of their own, park until released, or now
 * and then fail; in half of the rounds a plain thread cancels the group at a random moment
 * (the parked members are then never released otherwise) and waits beside the main task.
 * Every member spawned ends, nested ones included, before any wait returns, and the result is
 * 0 when nothing failed or was cancelled, -ECANCELED or a failure after a cancel.
 */
enum { SPAWNERS = 4, PER_SPAWNER = TEST_CAP(2000) / 8, ROUNDS = SLOW ? 6 : 40, FAIL_CODE = -1000 };
static weft_group *round_group;
static weft_chan *release;
static atomic_int spawned, fails_injected, in_round, out_round, parked;
static atomic_bool cancel_now, round_over;

static int nested_leaf(void *arg)
{
	(void)arg;
	atomic_fetch_add(&in_round, 1);
	weft_yield();
	atomic_fetch_add(&out_round, 1);
	return 0;
}

static int stress_member(void *arg)
{
	uint64_t s = (uint64_t)(uintptr_t)arg * 0x9e3779b97f4a7c15ULL;
	int r = 0;
	atomic_fetch_add(&in_round, 1);
	switch ((s >> 32) % 6) {
	case 0:
		weft_yield();
		weft_yield();
		break;
	case 1:
		r = weft_sleep((int64_t)((s >> 40) % 50000));
		break;
	case 2: {
		weft_group *g = weft_group_new(WEFT_FOREVER);
		CHECK(g);
		for (int i = 0; i < 2; i++) {
			int k = weft_group_spawn(g, nested_leaf, NULL);
			CHECK(k == 0 || k == -ECANCELED);
		}
		r = weft_group_wait(g);
		CHECK_EQ(weft_group_len(g), 0);
		weft_group_free(g);
		break;
	}
	case 3:
	case 4:
		atomic_fetch_add(&parked, 1);
		r = weft_chan_take(release, NULL, 0);
		r = r == -EPIPE ? 0 : r;
		break;
	default:
		if ((s >> 48) % 500 == 0) { /* in about a quarter of the rounds */
			atomic_fetch_add(&fails_injected, 1);
			r = FAIL_CODE - (int)((s >> 20) % 100);
		}
	}
	atomic_fetch_add(&out_round, 1);
	return r;
}

static int stress_spawner(void *arg)
{
	uint64_t base = (uint64_t)(uintptr_t)arg;
	for (int i = 0; i < PER_SPAWNER; i++) {
		int r = weft_group_spawn(round_group, stress_member,
					 (void *)(uintptr_t)(base * PER_SPAWNER + (uint64_t)i + 1));
		if (r == -ECANCELED)
			break;
		CHECK_EQ(r, 0);
		atomic_fetch_add(&spawned, 1);
		if (i % 16 == 0)
			weft_yield();
	}
	return 0;
}

static atomic_int thread_wait_result;

static void *stress_thread(void *arg)
{
	(void)arg;
	unsigned seed = 99;
	for (;;) { /* a cancel asked for is done, however late */
		if (atomic_exchange(&cancel_now, false)) {
			/* once a member waits for it (unless a failure ends the round first) */
			while (!atomic_load(&parked) && !atomic_load(&round_over))
				sched_yield();
			usleep(rand_r(&seed) % 2000);
			CHECK_EQ(weft_group_cancel(round_group), 0);
			atomic_store(&thread_wait_result, weft_group_wait(round_group));
		} else if (atomic_load(&round_over)) {
			return NULL;
		}
		sched_yield();
	}
}

static int stress_main(void *arg)
{
	(void)arg;
	unsigned seed = 5;
	for (int round = 0; round < ROUNDS; round++) {
		atomic_store(&spawned, 0);
		atomic_store(&fails_injected, 0);
		atomic_store(&in_round, 0);
		atomic_store(&out_round, 0);
		atomic_store(&parked, 0);
		atomic_store(&round_over, false);
		atomic_store(&thread_wait_result, 1);
		CHECK((round_group = weft_group_new(WEFT_FOREVER)));
		CHECK((release = weft_chan_new(0, 1)));
		bool cancel = rand_r(&seed) % 2;
		pthread_t th;
		CHECK_EQ(pthread_create(&th, NULL, stress_thread, NULL), 0);
		atomic_store(&cancel_now, cancel);
		weft_group *spawners = weft_group_new(WEFT_FOREVER);
		for (int k = 0; k < SPAWNERS; k++)
			CHECK_EQ(weft_group_spawn(spawners, stress_spawner,
						  (void *)(uintptr_t)(round * SPAWNERS + k)),
				 0);
		CHECK_EQ(weft_group_wait(spawners), 0);
		weft_group_free(spawners);
		if (!cancel) /* else the parked members wait for the cancel */
			weft_chan_close(release);
		int r = weft_group_wait(round_group);
		CHECK_EQ(weft_group_len(round_group), 0);
		CHECK_EQ(atomic_load(&in_round), atomic_load(&out_round)); /* nested ones too */
		atomic_store(&round_over, true);
		CHECK_EQ(pthread_join(th, NULL), 0);
		int f = atomic_load(&fails_injected);
		bool failed = r <= FAIL_CODE && r > FAIL_CODE - 100;
		if (cancel) /* the parked members gave up, unless a failure came first */
			CHECK(r == -ECANCELED || failed);
		else if (!f)
			CHECK_EQ(r, 0);
		else /* a failure cancels the group, but after it parked members may have left */
			CHECK(r == 0 || r == -ECANCELED || failed);
		if (cancel)
			CHECK_EQ(atomic_load(&thread_wait_result), r);
		CHECK(atomic_load(&spawned) > 0);
		weft_group_free(round_group);
		weft_chan_free(release);
	}
	return 0;
}

TEST(stress_members_on_every_worker_with_cancels_failures_and_thread_waiters)
{
	RUN(stress_main);
}

/*
 * Owners cancelled at random moments (while spawning, waiting or ending) by a task and a plain
 * thread: each owner's wait returns only when its own members have all ended.
 */
enum { OWNERS = SLOW ? 250 : 1000, OWNED = 3 }; /* 4 x OWNERS tasks alive at most */
static weft_task *owner_task[OWNERS];
static atomic_int owner_alive[OWNERS], owner_leaks, owners_done;

static int owned_member(void *arg)
{
	atomic_int *a = arg;
	atomic_fetch_add(a, 1);
	int r = weft_sleep(((intptr_t)arg >> 4) % 3 ? 200000 : WEFT_FOREVER);
	atomic_fetch_sub(a, 1);
	return r;
}

static void racing_owner(void *arg)
{
	int i = (int)(intptr_t)arg;
	weft_group *g = weft_group_new(WEFT_FOREVER);
	for (int k = 0; k < OWNED; k++) {
		int r = weft_group_spawn(g, owned_member, &owner_alive[i]);
		CHECK(r == 0 || r == -ECANCELED);
	}
	(void)weft_group_wait(g);
	if (atomic_load(&owner_alive[i]) != 0 || weft_group_len(g) != 0)
		atomic_fetch_add(&owner_leaks, 1);
	weft_group_free(g);
	atomic_fetch_add(&owners_done, 1);
}

static void *cancel_owners_thread(void *arg)
{
	unsigned seed = (unsigned)(uintptr_t)arg;
	for (int n = 0; n < OWNERS; n++) {
		int i = rand_r(&seed) % OWNERS;
		weft_task *t = __atomic_load_n(&owner_task[i], __ATOMIC_ACQUIRE);
		if (t) {
			int r = weft_cancel(t);
			CHECK(r == 0 || r == -ESRCH);
		}
		usleep(50);
	}
	return NULL;
}

static int owners_main(void *arg)
{
	(void)arg;
	pthread_t th;
	CHECK_EQ(pthread_create(&th, NULL, cancel_owners_thread, (void *)7), 0);
	unsigned seed = 3;
	for (int i = 0; i < OWNERS; i++) {
		weft_task *t = weft_spawn(racing_owner, (void *)(intptr_t)i);
		CHECK(t);
		__atomic_store_n(&owner_task[i], t, __ATOMIC_RELEASE);
		if (rand_r(&seed) % 2)
			CHECK_EQ(weft_cancel(owner_task[rand_r(&seed) % (i + 1)]), 0);
	}
	CHECK_EQ(pthread_join(th, NULL), 0);
	for (int i = 0; i < OWNERS; i++) /* the ones never cancelled end as their members do */
		CHECK_EQ(weft_cancel(owner_task[i]), 0);
	for (int i = 0; i < OWNERS; i++)
		CHECK_EQ(weft_join(owner_task[i]), 0);
	CHECK_EQ(atomic_load(&owners_done), OWNERS);
	CHECK_EQ(atomic_load(&owner_leaks), 0);
	return 0;
}

TEST(stress_owners_cancelled_while_spawning_waiting_and_ending)
{
	RUN(owners_main);
}

/* Groups freed by another task while their owners end: weft_group_free's step up to the owner
 * (a trylock) against the owner's disowning, on every worker. */
enum { HANDED = TEST_CAP(4000) / 2 };
static weft_group *_Atomic handed[HANDED];

static void make_and_hand_over(void *arg)
{
	int i = (int)(intptr_t)arg;
	weft_group *g = weft_group_new(WEFT_FOREVER);
	CHECK(g);
	CHECK_EQ(weft_group_spawn(g, count_and_yield, NULL), 0);
	atomic_store(&handed[i], g); /* and end, at about the time it is freed */
}

static int free_while_owner_ends(void *arg)
{
	(void)arg;
	weft_spawn_opts det = { .detached = 1 };
	for (int i = 0; i < HANDED; i++) {
		CHECK(weft_spawn_opt(make_and_hand_over, (void *)(intptr_t)i, &det));
		if (i % 8 == 7)
			weft_yield();
	}
	for (int i = 0; i < HANDED; i++) {
		weft_group *g;
		while (!(g = atomic_load(&handed[i])))
			weft_yield();
		CHECK_EQ(weft_group_wait(g), 0);
		weft_group_free(g);
	}
	CHECK_EQ(atomic_load(&ended), HANDED);
	return 0;
}

TEST(stress_groups_freed_while_their_owners_end)
{
	RUN(free_while_owner_ends);
}
