/* Tests of seeing inside a weft program: the task dump (weft_dump, SIGQUIT) and weft_stats. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "test.h"

static weft_chan *c;

static void reader(void *arg)
{
	(void)arg;
	int v;
	CHECK_EQ(weft_chan_take(c, &v, sizeof v), -EPIPE);
}

static void napper(void *arg)
{
	(void)arg;
	weft_sleep_until(weft_now() + 10000000000LL);
}

static int dumps(void *arg)
{
	(void)arg;
	CHECK((c = weft_chan_new(0, sizeof(int))));
	CHECK_EQ(strcmp(weft_chan_name(c), ""), 0);
	weft_chan_set_name(c, "jobs, with a name longer than thirty-one bytes");
	CHECK_EQ(strcmp(weft_chan_name(c), "jobs, with a name longer than t"), 0);
	weft_chan_set_name(c, "jobs");
	weft_task *r = weft_spawn_opt(reader, NULL, &(weft_spawn_opts){ .name = "reader" });
	weft_task *n = weft_spawn_opt(napper, NULL, &(weft_spawn_opts){ .name = "napper" });
	while (weft_chan_waiting(c) < 1)
		weft_sleep_until(weft_now() + 1000000);
	weft_sleep_until(weft_now() + 3000000); /* let the napper park too */
	int p[2];
	CHECK(pipe(p) == 0);
	CHECK_EQ(weft_dump(p[1]), 3);
	close(p[1]);
	char out[4096];
	ssize_t k = read(p[0], out, sizeof out - 1);
	CHECK(k > 0);
	out[k] = 0;
	close(p[0]);
	char want[128];
	snprintf(want, sizeof want, "(reader): chan recv on jobs (%p) for ", (void *)c);
	CHECK(strstr(out, want));
	CHECK(strstr(out, "(napper): sleep for "));
	CHECK(strstr(out, "(main): running"));
	CHECK(strstr(out, "spawned at "));
	CHECK_EQ(weft_dump(-1), -EBADF);
	weft_chan_close(c);
	weft_cancel(n);
	CHECK_EQ(weft_join(r), 0);
	CHECK_EQ(weft_join(n), 0);
	weft_chan_free(c);
	return 0;
}

TEST(dump_lists_tasks_and_what_they_wait_for)
{
	RUN(dumps);
	CHECK_EQ(weft_dump(1), -EINVAL); /* outside weft_run */
}

/* How long the dump says task `name` has waited, and on what, from a dump in out. */
static long long waited_ms(const char *out, const char *name, char *on, size_t cap)
{
	char key[64];
	snprintf(key, sizeof key, "(%s): ", name);
	const char *l = strstr(out, key);
	CHECK(l);
	const char *f = strstr(l, " for ");
	CHECK(f && f < strchr(l, '\n'));
	snprintf(on, cap, "%.*s", (int)(f - l), l);
	return atoll(f + 5);
}

static void dump_to(char *out, size_t cap)
{
	int p[2];
	CHECK(pipe(p) == 0);
	CHECK(weft_dump(p[1]) >= 1);
	close(p[1]);
	ssize_t k = read(p[0], out, cap - 1);
	CHECK(k > 0);
	out[k] = 0;
	close(p[0]);
}

static int pipe_fd[2];

static void fd_reader(void *arg)
{
	(void)arg;
	char b;
	CHECK_EQ(weft_read(pipe_fd[0], &b, 1, WEFT_FOREVER), 1);
}

static void short_nap(void *arg)
{
	(void)arg;
	weft_sleep_until(weft_now() + 200000000);
}

/* The times in a dump are true after the program was idle (every worker asleep, and the monitor
 * with them, whose coarse clock then stands still): a task parked 600 ms shows about 600, one
 * that just parked about 0 (they showed 0 and seconds); an fd is shown as a number. */
