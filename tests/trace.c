/* Tests of the execution trace (WEFT_TRACE) and of the wait statistics (weft_stats_waits). */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test.h"

/* ---- a small known program ---------------------------------------------------------------- */

enum { PACKETS = 100 };

static void producer(void *chan)
{
	for (int i = 0; i < PACKETS; i++)
		CHECK_EQ(weft_chan_put(chan, &i, sizeof i), 0);
}

static void consumer(void *chan)
{
	for (int i = 0, v; i < PACKETS; i++) {
		CHECK_EQ(weft_chan_take(chan, &v, sizeof v), (int)sizeof v);
		CHECK_EQ(v, i);
	}
}

static void nap(void *arg)
{
	(void)arg;
	usleep(2000);
}

static int known_program(void *arg)
{
	(void)arg;
	weft_chan *c = weft_chan_new(0, sizeof(int)); /* hand-off: every packet parks someone */
	weft_task *p = weft_spawn_opt(producer, c, &(weft_spawn_opts){ .name = "producer" });
	weft_task *q = weft_spawn_opt(consumer, c, &(weft_spawn_opts){ .name = "consumer" });
	CHECK_EQ(weft_join(p), 0);
	CHECK_EQ(weft_join(q), 0);
	weft_chan_free(c);
	/* a deadline wake-up, far enough that it has not passed when the sleep begins, even under
	 * an emulator: a sleep whose deadline has passed is no wait */
	CHECK_EQ(weft_sleep_until(weft_now() + 20 * MS), 0);
	CHECK_EQ(weft_blocking(nap, NULL), 0);          /* a call on the blocking pool */
	return 0;
}

/* ---- a JSON syntax check, enough to know Perfetto will parse the file ----------------------- */

static const char *json_value(const char *s);

static const char *ws(const char *s)
{
	while (*s == ' ' || *s == '\n' || *s == '\t' || *s == '\r')
		s++;
	return s;
}

static const char *json_string(const char *s)
{
	if (*s++ != '"')
		return NULL;
	for (; *s != '"'; s++) {
		if (!*s || (unsigned char)*s < 0x20)
			return NULL;
		if (*s == '\\' && !*++s)
			return NULL;
	}
	return s + 1;
}

static const char *json_list(const char *s, char close, int object)
{
	s = ws(s + 1);
	if (*s == close)
		return s + 1;
	for (;;) {
		if (object) {
			if (!(s = json_string(ws(s))) || *(s = ws(s)) != ':')
				return NULL;
			s++;
		}
		if (!(s = json_value(s)))
			return NULL;
		s = ws(s);
		if (*s == close)
			return s + 1;
		if (*s++ != ',')
			return NULL;
	}
}

static const char *json_value(const char *s)
{
	s = ws(s);
	if (*s == '{')
		return json_list(s, '}', 1);
	if (*s == '[')
		return json_list(s, ']', 0);
	if (*s == '"')
		return json_string(s);
	if (strncmp(s, "true", 4) == 0 || strncmp(s, "null", 4) == 0)
		return s + 4;
	if (strncmp(s, "false", 5) == 0)
		return s + 5;
	char *end;
	strtod(s, &end);
	return end == s ? NULL : end;
}

static char *slurp(const char *path)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	rewind(f);
	char *s = malloc((size_t)n + 1);
	if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
		free(s);
		s = NULL;
	}
	if (s)
		s[n] = 0;
	fclose(f);
	return s;
}

static int count(const char *s, const char *needle)
{
	int n = 0;
	for (const char *p = s; (p = strstr(p, needle)); p++)
		n++;
	return n;
}

/* A new empty file for a trace. */
static void trace_path(char path[32])
{
	strcpy(path, "/tmp/weft-trace-XXXXXX");
	int fd = mkstemp(path);
	CHECK(fd >= 0);
	close(fd);
}

/* ---- tests ----------------------------------------------------------------------------------- */

