/*
 * store_test.c - weft-mqtt's durable store (apps/mqtt/store.c) on SQLite: round trips through
 * a restart, deletion, group commit under many tasks, a crash test (a child writes under load
 * and is killed with SIGKILL at a random moment; everything it was told is durable must be
 * there after reopening, and every acknowledged delivery gone), damaged files, and a group
 * of writes as one transaction. A store that cannot write is store_fail_test.c's (the same
 * binary).
 *
 * Each test works in a fresh directory under /tmp (on disk here, so fsync is real).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sqlite3.h>

#include "store_test.h"

/* A fresh store directory in the test's scratch directory (store_open creates it). */
const char *fresh(void)
{
	static char db[160];
	static int n;
	snprintf(db, sizeof db, "%s/db%d", test_tmpdir(), ++n);
	return db;
}

store *open_ok(const char *path, const store_opts *o)
{
	char err[512];
	store *st = store_open(path, o, err, sizeof err);
	if (!st)
		fprintf(stderr, "store_open: %s\n", err);
	CHECK(st);
	return st;
}

store_msg msg(const char *topic, const char *payload, int qos)
{
	store_msg m = { .topic = topic, .topic_len = (uint16_t)strlen(topic), .qos = (uint8_t)qos,
			.payload = payload, .payload_len = (uint32_t)strlen(payload) };
	return m;
}

/* ---- what store_load gives back, as lines of text ---------------------------------------- */

typedef struct dump {
	char *buf;
	size_t len, cap;
} dump;

