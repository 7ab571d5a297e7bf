/* Tests of weft_select's FD and JOIN cases beside channel cases: which case wins, what the
 * losers leave (a joinable task, an unread fd, no node on any channel or fd), deadlines,
 * cancellation, misuse, plain threads, and a stress of selects racing writes, closes and exits
 * across every worker and plain threads. Channel-only selects are tested in tests/chan.c. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "poll.h" /* poll_observers */
#include "test.h"

static void nap(int64_t ns)
{
	CHECK_EQ(weft_sleep_until(weft_now() + ns), 0);
}

static void make_pipe(int p[2])
{
	CHECK_EQ(pipe2(p, O_CLOEXEC | O_NONBLOCK), 0);
}

static void close_pipe(int p[2])
{
	CHECK_EQ(weft_close(p[0]), 0);
	CHECK_EQ(weft_close(p[1]), 0);
}

/* weft_close, in two steps TSan sees: its close(2) is a raw system call, which TSan does not
 * see, and it would take the next pipe2 to return that number in another task for a race. */
static void close_fd(int fd)
{
	poll_forget(fd);
	CHECK_EQ(close(fd), 0);
}

static void write_byte(int fd)
{
	CHECK_EQ(write(fd, "x", 1), 1);
}

static void read_byte(int fd)
{
	char c;
	CHECK_EQ(read(fd, &c, 1), 1);
}

/* A task that sleeps `arg` ns and exits. */
static void sleeper(void *arg)
{
	nap((int64_t)(intptr_t)arg);
}

/* A task that waits for a packet on `arg` (a channel) and exits. */
static void waits_for_chan(void *arg)
{
	char b[8];
	weft_chan_recv(arg, b, sizeof b, WEFT_FOREVER);
}

struct after {
	int64_t ns;
	int fd;
};

static void write_after(void *arg)
{
	struct after *a = arg;
	nap(a->ns);
	write_byte(a->fd);
}

/* ---- FD cases ---------------------------------------------------------------------------- */

static int fd_readable(void *arg)
{
	(void)arg;
	int p[2];
	make_pipe(p);
	weft_chan *c = weft_chan_new(0, 8);
	char buf[8];
	weft_select_case k[2] = { weft_select_recv(c, buf, sizeof buf),
				  weft_select_fd(p[0], EPOLLIN) };
	/* readable later: the select parks, then the fd case wins */
	struct after a = { 5 * MS, p[1] };
	weft_task *w = weft_spawn(write_after, &a);
	CHECK_EQ(weft_select(k, 2, WEFT_FOREVER), 1);
	CHECK_EQ(k[1].result, EPOLLIN);
	CHECK_EQ(weft_join(w), 0);
	CHECK_EQ(poll_observers(p[0]), 0);
	CHECK_EQ(weft_chan_waiting(c), 0);
	/* the case only looks: the byte is still there, and it answers at once */
	CHECK_EQ(weft_select(k, 2, 0), 1);
	CHECK_EQ(weft_select(k, 2, 0), 1);
	read_byte(p[0]);
	CHECK_EQ(weft_select(k, 2, weft_now() + MS), -ETIMEDOUT);
	/* the same fd in two cases, and a reader of it elsewhere: both allowed */
	weft_select_case two[2] = { weft_select_fd(p[0], EPOLLIN), weft_select_fd(p[0], EPOLLIN) };
	w = weft_spawn(write_after, &a);
	int r = weft_select(two, 2, WEFT_FOREVER);
	CHECK(r == 0 || r == 1);
	CHECK_EQ(two[r].result, EPOLLIN);
	CHECK_EQ(weft_join(w), 0);
	CHECK_EQ(poll_observers(p[0]), 0);
	read_byte(p[0]);
	/* an fd switched off with -1 is never chosen */
	weft_select_case off[1] = { weft_select_fd(-1, EPOLLIN) };
	CHECK_EQ(weft_select(off, 1, weft_now() + MS), -ETIMEDOUT);
	weft_chan_free(c);
	close_pipe(p);
	return 0;
}

