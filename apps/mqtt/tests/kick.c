/*
 * Tests of kick.c on bare connection records: a kick reaches a connection napping in
 * conn_nap_until at once, whether it comes before the nap, during it, or in the instant the
 * nap begins, from a task on any worker or a plain thread; a nap nobody kicks lasts its time
 * and reports 0; the first kick's reason stays.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <weft.h>

#include "codec.h"
#include "conn_public.h"
#include "records.h"
#include "test.h"

#define CONNS 64
#define ROUNDS (SLOW ? 40 : 200)
#define LONG_NAP (10000 * MS) /* a kicked nap that ran this long was not woken */
#define SHORT_NAP (5 * MS)

static conn conns[CONNS];
static int peers[CONNS];
static atomic_int napped, results[CONNS];
static atomic_bool all_long; /* every nap long (a shutdown kicks them all) */
static _Atomic int64_t slept[CONNS];

static void fresh(int i)
{
	int sv[2];
	if (conns[i].fd > 0) {
		close(conns[i].fd);
		close(peers[i]);
	}
	CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	conns[i].fd = sv[0];
	peers[i] = sv[1];
	atomic_store(&conns[i].kick_rc, 0);
	atomic_store(&conns[i].napping, false);
}

/* Even connections are kicked (half by tasks, half by plain threads), odd ones are not. */
static bool kicked(int i)
{
	return i % 2 == 0;
}

static void napper(void *arg)
{
	int i = (int)(intptr_t)arg;
	int64_t t0 = weft_now();
	bool nap_long = kicked(i) || atomic_load(&all_long);
	int r = conn_nap_until(&conns[i], t0 + (nap_long ? LONG_NAP : SHORT_NAP));
	atomic_store(&slept[i], weft_now() - t0);
	atomic_store(&results[i], r);
	atomic_fetch_add(&napped, 1);
}

/* Kick conns[i] after a pause of 0 to about 3 spins of the scheduler: before its nap, as it
 * begins, or during it. */
static void kick_one(int i, unsigned *seed)
{
	int spins = rand_r(seed) % 4;
	for (int k = 0; k < spins; k++) {
		if (weft_self())
			weft_yield();
		else
			sched_yield();
	}
	conn_kick(&conns[i], 0x8B); /* two reasons: the first stays */
	conn_kick(&conns[i], 0x99);
}

static void task_kicker(void *arg)
{
	unsigned seed = (unsigned)(intptr_t)arg;
	for (int i = 0; i < CONNS; i += 4)
		kick_one(i, &seed);
}

static void *thread_kicker(void *arg)
{
	unsigned seed = (unsigned)(intptr_t)arg;
	for (int i = 2; i < CONNS; i += 4)
		kick_one(i, &seed);
	return NULL;
}

static int kicks_main(void *arg)
{
	(void)arg;
	for (int r = 0; r < ROUNDS; r++) {
		atomic_store(&napped, 0);
		for (int i = 0; i < CONNS; i++)
			fresh(i);
		weft_task *t[CONNS], *k;
		pthread_t th;
		for (int i = 0; i < CONNS; i++)
			CHECK(t[i] = weft_spawn(napper, (void *)(intptr_t)i));
		CHECK(k = weft_spawn(task_kicker, (void *)(intptr_t)(r + 1)));
		CHECK_EQ(pthread_create(&th, NULL, thread_kicker, (void *)(intptr_t)(r + 7)), 0);
		for (int i = 0; i < CONNS; i++)
			CHECK_EQ(weft_join(t[i]), 0);
		CHECK_EQ(weft_join(k), 0);
		pthread_join(th, NULL);
		for (int i = 0; i < CONNS; i++) {
			int64_t d = atomic_load(&slept[i]);
			if (kicked(i)) {
				CHECK_EQ(atomic_load(&results[i]), -1);
				CHECK(d < LONG_NAP / 2); /* woken, not timed out */
				CHECK_EQ(atomic_load(&conns[i].kick_rc), 0x8B);
				char b;
				CHECK_EQ(read(conns[i].fd, &b, 1), 0); /* its reads end */
			} else {
				CHECK_EQ(atomic_load(&results[i]), 0);
				CHECK(d >= SHORT_NAP);
				CHECK_EQ(atomic_load(&conns[i].kick_rc), 0);
			}
			CHECK(!atomic_load(&conns[i].napping));
		}
	}
	return 0;
}

TEST(kicks_wake_nappers_from_tasks_and_threads)
{
	RUN(kicks_main);
}

