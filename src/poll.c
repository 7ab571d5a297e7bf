/*
 * poll.c - parking tasks on file descriptors.
 *
 * One epoll instance serves the process. A file descriptor is registered the first time a
 * task waits on it, edge-triggered for both directions, and stays registered until it is
 * closed through weft (weft_close, or close() under the shim). Each fd has a small record
 * (fdesc) found through a two-level table indexed by the fd number, so lookups take no lock:
 *
 *   ready   the edges (EPOLLIN/EPOLLOUT) seen while nobody waited: the next waiter in that
 *           direction retries its system call instead of parking;
 *   reader, writer  the task parked for reading / for writing (one each: a second waiter
 *           in the same direction gets -EBUSY, as a socket read by two tasks at once is a bug).
 *
 * A waiter checks `ready` under the fdesc lock after its system call said EAGAIN, so an edge
 * that came in between is not lost. The poller (poll_run) wakes waiters through the wait
 * protocol (wait.h), which puts them on the polling worker's queue.
 *
 * Drained reads (nginx's trick, its rev->ready = 0). A read of a TCP socket that returns less
 * than it asked for has emptied the socket's receive queue: the kernel copies until the queue
 * is empty or the buffer full. Any data after it comes with a new edge. So the next read need
 * not try its system call, which would only say EAGAIN: it waits for that edge first (io.c),
 * one system call less per request of a request/response protocol. `drained` records such a
 * read, as read_edges + 1 taken before its system call: an edge taken by any poll_wait since
 * (read_edges moved) voids it, since that edge may be for data nobody has read yet. The
 * exceptions, where a short read leaves something behind, each announce themselves in the
 * edge that brought them: urgent data (the read stops at its mark; EPOLLPRI), the end of the
 * stream (once the last bytes are read, the next read returns 0 at once; EPOLLRDHUP) and
 * errors (EPOLLERR, EPOLLHUP). The poller clears `drains` for good when it sees one, before
 * it hands the edge to anyone, so a reader that took that edge sees the clear. A read of the
 * urgent byte itself (MSG_OOB) clears it too: the mark stays in the stream after it, and
 * EPOLLPRI is not reported again (poll_read_off). Not applied to other kinds of fd (a datagram
 * socket, a tty in canonical mode, a packet-mode pipe, a Unix socket passing fds: their short
 * reads have more behind them), nor to a TCP socket with SO_RCVLOWAT above 1 when first asked
 * (data below the mark brings no edge). Where a short read does leave something the rule
 * cannot know of - a control record after data on a kernel-TLS socket (an alert, a key
 * update), a socket redirected by a BPF sockmap - a read with a deadline makes its system
 * call when the wait times out (io.c), and one without waits for the next edge.
 *
 * Who polls: an idle worker that finds tasks waiting on fds sleeps in epoll_pwait2 instead of
 * its futex (one at a time; an eventfd wakes it when work arrives), and a busy worker polls
 * without waiting every few dozen switches, so ready sockets are served under load too.
 */
#define _GNU_SOURCE
#include "poll.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <poll.h>
#include <unistd.h>

#include "spin.h"
#include "sys.h"
#include "wait.h"
#include "weft.h"

#define CHUNK 1024
#define MAX_CHUNKS 4096 /* 4M fds */

struct fdesc {
	spinlock lock;
	atomic_bool registered;            /* written under the lock; drained reads look without */
	/* Read without the lock by any task using the fd, hence atomic (relaxed: each is a
	 * property of the fd that only changes when it is set up or closed). */
	_Atomic signed char user_nonblock; /* -1: weft has not touched the fd's flags */
	atomic_bool not_socket;            /* write(2) it is: send(2) said ENOTSOCK */
	uint32_t ready;
	struct wait *reader, *writer;
	struct weft_waitq polls;           /* poll(2) and select on this fd: poll_nodes */
	/* drained reads */
	_Atomic signed char drains;        /* a short read empties fd: 1 (TCP), 0, -1 not known */
	_Atomic uint32_t read_edges;         /* read edges taken by poll_wait */
	_Atomic uint32_t drained;          /* read_edges + 1 as of a short read, or 0 */
};