TEST(select_fd_readable_wins_and_reads_nothing)
{
	RUN(fd_readable);
}

static void drain_after(void *arg)
{
	struct after *a = arg;
	nap(a->ns);
	char buf[4096];
	while (read(a->fd, buf, sizeof buf) > 0)
		;
}

static int fd_writable(void *arg)
{
	(void)arg;
	int sv[2];
	CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
	weft_select_case k[1] = { weft_select_fd(sv[0], EPOLLOUT) };
	CHECK_EQ(weft_select(k, 1, 0), 0); /* empty buffer: writable at once */
	CHECK_EQ(k[0].result, EPOLLOUT);
	char junk[4096] = { 0 };
	while (write(sv[0], junk, sizeof junk) > 0)
		;
	CHECK_EQ(weft_select(k, 1, weft_now() + 2 * MS), -ETIMEDOUT);
	CHECK_EQ(poll_observers(sv[0]), 0);
	struct after a = { 5 * MS, sv[1] };
	weft_task *d = weft_spawn(drain_after, &a);
	CHECK_EQ(weft_select(k, 1, WEFT_FOREVER), 0);
	CHECK(k[0].result & EPOLLOUT);
	CHECK_EQ(weft_join(d), 0);
	/* both directions in one case */
	k[0] = weft_select_fd(sv[0], EPOLLIN | EPOLLOUT);
	CHECK_EQ(weft_select(k, 1, 0), 0);
	CHECK_EQ(k[0].result, EPOLLOUT);
	CHECK_EQ(weft_close(sv[0]), 0);
	CHECK_EQ(weft_close(sv[1]), 0);
	return 0;
}

TEST(select_fd_writable_wins)
{
	RUN(fd_writable);
}

static void close_after(void *arg)
{
	struct after *a = arg;
	nap(a->ns);
	CHECK_EQ(weft_close(a->fd), 0);
}

/* A closed fd: POLLNVAL for poll(2), -EBADF here; and a peer's close is a hang-up. */
static int fd_closed(void *arg)
{
	(void)arg;
	int p[2];
	make_pipe(p);
	weft_select_case k[1] = { weft_select_fd(p[0], EPOLLIN) };
	struct after a = { 5 * MS, p[1] };
	weft_task *t = weft_spawn(close_after, &a);
	CHECK_EQ(weft_select(k, 1, WEFT_FOREVER), 0);
	CHECK(k[0].result & EPOLLHUP);
	CHECK_EQ(weft_join(t), 0);
	CHECK_EQ(weft_close(p[0]), 0);
	make_pipe(p);
	a.fd = p[0]; /* closed through weft while the select waits on it */
	t = weft_spawn(close_after, &a);
	k[0] = weft_select_fd(p[0], EPOLLIN);
	CHECK_EQ(weft_select(k, 1, WEFT_FOREVER), 0);
	CHECK_EQ(k[0].result, -EBADF);
	CHECK_EQ(weft_join(t), 0);
	k[0] = weft_select_fd(p[0], EPOLLIN); /* and not open any more */
	CHECK_EQ(weft_select(k, 1, WEFT_FOREVER), 0);
	CHECK_EQ(k[0].result, -EBADF);
	CHECK_EQ(weft_close(p[1]), 0);
	return 0;
}

TEST(select_fd_closed_says_ebadf_and_hangup)
{
	RUN(fd_closed);
}

/* ---- JOIN cases -------------------------------------------------------------------------- */

