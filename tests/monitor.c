/*
 * tests/monitor.c - the monitor's promise (docs/design.md, The monitor): a worker held by a task
 * in a call the shim does not cover must not keep queued work from running on the other
 * workers, wherever that work waits: in the held worker's own queues, or in the global queue;
 * nor keep fds unpolled.
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

/*
 * Fds while the one worker at work is held and the other is parked. Nobody polls then: the
 * worker at work is held, and the parked one sleeps in standby, off the idle list that the
 * monitor's watch for unpolled fds wakes workers from; the monitor unparks for CPU only when
 * the held worker computes above 90% of the time, which one blocked in the kernel never does,
 * nor one the kernel time-slices with other programs (tests/io.c
 * `fds_stay_polled_while_the_poller_runs_a_long_task` on a loaded machine).
 *
 * Here, deterministically: a light load parks one of two workers; a reader task parks on a
 * pipe; the main task then holds the worker at work in the kernel (a raw read, as a call the
 * shim does not cover: no CPU time, so no unpark for CPU) for HOLD_MS, and a plain thread
 * writes the reader's pipe WRITE_MS into the hold, after the monitor's STUCK_NS (10 ms).
 * Unless the monitor brings the parked worker back to poll, the read waits out the hold.
 */
enum { HOLD_MS = 300, WRITE_MS = 20 };
static int fd_pipe[2], hold_pipe[2];
static atomic_bool reader_in;
static _Atomic int64_t written_at, read_at;

static void fd_reader(void *arg)
{
	(void)arg;
	char c;
	atomic_store(&reader_in, true);
	CHECK_EQ(weft_read(fd_pipe[0], &c, 1, weft_now() + 30000 * MS), 1);
	atomic_store(&read_at, weft_now());
}

static void *hold_writer(void *arg)
{
	(void)arg;
	usleep(WRITE_MS * 1000);
	atomic_store(&written_at, weft_now());
	CHECK_EQ(write(fd_pipe[1], "x", 1), 1);
	usleep((HOLD_MS - WRITE_MS) * 1000);
	CHECK_EQ(write(hold_pipe[1], "x", 1), 1); /* ends the hold */
	return NULL;
}

/* Workers in standby (parked), and whether the caller's is one. */
static int in_standby(bool *mine)
{
	weft_worker_stats st[8];
	int n = weft_stats(st, 8, NULL), k = 0;
	CHECK(n >= 1);
	for (int i = 0; i < n; i++)
		k += st[i].standby;
	*mine = st[weft_worker_id()].standby;
	return k;
}

static int parked_then_held(void *arg)
{
	(void)arg;
	CHECK_EQ(pipe(fd_pipe), 0);
	CHECK_EQ(pipe(hold_pipe), 0);
	weft_task *r = weft_spawn(fd_reader, NULL);
	CHECK(r);
	while (!atomic_load(&reader_in))
		CHECK_EQ(weft_sleep_until(weft_now() + MS), 0);
	/* A light load, the reader parked in its read: a wake-up a millisecond until the other
	 * worker is parked (the reader's start may have called it back; under an emulator the
	 * parking window takes longer to pass as light). */
	bool mine = true;
	for (int64_t end = weft_now() + 10000 * MS; in_standby(&mine) != 1 || mine;) {
		CHECK(weft_now() < end);
		CHECK_EQ(weft_sleep_until(weft_now() + MS), 0);
	}
	pthread_t th;
	CHECK_EQ(pthread_create(&th, NULL, hold_writer, NULL), 0);
	char c;
	CHECK_EQ(read(hold_pipe[0], &c, 1), 1); /* holds the worker in the kernel */
	CHECK_EQ(pthread_join(th, NULL), 0);
	CHECK_EQ(weft_join(r), 0);
	int64_t waited = atomic_load(&read_at) - atomic_load(&written_at);
	fprintf(stderr, "the read waited %.1f ms of a %d ms hold\n", waited / 1e6, HOLD_MS);
	/* Half the hold, as in tests/io.c: the kernel may keep the unparked worker off a core for
	 * tens of milliseconds on a loaded machine. */
	CHECK(waited < HOLD_MS / 2 * MS);
	return 0;
}

TEST(fds_stay_polled_while_the_one_worker_at_work_is_held)
{
	setenv("WEFT_WORKERS", "2", 1);
	unsetenv("WEFT_PARK");
	RUN(parked_then_held);
}

/*
 * Nor is the other worker parked while one is held: the CPU time of the two then looks like
 * a light load (the held one blocked, or time-sliced on a loaded machine, the other idle), but
 * the held worker takes none of the other's work. Here one of two workers is held in the
 * kernel for PARK_HOLD_MS, longer than the monitor's parking window (100 ms), while a task
 * wakes every millisecond; a plain thread samples the workers' standby flags all along.
 * Parked, the other worker would hand its sleeper over, the global queue would wait for a
 * worker free to take it, and the monitor would unpark it 10 ms later, window after window.
 */
enum { PARK_HOLD_MS = 400 };
static atomic_bool ticking;
static atomic_int standby_seen;

static void ticker(void *arg)
{
	(void)arg;
	while (atomic_load(&ticking))
		CHECK_EQ(weft_sleep_until(weft_now() + MS), 0);
}

static void *standby_sampler(void *arg)
{
	(void)arg;
	int64_t end = weft_now() + PARK_HOLD_MS * MS;
	while (weft_now() < end) {
		weft_worker_stats st[8];
		int n = weft_stats(st, 8, NULL);
		for (int i = 0; i < n; i++)
			if (st[i].standby)
				atomic_fetch_add(&standby_seen, 1);
		usleep(500);
	}
	CHECK_EQ(write(hold_pipe[1], "x", 1), 1); /* ends the hold */
	return NULL;
}

static int held_beside_a_light_load(void *arg)
{
	(void)arg;
	CHECK_EQ(pipe(hold_pipe), 0);
	atomic_store(&ticking, true);
	weft_task *t = weft_spawn(ticker, NULL);
	CHECK(t);
	CHECK_EQ(weft_sleep_until(weft_now() + 2 * MS), 0);
	bool mine;
	CHECK_EQ(in_standby(&mine), 0);
	pthread_t th;
	CHECK_EQ(pthread_create(&th, NULL, standby_sampler, NULL), 0);
	char c;
	CHECK_EQ(read(hold_pipe[0], &c, 1), 1); /* holds the worker in the kernel */
	CHECK_EQ(pthread_join(th, NULL), 0);
	atomic_store(&ticking, false);
	CHECK_EQ(weft_join(t), 0);
	fprintf(stderr, "a worker was seen in standby %d times in the %d ms hold\n",
		atomic_load(&standby_seen), PARK_HOLD_MS);
	CHECK_EQ(atomic_load(&standby_seen), 0);
	return 0;
}

TEST(a_worker_held_by_a_task_keeps_the_other_from_parking)
{
	setenv("WEFT_WORKERS", "2", 1);
	unsetenv("WEFT_PARK");
	RUN(held_beside_a_light_load);
}