static struct {
	int ep, ev;
	atomic_int waiters;
	pthread_mutex_t grow;
	struct fdesc *_Atomic chunks[MAX_CHUNKS];
} poller = { .ep = -1, .ev = -1, .grow = PTHREAD_MUTEX_INITIALIZER };

static struct fdesc *fdesc_of(int fd, bool create)
{
	if (fd < 0 || fd / CHUNK >= MAX_CHUNKS)
		return NULL;
	struct fdesc *c = atomic_load_explicit(&poller.chunks[fd / CHUNK], memory_order_acquire);
	if (!c && create) {
		pthread_mutex_lock(&poller.grow);
		c = atomic_load(&poller.chunks[fd / CHUNK]);
		if (!c && (c = calloc(CHUNK, sizeof *c))) {
			for (int i = 0; i < CHUNK; i++) {
				atomic_init(&c[i].user_nonblock, -1);
				atomic_init(&c[i].drains, -1);
			}
			atomic_store_explicit(&poller.chunks[fd / CHUNK], c, memory_order_release);
		}
		pthread_mutex_unlock(&poller.grow);
	}
	return c ? &c[fd % CHUNK] : NULL;
}

/* Once per process: the table and the epoll instance outlive weft_run, so fds opened under
 * one run stay usable in the next. */
int poll_init(void)
{
	if (poller.ep >= 0)
		return 0;
	int ep = epoll_create1(EPOLL_CLOEXEC);
	poller.ev = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (ep < 0 || poller.ev < 0)
		return -errno;
	struct epoll_event e = { .events = EPOLLIN, .data.fd = -1 };
	int r = epoll_ctl(ep, EPOLL_CTL_ADD, poller.ev, &e) < 0 ? -errno : 0;
	__atomic_store_n(&poller.ep, ep, __ATOMIC_RELEASE); /* poll_started: a plain thread may look */
	return r;
}

bool poll_started(void)
{
	return __atomic_load_n(&poller.ep, __ATOMIC_ACQUIRE) >= 0;
}


int poll_manage(int fd)
{
	struct fdesc *d = fdesc_of(fd, true);
	if (!d)
		return -EBADF;
	if (atomic_load_explicit(&d->user_nonblock, memory_order_relaxed) >= 0)
		return 0;
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0)
		return -errno;
	if (!(fl & O_NONBLOCK) && fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -errno;
	atomic_store_explicit(&d->user_nonblock, (fl & O_NONBLOCK) != 0, memory_order_relaxed);
	return 0;
}

bool poll_not_socket(int fd)
{
	struct fdesc *d = fdesc_of(fd, false);
	return d && atomic_load_explicit(&d->not_socket, memory_order_relaxed);
}

void poll_set_not_socket(int fd)
{
	struct fdesc *d = fdesc_of(fd, true);
	if (d)
		atomic_store_explicit(&d->not_socket, true, memory_order_relaxed);
}

int poll_user_nonblock(int fd)
{
	struct fdesc *d = fdesc_of(fd, false);
	return d ? atomic_load_explicit(&d->user_nonblock, memory_order_relaxed) : -1;
}

void poll_set_user_nonblock(int fd, bool on)
{
	struct fdesc *d = fdesc_of(fd, true);
	if (d)
		atomic_store_explicit(&d->user_nonblock, on, memory_order_relaxed);
}

int poll_observers(int fd)
{
	struct fdesc *d = fdesc_of(fd, false);
	int n = 0;
	if (!d)
		return 0;
	spin_lock(&d->lock);
	for (struct waitq_link *l = waitq_first(WAITQ_OF(&d->polls)); l; l = l->next)
		n++;
	spin_unlock(&d->lock);
	return n;
}

int poll_waiters(void)
{
	return atomic_load_explicit(&poller.waiters, memory_order_relaxed);
}

