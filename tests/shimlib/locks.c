/*
 * Tasks holding pthread locks under the shim. A pthread lock belongs to its thread, so a task
 * that holds one must not park in a shimmed call: its worker would run other tasks, to which
 * pthreads would count the lock as theirs, and the task could resume on another thread. The
 * shim counts the locks a thread holds and, while it holds any, makes the call block the
 * thread in libc; the monitor gives the tasks queued behind it to another thread.
 *
 * liblockheld.so (lockheld.c) is code written for threads that holds a mutex across usleep and
 * read, as sqlite holds its connection's across its busy handler's sleep; sqlite.c runs
 * sqlite itself. Each test runs a child of this binary with the shim preloaded.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "lockheld.h"
#include "test.h"

/* ---- stress: tasks on every worker and plain threads, own handles and shared ones -------- */

enum { TASKS = 100, ROUNDS = 20, SHARED = 8, THREADS = 4, THREAD_ROUNDS = 100 };
static struct lh *shared[SHARED];

static void napper(void *arg)
{
	int i = (int)(intptr_t)arg;
	struct lh *own = lh_open(i % 2 ? PTHREAD_MUTEX_RECURSIVE : PTHREAD_MUTEX_ERRORCHECK);
	CHECK(own);
	for (int r = 0; r < ROUNDS; r++) {
		CHECK_EQ(lh_nap(own, 300 + (unsigned)(i * 37 + r * 11) % 700), 0);
		CHECK_EQ(usleep(200), 0); /* no lock held: this parks the task */
		CHECK_EQ(lh_nap(shared[(i + r) % SHARED], 100), 0);
	}
	CHECK_EQ(lh_calls(own), ROUNDS);
	lh_close(own);
}

static void *thread_napper(void *arg)
{
	int j = (int)(intptr_t)arg;
	for (int r = 0; r < THREAD_ROUNDS; r++)
		CHECK_EQ(lh_nap(shared[(j + r) % SHARED], 100), 0);
	return NULL;
}

static int stress_main(void *arg)
{
	(void)arg;
	for (int i = 0; i < SHARED; i++)
		CHECK((shared[i] = lh_open(i % 2 ? PTHREAD_MUTEX_RECURSIVE : PTHREAD_MUTEX_ERRORCHECK)));
	pthread_t th[THREADS];
	for (int j = 0; j < THREADS; j++)
		CHECK_EQ(pthread_create(&th[j], NULL, thread_napper, (void *)(intptr_t)j), 0);
	weft_task *t[TASKS];
	for (int i = 0; i < TASKS; i++)
		CHECK((t[i] = weft_spawn(napper, (void *)(intptr_t)i)));
	for (int i = 0; i < TASKS; i++)
		CHECK_EQ(weft_join(t[i]), 0);
	for (int j = 0; j < THREADS; j++)
		pthread_join(th[j], NULL);
	long calls = 0;
	for (int i = 0; i < SHARED; i++) {
		calls += lh_calls(shared[i]);
		lh_close(shared[i]);
	}
	CHECK_EQ(calls, TASKS * ROUNDS + THREADS * THREAD_ROUNDS);
	return 0;
}

TEST(child_stress)
{
	alarm(120); /* a hang (every worker in pthread_mutex_lock) fails rather than waits */
	RUN(stress_main);
}

/* Before, the library saw its mutex held by two callers at once (recursive: the second task on
 * the thread got in), refused to the holder (error-checking: EPERM, after the task moved), or
 * the program hung. */
TEST(tasks_holding_a_mutex_across_usleep_keep_their_thread_beside_plain_threads)
{
	test_run_shimmed("child_stress");
}

/* ---- a read with the mutex held, the writer queued behind it ----------------------------- */

/* One worker. The reader holds the handle's mutex in a read of a pipe that only the writer,
 * queued on the same worker, will fill; the writer then takes the same mutex. The read blocks
 * the thread, so the monitor must hand the writer to a spare; the writer's nap then waits for
 * the reader's unlock. Before, the read parked the reader, the writer ran on the same thread
 * and got the mutex while the reader held it (recursive) or EDEADLK (error-checking). */
static struct lh *rw_handle;
static int rw_pipe[2];

static void reader(void *arg)
{
	(void)arg;
	char b[8];
	CHECK_EQ(lh_read(rw_handle, rw_pipe[0], b, sizeof b), 5);
	CHECK(memcmp(b, "hello", 5) == 0);
}

