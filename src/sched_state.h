/*
 * sched_state.h - the scheduler's shared state, and the internal interface between its four
 * files: sched.c (queues, switching, the worker loop), steal.c (taking work from other
 * workers), idle.c (spinning, sleeping, standby, waking) and monitor.c (the monitor thread).
 * Internal to those files (select.c also wakes an idle worker through it).
 *
 * The functions here that the switch, spawn and wake paths call are static inline: those
 * paths take no call that one file would not have taken. Functions called off those paths
 * (the idle loop, stealing, every GLOBAL_EVERY switches) are plain calls between the files.
 */
#ifndef WEFT_SCHED_STATE_H
#define WEFT_SCHED_STATE_H

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "asym.h"
#include "sched.h"

/* A worker that has run one task this long without switching is stalled, as far as a thief
 * can tell (steal.c); a request for work unanswered this long is dropped, and the requester
 * spins at least this long for the grant (idle.c). */
#define STALL_NS 10000

/* Each field says which file owns it. The order sets the cache lines: the global queue's length
 * and the idle counts, read on the wake path, share lines with fields that rarely change. */
struct sched_state {
	atomic_int nworkers;          /* sched.c: workers running (grows when the monitor starts a
				       * spare) */
	int nominal;                  /* sched.c: the first n_cores: the rest are spares */
	int64_t standby_ns;           /* monitor.c: see STANDBY_NS */
	int cap;                      /* monitor.c: workers there may be: the first n_cores, then
				       * spares (max_spares()); records made as they start */
	bool capped;                  /* monitor.c: it could start no more spares */
	struct worker **workers;      /* sched.c: the workers' records */
	pthread_mutex_t global_lock;  /* sched.c: the global queue, */
	weft_task **global_ring;      /* a ring of global_cap (a power of two) */
	uint32_t global_cap, global_head;
	atomic_int global_len;        /* its length, written under global_lock */
	_Atomic uint32_t global_takes; /* takes from it so far (under global_lock): the
					* monitor's sign that someone serves it */
	atomic_int nidle, nspinning, nstandby; /* idle.c: workers idle, spinning, in standby */
	atomic_int spares_to_standby; /* monitor.c: spares that may go to standby now (idle.c
				       * claims from it: claim_standby) */
	atomic_int active;            /* monitor.c: workers 0..active-1 take work; the other
				       * nominal ones are parked (park_or_unpark); always `nominal`
				       * without parking */
	bool parking;                 /* monitor.c: $WEFT_PARK is not 0 */
	pthread_mutex_t idle_lock;    /* idle.c: guards the idle list */
	struct worker *idle;          /* idle.c: the idle list, linked by idle_link */
	atomic_bool stop;             /* sched.c: weft_run is ending */
	_Atomic uint64_t ids;         /* sched.c: task ids handed out in blocks */
	int (*main_fn)(void *);       /* sched.c: weft_run's main task */
	void *main_arg;
	int main_result;
	bool deadlock_check;          /* idle.c: $WEFT_DEADLOCK is not 0 (set by weft_run) */
	int threads_at_start;         /* idle.c: threads that cannot wake a task */
	atomic_bool polling;          /* sched.c: a worker is inside poll_run */
	_Atomic int64_t last_poll;
	pthread_t monitor;            /* monitor.c: its thread */
	_Atomic uint32_t monitor_word; /* futex: the monitor sleeps on it, stop_all wakes it */
	_Atomic uint32_t monitor_off;  /* futex: 1 while the monitor sleeps for want of work */
};
/* The one scheduler. */
extern struct sched_state scheduler __attribute__((visibility("hidden")));

/* Every worker is on the idle list or in standby. */
static inline bool all_asleep(void)
{
	return atomic_load(&scheduler.nidle) + atomic_load(&scheduler.nstandby) ==
	       atomic_load(&scheduler.nworkers);
}

/* Whether the monitor has parked w, a nominal worker (park_or_unpark): seq_cst, against the
 * monitor's store of `active` and its look at `standby`. */
static inline bool parked(struct worker *w)
{
	return w->id >= atomic_load(&scheduler.active) && w->id < scheduler.nominal;
}

/* ---- sched.c ------------------------------------------------------------------------------ */