/* ---- drained reads ---- */

uint32_t poll_read_token(int fd)
{
	struct fdesc *d = fdesc_of(fd, false);
	return d ? atomic_load_explicit(&d->read_edges, memory_order_relaxed) : 0;
}

/* Whether fd is a TCP socket that wakes up for every byte (SO_RCVLOWAT 1): what the rule needs. */
static bool tcp_byte_stream(int fd)
{
	int proto = 0, lowat = 0, e = errno; /* the shim's read keeps libc's errno */
	socklen_t len = sizeof proto, llen = sizeof lowat;
	bool yes = getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &proto, &len) == 0 &&
		   proto == IPPROTO_TCP &&
		   getsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &lowat, &llen) == 0 && lowat <= 1;
	errno = e;
	return yes;
}

/* Whether a short read leaves fd empty: a TCP socket whose edges never said otherwise. Only
 * asked of a registered fd, which the program must close through weft (poll_forget): an fd
 * closed behind weft's back and reused for, say, a UDP socket never inherits the answer. */
static bool drains(int fd, struct fdesc *d)
{
	signed char k = atomic_load_explicit(&d->drains, memory_order_relaxed);
	if (k < 0) {
		k = tcp_byte_stream(fd);
		signed char unknown = -1; /* the poller may have cleared it meanwhile */
		atomic_compare_exchange_strong_explicit(&d->drains, &unknown, k,
							memory_order_relaxed, memory_order_relaxed);
	}
	return atomic_load_explicit(&d->drains, memory_order_acquire) == 1;
}

void poll_read_short(int fd, uint32_t token)
{
	struct fdesc *d = fdesc_of(fd, false);
	if (d && atomic_load_explicit(&d->registered, memory_order_relaxed) && drains(fd, d))
		atomic_store_explicit(&d->drained, token + 1, memory_order_relaxed);
}

void poll_read_off(int fd)
{
	struct fdesc *d = fdesc_of(fd, true);
	if (d) {
		atomic_store_explicit(&d->drains, 0, memory_order_relaxed);
		atomic_store_explicit(&d->drained, 0, memory_order_relaxed);
	}
}

static bool read_drained(int fd)
{
	struct fdesc *d = fdesc_of(fd, false);
	if (!d)
		return false;
	uint32_t at = atomic_load_explicit(&d->drained, memory_order_relaxed);
	return at && at == atomic_load_explicit(&d->read_edges, memory_order_relaxed) + 1;
}

/* Not with a deadline already past: that caller wants the kernel's answer, which may be ahead
 * of the poller's. For the same reason the callers make their system call (or poll(2)) once
 * more when this wait times out: every worker may have been busy, and nobody polled. */
int poll_read_wait(int fd, int64_t deadline)
{
	if (!read_drained(fd) || (deadline != WEFT_FOREVER && deadline <= weft_now()))
		return 1;
	return poll_wait(fd, EPOLLIN, deadline);
}

/* ---- waiting ---- */

static int ensure_registered(int fd, struct fdesc *d)
{
	if (atomic_load_explicit(&d->registered, memory_order_relaxed))
		return 0;
	struct epoll_event e = { .events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLPRI | EPOLLET,
				 .data.fd = fd };
	if (epoll_ctl(poller.ep, EPOLL_CTL_ADD, fd, &e) < 0 && errno != EEXIST)
		return -errno;
	atomic_store_explicit(&d->registered, true, memory_order_relaxed);
	return 0;
}