static void writer(void *arg)
{
	(void)arg;
	CHECK_EQ(usleep(5000), 0);
	CHECK_EQ(write(rw_pipe[1], "hello", 5), 5);
	CHECK_EQ(lh_nap(rw_handle, 100), 0);
}

static int read_main(void *arg)
{
	int kind = *(int *)arg;
	for (int round = 0; round < 10; round++) {
		CHECK((rw_handle = lh_open(kind)));
		CHECK_EQ(pipe(rw_pipe), 0);
		char b;
		CHECK(read(rw_pipe[0], &b, 0) == 0); /* through the shim: weft makes it non-blocking */
		weft_task *r = weft_spawn(reader, NULL), *w = weft_spawn(writer, NULL);
		CHECK(r && w);
		CHECK_EQ(weft_join(r), 0);
		CHECK_EQ(weft_join(w), 0);
		CHECK_EQ(lh_calls(rw_handle), 2);
		lh_close(rw_handle);
		close(rw_pipe[0]);
		close(rw_pipe[1]);
	}
	return 0;
}

TEST(child_read)
{
	alarm(60);
	setenv("WEFT_WORKERS", "1", 1);
	int kinds[] = { PTHREAD_MUTEX_RECURSIVE, PTHREAD_MUTEX_ERRORCHECK };
	for (int i = 0; i < 2; i++)
		CHECK_EQ(weft_run(read_main, &kinds[i]), 0);
}

TEST(a_task_holding_a_mutex_across_read_keeps_its_thread_and_the_writer_runs_elsewhere)
{
	test_run_shimmed("child_read");
}

/* ---- what counts as holding a lock ------------------------------------------------------- */

/* One worker and no spares (WEFT_MAX_SPARES=0): a task whose usleep keeps its thread holds it
 * for the whole sleep, and a witness task queued behind cannot run meanwhile; one whose usleep
 * parks lets the witness run. Deterministic: nothing else can run the witness. */
static atomic_int witnessed;

static void witness(void *arg)
{
	(void)arg;
	atomic_store(&witnessed, 1);
}

/* usleep with a witness queued behind: returns whether the witness ran meanwhile (it parked).
 * A witness that did not run is joined after the next usleep that parks. */
static weft_task *unwitnessed[4];
static int nunwitnessed;

static bool usleep_parks(void)
{
	atomic_store(&witnessed, 0);
	weft_task *w = weft_spawn(witness, NULL);
	CHECK(w);
	CHECK_EQ(usleep(2000), 0);
	bool ran = atomic_load(&witnessed);
	if (!ran) {
		CHECK(nunwitnessed < 4);
		unwitnessed[nunwitnessed++] = w;
		return false;
	}
	CHECK_EQ(weft_join(w), 0);
	while (nunwitnessed > 0)
		CHECK_EQ(weft_join(unwitnessed[--nunwitnessed]), 0);
	return true;
}

static pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
static pthread_rwlock_t rw = PTHREAD_RWLOCK_INITIALIZER;
static pthread_spinlock_t spin;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;

/* take, then usleep keeps the thread; release, then usleep parks. */
#define HELD_UNTIL_RELEASED(take, release)                                                 \
	do {                                                                               \
		CHECK_EQ(take, 0);                                                         \
		CHECK(!usleep_parks());                                                    \
		CHECK_EQ(release, 0);                                                      \
		CHECK(usleep_parks());                                                     \
	} while (0)

static struct timespec in_ms(int ms)
{
	struct timespec t;
	clock_gettime(CLOCK_REALTIME, &t);
	t.tv_nsec += ms * 1000000L;
	t.tv_sec += t.tv_nsec / 1000000000;
	t.tv_nsec %= 1000000000;
	return t;
}

static pthread_mutex_t taken_by_thread = PTHREAD_MUTEX_INITIALIZER;
static atomic_int thread_stage;

/* A plain thread takes a mutex and a spin lock, and holds the mutex until told. */
static void *holder_thread(void *arg)
{
	(void)arg;
	CHECK_EQ(pthread_mutex_lock(&taken_by_thread), 0);
	CHECK_EQ(pthread_spin_lock(&spin), 0);
	atomic_store(&thread_stage, 1);
	while (atomic_load(&thread_stage) != 2)
		usleep(100);
	CHECK_EQ(pthread_mutex_unlock(&taken_by_thread), 0);
	return NULL;
}