static int join_wins(void *arg)
{
	(void)arg;
	weft_chan *c = weft_chan_new(0, 8);
	char buf[8];
	weft_task *t = weft_spawn(sleeper, (void *)(intptr_t)(5 * MS));
	weft_select_case k[2] = { weft_select_recv(c, buf, sizeof buf), weft_select_join(t) };
	CHECK_EQ(weft_select(k, 2, WEFT_FOREVER), 1);
	CHECK_EQ(k[1].result, 0);
	CHECK_EQ(weft_join(t), -ESRCH); /* joined by the select, released */
	/* a task that has already ended is joined at once */
	t = weft_spawn(sleeper, 0);
	nap(2 * MS);
	k[1] = weft_select_join(t);
	CHECK_EQ(weft_select(k, 2, 0), 1);
	CHECK_EQ(weft_join(t), -ESRCH);
	CHECK_EQ(weft_chan_waiting(c), 0);
	weft_chan_free(c);
	return 0;
}

TEST(select_join_exit_wins_and_joins_exactly_then)
{
	RUN(join_wins);
}

static int join_loses(void *arg)
{
	(void)arg;
	weft_chan *c = weft_chan_new(0, 8), *d = weft_chan_new(1, 8);
	char buf[8];
	weft_task *t = weft_spawn(waits_for_chan, c);
	weft_select_case k[2] = { weft_select_recv(d, buf, sizeof buf), weft_select_join(t) };
	CHECK_EQ(weft_chan_send(d, "a", 1, WEFT_FOREVER), 0);
	CHECK_EQ(weft_select(k, 2, WEFT_FOREVER), 0); /* the channel wins: t still runs */
	CHECK_EQ(weft_select(k, 2, weft_now() + 2 * MS), -ETIMEDOUT);
	CHECK_EQ(weft_chan_send(c, "b", 1, WEFT_FOREVER), 0);
	CHECK_EQ(weft_join(t), 0); /* it stayed joinable, and the slot is free again */
	/* both ready: either may win, and t is joined only if its case did */
	for (int i = 0; i < 200; i++) {
		t = weft_spawn(sleeper, 0);
		CHECK_EQ(weft_join(t), 0);
		k[1] = weft_select_join(t); /* gone */
		CHECK_EQ(weft_select(k, 2, 0), -ESRCH);
		t = weft_spawn(sleeper, 0);
		nap(100000);
		k[1] = weft_select_join(t);
		CHECK_EQ(weft_chan_send(d, "a", 1, WEFT_FOREVER), 0);
		int r = weft_select(k, 2, WEFT_FOREVER);
		CHECK(r == 0 || r == 1);
		if (r == 1) {
			CHECK_EQ(weft_join(t), -ESRCH);
			CHECK_EQ(weft_chan_recv(d, buf, sizeof buf, 0), 1);
		} else {
			CHECK_EQ(weft_join(t), 0);
		}
	}
	weft_chan_free(c);
	weft_chan_free(d);
	return 0;
}

TEST(select_join_loser_stays_joinable)
{
	RUN(join_loses);
}

/* ---- deadlines, cancellation ------------------------------------------------------------- */

static int times_out(void *arg)
{
	(void)arg;
	int p[2];
	make_pipe(p);
	weft_chan *c = weft_chan_new(0, 8);
	weft_task *t = weft_spawn(waits_for_chan, c);
	while (weft_chan_waiting(c) == 0)
		nap(MS);
	char buf[8];
	weft_select_case k[3] = { weft_select_recv(c, buf, sizeof buf),
				  weft_select_fd(p[0], EPOLLIN), weft_select_join(t) };
	int64_t d = weft_now() + 5 * MS;
	CHECK_EQ(weft_select(k, 3, d), -ETIMEDOUT);
	CHECK(weft_now() >= d);
	CHECK_EQ(weft_select(k, 3, 0), -ETIMEDOUT); /* a deadline past only looks */
	CHECK_EQ(poll_observers(p[0]), 0);
	CHECK_EQ(weft_chan_waiting(c), 1); /* t's receive, not ours */
	CHECK_EQ(weft_chan_send(c, "a", 1, WEFT_FOREVER), 0);
	CHECK_EQ(weft_join(t), 0);
	weft_chan_free(c);
	close_pipe(p);
	return 0;
}

TEST(select_fd_join_chan_times_out_and_leaves_nothing)
{
	RUN(times_out);
}

