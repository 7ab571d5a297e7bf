/*
 * Tests of libweft-shim.so. The plain_* functions are code that knows nothing of weft: they
 * call usleep, read and write as any library would. Each test re-runs this binary as a child
 * with the shim preloaded, and the child runs plain code inside tasks and outside them.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>

#include "poll.h" /* poll_forget, which libweft.so exports for the shim's close() */
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

/* poll(2) that must end by a wake-up: it fails the test if it needed its (long) timeout, which
 * is also when it would look at the kernel once more and find the fds ready anyway. */
static int woken_poll(struct pollfd *p, nfds_t n)
{
	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	int r = poll(p, n, 5000);
	CHECK(elapsed_ms(t0) < 4000);
	return r;
}

TEST(child_usleep)
{
	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	/* 100 tasks x 5 x usleep(20 ms): 100 ms when they sleep together, 5 s if each usleep
	 * held its worker. Under TSan, on a VM where page faults cost 10 us: 1,041 ms once. */
	CHECK_EQ(weft_execute(100, plain_sleepy, NULL), 0);
	int64_t ms = elapsed_ms(t0);
	fprintf(stderr, "100 tasks x 5 x usleep(20ms): %lld ms\n", (long long)ms);
	CHECK(ms >= 100 && ms < (SLOW ? 3000 : 1000));
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

/* poll(2) on several fds parks the task on all of them: a chain of tasks, each polling its own
 * pipe and one that is never written, each woken by the next, completes in a moment with a
 * blocking pool of one thread (the child runs with WEFT_BLOCKING_THREADS=1). Were each poll a
 * pool job, the thread would hold the first task's poll, which waits for a task queued behind
 * it, until the 10 s timeout. The same with ppoll, select and pselect. */
#define CHAIN 50
static int chain[CHAIN][2], never[2];
static const char *chain_call;

/* Wait with chain_call until chain[i][0] is readable; checks that never[0] is not. */
static void wait_readable(int i)
{
	int a = never[0], b = chain[i][0];
	if (!strcmp(chain_call, "poll") || !strcmp(chain_call, "ppoll")) {
		struct pollfd p[3] = { { .fd = a, .events = POLLIN }, { .fd = b, .events = POLLIN },
				       { .fd = -1, .events = POLLIN } };
		struct timespec ts = { 10, 0 };
		CHECK_EQ(chain_call[0] == 'p' && chain_call[1] == 'p' ? ppoll(p, 3, &ts, NULL)
								      : poll(p, 3, 10000), 1);
		CHECK(p[0].revents == 0 && p[1].revents == POLLIN && p[2].revents == 0);
		return;
	}
	fd_set r, w;
	FD_ZERO(&r);
	FD_ZERO(&w);
	FD_SET(a, &r);
	FD_SET(b, &r);
	FD_SET(a, &w); /* the read end of a pipe is never writable */
	struct timeval tv = { 10, 0 };
	struct timespec ts = { 10, 0 };
	CHECK_EQ(!strcmp(chain_call, "select") ? select(b > a ? b + 1 : a + 1, &r, &w, NULL, &tv)
					       : pselect(b > a ? b + 1 : a + 1, &r, &w, NULL, &ts, NULL),
		 1);
	CHECK(!FD_ISSET(a, &r) && FD_ISSET(b, &r) && !FD_ISSET(a, &w));
}

static void chain_link(void *arg)
{
	int i = (int)(intptr_t)arg;
	wait_readable(i);
	char c;
	CHECK_EQ(read(chain[i][0], &c, 1), 1);
	if (i > 0)
		CHECK_EQ(write(chain[i - 1][1], "x", 1), 1);
}

static void run_chain(const char *call)
{
	weft_task *t[CHAIN];
	chain_call = call;
	for (int i = 0; i < CHAIN; i++) {
		CHECK(pipe(chain[i]) == 0);
		t[i] = weft_spawn(chain_link, (void *)(intptr_t)i);
	}
	usleep(20000); /* let them all park */
	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	CHECK_EQ(write(chain[CHAIN - 1][1], "x", 1), 1);
	for (int i = 0; i < CHAIN; i++)
		CHECK_EQ(weft_join(t[i]), 0);
	fprintf(stderr, "a chain of %d %s calls: %lld ms\n", CHAIN, call, (long long)elapsed_ms(t0));
	CHECK(elapsed_ms(t0) < 3000);
	for (int i = 0; i < CHAIN; i++) {
		close(chain[i][0]);
		close(chain[i][1]);
	}
}

static int poll_chain_main(void *arg)
{
	(void)arg;
	CHECK(pipe(never) == 0);
	run_chain("select");
	run_chain("pselect");
	run_chain("ppoll");
	run_chain("poll");
	/* nothing ready: poll returns 0 at its timeout, not before */
	int idle[2];
	CHECK(pipe(idle) == 0);
	struct pollfd p[2] = { { .fd = never[0], .events = POLLIN },
			       { .fd = idle[0], .events = POLLIN | POLLPRI } };
	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	CHECK_EQ(poll(p, 2, 30), 0);
	CHECK(elapsed_ms(t0) >= 30 && p[0].revents == 0 && p[1].revents == 0);
	return 0;
}

/* select(2) as the kernel does it: a bit per ready direction counted, the sets cut down to
 * what is ready, the timeout left written back, 0 with empty sets at the timeout, EBADF for an
 * fd that is not open (sets untouched); ppoll with a signal mask goes to libc, and works. */
static int select_main(void *arg)
{
	(void)arg;
	int s[2], q[2];
	CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, s) == 0 && pipe(q) == 0);
	CHECK_EQ(write(s[1], "x", 1), 1);
	fd_set r, w, e;
	FD_ZERO(&r);
	FD_ZERO(&w);
	FD_ZERO(&e);
	FD_SET(s[0], &r);
	FD_SET(s[0], &w);
	FD_SET(s[0], &e);
	FD_SET(q[0], &r);
	int nfds = (s[0] > q[0] ? s[0] : q[0]) + 1;
	struct timeval tv = { 5, 0 };
	CHECK_EQ(select(nfds, &r, &w, &e, &tv), 2); /* s[0] readable and writable */
	CHECK(FD_ISSET(s[0], &r) && FD_ISSET(s[0], &w) && !FD_ISSET(s[0], &e) && !FD_ISSET(q[0], &r));
	CHECK(tv.tv_sec >= 4 && tv.tv_sec <= 5);

	FD_ZERO(&r);
	FD_SET(q[0], &r);
	tv = (struct timeval){ 0, 30000 };
	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	CHECK_EQ(select(q[0] + 1, &r, NULL, NULL, &tv), 0);
	CHECK(elapsed_ms(t0) >= 30 && !FD_ISSET(q[0], &r) && tv.tv_sec == 0 && tv.tv_usec == 0);

	int gone[2];
	CHECK(pipe(gone) == 0);
	close(gone[0]);
	close(gone[1]);
	FD_ZERO(&r);
	FD_SET(q[0], &r);
	FD_SET(gone[0], &r);
	tv = (struct timeval){ 1, 0 };
	errno = 0;
	CHECK(select((q[0] > gone[0] ? q[0] : gone[0]) + 1, &r, NULL, NULL, &tv) == -1 && errno == EBADF);
	CHECK(FD_ISSET(q[0], &r) && FD_ISSET(gone[0], &r));

	sigset_t none;
	sigemptyset(&none);
	struct pollfd p = { .fd = s[0], .events = POLLIN };
	struct timespec ts = { 1, 0 };
	CHECK_EQ(ppoll(&p, 1, &ts, &none), 1);
	CHECK(p.revents == POLLIN);
	for (int i = 0; i < 2; i++) {
		close(s[i]);
		close(q[i]);
	}
	return 0;
}