int poll_wait(int fd, uint32_t events, int64_t deadline)
{
	struct fdesc *d = fdesc_of(fd, true);
	if (!d)
		return -EBADF;
	bool reading = events & EPOLLIN;
	struct wait **slot = reading ? &d->reader : &d->writer;
	uint32_t bit = reading ? EPOLLIN : EPOLLOUT;
	spin_lock(&d->lock);
	int err = ensure_registered(fd, d);
	if (!err && (d->ready & bit)) { /* an edge came since the caller's last try */
		d->ready &= ~bit;
		if (reading)
			atomic_fetch_add_explicit(&d->read_edges, 1, memory_order_relaxed);
		spin_unlock(&d->lock);
		return 0;
	}
	if (!err && *slot)
		err = -EBUSY;
	if (err) {
		spin_unlock(&d->lock);
		return err;
	}
	struct wait *w = wait_begin(reading ? "fd read" : "fd write", (void *)(intptr_t)fd);
	*slot = w;
	atomic_fetch_add(&poller.waiters, 1);
	spin_unlock(&d->lock);
	int r = wait_park(w, deadline);
	if (r == -ETIMEDOUT || r == -ECANCELED) { /* nobody took us out of the slot */
		spin_lock(&d->lock);
		if (*slot == w)
			*slot = NULL;
		spin_unlock(&d->lock);
	} else if (r == 0 && reading) {
		atomic_fetch_add_explicit(&d->read_edges, 1, memory_order_relaxed);
	}
	atomic_fetch_sub(&poller.waiters, 1);
	return r;
}

/* ---- poll(2) on several fds (the shim) ----
 *
 * A poll is an observer, not a reader: it must not take the edge a reader of the same fd is
 * owed, and any number of tasks may poll one fd. So it does not use the reader/writer slots and
 * `ready`. It links a node per pollfd into each fd's `polls` list, all pointing at one wait
 * record (as weft_select puts one record on several channels), and only then asks the kernel
 * what is ready: readiness from before the nodes were linked is in the kernel's answer, and
 * any that comes after brings an edge, which wakes every node it concerns (poll_run) and
 * leaves the fd's slots and `ready` as if no poll were there. Woken, the task unlinks its
 * nodes and asks the kernel again. */

static uint32_t node_mask(short events)
{
	uint32_t m = EPOLLERR | EPOLLHUP; /* reported whatever events asks for */
	if (events & (POLLIN | POLLPRI | POLLRDHUP | POLLRDNORM | POLLRDBAND))
		m |= EPOLLIN | EPOLLPRI | EPOLLRDHUP;
	if (events & (POLLOUT | POLLWRNORM | POLLWRBAND))
		m |= EPOLLOUT;
	return m;
}

static int link_node(const struct pollfd *p, struct poll_node *n, struct wait *w,
		     struct poll_node **won)
{
	struct fdesc *d = fdesc_of(p->fd, true);
	if (!d)
		return -EBADF;
	*n = (struct poll_node){ .w = w, .mask = node_mask(p->events), .won = won };
	spin_lock(&d->lock);
	int err = ensure_registered(p->fd, d);
	if (!err) {
		waitq_push_front(WAITQ_OF(&d->polls), &n->link);
		n->d = d;
	}
	spin_unlock(&d->lock);
	return err;
}

/* Claim the waiters of d's nodes that events concern, unlinking their nodes onto *woken, to be
 * finished once the lock is dropped. Lock held. */
static void claim_polls(struct fdesc *d, uint32_t events, struct poll_node **woken)
{
	struct waitq q = WAITQ_OF(&d->polls);
	for (struct waitq_link *l = waitq_first(q), *next; l; l = next) {
		struct poll_node *n = (struct poll_node *)l;
		next = l->next;
		if ((n->mask & events) && wait_claim(n->w)) {
			if (n->won)
				*n->won = n;
			waitq_remove(q, &n->link);
			n->next = *woken;
			*woken = n;
		}
	}
}

/* Read each node's fields before finishing its wait: once finished, its task may return and
 * the node, on that task's stack, is gone. */
static int finish_polls(struct poll_node *n, int result)
{
	int k = 0;
	for (struct poll_node *next; n; n = next, k++) {
		next = n->next;
		wait_finish(n->w, result);
	}
	return k;
}