enum { CANCELLED = 40 };
static int cp[2];
static weft_chan *cc;
static weft_task *ct;
static atomic_int c_started, c_cancelled;

static void select_until_cancelled(void *arg)
{
	(void)arg;
	char buf[8];
	weft_select_case k[3] = { weft_select_recv(cc, buf, sizeof buf),
				  weft_select_fd(cp[0], EPOLLIN), weft_select_join(ct) };
	atomic_fetch_add(&c_started, 1);
	/* only one of them may hold ct's joiner slot: the others are told so */
	int r = weft_select(k, 3, WEFT_FOREVER);
	if (r == -EBUSY) {
		k[2].task = NULL;
		r = weft_select(k, 3, WEFT_FOREVER);
	}
	CHECK_EQ(r, -ECANCELED);
	atomic_fetch_add(&c_cancelled, 1);
}

static int cancel_leaves_nothing(void *arg)
{
	(void)arg;
	make_pipe(cp);
	cc = weft_chan_new(0, 8);
	weft_chan *hold = weft_chan_new(0, 8);
	ct = weft_spawn(waits_for_chan, hold);
	weft_task *t[CANCELLED];
	for (int i = 0; i < CANCELLED; i++)
		t[i] = weft_spawn(select_until_cancelled, NULL);
	test_await(&c_started, CANCELLED);
	while (weft_chan_waiting(cc) < CANCELLED || poll_observers(cp[0]) < CANCELLED)
		nap(MS);
	CHECK_EQ(weft_join_until(ct, 0), -EBUSY); /* a select holds its slot */
	for (int i = 0; i < CANCELLED; i++)
		CHECK_EQ(weft_cancel(t[i]), 0);
	for (int i = 0; i < CANCELLED; i++)
		CHECK_EQ(weft_join(t[i]), 0);
	CHECK_EQ(atomic_load(&c_cancelled), CANCELLED);
	CHECK_EQ(weft_chan_waiting(cc), 0);
	CHECK_EQ(poll_observers(cp[0]), 0);
	CHECK_EQ(weft_chan_send(hold, "a", 1, WEFT_FOREVER), 0);
	CHECK_EQ(weft_join(ct), 0); /* its slot was given back */
	weft_chan_free(cc);
	weft_chan_free(hold);
	close_pipe(cp);
	return 0;
}

TEST(select_cancelled_leaves_no_waiter_anywhere)
{
	RUN(cancel_leaves_nothing);
}

/* ---- misuse ------------------------------------------------------------------------------ */

static void joiner(void *arg)
{
	weft_join(arg);
}

static int misuse(void *arg)
{
	(void)arg;
	weft_chan *hold = weft_chan_new(0, 8), *hold2 = weft_chan_new(0, 8);
	weft_task *t = weft_spawn(waits_for_chan, hold);
	weft_select_case k[2] = { weft_select_join(t), weft_select_join(t) };
	CHECK_EQ(weft_select(k, 2, 0), -EINVAL); /* one task in two cases */
	k[0] = weft_select_join(weft_self());
	CHECK_EQ(weft_select(k, 1, 0), -EINVAL); /* oneself */
	weft_spawn_opts o = { .detached = 1 };
	k[0] = weft_select_join(weft_spawn_opt(waits_for_chan, hold2, &o));
	CHECK_EQ(weft_select(k, 1, 0), -EINVAL);
	CHECK_EQ(weft_chan_send(hold2, "a", 1, WEFT_FOREVER), 0);
	k[0] = weft_select_fd(0, 0);
	CHECK_EQ(weft_select(k, 1, 0), -EINVAL);
	k[0] = weft_select_fd(0, EPOLLIN | EPOLLET);
	CHECK_EQ(weft_select(k, 1, 0), -EINVAL);
	k[0] = weft_select_join(t);
	k[0].op = 99;
	CHECK_EQ(weft_select(k, 1, 0), -EINVAL);
	/* t is being joined by someone else: -EBUSY, and nothing of ours stays behind */
	weft_task *j = weft_spawn(joiner, t);
	while (weft_join_until(t, 0) != -EBUSY) /* until the joiner holds t's slot */
		nap(MS);
	int p[2];
	make_pipe(p);
	write_byte(p[1]);
	weft_select_case m[2] = { weft_select_fd(p[0], EPOLLIN), weft_select_join(t) };
	CHECK_EQ(weft_select(m, 2, WEFT_FOREVER), -EBUSY);
	CHECK_EQ(poll_observers(p[0]), 0);
	CHECK_EQ(weft_chan_send(hold, "a", 1, WEFT_FOREVER), 0);
	CHECK_EQ(weft_join(j), 0);
	CHECK_EQ(weft_select(m, 2, 0), -ESRCH); /* joined by the joiner */
	weft_chan_free(hold);
	weft_chan_free(hold2);
	close_pipe(p);
	return 0;
}

