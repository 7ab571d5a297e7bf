/*
 * sched.h - workers and scheduling, as the rest of weft sees them: the worker's record, making
 * tasks runnable, switching. The scheduler is sched.c (queues, switching, the worker loop),
 * steal.c (taking work from other workers), idle.c (idle workers) and monitor.c (the monitor
 * thread); what those files share among themselves is in sched_state.h. Internal to weft.
 */
#ifndef WEFT_SCHED_H
#define WEFT_SCHED_H

#include <pthread.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "context.h"
#include "runq.h"
#include "stack.h"
#include "task.h"
#include "timer.h"

/*
 * A worker's record. Its fields are grouped by the file that owns them (writes them, or
 * decides what they mean); the order also sets the cache lines: the first group is what every
 * switch touches, the request line has a line of its own, and the timers start a new one.
 */
struct worker {
	/* sched.c: the queues and the running task, touched at every switch */
	struct runq q;
	weft_task *_Atomic next;      /* runs right after the current task: direct hand-off */
	weft_task *_Atomic inbox;     /* tasks other workers woke onto this one (sched_ready_on),
				       * linked by `link`, newest first */
	int id;
	weft_task *cur;               /* running task; NULL while in the worker loop */
	weft_task *prev;              /* the task just switched away from (finish_switch) */
	weft_ctx idle_ctx;            /* the worker thread's own stack: the worker loop */
	_Atomic uint32_t tick;        /* switches so far: paces periodic checks; the monitor
				       * reads it to tell a stuck worker */
	uint32_t next_streak;         /* consecutive runs from `next`, bounded for fairness */
	uint32_t slice_ops;           /* channel operations that did not wait (sched_slice) */
	/* the owner/thief protocol on q's head and `next` (sched_state.h, own_begin) */
	_Atomic uint32_t in_own;      /* the owner works on them alone */
	_Atomic uint32_t thieves;     /* thieves working on them: the owner must not be alone */
	/* steal.c */
	uint32_t rng;                 /* picks the first victim */
	bool declined_work;           /* this spin saw work it left to its worker (idle.c reads
				       * it: it backs off rather than sleep on the idle list) */
	int64_t request_wait_until;   /* it requested work: it spins until then at least */
	/* idle.c */
	bool spinning;                /* looking for work to steal (counted in nspinning) */
	int64_t spin_ns;              /* how long it looks before sleeping */
	int64_t back_off_ns;          /* how long it sleeps after a spin that declined work */
	atomic_bool sleeping_off_list; /* backing off, or in standby: only
					* sched_wake_for_inbox ends that sleep early */
	atomic_bool in_idle;          /* on the idle list; written under the idle lock */
	atomic_bool standby;          /* a spare no longer needed, or a parked worker: standby() */
	atomic_bool in_epoll;         /* its idle sleep is in epoll: wake it through the poller */
	/* steal.c, requests for work: a line of its own, which thieves write and the owner reads
	 * at every switch (serve_work_request), so that a thief looking does not pull the lines
	 * the owner writes there. */
	alignas(64) _Atomic uint32_t work_request; /* 1 + the id of a worker requesting half the
						    * ring, or 0 */
	_Atomic int64_t work_request_at; /* and since when */
	atomic_bool requesting_work;  /* it may have requests out: grant_work_request makes sure
				       * someone takes what it grants once this is false */
	/* sched.c: timers, task ids and counts */
	alignas(64) struct timer_wheel timers;
	uint64_t id_next, id_end;     /* block of task ids */
	_Atomic int64_t spawned, exited; /* live tasks = sum(spawned - exited) over workers;
					  * written by the owner only (counter_inc) */
	/* statistics (weft_stats): written by the owner, but requests_granted by the granters */
	_Atomic int64_t parks, wakes, steals, idle_ns;
	_Atomic int64_t requests_granted; /* batches others handed it when it requested work */
	/* idle.c */
	_Atomic uint32_t wake_word;   /* futex the idle worker sleeps on */
	struct worker *idle_link;
	/* sched.c: the thread */
	pthread_t thread;
	void *altstack;
	const void *stack_bottom;     /* the thread's stack, for ASan */
	size_t stack_size;
	void *idle_fake_stack;
	void *tsan_fiber;
	/* monitor.c */
	uint32_t seen_tick;           /* tick when last looked at, and since when */
	int64_t seen_since;
	int64_t probe_at, probe_cpu;  /* the thread's CPU time when it looked stuck */
	int8_t blocked;               /* whether the thread, held since seen_since, was found
				       * blocked in the kernel (1), runnable (0), or has not been
				       * looked at (-1): see held_long() */
	int64_t park_cpu;             /* the thread's CPU time at its last look */
	uint32_t moved_tick;          /* tick when last seen moving or idle, and when */
	int64_t moved_at;
	_Atomic uint32_t run_tick;    /* for the dump: the tick it first saw the current run at, */
	_Atomic int64_t run_since;    /* and when (monitor_running) */
	/* sched.c, for the monitor: set as the thread starts */
	clockid_t cpu_clock;          /* the thread's CPU-time clock, valid once tid is set */
	_Atomic pid_t tid;            /* 0 until the thread runs */
	bool started;                 /* a spare worker runs only once the monitor starts it */
	/* steal.c */
	struct victim_seen {          /* a thief's last look at each victim: stalled(), spawning() */
		uint32_t tick;
		int64_t since;
		int64_t spawned, spawned_at; /* its spawn count, and when it was seen to change */
	} *seen, seen_rest;           /* nseen of them (victim_seen()), the rest shared */
	int nseen;
	/* sched.c */
	struct stack_cache stacks;    /* last: 8 KiB, touched once per spawn and exit */
};

