/*
 * tests/monitor.c - the monitor's promise (docs/design.md, The monitor): a worker held by a task
 * in a call the shim does not cover must not keep queued work from running on the other
 * workers, wherever that work waits: in the held worker's own queues, or in the global queue.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

#include "sched.h"
#include "task.h"
#include "test.h"
#include "wait.h"

/*
 * The global queue while the worker taking from it is held and the other workers sleep on the
 * idle list. tests/task.c `stack_slots_are_never_handed_out_twice` hung so now and then: a
 * channel's close woke 3,000 tasks onto its home worker's inbox, which that worker drained
 * into its ring, spilling the overflow to the global queue, which wakes nobody (the worker is
 * to take it itself, a fair share at a time); its main task then blocked it in pthread_join
 * with one task left there for a plain thread's weft_join, and the monitor counted the
 * sleeping idle worker as free to take it.
 *
 * Here, deterministically, on three workers (none parked): A runs the main task, B is held in
 * a raw read, C sleeps on the idle list. QUEUED parked tasks are made runnable onto A's inbox
 * from B (wait_finish_on, which wakes A alone), and A drains them into its ring, spilling what
 * does not fit to the global queue. The first of them to run while A's own queues are empty and
 * some have not run yet (the rest are in the global queue: A took its share of it) holds A in a
 * raw read. A plain thread joins the rest, with a deadline: unless the monitor wakes C for the
 * global queue, they wait for good, and the joins time out.
 */
enum { QUEUED = 300 }; /* more than a ring (RUNQ_SIZE): draining them spills */
static weft_task *queued[QUEUED];
static struct wait *_Atomic waits[QUEUED];
static atomic_int parked, ran, holder = -1;
static atomic_bool pushed;
static int hold_a[2], hold_b[2]; /* pipes the tasks holding workers A and B read */
static weft_chan *done;
static int64_t held_at, all_ran_at;

static void queued_task(void *arg)
{
	int i = (int)(intptr_t)arg;
	struct wait *w = wait_begin("test: queued", NULL);
	atomic_store(&waits[i], w);
	atomic_fetch_add(&parked, 1);
	CHECK_EQ(wait_park(w, WEFT_FOREVER), 0);
	int n = atomic_fetch_add(&ran, 1) + 1;
	struct worker *me = worker_self();
	int none = -1;
	bool own_queues_empty =
		!runq_len(&me->q) && !atomic_load(&me->next) && !atomic_load(&me->inbox);
	if (n < QUEUED && own_queues_empty && atomic_compare_exchange_strong(&holder, &none, i)) {
		held_at = weft_now();
		char c;
		CHECK_EQ(read(hold_a[0], &c, 1), 1); /* holds A in the kernel */
	}
}

/* Moves to B, makes the queued tasks runnable on A from there, then holds B. */
static void waker(void *arg)
{
	int a = (int)(intptr_t)arg, b = (a + 1) % 3;
	sched_move(b); /* onto B's inbox, which wakes B alone */
	CHECK_EQ(weft_worker_id(), b);
	for (int i = 0; i < QUEUED; i++) {
		struct wait *w = atomic_load(&waits[i]);
		CHECK(wait_claim(w));
		wait_finish_on(w, 0, a); /* onto A's inbox: wakes A only, which is running */
	}
	atomic_store(&pushed, true);
	char c;
	CHECK_EQ(read(hold_b[0], &c, 1), 1); /* holds B in the kernel */
}

static void *joiner(void *arg)
{
	(void)arg;
	int64_t until = weft_now() + 2000 * MS;
	while (atomic_load(&holder) < 0 && atomic_load(&ran) < QUEUED && weft_now() < until)
		usleep(100);
	int h = atomic_load(&holder);
	CHECK(h >= 0); /* the scenario was reached: a queued task held A with work still queued */
	for (int i = 0; i < QUEUED; i++) {
		if (i == h)
			continue;
		int r = weft_join_until(queued[i], until);
		if (r == -ETIMEDOUT)
			fprintf(stderr, "%d of %d queued tasks ran in 2 s beside a held worker\n",
				atomic_load(&ran), QUEUED);
		CHECK_EQ(r, 0);
	}
	all_ran_at = weft_now();
	CHECK_EQ(write(hold_a[1], "x", 1), 1);
	CHECK_EQ(write(hold_b[1], "x", 1), 1);
	CHECK_EQ(weft_join(queued[h]), 0);
	weft_chan_close(done);
	return NULL;
}

static int global_queue_main(void *arg)
{
	(void)arg;
	CHECK_EQ(pipe(hold_a), 0);
	CHECK_EQ(pipe(hold_b), 0);
	CHECK((done = weft_chan_new(0, 1)));
	for (int i = 0; i < QUEUED; i++)
		CHECK((queued[i] = weft_spawn(queued_task, (void *)(intptr_t)i)));
	while (atomic_load(&parked) < QUEUED)
		test_pause();
	/* Every worker but ours asleep on the idle list: our deadline wakes ours alone. */
	CHECK_EQ(weft_sleep(30 * MS), 0);
	int a = weft_worker_id();
	/* A has nothing else queued: the spawn wakes nobody, and the yield runs it here. */
	weft_task *w = weft_spawn(waker, (void *)(intptr_t)a);
	CHECK(w);
	weft_yield();
	while (!atomic_load(&pushed)) /* not a park: A must not drain its inbox before */
		;
	pthread_t th;
	CHECK_EQ(pthread_create(&th, NULL, joiner, NULL), 0);
	/* A drains its inbox as this parks, and runs the queued tasks */
	CHECK_EQ(weft_chan_take(done, NULL, 0), -EPIPE);
	CHECK_EQ(pthread_join(th, NULL), 0);
	CHECK_EQ(weft_join(w), 0);
	weft_chan_free(done);
	fprintf(stderr, "the last queued task ran %.1f ms after A was held\n",
		(double)(all_ran_at - held_at) / 1e6);
	return 0;
}

TEST(global_queue_runs_while_its_worker_is_held_and_the_rest_sleep)
{
	setenv("WEFT_WORKERS", "3", 1);
	setenv("WEFT_PARK", "0", 1); /* C sleeps on the idle list, not in standby */
	RUN(global_queue_main);
}
