/*
 * Tests of deadlines: the timing wheel itself against a model (random deadlines from the past
 * to the end of int64_t, random cancels, random jumps of the clock), then timed waits in tasks
 * under stress: random deadlines on every worker, early wakes (channels, semaphores) racing
 * expiry, cancellation racing expiry, deadlines hours away and already past. Every timed wait
 * that times out is checked never to end before its deadline.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "test.h"
#include "timer.h"

static uint64_t rng_state = 88172645463325252ULL;

static uint64_t rnd(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return rng_state;
}

/* Per-task random numbers: tasks run on several workers at once. */
static uint64_t rnd_r(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* ---- the wheel against a model --------------------------------------------------------- */

enum { MODEL_N = 1000 };

static struct mtimer {
	struct timer t;
	bool queued;
	int fired;
	bool refuse; /* claim says no: somebody else woke it */
	bool late;   /* filed while a batch fired: perhaps after the expiry was over */
} mt[MODEL_N];

static struct timer_wheel wheel;
static int64_t model_now;
static int fired_total, capped;

static bool model_claim(struct timer *t)
{
	struct mtimer *m = (struct mtimer *)t;
	CHECK(m->queued);
	CHECK(t->when <= model_now); /* never before its deadline */
	CHECK_EQ(t->idx, -1);        /* out of the wheel before it is claimed */
	m->queued = false;
	return !m->refuse;
}

static void model_step(void);
static bool nested;  /* inside model_fire: no clock steps */
static bool solo;    /* no other worker at the wheel while a batch fires */

/* fire() runs with the wheel's lock dropped, part way through an expiry: meanwhile other
 * workers cancel and file timers, and another may expire (with an older clock reading). */
static void model_fire(struct timer **batch, int n)
{
	static int depth;
	CHECK(n > 0 && n <= TIMER_FIRE_BATCH);
	for (int i = 0; i < n; i++) {
		struct mtimer *m = (struct mtimer *)batch[i];
		CHECK(!m->refuse);
		m->fired++;
		fired_total++;
	}
	if (solo || depth || rnd() % 2)
		return;
	depth++;
	nested = true;
	for (int k = (int)(rnd() % 4); k > 0; k--)
		model_step();
	nested = false;
	if (rnd() % 2) {
		int64_t now = model_now;
		model_now -= (int64_t)(rnd() % 100000);
		timer_expire(&wheel, model_now, true, model_claim, model_fire);
		model_now = now;
	}
	depth--;
}

/* A deadline: mostly near, some past, some hours or centuries away. */
static int64_t model_deadline(void)
{
	switch (rnd() % 8) {
	case 0:
		return model_now - (int64_t)(rnd() % 1000000);                 /* past */
	case 1:
		return model_now + (int64_t)(rnd() % (4 * 3600 * 1000000000LL)); /* hours */
	case 2:
		return INT64_MAX - 1 - (int64_t)(rnd() % 1000);                  /* the end */
	case 3: { /* any scale */
		uint64_t d = rnd() >> (rnd() % 64 | 1);
		return d > (uint64_t)(INT64_MAX - model_now) ? INT64_MAX - 1 : model_now + (int64_t)d;
	}
	default:
		return model_now + (int64_t)(rnd() % 5000000);                   /* 0-5 ms */
	}
}

/* Expire as the worker does: look again while `first` says something is due and the last
 * look ended at its limit. */
static int model_expire(void)
{
	int n, total = 0, calls = 0;
	do {
		n = timer_expire(&wheel, model_now, false, model_claim, model_fire);
		CHECK(n <= TIMER_EXPIRE_MAX + TIMER_FIRE_BATCH);
		total += n;
		calls++;
	} while (n >= TIMER_EXPIRE_MAX && atomic_load(&wheel.first) <= model_now);
	if (calls > 1)
		capped++;
	return total;
}

static void model_check(void)
{
	int64_t min = INT64_MAX;
	int n = 0;
	for (int i = 0; i < MODEL_N; i++) {
		if (!mt[i].queued) {
			/* what the woken owner does: harmless once its timer has left the wheel */
			if (mt[i].t.wheel) {
				timer_del(&mt[i].t);
				CHECK(!mt[i].t.wheel);
			}
			continue;
		}
		n++;
		CHECK(mt[i].t.when > model_now || mt[i].late); /* everything due has been taken out */
		CHECK(mt[i].t.idx >= 0);
		if (mt[i].t.when < min)
			min = mt[i].t.when;
	}
	CHECK_EQ(wheel.n, n);
	int64_t first = atomic_load(&wheel.first);
	CHECK(first <= min); /* the idle loop never sleeps past a deadline */
	if (!n)
		CHECK_EQ(first, INT64_MAX);
}


/* Hundreds of deadlines within 100 us, as when 10^5 tasks sleep the same time. */
static void model_burst(void)
{
	for (int i = 0, n = 0; i < MODEL_N && n < 400; i++)
		if (!mt[i].queued) {
			mt[i].refuse = false;
			CHECK_EQ(timer_add(&wheel, &mt[i].t, model_now + (int64_t)(rnd() % 100000)), 0);
			mt[i].queued = true;
			mt[i].late = nested;
			n++;
		}
}

static void model_step(void)
{
	int k = (int)(rnd() % MODEL_N);
	if (!nested && rnd() % 512 == 0) {
		model_burst();
		return;
	}
	struct mtimer *m = &mt[k];
	switch (rnd() % 4) {
	case 0:
	case 1:
		if (!m->queued) {
			m->refuse = rnd() % 8 == 0;
			CHECK_EQ(timer_add(&wheel, &m->t, model_deadline()), 0);
			m->queued = true;
			m->late = nested;
		}
		break;
	case 2:
		if (m->queued) {
			timer_del(&m->t);
			CHECK_EQ(m->t.idx, -1);
			m->queued = false;
		}
		break;
	default: {
		if (nested)
			break;
		/* the clock: mostly small steps, now and then a jump of up to hours */
		uint64_t r = rnd();
		model_now += r % 16 == 0 ? (int64_t)(rnd() % (3600 * 1000000000LL))
					 : (int64_t)(rnd() % 200000);
		for (int i = 0; i < MODEL_N; i++)
			mt[i].late = false;
		model_expire();
		model_check();
	}
	}
}

TEST(wheel_matches_model)
{
	timer_wheel_init(&wheel);
	model_now = weft_now();
	for (int i = 0; i < MODEL_N; i++)
		mt[i].t.idx = -1;
	int steps = SLOW ? 100000 : 1000000;
	for (int i = 0; i < steps; i++)
		model_step();
	/* the end of time: everything left fires, exactly once (and nothing new is filed) */
	solo = true;
	model_now = INT64_MAX;
	model_expire();
	model_check();
	CHECK(capped > 0); /* some looks ended at the limit */
	CHECK_EQ(wheel.n, 0);
	int fired = 0;
	for (int i = 0; i < MODEL_N; i++) {
		CHECK(!mt[i].queued);
		fired += mt[i].fired;
	}
	CHECK_EQ(fired, fired_total);
	CHECK(fired_total > 1000);
	timer_wheel_destroy(&wheel);
}

/* Many timers due in the same tick, fired partly: those not yet due stay, to the ns. */
TEST(wheel_partial_tick_is_exact)
{
	solo = true;
	timer_wheel_init(&wheel);
	model_now = (weft_now() | 1023) - 1023 + 4096; /* a tick's start, a little ahead */
	for (int i = 0; i < 1000; i++) {
		mt[i] = (struct mtimer){ .t.idx = -1 };
		CHECK_EQ(timer_add(&wheel, &mt[i].t, model_now + i), 0);
		mt[i].queued = true;
	}
	int64_t base = model_now;
	for (int step = 0; step < 1010; step += 7) {
		model_now = base + step;
		model_expire();
		model_check();
		/* exact, not the tick's start */
		CHECK_EQ(atomic_load(&wheel.first), step + 1 < 1000 ? base + step + 1 : INT64_MAX);
	}
	CHECK_EQ(fired_total, 1000);
	timer_wheel_destroy(&wheel);
}

/* Without cancels, `first` is the earliest deadline exactly, whichever level it is on: the idle
 * loop sleeps until it and wakes for nothing else. */
TEST(wheel_first_is_exact)
{
	solo = true;
	timer_wheel_init(&wheel);
	model_now = weft_now();
	for (int i = 0; i < MODEL_N; i++)
		mt[i] = (struct mtimer){ .t.idx = -1 };
	for (int round = 0; round < 2000; round++) {
		for (int k = 0; k < 8; k++) {
			struct mtimer *m = &mt[rnd() % MODEL_N];
			if (m->queued)
				continue;
			int64_t d = model_deadline();
			CHECK_EQ(timer_add(&wheel, &m->t, d > model_now ? d : model_now + 1), 0);
			m->queued = true;
		}
		model_now += (int64_t)(rnd() % (rnd() % 8 ? 100000 : 100000000));
		model_expire();
		model_check();
		int64_t min = INT64_MAX;
		for (int i = 0; i < MODEL_N; i++)
			if (mt[i].queued && mt[i].t.when < min)
				min = mt[i].t.when;
		CHECK_EQ(atomic_load(&wheel.first), min);
	}
	timer_wheel_destroy(&wheel);
}

/* ---- tasks ------------------------------------------------------------------------------ */

static atomic_long timeouts, wakes;

/* Sleeps and timed receives on a channel nobody sends to, with random deadlines. */
static void random_waits(void *arg)
{
	weft_chan *c = arg;
	uint64_t s = (uint64_t)(uintptr_t)weft_self() | 1;
	for (int i = 0; i < 6; i++) {
		int64_t d = weft_now() - 200000 + (int64_t)(rnd_r(&s) % 3200000); /* -0.2..3 ms */
		if (i % 2) {
			CHECK_EQ(weft_sleep_until(d), 0);
		} else {
			int v;
			CHECK_EQ(weft_chan_recv(c, &v, sizeof v, d), -ETIMEDOUT);
		}
		CHECK(weft_now() >= d);
		atomic_fetch_add(&timeouts, 1);
	}
}

static int random_deadlines(void *arg)
{
	(void)arg;
	enum { N = SLOW ? 2000 : 20000 };
	weft_chan *c = weft_chan_new(0, sizeof(int));
	CHECK(c);
	CHECK_EQ(weft_execute(N, random_waits, c), 0);
	CHECK_EQ(atomic_load(&timeouts), 6L * N);
	weft_chan_free(c);
	return 0;
}

TEST(random_deadlines_on_all_workers_are_never_early)
{
	RUN(random_deadlines);
}

/* Early wakes racing expiry: senders and receivers on an unbuffered channel, and posters and
 * waiters on a semaphore, all with deadlines of a few microseconds; whatever times out is
 * late, and nothing is lost or delivered twice. */
static weft_chan *race_chan;
static weft_sem race_sem;
static atomic_long sent, received, posted, taken;

static void racer(void *arg)
{
	int role = (int)(intptr_t)arg % 4;
	uint64_t s = (uint64_t)(uintptr_t)weft_self() * 2654435761u | 1;
	for (int i = 0; i < (SLOW ? 100 : 400); i++) {
		int64_t d = weft_now() + (int64_t)(rnd_r(&s) % 60000);
		int v = i, r;
		switch (role) {
		case 0:
			r = weft_chan_send(race_chan, &v, sizeof v, d);
			if (r == 0)
				atomic_fetch_add(&sent, 1);
			break;
		case 1:
			r = weft_chan_recv(race_chan, &v, sizeof v, d);
			if (r >= 0) {
				CHECK_EQ(r, sizeof v);
				atomic_fetch_add(&received, 1);
				r = 0;
			}
			break;
		case 2:
			r = weft_sem_wait_until(&race_sem, d);
			if (r == 0)
				atomic_fetch_add(&taken, 1);
			break;
		default:
			if (rnd_r(&s) % 2)
				weft_yield();
			CHECK_EQ(weft_sem_post(&race_sem), 0);
			atomic_fetch_add(&posted, 1);
			r = weft_sleep_until(d);
			break;
		}
		if (r == -ETIMEDOUT)
			CHECK(weft_now() >= d);
		else
			CHECK_EQ(r, 0);
	}
}

static int early_wakes(void *arg)
{
	(void)arg;
	race_chan = weft_chan_new(0, sizeof(int));
	CHECK(race_chan);
	CHECK_EQ(weft_sem_init(&race_sem, 0), 0);
	enum { N = SLOW ? 400 : 800 };
	static weft_task *t[N];
	for (int i = 0; i < N; i++)
		CHECK((t[i] = weft_spawn(racer, (void *)(intptr_t)i)));
	for (int i = 0; i < N; i++)
		CHECK_EQ(weft_join(t[i]), 0);
	CHECK_EQ(atomic_load(&sent), atomic_load(&received));
	CHECK(atomic_load(&received) > 0);
	long left = 0;
	while (weft_sem_trywait(&race_sem) == 0)
		left++;
	CHECK_EQ(atomic_load(&taken) + left, atomic_load(&posted));
	CHECK(atomic_load(&taken) > 0);
	weft_chan_free(race_chan);
	return 0;
}

TEST(early_wakes_race_expiry)
{
	RUN(early_wakes);
}

/* Cancellation racing expiry: short sleeps and timed receives, cancelled at random moments by
 * other tasks. Each wait ends once: on time (never early), or cancelled. */
static weft_task *victims[SLOW ? 200 : 1000];
static atomic_long cancels_seen;

static void victim(void *arg)
{
	uint64_t s = (uint64_t)(uintptr_t)arg * 2654435761u | 1;
	weft_chan *c = race_chan;
	for (int i = 0;; i++) { /* until cancelled: every victim is, at some point of its wait */
		int64_t d = weft_now() + (int64_t)(rnd_r(&s) % 40000);
		int v, r = i % 2 ? weft_sleep_until(d) : weft_chan_recv(c, &v, sizeof v, d);
		if (r == -ECANCELED) {
			atomic_fetch_add(&cancels_seen, 1);
			CHECK_EQ(weft_sleep_until(weft_now() + 1000000), -ECANCELED);
			return;
		}
		CHECK(r == (i % 2 ? 0 : -ETIMEDOUT));
		CHECK(weft_now() >= d);
	}
}

static void canceller(void *arg)
{
	uint64_t s = (uint64_t)(uintptr_t)arg * 40503u | 1;
	int n = (int)(sizeof victims / sizeof *victims);
	for (int i = (int)(uintptr_t)arg; i < n; i += 16) {
		weft_sleep_until(weft_now() + (int64_t)(rnd_r(&s) % 30000));
		CHECK_EQ(weft_cancel(victims[i]), 0);
	}
}

static int cancel_races(void *arg)
{
	(void)arg;
	int n = (int)(sizeof victims / sizeof *victims);
	race_chan = weft_chan_new(0, sizeof(int));
	CHECK(race_chan);
	for (int i = 0; i < n; i++)
		CHECK((victims[i] = weft_spawn(victim, (void *)(intptr_t)(i + 1))));
	weft_task *c[16];
	for (int i = 0; i < 16; i++)
		CHECK((c[i] = weft_spawn(canceller, (void *)(intptr_t)i)));
	for (int i = 0; i < 16; i++)
		CHECK_EQ(weft_join(c[i]), 0);
	for (int i = 0; i < n; i++)
		CHECK_EQ(weft_join(victims[i]), 0);
	CHECK_EQ(atomic_load(&cancels_seen), n);
	weft_chan_free(race_chan);
	return 0;
}

TEST(cancellation_races_expiry)
{
	RUN(cancel_races);
}

/* Deadlines hours and centuries away wait (and do not hold up near ones) until woken or
 * cancelled; deadlines already past, however far, return at once. */
static weft_chan *far_chan;
static atomic_int far_done;

static void far_recv(void *arg)
{
	int64_t d = (int64_t)(intptr_t)arg, v = 0;
	int r = weft_chan_recv(far_chan, &v, sizeof v, d);
	CHECK(r == (int)sizeof v || r == -ECANCELED);
	atomic_fetch_add(&far_done, 1);
}

static void far_sleep(void *arg)
{
	CHECK_EQ(weft_sleep_until((int64_t)(intptr_t)arg), -ECANCELED);
	atomic_fetch_add(&far_done, 1);
}

static void near_sleep(void *arg)
{
	int64_t d = (int64_t)(intptr_t)arg;
	CHECK_EQ(weft_sleep_until(d), 0);
	CHECK(weft_now() >= d);
	atomic_fetch_add(&wakes, 1);
}

static int far_and_past(void *arg)
{
	(void)arg;
	int64_t now = weft_now(), hour = 3600 * 1000000000LL;
	/* past: sleeps return 0, timed receives -ETIMEDOUT, without waiting */
	int64_t past[] = { INT64_MIN, -1, 0, 1, now - hour, now - 1000, now };
	weft_chan *c = weft_chan_new(0, sizeof(int));
	CHECK(c);
	for (size_t i = 0; i < sizeof past / sizeof *past; i++) {
		int v;
		CHECK_EQ(weft_sleep_until(past[i]), 0);
		CHECK_EQ(weft_chan_recv(c, &v, sizeof v, past[i]), -ETIMEDOUT);
	}
	CHECK(weft_now() - now < 1000 * MS);
	weft_chan_free(c);

	far_chan = weft_chan_new(0, sizeof(int64_t));
	CHECK(far_chan);
	int64_t far[] = { now + 3 * hour, now + 1000 * hour, INT64_MAX / 2, INT64_MAX - 1 };
	enum { F = sizeof far / sizeof *far, NEAR = SLOW ? 500 : 2000 };
	weft_task *ft[2 * F];
	for (int i = 0; i < F; i++) {
		CHECK((ft[i] = weft_spawn(far_recv, (void *)(intptr_t)far[i])));
		CHECK((ft[F + i] = weft_spawn(far_sleep, (void *)(intptr_t)far[i])));
	}
	/* near deadlines fire on time while the far ones sit on the high levels */
	static weft_task *nt[NEAR];
	now = weft_now();
	for (int i = 0; i < NEAR; i++)
		CHECK((nt[i] = weft_spawn(near_sleep, (void *)(intptr_t)(now + (i % 50) * 100000))));
	for (int i = 0; i < NEAR; i++)
		CHECK_EQ(weft_join(nt[i]), 0);
	CHECK_EQ(atomic_load(&wakes), NEAR);
	CHECK(SLOW || weft_now() - now < 2000 * MS); /* TSan takes about 1 ms a task */
	CHECK_EQ(atomic_load(&far_done), 0);
	/* an early wake for two far receivers, cancellation for the rest */
	int64_t v = 7;
	CHECK_EQ(weft_chan_send(far_chan, &v, sizeof v, weft_now() + 5000 * MS), 0);
	CHECK_EQ(weft_chan_send(far_chan, &v, sizeof v, weft_now() + 5000 * MS), 0);
	test_await(&far_done, 2);
	for (int i = 0; i < 2 * F; i++)
		weft_cancel(ft[i]);
	for (int i = 0; i < 2 * F; i++)
		CHECK_EQ(weft_join(ft[i]), 0);
	CHECK_EQ(atomic_load(&far_done), 2 * F);
	weft_chan_free(far_chan);
	return 0;
}

TEST(deadlines_far_away_and_past)
{
	RUN(far_and_past);
}
