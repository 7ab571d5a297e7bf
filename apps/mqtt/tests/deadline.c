/*
 * Tests of deadline.c, the reaper's heap of offline sessions' deadlines, on bare session
 * records: sessions come out in deadline order, each once, never before their time; moving or
 * clearing a deadline takes effect; and tasks on every worker and plain threads filing and
 * clearing their own sessions while a reaper takes out what is due leave the heap exact.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include <weft.h>

#include "records.h"
#include "session.h"
#include "test.h"

static session *fresh(void)
{
	session *s = calloc(1, sizeof *s);
	CHECK(s);
	weft_mutex_init(&s->lock);
	atomic_init(&s->refs, 1);
	return s;
}

/* deadline_due's reference, given back without retiring the record */
static void unref(session *s)
{
	CHECK(atomic_fetch_sub(&s->refs, 1) == 2);
}

#define N 2000

static int order_main(void *arg)
{
	(void)arg;
	static session *s[N];
	static int64_t want[N];
	srand(7);
	for (int i = 0; i < N; i++) {
		s[i] = fresh();
		want[i] = 1 + rand() % 1000;
		deadline_set(s[i], want[i]);
	}
	for (int i = 0; i < N; i += 3) { /* move a third, clear a third */
		want[i] = 1 + rand() % 1000;
		deadline_set(s[i], want[i]);
		if (i + 1 < N) {
			want[i + 1] = 0;
			deadline_set(s[i + 1], 0);
		}
	}
	int64_t last = 0;
	int out = 0;
	for (int64_t now = 0; now <= 1000; now += 10) {
		session *d;
		while ((d = deadline_due(now))) {
			CHECK(d->dl_at <= now && d->dl_at >= last && d->dl_pos == 0);
			int i = 0;
			while (s[i] != d)
				i++;
			CHECK_EQ(d->dl_at, want[i]);
			want[i] = -1; /* out once */
			last = d->dl_at;
			out++;
			unref(d);
		}
	}
	for (int i = 0; i < N; i++)
		CHECK(want[i] <= 0);
	CHECK(deadline_due(INT64_MAX) == NULL);
	for (int i = 0; i < N; i++)
		free(s[i]);
	return 0;
}

TEST(sessions_come_out_in_deadline_order_once_and_on_time)
{
	RUN(order_main);
}

/* Stress: filers own their sessions (as a session's lock would make them), the reaper takes out
 * due ones; at the end the heap holds exactly the sessions that were filed last and not taken
 * out since, each with its last deadline, and gives each out once. */
#define FILERS 8
#define PER 64
#define ROUNDS (SLOW ? 2000 : 20000)
static session *fs[FILERS][PER];
static atomic_int filers_left;

static void filer(void *arg)
{
	int f = (int)(intptr_t)arg;
	unsigned seed = (unsigned)f * 7919u + 1;
	for (int r = 0; r < ROUNDS; r++) {
		session *s = fs[f][rand_r(&seed) % PER];
		WEFT_WITH_LOCK(&s->lock) {
			int64_t when = rand_r(&seed) % 4 ? weft_now() + rand_r(&seed) % 2000000 : 0;
			deadline_set(s, when);
			s->expire_at = when; /* what the reaper checks against */
		}
		if (r % 64 == 0)
			weft_yield();
	}
	atomic_fetch_sub(&filers_left, 1);
}

static void *filer_thread(void *arg)
{
	filer(arg);
	return NULL;
}

static atomic_long reaped;

static void reaper(void *arg)
{
	(void)arg;
	while (atomic_load(&filers_left) > 0) {
		session *s;
		int64_t now = weft_now();
		while ((s = deadline_due(now))) {
			/* (whether it was due is checked in the test above: its filer may have
			 * filed it again since, and its place is the heap's to read) */
			atomic_fetch_add(&reaped, 1);
			unref(s);
		}
		weft_yield();
	}
}

static int stress_main(void *arg)
{
	(void)arg;
	for (int f = 0; f < FILERS; f++)
		for (int i = 0; i < PER; i++)
			fs[f][i] = fresh();
	atomic_store(&filers_left, FILERS);
	weft_task *r = weft_spawn(reaper, NULL), *t[FILERS];
	pthread_t th[FILERS];
	for (int f = 0; f < FILERS; f++) {
		if (f % 4 == 3)
			CHECK(pthread_create(&th[f], NULL, filer_thread, (void *)(intptr_t)f) == 0);
		else
			t[f] = weft_spawn(filer, (void *)(intptr_t)f);
	}
	for (int f = 0; f < FILERS; f++) {
		if (f % 4 == 3)
			CHECK(pthread_join(th[f], NULL) == 0);
		else
			CHECK_EQ(weft_join(t[f]), 0);
	}
	CHECK_EQ(weft_join(r), 0);
	CHECK(atomic_load(&reaped) > 0);
	/* what is left: exactly the sessions whose last deadline was not taken out */
	int in_heap = 0;
	for (int f = 0; f < FILERS; f++)
		for (int i = 0; i < PER; i++)
			in_heap += fs[f][i]->dl_pos != 0;
	int out = 0;
	session *s;
	while ((s = deadline_due(INT64_MAX))) {
		CHECK(s->expire_at != 0 && s->dl_at == s->expire_at);
		out++;
		unref(s);
	}
	CHECK_EQ(out, in_heap);
	for (int f = 0; f < FILERS; f++)
		for (int i = 0; i < PER; i++) {
			CHECK_EQ(fs[f][i]->dl_pos, 0);
			free(fs[f][i]);
		}
	deadline_free_all();
	return 0;
}

TEST(filers_on_every_worker_and_threads_beside_a_reaper)
{
	RUN(stress_main);
}
