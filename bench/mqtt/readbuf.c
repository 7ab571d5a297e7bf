/*
 * readbuf.c - buffered reads under libmosquitto. libmosquitto reads each packet with three
 * read() calls or more (the type byte, the length one byte at a time, the rest): at 100,000
 * messages/s that is the generator's main cost, and the generator shares the cores with the
 * broker. So read() is interposed (libmosquitto calls
 * it through the PLT): on a socket registered here it refills a 64 KiB buffer with one system
 * call and serves libmosquitto's small reads from it. Only the worker that owns a connection
 * reads its socket, so a buffer needs no lock. Since epoll cannot see bytes already in the
 * buffer, conn_read reads until the buffer and the socket are both empty (or marks the
 * connection pending when it stops early).
 */
#define _GNU_SOURCE
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "loadgen.h"

#define RBUF (64 << 10)
struct rbuf {
	char *data;
	size_t off, len;
};
static struct rbuf *rbufs; /* indexed by fd; NULL: no buffering (idle and storm modes) */
static int nrbufs;

ssize_t read(int fd, void *buf, size_t n)
{
	struct rbuf *b = rbufs && fd >= 0 && fd < nrbufs && rbufs[fd].data ? &rbufs[fd] : NULL;
	if (!b)
		return syscall(SYS_read, fd, buf, n);
	if (b->off == b->len) {
		if (n >= RBUF)
			return syscall(SYS_read, fd, buf, n);
		ssize_t k = syscall(SYS_read, fd, b->data, RBUF);
		if (k <= 0)
			return k;
		b->off = 0;
		b->len = (size_t)k;
	}
	size_t k = n < b->len - b->off ? n : b->len - b->off;
	memcpy(buf, b->data + b->off, k);
	b->off += k;
	return (ssize_t)k;
}

void rbuf_register(int fd)
{
	if (!rbufs || fd < 0 || fd >= nrbufs || rbufs[fd].data)
		return;
	rbufs[fd].data = malloc(RBUF);
	rbufs[fd].off = rbufs[fd].len = 0;
}

bool rbuf_pending(int fd)
{
	return rbufs && fd >= 0 && fd < nrbufs && rbufs[fd].off < rbufs[fd].len;
}


/* Buffers for the descriptors there can be (traffic mode; LOADGEN_UNBUFFERED=1 turns them off,
 * to measure what they save). */
void rbuf_init(void)
{
	struct rlimit rl;
	getrlimit(RLIMIT_NOFILE, &rl);
	nrbufs = rl.rlim_cur < 1 << 20 ? (int)rl.rlim_cur : 1 << 20;
	const char *unbuf = getenv("LOADGEN_UNBUFFERED");
	if (!unbuf || !*unbuf)
		rbufs = calloc((size_t)nrbufs, sizeof *rbufs);
}
