/*
 * store_fail_test.c - a store that cannot write (part of mqtt_store, with store_test.c):
 *
 * - full_disk_fails_loudly: a write past the file's cap fails the store; nothing after it is
 *   reported durable, and reopened without the cap it holds every write that was.
 * - overflow_refused_at_once: a store that cannot write for long takes writes until 64 Ki
 *   wait, then refuses the next at once (-EIO), never making its caller wait for room - the
 *   broker writes under its sessions' locks - and closes at once.
 * - overflow_cuts_the_open_group: the writes of a group that an overflow cut short are never
 *   committed, nor anything after the refused write, even once the disk has room again: the
 *   store stays failed until it is reopened.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "store_test.h"

/* A call that waits for room in the queue never returns: end the test saying so. */
static void stuck(int sig)
{
	(void)sig;
	static const char m[] = "the test did not finish in 60 s: a write waits for room\n";
	(void)!write(2, m, sizeof m - 1);
	_exit(1);
}

static void watchdog(void)
{
	signal(SIGALRM, stuck);
	alarm(60);
}

/* ---- a write that cannot be made durable --------------------------------------------------- */

static int t_full(void *arg)
{
	(void)arg;
	store *st = open_ok(path, NULL);
	store_msg m = msg("kept", "before the limit", 1);
	store_dlv d = dl(1, 0, 0, 0);
	uint64_t row;
	CHECK_EQ(store_wait(st, store_enqueue(st, S("alice"), &m, &d, &row, NULL),
			    weft_now() + 5000 * MS), 0);
	CHECK_EQ(store_close(st), 0);
	/* the same database capped at 256 KiB: as a full disk, a commit fails */
	store_opts o = { .max_bytes = 256 * 1024 };
	st = open_ok(path, &o);
	char payload[4000];
	memset(payload, 'f', sizeof payload - 1);
	payload[sizeof payload - 1] = 0;
	int64_t t = 0;
	int r = 0, n = 0;
	for (; n < 1000 && r == 0; n++) {
		m = msg("full", payload, 1);
		t = store_enqueue(st, S("bob"), &m, &d, &row, NULL);
		CHECK(t > 0); /* taken even once failed: the writer tries them again */
		r = store_wait(st, t, weft_now() + 5000 * MS);
	}
	fprintf(stderr, "after %d messages: %d, %s\n", n, r, store_error(st));
	CHECK_EQ(r, -EIO); /* never reported durable */
	CHECK(strstr(store_error(st), "database or disk is full"));
	CHECK(store_failed(st)); /* and a later write is not reported durable either */
	CHECK_EQ(store_wait(st, store_enqueue(st, S("bob"), &m, &d, &row, NULL),
			    weft_now() + 5000 * MS), -EIO);
	CHECK_EQ(store_close(st), -EIO);
	/* without the cap it opens, with everything that was reported durable */
	st = open_ok(path, NULL);
	char *txt = load_text(st);
	CHECK(strstr(txt, "Q alice kept q1 p0 s0 r0 mr0 x0 props0 before the limit\n"));
	int q = 0;
	for (char *p = txt; (p = strstr(p, "Q bob full")); p++)
		q++;
	CHECK(q < n); /* the failed transaction's messages are not there */
	free(txt);
	CHECK_EQ(store_close(st), 0);
	return 0;
}

TEST(full_disk_fails_loudly)
{
	path = fresh();
	RUN(t_full);
}

/* ---- a store that cannot write for long ---------------------------------------------------- */

/* Tiny writes until one is refused (or `most` were taken): how many were, the last ticket in
 * *last, the slowest call in *worst (ns). */
static int fill_until_refused(store *st, const char *id, int most, int64_t *last, int64_t *worst)
{
	int n = 0;
	*worst = 0;
	for (; n < most; n++) {
		int64_t t0 = weft_now();
		int64_t t = store_rel_add(st, id, (uint16_t)strlen(id), (uint16_t)(n % 65535 + 1));
		int64_t took = weft_now() - t0;
		*worst = took > *worst ? took : *worst;
		if (t < 0) {
			CHECK_EQ(t, -EIO);
			break;
		}
		*last = t;
	}
	return n;
}