TEST(select_misuse_gets_errno)
{
	RUN(misuse);
}

/* ---- plain threads ----------------------------------------------------------------------- */

static int tp[2];
static weft_chan *tc;
static weft_task *tt;
static atomic_int t_ready, t_done;

static void *thread_selects(void *arg)
{
	(void)arg;
	char buf[8];
	weft_select_case k[3] = { weft_select_recv(tc, buf, sizeof buf),
				  weft_select_fd(tp[0], EPOLLIN), weft_select_join(tt) };
	atomic_store(&t_ready, 1);
	CHECK_EQ(weft_select(k, 3, WEFT_FOREVER), 1); /* the fd, written by a task */
	CHECK_EQ(k[1].result, EPOLLIN);
	read_byte(tp[0]);
	atomic_store(&t_ready, 2);
	CHECK_EQ(weft_select(k, 3, WEFT_FOREVER), 2); /* the task's exit */
	k[2].task = NULL;
	CHECK_EQ(weft_select(k, 3, weft_now() + MS), -ETIMEDOUT);
	atomic_store(&t_done, 1);
	return NULL;
}

static int from_thread(void *arg)
{
	(void)arg;
	make_pipe(tp);
	tc = weft_chan_new(0, 8);
	weft_chan *hold = weft_chan_new(0, 8);
	tt = weft_spawn(waits_for_chan, hold);
	pthread_t th;
	CHECK_EQ(pthread_create(&th, NULL, thread_selects, NULL), 0);
	test_await(&t_ready, 1);
	nap(5 * MS); /* every worker goes idle while the thread waits */
	write_byte(tp[1]);
	test_await(&t_ready, 2);
	nap(5 * MS);
	CHECK_EQ(weft_chan_send(hold, "a", 1, WEFT_FOREVER), 0);
	test_await(&t_done, 1); /* never block a worker in pthread_join */
	CHECK_EQ(pthread_join(th, NULL), 0);
	CHECK_EQ(weft_join(tt), -ESRCH);
	CHECK_EQ(poll_observers(tp[0]), 0);
	weft_chan_free(tc);
	weft_chan_free(hold);
	close_pipe(tp);
	return 0;
}

TEST(select_fd_and_join_from_a_plain_thread)
{
	RUN(from_thread);
}

/* Before any weft_run nobody polls: an FD case sees what is ready when the select looks, and
 * an fd not ready is no error (it said -EBADF: epoll had no instance to register it in). */
TEST(select_fd_before_any_run_looks_and_times_out)
{
	int p[2];
	CHECK_EQ(pipe(p), 0);
	weft_select_case k = weft_select_fd(p[0], EPOLLIN);
	int64_t t0 = weft_now();
	CHECK_EQ(weft_select(&k, 1, t0 + 50 * MS), -ETIMEDOUT);
	CHECK(weft_now() - t0 >= 50 * MS);
	CHECK_EQ(write(p[1], "x", 1), 1);
	CHECK_EQ(weft_select(NULL, 0, INT64_MIN), -ETIMEDOUT); /* a past deadline, as any other */
	k = weft_select_fd(p[0], EPOLLIN);
	CHECK_EQ(weft_select(&k, 1, weft_now() + 50 * MS), 0);
	CHECK(k.result & EPOLLIN);
	close(p[0]);
	close(p[1]);
}