TEST(child_select)
{
	RUN(select_main);
}

TEST(child_poll_chain)
{
	setenv("WEFT_BLOCKING_THREADS", "1", 1);
	RUN(poll_chain_main);
}

/* poll(2) on several fds, and reads around it:
 * - on a TCP socket whose last read was short (drained reads: the next read waits for an
 *   edge), a poll that takes that edge lets the read after it find the data at once;
 * - a poll may share an fd with a task reading it: it sees the other fd, the reader its data;
 * - one edge wakes every task polling the fd; a poll may name many fds, and one fd twice;
 * - a poll for errors alone (events 0) returns when the peer resets the connection. */
static int pr_fd;
static atomic_int pr_done;

static void write_later(void *arg)
{
	usleep(20000);
	CHECK_EQ(write((int)(intptr_t)arg, "later", 5), 5);
}

static void reset_later(void *arg)
{
	usleep(20000);
	struct linger l = { 1, 0 }; /* close sends RST */
	CHECK(setsockopt((int)(intptr_t)arg, SOL_SOCKET, SO_LINGER, &l, sizeof l) == 0);
	close((int)(intptr_t)arg);
}

static void poll_shared(void *arg)
{
	(void)arg;
	struct pollfd p = { .fd = pr_fd, .events = POLLIN };
	CHECK_EQ(woken_poll(&p, 1), 1);
	atomic_fetch_add(&pr_done, 1);
}