static int dump_times(void *arg)
{
	(void)arg;
	CHECK(pipe(pipe_fd) == 0);
	weft_task *r = weft_spawn_opt(fd_reader, NULL, &(weft_spawn_opts){ .name = "fdreader" });
	weft_sleep_until(weft_now() + 600000000); /* nothing runs: everybody sleeps */
	int64_t nap_start = weft_now();
	weft_task *n = weft_spawn_opt(short_nap, NULL, &(weft_spawn_opts){ .name = "shortnap" });
	weft_sleep_until(weft_now() + 20000000);
	char out[4096], on[128], want[64];
	long long since_nap = (weft_now() - nap_start) / 1000000;
	dump_to(out, sizeof out);
	char on_n[128];
	long long r_ms = waited_ms(out, "fdreader", on, sizeof on);
	long long n_ms = waited_ms(out, "shortnap", on_n, sizeof on_n);
	fprintf(stderr, "fdreader %lld ms, shortnap %lld ms\n%s", r_ms, n_ms, out);
	CHECK(r_ms >= 500 && r_ms < 600 + since_nap + 2000);
	/* the nap began since_nap ms ago (20 ms, more on a loaded machine), not 600 ms ago as the
	 * clock of the idle monitor said; 5 ms for the coarse clock's steps */
	CHECK(n_ms <= since_nap + 5);
	snprintf(want, sizeof want, "(fdreader): fd read on fd %d", pipe_fd[0]);
	CHECK(strstr(on, want));
	CHECK_EQ(write(pipe_fd[1], "x", 1), 1);
	CHECK_EQ(weft_join(r), 0);
	CHECK_EQ(weft_join(n), 0);
	close(pipe_fd[0]);
	close(pipe_fd[1]);
	return 0;
}

TEST(dump_wait_times_are_true_after_idleness)
{
	RUN(dump_times);
}

/* A dump runs while tasks park on named channels, are woken, and free them: it must never read
 * a channel after its free (ASan would say so) nor crash, and its lines stay whole. */
static _Atomic bool churning;

static void putter(void *arg)
{
	int v = 1;
	weft_yield();
	CHECK_EQ(weft_chan_put(arg, &v, sizeof v), 0);
}

static void churner(void *arg)
{
	(void)arg;
	int v;
	for (int i = 0; i < TEST_CAP(20000) / 4; i++) {
		weft_chan *ch = weft_chan_new(0, sizeof v);
		CHECK(ch);
		weft_chan_set_name(ch, "churn");
		weft_task *p = weft_spawn(putter, ch);
		CHECK_EQ(weft_chan_take(ch, &v, sizeof v), (int)sizeof v);
		CHECK_EQ(weft_join(p), 0);
		weft_chan_free(ch);
	}
}

static void dumper(void *arg)
{
	int fd = *(int *)arg, n = 0;
	while (atomic_load(&churning) || n == 0) {
		CHECK(weft_dump(fd) >= 1);
		n++;
		weft_yield();
	}
}

static int dumps_while_churning(void *arg)
{
	(void)arg;
	FILE *f = tmpfile();
	CHECK(f);
	int fd = fileno(f);
	atomic_store(&churning, true);
	weft_task *d = weft_spawn(dumper, &fd);
	weft_execute(4, churner, NULL);
	atomic_store(&churning, false);
	CHECK_EQ(weft_join(d), 0);
	/* Every line whole, and some name a channel that was alive when it was written. */
	off_t size = lseek(fd, 0, SEEK_END);
	char *out = malloc((size_t)size + 1);
	CHECK(out && pread(fd, out, (size_t)size, 0) == size);
	out[size] = 0;
	CHECK(size > 0 && out[size - 1] == '\n');
	CHECK(strstr(out, "chan recv on churn (") || strstr(out, "chan send on churn ("));
	free(out);
	fclose(f);
	return 0;
}

TEST(dump_while_tasks_free_the_channels_they_waited_on)
{
	RUN(dumps_while_churning);
}

static int quits(void *arg)
{
	(void)arg;
	weft_spawn_opt(napper, NULL, &(weft_spawn_opts){ .name = "napper" });
	weft_sleep_until(weft_now() + 3000000);
	raise(SIGQUIT);
	return 0;
}

TEST(child_sigquit)
{
	weft_run(quits, NULL);
}

TEST(sigquit_prints_the_dump_and_exits_2)
{
	char cmd[512], err[4096];
	snprintf(cmd, sizeof cmd, "%s child_sigquit", test_argv0);
	CHECK_EQ(test_spawn(cmd, err, sizeof err), 2);
	CHECK(strstr(err, "weft: SIGQUIT: the live tasks"));
	CHECK(strstr(err, "(napper): sleep for "));
}