/* ---- stress ------------------------------------------------------------------------------
 * Each selector, task or plain thread, runs rounds of: a pipe, a channel, and a task X that
 * does one thing - writes a byte, sends a packet, closes the pipe's write end, closes the
 * channel, or nothing - after a moment and exits. The selector waits for the first of: the
 * packet, the pipe readable, X's exit. Then it checks what the losers left: X joinable exactly
 * when its case lost, the byte still there when the fd lost, no node on the channel (freeing
 * it would abort) or the fd, and counts packets and bytes sent against those taken. */

enum { TASK_SELECTORS = 4, THREAD_SELECTORS = 2 };
static int rounds(void)
{
	return test_emulated() ? 100 : SLOW ? 300 : 2000;
}

struct round {
	int p[2];
	weft_chan *c;
	int action;
	int64_t delay;
};

enum { ACT_WRITE, ACT_SEND, ACT_HANGUP, ACT_CLOSE_CHAN, ACT_EXIT, ACTS };
static atomic_long sent, taken, written, read_back, joins_select, joins_after, spawned;
static atomic_int selectors_done;
static weft_chan *spawn_req;

struct spawn_req {
	struct round *r;
	weft_chan *reply;
};

static void x_task(void *arg)
{
	struct round *r = arg;
	if (r->delay)
		nap(r->delay);
	switch (r->action) {
	case ACT_WRITE:
		write_byte(r->p[1]);
		atomic_fetch_add(&written, 1);
		break;
	case ACT_SEND:
		CHECK_EQ(weft_chan_send(r->c, "pkt", 3, WEFT_FOREVER), 0);
		atomic_fetch_add(&sent, 1);
		break;
	case ACT_HANGUP:
		close_fd(r->p[1]);
		r->p[1] = -1;
		break;
	case ACT_CLOSE_CHAN:
		weft_chan_close(r->c);
		break;
	}
}

static weft_task *spawn_x(struct round *r)
{
	atomic_fetch_add(&spawned, 1);
	if (weft_self())
		return weft_spawn(x_task, r);
	weft_task *t;
	struct spawn_req q = { r, weft_chan_new(0, sizeof t) };
	CHECK_EQ(weft_chan_send(spawn_req, &q, sizeof q, WEFT_FOREVER), 0);
	CHECK_EQ(weft_chan_recv(q.reply, &t, sizeof t, WEFT_FOREVER), (int)sizeof t);
	weft_chan_free(q.reply);
	return t;
}

/* Spawns X tasks for the plain threads, which cannot. */
static void spawner(void *arg)
{
	(void)arg;
	struct spawn_req q;
	while (weft_chan_recv(spawn_req, &q, sizeof q, WEFT_FOREVER) == (int)sizeof q) {
		weft_task *t = weft_spawn(x_task, q.r);
		CHECK(t);
		CHECK_EQ(weft_chan_send(q.reply, &t, sizeof t, WEFT_FOREVER), 0);
	}
}

