/*
 * weft.h - the whole public API of weft, a runtime for very many lightweight tasks
 * multiplexed over one worker thread per core.
 *
 * Conventions (see docs/design.md). Everything added to this header follows them; a few older
 * names keep the spelling they had before the naming rule (channels: put/take wait as long as
 * it takes, send/recv take a deadline, offer/poll never wait; the I/O calls, weft_read and its
 * kin and weft_fd_wait, always take a deadline, WEFT_FOREVER for none).
 *  - Results: functions return 0 (or a non-negative count or index) on success and a negative
 *    errno value on failure. Constructors that return a handle return NULL and set errno.
 *  - Errors mean one thing each: -EINVAL an argument that can never be right (NULL, out of
 *    range, a handle of the wrong kind); -ESRCH a task handle whose task is gone; -ETIMEDOUT
 *    the deadline passed first; -ECANCELED the calling task is cancelled; -EAGAIN a call that
 *    never waits would have had to; -EPIPE a closed channel; -ENOMEM, -EMSGSIZE as usual.
 *  - Names: a call that may wait comes as NAME, which waits as long as it takes (and returns
 *    -ECANCELED when the task is cancelled), and NAME_until, the same with an absolute deadline
 *    as its last argument (weft_join / weft_join_until, weft_sem_wait / weft_sem_wait_until);
 *    a variant that never waits prefixes the verb with try (weft_sem_trywait). Only weft_sleep
 *    takes a duration, since a sleep is nothing but its time.
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

/* libweft is built with hidden visibility: what this header declares is all it exports. */
#pragma GCC visibility push(default)

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
 * the number of CPUs the calling thread may run on (its affinity mask, as nproc(1) counts).
 * With one worker per CPU of that set, each worker is pinned to its own CPU while weft_run
 * runs, so that the kernel never stacks two workers on one core (see weft_unpin for threads
 * a task starts). Tasks still alive when main_task returns are discarded, as in Go:
 * their stacks are released without running them further; so a plain thread waiting for a
 * task of this run (weft_join, a JOIN case of weft_select) must be done before weft_run
 * returns, since the task is not there afterwards. weft_run may be called again
 * afterwards, but not from inside a task. Returns -EINVAL for a NULL main_task, -EBUSY when
 * weft is already running, -ENOMEM or -EAGAIN when workers cannot be created.
 *
 * A worker held by one task (a blocking call the shim does not cover, a long computation) for
 * 10 ms while work waits behind it has that work taken over by an idle worker, or by a spare
 * worker thread when none is idle; a spare stops taking work (standby) once more workers than
 * CPUs have been free for a second, so that a program does not go on with more workers than
 * cores, and is called back when needed again. At a light load (the workers together using
 * less CPU time than one fewer could give, over 100 ms) workers are parked the same way, one
 * at a time, and called back as soon as work waits; weft_stats shows them in standby.
 *
 * Environment: WEFT_WORKERS=n; WEFT_PIN=0 leaves the workers unpinned; WEFT_PARK=0 keeps every
 * worker at work; WEFT_DEADLOCK=0 turns off deadlock detection; WEFT_SPARE_MS=m keeps spares
 * m ms instead of a second.
 */
int weft_run(int (*main_task)(void *), void *arg);

/*
 * A thread inherits its creator's CPU set, so a plain thread started by a task runs only on
 * that task's worker's CPU while the workers are pinned. Called first thing in such a thread,
 * weft_unpin gives it every CPU weft_run's caller had. 0, or a negative errno from
 * sched_setaffinity; nothing to do (0) when the workers are not pinned. weft's own threads
 * (the blocking pool, spare workers) do this themselves.
 */
int weft_unpin(void);

/* ------------------------------------------------------------------------------------------ */
/* Tasks                                                                                      */
/* ------------------------------------------------------------------------------------------ */

typedef struct weft_task weft_task;