static void add(dump *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(dump *d, const char *fmt, ...)
{
	char *line;
	va_list ap;
	va_start(ap, fmt);
	int n = vasprintf(&line, fmt, ap);
	va_end(ap);
	CHECK(n >= 0);
	if (d->len + (size_t)n + 1 > d->cap) {
		d->cap = (d->len + (size_t)n + 1) * 2;
		d->buf = realloc(d->buf, d->cap);
		CHECK(d->buf);
	}
	memcpy(d->buf + d->len, line, (size_t)n + 1);
	d->len += (size_t)n;
	free(line);
}

static void cb_session(void *arg, const store_session *s)
{
	/* the owner: "by NAME", "by anonymous", or nothing when the row does not say */
	add(arg, "S %.*s v%d e%u d%lld%s%.*s\n", s->id_len, s->id, s->version, s->expiry_interval,
	    (long long)s->disconnected_at,
	    !s->owner_known ? "" : s->owner ? " by " : " by anonymous",
	    s->owner_known && s->owner ? s->owner_len : 0, s->owner ? s->owner : "");
}

static void cb_sub(void *arg, const char *id, uint16_t id_len, const char *f, uint16_t f_len,
		   uint8_t opts, uint32_t subid)
{
	add(arg, "U %.*s %.*s o%d i%u\n", id_len, id, f_len, f, opts, subid);
}

static void cb_queued(void *arg, const char *id, uint16_t id_len, const store_msg *m,
		      const store_dlv *d)
{
	char ids[64] = "";
	for (int i = 0, n = 0; i < d->nsubid; i++)
		n += snprintf(ids + n, sizeof ids - (size_t)n, " i%u", d->subid[i]);
	add(arg, "Q %.*s %.*s q%d p%d s%d r%d mr%d x%lld props%u%s %.*s\n", id_len, id,
	    m->topic_len, m->topic, d->qos, d->pid, d->state, d->retain, m->retain,
	    (long long)m->expiry, m->props_len, ids, (int)m->payload_len, (const char *)m->payload);
}

static void cb_will(void *arg, const char *id, uint16_t id_len, const store_msg *m,
		    uint32_t delay, int64_t at)
{
	add(arg, "W %.*s %.*s q%d r%d x%lld d%u at%lld %.*s\n", id_len, id, m->topic_len, m->topic,
	    m->qos, m->retain, (long long)m->expiry, delay, (long long)at, (int)m->payload_len,
	    (const char *)m->payload);
}

static void cb_rel(void *arg, const char *id, uint16_t id_len, uint16_t pid)
{
	add(arg, "R %.*s %d\n", id_len, id, pid);
}

static void cb_retained(void *arg, const store_msg *m)
{
	add(arg, "T %.*s q%d x%lld %.*s\n", m->topic_len, m->topic, m->qos, (long long)m->expiry,
	    (int)m->payload_len, (const char *)m->payload);
}

static const store_callbacks cbs = { cb_session, cb_sub, cb_queued, cb_rel, cb_will,
				     cb_retained };

/* A delivery at qos, with the RETAIN flag and subscription ids given (up to 4, 0 ends). */
store_dlv dl(int qos, int retain, uint32_t id1, uint32_t id2)
{
	store_dlv d = { .qos = (uint8_t)qos, .retain = (uint8_t)retain };
	if (id1)
		d.subid[d.nsubid++] = id1;
	if (id2)
		d.subid[d.nsubid++] = id2;
	return d;
}

char *load_text(store *st)
{
	dump d = { NULL, 0, 0 };
	add(&d, "%s", "");
	int r = store_load(st, &cbs, &d);
	if (r)
		fprintf(stderr, "store_load: %s\n", store_error(st));
	CHECK_EQ(r, 0);
	return d.buf;
}

void expect(const char *text, const char *want)
{
	if (strcmp(text, want) != 0) {
		fprintf(stderr, "loaded:\n%s\nwanted:\n%s\n", text, want);
		CHECK(!"the store gave back something else");
	}
}

/* ---- round trips ------------------------------------------------------------------------- */

const char *path;

/* Writes of every kind; returns the last ticket. */
static int64_t write_everything(store *st)
{
	store_msg m;
	m = msg("a/b", "retained-1", 1);
	m.expiry = 1900000000;
	CHECK(store_put_retained(st, &m) > 0);
	m = msg("a/c", "retained-2", 0);
	CHECK(store_put_retained(st, &m) > 0);
	m = msg("a/d", "gone", 0);
	CHECK(store_put_retained(st, &m) > 0);
	CHECK(store_del_retained(st, S("a/d")) > 0);
	m = msg("a/c", "", 0); /* an empty payload clears */
	CHECK(store_put_retained(st, &m) > 0);

	store_session s1 = { S("alice"), 5, 3600, 0, S("alice-user"), true };
	store_session s2 = { S("bob"), 4, UINT32_MAX, 1800000000, NULL, 0, true };
	CHECK(store_put_session(st, &s1) > 0);
	CHECK(store_put_session(st, &s2) > 0);
	s1.disconnected_at = 1800000001; /* update */
	CHECK(store_put_session(st, &s1) > 0);
	CHECK(store_put_sub(st, S("alice"), S("x/#"), 1, 7) > 0);
	CHECK(store_put_sub(st, S("alice"), S("$share/g/y/+"), 2, 0) > 0);
	CHECK(store_put_sub(st, S("alice"), S("x/#"), 2, 8) > 0); /* replaces */
	CHECK(store_put_sub(st, S("bob"), S("z"), 0, 0) > 0);
	CHECK(store_put_sub(st, S("bob"), S("gone"), 0, 0) > 0);
	CHECK(store_del_sub(st, S("bob"), S("gone")) > 0);

	uint64_t r1, r1b, r2, r3;
	_Atomic uint64_t shared = 0;
	m = msg("x/1", "one", 1);
	uint8_t props[3] = { 0x23, 0, 5 };
	m.props = props, m.props_len = 3;
	m.retain = 1;
	store_dlv d = dl(1, 1, 7, 8);
	CHECK(store_enqueue(st, S("alice"), &m, &d, &r1, &shared) > 0);
	CHECK(shared > 0);
	d = dl(1, 0, 0, 0);
	d.pid = 3; /* sent at once */
	CHECK(store_enqueue(st, S("bob"), &m, &d, &r1b, &shared) > 0); /* the same message */
	CHECK(store_release(st, shared) > 0);
	m = msg("x/2", "two", 2);
	d = dl(2, 0, 268435455, 0);
	CHECK(store_enqueue(st, S("alice"), &m, &d, &r2, NULL) > 0);
	m = msg("x/3", "three", 1);
	d = dl(1, 0, 0, 0);
	CHECK(store_enqueue(st, S("alice"), &m, &d, &r3, NULL) > 0);
	CHECK(r1 < r1b && r1b < r2 && r2 < r3);
	CHECK(store_inflight(st, S("alice"), r1, 10, 0) > 0);
	CHECK(store_inflight(st, S("alice"), r2, 11, 0) > 0);
	CHECK(store_inflight(st, S("alice"), r2, 11, 1) > 0); /* PUBREC came */
	CHECK(store_inflight(st, S("alice"), r3, 12, 0) > 0);
	CHECK(store_ack(st, S("alice"), 12) > 0);
	CHECK(store_rel_add(st, S("alice"), 300) > 0);
	CHECK(store_rel_add(st, S("alice"), 301) > 0);
	CHECK(store_rel_del(st, S("alice"), 300) > 0);
	m = msg("will/alice", "alice is gone", 1);
	m.retain = 1, m.expiry = 60;
	CHECK(store_put_will(st, S("alice"), &m, 30, 0) > 0);
	m = msg("will/bob", "bob", 0);
	CHECK(store_put_will(st, S("bob"), &m, 0, 0) > 0);
	m = msg("will/bob", "bob is gone", 2);
	CHECK(store_put_will(st, S("bob"), &m, 5, 1800000005) > 0); /* replaces */
	return store_rel_add(st, S("bob"), 1);
}

static const char *everything =
	"S alice v5 e3600 d1800000001 by alice-user\n"
	"S bob v4 e4294967295 d1800000000 by anonymous\n"
	"U alice $share/g/y/+ o2 i0\n"
	"U alice x/# o2 i8\n"
	"U bob z o0 i0\n"
	"Q alice x/1 q1 p10 s0 r1 mr1 x0 props3 i7 i8 one\n"
	"Q alice x/2 q2 p11 s1 r0 mr0 x0 props0 i268435455 two\n"
	"Q bob x/1 q1 p3 s0 r0 mr1 x0 props3 one\n"
	"R alice 301\n"
	"R bob 1\n"
	"W alice will/alice q1 r1 x60 d30 at0 alice is gone\n"
	"W bob will/bob q2 r0 x0 d5 at1800000005 bob is gone\n"
	"T a/b q1 x1900000000 retained-1\n";

static int t_roundtrip(void *arg)
{
	(void)arg;
	store *st = open_ok(path, NULL);
	int64_t last = write_everything(st);
	CHECK(last > 0);
	CHECK_EQ(store_wait(st, last, weft_now() + 5000 * MS), 0);
	CHECK(store_durable(st) >= last);
	CHECK_EQ(store_wait(st, last + 1, weft_now()), -EINVAL); /* not handed out */
	char *t = load_text(st);
	expect(t, everything);
	free(t);
	CHECK_EQ(store_close(st), 0);
	/* restart: everything is back */
	st = open_ok(path, NULL);
	t = load_text(st);
	expect(t, everything);
	free(t);
	/* acknowledging bob's copy removes his queue row; alice still holds the message */
	CHECK(store_inflight(st, S("bob"), 2, 5, 0) > 0);
	CHECK(store_ack(st, S("bob"), 5) > 0);
	/* new deliveries after a restart get new ids, after the old ones in queue order */
	uint64_t r4;
	store_msg m = msg("x/4", "four", 1);
	store_dlv d = dl(1, 0, 0, 0);
	CHECK(store_enqueue(st, S("alice"), &m, &d, &r4, NULL) > 0);
	CHECK(r4 > 3); /* above the rows still held */
	CHECK(store_del_will(st, S("alice")) > 0);
	CHECK_EQ(store_close(st), 0);
	st = open_ok(path, NULL);
	t = load_text(st);
	CHECK(strstr(t, "Q alice x/4 q1 p0 s0 r0 mr0 x0 props0 four\n"));
	CHECK(strstr(t, "Q alice x/1"));
	CHECK(!strstr(t, "Q bob"));
	CHECK(!strstr(t, "W alice"));
	CHECK(strstr(t, "Q alice x/2 q2 p11 s1 r0 mr0 x0 props0 i268435455 two\nQ alice x/4"));
	free(t);
	/* deleting a session takes everything it holds, and the messages only it held */
	CHECK_EQ(store_wait(st, store_del_session(st, S("alice")), weft_now() + 5000 * MS), 0);
	t = load_text(st);
	expect(t, "S bob v4 e4294967295 d1800000000 by anonymous\n"
		  "U bob z o0 i0\n"
		  "R bob 1\n"
		  "W bob will/bob q2 r0 x0 d5 at1800000005 bob is gone\n"
		  "T a/b q1 x1900000000 retained-1\n");
	free(t);
	CHECK_EQ(store_close(st), 0);
	return 0;
}

TEST(roundtrip_restart_delete)
{
	path = fresh();
	RUN(t_roundtrip);
}

/* Without weft running: the calls work from plain threads too. */
TEST(plain_thread)
{
	path = fresh();
	store *st = open_ok(path, NULL);
	int64_t last = write_everything(st);
	CHECK_EQ(store_wait(st, last, weft_now() + 5000 * MS), 0);
	CHECK_EQ(store_close(st), 0);
	st = open_ok(path, NULL);
	char *t = load_text(st);
	expect(t, everything);
	free(t);
	CHECK_EQ(store_close(st), 0);
}

/* ---- group commit ------------------------------------------------------------------------ */

static store *gst;
#define WRITERS 64
#define PER_WRITER 40

static void publisher(void *arg)
{
	int id = (int)(intptr_t)arg;
	char client[16], payload[32];
	snprintf(client, sizeof client, "c%d", id);
	for (int i = 0; i < PER_WRITER; i++) {
		snprintf(payload, sizeof payload, "%d-%d", id, i);
		store_msg m = msg("load", payload, 1);
		store_dlv d = dl(1, 0, 0, 0);
		uint64_t row;
		int64_t t = store_enqueue(gst, S(client), &m, &d, &row, NULL);
		CHECK(t > 0);
		/* as a broker before its PUBACK */
		CHECK_EQ(store_wait(gst, t, weft_now() + 10000 * MS), 0);
	}
}

static int t_group(void *arg)
{
	(void)arg;
	gst = open_ok(path, NULL);
	weft_task *t[WRITERS];
	for (int i = 0; i < WRITERS; i++)
		CHECK(t[i] = weft_spawn(publisher, (void *)(intptr_t)i));
	for (int i = 0; i < WRITERS; i++)
		weft_join(t[i]);
	store_stats s;
	store_stats_get(gst, &s);
	fprintf(stderr, "%llu writes in %llu commits (%.1f per fsync), %.2f ms per commit\n",
		(unsigned long long)s.writes, (unsigned long long)s.commits,
		(double)s.writes / (double)s.commits, (double)s.commit_ns / 1e6 / (double)s.commits);
	CHECK_EQ(s.writes, WRITERS * PER_WRITER);
	/* 64 tasks each waiting for its write: commits carry many writes each (one each without
	 * group commit). Under TSan a writer's own work takes about as long as a commit (2.9
	 * writes per commit on a VM where a page fault costs 10 us). */
	CHECK(s.commits * (SLOW ? 2 : 4) <= s.writes);
	char *txt = load_text(gst);
	int n = 0;
	for (char *p = txt; (p = strstr(p, "\nQ ")); p++)
		n++;
	CHECK_EQ(n + (strncmp(txt, "Q ", 2) == 0), WRITERS * PER_WRITER);
	free(txt);
	CHECK_EQ(store_close(gst), 0);
	return 0;
}

TEST(group_commit_many_tasks)
{
	path = fresh();
	RUN(t_group);
}

/* ---- crash test -------------------------------------------------------------------------- */

#define ROUNDS 5
#define CRASH_TASKS 16
#define MAXI 8192

/* What the child reports once store_wait said durable. */
typedef struct report {
	char kind;         /* 'E' enqueued, 'S' ack sent to the store, 'A' ack durable,
			    * 'T' retained set */
	uint8_t task;
	uint16_t round;
	uint32_t i;
} report;

static int pipe_w, crash_round;
static store *cst;

static void tell(char kind, int task, int i)
{
	report r = { kind, (uint8_t)task, (uint16_t)crash_round, (uint32_t)i };
	if (write(pipe_w, &r, sizeof r) != (ssize_t)sizeof r) /* atomic: < PIPE_BUF */
		_exit(3);
}

static void crash_writer(void *arg)
{
	int task = (int)(intptr_t)arg;
	char client[16], payload[48], topic[16], val[16];
	snprintf(client, sizeof client, "c%d", task);
	snprintf(topic, sizeof topic, "ret/%d", task);
	for (int i = 0; i < MAXI; i++) {
		snprintf(payload, sizeof payload, "r%d-t%d-%d", crash_round, task, i);
		store_msg m = msg("crash", payload, 1);
		store_dlv d = dl(1, 0, 0, 0);
		uint64_t row;
		int64_t t = store_enqueue(cst, S(client), &m, &d, &row, NULL);
		if (t < 0 || store_wait(cst, t, WEFT_FOREVER))
			_exit(4);
		tell('E', task, i);
		if (i % 4 == 0) { /* delivered and acknowledged by the client */
			/* unique within the session across rounds, as a broker keeps an
			 * inflight pid (reloaded after a restart) until it is acknowledged */
			uint16_t pid = (uint16_t)(crash_round * MAXI + i + 1);
			tell('S', task, i); /* from here the message may be gone */
			if (store_inflight(cst, S(client), row, pid, 0) < 0 ||
			    (t = store_ack(cst, S(client), pid)) < 0 || store_wait(cst, t, WEFT_FOREVER))
				_exit(5);
			tell('A', task, i);
		}
		if (i % 3 == 0) {
			snprintf(val, sizeof val, "%d-%d", crash_round, i);
			m = msg(topic, val, 0);
			if ((t = store_put_retained(cst, &m)) < 0 || store_wait(cst, t, WEFT_FOREVER))
				_exit(6);
			tell('T', task, i);
		}
	}
}

static int crash_child(void *arg)
{
	(void)arg;
	weft_task *t[CRASH_TASKS];
	for (int i = 0; i < CRASH_TASKS; i++)
		t[i] = weft_spawn(crash_writer, (void *)(intptr_t)i);
	for (int i = 0; i < CRASH_TASKS; i++)
		weft_join(t[i]);
	return 0;
}

static uint8_t told[ROUNDS][CRASH_TASKS][MAXI];  /* bit 1: E, 2: A, 4: S */
static uint8_t found[ROUNDS][CRASH_TASKS][MAXI];
static int ret_told[ROUNDS][CRASH_TASKS];        /* last retained value told, -1 none */
static char ret_found[CRASH_TASKS][32];

static void crash_queued(void *arg, const char *id, uint16_t id_len, const store_msg *m,
			 const store_dlv *d)
{
	(void)arg, (void)id, (void)id_len, (void)d;
	int r, t, i;
	char p[64];
	snprintf(p, sizeof p, "%.*s", (int)m->payload_len, (const char *)m->payload);
	CHECK(sscanf(p, "r%d-t%d-%d", &r, &t, &i) == 3);
	CHECK(r >= 0 && r < ROUNDS && t >= 0 && t < CRASH_TASKS && i >= 0 && i < MAXI);
	found[r][t][i]++;
}

static void crash_retained(void *arg, const store_msg *m)
{
	(void)arg;
	int t;
	char topic[32];
	snprintf(topic, sizeof topic, "%.*s", m->topic_len, m->topic);
	CHECK(sscanf(topic, "ret/%d", &t) == 1 && t >= 0 && t < CRASH_TASKS);
	snprintf(ret_found[t], sizeof ret_found[t], "%.*s", (int)m->payload_len,
		 (const char *)m->payload);
}

static void record_crash(const report *r)
{
	CHECK(r->round < ROUNDS && r->task < CRASH_TASKS && r->i < MAXI);
	if (r->kind == 'E')
		told[r->round][r->task][r->i] |= 1;
	else if (r->kind == 'A')
		told[r->round][r->task][r->i] |= 2;
	else if (r->kind == 'S')
		told[r->round][r->task][r->i] |= 4;
	else
		ret_told[r->round][r->task] = (int)r->i;
}

/* Read a child's reports from fd until `until` (WEFT_FOREVER: until it is gone), handing each
 * to record. Returns how many said a message was durable ('E'). */
static int drain(int fd, int64_t until, void (*record)(const report *))
{
	int durable = 0;
	for (;;) {
		int64_t left = until - weft_now();
		if (until != WEFT_FOREVER && left <= 0)
			return durable;
		struct pollfd p = { fd, POLLIN, 0 };
		int ms = until == WEFT_FOREVER ? -1 : (int)(left / MS) + 1;
		if (poll(&p, 1, ms) <= 0)
			continue;
		report rs[256];
		ssize_t n = read(fd, rs, sizeof rs);
		if (n <= 0)
			return durable;
		CHECK(n % (ssize_t)sizeof(report) == 0);
		for (int k = 0; k < n / (ssize_t)sizeof(report); k++) {
			record(&rs[k]);
			durable += rs[k].kind == 'E';
		}
	}
}

/* Read a child's reports until it has told something durable (60 s at most), then for 0 to
 * spread_ms more: the kill that follows lands at a random point of the child's work. Not at a
 * fixed time from the fork: under TSan on two cores the child took more than the 100 ms that
 * gave it to open the store and commit its first group. */
static void until_killed(int fd, void (*record)(const report *), int spread_ms)
{
	int64_t give_up = weft_now() + 60000 * MS;
	while (!drain(fd, weft_now() + 10 * MS, record) && weft_now() < give_up)
		;
	drain(fd, weft_now() + (rand() % spread_ms) * MS, record);
}

TEST(crash_kill9_zero_loss)
{
	path = fresh();
	srand((unsigned)getpid());
	memset(ret_told, -1, sizeof ret_told);
	long total_e = 0, total_a = 0;
	for (int round = 0; round < ROUNDS; round++) {
		int fds[2];
		CHECK(pipe(fds) == 0);
		pid_t pid = fork();
		CHECK(pid >= 0);
		if (pid == 0) {
			close(fds[0]);
			pipe_w = fds[1];
			crash_round = round;
			char err[512];
			cst = store_open(path, NULL, err, sizeof err);
			if (!cst) {
				fprintf(stderr, "child: %s\n", err);
				_exit(2);
			}
			weft_run(crash_child, NULL);
			_exit(0);
		}
		close(fds[1]);
		until_killed(fds[0], record_crash, 400);
		CHECK_EQ(kill(pid, SIGKILL), 0);
		int status;
		CHECK_EQ(waitpid(pid, &status, 0), pid);
		if (!(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL))
			fprintf(stderr, "child ended by itself: status %#x\n", status);
		CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
		drain(fds[0], WEFT_FOREVER, record_crash); /* what it wrote before dying */
		close(fds[0]);

		/* reopen: every message told durable is there unless acknowledged */
		memset(found, 0, sizeof found);
		memset(ret_found, 0, sizeof ret_found);
		store *st = open_ok(path, NULL);
		store_callbacks cb = { .queued = crash_queued, .retained = crash_retained };
		CHECK_EQ(store_load(st, &cb, NULL), 0);
		CHECK_EQ(store_close(st), 0);
		long e = 0, a = 0, lost = 0, back = 0;
		for (int r = 0; r <= round; r++)
			for (int t = 0; t < CRASH_TASKS; t++)
				for (int i = 0; i < MAXI; i++) {
					uint8_t k = told[r][t][i];
					CHECK(found[r][t][i] <= 1);
					if (r == round)
						e += (k & 1), a += (k & 2) != 0;
					if ((k & 1) && !(k & 4) && !found[r][t][i]) {
						if (lost++ < 10)
							fprintf(stderr, "lost: round %d task %d "
								"message %d\n", r, t, i);
					}
					if ((k & 2) && found[r][t][i])
						back++;
				}
		for (int t = 0; t < CRASH_TASKS; t++) {
			int told_i = ret_told[round][t];
			if (told_i < 0)
				continue;
			int fr, fi;
			CHECK(sscanf(ret_found[t], "%d-%d", &fr, &fi) == 2);
			/* the value told, or a later one the child set before it died */
			if (fr != round || fi < told_i) {
				fprintf(stderr, "lost: retained of task %d: told %d-%d, found %s\n",
					t, round, told_i, ret_found[t]);
				lost++;
			}
		}
		fprintf(stderr, "round %d: killed after %ld durable messages, %ld acks; lost %ld, "
				"acknowledged but back %ld\n",
			round, e, a, lost, back);
		CHECK(e > 0);
		CHECK_EQ(lost, 0);
		CHECK_EQ(back, 0);
		total_e += e, total_a += a;
	}
	fprintf(stderr, "%d kills, %ld messages and %ld acks told durable, none lost\n", ROUNDS,
		total_e, total_a);
}

/* ---- damaged files ----------------------------------------------------------------------- */

static char dbfile[256];

/* A store of about a megabyte, closed (its log folded into the database file). */
static void make_big(void)
{
	path = fresh();
	store *st = open_ok(path, NULL);
	char payload[500];
	memset(payload, 'p', sizeof payload - 1);
	payload[sizeof payload - 1] = 0;
	int64_t t = 0;
	for (int i = 0; i < 2000; i++) {
		char topic[32];
		snprintf(topic, sizeof topic, "big/%d", i);
		store_msg m = msg(topic, payload, 1);
		CHECK((t = store_put_retained(st, &m)) > 0);
	}
	CHECK_EQ(store_wait(st, t, weft_now() + 10000 * MS), 0);
	CHECK_EQ(store_close(st), 0);
	snprintf(dbfile, sizeof dbfile, "%s/weft-mqtt.db", path);
}

static void scribble(off_t at, size_t n)
{
	int fd = open(dbfile, O_WRONLY);
	CHECK(fd >= 0);
	uint8_t junk[8192];
	for (size_t i = 0; i < sizeof junk; i++)
		junk[i] = (uint8_t)(i * 131 + 17);
	CHECK(n <= sizeof junk);
	CHECK_EQ(pwrite(fd, junk, n, at), n);
	close(fd);
}

static void expect_refused(const char *what)
{
	char err[512] = "";
	store *st = store_open(path, NULL, err, sizeof err);
	fprintf(stderr, "store_open: %s\n", err);
	CHECK(st == NULL);
	CHECK(strstr(err, what));
	CHECK(strstr(err, dbfile));
}

TEST(damaged_header)
{
	make_big();
	scribble(0, 100);
	expect_refused("is not a database");
}

TEST(damaged_page)
{
	make_big();
	scribble(40 * 4096, 4096); /* a table page in the middle */
	expect_refused("is damaged");
}

TEST(truncated_file)
{
	make_big();
	CHECK_EQ(truncate(dbfile, 300 * 1024), 0);
	expect_refused("is damaged");
}

TEST(bad_directory_and_second_user)
{
	char err[512];
	CHECK(!store_open("/proc/version", NULL, err, sizeof err));
	fprintf(stderr, "%s\n", err);
	CHECK(strstr(err, "/proc/version"));
	path = fresh();
	store *st = open_ok(path, NULL);
	/* one broker per database: a second opener is told, not let in */
	CHECK(!store_open(path, NULL, err, sizeof err));
	fprintf(stderr, "%s\n", err);
	CHECK(strstr(err, "in use by another process"));
	CHECK_EQ(store_close(st), 0);
	st = open_ok(path, NULL);
	CHECK_EQ(store_close(st), 0);
}

/* A group is one transaction, even past max_batch: a crash keeps all of it or none. */
static int t_group_unit(void *arg)
{
	(void)arg;
	store_opts o = { .max_batch = 1 }; /* else a commit per write */
	store *st = open_ok(path, &o);
	store_msg m = msg("g", "grouped", 2);
	store_dlv d = dl(2, 0, 0, 0);
	uint64_t row;
	store_stats before, after;
	CHECK_EQ(store_wait(st, store_rel_add(st, S("other"), 1), weft_now() + 5000 * MS), 0);
	store_stats_get(st, &before);
	CHECK(store_group_begin(st) > 0);
	CHECK(store_rel_add(st, S("pub"), 7) > 0);
	CHECK(store_enqueue(st, S("s1"), &m, &d, &row, NULL) > 0);
	CHECK(store_enqueue(st, S("s2"), &m, &d, &row, NULL) > 0);
	CHECK_EQ(store_wait(st, store_group_end(st), weft_now() + 5000 * MS), 0);
	store_stats_get(st, &after);
	CHECK_EQ(after.commits - before.commits, 1);
	CHECK_EQ(after.writes - before.writes, 5); /* the group's marks count as writes */
	CHECK_EQ(store_close(st), 0);
	return 0;
}

TEST(group_is_one_transaction)
{
	path = fresh();
	RUN(t_group_unit);
}

/* ---- a message shared by several sessions ------------------------------------------------ */

/* The first of two integers a query on the (closed) database at path returns. */
long long sql_int(const char *sql)
{
	char file[256];
	snprintf(file, sizeof file, "%s/weft-mqtt.db", path);
	sqlite3 *db;
	CHECK_EQ(sqlite3_open(file, &db), SQLITE_OK);
	sqlite3_stmt *s;
	CHECK_EQ(sqlite3_prepare_v2(db, sql, -1, &s, NULL), SQLITE_OK);
	CHECK_EQ(sqlite3_step(s), SQLITE_ROW);
	long long v = sqlite3_column_int64(s, 0);
	sqlite3_finalize(s);
	sqlite3_close(db);
	return v;
}

static int t_pinned(void *arg)
{
	(void)arg;
	store *st = open_ok(path, NULL);
	_Atomic uint64_t shared = 0;
	store_msg m = msg("fan", "shared", 1);
	store_dlv d = dl(1, 0, 0, 0);
	uint64_t ra, rb, rc;
	/* alice gets it, and acknowledges it before the routing has queued it for bob: the
	 * message must stay, pinned */
	CHECK(store_enqueue(st, S("alice"), &m, &d, &ra, &shared) > 0);
	CHECK(store_inflight(st, S("alice"), ra, 1, 0) > 0);
	CHECK(store_ack(st, S("alice"), 1) > 0);
	CHECK(store_enqueue(st, S("bob"), &m, &d, &rb, &shared) > 0);
	CHECK(store_enqueue(st, S("carol"), &m, &d, &rc, &shared) > 0);
	CHECK(store_del_session(st, S("carol")) > 0); /* a deleted session does not take it */
	int64_t t = store_release(st, shared);
	CHECK_EQ(store_wait(st, t, weft_now() + 5000 * MS), 0);
	char *txt = load_text(st);
	expect(txt, "Q bob fan q1 p0 s0 r0 mr0 x0 props0 shared\n");
	free(txt);
	/* bob's acknowledgement is the last reference: the message goes */
	CHECK(store_inflight(st, S("bob"), rb, 2, 0) > 0);
	CHECK(store_ack(st, S("bob"), 2) > 0);
	/* released while nobody holds it: it goes at once */
	_Atomic uint64_t lone = 0;
	CHECK(store_enqueue(st, S("dave"), &m, &d, &rc, &lone) > 0);
	CHECK(store_del_session(st, S("dave")) > 0);
	CHECK(store_release(st, lone) > 0);
	CHECK_EQ(store_close(st), 0);
	CHECK_EQ(sql_int("SELECT count(*) FROM msgs"), 0);
	CHECK_EQ(sql_int("SELECT count(*) FROM queue"), 0);
	return 0;
}

TEST(shared_message_pinned_until_released)
{
	path = fresh();
	RUN(t_pinned);
}

/* Shared messages under kill -9: a child fans messages out to four sessions, the first one
 * acknowledging each before the others are queued, the second after the release, and reports
 * what is durable. After each kill: every delivery reported durable and not acknowledged is
 * there with its message, no queue row lacks its message and no message is left that nobody
 * holds. */
#define SH_ROUNDS 3
#define SH_TASKS 8
#define SH_PER 2500
#define SH_MAX (SH_TASKS * SH_PER)
static uint8_t sh_told[SH_ROUNDS][SH_MAX];     /* 1: queued for all four, durable; 2: c1 acked */
static uint8_t sh_found[SH_ROUNDS][SH_MAX][4];

static void sh_task(void *arg)
{
	int first = (int)(intptr_t)arg * SH_PER;
	char payload[32];
	for (int i = first; i < first + SH_PER; i++) {
		snprintf(payload, sizeof payload, "%d-%d", crash_round, i);
		store_msg m = msg("fan", payload, 1);
		store_dlv d = dl(1, 0, 0, 0);
		_Atomic uint64_t shared = 0;
		uint64_t row[4];
		/* unique across rounds: a delivery left inflight by a kill keeps its pid */
		uint16_t pid = (uint16_t)(crash_round * SH_MAX + i + 1);
		int64_t t;
		if (store_enqueue(cst, S("c0"), &m, &d, &row[0], &shared) < 0 ||
		    store_inflight(cst, S("c0"), row[0], pid, 0) < 0 || store_ack(cst, S("c0"), pid) < 0)
			_exit(4);
		for (int k = 1; k < 4; k++) {
			char id[4] = { 'c', (char)('0' + k), 0, 0 };
			if (store_enqueue(cst, S(id), &m, &d, &row[k], &shared) < 0)
				_exit(4);
		}
		if ((t = store_release(cst, shared)) < 0 || store_wait(cst, t, WEFT_FOREVER))
			_exit(5);
		tell('E', 0, i);
		if (store_inflight(cst, S("c1"), row[1], pid, 0) < 0 ||
		    (t = store_ack(cst, S("c1"), pid)) < 0 || store_wait(cst, t, WEFT_FOREVER))
			_exit(6);
		tell('A', 0, i);
	}
}

static int sh_child(void *arg)
{
	(void)arg;
	weft_task *t[SH_TASKS];
	for (int i = 0; i < SH_TASKS; i++)
		t[i] = weft_spawn(sh_task, (void *)(intptr_t)i);
	for (int i = 0; i < SH_TASKS; i++)
		weft_join(t[i]);
	return 0;
}

static void sh_queued(void *arg, const char *id, uint16_t id_len, const store_msg *m,
		      const store_dlv *d)
{
	(void)arg, (void)d;
	int r, i;
	char p[32];
	snprintf(p, sizeof p, "%.*s", (int)m->payload_len, (const char *)m->payload);
	CHECK(sscanf(p, "%d-%d", &r, &i) == 2 && r >= 0 && r < SH_ROUNDS && i >= 0 && i < SH_MAX);
	CHECK(id_len == 2 && id[1] >= '0' && id[1] <= '3');
	sh_found[r][i][id[1] - '0']++;
}

static void record_shared(const report *r)
{
	sh_told[r->round][r->i] |= r->kind == 'E' ? 1 : 2;
}

TEST(crash_shared_messages)
{
	path = fresh();
	srand((unsigned)getpid());
	for (int round = 0; round < SH_ROUNDS; round++) {
		int fds[2];
		CHECK(pipe(fds) == 0);
		pid_t pid = fork();
		CHECK(pid >= 0);
		if (pid == 0) {
			close(fds[0]);
			pipe_w = fds[1];
			crash_round = round;
			char err[512];
			if (!(cst = store_open(path, NULL, err, sizeof err)))
				_exit(2);
			weft_run(sh_child, NULL);
			_exit(0);
		}
		close(fds[1]);
		until_killed(fds[0], record_shared, 300);
		CHECK_EQ(kill(pid, SIGKILL), 0);
		int status;
		CHECK_EQ(waitpid(pid, &status, 0), pid);
		CHECK(WIFSIGNALED(status));
		drain(fds[0], WEFT_FOREVER, record_shared);
		close(fds[0]);
		memset(sh_found, 0, sizeof sh_found);
		store *st = open_ok(path, NULL); /* sweeps what the crash left unreferenced */
		store_callbacks cb = { .queued = sh_queued };
		CHECK_EQ(store_load(st, &cb, NULL), 0);
		CHECK_EQ(store_close(st), 0);
		long told = 0, lost = 0;
		for (int r = 0; r <= round; r++)
			for (int i = 0; i < SH_MAX; i++) {
				if (!(sh_told[r][i] & 1))
					continue;
				told += r == round;
				CHECK_EQ(sh_found[r][i][0], 0); /* acknowledged first */
				for (int k = 2; k < 4; k++)
					lost += sh_found[r][i][k] != 1;
				if (sh_told[r][i] & 2)
					CHECK_EQ(sh_found[r][i][1], 0);
				else
					lost += sh_found[r][i][1] > 1;
			}
		long long dangling = sql_int("SELECT count(*) FROM queue WHERE mid NOT IN "
					     "(SELECT mid FROM msgs)");
		long long unheld = sql_int("SELECT count(*) FROM msgs WHERE mid NOT IN "
					   "(SELECT mid FROM queue)");
		fprintf(stderr, "round %d: %ld messages fanned out durably before the kill; lost %ld, "
				"queue rows without message %lld, messages nobody holds %lld\n",
			round, told, lost, dangling, unheld);
		CHECK(told > 0);
		CHECK_EQ(lost, 0);
		CHECK_EQ(dangling, 0);
		CHECK_EQ(unheld, 0);
	}
}

/* ---- a database written by the first schema ------------------------------------------------ */

TEST(upgrade_from_schema_1)
{
	path = fresh();
	CHECK_EQ(mkdir(path, 0700), 0);
	char file[256];
	snprintf(file, sizeof file, "%s/weft-mqtt.db", path);
	sqlite3 *db;
	CHECK_EQ(sqlite3_open(file, &db), SQLITE_OK);
	CHECK_EQ(sqlite3_exec(db,
		"PRAGMA journal_mode=WAL;"
		"CREATE TABLE meta(k TEXT PRIMARY KEY, v);"
		"INSERT INTO meta VALUES('schema', 1);"
		"CREATE TABLE retained(topic BLOB PRIMARY KEY, qos INT, props BLOB, payload BLOB,"
		" expiry INT);"
		"CREATE TABLE sessions(id BLOB PRIMARY KEY, version INT, expiry_interval INT,"
		" disconnected_at INT);"
		"CREATE TABLE subs(id BLOB, filter BLOB, opts INT, subid INT, PRIMARY KEY(id, filter))"
		" WITHOUT ROWID;"
		"CREATE TABLE msgs(mid INTEGER PRIMARY KEY, topic BLOB, qos INT, retain INT,"
		" props BLOB, payload BLOB, expiry INT);"
		"CREATE TABLE queue(id BLOB, seq INT, mid INT, qos INT, pid INT, state INT,"
		" PRIMARY KEY(id, seq)) WITHOUT ROWID;"
		"CREATE INDEX queue_mid ON queue(mid);"
		"CREATE INDEX queue_pid ON queue(id, pid);"
		"CREATE TABLE rel(id BLOB, pid INT, PRIMARY KEY(id, pid)) WITHOUT ROWID;"
		"INSERT INTO sessions VALUES(CAST('old' AS BLOB), 4, 4294967295, 1800000000);"
		"INSERT INTO msgs VALUES(3, CAST('t' AS BLOB), 1, 1, x'', CAST('kept' AS BLOB), 0);"
		"INSERT INTO queue VALUES(CAST('old' AS BLOB), 5, 3, 1, 0, 0);",
		NULL, NULL, NULL), SQLITE_OK);
	sqlite3_close(db);
	store *st = open_ok(path, NULL);
	char *txt = load_text(st);
	expect(txt, "S old v4 e4294967295 d1800000000\n"
		    "Q old t q1 p0 s0 r0 mr1 x0 props0 kept\n");
	free(txt);
	CHECK_EQ(store_close(st), 0);
	CHECK_EQ(sql_int("SELECT v FROM meta WHERE k='schema'"), 3);
}