static void read_after_poll(void *arg)
{
	(void)arg;
	char b[64];
	CHECK_EQ(read(pr_fd, b, sizeof b), 5);
	atomic_store(&pr_done, 1);
}

static void tcp_pair(int *c, int *s)
{
	int lfd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t al = sizeof a;
	CHECK(bind(lfd, (struct sockaddr *)&a, sizeof a) == 0 && listen(lfd, 1) == 0);
	CHECK(getsockname(lfd, (struct sockaddr *)&a, &al) == 0);
	*c = socket(AF_INET, SOCK_STREAM, 0);
	CHECK(connect(*c, (struct sockaddr *)&a, sizeof a) == 0);
	CHECK((*s = accept(lfd, NULL, NULL)) >= 0);
	close(lfd);
}

static int poll_reads_main(void *arg)
{
	(void)arg;
	int c, s, other[2];
	tcp_pair(&c, &s);
	CHECK(pipe(other) == 0);
	char b[64];
	weft_task *w = weft_spawn(write_later, (void *)(intptr_t)c);
	CHECK_EQ(read(s, b, sizeof b), 5); /* waits (s is registered), then short: s is drained */
	CHECK_EQ(weft_join(w), 0);
	w = weft_spawn(write_later, (void *)(intptr_t)c);
	struct pollfd p[2] = { { .fd = other[0], .events = POLLIN }, { .fd = s, .events = POLLIN } };
	CHECK_EQ(woken_poll(p, 2), 1);
	CHECK(p[1].revents & POLLIN);
	CHECK_EQ(weft_join(w), 0);
	pr_fd = s;
	CHECK(weft_spawn_opt(read_after_poll, NULL, &(weft_spawn_opts){ .detached = 1 }));
	for (int i = 0; i < 2000 && !atomic_load(&pr_done); i++)
		usleep(1000);
	CHECK(atomic_load(&pr_done)); /* it would wait for an edge the poll took */

	/* s is being read by a task: a poll on it waits elsewhere, and sees the other fd */
	atomic_store(&pr_done, 0);
	weft_task *r = weft_spawn(read_after_poll, NULL);
	usleep(10000);
	w = weft_spawn(write_later, (void *)(intptr_t)other[1]);
	CHECK_EQ(woken_poll(p, 2), 1);
	CHECK(p[0].revents == POLLIN && p[1].revents == 0);
	CHECK_EQ(weft_join(w), 0);
	CHECK_EQ(write(c, "later", 5), 5);
	CHECK_EQ(weft_join(r), 0);

	/* several tasks poll one pipe: one write wakes them all */
	atomic_store(&pr_done, 0);
	weft_task *many[8];
	pr_fd = other[0];
	for (int i = 0; i < 8; i++)
		many[i] = weft_spawn(poll_shared, NULL);
	usleep(10000);
	CHECK_EQ(write(other[1], "x", 1), 1);
	for (int i = 0; i < 8; i++)
		CHECK_EQ(weft_join(many[i]), 0);
	CHECK_EQ(atomic_load(&pr_done), 8);

	/* more fds than fit on the stack, one of them named 20 times */
	char x;
	CHECK_EQ(read(other[0], &x, 1), 1);
	int idle[2];
	CHECK(pipe(idle) == 0);
	struct pollfd big[21];
	for (int i = 0; i < 20; i++)
		big[i] = (struct pollfd){ .fd = idle[0], .events = POLLIN };
	big[20] = (struct pollfd){ .fd = other[0], .events = POLLIN };
	w = weft_spawn(write_later, (void *)(intptr_t)other[1]);
	CHECK_EQ(woken_poll(big, 21), 1);
	CHECK(big[0].revents == 0 && big[19].revents == 0 && big[20].revents == POLLIN);
	CHECK_EQ(weft_join(w), 0);
	close(idle[0]);
	close(idle[1]);

	/* errors alone: the peer resets the connection */
	struct pollfd e = { .fd = s, .events = 0 };
	w = weft_spawn(reset_later, (void *)(intptr_t)c);
	CHECK_EQ(woken_poll(&e, 1), 1);
	CHECK((e.revents & (POLLERR | POLLHUP)) && !(e.revents & POLLIN));
	CHECK_EQ(weft_join(w), 0);
	close(s);
	close(other[0]);
	close(other[1]);
	return 0;
}

