/* Tests of channels and select: stress at every capacity kind, crop/pad, offer/poll,
 * deadlines, close, select fairness and wake-ups, plain threads, cancellation, bad input. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "chan.h"
#include "sched.h" /* SLICE_OPS */
#include "test.h"

/* Wait until n senders or receivers are parked on c: tests that need a partner in place
 * must not rely on a nap being long enough (under emulation or load it is not). */
static void await_waiting(weft_chan *c, size_t n)
{
	while (weft_chan_waiting(c) < n)
		weft_sleep_until(weft_now() + 100000);
}

static void nap(int64_t ns)
{
	CHECK_EQ(weft_sleep_until(weft_now() + ns), 0);
}

/* ---- packets of the stress tests ---------------------------------------------------------
 * A packet is its producer's id and sequence number, then payload bytes that are a function
 * of both, of a length that is too: a receiver can check every byte, and the zero padding. */

#define PSIZE 64

struct hdr {
	uint32_t prod, seq;
};

static uint32_t mix(uint32_t a, uint32_t b)
{
	uint32_t x = a * 0x9e3779b1u ^ (b + 0x7f4a7c15u) * 0x85ebca6bu;
	x ^= x >> 15;
	x *= 0x2c1b3c6du;
	return x ^ (x >> 12);
}

static size_t make_packet(uint8_t *p, uint32_t prod, uint32_t seq)
{
	size_t len = sizeof(struct hdr) + mix(prod, seq) % (PSIZE - sizeof(struct hdr) + 1);
	memcpy(p, &(struct hdr){ prod, seq }, sizeof(struct hdr));
	for (size_t k = sizeof(struct hdr); k < len; k++)
		p[k] = (uint8_t)(prod * 131 + seq * 7 + k * 13);
	return len;
}

/* Checks the packet of length len in buf (PSIZE bytes); returns its header and byte sum. */
static struct hdr check_packet(const uint8_t *buf, int len, long *sum)
{
	struct hdr h;
	memcpy(&h, buf, sizeof h);
	uint8_t want[PSIZE];
	CHECK_EQ(len, (int)make_packet(want, h.prod, h.seq));
	CHECK(memcmp(buf, want, (size_t)len) == 0);
	for (int k = len; k < PSIZE; k++)
		CHECK_EQ(buf[k], 0);
	for (int k = 0; k < len; k++)
		*sum += buf[k];
	return h;
}

/* ---- MPMC stress ------------------------------------------------------------------------ */

enum { PRODS = 8, CONS = 8, PER = 20000 };

static struct {
	weft_chan *c;
	atomic_uchar seen[PRODS * PER];
	atomic_long got, sum_sent, sum_got;
} S;

/* Producers and consumers use put/take, timed calls with short deadlines (so timeouts race
 * with hand-offs) and offer/poll with yields, by id. */
static void producer(void *arg)
{
	uint32_t id = (uint32_t)(uintptr_t)arg;
	uint8_t p[PSIZE];
	long sum = 0;
	for (uint32_t seq = 0; seq < PER; seq++) {
		size_t len = make_packet(p, id, seq);
		for (size_t k = 0; k < len; k++)
			sum += p[k];
		int r;
		switch (id % 3) {
		case 0:
			r = weft_chan_put(S.c, p, len);
			break;
		case 1:
			while ((r = weft_chan_send(S.c, p, len, weft_now() + 20000)) == -ETIMEDOUT)
				;
			break;
		default:
			while ((r = weft_chan_offer(S.c, p, len)) == -EAGAIN)
				weft_yield();
		}
		CHECK_EQ(r, 0);
	}
	atomic_fetch_add(&S.sum_sent, sum);
}

static int receive(int how, uint8_t *buf)
{
	int r;
	switch (how) {
	case 0:
		return weft_chan_take(S.c, buf, PSIZE);
	case 1:
		while ((r = weft_chan_recv(S.c, buf, PSIZE, weft_now() + 20000)) == -ETIMEDOUT)
			;
		return r;
	default:
		while ((r = weft_chan_poll(S.c, buf, PSIZE)) == -EAGAIN)
			weft_yield();
		return r;
	}
}

static void consumer(void *arg)
{
	int how = (int)(uintptr_t)arg % 3;
	int64_t last[PRODS];
	for (int i = 0; i < PRODS; i++)
		last[i] = -1;
	uint8_t buf[PSIZE];
	long sum = 0, n = 0;
	int r;
	while (memset(buf, 0xee, sizeof buf), (r = receive(how, buf)) != -EPIPE) {
		CHECK(r > 0);
		struct hdr h = check_packet(buf, r, &sum);
		CHECK(h.prod < PRODS && h.seq < PER);
		CHECK((int64_t)h.seq > last[h.prod]); /* each producer's packets in order */
		last[h.prod] = h.seq;
		CHECK_EQ(atomic_exchange(&S.seen[h.prod * PER + h.seq], 1), 0);
		n++;
	}
	atomic_fetch_add(&S.got, n);
	atomic_fetch_add(&S.sum_got, sum);
}

static size_t stress_cap;

/* With the eager bias (child_bias_case), a plain thread beside the tasks locks S.c whenever
 * it finds it biased, and so takes the bias away as the owner's tasks come and go. The tasks
 * alone may never revoke: those on another worker that may move go to the owner's and enter
 * through its bias (chan.c, bias_fight), the scheduler may gather all of them on one worker
 * for the whole run (steal.c, idle.c), and under load it does; a plain thread it cannot. */
static atomic_bool revoker_stop, revoker_done;

static void *revoker(void *arg)
{
	(void)arg;
	while (!atomic_load(&revoker_stop))
		if (chan_bias_owner(S.c))
			weft_chan_len(S.c); /* a plain thread's locking revokes the bias */
		else
			sched_yield();
	atomic_store(&revoker_done, true);
	return NULL;
}

static int stress(void *arg)
{
	(void)arg;
	CHECK((S.c = weft_chan_new(stress_cap, PSIZE)));
	bool eager = chan_bias_mode() == CHAN_BIAS_EAGER;
	pthread_t rt;
	if (eager) {
		atomic_store(&revoker_stop, false);
		atomic_store(&revoker_done, false);
		CHECK_EQ(pthread_create(&rt, NULL, revoker, NULL), 0);
	}
	weft_task *p[PRODS], *c[CONS];
	for (int i = 0; i < PRODS || i < CONS; i++) {
		if (i < CONS)
			CHECK((c[i] = weft_spawn(consumer, (void *)(uintptr_t)i)));
		if (i < PRODS)
			CHECK((p[i] = weft_spawn(producer, (void *)(uintptr_t)i)));
	}
	for (int i = 0; i < PRODS; i++)
		CHECK_EQ(weft_join(p[i]), 0);
	/* However the run went, the consumers that poll or time out still lock S.c over and over
	 * until it is closed: the bias comes back, and the revoker takes it away from them. */
	while (eager && chan_bias_revocations() == 0)
		nap(MS);
	weft_chan_close(S.c); /* consumers drain what is buffered, then see -EPIPE */
	for (int i = 0; i < CONS; i++)
		CHECK_EQ(weft_join(c[i]), 0);
	if (eager) {
		atomic_store(&revoker_stop, true);
		while (!atomic_load(&revoker_done)) /* never block a worker in pthread_join */
			nap(MS);
		CHECK_EQ(pthread_join(rt, NULL), 0);
	}
	CHECK_EQ(atomic_load(&S.got), PRODS * PER);
	for (int i = 0; i < PRODS * PER; i++)
		CHECK_EQ(atomic_load(&S.seen[i]), 1);
	CHECK_EQ(atomic_load(&S.sum_got), atomic_load(&S.sum_sent));
	CHECK_EQ(weft_chan_len(S.c), 0);
	weft_chan_free(S.c);
	return 0;
}