TEST(trace_of_a_known_program)
{
	char path[32];
	trace_path(path);
	setenv("WEFT_TRACE", path, 1);
	/* One worker: the main task reaches weft_join before either task has run, so the trace
	 * holds a park in join. With two, on a slow machine (qemu), the other worker could finish
	 * both first. */
	setenv("WEFT_WORKERS", "1", 1);
	RUN(known_program);
	unsetenv("WEFT_TRACE");
	char *s = slurp(path);
	unlink(path);
	CHECK(s != NULL);
	const char *end = json_value(s);
	CHECK(end != NULL && *ws(end) == 0);

	/* a track per worker, and one for the blocking pool */
	CHECK(strstr(s, "\"name\":\"worker 0\"") != NULL);
	CHECK(strstr(s, "\"name\":\"blocking pool") != NULL);
	CHECK(strstr(s, "\"name\":\"blocking call\"") != NULL);
	/* slices named after the tasks; parks say what they wait for */
	CHECK(count(s, "\"name\":\"producer\"") >= 1);
	CHECK(count(s, "\"name\":\"consumer\"") >= 1);
	CHECK(strstr(s, "\"waits for\":\"chan send\"") || strstr(s, "\"waits for\":\"chan recv\""));
	CHECK(strstr(s, "\"waits for\":\"join\"") != NULL);
	CHECK(strstr(s, "\"then\":\"exit\"") != NULL);
	/* a hand-off parks one side per packet: about PACKETS wake arrows, each with both ends
	 * (every woken task ran again before the end) */
	int starts = count(s, "\"ph\":\"s\""), ends = count(s, "\"ph\":\"f\"");
	CHECK(starts >= PACKETS);
	CHECK_EQ(starts, ends);
	CHECK(strstr(s, "\"name\":\"spawn\"") != NULL);
	CHECK(strstr(s, "\"name\":\"deadline\"") != NULL);
	free(s);
}

TEST(trace_to_an_unwritable_path_is_reported_not_fatal)
{
	setenv("WEFT_TRACE", "/nonexistent-dir/trace.json", 1);
	RUN(known_program);
	unsetenv("WEFT_TRACE");
}

/* With WEFT_STATS set, waits are counted by kind; without, nothing is counted. */
static int counted_waits(void *arg)
{
	int want = *(int *)arg;
	CHECK_EQ(known_program(NULL), 0);
	weft_wait_stats st[32];
	int n = weft_stats_waits(st, 32);
	if (!want) {
		CHECK_EQ(n, 0);
		return 0;
	}
	uint64_t chan = 0, sleep = 0, blocking = 0;
	for (int i = 0; i < n; i++) {
		CHECK(st[i].wait_ns >= 0);
		if (strncmp(st[i].what, "chan ", 5) == 0)
			chan += st[i].waits;
		else if (strcmp(st[i].what, "sleep") == 0)
			sleep += st[i].waits;
		else if (strcmp(st[i].what, "blocking call") == 0) {
			blocking += st[i].waits;
			CHECK(st[i].wait_ns >= 2 * MS);
		}
	}
	CHECK(chan >= PACKETS - 1); /* a hand-off parks a sender or a receiver per packet */
	CHECK_EQ(sleep, 1);
	CHECK_EQ(blocking, 1);
	CHECK_EQ(weft_stats_waits(NULL, -1), -EINVAL);
	CHECK_EQ(weft_stats_waits(st, 0), 0);
	return 0;
}

/* Plain threads' waits are counted too (in a table of their own, under a lock): a thread
 * parks on a hand-off channel until a task sends. */
static uint64_t waits_for(const char *what)
{
	weft_wait_stats st[32];
	int n = weft_stats_waits(st, 32);
	uint64_t w = 0;
	for (int i = 0; i < n; i++)
		if (strcmp(st[i].what, what) == 0)
			w += st[i].waits;
	return w;
}

static void *plain_receiver(void *chan)
{
	int v;
	CHECK_EQ(weft_chan_take(chan, &v, sizeof v), (int)sizeof v);
	return NULL;
}