TEST(child_poll_reads)
{
	RUN(poll_reads_main);
}

/* Stress: pollers on every worker and on plain threads, each polling two socket pairs of its
 * own, fed a byte at a time by writers that are tasks or plain threads; every byte is read
 * exactly once and every poll ends by a wake-up. */
#define POLLERS 64
#define BYTES (SLOW ? 100 : 400)
static int sp[POLLERS][2][2];

static void poller(void *arg)
{
	int i = (int)(intptr_t)arg, got = 0;
	while (got < 2 * BYTES) {
		struct pollfd p[2] = { { .fd = sp[i][0][0], .events = POLLIN },
				       { .fd = sp[i][1][0], .events = POLLIN } };
		CHECK(woken_poll(p, 2) >= 1);
		for (int k = 0; k < 2; k++) {
			char b[64];
			if (p[k].revents & POLLIN) {
				ssize_t n = read(p[k].fd, b, sizeof b);
				CHECK(n > 0);
				got += (int)n;
			}
		}
	}
	CHECK_EQ(got, 2 * BYTES);
}

static void writer(void *arg)
{
	int i = (int)(intptr_t)arg;
	for (int n = 0; n < BYTES; n++) {
		for (int k = 0; k < 2; k++)
			CHECK_EQ(write(sp[i][(n + k + i) % 2][1], "b", 1), 1);
		if (n % 7 == 0)
			usleep(100);
	}
}

static void *writer_thread(void *arg)
{
	writer(arg);
	return NULL;
}

static void *poller_thread(void *arg)
{
	poller(arg);
	return NULL;
}

/* Pair i's poller is a plain thread when i % 4 == 1, its writer when i % 4 == 0. */
static int poll_stress_main(void *arg)
{
	(void)arg;
	weft_task *t[2][POLLERS];
	pthread_t th[2][POLLERS];
	for (int i = 0; i < POLLERS; i++) {
		CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sp[i][0]) == 0);
		CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sp[i][1]) == 0);
	}
	for (int i = 0; i < POLLERS; i++) {
		void *a = (void *)(intptr_t)i;
		if (i % 4 == 1)
			CHECK(pthread_create(&th[0][i], NULL, poller_thread, a) == 0);
		else
			t[0][i] = weft_spawn(poller, a);
		if (i % 4 == 0)
			CHECK(pthread_create(&th[1][i], NULL, writer_thread, a) == 0);
		else
			t[1][i] = weft_spawn(writer, a);
	}
	for (int i = 0; i < POLLERS; i++) {
		if (i % 4 == 1)
			CHECK(pthread_join(th[0][i], NULL) == 0);
		else
			CHECK_EQ(weft_join(t[0][i]), 0);
		if (i % 4 == 0)
			CHECK(pthread_join(th[1][i], NULL) == 0);
		else
			CHECK_EQ(weft_join(t[1][i]), 0);
	}
	for (int i = 0; i < POLLERS; i++)
		for (int k = 0; k < 4; k++)
			close(sp[i][k / 2][k % 2]);
	return 0;
}

TEST(child_poll_stress)
{
	RUN(poll_stress_main);
}

/* poll(2) ended otherwise than by an edge, and polls that fall back to libc:
 * - cancelled (-1/EINTR) or timed out, its task goes on to reuse the stack its nodes were on
 *   while edges arrive on the fds it polled;
 * - an fd closed through the shim by another task: POLLNVAL at once;
 * - a regular file (epoll refuses it) or standard output among the fds: libc, on the pool;
 * - writability on two full sockets; no fds at all, or only negative ones: a sleep. */
static int pe[3][2];
static atomic_int pe_res, pe_err;

static void scribble(int depth)
{
	volatile char buf[512];
	memset((char *)buf, 0xab, sizeof buf);
	if (depth)
		scribble(depth - 1);
}