static int counting_main(void *arg)
{
	(void)arg;
	CHECK(usleep_parks()); /* nothing held */
	struct timespec t = in_ms(1000);
	HELD_UNTIL_RELEASED(pthread_mutex_lock(&m), pthread_mutex_unlock(&m));
	HELD_UNTIL_RELEASED(pthread_mutex_trylock(&m), pthread_mutex_unlock(&m));
	HELD_UNTIL_RELEASED(pthread_mutex_timedlock(&m, &t), pthread_mutex_unlock(&m));
#if __GLIBC_PREREQ(2, 30) && !defined(__SANITIZE_THREAD__) /* TSan does not see clocklock's
								  * lock, and takes the unlock for
								  * a wrong one */
	HELD_UNTIL_RELEASED(pthread_mutex_clocklock(&m, CLOCK_REALTIME, &t), pthread_mutex_unlock(&m));
	HELD_UNTIL_RELEASED(pthread_rwlock_clockrdlock(&rw, CLOCK_REALTIME, &t),
			    pthread_rwlock_unlock(&rw));
	HELD_UNTIL_RELEASED(pthread_rwlock_clockwrlock(&rw, CLOCK_REALTIME, &t),
			    pthread_rwlock_unlock(&rw));
#endif
	HELD_UNTIL_RELEASED(pthread_rwlock_rdlock(&rw), pthread_rwlock_unlock(&rw));
	HELD_UNTIL_RELEASED(pthread_rwlock_tryrdlock(&rw), pthread_rwlock_unlock(&rw));
	HELD_UNTIL_RELEASED(pthread_rwlock_timedrdlock(&rw, &t), pthread_rwlock_unlock(&rw));
	HELD_UNTIL_RELEASED(pthread_rwlock_wrlock(&rw), pthread_rwlock_unlock(&rw));
	HELD_UNTIL_RELEASED(pthread_rwlock_trywrlock(&rw), pthread_rwlock_unlock(&rw));
	HELD_UNTIL_RELEASED(pthread_rwlock_timedwrlock(&rw, &t), pthread_rwlock_unlock(&rw));
	CHECK_EQ(pthread_spin_init(&spin, PTHREAD_PROCESS_PRIVATE), 0);
	HELD_UNTIL_RELEASED(pthread_spin_lock(&spin), pthread_spin_unlock(&spin));
	HELD_UNTIL_RELEASED(pthread_spin_trylock(&spin), pthread_spin_unlock(&spin));

	/* Two locks: held until both are released. */
	CHECK_EQ(pthread_mutex_lock(&m), 0);
	CHECK_EQ(pthread_rwlock_rdlock(&rw), 0);
	CHECK(!usleep_parks());
	HELD_UNTIL_RELEASED(pthread_mutex_unlock(&m), pthread_rwlock_unlock(&rw));

	/* A recursive mutex taken twice is held until released twice. */
	pthread_mutex_t rec;
	pthread_mutexattr_t a;
	CHECK_EQ(pthread_mutexattr_init(&a), 0);
	CHECK_EQ(pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE), 0);
	CHECK_EQ(pthread_mutex_init(&rec, &a), 0);
	CHECK_EQ(pthread_mutex_lock(&rec), 0);
	HELD_UNTIL_RELEASED(pthread_mutex_lock(&rec), pthread_mutex_unlock(&rec) +
							      pthread_mutex_unlock(&rec));
	/* Calls that fail take nothing: an error-checking mutex taken again (EDEADLK) is released
	 * by one unlock, and an unlock that pthreads refuses (EPERM) releases nothing (TSan rightly
	 * reports that unlock: not under TSan). */
	pthread_mutex_t ec;
	CHECK_EQ(pthread_mutexattr_settype(&a, PTHREAD_MUTEX_ERRORCHECK), 0);
	CHECK_EQ(pthread_mutex_init(&ec, &a), 0);
	CHECK_EQ(pthread_mutex_lock(&ec), 0);
	CHECK_EQ(pthread_mutex_lock(&ec), EDEADLK);
#if !defined(__SANITIZE_THREAD__)
	static pthread_mutex_t unheld = PTHREAD_ERRORCHECK_MUTEX_INITIALIZER_NP;
	CHECK_EQ(pthread_mutex_unlock(&unheld), EPERM);