/* Counters add up: at quiescence every park was matched by a wake-up. */
static weft_chan *ping;

static void pinger(void *arg)
{
	(void)arg;
	int v = 0;
	for (int i = 0; i < 10000; i++)
		CHECK_EQ(weft_chan_put(ping, &v, sizeof v), 0);
}

static void *thread_taker(void *arg)
{
	(void)arg;
	int v;
	for (int i = 0; i < 10000; i++)
		CHECK_EQ(weft_chan_take(ping, &v, sizeof v), (int)sizeof v);
	return NULL;
}

static void sleeper(void *arg)
{
	(void)arg;
	for (int i = 0; i < 50; i++)
		weft_sleep_until(weft_now() + 100000);
}

static int counts(void *arg)
{
	(void)arg;
	CHECK((ping = weft_chan_new(0, sizeof(int))));
	pthread_t th;
	CHECK_EQ(pthread_create(&th, NULL, thread_taker, NULL), 0);
	weft_task *t[3] = { weft_spawn(pinger, NULL), weft_spawn(sleeper, NULL),
			    weft_spawn(sleeper, NULL) };
	for (int i = 0; i < 3; i++)
		CHECK_EQ(weft_join(t[i]), 0);
	while (pthread_tryjoin_np(th, NULL) != 0)
		weft_sleep_until(weft_now() + 1000000);
	weft_chan_free(ping);
	weft_worker_stats st[64];
	uint64_t foreign;
	int n = weft_stats(st, 64, &foreign);
	CHECK(n >= 1);
	uint64_t parks = 0, wakes = 0, switches = 0;
	for (int i = 0; i < n; i++) {
		parks += st[i].parks;
		wakes += st[i].wakes;
		switches += st[i].switches;
	}
	/* main itself is running: everyone else is done, so every park has been answered */
	CHECK_EQ(parks, wakes + foreign);
	CHECK(foreign > 0);          /* the thread woke the pinger */
	CHECK(parks >= 100);         /* the sleepers parked 100 times between them */
	CHECK(switches >= parks);
	CHECK_EQ(weft_stats(NULL, -1, NULL), -EINVAL);
	return 0;
}

TEST(stats_parks_match_wakes_at_quiescence)
{
	RUN(counts);
	CHECK_EQ(weft_stats(NULL, 0, NULL), -EINVAL); /* outside weft_run */
}

/* A task in a system call weft does not cover (a raw read(2) of a pipe: this test is not
 * shimmed) holds its worker: the dump says so, and for how long, as Go's "[syscall, N
 * minutes]", instead of a bare "running". */
static int held_fd[2];

static void holds_its_worker(void *arg)
{
	(void)arg;
	char b;
	CHECK_EQ(read(held_fd[0], &b, 1), 1);
}

static int dump_of_a_held_worker(void *arg)
{
	(void)arg;
	CHECK_EQ(pipe(held_fd), 0);
	weft_task *h = weft_spawn_opt(holds_its_worker, NULL, &(weft_spawn_opts){ .name = "holder" });
	weft_sleep(600 * MS);
	FILE *f = tmpfile();
	CHECK(f);
	CHECK(weft_dump(fileno(f)) >= 2);
	CHECK_EQ(write(held_fd[1], "x", 1), 1);
	CHECK_EQ(weft_join(h), 0);
	char out[4096];
	rewind(f);
	size_t k = fread(out, 1, sizeof out - 1, f);
	out[k] = 0;
	fclose(f);
	const char *l = strstr(out, "(holder): in a system call for ");
	if (!l)
		printf("%s", out);
	CHECK(l);
	long ms = atol(l + strlen("(holder): in a system call for "));
	CHECK(ms >= 200 && ms < 60000);
	CHECK(strstr(l, " ms on worker "));
	close(held_fd[0]);
	close(held_fd[1]);
	return 0;
}

TEST(dump_says_how_long_a_task_has_held_its_worker_in_a_system_call)
{
	RUN(dump_of_a_held_worker);
}
