/*
 * io.c - task-aware file descriptor operations with deadlines.
 *
 * Each call makes the fd non-blocking (once; poll.c remembers what the program had set), tries
 * the system call, and on EAGAIN parks the task on the fd (poll_wait) until it is ready or the
 * deadline passes. A write is finished before it returns unless the deadline passes first
 * (then it returns what was written, or -ETIMEDOUT if nothing was). From a plain thread the
 * same calls block the thread (poll(2) with the deadline).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <netinet/in.h>
#include <netinet/tcp.h>

#include "poll.h"
#include "sys.h"
#include "weft.h"

static int thread_wait(int fd, uint32_t events, int64_t deadline)
{
	struct pollfd p = { .fd = fd, .events = (short)((events & EPOLLIN ? POLLIN : 0) |
							 (events & EPOLLOUT ? POLLOUT : 0)) };
	for (;;) {
		int64_t left = deadline == WEFT_FOREVER ? -1 : (deadline - weft_now()) / 1000000 + 1;
		if (deadline != WEFT_FOREVER && deadline <= weft_now())
			return -ETIMEDOUT;
		struct timespec ts = { left / 1000, (left % 1000) * 1000000 };
		int r = ppoll(&p, 1, left < 0 ? NULL : &ts, NULL);
		if (r > 0)
			return 0;
		if (r < 0 && errno != EINTR)
			return -errno;
	}
}

/* The poller is edge-triggered: it reports readiness that arrives after the last operation
 * that came back empty-handed. A caller of weft_fd_wait may not have gone that far (it read
 * one buffer of several waiting), so look at the level first, as poll(2) would. weft's own
 * operations wait only after EAGAIN and skip this system call. */
static bool ready_now(int fd, uint32_t events)
{
	struct pollfd p = { .fd = fd, .events = (short)((events & EPOLLIN ? POLLIN : 0) |
							 (events & EPOLLOUT ? POLLOUT : 0)) };
	struct timespec zero = { 0, 0 };
	return sys_ppoll(&p, 1, &zero) > 0;
}

int weft_fd_wait(int fd, uint32_t events, int64_t deadline)
{
	if (fd < 0)
		return -EBADF;
	if (!(events & (EPOLLIN | EPOLLOUT)))
		return -EINVAL;
	if (!weft_self())
		return thread_wait(fd, events, deadline);
	int err = poll_manage(fd);
	if (err)
		return err;
	/* after a read that left fd empty (poll.c, "drained reads"): no need to look at the level */
	if (events == EPOLLIN && (err = poll_read_wait(fd, deadline)) <= 0)
		return err == -ETIMEDOUT && ready_now(fd, events) ? 0 : err;
	return ready_now(fd, events) ? 0 : poll_wait(fd, events, deadline);
}

/* The wait of an operation that just said EAGAIN on a managed fd: the edge is still to come. */
static int wait_after_eagain(int fd, uint32_t events, int64_t deadline)
{
	return weft_self() ? poll_wait(fd, events, deadline) : thread_wait(fd, events, deadline);
}

/* Retry op while it says EAGAIN, waiting for `events` in between. `len`: for a read, the bytes
 * it asks for (a short one may leave fd drained); 0 for any other call. */
#define RETRY(fd, events, deadline, len, call)                             \
	do {                                                               \
		bool task_ = weft_self() != NULL;                          \
		size_t len_ = (len);                                       \
		if (task_) {                                               \
			int err_ = poll_manage(fd);                        \
			if (!err_ && len_)                                 \
				err_ = poll_read_wait(fd, deadline);       \
			if (err_ < 0 && err_ != -ETIMEDOUT)                \
				return err_;                               \
		}                                                          \
		for (;;) {                                                 \
			uint32_t tok_ = task_ && len_ ? poll_read_token(fd) : 0; \
			ssize_t r_ = (call);                               \
			if (r_ > 0 && (size_t)r_ < len_ && task_)          \
				poll_read_short(fd, tok_);                 \
			if (r_ >= 0)                                       \
				return r_;                                 \
			if (errno == EINTR)                                \
				continue;                                  \
			if (errno != EAGAIN && errno != EWOULDBLOCK)       \
				return -errno;                             \
			int w_ = wait_after_eagain((fd), (events), (deadline)); \
			if (w_ < 0)                                        \
				return w_;                                 \
		}                                                          \
	} while (0)