/* The worker running the caller, or NULL on a plain thread. A task can resume on another
 * worker, so the thread-local variable must be read afresh after every switch: on x86-64 each
 * read is one %fs-relative load, which the compiler cannot move across the switch (an opaque
 * call); elsewhere the compiler may keep a thread pointer in a register across calls, so the
 * read goes through a function that is never inlined. */
extern __thread struct worker *worker_tls __attribute__((tls_model("initial-exec")));
#if defined(__x86_64__)
static inline struct worker *worker_self(void)
{
	return worker_tls;
}
#else
struct worker *worker_self(void);
#endif

/*
 * Called by a blocking call that completed without waiting (a channel send, receive or
 * select). Every SLICE_OPS such calls on a worker, the task making one yields
 * (sched_slice_end), as if it had waited. Without this a task whose calls never wait (sends on
 * an unbounded channel) keeps its worker for as long as it sends: the tasks queued behind it
 * wait, its timers and fds go unlooked at (pick()'s periodic checks count switches), and an
 * idle worker takes the worker for stalled and its queue with it, which, while tasks gather on
 * a contended channel (sched_gather_worker), sends them straight back to fight over the
 * channel from two cores.
 */
#define SLICE_OPS 512
void sched_slice_end(void);
static inline void sched_slice(void)
{
	struct worker *w = worker_self();
	if (w && ++w->slice_ops % SLICE_OPS == 0)
		sched_slice_end();
}

/* Whether the caller runs on a worker (is a task), in one load on every target: a thread
 * pointer kept from before a switch reads another worker's variable, which gives the same
 * answer (for locks that record whether a plain thread holds them, chan.c). */
static inline bool sched_on_a_worker(void)
{
	return worker_tls != NULL;
}

/* A counter only its worker writes: a plain increment, atomic for other readers. */
static inline void counter_inc(_Atomic int64_t *c)
{
	atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + 1,
			      memory_order_relaxed);
}


/* Make a parked or new task runnable: onto the calling worker's `next` slot (it runs right
 * after the caller), or the global queue when called from a plain thread. */
void sched_ready(weft_task *t);
/* Same, at the tail of the local queue (spawn). */
void sched_ready_tail(weft_task *t);
/* sched_ready_tail for n tasks at once (timer expiry): what does not fit the local ring goes
 * to the global queue in one push, and idle workers are looked at once. A worker only. */
void sched_ready_batch(weft_task *const *v, int n);
/* Make t runnable on worker `home` (its inbox) rather than the caller's: see chan.c's wake().
 * From `home` itself, or a plain thread, the same as sched_ready. */
void sched_ready_on(weft_task *t, int home);
/* Move the calling task to worker `to`: it carries on there once `to` gets to it (see chan.c's
 * lock_slow). No-op on a plain thread, on `to` itself, or for a worker that is not running. */
void sched_move(int to);
/* Switch away from the current task, which has published itself somewhere a waker will find
 * it (see wait.h). Returns when it is made runnable again and scheduled. */
void sched_park(void);
/* The current task is finished: switch away for good. */
_Noreturn void sched_exit(void);
/* Called first thing by a new task, and after every switch: complete the switch. */
void sched_finish_switch(void);
uint64_t sched_new_id(struct worker *w);
/* weft_now() as of the monitor's last look: cheap timestamps, about a millisecond old while any
 * worker runs. While every worker sleeps the monitor does too, and the value is as old as the
 * sleep until the monitor's first look after a worker wakes it; its users (channel heat, park
 * times in the dump) only need it roughly. */
extern _Atomic int64_t sched_coarse_now __attribute__((visibility("hidden")));

/* Tasks contend for channels: sched_note_contention says so when a task finds a channel's lock
 * taken by a task on another worker (chan.c). Spreading such tasks over cores makes them
 * slower, not faster (see steal.c), so they gather on one worker, sched_gather_worker(): the
 * first to notice contention after a quiet period, the same for every channel, so that tasks
 * using several of them (a pipeline) are not pulled back and forth. One store per coarse clock
 * tick at most, so the lines stay shared. The period is SCHED_CONTENDED_NS, or longer when
 * gathering keeps lapsing too soon (sched_note_contention). */
#define SCHED_CONTENDED_NS 2000000
#define SCHED_GATHER_MAX_NS 64000000
/* The gathering period after one that lapsed: contention came back `quiet` ns after the last,
 * with the period at `period` (steal.c, sched_note_contention). */
int64_t sched_next_gather_period(int64_t quiet, int64_t period);
extern _Atomic int64_t sched_contended_at __attribute__((visibility("hidden")));
extern atomic_int sched_gather_on __attribute__((visibility("hidden")));
static inline int sched_gather_worker(void)
{
	return atomic_load_explicit(&sched_gather_on, memory_order_relaxed);
}
/* me: the worker to gather on if none is chosen yet; an id this run lacks (a channel biased in
 * an earlier weft_run) stands for the caller's. */
void sched_note_contention(int me);
/* Steals that interrupted their victim with a fence since the process began (tests): the rest
 * of the work that moved between workers was granted on request (steal.c). */
long sched_fenced_steals(void);
/* Write a line per live task to fd (at most `max`; dump.c). Returns the number of tasks.
 * in_signal: called from a signal handler, so it must not wait for any lock. */
int dump_tasks(int fd, int max, bool in_signal);
/* weft_run's SIGQUIT handler (a dump), when the program has none. */
void dump_install(void);
void dump_uninstall(void);
/* WEFT_STATS=1's table on stderr. */
void sched_print_stats(void);
/* weft_run's SIGTERM and SIGINT handlers that write the trace and the statistics first
 * (finish.c), when either is wanted and the program has no handler: the threads it started
 * (0 or 1). */
int finish_install(void);
void finish_uninstall(void);
#endif