TEST(mpmc_stress_capacity_0)
{
	stress_cap = 0;
	RUN(stress);
}

TEST(mpmc_stress_capacity_1)
{
	stress_cap = 1;
	RUN(stress);
}

TEST(mpmc_stress_capacity_7)
{
	stress_cap = 7;
	RUN(stress);
}

TEST(mpmc_stress_unbounded)
{
	stress_cap = WEFT_UNBOUNDED;
	RUN(stress);
}

/* ---- crop and pad ----------------------------------------------------------------------- */

static weft_chan *pc;

static void recv4(void *arg)
{
	char *buf = arg;
	CHECK_EQ(weft_chan_take(pc, buf, 4), 10); /* parked receiver, cropped by the sender */
}

static void send3(void *arg)
{
	(void)arg;
	CHECK_EQ(weft_chan_put(pc, "abc", 3), 0); /* parked sender */
}

static void check_padded(const char *buf)
{
	CHECK(memcmp(buf, "abc\0\0\0\0\0", 8) == 0);
	CHECK_EQ((unsigned char)buf[8], 0xaa); /* exactly cap bytes written */
}

static int crop_pad(void *arg)
{
	(void)arg;
	char buf[16];
	/* buffered */
	CHECK((pc = weft_chan_new(1, 16)));
	CHECK_EQ(weft_chan_put(pc, "0123456789", 10), 0);
	memset(buf, 0xaa, sizeof buf);
	CHECK_EQ(weft_chan_take(pc, buf, 4), 10);
	CHECK(memcmp(buf, "0123", 4) == 0 && (unsigned char)buf[4] == 0xaa);
	CHECK_EQ(weft_chan_put(pc, "abc", 3), 0);
	memset(buf, 0xaa, sizeof buf);
	CHECK_EQ(weft_chan_take(pc, buf, 8), 3);
	check_padded(buf);
	CHECK_EQ(weft_chan_put(pc, NULL, 0), 0); /* an empty packet */
	memset(buf, 0xaa, sizeof buf);
	CHECK_EQ(weft_chan_take(pc, buf, 5), 0);
	CHECK(memcmp(buf, "\0\0\0\0\0", 5) == 0);
	/* a full buffer with a parked sender: its packet moves into the freed slot */
	CHECK_EQ(weft_chan_put(pc, "0123456789", 10), 0);
	weft_task *t = weft_spawn(send3, NULL);
	await_waiting(pc, 1);
	CHECK_EQ(weft_chan_take(pc, buf, 16), 10);
	memset(buf, 0xaa, sizeof buf);
	CHECK_EQ(weft_chan_take(pc, buf, 8), 3);
	check_padded(buf);
	CHECK_EQ(weft_join(t), 0);
	weft_chan_free(pc);
	/* hand-off, both ways */
	CHECK((pc = weft_chan_new(0, 16)));
	memset(buf, 0xaa, sizeof buf);
	t = weft_spawn(recv4, buf);
	await_waiting(pc, 1);
	CHECK_EQ(weft_chan_put(pc, "0123456789", 10), 0);
	CHECK_EQ(weft_join(t), 0);
	CHECK(memcmp(buf, "0123", 4) == 0 && (unsigned char)buf[4] == 0xaa);
	t = weft_spawn(send3, NULL);
	await_waiting(pc, 1);
	memset(buf, 0xaa, sizeof buf);
	CHECK_EQ(weft_chan_take(pc, buf, 8), 3);
	check_padded(buf);
	CHECK_EQ(weft_join(t), 0);
	weft_chan_free(pc);
	return 0;
}

TEST(receive_crops_and_pads)
{
	RUN(crop_pad);
}

/* ---- offer and poll --------------------------------------------------------------------- */

static void recv_one(void *arg)
{
	int v;
	CHECK_EQ(weft_chan_take(arg, &v, sizeof v), sizeof v);
	CHECK_EQ(v, 42);
}

static int offer_poll(void *arg)
{
	(void)arg;
	int v = 0;
	weft_chan *c = weft_chan_new(1, sizeof v);
	CHECK(c);
	CHECK_EQ(weft_chan_poll(c, &v, sizeof v), -EAGAIN);
	CHECK_EQ(weft_chan_offer(c, &(int){ 5 }, sizeof v), 0);
	CHECK_EQ(weft_chan_len(c), 1);
	CHECK_EQ(weft_chan_offer(c, &(int){ 6 }, sizeof v), -EAGAIN);
	CHECK_EQ(weft_chan_poll(c, &v, sizeof v), sizeof v);
	CHECK_EQ(v, 5);
	CHECK_EQ(weft_chan_poll(c, &v, sizeof v), -EAGAIN);
	weft_chan_free(c);

	CHECK((c = weft_chan_new(7, sizeof v)));
	for (int i = 0; i < 7; i++)
		CHECK_EQ(weft_chan_offer(c, &i, sizeof i), 0);
	CHECK_EQ(weft_chan_offer(c, &v, sizeof v), -EAGAIN);
	CHECK_EQ(weft_chan_len(c), 7);
	for (int round = 0; round < 20; round++) { /* wrap around the ring */
		CHECK_EQ(weft_chan_poll(c, &v, sizeof v), sizeof v);
		CHECK_EQ(v, round);
		int next = round + 7;
		CHECK_EQ(weft_chan_offer(c, &next, sizeof next), 0);
	}
	weft_chan_free(c); /* with packets in it */

	/* capacity 0: offer and poll succeed only against a waiting partner */
	CHECK((c = weft_chan_new(0, sizeof v)));
	CHECK_EQ(weft_chan_offer(c, &v, sizeof v), -EAGAIN);
	CHECK_EQ(weft_chan_poll(c, &v, sizeof v), -EAGAIN);
	CHECK_EQ(weft_chan_len(c), 0);
	weft_task *t = weft_spawn(recv_one, c);
	await_waiting(c, 1);
	CHECK_EQ(weft_chan_offer(c, &(int){ 42 }, sizeof v), 0);
	CHECK_EQ(weft_join(t), 0);
	CHECK_EQ(weft_chan_offer(c, &v, sizeof v), -EAGAIN);
	weft_chan_free(c);

	/* unbounded: offers never fail, it grows and shrinks back, FIFO throughout */
	CHECK((c = weft_chan_new(WEFT_UNBOUNDED, sizeof v)));
	for (int round = 0; round < 3; round++) {
		for (int i = 0; i < 100000; i++)
			CHECK_EQ(weft_chan_offer(c, &i, sizeof i), 0);
		CHECK_EQ(weft_chan_len(c), 100000);
		for (int i = 0; i < 100000; i++) {
			CHECK_EQ(weft_chan_poll(c, &v, sizeof v), sizeof v);
			CHECK_EQ(v, i);
		}
		CHECK_EQ(weft_chan_poll(c, &v, sizeof v), -EAGAIN);
	}
	for (int i = 0; i < 1000; i++)
		CHECK_EQ(weft_chan_offer(c, &i, sizeof i), 0);
	weft_chan_free(c); /* segments still full: freed too (ASan's leak check) */
	return 0;
}

TEST(offer_and_poll_on_full_and_empty)
{
	RUN(offer_poll);
}

/* ---- FIFO among waiters ----------------------------------------------------------------- */

static weft_chan *fc;
static int fifo_got[5];

static void fifo_recv(void *arg)
{
	int i = (int)(uintptr_t)arg;
	CHECK_EQ(weft_chan_take(fc, &fifo_got[i], sizeof(int)), sizeof(int));
}