ssize_t weft_read(int fd, void *buf, size_t n, int64_t deadline)
{
	RETRY(fd, EPOLLIN, deadline, n, sys_read(fd, buf, n));
}

ssize_t weft_readv(int fd, const struct iovec *iov, int n, int64_t deadline)
{
	RETRY(fd, EPOLLIN, deadline, iov_total(iov, n), sys_readv(fd, iov, n));
}

ssize_t weft_recv(int fd, void *buf, size_t n, int flags, int64_t deadline)
{
	RETRY(fd, EPOLLIN, deadline, recv_len(fd, n, flags), sys_recvfrom(fd, buf, n, flags, NULL, NULL));
}

ssize_t weft_recvfrom(int fd, void *buf, size_t n, int flags, struct sockaddr *from,
		      socklen_t *fromlen, int64_t deadline)
{
	RETRY(fd, EPOLLIN, deadline, recv_len(fd, n, flags),
	      sys_recvfrom(fd, buf, n, flags, from, fromlen));
}

/* recvmsg takes no part in drained reads (a short read may stop before ancillary data: a
 * kernel-TLS control record, passed fds), but its reading the urgent byte turns the rule off. */
ssize_t weft_recvmsg(int fd, struct msghdr *m, int flags, int64_t deadline)
{
	RETRY(fd, EPOLLIN, deadline, recv_len(fd, 0, flags), sys_recvmsg(fd, m, flags));
}

/* On a socket, send(MSG_NOSIGNAL): a closed peer gives -EPIPE, not a SIGPIPE. */
static ssize_t write_call(int fd, const void *buf, size_t n)
{
	if (!poll_not_socket(fd)) {
		ssize_t r = sys_sendto(fd, buf, n, MSG_NOSIGNAL, NULL, 0);
		if (r >= 0 || errno != ENOTSOCK)
			return r;
		poll_set_not_socket(fd);
	}
	return sys_write(fd, buf, n);
}

static ssize_t write_once(int fd, const void *buf, size_t n, int64_t deadline)
{
	RETRY(fd, EPOLLOUT, deadline, 0, write_call(fd, buf, n));
}

static ssize_t sendto_once(int fd, const void *buf, size_t n, int flags,
			   const struct sockaddr *to, socklen_t tolen, int64_t deadline)
{
	RETRY(fd, EPOLLOUT, deadline, 0, sys_sendto(fd, buf, n, flags | MSG_NOSIGNAL, to, tolen));
}

ssize_t weft_write(int fd, const void *buf, size_t n, int64_t deadline)
{
	size_t done = 0;
	while (done < n) {
		ssize_t r = write_once(fd, (const char *)buf + done, n - done, deadline);
		if (r < 0)
			return done ? (ssize_t)done : r;
		done += (size_t)r;
	}
	return (ssize_t)done;
}

ssize_t weft_send(int fd, const void *buf, size_t n, int flags, int64_t deadline)
{
	size_t done = 0;
	while (done < n) {
		ssize_t r = sendto_once(fd, (const char *)buf + done, n - done, flags, NULL, 0, deadline);
		if (r < 0)
			return done ? (ssize_t)done : r;
		done += (size_t)r;
	}
	return (ssize_t)done;
}

ssize_t weft_sendto(int fd, const void *buf, size_t n, int flags, const struct sockaddr *to,
		    socklen_t tolen, int64_t deadline)
{
	return sendto_once(fd, buf, n, flags, to, tolen, deadline);
}

/* writev/sendmsg: finish partial writes by advancing through the vector. */
static ssize_t writev_once(int fd, const struct iovec *iov, int n, int64_t deadline)
{
	RETRY(fd, EPOLLOUT, deadline, 0, sys_writev(fd, iov, n));
}