static void poll_three(void *arg)
{
	struct pollfd p[3];
	for (int i = 0; i < 3; i++)
		p[i] = (struct pollfd){ .fd = pe[i][0], .events = POLLIN };
	atomic_store(&pe_res, poll(p, 3, (int)(intptr_t)arg));
	atomic_store(&pe_err, errno);
	scribble(8); /* over the nodes, which must be off every list by now */
	usleep(30000);
	scribble(8);
}

static void drain_later_fd(void *arg)
{
	static char sink[1 << 16];
	usleep(20000);
	while (recv((int)(intptr_t)arg, sink, sizeof sink, MSG_DONTWAIT) > 0)
		;
}

static int poll_ends_main(void *arg)
{
	(void)arg;
	char b[8];
	for (int i = 0; i < 3; i++)
		CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, pe[i]) == 0);
	for (int timeout = -1; timeout <= 20; timeout += 21) { /* cancelled, then timed out */
		weft_task *t = weft_spawn(poll_three, (void *)(intptr_t)timeout);
		usleep(timeout < 0 ? 10000 : 30000);
		if (timeout < 0)
			CHECK_EQ(weft_cancel(t), 0);
		usleep(5000);
		for (int i = 0; i < 3; i++)
			CHECK_EQ(write(pe[i][1], "e", 1), 1);
		CHECK_EQ(weft_join(t), 0);
		CHECK_EQ(atomic_load(&pe_res), timeout < 0 ? -1 : 0);
		if (timeout < 0)
			CHECK_EQ(atomic_load(&pe_err), EINTR);
		for (int i = 0; i < 3; i++)
			CHECK_EQ(read(pe[i][0], b, sizeof b), 1);
	}

	weft_task *t = weft_spawn(poll_three, (void *)(intptr_t)5000);
	usleep(10000);
	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	close(pe[1][0]);
	CHECK_EQ(weft_join(t), 0);
	CHECK_EQ(atomic_load(&pe_res), 1);
	CHECK(elapsed_ms(t0) < 4000);

	int f = open("/proc/self/stat", O_RDONLY);
	struct pollfd p[2] = { { .fd = pe[0][0], .events = POLLIN }, { .fd = f, .events = POLLIN } };
	CHECK_EQ(woken_poll(p, 2), 1);
	CHECK(p[0].revents == 0 && (p[1].revents & POLLIN));
	p[1] = (struct pollfd){ .fd = 1, .events = POLLOUT };
	CHECK(poll(p, 2, 1000) >= 0);
	close(f);

	int a[2], c[2];
	CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, a) == 0 && socketpair(AF_UNIX, SOCK_STREAM, 0, c) == 0);
	static char big[1 << 16];
	while (send(a[1], big, sizeof big, MSG_DONTWAIT) > 0)
		;
	while (send(c[1], big, sizeof big, MSG_DONTWAIT) > 0)
		;
	struct pollfd out[2] = { { .fd = a[1], .events = POLLOUT }, { .fd = c[1], .events = POLLOUT } };
	t = weft_spawn(drain_later_fd, (void *)(intptr_t)c[0]);
	CHECK_EQ(woken_poll(out, 2), 1);
	CHECK(out[0].revents == 0 && (out[1].revents & POLLOUT));
	CHECK_EQ(weft_join(t), 0);

	struct pollfd neg[2] = { { .fd = -1, .events = POLLIN }, { .fd = -5, .events = POLLIN } };
	clock_gettime(CLOCK_MONOTONIC, &t0);
	CHECK_EQ(poll(neg, 2, 30), 0);
	CHECK(elapsed_ms(t0) >= 30);
	return 0;
}

TEST(child_poll_ends)
{
	RUN(poll_ends_main);
}

/* A poll woken because one of its fds is being closed (the shim's close() first wakes the fd's
 * waiters, then closes it in the kernel) must not register that fd in epoll again in between:
 * the close would drop the registration unseen, and the next fd to get that number would never
 * be registered, so a read of it would wait for ever. Made certain here by calling the two
 * halves of close() 20 ms apart. */
static int cr_fd, cr_idle[2];
static atomic_int cr_read;

static void cr_poll(void *arg)
{
	(void)arg;
	struct pollfd p[2] = { { .fd = cr_fd, .events = POLLIN }, { .fd = cr_idle[0], .events = POLLIN } };
	poll(p, 2, 200);
}

static void cr_reader(void *arg)
{
	char b[8];
	CHECK_EQ(read((int)(intptr_t)arg, b, sizeof b), 1);
	atomic_store(&cr_read, 1);
}

