/*
 * weft.h - the whole public API of weft, a runtime for very many lightweight tasks
 * multiplexed over one worker thread per core.
 *
 * Conventions (see docs/design.md):
 *  - Functions return 0 (or a non-negative count) on success and a negative errno value on
 *    failure. Constructors that return a handle return NULL and set errno.
 *  - Time is int64_t nanoseconds on the monotonic clock of weft_now(). Blocking calls take an
 *    absolute deadline; WEFT_FOREVER never expires; a deadline already past means "do not
 *    block".
 *  - Every blocking call works from a task (the task parks, its worker runs other tasks) and
 *    from a plain OS thread (the thread sleeps on a futex).
 */
#ifndef WEFT_H
#define WEFT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------ */
/* Time                                                                                       */
/* ------------------------------------------------------------------------------------------ */

#define WEFT_FOREVER INT64_MAX

/* Monotonic time in nanoseconds (CLOCK_MONOTONIC). */
int64_t weft_now(void);

/* ------------------------------------------------------------------------------------------ */
/* Running                                                                                    */
/* ------------------------------------------------------------------------------------------ */

/*
 * Start the workers, run main_task(arg) as the first task and return its result once it has
 * returned. The calling thread becomes worker 0. The number of workers is $WEFT_WORKERS, or
 * the number of online CPUs. Tasks still alive when main_task returns are discarded, as in Go:
 * their stacks are released without running them further. weft_run may be called again
 * afterwards, but not from inside a task. Returns -EINVAL for a NULL main_task, -EBUSY when
 * weft is already running, -ENOMEM or -EAGAIN when workers cannot be created.
 *
 * Environment: WEFT_WORKERS=n; WEFT_DEADLOCK=0 turns off deadlock detection.
 */
int weft_run(int (*main_task)(void *), void *arg);

/* ------------------------------------------------------------------------------------------ */
/* Tasks                                                                                      */
/* ------------------------------------------------------------------------------------------ */

typedef struct weft_task weft_task;

#define WEFT_STACK_DEFAULT (64 * 1024) /* bytes */
#define WEFT_STACK_MIN (16 * 1024)     /* bytes; smaller sizes are rejected with EINVAL */

/* Options for weft_spawn_opt; zero-initialise and set what you need. */
typedef struct weft_spawn_opts {
	size_t stack_size; /* 0: WEFT_STACK_DEFAULT */
	const char *name;  /* copied (up to 31 bytes); NULL: "task" */
	int detached;      /* nonzero: released on exit, never joined */
} weft_spawn_opts;

/*
 * Spawn a task running fn(arg). It is runnable at once, on the caller's worker (an idle worker
 * may steal it). Must be called from inside weft_run (from a task). Returns the handle, to be
 * passed to weft_join exactly once, or NULL with errno EINVAL (fn NULL, stack too small, called
 * outside weft_run) or ENOMEM.
 */
weft_task *weft_spawn(void (*fn)(void *), void *arg);
weft_task *weft_spawn_opt(void (*fn)(void *), void *arg, const weft_spawn_opts *opts);

/*
 * Wait for t to finish and release it. Returns 0; -EINVAL for NULL, a detached task, joining
 * oneself, a task another caller is already joining, or a handle already joined; -ECANCELED if
 * the caller was cancelled while waiting (t stays joinable). A joined handle's memory is reused
 * by later spawns: once a newer task has taken it over, joining the old handle again is
 * undefined, as with pthread_join.
 */
int weft_join(weft_task *t);

/* Let the other runnable tasks of this worker run. From a plain thread: sched_yield(). */
void weft_yield(void);

/*
 * Sleep until the deadline. Returns 0, or -ECANCELED. From a plain thread it sleeps the thread
 * (clock_nanosleep, absolute).
 */
int weft_sleep_until(int64_t deadline);

/* Run n tasks of fn(arg) and return when all have finished: 0, or -EINVAL (n <= 0, fn NULL). */
int weft_execute(int n, void (*fn)(void *), void *arg);

/* The calling task, or NULL on a thread that is not running a weft task. */
weft_task *weft_self(void);

/* The task's id (unique for the process, > 0) and name. */
uint64_t weft_task_id(const weft_task *t);
const char *weft_task_name(const weft_task *t);

/*
 * Cancel t: its current blocking call and every later one return -ECANCELED (sleeping, joining,
 * channel and lock waits alike). The task decides how to wind up; nothing is unwound by force.
 * Returns 0 or -EINVAL. t must not have been joined yet.
 */
int weft_cancel(weft_task *t);

/* Nonzero when the calling task has been cancelled. */
int weft_cancelled(void);