#endif
	CHECK(!usleep_parks());
	CHECK_EQ(pthread_mutex_unlock(&ec), 0);
	CHECK(usleep_parks());
	pthread_mutexattr_destroy(&a);

	/* A condition wait gives its mutex back inside libc and takes it again: still held. */
	CHECK_EQ(pthread_mutex_lock(&m), 0);
	struct timespec soon = in_ms(1);
	CHECK_EQ(pthread_cond_timedwait(&cond, &m, &soon), ETIMEDOUT);
	CHECK(!usleep_parks());
	CHECK_EQ(pthread_mutex_unlock(&m), 0);
	CHECK(usleep_parks());

	/* Locks are counted per thread: a lock a plain thread holds is not the task's, and a
	 * trylock that finds it taken takes nothing. */
	pthread_t th;
	CHECK_EQ(pthread_create(&th, NULL, holder_thread, NULL), 0);
	while (atomic_load(&thread_stage) != 1)
		CHECK(usleep_parks());
	CHECK(usleep_parks());
	CHECK_EQ(pthread_mutex_trylock(&taken_by_thread), EBUSY);
	CHECK(usleep_parks());
#if !defined(__SANITIZE_THREAD__) /* which rightly reports an unlock on another thread */
	/* The task's release of the spin lock the thread took (spin locks have no owner) leaves
	 * the task's count at 0, not below, or the next lock would not count. */
	CHECK_EQ(pthread_spin_unlock(&spin), 0);
	HELD_UNTIL_RELEASED(pthread_mutex_lock(&m), pthread_mutex_unlock(&m));
#endif
	atomic_store(&thread_stage, 2);
	pthread_join(th, NULL);
	return 0;
}

TEST(child_counting)
{
	alarm(60);
	setenv("WEFT_WORKERS", "1", 1);
	setenv("WEFT_MAX_SPARES", "0", 1);
	RUN(counting_main);
}

TEST(every_pthread_lock_held_keeps_the_thread_and_only_while_held)
{
	test_run_shimmed("child_counting");
}

/* ---- connect with a lock held, on an fd weft made non-blocking ---------------------------- */

/* The task first reads the socket without a lock, which makes weft manage it (non-blocking in
 * the kernel, blocking as far as the program knows). Its connect with a lock held must then
 * wait for the connection as a plain thread's would, not say EINPROGRESS, nor park: the
 * witness queued behind it on the one worker, with no spares, runs only afterwards. The
 * listener's queue is full (backlog 0, one connection waiting), so the kernel drops the SYN
 * and the connection takes the second or so of its retransmission, after a plain thread has
 * accepted the first. */
static int listener;

static void *accept_later(void *arg)
{
	(void)arg;
	usleep(50000);
	int c = accept(listener, NULL, NULL);
	CHECK(c >= 0);
	return (void *)(intptr_t)c;
}

static int connect_main(void *arg)
{
	(void)arg;
	listener = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t al = sizeof a;
	CHECK(bind(listener, (struct sockaddr *)&a, sizeof a) == 0 && listen(listener, 0) == 0);
	CHECK(getsockname(listener, (struct sockaddr *)&a, &al) == 0);
	int first = socket(AF_INET, SOCK_STREAM, 0);
	CHECK_EQ(connect(first, (struct sockaddr *)&a, sizeof a), 0); /* fills the queue */
	int s = socket(AF_INET, SOCK_STREAM, 0);
	char b[4];
	CHECK(read(s, b, sizeof b) == -1); /* not connected: ENOTCONN, and weft manages s */
	pthread_t th;
	CHECK_EQ(pthread_create(&th, NULL, accept_later, NULL), 0);
	atomic_store(&witnessed, 0);
	weft_task *w = weft_spawn(witness, NULL);
	CHECK(w);
	CHECK_EQ(pthread_mutex_lock(&m), 0);
	CHECK_EQ(connect(s, (struct sockaddr *)&a, sizeof a), 0);
	CHECK_EQ(atomic_load(&witnessed), 0);
	CHECK_EQ(pthread_mutex_unlock(&m), 0);
	CHECK_EQ(weft_join(w), 0);
	void *c1;
	pthread_join(th, &c1);
	int c = accept(listener, NULL, NULL);
	CHECK(c >= 0);
	CHECK_EQ(write(s, "ping", 4), 4);
	CHECK_EQ(read(c, b, sizeof b), 4);
	close((int)(intptr_t)c1);
	close(c);
	close(s);
	close(first);
	close(listener);
	return 0;
}

TEST(child_connect)
{
	alarm(60);
	setenv("WEFT_WORKERS", "1", 1);
	setenv("WEFT_MAX_SPARES", "0", 1);
	RUN(connect_main);
}

TEST(connect_with_a_lock_held_waits_for_the_connection_on_its_thread)
{
	test_run_shimmed("child_connect");
}
