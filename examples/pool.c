/*
 * pool: a worker pool with cancellation. pool() hands JOBS jobs to WORKERS workers through a
 * channel and returns when they are all done, or at the first failure, at its deadline, or
 * when the task running it is cancelled; whichever it is, no worker outlives it.
 *
 * The pool itself (the constants, struct pool, feed, work and pool below) is 49 lines, not
 * counting blank lines and comments; pool.go beside it, the same in Go with
 * errgroup.WithContext, a select on ctx.Done() in the feeder and in each worker and the
 * deadline in the context, is 39 counted the same way. The difference is mostly what Go
 * cannot fail at (making a channel, starting a goroutine) and what its closures capture (the
 * channel, here in struct pool). Written with weft_spawn and a weft_waitgroup instead, it took
 * more, and a cancelled closer's wait returned at once, leaving its workers running.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <weft.h>

enum { WORKERS = 8, JOBS = 200 };

struct pool {
	weft_chan *jobs;
	int bad;            /* the job that fails, or 0 */
	long done, running; /* jobs done, workers running */
};

/* A member of the group like the workers: cancelled with them, so it never waits for good. */
static int feed(void *arg)
{
	struct pool *p = arg;
	int r = 0;
	for (int job = 1; job <= JOBS && r == 0; job++)
		r = weft_chan_put(p->jobs, &job, sizeof job);
	weft_chan_close(p->jobs);
	return r;
}

static int work(void *arg)
{
	struct pool *p = arg;
	int job, r;
	__atomic_fetch_add(&p->running, 1, __ATOMIC_RELAXED);
	while ((r = weft_chan_take(p->jobs, &job, sizeof job)) >= 0) {
		if (job == p->bad) {
			r = -EIO;
			break;
		}
		if ((r = weft_sleep(100000)) < 0) /* the work: 100 us, unless cancelled */
			break;
		__atomic_fetch_add(&p->done, 1, __ATOMIC_RELAXED);
	}
	__atomic_fetch_sub(&p->running, 1, __ATOMIC_RELAXED);
	return r == -EPIPE ? 0 : r; /* -EPIPE: no jobs left */
}

/* 0, or the first failure: -EIO from the bad job, -ECANCELED at the deadline or on a cancel. */
static int pool(struct pool *p, int64_t deadline)
{
	weft_group *g = weft_group_new(deadline);
	if (!g || !(p->jobs = weft_chan_new(0, sizeof(int)))) {
		weft_group_free(g);
		return -ENOMEM;
	}
	int err = weft_group_spawn(g, feed, p);
	for (int i = 0; i < WORKERS && !err; i++)
		err = weft_group_spawn(g, work, p);
	if (err == -ENOMEM) /* could not start them all: stop those that did */
		weft_group_cancel(g);
	int first = weft_group_wait(g); /* -ECANCELED from a spawn: the wait says why */
	weft_group_free(g);
	weft_chan_free(p->jobs);
	return err == -ENOMEM ? err : first;
}

/* ---- the demonstration ------------------------------------------------------------------- */

static int closer_result;

static void closer(void *arg)
{
	closer_result = pool(arg, WEFT_FOREVER);
}

static int main_task(void *arg)
{
	(void)arg;
	struct pool a = { .bad = 0 }, b = { .bad = 50 }, c = { .bad = 0 }, d = { .bad = 0 };
	int r = pool(&a, WEFT_FOREVER);
	printf("all jobs:         %s, %ld done\n", strerror(-r), a.done);
	r = pool(&b, WEFT_FOREVER);
	printf("job 50 fails:     %s, %ld done\n", strerror(-r), b.done);
	r = pool(&c, weft_now() + 2000000);
	printf("2 ms deadline:    %s, %ld done\n", strerror(-r), c.done);
	weft_task *t = weft_spawn(closer, &d);
	weft_sleep(2000000);
	weft_cancel(t); /* cancels the group pool() made, and waits for its workers */
	weft_join(t);
	printf("closer cancelled: %s, %ld done, %ld running\n", strerror(-closer_result), d.done,
	       d.running);
	return 0;
}

int main(void)
{
	return weft_run(main_task, NULL);
}