static int plain_thread_waits(void *arg)
{
	(void)arg;
	weft_chan *c = weft_chan_new(0, sizeof(int));
	uint64_t before = waits_for("chan recv");
	pthread_t th;
	CHECK(pthread_create(&th, NULL, plain_receiver, c) == 0);
	while (weft_chan_waiting(c) < 1)
		weft_sleep_until(weft_now() + MS);
	int v = 1;
	CHECK_EQ(weft_chan_put(c, &v, sizeof v), 0);
	pthread_join(th, NULL);
	CHECK(waits_for("chan recv") >= before + 1);
	weft_chan_free(c);
	return 0;
}

TEST(wait_statistics_count_plain_threads)
{
	setenv("WEFT_STATS", "1", 1);
	RUN(plain_thread_waits);
}

TEST(wait_statistics_by_kind)
{
	int on = 1, off = 0;
	setenv("WEFT_STATS", "1", 1);
	CHECK_EQ(weft_run(counted_waits, &on), 0);
	unsetenv("WEFT_STATS");
	CHECK_EQ(weft_run(counted_waits, &off), 0);
}

/* ---- the trace while weft runs, and when a signal ends the program -------------------------- */

/* weft_trace_flush writes what is recorded so far, and recording goes on: the file written at
 * the end holds the tasks that ran after the flush too. */
static void named_nap(void *arg)
{
	(void)arg;
	weft_sleep(MS);
}

static int flushes_midway(void *path)
{
	weft_join(weft_spawn_opt(named_nap, NULL, &(weft_spawn_opts){ .name = "before-flush" }));
	CHECK_EQ(weft_trace_flush(), 0);
	char *s = slurp(path);
	CHECK(s != NULL);
	const char *end = json_value(s);
	CHECK(end != NULL && *ws(end) == 0);
	CHECK(strstr(s, "\"name\":\"before-flush\"") != NULL);
	CHECK(strstr(s, "\"name\":\"after-flush\"") == NULL);
	free(s);
	weft_join(weft_spawn_opt(named_nap, NULL, &(weft_spawn_opts){ .name = "after-flush" }));
	return 0;
}

TEST(trace_flush_writes_so_far_and_records_on)
{
	char path[32];
	trace_path(path);
	setenv("WEFT_TRACE", path, 1);
	CHECK_EQ(weft_run(flushes_midway, path), 0);
	unsetenv("WEFT_TRACE");
	char *s = slurp(path);
	unlink(path);
	CHECK(s != NULL);
	CHECK(strstr(s, "\"name\":\"before-flush\"") && strstr(s, "\"name\":\"after-flush\""));
	free(s);
	/* not tracing: nothing to do */
	CHECK_EQ(weft_trace_flush(), 0);
}

/* A server stopped with SIGTERM: the child sends itself the signal from a task and waits for
 * ever; the trace and the statistics come out, and the child dies of SIGTERM all the same. */
static int terminated(void *arg)
{
	(void)arg;
	weft_join(weft_spawn_opt(named_nap, NULL, &(weft_spawn_opts){ .name = "served" }));
	int p[2];
	CHECK_EQ(pipe(p), 0);
	kill(getpid(), SIGTERM);
	char b;
	weft_read(p[0], &b, 1, WEFT_FOREVER); /* as a server waits for its next client */
	return 0;
}

TEST(child_terminated)
{
	weft_run(terminated, NULL);
}

TEST(sigterm_writes_the_trace_and_the_statistics)
{
	char path[32], vars[64], err[8192];
	trace_path(path);
	snprintf(vars, sizeof vars, "WEFT_TRACE=%s WEFT_STATS=1", path);
	int st = test_spawn_child_env(vars, "child_terminated", err, sizeof err);
	CHECK_EQ(st, -SIGTERM);
	CHECK(strstr(err, "weft: statistics") != NULL);
	char *s = slurp(path);
	unlink(path);
	CHECK(s != NULL);
	const char *end = json_value(s);
	CHECK(end != NULL && *ws(end) == 0);
	CHECK(strstr(s, "\"name\":\"served\"") != NULL);
	free(s);
}
