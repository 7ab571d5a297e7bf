/*
 * Tests of libweft-shim.so. The plain_* functions are code that knows nothing of weft: they
 * call usleep, read and write as any library would. Each test re-runs this binary as a child
 * with the shim preloaded, and the child runs plain code inside tasks and outside them.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "test.h"

/* ---- code that knows nothing of weft ------------------------------------------------------ */

static void plain_sleepy(void *arg)
{
	(void)arg;
	for (int i = 0; i < 5; i++)
		usleep(20000);
}

static int plain_echo_once(int fd)
{
	char b[64];
	ssize_t n = read(fd, b, sizeof b);
	return n > 0 && write(fd, b, (size_t)n) == n ? 0 : -1;
}

/* ---- children ---------------------------------------------------------------------------- */

static int64_t elapsed_ms(struct timespec a)
{
	struct timespec b;
	clock_gettime(CLOCK_MONOTONIC, &b);
	return (b.tv_sec - a.tv_sec) * 1000 + (b.tv_nsec - a.tv_nsec) / 1000000;
}

TEST(child_usleep)
{
	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	/* 100 tasks x 5 x usleep(20 ms): 100 ms when they sleep together, seconds if each
	 * usleep held its worker. */
	CHECK_EQ(weft_execute(100, plain_sleepy, NULL), 0);
	int64_t ms = elapsed_ms(t0);
	fprintf(stderr, "100 tasks x 5 x usleep(20ms): %lld ms\n", (long long)ms);
	CHECK(ms >= 100 && ms < 1000);
}

static int sv[50][2];
static atomic_int echoed;

static void serve_one(void *arg)
{
	int i = (int)(intptr_t)arg;
	CHECK_EQ(plain_echo_once(sv[i][0]), 0); /* blocking read: parks this task only */
	atomic_fetch_add(&echoed, 1);
}

static void client_one(void *arg)
{
	int i = (int)(intptr_t)arg;
	usleep(10000);
	CHECK_EQ(write(sv[i][1], "ping", 4), 4);
	char b[8];
	CHECK_EQ(read(sv[i][1], b, sizeof b), 4);
}

static int echo_main(void *arg)
{
	(void)arg;
	weft_task *t[100];
	for (int i = 0; i < 50; i++) {
		CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv[i]) == 0);
		t[i] = weft_spawn(serve_one, (void *)(intptr_t)i);
	}
	for (int i = 0; i < 50; i++)
		t[50 + i] = weft_spawn(client_one, (void *)(intptr_t)i);
	for (int i = 0; i < 100; i++)
		CHECK_EQ(weft_join(t[i]), 0);
	CHECK_EQ(atomic_load(&echoed), 50);
	/* the program still believes its fds blocking */
	CHECK((fcntl(sv[0][0], F_GETFL) & O_NONBLOCK) == 0);
	/* and when it asks for non-blocking, it gets EAGAIN, not a park */
	CHECK(fcntl(sv[0][0], F_SETFL, fcntl(sv[0][0], F_GETFL) | O_NONBLOCK) == 0);
	char b[4];
	errno = 0;
	CHECK(read(sv[0][0], b, sizeof b) == -1 && errno == EAGAIN);
	CHECK((fcntl(sv[0][0], F_GETFL) & O_NONBLOCK) != 0);
	/* poll on one fd parks until it is ready, or times out */
	struct pollfd p = { .fd = sv[1][0], .events = POLLIN };
	CHECK_EQ(poll(&p, 1, 20), 0);
	for (int i = 0; i < 50; i++) {
		close(sv[i][0]);
		close(sv[i][1]);
	}
	return 0;
}

TEST(child_blocking_reads)
{
	RUN(echo_main);
}

static void *plain_thread(void *arg)
{
	(void)arg;
	/* Outside tasks: libc as ever, errno included. */
	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	CHECK_EQ(usleep(10000), 0);
	CHECK(elapsed_ms(t0) >= 10);
	errno = 0;
	CHECK(read(-1, NULL, 0) == -1 && errno == EBADF);
	struct timespec bad = { 0, 2000000000 };
	errno = 0;
	CHECK(nanosleep(&bad, NULL) == -1 && errno == EINVAL);
	return NULL;
}

static int mixed_main(void *arg)
{
	(void)arg;
	pthread_t th;
	pthread_create(&th, NULL, plain_thread, NULL);
	pthread_join(th, NULL);
	/* inside a task: same errno behaviour */
	errno = 0;
	CHECK(read(-1, NULL, 0) == -1 && errno == EBADF);
	struct timespec bad = { 0, -1 };
	errno = 0;
	CHECK(nanosleep(&bad, NULL) == -1 && errno == EINVAL);
	CHECK_EQ(sleep(0), 0);
	return 0;
}

TEST(child_libc_semantics)
{
	plain_thread(NULL); /* before weft_run: plain libc */
	RUN(mixed_main);
}

/* Plain code on TCP inside tasks: an echo of several requests, each answered after a short
 * read (weft's drained-reads rule applies: the next read waits for data first), ended by the
 * client's FIN; recv with MSG_DONTWAIT on a blocking socket says EAGAIN at once, as in libc;
 * and a successful read leaves errno alone. */
static int tcp_c, tcp_s;