/*
 * A task gets stack_size bytes less weft's record of the task (a few hundred bytes at the top
 * of the stack; the message below says the usable size). A task that overflows its stack ends
 * the program with "weft: task <id> (<name>) overflowed its <size>-byte stack": at once when
 * its stack has a guard page, as the first $WEFT_STACK_GUARDS stacks do (default: a quarter of
 * vm.max_map_count less 2048, 14,334 on a default kernel, so that half of the mappings stay for
 * the program); beyond that, when the task next parks with no deadline or ends, or within 16
 * switches (a canary check). Compile tasks' code with -fstack-clash-protection: without it a
 * frame bigger than a page can step over the guard page and write into the stack below,
 * another task's, before anything faults (with it, a stack with a guard page faults there
 * first; one beyond the guard budget is still caught after the fact).
 */
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
 * A handle names one task for good: a task's memory is reused by later spawns once it has
 * been joined (or, detached, has ended), but the handle carries a generation, and every call
 * on a handle whose task is gone returns -ESRCH (weft_task_id 0) instead of acting on the task
 * that took its place. (The generation has 22 bits: a handle is mistaken for a live one only
 * if its task's memory has been reused a multiple of 4,194,304 times since.)
 *
 * Wait for t to finish and release it. Returns 0; -EINVAL for NULL, a detached task or
 * joining oneself; -EBUSY when another caller is already joining t (a weft_join, or a
 * weft_select with t in a JOIN case, until that call returns); -ESRCH when t is gone (joined
 * already); -ECANCELED if the caller was cancelled while waiting (t stays joinable).
 */
int weft_join(weft_task *t);

/* weft_join, waiting until the deadline at most: -ETIMEDOUT when t has not finished by then
 * (t stays joinable; a deadline already past only looks). Other results as weft_join. */
int weft_join_until(weft_task *t, int64_t deadline);

/* Let the other runnable tasks of this worker run. From a plain thread: sched_yield(). */
void weft_yield(void);

/*
 * Sleep until the deadline. Returns 0, or -ECANCELED. From a plain thread it sleeps the thread
 * (clock_nanosleep, absolute).
 */
int weft_sleep_until(int64_t deadline);

/* Sleep for ns nanoseconds from now (0 or less: do not sleep): weft_sleep_until(weft_now() +
 * ns), the one call that takes a duration (see the naming rule above). 0, or -ECANCELED. */
int weft_sleep(int64_t ns);

/* Run n tasks of fn(arg) and return when all have finished: 0, or -EINVAL (n <= 0, fn NULL). */
int weft_execute(int n, void (*fn)(void *), void *arg);

/* The calling task (the handle weft_spawn returned for it), or NULL on a thread that is not
 * running a weft task. */
weft_task *weft_self(void);

/* The task's id (unique for the process, > 0) and name; 0 and "" for NULL or a task that is
 * gone. The name is valid until the task is joined (a detached task's, until it ends). */
uint64_t weft_task_id(const weft_task *t);
const char *weft_task_name(const weft_task *t);

/*
 * The index of the worker thread the caller runs on, in 0..weft_worker_max()-1, or -1 on a
 * thread that is not a weft worker. A task may move to another worker at any blocking call or
 * yield, so the index is only good for choosing a per-worker cache (of memory, of counters)
 * that is then used without blocking. weft_worker_max() is fixed for the whole of weft_run
 * (it counts the spare workers the monitor may start when workers are held in blocking calls:
 * $WEFT_MAX_SPARES, by default 10,000) and is 0 outside it.
 */
int weft_worker_id(void);
int weft_worker_max(void);

/*
 * Cancel t: its current blocking call and every later one return -ECANCELED (sleeping, joining,
 * channel and lock waits alike). The task decides how to wind up; nothing is unwound by force.
 * The groups t owns (weft_group_new) are cancelled with it, down the tree.
 * Returns 0 (also for a task that has ended but is not joined yet); -EINVAL for NULL; -ESRCH
 * when t is gone (joined, or detached and ended), which is safe to ask at any time.
 */
int weft_cancel(weft_task *t);

/* Nonzero when the calling task has been cancelled (or its group's deadline has passed). */
int weft_cancelled(void);

/*
 * Write a line per live task to fd, as Go's goroutine dump: id, name, state, what a parked
 * task waits for (sleep, join, chan recv, mutex, fd read, ...) and on which object, for how
 * long (to about a millisecond), and where it was spawned (file+offset, for addr2line):
 *
 *   task 12 (conn): chan recv on 0x55d0c0a1c2a0 for 153 ms, spawned at ./server+0x1a2b
 *   task 14 (query): in a system call for 2210 ms on worker 1, spawned at ./server+0x1c40
 *
 * A task on a worker shows "running", or "in a system call" when its worker's thread is
 * blocked in the kernel (a call weft does not cover: see the shim), with how long it has held
 * the worker (to a few milliseconds; left out while the task has only just begun). Returns
 * the number of tasks, -EBADF, or -EINVAL outside a task. While weft runs, SIGQUIT (Ctrl-\)
 * prints the same dump to stderr and exits with status 2, unless the program has a SIGQUIT
 * handler of its own. The deadlock report lists the blocked tasks the same way.
 */
int weft_dump(int fd);

/* Counters of one worker since weft_run began. */
typedef struct weft_worker_stats {
	uint64_t switches; /* switches into tasks */
	uint64_t parks;    /* times a task parked here */
	uint64_t wakes;    /* tasks woken here: by hand-off, deadline or cancel */
	uint64_t steals;   /* batches of tasks taken from other workers */
	int64_t idle_ns;   /* time spent asleep (futex or epoll) */
	int standby;       /* 1: in standby, taking no work until the monitor needs it again: a
			    * spare once the worker it was started for is back, or a worker
			    * parked at a light load (weft_run) */
} weft_worker_stats;

/*
 * Fill out[0..max) with each worker's counters (spares the monitor started included) and
 * *foreign (may be NULL) with the tasks woken by plain threads. Returns the number of workers,
 * or -EINVAL when weft is not running. Counters are read without stopping anyone: exact once
 * the program is quiet (then parks = wakes summed over workers, plus foreign wake-ups).
 * WEFT_STATS=1 prints them on stderr when weft_run ends.
 */
int weft_stats(weft_worker_stats *out, int max, uint64_t *foreign);

/* Parks of tasks and threads by what they waited for (see weft_stats_waits). */
typedef struct weft_wait_stats {
	const char *what; /* "mutex", "channel recv", "sleep", "fd read", "join", ... */
	uint64_t waits;   /* times a task or thread parked for it: contended acquisitions */
	int64_t wait_ns;  /* total time parked */
} weft_wait_stats;

/*
 * Fill out[0..max) with the waits since weft_run began, one entry per kind; returns how many
 * entries, 0 when not counting, -EINVAL on bad arguments. Timing every wait costs two clock
 * reads, so weft counts only when WEFT_STATS or WEFT_TRACE is set in the environment when
 * weft_run starts; WEFT_STATS=1 prints this table beside the workers' at exit.
 */
int weft_stats_waits(weft_wait_stats *out, int max);

/*
 * With WEFT_TRACE=path set when weft_run started: write the trace recorded so far to path now
 * (the whole file, replacing what an earlier flush wrote), and go on recording; weft_run still
 * writes the full trace when it returns. Recording pauses while the file is written, so the
 * write's own moment is missing from it. Returns 0 (also when not tracing) or -errno when the
 * file cannot be written. Any thread may call it.
 *
 * A program stopped by SIGTERM or SIGINT never returns from weft_run. So while weft runs with
 * WEFT_TRACE or WEFT_STATS set, and the program has no handler of its own for the signal, the
 * first SIGTERM or SIGINT writes the trace and prints the statistics, then ends the program as
 * the signal would have (its exit status says the signal).
 */
int weft_trace_flush(void);

/* ------------------------------------------------------------------------------------------ */
/* Task groups                                                                                */
/* ------------------------------------------------------------------------------------------ */

/*
 * A task group (Go's errgroup, Trio's nursery, libdill's bundle) answers for the tasks spawned
 * into it, its members, together: wait for all of them, cancel all of them, keep the first
 * error.
 *
 *     weft_group *g = weft_group_new(WEFT_FOREVER);
 *     for (int i = 0; i < n; i++)
 *             weft_group_spawn(g, worker, &job[i]);
 *     int err = weft_group_wait(g);         -- 0, or the first failing member's result
 *     weft_group_free(g);
 *
 *  - A member runs int fn(void *arg): 0 is success, anything else (a negative errno, by the
 *    conventions above) failure. The first failure becomes the group's error and cancels the
 *    group: the other members are cancelled, later spawns refused.
 *  - Cancelling a group cancels each member as weft_cancel does, and every group a member
 *    owns, down the whole tree.
 *  - A group is owned by the task that made it, and weft_cancel of a task cancels the groups it
 *    owns: a closer that is cancelled takes its workers down with it. When the owner ends
 *    first, the group has no owner from then on (its members go on); a group made on a plain
 *    thread has none.
 *  - A deadline: from the group's deadline on its members count as cancelled: a blocking call
 *    returns -ECANCELED once it passes (one waiting then is woken at it), and weft_cancelled()
 *    says so. A group takes the earlier of its own deadline and its maker's (the deadline of
 *    the group the making task is a member of), so deadlines nest.
 *  - Members are detached: there is nothing to join, and each one's memory is released as it
 *    ends.
 */
typedef struct weft_group weft_group;

/*
 * A new group, owned by the calling task (by nobody on a plain thread), whose members are
 * cancelled from `deadline` on (WEFT_FOREVER: never; see above for the maker's deadline). A
 * group made by a task already cancelled starts cancelled. NULL with errno ENOMEM.
 */
weft_group *weft_group_new(int64_t deadline);

/*
 * Spawn fn(arg) as a member of g. From a task, as weft_spawn; opts as for weft_spawn_opt
 * (detached must be 0: members always are). Returns 0; -ECANCELED when g is cancelled or its
 * deadline has passed (nothing was spawned); -EINVAL (g or fn NULL, a stack too small, detached
 * set, called outside a task); -ENOMEM.
 */
int weft_group_spawn(weft_group *g, int (*fn)(void *), void *arg);
int weft_group_spawn_opt(weft_group *g, int (*fn)(void *), void *arg, const weft_spawn_opts *opts);

/*
 * Wait until every member of g has ended. Returns g's error (the first non-zero result of a
 * member; after a cancel, usually that of a member that gave up with -ECANCELED), or 0 if every
 * member returned 0; -EINVAL for NULL. The owner's wait is not cut short by its own
 * cancellation: cancelling the owner cancels the group, and its wait goes on until the members
 * have ended, so that none outlives it (a member that ignores cancellation holds it; bound it
 * with weft_group_wait_until). Any other task waiting returns -ECANCELED when cancelled. Any
 * number of tasks and threads may wait at once.
 */
int weft_group_wait(weft_group *g);

/* weft_group_wait until the deadline at most: -ETIMEDOUT when members remain then (they go on;
 * wait again, or cancel). */
int weft_group_wait_until(weft_group *g, int64_t deadline);

/* Cancel every member of g and every group they own; spawns into g return -ECANCELED from now
 * on. Returns 0, or -EINVAL for NULL. A second cancel does nothing more. */
int weft_group_cancel(weft_group *g);

/* The number of members that have not ended yet (a snapshot; 0 for NULL). */
size_t weft_group_len(const weft_group *g);

/*
 * Release g. It must have no members left (wait first): weft prints "weft: weft_group_free on
 * a group with N members" and aborts otherwise. NULL does nothing.
 */
void weft_group_free(weft_group *g);

/* ------------------------------------------------------------------------------------------ */
/* Channels                                                                                   */
/* ------------------------------------------------------------------------------------------ */

/*
 * A channel carries packets of at most packet_size bytes between tasks and plain threads, in
 * FIFO order. Its capacity says how many packets it buffers:
 *   0               synchronous hand-off: a send waits until a receiver takes the packet;
 *   1               a bounded buffer of one packet (a rendezvous slot): fire and forget;
 *   N               a ring of N packets;
 *   WEFT_UNBOUNDED  grows in segments as needed: sends never wait.
 * Packet storage is allocated once, by weft_chan_new (an unbounded channel allocates a segment
 * when it grows past what it holds, and keeps one spare): sending and receiving allocate
 * nothing. Any number of tasks and threads may send and receive on one channel at once.
 * Sends, receives and selects that complete without waiting still switch tasks now and then:
 * every 512 of them on a worker (offer and poll aside, which never switch), the caller yields
 * to the tasks queued behind it, so a task that never waits (a sender on an unbounded channel)
 * does not keep its worker to itself. A channel used over and over from one worker is biased to
 * it: its lock then costs no atomic operation there, and the first locker from elsewhere pays a
 * membarrier(2) to take the bias away (WEFT_CHAN_BIAS=0 in the environment turns biasing off).
 *
 * A packet is atomic: it is delivered whole to exactly one receiver, or not at all. The
 * receiver names how many bytes it wants (cap): a longer packet is cropped to cap, a shorter
 * one zero-padded up to cap, and the call returns the length that was sent.
 *
 * Deadlines are absolute (weft_now()). A deadline already past means "do not wait": the call
 * completes if it can at once and otherwise returns -ETIMEDOUT. A cancelled task's call
 * returns -ECANCELED when it would have to wait (or is waiting); a call that can complete at
 * once still does. Either way no packet is lost or duplicated: a send that failed did not
 * send, a receive that failed took nothing.
 */
typedef struct weft_chan weft_chan;

#define WEFT_UNBOUNDED ((size_t)-1) /* capacity of a channel that grows without limit */

/*
 * A new channel of `capacity` packets (0, N, or WEFT_UNBOUNDED) of at most packet_size bytes
 * each. Returns NULL with errno EINVAL (packet_size 0 or above INT_MAX, capacity * packet size
 * overflows) or ENOMEM.
 */
weft_chan *weft_chan_new(size_t capacity, size_t packet_size);

/*
 * Send the len bytes at p, waiting until the deadline for room (or, at capacity 0, for a
 * receiver to take it). Returns 0 once the packet is in the channel (capacity 0: in a
 * receiver's hands); -EMSGSIZE if len > packet_size; -EPIPE if the channel is or gets closed
 * (the packet was not sent); -ETIMEDOUT; -ECANCELED; -EINVAL (c NULL, p NULL with len > 0);
 * -ENOMEM when an unbounded channel cannot grow.
 */
int weft_chan_send(weft_chan *c, const void *p, size_t len, int64_t deadline);

/*
 * Receive the oldest packet into buf, waiting until the deadline for one. Exactly cap bytes of
 * buf are written: the packet cropped or zero-padded to cap. Returns the packet's sent length
 * (0..packet_size), which may be more than cap; -EPIPE once the channel is closed and drained;
 * -ETIMEDOUT; -ECANCELED; -EINVAL (c NULL, buf NULL with cap > 0).
 */
int weft_chan_recv(weft_chan *c, void *buf, size_t cap, int64_t deadline);

/* weft_chan_send with WEFT_FOREVER: waits as long as it takes. */
int weft_chan_put(weft_chan *c, const void *p, size_t len);

/* weft_chan_recv with WEFT_FOREVER: waits as long as it takes. */
int weft_chan_take(weft_chan *c, void *buf, size_t cap);

/*
 * Send only if that needs no waiting (room in the buffer, or at capacity 0 a receiver already
 * waiting). Returns 0, or -EAGAIN when it would have to wait; other errors as weft_chan_send.
 */
int weft_chan_offer(weft_chan *c, const void *p, size_t len);

/*
 * Receive only if a packet is there (buffered, or at capacity 0 a sender already waiting).
 * Returns the sent length, or -EAGAIN when it would have to wait; other errors as
 * weft_chan_recv.
 */
int weft_chan_poll(weft_chan *c, void *buf, size_t cap);

/*
 * Close c: later sends fail with -EPIPE; receivers still get the packets buffered, then -EPIPE.
 * Tasks and threads waiting in a send or receive on c wake with -EPIPE (a waiting sender's
 * packet is not sent). Closing twice, or closing NULL, does nothing.
 */
void weft_chan_close(weft_chan *c);

/*
 * Release c and the packets still in it. Nobody may use c any more. Freeing a channel that
 * still has tasks or threads waiting on it is a program error: weft prints
 * "weft: weft_chan_free on a channel with N waiters" and aborts (close it and let the waiters
 * leave first). NULL does nothing. A channel used after it is freed is usually caught too
 * ("weft: channel 0x... used after weft_chan_free", and abort) until its memory is reused;
 * build with ASan (`make SANITIZE=address`) to catch every case.
 */
void weft_chan_free(weft_chan *c);

/* Number of packets buffered in c right now (a snapshot; 0 for NULL). */
size_t weft_chan_len(weft_chan *c);

/* Number of senders and receivers (tasks, threads, select cases) parked on c right now, or
 * just leaving after a deadline or cancellation (a snapshot; 0 for NULL). */
size_t weft_chan_waiting(weft_chan *c);

/* Name c for the task dump ("chan recv on jobs"): up to 31 bytes are kept. weft_chan_name
 * returns "" for a channel without a name. */
void weft_chan_set_name(weft_chan *c, const char *name);
const char *weft_chan_name(const weft_chan *c);

/*
 * Select: wait on several sends and receives at once, over any channels, and on fds and task
 * exits too, with one deadline, and do exactly one of them. Describe each case with a
 * weft_select_case (the helpers weft_select_send, weft_select_recv, weft_select_fd and
 * weft_select_join fill one in):
 *  - SEND, RECV: a send or receive on `chan`, done as weft_chan_send / weft_chan_recv would.
 *  - FD: `fd` is ready for `events` (EPOLLIN and/or EPOLLOUT, <sys/epoll.h>), level-triggered
 *    as poll(2) and weft_fd_wait. The case only looks: it reads nothing, takes no edge from a
 *    task reading or writing fd, and any number of cases and tasks may wait on one fd at once.
 *    result: the events ready (EPOLLIN, EPOLLOUT, EPOLLERR, EPOLLHUP: the same bits as
 *    poll(2)'s), or -EBADF when fd is not open or was closed with weft_close meanwhile. An fd
 *    a select has waited on must be closed with weft_close (or close() under the shim).
 *  - JOIN: `task` has finished. Only the case done joins it: result 0, the task is released as
 *    by weft_join. If the select returns anything else (another case, -ETIMEDOUT, -ECANCELED),
 *    the task stays joinable, even if it finished meanwhile.
 * There is no case for a second deadline: the select's deadline is its timer; a wait for
 * "whichever of two times comes first" is a wait for the earlier one.
 */
enum { WEFT_SELECT_SEND = 1, WEFT_SELECT_RECV = 2, WEFT_SELECT_FD = 3, WEFT_SELECT_JOIN = 4 };

typedef struct weft_select_case {
	weft_chan *chan;        /* SEND, RECV; NULL: the case is never chosen (to switch a case
				 * off). Not used by FD and JOIN cases */
	int op;                 /* WEFT_SELECT_SEND, _RECV, _FD or _JOIN */
	union {
		const void *packet; /* SEND: the packet to send */
		void *buf;          /* RECV: where the packet goes */
		weft_task *task;    /* JOIN: the task to join; NULL: never chosen */
		struct {
			int fd;          /* FD: the fd; < 0: never chosen (as for poll(2)) */
			uint32_t events; /* FD: EPOLLIN and/or EPOLLOUT */
		};
	};                      /* (fd and events share the pointer's 8 bytes on 64-bit targets) */
	size_t len;             /* SEND: the packet's length; RECV: cap, as for weft_chan_recv */
	int result;             /* out, for the case done: SEND 0; RECV the sent length;
				 * either -EPIPE when the channel is closed; FD the events ready
				 * or -EBADF; JOIN 0 */
} weft_select_case;

#define WEFT_SELECT_MAX 64 /* cases in one weft_select */

static inline weft_select_case weft_select_send(weft_chan *c, const void *p, size_t len)
{
	weft_select_case k = { c, WEFT_SELECT_SEND, { p }, len, 0 };
	return k;
}

static inline weft_select_case weft_select_recv(weft_chan *c, void *buf, size_t cap)
{
	weft_select_case k = { c, WEFT_SELECT_RECV, { buf }, cap, 0 };
	return k;
}

static inline weft_select_case weft_select_fd(int fd, uint32_t events)
{
	weft_select_case k = { NULL, WEFT_SELECT_FD, { NULL }, 0, 0 };
	k.fd = fd;
	k.events = events;
	return k;
}

static inline weft_select_case weft_select_join(weft_task *t)
{
	weft_select_case k = { NULL, WEFT_SELECT_JOIN, { NULL }, 0, 0 };
	k.task = t;
	return k;
}

/*
 * Do one of the n cases, waiting until the deadline for one to become possible. When several
 * are possible, one is chosen uniformly at random, so none starves. A case on a closed channel
 * is possible: it is done with result -EPIPE (a receive drains buffered packets first). A case
 * whose channel (FD: fd, JOIN: task) is NULL (< 0) is never chosen. A select never pairs its
 * own send with its own receive. Returns the index of the case done, with cases[i].result set;
 * -ETIMEDOUT; -ECANCELED; -EINVAL (cases NULL with n > 0, n < 0 or > WEFT_SELECT_MAX, a bad op
 * or buffer, FD events without EPOLLIN or EPOLLOUT, one task in two JOIN cases, a JOIN case on
 * a detached task or on the caller itself); -ESRCH when a JOIN case's task is gone (joined
 * already); -EBUSY when another caller (a weft_join, a select) is joining it, as weft_join
 * says too; -EMSGSIZE when a send case's packet exceeds its channel's packet size;
 * -ENOMEM when an unbounded channel cannot grow; -errno when epoll refuses an FD case's fd
 * (EPERM: a regular file, which poll(2) would call always ready). Those errors come before any
 * case is done. n == 0 just waits until the deadline. From a plain thread, FD cases are seen
 * by the workers of a weft_run in progress (they poll the fds); without one, only an fd ready
 * when the select looks is seen.
 */
int weft_select(weft_select_case *cases, int n, int64_t deadline);

/* ------------------------------------------------------------------------------------------ */
/* Locks and other synchronisation                                                            */
/* ------------------------------------------------------------------------------------------ */

/*
 * Every lock here is a plain struct with a static initialiser, so a global needs no init call:
 *
 *     static weft_mutex lock = WEFT_MUTEX_INIT;
 *     WEFT_WITH_LOCK(&lock) { shared++; }           -- unlocked however the block is left
 *
 * All of them work from tasks (the task parks; its worker runs other tasks) and from plain OS
 * threads (the thread sleeps on a futex), and a task and a thread may share one. Calls that
 * take a deadline return 0, -ETIMEDOUT once it has passed (a deadline already past means "do
 * not block"), or -ECANCELED when the calling task is cancelled (weft_cancel) while blocked or
 * about to block. Calls without a deadline that return int block forever and honour
 * cancellation; those that return void (weft_mutex_lock, weft_rwlock_rdlock/wrlock) cannot fail
 * and ignore cancellation, so that a lock taken in a block always is taken. Fields starting with
 * `_` are private. Misuse (unlocking what is not locked, destroying a lock that has waiters) is
 * reported as "weft: ..." on stderr followed by abort() in debug builds (without NDEBUG).
 */

/* A FIFO of parked waiters (private): the queue of the channels, semaphores, conditions,
 * rwlocks, wait groups and once below (weft_mutex keeps its two ends as _head and _tail). */
struct weft_waitq {
	void *_first, *_last;
};

/* ---- mutex ------------------------------------------------------------------------------ */

/*
 * A task-aware mutual-exclusion lock, built for contention (see src/mutex.c): an uncontended
 * lock/unlock pair costs one atomic instruction (where Linux has membarrier); a contended lock
 * spins briefly while the holder runs on another core, then parks. Unlocking does not hand the
 * lock to a waiter (the running task may take it again at once, for throughput), except that a
 * waiter that has waited about 1 ms at the head of the queue gets it handed over directly, so
 * no waiter starves. Not recursive. Any task or thread may unlock a locked mutex (as in Go);
 * unlocking one that is not locked aborts. Unlock reads the mutex after releasing it, so its
 * memory must stay valid until every weft_mutex_unlock call on it has returned: a task that
 * takes the lock, finds it has the last reference and frees the object must not assume the
 * previous holder's unlock has returned (reclaim such objects after a grace period, as
 * weft-mqtt's sessions do).
 */
typedef struct weft_mutex {
	unsigned char _locked;  /* 1 while held (src/mutex.c) */
	unsigned char _flags;   /* what an unlock must look at: waiters, woken, starving */
	unsigned char _qlock;   /* guards the queue */
	unsigned int _ticks;    /* unlocks made while waiters were queued (a running count) */
	void *_owner;           /* worker of the last taker: spin only if it is another core */
	int64_t _turn;          /* when the head waiter joined the queue */
	void *_head, *_tail;    /* parked waiters */
} weft_mutex;

#define WEFT_MUTEX_INIT { 0, 0, 0, 0, 0, 0, 0, 0 }

/* Initialise m at run time: the same as assigning WEFT_MUTEX_INIT. */
void weft_mutex_init(weft_mutex *m);

/* Take m, waiting as long as it takes. Never fails; cancellation does not interrupt it. */
void weft_mutex_lock(weft_mutex *m);

/* Take m if it is free: 0, or -EAGAIN when it is held. Never blocks. */
int weft_mutex_trylock(weft_mutex *m);

/* Take m, waiting until the deadline at most: 0, -ETIMEDOUT or -ECANCELED. */
int weft_mutex_lock_until(weft_mutex *m, int64_t deadline);

/* Release m. It must be locked (by anyone); unlocking a mutex that is not locked aborts with
 * "weft: weft_mutex_unlock: mutex is not locked". */
void weft_mutex_unlock(weft_mutex *m);

/* Check that m can be thrown away. Debug builds abort when it is locked or has waiters;
 * otherwise nothing to do (a mutex owns no memory). */
void weft_mutex_destroy(weft_mutex *m);

/* Internal helpers of WEFT_WITH_LOCK. */
static inline weft_mutex *weft__with_lock(weft_mutex *m)
{
	weft_mutex_lock(m);
	return m;
}

static inline void weft__with_unlock(weft_mutex **m)
{
	if (*m)
		weft_mutex_unlock(*m);
	*m = 0;
}

#define WEFT__CAT2(a, b) a##b
#define WEFT__CAT(a, b) WEFT__CAT2(a, b)

/*
 * WEFT_WITH_LOCK(&m) { ... } runs the block with m locked and unlocks it however the block is
 * left: at its end, by break, continue, return or goto (a cleanup attribute on the loop
 * variable, GNU C). The block runs exactly once. Blocks nest.
 */
#define WEFT_WITH_LOCK(m)                                                                          \
	for (weft_mutex *WEFT__CAT(weft__held_, __LINE__)                                          \
		     __attribute__((cleanup(weft__with_unlock))) = weft__with_lock(m);             \
	     WEFT__CAT(weft__held_, __LINE__); weft__with_unlock(&WEFT__CAT(weft__held_, __LINE__)))

/* ---- semaphore --------------------------------------------------------------------------- */

/* A counting semaphore. Units released by weft_sem_post go to the longest waiter first. */
typedef struct weft_sem {
	unsigned int _lock;
	unsigned int _count;
	struct weft_waitq _q;
} weft_sem;

#define WEFT_SEM_INIT(value) { 0, (value), { 0, 0 } }

/* Initialise s with `value` units: 0. */
int weft_sem_init(weft_sem *s, unsigned int value);

/* Take one unit, waiting for one if there is none: 0 or -ECANCELED. */
int weft_sem_wait(weft_sem *s);

/* Take one unit, waiting until the deadline at most: 0, -ETIMEDOUT or -ECANCELED. */
int weft_sem_wait_until(weft_sem *s, int64_t deadline);

/* Take one unit if there is one: 0, or -EAGAIN. */
int weft_sem_trywait(weft_sem *s);

/* Release one unit, to the first waiter if any: 0, or -EOVERFLOW when the count would exceed
 * UINT_MAX. */
int weft_sem_post(weft_sem *s);

/* The number of units available now (a snapshot). */
unsigned int weft_sem_value(weft_sem *s);

/* Debug builds abort when s has waiters. */
void weft_sem_destroy(weft_sem *s);

/* ---- condition variable ------------------------------------------------------------------ */

/* A condition variable for weft_mutex. Wake-ups are never spurious: a wait that returns 0 was
 * ended by a signal or broadcast meant for it (still re-check your predicate when several
 * waiters compete for the state it guards). */
typedef struct weft_cond {
	unsigned int _lock;
	unsigned int _pad;
	struct weft_waitq _q;
} weft_cond;

#define WEFT_COND_INIT { 0, 0, { 0, 0 } }

/* Initialise c: the same as assigning WEFT_COND_INIT. */
void weft_cond_init(weft_cond *c);

/* Release m (which the caller holds), wait for a signal, take m again. Returns 0 or
 * -ECANCELED; m is held again on return in every case. */
int weft_cond_wait(weft_cond *c, weft_mutex *m);

/* Same, until the deadline at most: 0, -ETIMEDOUT or -ECANCELED; m is held again on return.
 * A deadline already past returns -ETIMEDOUT without releasing m. */
int weft_cond_wait_until(weft_cond *c, weft_mutex *m, int64_t deadline);

/* Wake the longest waiter, if any. Holding the mutex is not required. Returns how many were
 * woken (0 or 1). */
int weft_cond_signal(weft_cond *c);

/* Wake every waiter. Returns how many were woken. */
int weft_cond_broadcast(weft_cond *c);

/* Debug builds abort when c has waiters. */
void weft_cond_destroy(weft_cond *c);

/* ---- reader-writer lock ------------------------------------------------------------------ */

/*
 * Many readers or one writer. Neither side starves: once a writer waits, new readers queue
 * behind it; when a writer unlocks, every reader then waiting is let in together, before the
 * next writer.
 */
typedef struct weft_rwlock {
	unsigned int _lock;
	unsigned int _readers;   /* readers holding it */
	unsigned int _writer;    /* 1 while a writer holds it */
	unsigned int _pad;
	struct weft_waitq _rq;   /* waiting readers */
	struct weft_waitq _wq;   /* waiting writers */
} weft_rwlock;

#define WEFT_RWLOCK_INIT { 0, 0, 0, 0, { 0, 0 }, { 0, 0 } }

/* Initialise rw: the same as assigning WEFT_RWLOCK_INIT. */
void weft_rwlock_init(weft_rwlock *rw);

/* Take rw for reading / writing, waiting as long as it takes (never fails, not cancellable). */
void weft_rwlock_rdlock(weft_rwlock *rw);
void weft_rwlock_wrlock(weft_rwlock *rw);

/* Same, until the deadline at most: 0, -ETIMEDOUT or -ECANCELED. */
int weft_rwlock_rdlock_until(weft_rwlock *rw, int64_t deadline);
int weft_rwlock_wrlock_until(weft_rwlock *rw, int64_t deadline);

/* Take rw for reading / writing if that needs no wait: 0, or -EAGAIN. */
int weft_rwlock_tryrdlock(weft_rwlock *rw);
int weft_rwlock_trywrlock(weft_rwlock *rw);

/* Release a read or write hold (rw knows which). Unlocking an rwlock that nobody holds aborts
 * with "weft: weft_rwlock_unlock: rwlock is not locked". */
void weft_rwlock_unlock(weft_rwlock *rw);

/* Debug builds abort when rw is held or has waiters. */
void weft_rwlock_destroy(weft_rwlock *rw);

static inline weft_rwlock *weft__with_rdlock(weft_rwlock *rw)
{
	weft_rwlock_rdlock(rw);
	return rw;
}

static inline weft_rwlock *weft__with_wrlock(weft_rwlock *rw)
{
	weft_rwlock_wrlock(rw);
	return rw;
}

static inline void weft__with_rwunlock(weft_rwlock **rw)
{
	if (*rw)
		weft_rwlock_unlock(*rw);
	*rw = 0;
}

/* WEFT_WITH_RDLOCK(&rw) { ... } / WEFT_WITH_WRLOCK(&rw) { ... }: as WEFT_WITH_LOCK. */
#define WEFT__WITH_RW(rw, take)                                                                    \
	for (weft_rwlock *WEFT__CAT(weft__rwheld_, __LINE__)                                       \
		     __attribute__((cleanup(weft__with_rwunlock))) = take(rw);                     \
	     WEFT__CAT(weft__rwheld_, __LINE__);                                                  \
	     weft__with_rwunlock(&WEFT__CAT(weft__rwheld_, __LINE__)))
#define WEFT_WITH_RDLOCK(rw) WEFT__WITH_RW(rw, weft__with_rdlock)
#define WEFT_WITH_WRLOCK(rw) WEFT__WITH_RW(rw, weft__with_wrlock)

/* ---- wait group -------------------------------------------------------------------------- */

/* Wait for a collection of tasks to finish (Go's sync.WaitGroup): add before starting each,
 * done when each finishes, wait for the count to reach zero. */
typedef struct weft_waitgroup {
	unsigned int _lock;
	unsigned int _pad;
	int64_t _count;
	struct weft_waitq _q;
} weft_waitgroup;

#define WEFT_WAITGROUP_INIT { 0, 0, 0, { 0, 0 } }

/* Initialise wg: the same as assigning WEFT_WAITGROUP_INIT. */
void weft_waitgroup_init(weft_waitgroup *wg);

/* Add delta (may be negative) to the count; reaching zero releases every waiter. Returns 0.
 * A count that goes negative aborts with "weft: weft_waitgroup_add: negative count". */
int weft_waitgroup_add(weft_waitgroup *wg, int64_t delta);

/* weft_waitgroup_add(wg, -1). */
int weft_waitgroup_done(weft_waitgroup *wg);

/* Wait until the count is zero: 0 or -ECANCELED. */
int weft_waitgroup_wait(weft_waitgroup *wg);

/* Same, until the deadline at most: 0, -ETIMEDOUT or -ECANCELED. */
int weft_waitgroup_wait_until(weft_waitgroup *wg, int64_t deadline);

/* ---- once -------------------------------------------------------------------------------- */

/* Run an initialisation exactly once, whoever asks first (pthread_once, Go's sync.Once). */
typedef struct weft_once {
	unsigned int _state;     /* 0 not run, 1 running, 2 done */
	unsigned int _lock;
	const void *_runner;     /* the task or thread running fn: recursion check */
	struct weft_waitq _q;
} weft_once;

#define WEFT_ONCE_INIT { 0, 0, 0, { 0, 0 } }

/*
 * Run fn(arg) if no call on o has run it yet; otherwise wait until the call that runs it has
 * returned. Returns 0 once fn has completed, or -ECANCELED if the caller was cancelled while
 * waiting for another caller's fn (fn itself is never interrupted). Calling weft_call_once on o
 * from inside its own fn aborts in debug builds (it could never finish).
 */
int weft_call_once(weft_once *o, void (*fn)(void *), void *arg);

/* ---- barrier ----------------------------------------------------------------------------- */

/* n parties meet: each waits until all n have arrived, then all go on, and the barrier is
 * ready for the next round. */
typedef struct weft_barrier {
	unsigned int _lock;
	unsigned int _n;         /* parties per round */
	unsigned int _arrived;   /* arrived in this round */
	unsigned int _round;
	struct weft_waitq _q;
} weft_barrier;

#define WEFT_BARRIER_INIT(n) { 0, (n), 0, 0, { 0, 0 } }

/* weft_barrier_wait's result for the one caller that completed the round. */
#define WEFT_BARRIER_LAST 1

/* Initialise b for n parties: 0, or -EINVAL when n is 0. */
int weft_barrier_init(weft_barrier *b, unsigned int n);

/* Arrive and wait for the rest of the round: WEFT_BARRIER_LAST for the caller that completed
 * it, 0 for the others, or -ECANCELED (the caller leaves the round: it no longer counts). */
int weft_barrier_wait(weft_barrier *b);

/* Same, until the deadline at most; -ETIMEDOUT also leaves the round. */
int weft_barrier_wait_until(weft_barrier *b, int64_t deadline);

/* Debug builds abort when b has waiters. */
void weft_barrier_destroy(weft_barrier *b);

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
 * (or close() under the shim). After a read of a TCP socket that returned less than it asked
 * for (the socket is then empty), a task's next read waits for new data before it tries the
 * system call (docs/design.md, "Drained reads"): one system call less per request. A read
 * with a deadline already past, or whose wait for new data times out, makes the system call.
 */
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

/* Wait until fd is ready: events is EPOLLIN and/or EPOLLOUT (<sys/epoll.h>). 0 or -errno.
 * Level-triggered, as poll(2): data already waiting (say, left by a read that filled its
 * buffer) answers at once. */
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

/* A listening TCP socket on host:port (host NULL or "": all addresses, IPv6 and IPv4 on one
 * dual-stack socket where the host has IPv6; port 0: any). Returns the fd or -errno. Name
 * resolution runs on the blocking pool. */
int weft_tcp_listen(const char *host, int port, int backlog);
/* A TCP connection to host:port (TCP_NODELAY set), tried address by address until one
 * answers or the deadline passes. Returns the fd or -errno. A name is resolved on the blocking
 * pool (getaddrinfo blocks); a numeric address ("127.0.0.1", "::1") is used as it is. */
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

/* ------------------------------------------------------------------------------------------ */
/* Flows                                                                                      */
/* ------------------------------------------------------------------------------------------ */

/*
 * A flow is a graph of nodes declared in a .flux file (docs/flows.md) and compiled into C by
 * weft-flux: x.flux gives x_flow.h (the records and the prototypes of the user's node
 * functions, conditions and guard set-up calls) and x_flow.c (tables describing the graph and
 * a weft_flow object named x_flow). Each event - a node's input record - runs as a task, or for
 * a detached node on the blocking pool; guards park the event, never a worker.
 *
 * The weft_flow_* structs below are filled in by generated code; programs only pass the flow
 * object around.
 */
enum {
	WEFT_FLOW_DETACHED = 1, /* node runs on the blocking pool */
	WEFT_FLOW_ABSTRACT = 2, /* node has no function: it routes by its rules */
	WEFT_FLOW_SOURCE = 4,   /* re-run after every run, until the flow stops */
	WEFT_FLOW_INITIAL = 8,  /* run once before the sources */
};

/* Guard kinds and the modes a node takes them in. */
enum {
	WEFT_FLOW_EXCLUSIVE = 1, /* one holder per key */
	WEFT_FLOW_READ,          /* readwrite guard, shared */
	WEFT_FLOW_WRITE,         /* readwrite guard, one holder */
	WEFT_FLOW_POOL,          /* each holder gets one item of the pool */
	WEFT_FLOW_FREE,          /* the value, without synchronisation */
};

#define WEFT_FLOW_MAX_GUARDS 8 /* guards one node may take */

/* One routing rule of an abstract node: when test(in) passes (NULL: always), the input goes to
 * every target (one for a sequence, several for a fan-out). */
typedef struct weft_flow_rule {
	int (*test)(const void *in);
	const int *targets;
	int ntargets;
} weft_flow_rule;

/* One guard a node takes: which guard, in which mode, the key taken from the input record,
 * and which atom (field of the node's atoms record) receives the value. */
typedef struct weft_flow_use {
	int guard;
	int mode;
	void (*key)(const void *in, void *key);
	int atom;
} weft_flow_use;

typedef struct weft_flow_node {
	const char *name;
	/* calls the user's function: the atoms are pointers to the guard values, in order */
	int (*call)(const void *in, void *out, void **atoms);
	unsigned in_size, out_size;
	unsigned flags;                /* WEFT_FLOW_DETACHED, ... */
	const int *next;               /* nodes fed by this node's output */
	int nnext;
	const weft_flow_rule *rules;   /* abstract nodes */
	int nrules;
	const weft_flow_use *uses;     /* guards, in the flow's global order */
	int nuses;
	int on_error;                  /* handler node, or -1 */
	unsigned err_offset;           /* where the handler's input holds `int err` */
} weft_flow_node;

typedef struct weft_flow_guard {
	const char *name;
	int kind;                      /* WEFT_FLOW_EXCLUSIVE, WEFT_FLOW_READ (readwrite), ... */
	unsigned key_size;
} weft_flow_guard;

typedef struct weft_flow {
	const char *name;
	const weft_flow_node *nodes;
	int nnodes;
	const weft_flow_guard *guards;
	int nguards;
	const int *sources;
	int nsources;
	const int *initials;
	int ninitials;
	void (*init)(int argc, char **argv); /* the user's optional init and deinit */
	void (*deinit)(void);
	struct weft_flow_rt *_rt;            /* run-time state (src/flow.h) */
} weft_flow;

/*
 * Run the flow: the user's init(argc, argv), then the initial nodes (each runs once, in
 * order, before the sources start), then every source, re-run after each of its runs. Each
 * output record becomes an event for the node's successors. Returns when the flow is over:
 * after weft_flow_stop or weft_flow_kill once the events in flight are done, or, in a flow
 * without sources, when no event is left. Then calls the user's deinit() and, when
 * $WEFT_FLOW_STATS=1, prints the per-node counters on stderr. Called from a plain thread it
 * runs weft (weft_run) for the duration; from a task it runs in the caller's weft. Returns 0,
 * -EBUSY when the flow is already running, -ENOMEM, or weft_run's error.
 */
int weft_flow_run(weft_flow *f, int argc, char **argv);

/* Drain: sources stop re-running; events in flight (and those they emit) run to the end. */
void weft_flow_stop(weft_flow *f);

/* Stop now: sources stop, events not yet started are dropped, outputs are no longer routed;
 * node functions already running finish their call. */
void weft_flow_kill(weft_flow *f);

/*
 * Splay: from inside a node function, emit the record in *out now as one event for the node's
 * successors, then go on (out may be refilled and emitted again). The record left in *out when
 * the function returns 0 is emitted as usual, unless weft_flow_drop(out) was called. out must
 * be the pointer the node was given. Returns 0, or -ECANCELED once the flow is killed.
 */
int weft_flow_emit(void *out);

/* From inside a node function: do not emit the final output record of this run. */
void weft_flow_drop(void *out);

/*
 * Guard values, normally set in init (weft-flux generates typed wrappers, G_set and G_add):
 * set the value of key in guard g (exclusive, readwrite or free), or add an item to pool g.
 * Returns 0, -EINVAL (bad guard or kind) or -ENOMEM.
 */
int weft_flow_guard_set(weft_flow *f, int g, const void *key, void *value);
int weft_flow_guard_add(weft_flow *f, int g, void *item);

/* Per-node counters: runs (events), errors (non-zero returns), and time spent in the node.
 * The time is measured on one run in 16 (and each node's first run on each worker) and scaled
 * up to all runs, since reading the clock can cost more than a small node; with
 * $WEFT_FLOW_STATS set every run is timed. */
typedef struct weft_flow_stats {
	const char *name;
	uint64_t events;
	uint64_t errors;
	int64_t time_ns;
} weft_flow_stats;

/* Fill out[0..max) with each node's counters (a snapshot, read without stopping anyone), in
 * declaration order. Returns the number of nodes; 0 before the flow first ran. */
int weft_flow_stats_get(weft_flow *f, weft_flow_stats *out, int max);

/* Write the counters as a table to fd: 0 or -errno. */
int weft_flow_stats_print(weft_flow *f, int fd);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif /* WEFT_H */