/* Push n tasks onto the global queue. */
void sched_global_push(weft_task *const *batch, uint32_t n);
/* Take a fair share of the global queue: one to run, the rest into w's ring. */
weft_task *sched_global_pop(struct worker *w);
/* A full ring moves half of itself, plus t, to the global queue. */
void sched_spill(struct worker *w, weft_task *t);
/* Whether any queue holds a task. */
bool sched_work_anywhere(void);
/* Push the chain newest..oldest (linked through `link` from newest to oldest) onto v's inbox. */
void sched_inbox_push_chain(struct worker *v, weft_task *newest, weft_task *oldest);
/* Move v's inbox into w's ring, oldest first. Returns how many. */
int sched_inbox_drain(struct worker *w, struct worker *v);
/* Expire w's due timers. */
void sched_run_timers(struct worker *w);
/* Poll fds without waiting, if nobody did in the last `every` ns; the number of tasks woken. */
int sched_poll_now(int64_t every);
/* The next task to run from w's own queues, or NULL (pick(), out of line). */
weft_task *sched_pick(struct worker *w);
/* Worker i's record (a spare: made by the monitor, before it counts it in scheduler.nworkers). */
struct worker *sched_new_worker(int i);
/* A worker thread's start routine (pthread_create). */
void *sched_worker_thread(void *arg);

/* The owner pushes t onto its ring, or spills half of it to the global queue. */
static inline void push_local(struct worker *w, weft_task *t)
{
	if (!runq_push(&w->q, t))
		sched_spill(w, t);
}

/* Whether w has work queued besides the task it runs: only then is another worker woken for a
 * task made runnable here (sched_ready, sched_ready_tail, sched_ready_batch). */
static inline bool has_queued(struct worker *w)
{
	return runq_len(&w->q) || atomic_load_explicit(&w->next, memory_order_relaxed);
}

/*
 * The owner/thief protocol. A worker takes from the head of its own ring and from its `next`
 * slot at every switch, and thieves (steal.c) take from the same places far more rarely: each
 * of the worker's takes would be a CAS or an exchange only to exclude them, half the cost of a
 * yield. So the worker and its thieves play Dekker's game with asymmetric fences (asym.h): the
 * worker sets in_own and then looks at `thieves` (own_begin); a thief counts itself in
 * `thieves`, runs asym_heavy and then waits for in_own to clear (steal.c, thief_begin). A
 * worker that finds no thief works alone, with plain loads and stores, until it clears in_own
 * (own_end); one that finds a thief uses the atomic operations, as every worker does where
 * membarrier is missing. A worker preempted while alone could keep a thief waiting: after
 * THIEF_PATIENCE looks the thief gives up and tries elsewhere (as it does when membarrier
 * fails).
 */
static inline void own_end(struct worker *w)
{
	atomic_store_explicit(&w->in_own, 0, memory_order_release);
}

static inline bool own_begin(struct worker *w)
{
	if (!asym_on())
		return false;
	atomic_store_explicit(&w->in_own, 1, memory_order_relaxed);
	asym_light();
	if (!atomic_load_explicit(&w->thieves, memory_order_acquire))
		return true;
	own_end(w);
	return false;
}

/* ---- steal.c ------------------------------------------------------------------------------ */

/* Look at the other workers for work (w may spin); spin_since: when w began looking. */
weft_task *steal(struct worker *w, int64_t spin_since);
/* The global queue, for an idle worker (left to a gathering worker: see steal.c). */
weft_task *steal_from_global(struct worker *w);
/* w stops looking for work: withdraw its requests (found_work: it found some). */
void withdraw_work_requests(struct worker *w, bool found_work);
/* Hand half of w's ring to the worker that requested it. */
void grant_work_request(struct worker *w);
/* A new weft_run: no contention yet. */
void steal_reset(void);

/* At every switch and spawn: grant a request for work, if one is out. */
static inline void serve_work_request(struct worker *w)
{
	if (__builtin_expect(atomic_load_explicit(&w->work_request, memory_order_relaxed) != 0, 0))
		grant_work_request(w);
}

/* ---- idle.c ------------------------------------------------------------------------------- */

/* v was taken off the idle list (lock held then), or backs off or stands by off it: end its
 * sleep. */
void sched_wake_worker(struct worker *v);
/* Wake one sleeping worker to look for work, unless one is already looking. */
void sched_wake_idle(void);
/* Take w off the idle list. idle_lock held. */
void sched_idle_remove(struct worker *w);
/* v has tasks in its inbox: make sure it is awake (after the seq_cst push). */
void sched_wake_for_inbox(struct worker *v);
/* w found nothing of its own: may it spin, looking at the other workers? */
bool idle_start_spinning(struct worker *w);
/* The worker loop's look for work came back empty: spin on, or sleep (see idle.c). */
void idle_no_work(struct worker *w, int64_t *spin_since);
/* The worker loop found work, after spinning since spin_since (0: it did not spin). */
void idle_found_work(struct worker *w, int64_t spin_since);
/* A new worker's record: idle.c's fields. */
void idle_init_worker(struct worker *w);
/* Threads at weft_run's start that cannot wake a task (the deadlock check's baseline). */
int idle_threads_before_run(void);
#endif