static int waiters_fifo(void *arg)
{
	(void)arg;
	CHECK((fc = weft_chan_new(0, sizeof(int))));
	weft_task *t[5];
	for (int i = 0; i < 5; i++) {
		t[i] = weft_spawn(fifo_recv, (void *)(uintptr_t)i);
		await_waiting(fc, (size_t)i + 1); /* each parks before the next comes */
	}
	for (int i = 0; i < 5; i++)
		CHECK_EQ(weft_chan_put(fc, &i, sizeof i), 0);
	for (int i = 0; i < 5; i++) {
		CHECK_EQ(weft_join(t[i]), 0);
		CHECK_EQ(fifo_got[i], i);
	}
	weft_chan_free(fc);
	return 0;
}

TEST(waiting_receivers_are_served_in_order)
{
	RUN(waiters_fifo);
}

/* ---- deadlines -------------------------------------------------------------------------- */

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return x < y ? -1 : x > y;
}

/* A timed wait is never early, late by under 2 ms at the median and under 100 ms always
 * (the bound a loaded CI machine still meets). */
static void check_lateness(int64_t *late, int n)
{
	for (int i = 0; i < n; i++)
		CHECK(late[i] >= 0 && late[i] < 100 * MS);
	qsort(late, (size_t)n, sizeof *late, cmp_i64);
	if (late[n / 2] >= 2 * MS)
		fprintf(stderr, "median lateness %lld ns\n", (long long)late[n / 2]);
	CHECK(late[n / 2] < 2 * MS);
}

static void timed_ops(weft_chan *empty, weft_chan *full)
{
	enum { N = 20 };
	int64_t late[N];
	int v = 0;
	for (int i = 0; i < N; i++) {
		int64_t d = weft_now() + 1 * MS + i * 50000;
		CHECK_EQ(weft_chan_recv(empty, &v, sizeof v, d), -ETIMEDOUT);
		late[i] = weft_now() - d;
	}
	check_lateness(late, N);
	for (int i = 0; i < N; i++) {
		int64_t d = weft_now() + 1 * MS + i * 50000;
		CHECK_EQ(weft_chan_send(full, &v, sizeof v, d), -ETIMEDOUT);
		late[i] = weft_now() - d;
	}
	check_lateness(late, N);
	/* a deadline already past: no waiting at all */
	int64_t t0 = weft_now();
	CHECK_EQ(weft_chan_recv(empty, &v, sizeof v, t0 - 1), -ETIMEDOUT);
	CHECK_EQ(weft_chan_recv(empty, &v, sizeof v, 0), -ETIMEDOUT);
	CHECK_EQ(weft_chan_send(full, &v, sizeof v, INT64_MIN), -ETIMEDOUT);
	CHECK(weft_now() - t0 < 50 * MS);
	/* ...but what can be done at once still is */
	CHECK_EQ(weft_chan_recv(full, &v, sizeof v, 0), sizeof v);
	CHECK_EQ(weft_chan_send(full, &v, sizeof v, 0), 0);
}

static int deadlines(void *arg)
{
	(void)arg;
	weft_chan *empty = weft_chan_new(1, sizeof(int)), *full = weft_chan_new(1, sizeof(int));
	CHECK(empty && full);
	CHECK_EQ(weft_chan_put(full, &(int){ 1 }, sizeof(int)), 0);
	timed_ops(empty, full);
	weft_chan_free(empty);
	weft_chan_free(full);
	return 0;
}

TEST(timed_recv_and_send_expire_on_time)
{
	RUN(deadlines);
}

TEST(timed_recv_and_send_expire_on_time_in_plain_threads)
{
	weft_chan *empty = weft_chan_new(0, sizeof(int)), *full = weft_chan_new(1, sizeof(int));
	CHECK(empty && full);
	CHECK_EQ(weft_chan_put(full, &(int){ 1 }, sizeof(int)), 0);
	timed_ops(empty, full);
	weft_chan_free(empty);
	weft_chan_free(full);
}

/* ---- close ------------------------------------------------------------------------------ */

static weft_chan *ca, *cb;
static atomic_int epipes;

static void parked_recv(void *arg)
{
	(void)arg;
	int v;
	CHECK_EQ(weft_chan_take(ca, &v, sizeof v), -EPIPE);
	atomic_fetch_add(&epipes, 1);
}

static void parked_send(void *arg)
{
	int v = (int)(uintptr_t)arg;
	CHECK_EQ(weft_chan_put(cb, &v, sizeof v), -EPIPE);
	atomic_fetch_add(&epipes, 1);
}

static void *thread_recv(void *arg)
{
	parked_recv(arg);
	return NULL;
}

static void *thread_send(void *arg)
{
	parked_send(arg);
	return NULL;
}

static int closes(void *arg)
{
	(void)arg;
	enum { N = 10 };
	CHECK((ca = weft_chan_new(0, sizeof(int))));
	CHECK((cb = weft_chan_new(2, sizeof(int))));
	CHECK_EQ(weft_chan_put(cb, &(int){ 100 }, sizeof(int)), 0);
	CHECK_EQ(weft_chan_put(cb, &(int){ 101 }, sizeof(int)), 0);
	weft_task *r[N], *s[N];
	for (int i = 0; i < N; i++) {
		CHECK((r[i] = weft_spawn(parked_recv, NULL)));
		CHECK((s[i] = weft_spawn(parked_send, (void *)(uintptr_t)i)));
	}
	pthread_t tr, ts;
	CHECK_EQ(pthread_create(&tr, NULL, thread_recv, NULL), 0);
	CHECK_EQ(pthread_create(&ts, NULL, thread_send, (void *)(uintptr_t)99), 0);
	nap(5 * MS);
	CHECK_EQ(atomic_load(&epipes), 0);
	weft_chan_close(ca);
	weft_chan_close(cb);
	weft_chan_close(cb); /* twice: nothing */
	for (int i = 0; i < N; i++) {
		CHECK_EQ(weft_join(r[i]), 0);
		CHECK_EQ(weft_join(s[i]), 0);
	}
	while (atomic_load(&epipes) < 2 * N + 2)
		nap(MS);
	CHECK_EQ(pthread_join(tr, NULL), 0);
	CHECK_EQ(pthread_join(ts, NULL), 0);
	/* cb still holds its two packets: drained, then -EPIPE */
	int v;
	CHECK_EQ(weft_chan_take(cb, &v, sizeof v), sizeof v);
	CHECK_EQ(v, 100);
	CHECK_EQ(weft_chan_poll(cb, &v, sizeof v), sizeof v);
	CHECK_EQ(v, 101);
	CHECK_EQ(weft_chan_take(cb, &v, sizeof v), -EPIPE);
	CHECK_EQ(weft_chan_poll(cb, &v, sizeof v), -EPIPE);
	CHECK_EQ(weft_chan_recv(cb, &v, sizeof v, weft_now() + MS), -EPIPE);
	CHECK_EQ(weft_chan_put(ca, &v, sizeof v), -EPIPE);
	CHECK_EQ(weft_chan_offer(cb, &v, sizeof v), -EPIPE);
	CHECK_EQ(weft_chan_send(cb, &v, sizeof v, 0), -EPIPE);
	weft_chan_free(ca); /* every waiter has left */
	weft_chan_free(cb);
	weft_chan_close(NULL);
	weft_chan_free(NULL);
	return 0;
}

TEST(close_wakes_parked_senders_and_receivers)
{
	RUN(closes);
}

static void stuck_recv(void *arg)
{
	int v;
	weft_chan_take(arg, &v, sizeof v);
}

static int free_busy(void *arg)
{
	(void)arg;
	weft_chan *c = weft_chan_new(0, sizeof(int));
	weft_spawn(stuck_recv, c);
	await_waiting(c, 1);
	weft_chan_free(c);
	return 0;
}