static void one_round(uint32_t seed)
{
	struct round r = { .action = (int)(seed % ACTS), .delay = (seed >> 8) % 4 ? 0 : 20000 };
	make_pipe(r.p);
	CHECK((r.c = weft_chan_new(0, 8)));
	weft_task *x = spawn_x(&r);
	char buf[8];
	weft_select_case k[3] = { weft_select_recv(r.c, buf, sizeof buf),
				  weft_select_fd(r.p[0], EPOLLIN), weft_select_join(x) };
	bool timed = (seed >> 12) % 2;
	int i;
	while ((i = weft_select(k, 3, timed ? weft_now() + 30000 : WEFT_FOREVER)) == -ETIMEDOUT)
		CHECK_EQ(poll_observers(r.p[0]), 0);
	CHECK(i >= 0 && i < 3);
	CHECK_EQ(poll_observers(r.p[0]), 0);
	if (i == 0) {
		if (r.action == ACT_SEND) {
			CHECK_EQ(k[0].result, 3);
			atomic_fetch_add(&taken, 1);
		} else {
			CHECK_EQ(r.action, ACT_CLOSE_CHAN);
			CHECK_EQ(k[0].result, -EPIPE);
		}
	} else if (i == 1) {
		CHECK(r.action == ACT_WRITE || r.action == ACT_HANGUP);
		CHECK(k[1].result & (r.action == ACT_WRITE ? EPOLLIN : EPOLLHUP));
	} else {
		CHECK_EQ(k[2].result, 0);
		CHECK(r.action != ACT_SEND); /* X cannot end before its packet is taken */
		atomic_fetch_add(&joins_select, 1);
	}
	if (i != 2) {
		CHECK_EQ(weft_join(x), 0);
		atomic_fetch_add(&joins_after, 1);
	} else {
		CHECK_EQ(weft_join(x), -ESRCH);
	}
	if (r.action == ACT_WRITE) {
		read_byte(r.p[0]); /* still there, whoever won */
		atomic_fetch_add(&read_back, 1);
	}
	CHECK_EQ(weft_chan_waiting(r.c), 0);
	weft_chan_free(r.c);
	close_fd(r.p[0]);
	if (r.p[1] >= 0)
		close_fd(r.p[1]);
}

static uint32_t next_seed(uint32_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 17;
	*s ^= *s << 5;
	return *s;
}

static void task_selector(void *arg)
{
	uint32_t s = (uint32_t)(uintptr_t)arg * 2654435761u + 1;
	for (int n = rounds(); n > 0; n--)
		one_round(next_seed(&s));
	atomic_fetch_add(&selectors_done, 1);
}

static void *thread_selector(void *arg)
{
	task_selector(arg);
	return NULL;
}

static int stress(void *arg)
{
	(void)arg;
	spawn_req = weft_chan_new(0, sizeof(struct spawn_req));
	weft_task *sp = weft_spawn(spawner, NULL);
	weft_task *t[TASK_SELECTORS];
	pthread_t th[THREAD_SELECTORS];
	for (int i = 0; i < THREAD_SELECTORS; i++)
		CHECK_EQ(pthread_create(&th[i], NULL, thread_selector, (void *)(uintptr_t)(100 + i)), 0);
	for (int i = 0; i < TASK_SELECTORS; i++)
		t[i] = weft_spawn(task_selector, (void *)(uintptr_t)i);
	for (int i = 0; i < TASK_SELECTORS; i++)
		CHECK_EQ(weft_join(t[i]), 0);
	while (atomic_load(&selectors_done) < TASK_SELECTORS + THREAD_SELECTORS)
		nap(MS);
	for (int i = 0; i < THREAD_SELECTORS; i++)
		CHECK_EQ(pthread_join(th[i], NULL), 0);
	weft_chan_close(spawn_req);
	CHECK_EQ(weft_join(sp), 0);
	weft_chan_free(spawn_req);
	CHECK_EQ(atomic_load(&sent), atomic_load(&taken));
	CHECK_EQ(atomic_load(&written), atomic_load(&read_back));
	CHECK_EQ(atomic_load(&joins_select) + atomic_load(&joins_after), atomic_load(&spawned));
	CHECK_EQ(atomic_load(&spawned), (long)rounds() * (TASK_SELECTORS + THREAD_SELECTORS));
	CHECK(atomic_load(&joins_select) > 0); /* each kind of case won some rounds */
	CHECK(atomic_load(&joins_after) > 0);
	CHECK_EQ(poll_waiters(), 0);
	return 0;
}

TEST(select_stress_fds_joins_chans_exactly_once)
{
	RUN(stress);
}