/* One napper, one kick aimed at the instant the nap begins (a spin of 0 to 4 us after the
 * napper says it is about to nap), many times: a kick that slipped in between the napper's look for a kick
 * and its sleep would leave it asleep until its deadline. Above, other kicks' wake-ups could
 * hide such a loss; here nothing else wakes the napper. From a plain thread (made before
 * weft_run, so not pinned to a worker's CPU, where it would wait for that worker's turn), and
 * from a task on the other worker. */
#define RACES (SLOW ? 1000 : 4000)
static atomic_int race_go, race_done;
static pthread_t race_th;

static void race_kick(unsigned *seed)
{
	while (!atomic_load_explicit(&race_go, memory_order_acquire))
		if (weft_self())
			weft_yield(); /* the napper may need this worker */
	atomic_store(&race_go, 0);
	spin_for(rand_r(seed) % 4000);
	conn_kick(&conns[0], 0x8B);
	atomic_fetch_add(&race_done, 1);
}

static void *race_thread(void *arg)
{
	(void)arg;
	unsigned seed = 1;
	for (int i = 0; i < RACES / 2; i++)
		race_kick(&seed);
	return NULL;
}

static void race_task(void *arg)
{
	(void)arg;
	unsigned seed = 2;
	for (int i = RACES / 2; i < RACES; i++)
		race_kick(&seed);
}

static void race_napper(void *arg)
{
	(void)arg;
	int64_t until = weft_now() + LONG_NAP;
	atomic_store_explicit(&race_go, 1, memory_order_release);
	CHECK_EQ(conn_nap_until(&conns[0], until), -1);
	CHECK(weft_now() < until); /* woken by the kick, not by its deadline */
}

static int race_main(void *arg)
{
	(void)arg;
	weft_task *k = NULL;
	for (int i = 0; i < RACES; i++) {
		if (i == RACES / 2)
			CHECK(k = weft_spawn(race_task, NULL));
		fresh(0);
		weft_task *t = weft_spawn(race_napper, NULL);
		CHECK(t);
		CHECK_EQ(weft_join(t), 0);
		CHECK_EQ(atomic_load(&conns[0].kick_rc), 0x8B);
		while (atomic_load(&race_done) <= i) /* the kick is done before the next round */
			weft_yield();
	}
	CHECK_EQ(weft_join(k), 0);
	return 0;
}

TEST(a_kick_racing_the_start_of_a_nap_is_never_lost)
{
	setenv("WEFT_WORKERS", "2", 1);
	CHECK_EQ(pthread_create(&race_th, NULL, race_thread, NULL), 0);
	RUN(race_main);
	pthread_join(race_th, NULL);
}

/* A shutdown kicks every connection, napping or not, from one task: every nap ends. */
static int shutdown_main(void *arg)
{
	(void)arg;
	atomic_store(&all_long, true);
	for (int r = 0; r < ROUNDS / 4; r++) {
		atomic_store(&napped, 0);
		weft_task *t[CONNS];
		for (int i = 0; i < CONNS; i++) {
			fresh(i);
			CHECK(t[i] = weft_spawn(napper, (void *)(intptr_t)i));
		}
		if (r % 2)
			weft_yield(); /* some napping already, some not yet */
		for (int i = 0; i < CONNS; i++)
			conn_kick(&conns[i], MQ_RC_SERVER_SHUTTING_DOWN);
		for (int i = 0; i < CONNS; i++)
			CHECK_EQ(weft_join(t[i]), 0);
		CHECK_EQ(atomic_load(&napped), CONNS);
		for (int i = 0; i < CONNS; i++) {
			CHECK_EQ(atomic_load(&results[i]), -1);
			CHECK(atomic_load(&slept[i]) < LONG_NAP / 2);
		}
	}
	return 0;
}

TEST(a_shutdown_ends_every_nap)
{
	RUN(shutdown_main);
}

/* A nap cut by weft_cancel reports -1 too (its task is to end), without a kick. */
static void cancelled_napper(void *arg)
{
	(void)arg;
	CHECK_EQ(conn_nap_until(&conns[1], weft_now() + LONG_NAP), -1);
	CHECK_EQ(atomic_load(&conns[1].kick_rc), 0);
}

static int cancel_main(void *arg)
{
	(void)arg;
	fresh(1);
	weft_task *t = weft_spawn(cancelled_napper, NULL);
	CHECK(t);
	weft_sleep_until(weft_now() + 5 * MS);
	CHECK_EQ(weft_cancel(t), 0);
	int rc = weft_join(t);
	CHECK(rc == 0 || rc == -ECANCELED);
	return 0;
}

TEST(a_cancelled_nap_ends)
{
	RUN(cancel_main);
}
