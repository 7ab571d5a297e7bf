/*
 * lockheld.c - the library of lockheld.h. Every call takes its handle's mutex, checks that it
 * is alone inside (a count of holders, which a mutex shared out between two holders would let
 * reach 2), makes its blocking call, checks it is still on the same thread, and releases the
 * mutex, checking that pthreads agrees it was the holder.
 */
#define _GNU_SOURCE
#include "lockheld.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

struct lh {
	pthread_mutex_t m;
	atomic_int inside;
	long calls;
};

struct lh *lh_open(int kind)
{
	struct lh *h = calloc(1, sizeof *h);
	pthread_mutexattr_t a;
	if (!h || pthread_mutexattr_init(&a) || pthread_mutexattr_settype(&a, kind) ||
	    pthread_mutex_init(&h->m, &a)) {
		free(h);
		return NULL;
	}
	pthread_mutexattr_destroy(&a);
	return h;
}

void lh_close(struct lh *h)
{
	pthread_mutex_destroy(&h->m);
	free(h);
}

static int enter(struct lh *h, pthread_t *self)
{
	int err = pthread_mutex_lock(&h->m);
	if (err)
		return err;
	*self = pthread_self();
	if (atomic_fetch_add(&h->inside, 1) != 0)
		return EBUSY; /* left locked: the test ends here */
	h->calls++;
	return 0;
}

static int leave(struct lh *h, pthread_t self)
{
	if (!pthread_equal(self, pthread_self()))
		return EXDEV;
	atomic_fetch_sub(&h->inside, 1);
	return pthread_mutex_unlock(&h->m);
}

int lh_nap(struct lh *h, unsigned us)
{
	pthread_t self;
	int err = enter(h, &self);
	if (err)
		return err;
	usleep(us);
	return leave(h, self);
}

ssize_t lh_read(struct lh *h, int fd, void *buf, size_t n)
{
	pthread_t self;
	int err = enter(h, &self);
	if (!err) {
		ssize_t r = read(fd, buf, n);
		int read_errno = errno;
		if (!(err = leave(h, self))) {
			errno = read_errno;
			return r;
		}
	}
	errno = err;
	return -1;
}

long lh_calls(struct lh *h)
{
	pthread_mutex_lock(&h->m);
	long n = h->calls;
	pthread_mutex_unlock(&h->m);
	return n;
}