TEST(child_free_with_waiter)
{
	weft_run(free_busy, NULL);
}

TEST(free_with_waiters_is_reported)
{
	test_expect_abort("child_free_with_waiter",
			  "weft: weft_chan_free on a channel with 1 waiter\n");
}

/* A channel used after weft_chan_free: said so, not a silent hang on its lock (what the
 * allocator or the poison left in the lock word is no lock value). A bounded channel, an
 * unbounded one, by a task on a worker that used it before (its bias), and by a plain thread. */
static int use_after_free(void *arg)
{
	int v = 1;
	weft_chan *c = weft_chan_new(*(const char *)arg == 'u' ? WEFT_UNBOUNDED : 4, sizeof v);
	for (int i = 0; i < 1000; i++) { /* its bias goes to this worker */
		CHECK(weft_chan_put(c, &v, sizeof v) >= 0);
		CHECK(weft_chan_take(c, &v, sizeof v) >= 0);
	}
	weft_chan_free(c);
	weft_chan_put(c, &v, sizeof v);
	return 0;
}

TEST(child_use_after_free_bounded)
{
	weft_run(use_after_free, "b");
}

TEST(child_use_after_free_unbounded)
{
	weft_run(use_after_free, "u");
}

TEST(child_use_after_free_thread)
{
	int v = 1;
	weft_chan *c = weft_chan_new(4, sizeof v);
	CHECK(weft_chan_put(c, &v, sizeof v) >= 0);
	weft_chan_free(c);
	weft_chan_take(c, &v, sizeof v);
}

TEST(use_after_free_is_reported)
{
#if defined(__SANITIZE_ADDRESS__)
	test_skip("ASan reports the use after free itself, and first");
#endif
	test_expect_abort("child_use_after_free_bounded", "used after weft_chan_free");
	test_expect_abort("child_use_after_free_unbounded", "used after weft_chan_free");
	test_expect_abort("child_use_after_free_thread", "used after weft_chan_free");
}

/* The dump finds a channel's name only while the channel is named and not freed: named
 * channels are kept in a set (chan.c) that must stay right through renames, unnamings and frees
 * in any order (its deletions shift entries back). */
TEST(dump_finds_names_of_live_named_channels_only)
{
	enum { N = 2000 };
	static weft_chan *c[N];
	static bool live[N], named[N];
	char want[32], got[32];
	uint64_t x = 0x2545F4914F6CDD1DULL;
	for (int i = 0; i < N; i++) {
		CHECK((c[i] = weft_chan_new(1, 8)));
		live[i] = true;
	}
	for (int step = 0; step < 20 * N; step++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		int i = (int)(x % N), op = (int)(x >> 32) % 4;
		if (!live[i])
			continue;
		if (op == 0 || op == 1) {
			snprintf(want, sizeof want, "chan-%d-%d", i, step);
			weft_chan_set_name(c[i], want);
			named[i] = true;
		} else if (op == 2) {
			weft_chan_set_name(c[i], "");
			named[i] = false;
		} else if (step > 10 * N) {
			weft_chan_free(c[i]);
			live[i] = named[i] = false;
		}
		for (int k = step % 64 ? i : 0; k < (step % 64 ? i + 1 : N); k++) { /* now and then all */
			if (!live[k])
				continue;
			bool found = chan_name_of(c[k], got, sizeof got, true);
			CHECK_EQ(found, named[k]);
			if (found)
				CHECK_EQ(strcmp(got, weft_chan_name(c[k])), 0);
		}
	}
	for (int i = 0; i < N; i++) {
		if (live[i])
			CHECK_EQ(chan_name_of(c[i], got, sizeof got, true), named[i]);
		weft_chan_free(live[i] ? c[i] : NULL);
	}
	int on_stack;
	CHECK(!chan_name_of(&on_stack, got, sizeof got, true));
	CHECK(!chan_name_of(NULL, got, sizeof got, false));
}

/* ---- select ----------------------------------------------------------------------------- */

static int select_fair(void *arg)
{
	(void)arg;
	enum { K = 4, ROUNDS = 100000 };
	weft_chan *c[K];
	weft_select_case k[K];
	int buf[K], count[K] = { 0 };
	/* four receive cases, always ready */
	for (int i = 0; i < K; i++) {
		CHECK((c[i] = weft_chan_new(1, sizeof(int))));
		CHECK_EQ(weft_chan_offer(c[i], &i, sizeof i), 0);
		k[i] = weft_select_recv(c[i], &buf[i], sizeof buf[i]);
	}
	for (int r = 0; r < ROUNDS; r++) {
		int i = weft_select(k, K, WEFT_FOREVER);
		CHECK(i >= 0 && i < K);
		CHECK_EQ(k[i].result, sizeof(int));
		CHECK_EQ(buf[i], i);
		count[i]++;
		CHECK_EQ(weft_chan_offer(c[i], &i, sizeof i), 0);
	}
	for (int i = 0; i < K; i++)
		CHECK(abs(count[i] - ROUNDS / K) < ROUNDS / K / 10);
	/* two receives and two sends, all ready */
	memset(count, 0, sizeof count);
	for (int i = 2; i < K; i++) {
		CHECK_EQ(weft_chan_poll(c[i], &buf[i], sizeof buf[i]), sizeof(int));
		k[i] = weft_select_send(c[i], &i, sizeof i);
	}
	int two = 2, three = 3;
	k[2].packet = &two;
	k[3].packet = &three;
	for (int r = 0; r < ROUNDS; r++) {
		int i = weft_select(k, K, 0);
		CHECK(i >= 0 && i < K);
		CHECK_EQ(k[i].result, i < 2 ? (int)sizeof(int) : 0);
		count[i]++;
		if (i < 2)
			CHECK_EQ(weft_chan_offer(c[i], &i, sizeof i), 0);
		else
			CHECK_EQ(weft_chan_poll(c[i], &buf[i], sizeof buf[i]), sizeof(int));
	}
	for (int i = 0; i < K; i++) {
		CHECK(abs(count[i] - ROUNDS / K) < ROUNDS / K / 10);
		weft_chan_free(c[i]);
	}
	return 0;
}

TEST(select_chooses_ready_cases_fairly)
{
	RUN(select_fair);
}

static weft_chan *sc[3];

static void send_later(void *arg)
{
	int i = (int)(uintptr_t)arg;
	nap(2 * MS);
	CHECK_EQ(weft_chan_put(sc[i], "hello", 5), 0);
}

static void take_later(void *arg)
{
	int i = (int)(uintptr_t)arg;
	char buf[8];
	nap(2 * MS);
	CHECK_EQ(weft_chan_take(sc[i], buf, sizeof buf), 3);
	CHECK(memcmp(buf, "abc\0\0\0\0\0", 8) == 0);
}