static int close_race_main(void *arg)
{
	(void)arg;
	int a[2], b[2];
	CHECK(pipe(cr_idle) == 0 && socketpair(AF_UNIX, SOCK_STREAM, 0, a) == 0);
	cr_fd = a[0];
	weft_task *t = weft_spawn(cr_poll, NULL);
	usleep(20000);
	poll_forget(a[0]);
	usleep(20000);
	CHECK(syscall(SYS_close, a[0]) == 0);
	CHECK_EQ(weft_join(t), 0);
	CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, b) == 0);
	CHECK_EQ(b[0], a[0]); /* the number is reused */
	CHECK(weft_spawn_opt(cr_reader, (void *)(intptr_t)b[0], &(weft_spawn_opts){ .detached = 1 }));
	usleep(20000);
	CHECK_EQ(write(b[1], "x", 1), 1);
	for (int i = 0; i < 2000 && !atomic_load(&cr_read); i++)
		usleep(1000);
	CHECK(atomic_load(&cr_read));
	return 0;
}

TEST(child_poll_close_race)
{
	RUN(close_race_main);
}

/* ---- the tests: run a child with the shim preloaded --------------------------------------- */

TEST(usleep_in_tasks_runs_concurrently)
{
	test_run_shimmed("child_usleep");
}

TEST(blocking_reads_park_only_their_task)
{
	test_run_shimmed("child_blocking_reads");
}

TEST(libc_semantics_kept_inside_and_outside_tasks)
{
	test_run_shimmed("child_libc_semantics");
}

TEST(tcp_reads_and_dontwait_keep_libc_semantics)
{
	test_run_shimmed("child_tcp");
}

TEST(poll_for_reading_and_writing_returns_when_writable)
{
	test_run_shimmed("child_poll_both_ways");
}

TEST(poll_on_several_fds_parks_the_task_not_a_pool_thread)
{
	test_run_shimmed("child_poll_chain");
}

TEST(poll_on_several_fds_with_reads_busy_fds_and_errors)
{
	test_run_shimmed("child_poll_reads");
}

TEST(poll_on_several_fds_stress_with_task_and_thread_writers)
{
	test_run_shimmed("child_poll_stress");
}

TEST(poll_ended_by_cancel_timeout_close_and_libc_fallbacks)
{
	test_run_shimmed("child_poll_ends");
}

TEST(poll_woken_by_a_close_leaves_the_fd_unregistered)
{
	test_run_shimmed("child_poll_close_race");
}

TEST(select_pselect_and_ppoll_park_the_task_with_select_semantics)
{
	test_run_shimmed("child_select");
}

/* This program links to libweft.so, the weft the shim serves: no warning (tests/io.c has the
 * static case). */
TEST(the_shim_serving_the_programs_own_weft_says_nothing)
{
	char err[4096];
	CHECK_EQ(test_spawn_shimmed("child_usleep", err, sizeof err), 0);
	CHECK(!strstr(err, "libweft-shim.so is loaded"));
}

/* ---- the shared library's names ----------------------------------------------------------- */

/* Functions of this program that happen to bear the names of weft internals, as any program's
 * may. Were libweft.so to export its internals, the dynamic linker would bind the library's own
 * calls to these (the executable's symbols come first), and spawning, parking or sleeping
 * would abort here. */
void stack_get(void);
void sched_park(void);
void timer_add(void);
void stack_get(void)
{
	abort();
}
void sched_park(void)
{
	abort();
}
void timer_add(void)
{
	abort();
}

static void napper(void *arg)
{
	(void)arg;
	CHECK_EQ(weft_sleep_until(weft_now() + 1000000), 0);
}

static int internal_names_main(void *arg)
{
	(void)arg;
	weft_task *t = weft_spawn(napper, NULL);
	CHECK(t);
	CHECK_EQ(weft_join(t), 0);
	return 0;
}

TEST(a_programs_own_names_never_stand_in_for_weft_internals)
{
	RUN(internal_names_main);
	/* what libweft.so does export: its API, and the shim's way in under reserved names */
	CHECK(dlsym(RTLD_DEFAULT, "weft_spawn"));
	CHECK(dlsym(RTLD_DEFAULT, "weft__poll_wait"));
	CHECK(!dlsym(RTLD_DEFAULT, "poll_wait") && !dlsym(RTLD_DEFAULT, "wait_park"));
}
