/*
 * shim.c - libweft-shim.so: blocking libc calls made inside a weft task become task waits.
 *
 * Loaded with LD_PRELOAD (or linked before libc), it defines sleep, usleep, nanosleep,
 * clock_nanosleep, read, write, readv, writev, recv, recvfrom, recvmsg, send, sendto, sendmsg,
 * accept, accept4, connect, poll, ppoll, select and pselect. Called from a task, each parks
 * the task instead of the worker (on a deadline, or on its fds through the poller). Called from
 * any other thread, or from a task whose thread holds a pthread lock (see may_park: the shim
 * also defines the pthread lock calls, to count the locks held), each goes to libc and blocks
 * the thread as libc would. Return values and errno are libc's; a task cancelled in such a
 * call sees -1/EINTR.
 *
 * To wait on an fd weft makes it non-blocking in the kernel, so the shim also keeps up the
 * program's own view of O_NONBLOCK: fcntl(F_GETFL/F_SETFL) and ioctl(FIONBIO) read and write
 * that view, calls on an fd the program believes non-blocking still fail with EAGAIN, and a
 * plain thread using an fd weft made non-blocking behind its back is made to wait as before.
 * close() forgets the fd (and wakes its waiters with EBADF). Standard input, output and error
 * are left alone: their open file may be shared with other processes (a shell's terminal or
 * pipe), which must not find it non-blocking.
 *
 * The shim must share the program's weft: use it with programs linked to libweft.so (weft_run
 * warns in one that has weft linked in statically, which weft__shim_runtime tells it).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "poll.h"
#include "weft.h"

/* real_NAME: libc's NAME, looked up once (threads racing here store the same value). */
#define REAL(name)                                                                      \
	static __typeof__(&name) real_##name##_p;                                       \
	__typeof__(&name) real_##name = __atomic_load_n(&real_##name##_p, __ATOMIC_RELAXED); \
	if (!real_##name) {                                                             \
		real_##name = (__typeof__(&name))dlsym(RTLD_NEXT, #name);               \
		__atomic_store_n(&real_##name##_p, real_##name, __ATOMIC_RELAXED);      \
	}

/* The weft whose tasks the shim serves: libweft.so's (see check_shim in sched.c). */
__attribute__((visibility("default"))) const void *weft__shim_runtime(void)
{
	return sched_runtime();
}

/*
 * A pthread lock belongs to the thread that took it. A task that parked in one of the calls
 * below while holding one would leave its worker to run other tasks, which then hold the lock
 * as far as pthreads can tell (a recursive mutex lets them in, an error-checking one refuses
 * the holder its unlock), and would resume, perhaps, on a thread that does not hold it. sqlite
 * holds its connection's recursive mutex across the usleep of its busy handler: 200 tasks each
 * with a connection, beside one holding the database locked, hung with every worker in
 * pthread_mutex_lock. So the shim also defines the pthread lock calls (below) and counts, per
 * thread, the locks taken and not yet released through them; while the count is not 0 the
 * calls here go to libc and block the thread, as Go's system calls block their thread, and the
 * monitor, seeing the worker blocked in the kernel with work queued, gives that work to another
 * thread within a millisecond or two (monitor.c, held_long).
 *
 * Per thread, not per task: a task that holds a lock keeps its thread (the shim does not park
 * it), so the thread's count is the task's. One that parks anyway, in weft's own calls (a
 * channel, a weft_mutex), with a pthread lock held is already wrong, lock and all; its count
 * stays with the thread it left, whose calls then block rather than park: slower, never
 * unsafe. An unlock with the count at 0 (a lock taken before the shim was loaded, or unlocked
 * by another thread than took it) leaves it at 0. pthread_cond_wait releases and takes its
 * mutex back inside libc, not through here: the count stays, as the lock does. Locks libc
 * takes within its own calls (malloc's arenas, stdio's) never pass through here either, nor
 * need to: none is held when the call returns.
 */
static __thread unsigned locks_held __attribute__((tls_model("initial-exec")));

/* Whether a call here may park the caller: it is a task, and its thread holds no pthread
 * lock. Otherwise the call is libc's, made as a plain thread would make it. */
static bool may_park(void)
{
	return !locks_held && weft_self() != NULL;
}

/* Turn a weft result into libc's -1/errno. */
static long fail(int err)
{
	errno = err == -ECANCELED ? EINTR : -err;
	return -1;
}

/* ---- sleeping ---------------------------------------------------------------------------- */

static int sleep_ns(int64_t ns, struct timespec *rem)
{
	int64_t deadline = weft_now() + ns;
	int r = weft_sleep_until(deadline);
	if (r == 0)
		return 0;
	if (rem) {
		int64_t left = deadline - weft_now();
		left = left < 0 ? 0 : left;
		*rem = (struct timespec){ left / 1000000000, left % 1000000000 };
	}
	return r;
}

unsigned int sleep(unsigned int s)
{
	REAL(sleep);
	if (!may_park())
		return real_sleep(s);
	struct timespec rem = { 0, 0 };
	return sleep_ns((int64_t)s * 1000000000, &rem) ? (unsigned)rem.tv_sec + (rem.tv_nsec > 0) : 0;
}

int usleep(useconds_t us)
{
	REAL(usleep);
	if (!may_park())
		return real_usleep(us);
	int r = sleep_ns((int64_t)us * 1000, NULL);
	return r ? (int)fail(r) : 0;
}

int nanosleep(const struct timespec *req, struct timespec *rem)
{
	REAL(nanosleep);
	if (!may_park())
		return real_nanosleep(req, rem);
	if (!req || req->tv_nsec < 0 || req->tv_nsec >= 1000000000 || req->tv_sec < 0)
		return (int)fail(-EINVAL);
	int r = sleep_ns((int64_t)req->tv_sec * 1000000000 + req->tv_nsec, rem);
	return r ? (int)fail(r) : 0;
}

int clock_nanosleep(clockid_t clk, int flags, const struct timespec *req, struct timespec *rem)
{
	REAL(clock_nanosleep);
	if (!may_park() || (clk != CLOCK_MONOTONIC && clk != CLOCK_REALTIME))
		return real_clock_nanosleep(clk, flags, req, rem);
	if (!req || req->tv_nsec < 0 || req->tv_nsec >= 1000000000)
		return EINVAL;
	int64_t ns = (int64_t)req->tv_sec * 1000000000 + req->tv_nsec;
	if (flags & TIMER_ABSTIME) { /* make it relative to its own clock */
		struct timespec now;
		clock_gettime(clk, &now);
		ns -= (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
		rem = NULL;
	}
	int r = sleep_ns(ns, rem);
	return r == -ECANCELED ? EINTR : -r;
}

/* ---- file descriptors -------------------------------------------------------------------- */

static void real_poll_wait(struct pollfd *p)
{
	REAL(poll);
	real_poll(p, 1, -1);
}

/* A plain thread on an fd weft made non-blocking behind the program's back: wait as the
 * blocking call would have. */
static bool thread_should_wait(int fd, long r)
{
	return r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && poll_user_nonblock(fd) == 0;
}

/*
 * The body of every fd call: `call` is the libc call, `ev` the direction, `len` for a read the
 * bytes it asks for (weft's drained-reads rule, poll.c; 0 for other calls), `nowait` whether
 * the caller said MSG_DONTWAIT (then the call is made once, as libc would).
 * In a task: make the fd non-blocking, retry the call while it would block and the program
 * believes the fd blocking, parking on the fd in between.
 */
#define FD_CALL(fd, ev, len, nowait, call)                                                 \
	do {                                                                               \
		size_t len_ = (len); /* first: it may turn the rule off (recv_len) */      \
		if (nowait)                                                                \
			return (long)(call);                                               \
		if (!may_park()) {                                                         \
			for (;;) {                                                         \
				long r_ = (long)(call);                                    \
				if (!thread_should_wait(fd, r_))                           \
					return r_;                                         \
				struct pollfd p_ = { .fd = fd,                             \
						     .events = ev == EPOLLIN ? POLLIN : POLLOUT }; \
				real_poll_wait(&p_);                                       \
			}                                                                  \
		}                                                                          \
		if (fd <= 2 || poll_manage(fd) < 0)                                        \
			return (long)(call);                                               \
		int w_ = len_ && poll_user_nonblock(fd) != 1 ? poll_read_wait(fd, WEFT_FOREVER)  \
							     : 1;                             \
		if (w_ < 0)                                                                \
			return fail(w_);                                                   \
		for (;;) {                                                                 \
			uint32_t tok_ = len_ ? poll_read_token(fd) : 0;                    \
			long r_ = (long)(call);                                            \
			if (r_ > 0 && (size_t)r_ < len_)                                   \
				poll_read_short(fd, tok_);                                 \
			if (r_ >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK) ||        \
			    poll_user_nonblock(fd) == 1)                                   \
				return r_;                                                 \
			if ((w_ = poll_wait(fd, ev, WEFT_FOREVER)) < 0)                    \
				return fail(w_);                                           \
		}                                                                          \
	} while (0)

ssize_t read(int fd, void *buf, size_t n)
{
	REAL(read);
	FD_CALL(fd, EPOLLIN, n, false, real_read(fd, buf, n));
}

ssize_t write(int fd, const void *buf, size_t n)
{
	REAL(write);
	FD_CALL(fd, EPOLLOUT, 0, false, real_write(fd, buf, n));
}

ssize_t readv(int fd, const struct iovec *iov, int n)
{
	REAL(readv);
	FD_CALL(fd, EPOLLIN, iov_total(iov, n), false, real_readv(fd, iov, n));
}

ssize_t writev(int fd, const struct iovec *iov, int n)
{
	REAL(writev);
	FD_CALL(fd, EPOLLOUT, 0, false, real_writev(fd, iov, n));
}

ssize_t recv(int fd, void *buf, size_t n, int flags)
{
	REAL(recv);
	FD_CALL(fd, EPOLLIN, recv_len(fd, n, flags), flags & MSG_DONTWAIT, real_recv(fd, buf, n, flags));
}

ssize_t recvfrom(int fd, void *buf, size_t n, int flags, struct sockaddr *a, socklen_t *l)
{
	REAL(recvfrom);
	FD_CALL(fd, EPOLLIN, recv_len(fd, n, flags), flags & MSG_DONTWAIT,
		real_recvfrom(fd, buf, n, flags, a, l));
}

ssize_t recvmsg(int fd, struct msghdr *m, int flags)
{
	REAL(recvmsg);
	FD_CALL(fd, EPOLLIN, recv_len(fd, 0, flags), flags & MSG_DONTWAIT, real_recvmsg(fd, m, flags));
}

ssize_t send(int fd, const void *buf, size_t n, int flags)
{
	REAL(send);
	FD_CALL(fd, EPOLLOUT, 0, flags & MSG_DONTWAIT, real_send(fd, buf, n, flags));
}

ssize_t sendto(int fd, const void *buf, size_t n, int flags, const struct sockaddr *a,
	       socklen_t l)
{
	REAL(sendto);
	FD_CALL(fd, EPOLLOUT, 0, flags & MSG_DONTWAIT, real_sendto(fd, buf, n, flags, a, l));
}

ssize_t sendmsg(int fd, const struct msghdr *m, int flags)
{
	REAL(sendmsg);
	FD_CALL(fd, EPOLLOUT, 0, flags & MSG_DONTWAIT, real_sendmsg(fd, m, flags));
}

int accept4(int fd, struct sockaddr *a, socklen_t *l, int flags)
{
	REAL(accept4);
	FD_CALL(fd, EPOLLIN, 0, false, real_accept4(fd, a, l, flags));
}

int accept(int fd, struct sockaddr *a, socklen_t *l)
{
	REAL(accept);
	FD_CALL(fd, EPOLLIN, 0, false, real_accept(fd, a, l));
}

int connect(int fd, const struct sockaddr *a, socklen_t l)
{
	REAL(connect);
	if (!may_park()) { /* a connect weft made non-blocking behind the program's back waits */
		int r = real_connect(fd, a, l);
		if (r == 0 || (errno != EINPROGRESS && errno != EAGAIN && errno != EINTR) ||
		    poll_user_nonblock(fd) != 0)
			return r;
		struct pollfd p = { .fd = fd, .events = POLLOUT };
		real_poll_wait(&p);
		int err = 0;
		socklen_t len = sizeof err;
		if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
			return -1;
		return err ? (int)fail(-err) : 0;
	}
	if (poll_manage(fd) < 0 || poll_user_nonblock(fd) == 1)
		return real_connect(fd, a, l);
	int r = weft_connect(fd, a, l, WEFT_FOREVER);
	return r ? (int)fail(r) : 0;
}

/* poll(2) parks the task on all its fds at once (poll_fds). On the blocking pool instead, where
 * weft must not or cannot wait: standard input, output or error among the fds (weft leaves
 * them blocking, see FD_CALL), or an fd epoll refuses. */
struct poll_job {
	struct pollfd *fds;
	nfds_t n;
	int timeout, result, err;
};

static void poll_job(void *p)
{
	REAL(poll);
	struct poll_job *j = p;
	j->result = real_poll(j->fds, j->n, j->timeout);
	j->err = errno;
}

static int poll_on_pool(struct pollfd *fds, nfds_t n, int64_t deadline)
{
	struct poll_job j = { fds, n, -1, 0, 0 };
	if (deadline != WEFT_FOREVER) {
		int64_t left = deadline - weft_now();
		j.timeout = left <= 0 ? 0 : (int)((left + 999999) / 1000000);
	}
	int err = weft_blocking(poll_job, &j);
	if (err)
		return (int)fail(err);
	errno = j.err;
	return j.result;
}

static bool weft_can_wait(const struct pollfd *fds, nfds_t n)
{
	if (n > INT_MAX)
		return false;
	for (nfds_t i = 0; i < n; i++)
		if (fds[i].fd >= 0 && (fds[i].fd <= 2 || poll_manage(fds[i].fd) < 0))
			return false;
	return true;
}

/* The poll family in a task, until `deadline`. */
static int task_poll(struct pollfd *fds, nfds_t n, int64_t deadline)
{
	if (!weft_can_wait(fds, n))
		return poll_on_pool(fds, n, deadline);
	int r = poll_fds(fds, (int)n, deadline);
	if (r == -ECANCELED)
		return (int)fail(r);
	return r < 0 ? poll_on_pool(fds, n, deadline) : r;
}

/* now + sec seconds + ns, or WEFT_FOREVER past the year 2500 (not to overflow). */
static int64_t deadline_in(int64_t sec, int64_t ns)
{
	return sec > 16000000000 ? WEFT_FOREVER : weft_now() + sec * 1000000000 + ns;
}

int poll(struct pollfd *fds, nfds_t n, int timeout)
{
	REAL(poll);
	if (!may_park() || timeout == 0)
		return real_poll(fds, n, timeout);
	return task_poll(fds, n, timeout < 0 ? WEFT_FOREVER : deadline_in(0, timeout * 1000000LL));
}

/* Whether ppoll or pselect goes straight to libc: outside a task; with a signal mask to swap in
 * for the wait (a worker's mask is not the task's to change); with a timeout of zero (no wait)
 * or a bad one (libc says EINVAL). */
static bool for_libc(const struct timespec *ts, const sigset_t *mask)
{
	return !may_park() || mask ||
	       (ts && (ts->tv_sec < 0 || ts->tv_nsec < 0 || ts->tv_nsec >= 1000000000 ||
		       (!ts->tv_sec && !ts->tv_nsec)));
}

int ppoll(struct pollfd *fds, nfds_t n, const struct timespec *ts, const sigset_t *mask)
{
	REAL(ppoll);
	if (for_libc(ts, mask))
		return real_ppoll(fds, n, ts, mask);
	return task_poll(fds, n, ts ? deadline_in(ts->tv_sec, ts->tv_nsec) : WEFT_FOREVER);
}

/* select and pselect: the fd sets become a pollfd array, and poll's answer the sets again, as
 * the kernel does (fs/select.c: readable also on POLLHUP and POLLERR, writable also on POLLERR,
 * exceptional on POLLPRI; an fd that is not open fails the call with EBADF). */
static int task_select(int nfds, fd_set *r, fd_set *w, fd_set *e, int64_t deadline)
{
	struct pollfd small[64], *p = small;
	int n = 0;
	for (int fd = 0; fd < nfds; fd++)
		n += (r && FD_ISSET(fd, r)) || (w && FD_ISSET(fd, w)) || (e && FD_ISSET(fd, e));
	if (n > 64 && !(p = malloc((size_t)n * sizeof *p)))
		return (int)fail(-ENOMEM);
	n = 0;
	for (int fd = 0; fd < nfds; fd++) {
		short ev = (r && FD_ISSET(fd, r) ? POLLIN : 0) | (w && FD_ISSET(fd, w) ? POLLOUT : 0) |
			   (e && FD_ISSET(fd, e) ? POLLPRI : 0);
		if (ev)
			p[n++] = (struct pollfd){ .fd = fd, .events = ev };
	}
	int k = task_poll(p, (nfds_t)n, deadline);
	for (int i = 0; i < n && k > 0; i++)
		if (p[i].revents & POLLNVAL)
			k = (int)fail(-EBADF);
	if (k >= 0) {
		k = 0;
		for (int i = 0; i < n; i++) {
			int fd = p[i].fd;
			short ev = p[i].events, re = p[i].revents;
			bool rd = (ev & POLLIN) && (re & (POLLIN | POLLHUP | POLLERR));
			bool wr = (ev & POLLOUT) && (re & (POLLOUT | POLLERR));
			bool ex = (ev & POLLPRI) && (re & POLLPRI);
			if (r && !rd)
				FD_CLR(fd, r);
			if (w && !wr)
				FD_CLR(fd, w);
			if (e && !ex)
				FD_CLR(fd, e);
			k += rd + wr + ex;
		}
	}
	if (p != small)
		free(p);
	return k;
}

int select(int nfds, fd_set *r, fd_set *w, fd_set *e, struct timeval *tv)
{
	REAL(select);
	if (!may_park() || nfds < 0 || nfds > FD_SETSIZE ||
	    (tv && (tv->tv_sec < 0 || tv->tv_usec < 0 || (!tv->tv_sec && !tv->tv_usec))))
		return real_select(nfds, r, w, e, tv);
	int64_t deadline = tv ? deadline_in(tv->tv_sec, (int64_t)tv->tv_usec * 1000) : WEFT_FOREVER;
	int k = task_select(nfds, r, w, e, deadline);
	if (tv && deadline != WEFT_FOREVER) { /* Linux says how much of the timeout is left */
		int64_t left = deadline - weft_now();
		left = left < 0 ? 0 : left;
		*tv = (struct timeval){ left / 1000000000, left % 1000000000 / 1000 };
	}
	return k;
}

int pselect(int nfds, fd_set *r, fd_set *w, fd_set *e, const struct timespec *ts,
	    const sigset_t *mask)
{
	REAL(pselect);
	if (for_libc(ts, mask) || nfds < 0 || nfds > FD_SETSIZE)
		return real_pselect(nfds, r, w, e, ts, mask);
	return task_select(nfds, r, w, e, ts ? deadline_in(ts->tv_sec, ts->tv_nsec) : WEFT_FOREVER);
}

/* ---- the program's view of O_NONBLOCK, and close ----------------------------------------- */

int fcntl(int fd, int cmd, ...)
{
	REAL(fcntl);
	va_list ap;
	va_start(ap, cmd);
	uintptr_t arg = va_arg(ap, uintptr_t);
	va_end(ap);
	int view = poll_user_nonblock(fd);
	if (view < 0 || (cmd != F_GETFL && cmd != F_SETFL))
		return real_fcntl(fd, cmd, arg);
	if (cmd == F_GETFL) {
		int fl = real_fcntl(fd, F_GETFL);
		return fl < 0 ? fl : (fl & ~O_NONBLOCK) | (view ? O_NONBLOCK : 0);
	}
	int r = real_fcntl(fd, F_SETFL, (int)arg | O_NONBLOCK);
	if (r == 0)
		poll_set_user_nonblock(fd, (int)arg & O_NONBLOCK);
	return r;
}

int ioctl(int fd, unsigned long req, ...)
{
	REAL(ioctl);
	va_list ap;
	va_start(ap, req);
	void *arg = va_arg(ap, void *);
	va_end(ap);
	if (req == FIONBIO && arg && poll_user_nonblock(fd) >= 0) {
		poll_set_user_nonblock(fd, *(int *)arg != 0);
		return 0; /* the kernel's flag stays set */
	}
	return real_ioctl(fd, req, arg);
}

int close(int fd)
{
	REAL(close);
	poll_forget(fd);
	return real_close(fd);
}

/* ---- pthread locks: counted, so that a task holding one keeps its thread (may_park) ------- */

/* EOWNERDEAD: a robust mutex whose holder died is taken all the same. The count is a plain
 * thread-local increment beside libc's call (and TSan's, which the lookup finds first). */
#define LOCK_TAKE(name, params, args)                                                      \
	int name params                                                                     \
	{                                                                                   \
		REAL(name);                                                                 \
		int r = real_##name args;                                                   \
		locks_held += r == 0 || r == EOWNERDEAD;                                    \
		return r;                                                                   \
	}
#define LOCK_RELEASE(name, params, args)                                                   \
	int name params                                                                     \
	{                                                                                   \
		REAL(name);                                                                 \
		int r = real_##name args;                                                   \
		locks_held -= r == 0 && locks_held > 0;                                     \
		return r;                                                                   \
	}

LOCK_TAKE(pthread_mutex_lock, (pthread_mutex_t *m), (m))
LOCK_TAKE(pthread_mutex_trylock, (pthread_mutex_t *m), (m))
LOCK_TAKE(pthread_mutex_timedlock, (pthread_mutex_t *restrict m, const struct timespec *restrict t),
	  (m, t))
LOCK_RELEASE(pthread_mutex_unlock, (pthread_mutex_t *m), (m))
LOCK_TAKE(pthread_rwlock_rdlock, (pthread_rwlock_t *l), (l))
LOCK_TAKE(pthread_rwlock_tryrdlock, (pthread_rwlock_t *l), (l))
LOCK_TAKE(pthread_rwlock_timedrdlock,
	  (pthread_rwlock_t *restrict l, const struct timespec *restrict t), (l, t))
LOCK_TAKE(pthread_rwlock_wrlock, (pthread_rwlock_t *l), (l))
LOCK_TAKE(pthread_rwlock_trywrlock, (pthread_rwlock_t *l), (l))
LOCK_TAKE(pthread_rwlock_timedwrlock,
	  (pthread_rwlock_t *restrict l, const struct timespec *restrict t), (l, t))
LOCK_RELEASE(pthread_rwlock_unlock, (pthread_rwlock_t *l), (l))
LOCK_TAKE(pthread_spin_lock, (pthread_spinlock_t *l), (l))
LOCK_TAKE(pthread_spin_trylock, (pthread_spinlock_t *l), (l))
LOCK_RELEASE(pthread_spin_unlock, (pthread_spinlock_t *l), (l))
#if __GLIBC_PREREQ(2, 30) /* the clock variants */
LOCK_TAKE(pthread_mutex_clocklock,
	  (pthread_mutex_t *restrict m, clockid_t c, const struct timespec *restrict t), (m, c, t))
LOCK_TAKE(pthread_rwlock_clockrdlock,
	  (pthread_rwlock_t *restrict l, clockid_t c, const struct timespec *restrict t), (l, c, t))
LOCK_TAKE(pthread_rwlock_clockwrlock,
	  (pthread_rwlock_t *restrict l, clockid_t c, const struct timespec *restrict t), (l, c, t))
#endif