/* ------------------------------------------------------------------------------------------ */
/* Channels                                                                                   */
/* ------------------------------------------------------------------------------------------ */

/* @@CHANNELS@@ */

/* ------------------------------------------------------------------------------------------ */
/* Locks and other synchronisation                                                            */
/* ------------------------------------------------------------------------------------------ */

/* @@SYNC@@ */

/* ------------------------------------------------------------------------------------------ */
/* File descriptors and sockets                                                               */
/* ------------------------------------------------------------------------------------------ */

/*
 * Task-aware I/O. Each call makes fd non-blocking (once), tries the system call and, while it
 * would block, parks the calling task until the fd is ready or the deadline passes; the worker
 * runs other tasks meanwhile. From a plain thread the same calls block the thread. They return
 * what the system call returns (a count, or 0 for a new fd), or -errno: -ETIMEDOUT when the
 * deadline passed first, -ECANCELED when the task was cancelled, -EBADF when the fd was closed
 * with weft_close while the task waited, -EBUSY when another task already waits on the same
 * fd in the same direction. Writes and sends finish partial writes before returning, unless the
 * deadline passes (they then return the bytes written, or -ETIMEDOUT if none). Sends never
 * raise SIGPIPE (-EPIPE instead). An fd a task has waited on must be closed with weft_close
 * (or close() under the shim).
 */
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

/* Wait until fd is ready: events is EPOLLIN and/or EPOLLOUT (<sys/epoll.h>). 0 or -errno. */
int weft_fd_wait(int fd, uint32_t events, int64_t deadline);
ssize_t weft_read(int fd, void *buf, size_t n, int64_t deadline);
ssize_t weft_write(int fd, const void *buf, size_t n, int64_t deadline);
ssize_t weft_readv(int fd, const struct iovec *iov, int n, int64_t deadline);
ssize_t weft_writev(int fd, const struct iovec *iov, int n, int64_t deadline);
ssize_t weft_recv(int fd, void *buf, size_t n, int flags, int64_t deadline);
ssize_t weft_send(int fd, const void *buf, size_t n, int flags, int64_t deadline);
ssize_t weft_recvfrom(int fd, void *buf, size_t n, int flags, struct sockaddr *from,
		      socklen_t *fromlen, int64_t deadline);
ssize_t weft_sendto(int fd, const void *buf, size_t n, int flags, const struct sockaddr *to,
		    socklen_t tolen, int64_t deadline);
ssize_t weft_recvmsg(int fd, struct msghdr *m, int flags, int64_t deadline);
ssize_t weft_sendmsg(int fd, const struct msghdr *m, int flags, int64_t deadline);
/* accept4(2): returns the new fd (close-on-exec, plus `flags`), or -errno. */
int weft_accept(int fd, struct sockaddr *addr, socklen_t *len, int flags, int64_t deadline);
/* connect(2), waiting for the connection to complete: 0 or -errno (-ECONNREFUSED, ...). */
int weft_connect(int fd, const struct sockaddr *addr, socklen_t len, int64_t deadline);
/* Close fd; tasks waiting on it wake with -EBADF. 0 or -errno. */
int weft_close(int fd);

/* A listening TCP socket on host:port (host NULL or "": all addresses; IPv4 or IPv6; port 0:
 * any). Returns the fd or -errno. Name resolution runs on the blocking pool. */
int weft_tcp_listen(const char *host, int port, int backlog);
/* A TCP connection to host:port (TCP_NODELAY set), tried address by address until one
 * answers or the deadline passes. Returns the fd or -errno. */
int weft_tcp_connect(const char *host, int port, int64_t deadline);
/* Unix-domain stream sockets. Return the fd or -errno. */
int weft_unix_listen(const char *path, int backlog);
int weft_unix_connect(const char *path, int64_t deadline);

/* ------------------------------------------------------------------------------------------ */
/* Blocking work                                                                              */
/* ------------------------------------------------------------------------------------------ */

/*
 * Run fn(arg) on a pool of OS threads while the calling task is parked: for calls that must
 * block (disk I/O, name resolution, libraries without a non-blocking API). The pool grows on
 * demand up to $WEFT_BLOCKING_THREADS (default 64) threads; idle ones retire after 10 s. The
 * wait cannot be cancelled: fn may use the caller's memory until it returns. From a plain
 * thread fn runs right there. Returns 0, -EINVAL (fn NULL) or -EAGAIN (no thread could be
 * started).
 */
int weft_blocking(void (*fn)(void *), void *arg);

#ifdef __cplusplus
}
#endif
#endif /* WEFT_H */
