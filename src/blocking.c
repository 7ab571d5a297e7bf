/*
 * blocking.c - the blocking pool: OS threads for work that must block (OFlux's detached
 * execution). weft_blocking(fn, arg) queues a job and parks the calling task; a pool thread
 * runs fn(arg) and wakes the task. The pool grows on demand up to $WEFT_BLOCKING_THREADS
 * (default 64) threads; a thread idle for IDLE_NS retires. The pool outlives weft_run.
 *
 * The wait is not cancellable: fn may use the caller's stack until it returns.
 */
#define _GNU_SOURCE
#include "blocking.h"

#include <errno.h>
#include <stdbool.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "trace.h"
#include "wait.h"
#include "weft.h"

#define IDLE_NS (10LL * 1000000000)

struct job {
	void (*fn)(void *);
	void *arg;
	struct job *next;
	struct wait *w;
};

static struct {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct job *head, *tail;
	int threads, idle, max;
	atomic_int busy;     /* jobs queued or running */
	atomic_int nthreads; /* for deadlock detection: threads that are weft's own */
} B = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };

int blocking_jobs(void)
{
	return atomic_load(&B.busy);
}

int blocking_threads(void)
{
	return atomic_load(&B.nthreads);
}

static struct job *next_job(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += IDLE_NS / 1000000000;
	while (!B.head) {
		B.idle++;
		int r = pthread_cond_timedwait(&B.cond, &B.lock, &ts);
		B.idle--;
		if (r == ETIMEDOUT && !B.head)
			return NULL;
	}
	struct job *j = B.head;
	B.head = j->next;
	if (!B.head)
		B.tail = NULL;
	return j;
}

static void *pool_thread(void *arg)
{
	(void)arg;
	weft_unpin(); /* started from a worker: its CPU set (affinity.c) */
	pthread_mutex_lock(&B.lock);
	struct job *j;
	while ((j = next_job())) {
		pthread_mutex_unlock(&B.lock);
		trace_call(j->fn, true);
		j->fn(j->arg);
		trace_call(j->fn, false);
		pthread_mutex_lock(&B.lock);
		wait_wake(j->w, 0);
		atomic_fetch_sub(&B.busy, 1);
	}
	B.threads--;
	atomic_fetch_sub(&B.nthreads, 1);
	pthread_mutex_unlock(&B.lock);
	return NULL;
}

static int max_threads(void)
{
	const char *e = getenv("WEFT_BLOCKING_THREADS");
	int n = e && *e ? atoi(e) : 64;
	return n < 1 ? 1 : n;
}

/* Queue j and make sure a thread will take it. Lock held. */
static int submit(struct job *j)
{
	if (!B.max)
		B.max = max_threads();
	if (B.idle == 0 && B.threads < B.max) {
		pthread_t t;
		pthread_attr_t a;
		pthread_attr_init(&a);
		pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
		int err = pthread_create(&t, &a, pool_thread, NULL);
		pthread_attr_destroy(&a);
		if (err && B.threads == 0)
			return -err;
		if (!err) {
			B.threads++;
			atomic_fetch_add(&B.nthreads, 1);
		}
	}
	j->next = NULL;
	if (B.tail)
		B.tail->next = j;
	else
		B.head = j;
	B.tail = j;
	atomic_fetch_add(&B.busy, 1);
	pthread_cond_signal(&B.cond);
	return 0;
}

int weft_blocking(void (*fn)(void *), void *arg)
{
	if (!fn)
		return -EINVAL;
	if (!weft_self()) { /* a plain thread may block itself */
		fn(arg);
		return 0;
	}
	struct job j = { .fn = fn, .arg = arg };
	pthread_mutex_lock(&B.lock);
	j.w = wait_begin_nocancel("blocking call", fn);
	int err = submit(&j);
	pthread_mutex_unlock(&B.lock);
	if (err) {
		wait_abandon(j.w);
		return err;
	}
	wait_park(j.w, WEFT_FOREVER); /* the pool thread touches j no more once it wakes us */
	return 0;
}