static ssize_t sendmsg_once(int fd, const struct msghdr *m, int flags, int64_t deadline)
{
	RETRY(fd, EPOLLOUT, deadline, 0, sys_sendmsg(fd, m, flags | MSG_NOSIGNAL));
}

/* Copy of the not-yet-written part of iov after `done` bytes, into tmp (at most 64 entries). */
static int iov_rest(const struct iovec *iov, int n, size_t done, struct iovec *tmp)
{
	int k = 0;
	for (int i = 0; i < n && k < 64; i++) {
		if (done >= iov[i].iov_len) {
			done -= iov[i].iov_len;
			continue;
		}
		tmp[k].iov_base = (char *)iov[i].iov_base + done;
		tmp[k++].iov_len = iov[i].iov_len - done;
		done = 0;
	}
	return k;
}

ssize_t weft_writev(int fd, const struct iovec *iov, int n, int64_t deadline)
{
	size_t total = iov_total(iov, n), done = 0;
	struct iovec tmp[64];
	while (done < total) {
		int k = done ? iov_rest(iov, n, done, tmp) : n;
		ssize_t r = writev_once(fd, done ? tmp : iov, k, deadline);
		if (r < 0)
			return done ? (ssize_t)done : r;
		done += (size_t)r;
	}
	return (ssize_t)done;
}

ssize_t weft_sendmsg(int fd, const struct msghdr *m, int flags, int64_t deadline)
{
	size_t total = iov_total(m->msg_iov, (int)m->msg_iovlen), done = 0;
	struct iovec tmp[64];
	struct msghdr rest = *m;
	while (done < total || (total == 0 && done == 0)) {
		if (done) {
			rest.msg_iov = tmp;
			rest.msg_iovlen = (size_t)iov_rest(m->msg_iov, (int)m->msg_iovlen, done, tmp);
			rest.msg_control = NULL; /* ancillary data went with the first part */
			rest.msg_controllen = 0;
		}
		ssize_t r = sendmsg_once(fd, &rest, flags, deadline);
		if (r < 0)
			return done ? (ssize_t)done : r;
		done += (size_t)r;
		if (total == 0)
			break;
	}
	return (ssize_t)done;
}

static int accept_once(int fd, struct sockaddr *addr, socklen_t *len, int flags, int64_t deadline)
{
	RETRY(fd, EPOLLIN, deadline, 0, sys_accept4(fd, addr, len, flags));
}

/* The new fd is made non-blocking at once (saving the two fcntl calls of its first wait);
 * what the program asked for is remembered for the shim. */
int weft_accept(int fd, struct sockaddr *addr, socklen_t *len, int flags, int64_t deadline)
{
	int r = accept_once(fd, addr, len, flags | SOCK_NONBLOCK | SOCK_CLOEXEC, deadline);
	if (r >= 0)
		poll_set_user_nonblock(r, flags & SOCK_NONBLOCK);
	return r;
}

int weft_connect(int fd, const struct sockaddr *addr, socklen_t len, int64_t deadline)
{
	if (weft_self()) {
		int err = poll_manage(fd);
		if (err)
			return err;
	}
	if (sys_connect(fd, addr, len) == 0)
		return 0;
	if (errno != EINPROGRESS && errno != EAGAIN && errno != EINTR)
		return -errno;
	int r = weft_fd_wait(fd, EPOLLOUT, deadline);
	if (r < 0)
		return r;
	int soerr = 0;
	socklen_t sl = sizeof soerr;
	if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0)
		return -errno;
	return -soerr;
}

int weft_close(int fd)
{
	poll_forget(fd);
	return sys_close(fd) < 0 ? -errno : 0;
}

/* ---- socket helpers ---------------------------------------------------------------------- */

struct resolve {
	const char *host, *port;
	int passive, err;
	struct addrinfo *res;
};

static void resolve_job(void *p)
{
	struct resolve *r = p;
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
				  .ai_flags = r->passive ? AI_PASSIVE : 0 };
	r->err = getaddrinfo(r->host, r->port, &hints, &r->res);
}