static int t_overflow(void *arg)
{
	(void)arg;
	store *st = open_ok(path, NULL);
	CHECK_EQ(store_wait(st, store_rel_add(st, S("before"), 1), weft_now() + 5000 * MS), 0);
	CHECK_EQ(store_close(st), 0);
	char f[256];
	struct stat sb;
	snprintf(f, sizeof f, "%s/weft-mqtt.db", path);
	CHECK_EQ(stat(f, &sb), 0);
	store_opts o = { .max_bytes = sb.st_size }; /* not a page more than it has */
	st = open_ok(path, &o);
	int64_t last = 0, worst;
	int n = fill_until_refused(st, "flood", 400000, &last, &worst);
	fprintf(stderr, "%d writes taken, then refused; the slowest call took %lld us\n", n,
		(long long)(worst / 1000));
	CHECK(n < 400000);
	CHECK(n >= 65536);        /* a queue's worth first */
	CHECK(worst < 1000 * MS); /* none waited */
	CHECK(store_failed(st));
	CHECK_EQ(store_wait(st, last, weft_now() + 5000 * MS), -EIO);
	CHECK_EQ(store_rel_add(st, S("after"), 1), -EIO); /* refused from now on */
	int64_t t0 = weft_now();
	CHECK_EQ(store_close(st), -EIO);
	CHECK(weft_now() - t0 < 5000 * MS);
	st = open_ok(path, NULL);
	char *txt = load_text(st);
	CHECK(strstr(txt, "R before 1\n"));
	CHECK(!strstr(txt, "R after"));
	free(txt);
	CHECK_EQ(store_close(st), 0);
	return 0;
}

TEST(overflow_refused_at_once)
{
	path = fresh();
	watchdog();
	RUN(t_overflow);
}

/* The size of the store's write-ahead log now. */
static off_t wal_size(void)
{
	char f[256];
	struct stat sb;
	snprintf(f, sizeof f, "%s/weft-mqtt.db-wal", path);
	CHECK_EQ(stat(f, &sb), 0);
	return sb.st_size;
}

static int t_group_cut(void *arg)
{
	(void)arg;
	store *st = open_ok(path, NULL);
	CHECK_EQ(store_wait(st, store_rel_add(st, S("before"), 1), weft_now() + 5000 * MS), 0);
	/* a disk with 8 KiB of room: the log cannot grow past it (as the broker's test does it,
	 * with the process's file size limit, which this test lifts later) */
	signal(SIGXFSZ, SIG_IGN);
	struct rlimit rl = { (rlim_t)wal_size() + 8192, RLIM_INFINITY };
	CHECK_EQ(setrlimit(RLIMIT_FSIZE, &rl), 0);
	int r = 0;
	for (int i = 0; i < 100 && r == 0; i++) {
		int64_t t = 0;
		for (int j = 0; j < 200; j++)
			t = store_rel_add(st, S("fill"), (uint16_t)(200 * i + j + 1));
		CHECK(t > 0);
		r = store_wait(st, t, weft_now() + 5000 * MS);
	}
	CHECK_EQ(r, -EIO);
	CHECK(store_failed(st));
	/* a group open when the queue overflows: its id is taken, what comes after is refused */
	CHECK(store_group_begin(st) > 0);
	CHECK(store_rel_add(st, S("pub"), 7) > 0);
	int64_t last = 0, worst;
	int n = fill_until_refused(st, "grouped", 400000, &last, &worst);
	fprintf(stderr, "%d writes taken in the group, then refused\n", n);
	CHECK(n < 400000);
	CHECK(store_group_end(st) > 0); /* the end is taken: the writer waits for it */
	/* room again, longer than the writer waits between tries: the store stays failed, since
	 * a write was refused and what came after it cannot be made durable */
	rl.rlim_cur = RLIM_INFINITY;
	CHECK_EQ(setrlimit(RLIMIT_FSIZE, &rl), 0);
	weft_sleep_until(weft_now() + 1500 * MS);
	CHECK(store_failed(st));
	CHECK_EQ(store_wait(st, last, weft_now() + 5000 * MS), -EIO);
	CHECK_EQ(store_rel_add(st, S("after"), 1), -EIO);
	CHECK_EQ(store_close(st), -EIO);
	st = open_ok(path, NULL);
	char *txt = load_text(st);
	CHECK(strstr(txt, "R before 1\n"));
	CHECK(!strstr(txt, "R pub 7\n")); /* the group is all there or not at all */
	CHECK(!strstr(txt, "R grouped"));
	CHECK(!strstr(txt, "R after"));
	free(txt);
	CHECK_EQ(store_close(st), 0);
	return 0;
}

TEST(overflow_cuts_the_open_group)
{
	path = fresh();
	watchdog();
	RUN(t_group_cut);
}