static int select_waits(void *arg)
{
	(void)arg;
	char buf[3][8];
	weft_select_case k[3];
	/* receives on three empty channels: woken by a send on the middle one */
	for (int i = 0; i < 3; i++) {
		CHECK((sc[i] = weft_chan_new(i, 8))); /* capacities 0, 1, 2 */
		k[i] = weft_select_recv(sc[i], buf[i], sizeof buf[i]);
	}
	weft_task *t = weft_spawn(send_later, (void *)(uintptr_t)1);
	CHECK_EQ(weft_select(k, 3, WEFT_FOREVER), 1);
	CHECK_EQ(k[1].result, 5);
	CHECK(memcmp(buf[1], "hello\0\0\0", 8) == 0);
	CHECK_EQ(weft_join(t), 0);
	/* the same at capacity 0: the sender hands its packet over */
	t = weft_spawn(send_later, (void *)(uintptr_t)0);
	CHECK_EQ(weft_select(k, 3, weft_now() + 1000 * MS), 0);
	CHECK_EQ(k[0].result, 5);
	CHECK_EQ(weft_join(t), 0);
	/* sends: capacity 0 has no receiver, 1 and 2 are full; a receiver comes to channel 2 */
	CHECK_EQ(weft_chan_put(sc[1], "x", 1), 0);
	CHECK_EQ(weft_chan_put(sc[2], "abc", 3), 0);
	CHECK_EQ(weft_chan_put(sc[2], "abc", 3), 0);
	for (int i = 0; i < 3; i++)
		k[i] = weft_select_send(sc[i], "abc", 3);
	t = weft_spawn(take_later, (void *)(uintptr_t)2);
	CHECK_EQ(weft_select(k, 3, WEFT_FOREVER), 2);
	CHECK_EQ(k[2].result, 0);
	CHECK_EQ(weft_join(t), 0);
	CHECK_EQ(weft_chan_len(sc[2]), 2);
	/* nothing ready: times out, never early */
	int64_t d = weft_now() + 2 * MS;
	CHECK_EQ(weft_select(k, 3, d), -ETIMEDOUT);
	CHECK(weft_now() >= d);
	CHECK_EQ(weft_select(k, 3, 0), -ETIMEDOUT);
	/* its own send and receive on one hand-off channel never pair up */
	weft_select_case self[2] = { weft_select_send(sc[0], "abc", 3),
				     weft_select_recv(sc[0], buf[0], 8) };
	CHECK_EQ(weft_select(self, 2, weft_now() + 2 * MS), -ETIMEDOUT);
	/* NULL channels are never chosen; no cases at all just waits */
	weft_select_case none[2] = { weft_select_recv(NULL, buf[0], 8),
				     weft_select_send(NULL, "a", 1) };
	CHECK_EQ(weft_select(none, 2, weft_now() + MS), -ETIMEDOUT);
	CHECK_EQ(weft_select(NULL, 0, weft_now() + MS), -ETIMEDOUT);
	/* a closed channel is ready, with -EPIPE */
	weft_chan_close(sc[0]);
	k[1] = weft_select_recv(NULL, buf[1], 8);
	k[2] = weft_select_recv(NULL, buf[2], 8);
	CHECK_EQ(weft_select(k, 3, WEFT_FOREVER), 0);
	CHECK_EQ(k[0].result, -EPIPE);
	/* a closed channel's buffered packets come first */
	weft_chan_close(sc[2]);
	k[0] = weft_select_recv(sc[2], buf[0], 8);
	CHECK_EQ(weft_select(k, 1, 0), 0);
	CHECK_EQ(k[0].result, 3);
	CHECK_EQ(weft_select(k, 1, 0), 0);
	CHECK_EQ(k[0].result, 3);
	CHECK_EQ(weft_select(k, 1, 0), 0);
	CHECK_EQ(k[0].result, -EPIPE);
	for (int i = 0; i < 3; i++)
		weft_chan_free(sc[i]); /* no node of any select is left queued */
	return 0;
}

TEST(select_waits_wakes_times_out_and_sees_close)
{
	RUN(select_waits);
}

static atomic_int select_closed, select_started;

static void select_forever(void *arg)
{
	(void)arg;
	char buf[8];
	weft_select_case k[3];
	for (int i = 0; i < 3; i++)
		k[i] = weft_select_recv(sc[i], buf, sizeof buf);
	atomic_fetch_add(&select_started, 1); /* and parks in weft_select right away */
	int r = weft_select(k, 3, WEFT_FOREVER);
	if (r == -ECANCELED)
		return;
	CHECK(r >= 0 && k[r].result == -EPIPE);
	atomic_fetch_add(&select_closed, 1);
}

/* Many selects parked on the same channels: cancelled, or woken by a close. */
static int select_cancel_close(void *arg)
{
	(void)arg;
	enum { N = 50 };
	for (int i = 0; i < 3; i++)
		CHECK((sc[i] = weft_chan_new(i, 8)));
	weft_task *t[N];
	for (int i = 0; i < N; i++)
		CHECK((t[i] = weft_spawn(select_forever, NULL)));
	/* Every task must be in its select before the close, or it would find the channel
	 * closed instead of being cancelled: a fixed nap is not enough under emulation. */
	while (atomic_load(&select_started) < N)
		nap(MS);
	for (int i = 0; i < N; i += 2)
		CHECK_EQ(weft_cancel(t[i]), 0);
	nap(20 * MS);
	weft_chan_close(sc[1]);
	for (int i = 0; i < N; i++)
		CHECK_EQ(weft_join(t[i]), 0);
	CHECK_EQ(atomic_load(&select_closed), N / 2);
	for (int i = 0; i < 3; i++)
		weft_chan_free(sc[i]);
	return 0;
}

TEST(select_cancelled_or_closed_leaves_no_waiter)
{
	RUN(select_cancel_close);
}

/* Selects on both sides over three channels: exactly-once delivery. */
enum { SPRODS = 6, SCONS = 6, SPER = 3000 };
static atomic_uchar sseen[SPRODS * SPER];
static atomic_long sgot;

static void select_producer(void *arg)
{
	uint32_t id = (uint32_t)(uintptr_t)arg;
	uint8_t p[PSIZE];
	for (uint32_t seq = 0; seq < SPER; seq++) {
		size_t len = make_packet(p, id, seq);
		weft_select_case k[3];
		for (int i = 0; i < 3; i++)
			k[i] = weft_select_send(sc[i], p, len);
		int r = weft_select(k, 3, seq % 2 ? WEFT_FOREVER : weft_now() + 50000);
		if (r == -ETIMEDOUT) {
			seq--;
			continue;
		}
		CHECK(r >= 0 && r < 3);
		CHECK_EQ(k[r].result, 0);
	}
}

static void select_consumer(void *arg)
{
	uint8_t buf[3][PSIZE];
	weft_select_case k[3];
	for (int i = 0; i < 3; i++)
		k[i] = weft_select_recv(sc[i], buf[i], PSIZE);
	long sum = 0, n = 0;
	int open = 3;
	bool timed = (uintptr_t)arg % 2;
	while (open) {
		int r = weft_select(k, 3, timed ? weft_now() + 50000 : WEFT_FOREVER);
		if (r == -ETIMEDOUT)
			continue;
		CHECK(r >= 0 && r < 3);
		if (k[r].result == -EPIPE) {
			k[r].chan = NULL;
			open--;
			continue;
		}
		struct hdr h = check_packet(buf[r], k[r].result, &sum);
		CHECK(h.prod < SPRODS && h.seq < SPER);
		CHECK_EQ(atomic_exchange(&sseen[h.prod * SPER + h.seq], 1), 0);
		n++;
	}
	atomic_fetch_add(&sgot, n);
}

static int select_stress(void *arg)
{
	(void)arg;
	CHECK((sc[0] = weft_chan_new(0, PSIZE)));
	CHECK((sc[1] = weft_chan_new(1, PSIZE)));
	CHECK((sc[2] = weft_chan_new(WEFT_UNBOUNDED, PSIZE)));
	weft_task *p[SPRODS], *c[SCONS];
	for (int i = 0; i < SCONS; i++)
		CHECK((c[i] = weft_spawn(select_consumer, (void *)(uintptr_t)i)));
	for (int i = 0; i < SPRODS; i++)
		CHECK((p[i] = weft_spawn(select_producer, (void *)(uintptr_t)i)));
	for (int i = 0; i < SPRODS; i++)
		CHECK_EQ(weft_join(p[i]), 0);
	for (int i = 0; i < 3; i++)
		weft_chan_close(sc[i]);
	for (int i = 0; i < SCONS; i++)
		CHECK_EQ(weft_join(c[i]), 0);
	CHECK_EQ(atomic_load(&sgot), SPRODS * SPER);
	for (int i = 0; i < SPRODS * SPER; i++)
		CHECK_EQ(atomic_load(&sseen[i]), 1);
	for (int i = 0; i < 3; i++)
		weft_chan_free(sc[i]);
	return 0;
}