void poll_unlink_all(struct poll_node *node, int n)
{
	for (int i = 0; i < n; i++) {
		struct fdesc *d = node[i].d;
		if (!d)
			continue;
		spin_lock(&d->lock);
		if (waitq_linked(&node[i].link))
			waitq_remove(WAITQ_OF(&d->polls), &node[i].link);
		spin_unlock(&d->lock);
	}
}

/* What the kernel says is ready now: the number of fds (revents filled in), or -errno. */
int poll_look(struct pollfd *fds, int n)
{
	struct timespec zero = { 0, 0 };
	int r = (int)sys_ppoll(fds, (nfds_t)n, &zero);
	return r < 0 ? -errno : r;
}

/* Link w on every fd: 0 or -errno. Sets *linked to how many nodes it went through. */
int poll_link_all(const struct pollfd *fds, int n, struct poll_node *node, struct wait *w,
		  struct poll_node **won, int *linked)
{
	int err = 0;
	for (*linked = 0; *linked < n && !err; ++*linked) {
		node[*linked] = (struct poll_node){ 0 };
		if (fds[*linked].fd >= 0)
			err = link_node(&fds[*linked], &node[*linked], w, won);
	}
	return err;
}

void poll_waiters_add(int d)
{
	atomic_fetch_add(&poller.waiters, d);
}

int poll_fds(struct pollfd *fds, int n, int64_t deadline)
{
	struct poll_node small[16], *node = n <= 16 ? small : malloc((size_t)n * sizeof *node);
	if (!node)
		return -ENOMEM;
	int r, linked;
	atomic_fetch_add(&poller.waiters, 1);
	for (;;) {
		struct wait *w = wait_begin("poll", fds);
		int err = poll_link_all(fds, n, node, w, NULL, &linked);
		if ((r = err ? err : poll_look(fds, n))) {
			wait_abandon(w); /* a wake-up that came meanwhile is moot: we have looked */
			poll_unlink_all(node, linked);
			break;
		}
		r = wait_park(w, deadline);
		poll_unlink_all(node, linked);
		if (r == -ETIMEDOUT) { /* the kernel's last word: the poller may be behind */
			r = poll_look(fds, n);
			break;
		}
		/* An fd closed through weft (poll_forget) may not be closed in the kernel yet:
		 * linking again would register it anew, and epoll would drop that registration
		 * unseen at the close, leaving whatever next gets its number unregistered for
		 * good. So look once: POLLNVAL if the close is done; if not, the caller asks libc,
		 * which waits for the other fds, as a poll racing a close does there. */
		if (r == -EBADF && (r = poll_look(fds, n)) == 0)
			r = -EBADF;
		if (r != 0)
			break;
	}
	atomic_fetch_sub(&poller.waiters, 1);
	if (node != small)
		free(node);
	return r;
}

/* An edge: claim the waiter of that direction (to be finished once the lock is dropped: a
 * wake-up may take a system call), or remember the edge. Lock held. */
static struct wait *deliver(struct fdesc *d, struct wait **slot, uint32_t bit)
{
	struct wait *w = *slot;
	if (w) {
		*slot = NULL;
		if (wait_claim(w))
			return w;
	}
	d->ready |= bit;
	return NULL;
}

/* epoll_pwait2 (Linux 5.11) waits to the nanosecond; before it, and under qemu-user, which
 * lacks it, epoll_wait's milliseconds are rounded down and the caller loops. */
static int epoll_wait_ns(struct epoll_event *ev, int max, struct timespec *tp)
{
	static atomic_bool no_pwait2;
	if (!atomic_load_explicit(&no_pwait2, memory_order_relaxed)) {
		int n = epoll_pwait2(poller.ep, ev, max, tp, NULL);
		if (n >= 0 || errno != ENOSYS)
			return n;
		atomic_store(&no_pwait2, true);
	}
	int ms = tp ? (int)(tp->tv_sec * 1000 + tp->tv_nsec / 1000000) : -1;
	return epoll_wait(poller.ep, ev, max, ms);
}