static void plain_echo_until_eof(void *arg)
{
	(void)arg;
	char b[256];
	ssize_t n;
	while ((n = read(tcp_s, b, sizeof b)) > 0)
		CHECK_EQ(write(tcp_s, b, (size_t)n), n);
	CHECK_EQ(n, 0);
}

static int tcp_main(void *arg)
{
	(void)arg;
	int lfd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t al = sizeof a;
	CHECK(bind(lfd, (struct sockaddr *)&a, sizeof a) == 0 && listen(lfd, 4) == 0);
	CHECK(getsockname(lfd, (struct sockaddr *)&a, &al) == 0);
	tcp_c = socket(AF_INET, SOCK_STREAM, 0);
	CHECK(connect(tcp_c, (struct sockaddr *)&a, sizeof a) == 0);
	CHECK((tcp_s = accept(lfd, NULL, NULL)) >= 0);
	char b[16];
	errno = 0;
	CHECK(recv(tcp_s, b, sizeof b, MSG_DONTWAIT) == -1 && errno == EAGAIN);
	weft_task *t = weft_spawn(plain_echo_until_eof, NULL);
	for (int i = 0; i < 20; i++) {
		char m[8];
		int n = snprintf(m, sizeof m, "req %d", i);
		CHECK_EQ(write(tcp_c, m, (size_t)n), n);
		size_t got = 0;
		while (got < (size_t)n) {
			ssize_t k = read(tcp_c, b + got, sizeof b - got);
			CHECK(k > 0);
			got += (size_t)k;
		}
		CHECK(memcmp(b, m, (size_t)n) == 0);
		usleep(1000 * (i % 3)); /* the server waits in its read at times, at times not */
	}
	shutdown(tcp_c, SHUT_WR);
	CHECK_EQ(weft_join(t), 0);
	int p[2];
	CHECK(pipe(p) == 0);
	CHECK_EQ(write(p[1], "x", 1), 1);
	errno = 12345;
	CHECK_EQ(read(p[0], b, sizeof b), 1);
	CHECK_EQ(errno, 12345);
	close(p[0]);
	close(p[1]);
	close(tcp_c);
	close(tcp_s);
	close(lfd);
	return 0;
}

/* poll(2) for reading and writing at once on a socket that is not readable and whose send
 * buffer is full: it returns when a reader makes room (it used to wait for POLLIN alone). */
static int both_ways_fd;

static void drain_later(void *arg)
{
	(void)arg;
	char b[4096];
	usleep(20000);
	while (recv(both_ways_fd, b, sizeof b, MSG_DONTWAIT) > 0)
		;
}

static int poll_both_main(void *arg)
{
	(void)arg;
	int sv2[2];
	CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv2) == 0);
	char b[4096] = { 0 };
	while (send(sv2[0], b, sizeof b, MSG_DONTWAIT) > 0)
		;
	both_ways_fd = sv2[1];
	weft_task *t = weft_spawn(drain_later, NULL);
	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	struct pollfd p = { .fd = sv2[0], .events = POLLIN | POLLOUT };
	CHECK_EQ(poll(&p, 1, 3000), 1);
	CHECK(p.revents & POLLOUT);
	CHECK(elapsed_ms(t0) < 1000);
	CHECK_EQ(weft_join(t), 0);
	/* and with no fd, poll sleeps */
	clock_gettime(CLOCK_MONOTONIC, &t0);
	CHECK_EQ(poll(NULL, 0, 30), 0);
	CHECK(elapsed_ms(t0) >= 30);
	close(sv2[0]);
	close(sv2[1]);
	return 0;
}

TEST(child_poll_both_ways)
{
	RUN(poll_both_main);
}

TEST(child_tcp)
{
	RUN(tcp_main);
}

/* ---- the tests: run a child with the shim preloaded --------------------------------------- */

static void run_child(const char *name)
{
	char self[512], dir[512], cmd[2048], err[4096];
	snprintf(self, sizeof self, "%s", test_argv0);
	snprintf(dir, sizeof dir, "%s", test_argv0);
	const char *runner = getenv("RUNNER");
	/* qemu-user takes the guest's environment with -E; ASan must be told that a preloaded
	 * library comes before it */
	if (runner && *runner)
		snprintf(cmd, sizeof cmd, "-E LD_PRELOAD=%s/../libweft-shim.so %s %s", dirname(dir),
			 self, name);
	else
		snprintf(cmd, sizeof cmd,
			 "env LD_PRELOAD=%s/../libweft-shim.so ASAN_OPTIONS=verify_asan_link_order=0 %s %s",
			 dirname(dir), self, name);
	int st = test_spawn(cmd, err, sizeof err);
	if (st != 0)
		fprintf(stderr, "child %s: status %d\n%s", name, st, err);
	CHECK_EQ(st, 0);
}

TEST(usleep_in_tasks_runs_concurrently)
{
	run_child("child_usleep");
}

TEST(blocking_reads_park_only_their_task)
{
	run_child("child_blocking_reads");
}

TEST(libc_semantics_kept_inside_and_outside_tasks)
{
	run_child("child_libc_semantics");
}

TEST(tcp_reads_and_dontwait_keep_libc_semantics)
{
	run_child("child_tcp");
}

TEST(poll_for_reading_and_writing_returns_when_writable)
{
	run_child("child_poll_both_ways");
}