TEST(select_stress_exactly_once)
{
	RUN(select_stress);
}

/* ---- plain threads ---------------------------------------------------------------------- */

enum { THREADS = 4, TPER = 5000 };
static weft_chan *to_tasks, *to_threads;
static atomic_long tsum_sent, tsum_got;
static atomic_int threads_done;

static void *thread_producer(void *arg)
{
	(void)arg;
	for (long i = 1; i <= TPER; i++) {
		CHECK_EQ(weft_chan_put(to_tasks, &i, sizeof i), 0);
		atomic_fetch_add(&tsum_sent, i);
	}
	atomic_fetch_add(&threads_done, 1);
	return NULL;
}

static void *thread_consumer(void *arg)
{
	(void)arg;
	long v;
	int r;
	while ((r = weft_chan_take(to_threads, &v, sizeof v)) != -EPIPE) {
		CHECK_EQ(r, sizeof v);
		atomic_fetch_add(&tsum_got, v);
	}
	atomic_fetch_add(&threads_done, 1);
	return NULL;
}

static void task_producer(void *arg)
{
	(void)arg;
	for (long i = 1; i <= TPER; i++) {
		CHECK_EQ(weft_chan_put(to_threads, &i, sizeof i), 0);
		atomic_fetch_add(&tsum_sent, i);
	}
}

static void task_consumer(void *arg)
{
	(void)arg;
	long v;
	int r;
	while ((r = weft_chan_take(to_tasks, &v, sizeof v)) != -EPIPE) {
		CHECK_EQ(r, sizeof v);
		atomic_fetch_add(&tsum_got, v);
	}
}

static size_t thread_cap;

static int thread_traffic(void *arg)
{
	(void)arg;
	CHECK((to_tasks = weft_chan_new(thread_cap, sizeof(long))));
	CHECK((to_threads = weft_chan_new(thread_cap, sizeof(long))));
	pthread_t tp[THREADS], tc[THREADS];
	weft_task *p[THREADS], *c[THREADS];
	for (int i = 0; i < THREADS; i++) {
		CHECK_EQ(pthread_create(&tp[i], NULL, thread_producer, NULL), 0);
		CHECK_EQ(pthread_create(&tc[i], NULL, thread_consumer, NULL), 0);
		CHECK((p[i] = weft_spawn(task_producer, NULL)));
		CHECK((c[i] = weft_spawn(task_consumer, NULL)));
	}
	for (int i = 0; i < THREADS; i++)
		CHECK_EQ(weft_join(p[i]), 0);
	weft_chan_close(to_threads);
	while (atomic_load(&threads_done) < 2 * THREADS) /* never block a worker in pthread_join */
		nap(MS);
	weft_chan_close(to_tasks);
	for (int i = 0; i < THREADS; i++) {
		CHECK_EQ(weft_join(c[i]), 0);
		CHECK_EQ(pthread_join(tp[i], NULL), 0);
		CHECK_EQ(pthread_join(tc[i], NULL), 0);
	}
	CHECK_EQ(atomic_load(&tsum_got), atomic_load(&tsum_sent));
	CHECK_EQ(atomic_load(&tsum_sent), 2L * THREADS * TPER * (TPER + 1) / 2);
	weft_chan_free(to_tasks);
	weft_chan_free(to_threads);
	return 0;
}

TEST(plain_threads_and_tasks_both_ways_capacity_0)
{
	thread_cap = 0;
	RUN(thread_traffic);
}

TEST(plain_threads_and_tasks_both_ways_capacity_1)
{
	thread_cap = 1;
	RUN(thread_traffic);
}

/* Without weft_run at all: threads only, with a select among them. */
static void *ponger(void *arg)
{
	(void)arg;
	long v;
	int r;
	while ((r = weft_chan_take(to_threads, &v, sizeof v)) == sizeof v)
		CHECK_EQ(weft_chan_put(to_tasks, &(long){ v + 1 }, sizeof v), 0);
	CHECK_EQ(r, -EPIPE);
	return NULL;
}

TEST(plain_threads_without_weft_run)
{
	CHECK((to_tasks = weft_chan_new(0, sizeof(long))));
	CHECK((to_threads = weft_chan_new(0, sizeof(long))));
	pthread_t th;
	CHECK_EQ(pthread_create(&th, NULL, ponger, NULL), 0);
	for (long i = 0; i < 2000; i++) {
		long v;
		CHECK_EQ(weft_chan_put(to_threads, &i, sizeof i), 0);
		weft_select_case k[2] = { weft_select_recv(to_tasks, &v, sizeof v),
					  weft_select_recv(NULL, NULL, 0) };
		CHECK_EQ(weft_select(k, 2, weft_now() + 1000 * MS), 0);
		CHECK_EQ(v, i + 1);
	}
	weft_chan_close(to_threads);
	CHECK_EQ(pthread_join(th, NULL), 0);
	weft_chan_free(to_tasks);
	weft_chan_free(to_threads);
}

/* ---- cancellation mid-stress -------------------------------------------------------------- */

enum { CPRODS = 16, CCONS = 16, CPER = 10000 };
static weft_chan *cc;
static atomic_uchar cseen[CPRODS * CPER];
static int csent[CPRODS];
static atomic_long cgot;
static atomic_int cancelled_calls;

static void cancel_producer(void *arg)
{
	int id = (int)(uintptr_t)arg;
	long v;
	int seq;
	for (seq = 0; seq < CPER; seq++) {
		v = (long)id * CPER + seq;
		int r = weft_chan_put(cc, &v, sizeof v);
		if (r == -ECANCELED) {
			atomic_fetch_add(&cancelled_calls, 1);
			break;
		}
		CHECK_EQ(r, 0);
	}
	csent[id] = seq; /* read after join */
}

static void cancel_consumer(void *arg)
{
	(void)arg;
	long v, n = 0;
	int r;
	while ((r = weft_chan_take(cc, &v, sizeof v)) == sizeof v) {
		CHECK(v >= 0 && v < CPRODS * CPER);
		CHECK_EQ(atomic_exchange(&cseen[v], 1), 0);
		n++;
	}
	CHECK(r == -EPIPE || r == -ECANCELED);
	if (r == -ECANCELED)
		atomic_fetch_add(&cancelled_calls, 1);
	atomic_fetch_add(&cgot, n);
}

static size_t cancel_cap;

static int cancel_stress(void *arg)
{
	(void)arg;
	CHECK((cc = weft_chan_new(cancel_cap, sizeof(long))));
	weft_task *p[CPRODS], *c[CCONS];
	for (int i = 0; i < CPRODS; i++) {
		CHECK((p[i] = weft_spawn(cancel_producer, (void *)(uintptr_t)i)));
		CHECK((c[i] = weft_spawn(cancel_consumer, NULL)));
	}
	/* cancel half of each side while the traffic flows, at staggered moments */
	for (int i = 0; i < CPRODS / 2; i++) {
		nap(200000);
		CHECK_EQ(weft_cancel(p[2 * i]), 0);
		CHECK_EQ(weft_cancel(c[2 * i]), 0);
	}
	for (int i = 0; i < CPRODS; i++)
		CHECK_EQ(weft_join(p[i]), 0);
	weft_chan_close(cc);
	for (int i = 0; i < CCONS; i++)
		CHECK_EQ(weft_join(c[i]), 0);
	long sent = 0;
	for (int id = 0; id < CPRODS; id++) {
		sent += csent[id];
		for (int seq = 0; seq < CPER; seq++)
			CHECK_EQ(atomic_load(&cseen[id * CPER + seq]), seq < csent[id]);
	}
	CHECK_EQ(atomic_load(&cgot), sent);
	fprintf(stderr, "sent %ld of %d, %d calls cancelled\n", sent, CPRODS * CPER, atomic_load(&cancelled_calls));
	weft_chan_free(cc);
	return 0;
}