void poll_collect(struct poll_batch *b, int64_t deadline)
{
	struct timespec ts = { 0, 0 }, *tp = NULL;
	if (deadline != INT64_MAX) {
		int64_t left = deadline - weft_now();
		if (left > 0)
			ts = (struct timespec){ left / 1000000000, left % 1000000000 };
		tp = &ts;
	}
	b->n = epoll_wait_ns(b->ev, POLL_BATCH, tp);
}

int poll_dispatch(const struct poll_batch *b)
{
	int woken = 0;
	for (int i = 0; i < b->n; i++) {
		int fd = b->ev[i].data.fd;
		uint32_t e = b->ev[i].events;
		if (fd < 0) {
			uint64_t v;
			if (sys_read(poller.ev, &v, sizeof v) < 0) {
			}
			continue;
		}
		struct fdesc *d = fdesc_of(fd, false);
		if (!d)
			continue;
		struct wait *r = NULL, *w = NULL;
		struct poll_node *polls = NULL;
		if (e & (EPOLLPRI | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) /* before anyone has the edge */
			atomic_store_explicit(&d->drains, 0, memory_order_release);
		spin_lock(&d->lock);
		if (e & (EPOLLIN | EPOLLPRI | EPOLLRDHUP | EPOLLHUP | EPOLLERR))
			r = deliver(d, &d->reader, EPOLLIN);
		if (e & (EPOLLOUT | EPOLLHUP | EPOLLERR))
			w = deliver(d, &d->writer, EPOLLOUT);
		claim_polls(d, e, &polls);
		spin_unlock(&d->lock);
		if (r)
			wait_finish(r, 0);
		if (w)
			wait_finish(w, 0);
		woken += (r != NULL) + (w != NULL) + finish_polls(polls, 0);
	}
	return woken;
}

int poll_run(int64_t deadline)
{
	struct poll_batch b;
	poll_collect(&b, deadline);
	return poll_dispatch(&b);
}

static atomic_long interrupts;

long poll_interrupts(void)
{
	return atomic_load_explicit(&interrupts, memory_order_relaxed);
}

void poll_interrupt(void)
{
	atomic_fetch_add_explicit(&interrupts, 1, memory_order_relaxed);
	uint64_t one = 1;
	if (sys_write(poller.ev, &one, sizeof one) < 0) {
	}
}

void poll_forget(int fd)
{
	struct fdesc *d = fdesc_of(fd, false);
	/* Nothing to forget about an fd weft never managed (every close() under the shim comes
	 * here, from any code: a sanitizer's symbolizer closing its files in the middle of a
	 * report must not touch weft's state). Registration and waiting need poll_manage. */
	if (!d || (!atomic_load_explicit(&d->registered, memory_order_relaxed) &&
		   atomic_load_explicit(&d->user_nonblock, memory_order_relaxed) == -1))
		return;
	spin_lock(&d->lock);
	if (atomic_load_explicit(&d->registered, memory_order_relaxed))
		epoll_ctl(poller.ep, EPOLL_CTL_DEL, fd, NULL);
	atomic_store_explicit(&d->registered, false, memory_order_relaxed);
	d->ready = 0;
	atomic_store_explicit(&d->user_nonblock, -1, memory_order_relaxed);
	atomic_store_explicit(&d->not_socket, false, memory_order_relaxed);
	atomic_store_explicit(&d->drains, -1, memory_order_relaxed);
	atomic_store_explicit(&d->drained, 0, memory_order_relaxed);
	struct wait *r = d->reader && wait_claim(d->reader) ? d->reader : NULL;
	struct wait *w = d->writer && wait_claim(d->writer) ? d->writer : NULL;
	d->reader = d->writer = NULL;
	struct poll_node *polls = NULL;
	claim_polls(d, ~0u, &polls);
	spin_unlock(&d->lock);
	if (r)
		wait_finish(r, -EBADF);
	if (w)
		wait_finish(w, -EBADF);
	finish_polls(polls, -EBADF);
}
