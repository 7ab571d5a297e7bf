/*
 * poll.h - the epoll poller (poll.c): tasks park on file descriptors; the idle loop waits in
 * epoll instead of a futex while tasks wait for I/O.
 */
#ifndef WEFT_POLL_H
#define WEFT_POLL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "waitq.h"

/* libweft-shim.so calls the functions marked SHIM_API across the library boundary. They are
 * the only internals libweft.so exports (the rest is hidden: the Makefile's
 * -fvisibility=hidden), under names of their own, weft__*, that no program's symbols can
 * clash with or interpose on. */
#define SHIM_API(name) __asm__("weft__" #name) __attribute__((visibility("default")))

/* Which copy of weft this is (sched.c): the shim says which one it serves, so that weft_run in
 * a program with a second copy linked in statically can tell that the shim is not for it. */
const void *sched_runtime(void) SHIM_API(runtime);

int poll_init(void);
/* Park the caller until fd is ready for `events` (EPOLLIN and/or EPOLLOUT), the deadline
 * passes (-ETIMEDOUT), the task is cancelled (-ECANCELED) or fd is closed through weft
 * (-EBADF). Returns 0 when ready. */
int poll_wait(int fd, uint32_t events, int64_t deadline) SHIM_API(poll_wait);
/* poll(2) for a task: parks it (not its worker) until one of fds is ready, then returns what
 * poll(2) would: the number ready, revents filled in. Or 0 when the deadline passes, -ECANCELED,
 * -ENOMEM, or -errno when an fd cannot be waited on here (epoll refuses it). Any number of
 * tasks may poll one fd, and a poll takes no edge from the fd's reader or writer. The fds must
 * have been through poll_manage. */
struct pollfd;
int poll_fds(struct pollfd *fds, int n, int64_t deadline) SHIM_API(poll_fds);
/* poll_fds in parts, for weft_select's fd cases (select.c), which wait on channels and tasks
 * too. A node per pollfd, in each fd's list of observers, all pointing to one wait record:
 * the first edge that concerns a node claims the record, stores the node in *won (if won is
 * not NULL) and finishes the wait with 0, or -EBADF when the fd is closed through weft. */
struct fdesc;
struct wait;
struct poll_node {
	struct waitq_link link;        /* in d's list of observers (waitq.h), while linked */
	struct poll_node *next;        /* once claimed: the chain of nodes to finish (not in
					* `link`: poll_unlink_all asks waitq_linked of it) */
	struct wait *w;
	uint32_t mask;                 /* the epoll events that concern it */
	struct fdesc *d;               /* whose list it is in, once linked (not found again
					* through the caller's array, which may change under us) */
	struct poll_node **won;        /* where its claimer says it was this node, or NULL */
};
_Static_assert(offsetof(struct poll_node, link) == 0, "waitq.h: the link comes first");
/* Link node[i] for fds[i] (fd < 0: skipped); 0 or -errno (epoll refuses an fd). *linked: how
 * many nodes to give to poll_unlink_all, also after an error. */
int poll_link_all(const struct pollfd *fds, int n, struct poll_node *node, struct wait *w,
		  struct poll_node **won, int *linked);
void poll_unlink_all(struct poll_node *node, int n);
/* Whether the poller exists (a weft_run has started): before, nothing would ever poll a node
 * linked, and epoll refuses to register one. */
bool poll_started(void);
/* What the kernel says is ready now (ppoll without waiting): the number of fds, revents
 * filled in, or -errno. */
int poll_look(struct pollfd *fds, int n);
/* Count (d = 1) or stop counting (d = -1) a waiter on fds that uses no slot: while there is
 * one, a worker polls (poll_waiters). */
void poll_waiters_add(int d);
/* Collect ready fds and wake their waiters; waits until `deadline` (0: do not wait,
 * INT64_MAX: until woken). Returns the number of waiters woken. */
int poll_run(int64_t deadline);
/* poll_run in two steps, for an idle worker: it collects while it sleeps on the idle list and
 * wakes the waiters once it is off that list, so that the tasks it readies wake another
 * worker, not itself (see idle_sleep in idle.c). */
#define POLL_BATCH 256
struct poll_batch {
	int n; /* events in ev, or -1 (errno set) */
	struct epoll_event ev[POLL_BATCH];
};
void poll_collect(struct poll_batch *b, int64_t deadline);
int poll_dispatch(const struct poll_batch *b);
/* Make a poll_run in progress return (idle worker being woken). */
void poll_interrupt(void);
/* Calls of poll_interrupt since the process began (tests). */
long poll_interrupts(void);
/* Nodes of poll(2) or weft_select linked on fd right now (tests). */
int poll_observers(int fd);
/* Tasks parked on fds right now. */
int poll_waiters(void);
/* fd is being closed: wake its waiters with -EBADF and forget it. */
void poll_forget(int fd) SHIM_API(poll_forget);

/* What the program believes about an fd's O_NONBLOCK flag (the shim keeps the kernel's flag
 * set on fds weft manages). Returns -1 when weft has never made fd non-blocking. */
int poll_user_nonblock(int fd) SHIM_API(poll_user_nonblock);
void poll_set_user_nonblock(int fd, bool on) SHIM_API(poll_set_user_nonblock);
/* Whether fd is known not to be a socket (weft_write then uses write(2), not send(2)). */
bool poll_not_socket(int fd);
void poll_set_not_socket(int fd);
/* Drained reads (poll.c): take a token before a read's system call; if it read less than it
 * asked for, say so with the token. Before the next read (or wait for reading) by a task,
 * poll_read_wait: when the last read left fd empty, it waits for fd's edge and returns what
 * poll_wait says (0, -ETIMEDOUT, -errno); otherwise it returns 1 at once. */
uint32_t poll_read_token(int fd) SHIM_API(poll_read_token);
void poll_read_short(int fd, uint32_t token) SHIM_API(poll_read_short);
int poll_read_wait(int fd, int64_t deadline) SHIM_API(poll_read_wait);
/* fd's urgent byte was read (MSG_OOB): never apply the rule to it again. */
void poll_read_off(int fd) SHIM_API(poll_read_off);

/* The bytes readv and writev ask for. */
static inline size_t iov_total(const struct iovec *iov, int n)
{
	size_t t = 0;
	for (int i = 0; i < n; i++)
		t += iov[i].iov_len;
	return t;
}

/* A recv of n bytes with `flags` on fd is about to be made: what it asks for, as far as drained
 * reads go - 0 when its short read says nothing of the receive queue (it peeks, or reads
 * urgent data or the error queue). Reading the urgent byte turns the rule off for fd. */
static inline size_t recv_len(int fd, size_t n, int flags)
{
	if (flags & MSG_OOB)
		poll_read_off(fd);
	return flags & (MSG_PEEK | MSG_OOB | MSG_TRUNC | MSG_ERRQUEUE) ? 0 : n;
}
/* Make fd non-blocking in the kernel, remembering what it was. 0 or -errno. */
int poll_manage(int fd) SHIM_API(poll_manage);
#endif