/* Name resolution blocks: run it on the blocking pool - unless host is a numeric address (or
 * none, for listening on every address), which getaddrinfo turns into an address without
 * asking anyone (AI_NUMERICHOST): done here, it saves a hand-off to the pool and back, which
 * under load costs more than the connect itself. */
static int resolve(const char *host, int port, int passive, struct addrinfo **res)
{
	char ps[16];
	snprintf(ps, sizeof ps, "%d", port);
	struct resolve r = { .host = host && *host ? host : NULL, .port = ps, .passive = passive };
	struct addrinfo numeric = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
				    .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV |
						(passive ? AI_PASSIVE : 0) };
	if (getaddrinfo(r.host, r.port, &numeric, res) == 0)
		return 0;
	int err = weft_blocking(resolve_job, &r);
	if (err)
		return err;
	if (r.err) {
		if (r.err == EAI_SYSTEM)
			return -errno;
		return r.err == EAI_NONAME ? -ENOENT : -EHOSTUNREACH;
	}
	*res = r.res;
	return 0;
}

int weft_tcp_listen(const char *host, int port, int backlog)
{
	if (port < 0 || port > 65535)
		return -EINVAL;
	struct addrinfo *res;
	int err = resolve(host, port, 1, &res), fd = -1;
	if (err)
		return err;
	err = -EADDRNOTAVAIL;
	/* All addresses: IPv6's "::" first, made dual-stack (IPv4 clients come as ::ffff:a.b.c.d),
	 * since getaddrinfo lists 0.0.0.0 first and a listener there refuses every IPv6 client;
	 * 0.0.0.0 where the host has no IPv6. */
	bool any = !host || !*host;
	for (int pass = any ? 0 : 1; pass < 2 && fd < 0; pass++) {
		for (struct addrinfo *a = res; a; a = a->ai_next) {
			if (pass == 0 && a->ai_family != AF_INET6)
				continue;
			fd = socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
			if (fd < 0) {
				err = -errno;
				continue;
			}
			int one = 1, zero = 0;
			setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
			if (pass == 0)
				setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
			if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, backlog) == 0)
				break;
			err = -errno;
			sys_close(fd);
			fd = -1;
		}
	}
	freeaddrinfo(res);
	return fd >= 0 ? fd : err;
}

int weft_tcp_connect(const char *host, int port, int64_t deadline)
{
	if (!host || port <= 0 || port > 65535)
		return -EINVAL;
	struct addrinfo *res;
	int err = resolve(host, port, 0, &res), fd = -1;
	if (err)
		return err;
	err = -EHOSTUNREACH;
	for (struct addrinfo *a = res; a; a = a->ai_next) {
		fd = socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		if (fd < 0) {
			err = -errno;
			continue;
		}
		if ((err = weft_connect(fd, a->ai_addr, a->ai_addrlen, deadline)) == 0)
			break;
		weft_close(fd);
		fd = -1;
		if (err == -ETIMEDOUT || err == -ECANCELED)
			break;
	}
	freeaddrinfo(res);
	if (fd >= 0) {
		int one = 1;
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	}
	return fd >= 0 ? fd : err;
}

static int unix_addr(const char *path, struct sockaddr_un *a)
{
	if (!path || strlen(path) >= sizeof a->sun_path)
		return -ENAMETOOLONG;
	memset(a, 0, sizeof *a);
	a->sun_family = AF_UNIX;
	strcpy(a->sun_path, path);
	return 0;
}

int weft_unix_listen(const char *path, int backlog)
{
	struct sockaddr_un a;
	int err = unix_addr(path, &a);
	if (err)
		return err;
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (bind(fd, (struct sockaddr *)&a, sizeof a) < 0 || listen(fd, backlog) < 0) {
		err = -errno;
		sys_close(fd);
		return err;
	}
	return fd;
}

int weft_unix_connect(const char *path, int64_t deadline)
{
	struct sockaddr_un a;
	int err = unix_addr(path, &a);
	if (err)
		return err;
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if ((err = weft_connect(fd, (struct sockaddr *)&a, sizeof a, deadline))) {
		weft_close(fd);
		return err;
	}
	return fd;
}