TEST(cancel_mid_stress_capacity_0_loses_nothing)
{
	cancel_cap = 0;
	RUN(cancel_stress);
}

TEST(cancel_mid_stress_capacity_1_loses_nothing)
{
	cancel_cap = 1;
	RUN(cancel_stress);
}

/* ---- offer and poll never move a task ----------------------------------------------------
 * A task moves to another worker only at calls that may block (weft.h), even while a channel is
 * hot and the tasks that wait on it gather on one worker (chan.c, lock_slow). Tasks on two
 * workers and plain threads hammer one channel, some with put and take (which may move), the
 * rest with offer and poll; each of the latter checks it is on the same worker after every
 * call as before it. */

enum { NB_PAIRS = 8, NB_THREADS = 2, NB_CALLS = SLOW ? 5000 : 50000 };
static weft_chan *nb;
static atomic_int nb_moved, nb_blocking_moved, nb_done;

static void nb_nonblocking(void *arg)
{
	bool sender = (uintptr_t)arg;
	long v = 0;
	for (int i = 0; i < NB_CALLS; i++) {
		int before = weft_worker_id(), r;
		if (sender)
			CHECK((r = weft_chan_offer(nb, &v, sizeof v)) == 0 || r == -EAGAIN);
		else
			CHECK((r = weft_chan_poll(nb, &v, sizeof v)) == sizeof v || r == -EAGAIN);
		if (weft_worker_id() != before)
			atomic_fetch_add(&nb_moved, 1);
		if (i % 256 == 0)
			weft_yield(); /* a chance for the other worker to take us: between calls */
	}
}

static void nb_blocking(void *arg)
{
	bool sender = (uintptr_t)arg;
	long v = 0;
	for (int i = 0; i < NB_CALLS / 4; i++) {
		int before = weft_worker_id();
		if (sender)
			CHECK_EQ(weft_chan_put(nb, &v, sizeof v), 0);
		else
			CHECK_EQ(weft_chan_take(nb, &v, sizeof v), (int)sizeof v);
		if (weft_worker_id() != before)
			atomic_fetch_add(&nb_blocking_moved, 1);
	}
}

/* Offers and polls until every task is done: whatever the tasks' offers and polls leave (a
 * full buffer for a blocking sender, an empty one for a receiver), a thread moves it on. */
static void *nb_thread(void *arg)
{
	(void)arg;
	long v = 0;
	while (!atomic_load(&nb_done)) {
		weft_chan_offer(nb, &v, sizeof v);
		weft_chan_poll(nb, &v, sizeof v);
	}
	return NULL;
}

static int nb_main(void *arg)
{
	(void)arg;
	CHECK((nb = weft_chan_new(16, sizeof(long))));
	pthread_t th[NB_THREADS];
	for (int i = 0; i < NB_THREADS; i++)
		CHECK_EQ(pthread_create(&th[i], NULL, nb_thread, NULL), 0);
	weft_task *t[4 * NB_PAIRS];
	for (int i = 0; i < 4 * NB_PAIRS; i++)
		CHECK((t[i] = weft_spawn(i % 4 < 2 ? nb_nonblocking : nb_blocking,
					 (void *)(uintptr_t)(i % 2))));
	for (int i = 0; i < 4 * NB_PAIRS; i++)
		CHECK_EQ(weft_join(t[i]), 0);
	atomic_store(&nb_done, 1);
	for (int i = 0; i < NB_THREADS; i++)
		pthread_join(th[i], NULL);
	fprintf(stderr, "blocking calls that moved: %d\n", atomic_load(&nb_blocking_moved));
	CHECK_EQ(atomic_load(&nb_moved), 0);
	weft_chan_free(nb);
	return 0;
}

TEST(offer_and_poll_never_move_the_task)
{
	setenv("WEFT_WORKERS", "2", 1);
	RUN(nb_main);
}

/* ---- a task whose calls never wait ---------------------------------------------------------
 * On one worker, a sender on an unbounded channel never waits, but its worker still switches
 * every SLICE_OPS sends, receives or selects that did not wait (sched.h): the task queued
 * behind it runs long before the sender is done. offer and poll never switch: behind a task
 * that only offers, the queued task waits until it is done. */

enum { HOG_SENDS = 4 * SLICE_OPS };
static atomic_int hog_other_ran;

static void hog_other(void *arg)
{
	(void)arg;
	atomic_store(&hog_other_ran, 1);
}

/* One send by `how`: "put", "select" (its one case, index 0) or "offer". */
static int hog_send(const char *how, weft_chan *c, long *v)
{
	weft_select_case k = weft_select_send(c, v, sizeof *v);
	if (strcmp(how, "select") == 0)
		return weft_select(&k, 1, WEFT_FOREVER);
	if (strcmp(how, "offer") == 0)
		return weft_chan_offer(c, v, sizeof *v);
	return weft_chan_put(c, v, sizeof *v);
}

static int hog_main(void *arg)
{
	const char *how = arg;
	bool offer = strcmp(how, "offer") == 0;
	weft_chan *c = weft_chan_new(WEFT_UNBOUNDED, sizeof(long));
	CHECK(c);
	atomic_store(&hog_other_ran, 0);
	weft_task *t = weft_spawn(hog_other, NULL);
	CHECK(t);
	long first_seen = -1;
	for (long i = 0; i < HOG_SENDS; i++) {
		CHECK_EQ(hog_send(how, c, &i), 0);
		if (first_seen < 0 && atomic_load(&hog_other_ran))
			first_seen = i;
	}
	if (offer)
		CHECK_EQ(first_seen, -1);
	else
		CHECK(first_seen >= 0 && first_seen < SLICE_OPS);
	CHECK_EQ(weft_join(t), 0);
	CHECK_EQ(weft_chan_len(c), HOG_SENDS);
	weft_chan_free(c);
	return 0;
}

TEST(a_sender_that_never_waits_still_lets_queued_tasks_run)
{
	setenv("WEFT_WORKERS", "1", 1);
	CHECK_EQ(weft_run(hog_main, "put"), 0);
	CHECK_EQ(weft_run(hog_main, "select"), 0);
	CHECK_EQ(weft_run(hog_main, "offer"), 0);
}

/* ---- bad input -------------------------------------------------------------------------- */

static int bad_input(void *arg)
{
	(void)arg;
	errno = 0;
	CHECK(weft_chan_new(1, 0) == NULL && errno == EINVAL);
	errno = 0;
	CHECK(weft_chan_new(1, (size_t)INT_MAX + 1) == NULL && errno == EINVAL);
	errno = 0;
	CHECK(weft_chan_new(SIZE_MAX / 2, 64) == NULL && errno == EINVAL); /* size overflows */
	weft_chan *c = weft_chan_new(1, 4);
	CHECK(c);
	char buf[8] = "1234567";
	CHECK_EQ(weft_chan_send(NULL, buf, 4, WEFT_FOREVER), -EINVAL);
	CHECK_EQ(weft_chan_put(NULL, buf, 4), -EINVAL);
	CHECK_EQ(weft_chan_offer(NULL, buf, 4), -EINVAL);
	CHECK_EQ(weft_chan_recv(NULL, buf, 4, WEFT_FOREVER), -EINVAL);
	CHECK_EQ(weft_chan_take(NULL, buf, 4), -EINVAL);
	CHECK_EQ(weft_chan_poll(NULL, buf, 4), -EINVAL);
	CHECK_EQ(weft_chan_put(c, NULL, 4), -EINVAL);
	CHECK_EQ(weft_chan_put(c, buf, 5), -EMSGSIZE);
	CHECK_EQ(weft_chan_offer(c, buf, 8), -EMSGSIZE);
	CHECK_EQ(weft_chan_send(c, buf, 5, 0), -EMSGSIZE);
	CHECK_EQ(weft_chan_len(c), 0);
	CHECK_EQ(weft_chan_put(c, buf, 4), 0);
	CHECK_EQ(weft_chan_take(c, NULL, 4), -EINVAL);
	CHECK_EQ(weft_chan_take(c, NULL, 0), 4); /* nothing wanted: the packet is dropped */
	weft_select_case k[2] = { weft_select_send(c, buf, 4), weft_select_recv(c, buf, 4) };
	CHECK_EQ(weft_select(NULL, 1, 0), -EINVAL);
	CHECK_EQ(weft_select(k, -1, 0), -EINVAL);
	CHECK_EQ(weft_select(k, WEFT_SELECT_MAX + 1, 0), -EINVAL);
	k[1].op = 7;
	CHECK_EQ(weft_select(k, 2, 0), -EINVAL);
	k[1] = weft_select_recv(c, NULL, 4);
	CHECK_EQ(weft_select(k, 2, 0), -EINVAL);
	k[1] = weft_select_send(c, buf, 5);
	CHECK_EQ(weft_select(k, 2, 0), -EMSGSIZE);
	CHECK_EQ(weft_chan_len(c), 0); /* nothing was done */
	CHECK_EQ(weft_chan_len(NULL), 0);
	weft_chan_free(c);
	return 0;
}

TEST(bad_input_gets_errno)
{
	RUN(bad_input);
}

/* ---- the bias ----------------------------------------------------------------------------
 * A channel locked over and over from one worker is biased to it (chan.c): that worker's tasks
 * take its lock with plain stores, and a locker from elsewhere revokes the bias with a fence.
 * The stress suites above run with the default bias, which revokes seldom (a backoff of a
 * millisecond and more); here they run again in a child with WEFT_CHAN_BIAS=eager, where the
 * bias is granted after two lockings and revocations race with owners all the time, and once
 * with the bias off (the path where membarrier is missing). */

static const struct {
	const char *name;
	void (*fn)(void);
	bool revokes; /* lockers on several workers or threads: revocations must happen */
} bias_cases[] = {
	{ "mpmc_stress_capacity_0", mpmc_stress_capacity_0, true },
	{ "mpmc_stress_capacity_1", mpmc_stress_capacity_1, true },
	{ "mpmc_stress_capacity_7", mpmc_stress_capacity_7, true },
	{ "mpmc_stress_unbounded", mpmc_stress_unbounded, true },
	{ "select_stress_exactly_once", select_stress_exactly_once, false }, /* may gather */
	{ "plain_threads_and_tasks_both_ways_capacity_0",
	  plain_threads_and_tasks_both_ways_capacity_0, true },
	{ "plain_threads_and_tasks_both_ways_capacity_1",
	  plain_threads_and_tasks_both_ways_capacity_1, true },
	/* its tasks gather on one worker: the bias with cancellation and leave() */
	{ "cancel_mid_stress_capacity_1_loses_nothing",
	  cancel_mid_stress_capacity_1_loses_nothing, false },
};

/* Runs the case $CHAN_BIAS_CASE names, with the bias $WEFT_CHAN_BIAS asks for. */
TEST(child_bias_case)
{
	const char *name = getenv("CHAN_BIAS_CASE"), *mode = getenv("WEFT_CHAN_BIAS");
	bool eager = strcmp(mode, "eager") == 0 && test_have_membarrier();
	fprintf(stderr, "%s, bias %s\n", name, mode); /* says which, should it fail */
	CHECK_EQ(chan_bias_mode(), eager ? CHAN_BIAS_EAGER : CHAN_BIAS_OFF);
	size_t i = 0;
	while (i < sizeof bias_cases / sizeof *bias_cases && strcmp(bias_cases[i].name, name))
		i++;
	CHECK(i < sizeof bias_cases / sizeof *bias_cases);
	bias_cases[i].fn();
	fprintf(stderr, "%s: %ld revocations\n", name, chan_bias_revocations());
	if (!eager)
		CHECK_EQ(chan_bias_revocations(), 0);
	else if (bias_cases[i].revokes) /* the suite did race owners against revokers */
		CHECK(chan_bias_revocations() > 0);
}

static void bias_case(const char *mode, const char *name)
{
	setenv("WEFT_CHAN_BIAS", mode, 1);
	setenv("CHAN_BIAS_CASE", name, 1);
	test_run_child("child_bias_case");
}

TEST(stress_suites_with_an_eager_bias)
{
	for (size_t i = 0; i < sizeof bias_cases / sizeof *bias_cases; i++)
		bias_case("eager", bias_cases[i].name);
}

TEST(stress_suites_with_the_bias_off)
{
	bias_case("0", "mpmc_stress_capacity_1");
	bias_case("0", "plain_threads_and_tasks_both_ways_capacity_1");
}

/* A channel outlives weft_run, biased to a worker that is then gone: a plain thread takes the
 * bias away (looking at that worker's slot), and a later weft_run with fewer workers uses the
 * channel again. */
static weft_chan *outlived;

static void outlive_consumer(void *arg)
{
	(void)arg;
	for (long i = 0, v; i < 10000; i++) {
		CHECK_EQ(weft_chan_take(outlived, &v, sizeof v), sizeof v);
		CHECK_EQ(v, i);
	}
}

static int outlive_traffic(void *arg)
{
	(void)arg;
	weft_task *t = weft_spawn(outlive_consumer, NULL);
	CHECK(t);
	for (long i = 0; i < 10000; i++)
		CHECK_EQ(weft_chan_put(outlived, &i, sizeof i), 0);
	CHECK_EQ(weft_join(t), 0);
	/* End with the channel biased to this worker: the two tasks may have ended on two workers,
	 * and a revocation late in the run leaves it unbiased until a backoff has passed (up to
	 * a second). Alone, this task's lockings win it back. */
	int64_t until = weft_now() + 3000000000;
	while (chan_bias_mode() == CHAN_BIAS_ON && !chan_bias_owner(outlived) && weft_now() < until) {
		long v = 0;
		CHECK_EQ(weft_chan_put(outlived, &v, sizeof v), 0);
		CHECK_EQ(weft_chan_take(outlived, &v, sizeof v), sizeof v);
	}
	return 0;
}

TEST(a_bias_outlives_its_weft_run)
{
	CHECK((outlived = weft_chan_new(1, sizeof(long))));
	setenv("WEFT_WORKERS", "2", 1);
	RUN(outlive_traffic);
	CHECK(chan_bias_mode() != CHAN_BIAS_ON || chan_bias_owner(outlived));
	long before = chan_bias_revocations(), v = 42;
	CHECK_EQ(weft_chan_put(outlived, &v, sizeof v), 0);
	CHECK_EQ(weft_chan_take(outlived, &v, sizeof v), sizeof v);
	CHECK_EQ(v, 42);
	if (chan_bias_mode() == CHAN_BIAS_ON) /* the put above took the bias away */
		CHECK_EQ(chan_bias_revocations(), before + 1);
	setenv("WEFT_WORKERS", "1", 1);
	RUN(outlive_traffic);
	weft_chan_free(outlived);
}
