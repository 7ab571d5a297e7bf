/*
 * sched_state.h - the scheduler's state, shared by the workers (sched.c) and the monitor thread
 * that watches them (monitor.c). Internal to those two files.
 */
#ifndef WEFT_SCHED_STATE_H
#define WEFT_SCHED_STATE_H

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "sched.h"

struct sched_state {
	atomic_int n;                 /* workers running (grows when the monitor starts a spare) */
	int nominal;                  /* the first n_cores: the rest are spares */
	int64_t standby_ns;           /* see STANDBY_NS */
	int cap;                      /* workers there may be: the first n_cores, then spares
				       * (max_spares()); records made as they start */
	bool capped;                  /* the monitor said it could start no more spares */
	struct worker **w;
	pthread_mutex_t gq_lock;
	weft_task **gq;               /* the global queue: a ring of gq_cap (a power of two) */
	uint32_t gq_cap, gq_head;
	atomic_int gq_n;              /* its length, written under gq_lock */
	_Atomic uint32_t gq_taken;    /* takes from it so far (under gq_lock): the monitor's sign
				       * that someone serves it */
	atomic_int nidle, nspinning, nstandby;
	atomic_int surplus;           /* spares that may go to standby now (the monitor's count) */
	atomic_int active;            /* workers 0..active-1 take work; the other nominal ones are
				       * parked (park_or_unpark); always `nominal` without parking */
	bool parking;                 /* $WEFT_PARK is not 0 */
	pthread_mutex_t idle_lock;
	struct worker *idle;
	atomic_bool stop;
	_Atomic uint64_t ids;
	int (*main_fn)(void *);
	void *main_arg;
	int main_result;
	bool deadlock_check;
	int threads_at_start;
	atomic_bool polling;          /* a worker is inside poll_run */
	_Atomic int64_t last_poll;
	pthread_t monitor;
	_Atomic uint32_t monitor_word; /* futex: the monitor sleeps on it, stop_all wakes it */
	_Atomic uint32_t monitor_off;  /* futex: 1 while the monitor sleeps for want of work */
};
extern struct sched_state sched_state __attribute__((visibility("hidden")));
/* Both files call it S. */
#define S sched_state

/* Every worker is on the idle list or in standby. */
static inline bool all_asleep(void)
{
	return atomic_load(&S.nidle) + atomic_load(&S.nstandby) == atomic_load(&S.n);
}

/* Whether the monitor has parked w, a nominal worker (park_or_unpark): seq_cst, against the
 * monitor's store of `active` and its look at `standby`. */
static inline bool parked(struct worker *w)
{
	return w->id >= atomic_load(&S.active) && w->id < S.nominal;
}

/* sched.c's, for the monitor. */
/* v was taken off the idle list (lock held then), or rests or stands by off it: end its
 * sleep. */
void sched_wake_worker(struct worker *v);
/* Wake one sleeping worker to look for work, unless one is already looking. */
void sched_wake_idle(void);
/* Take w off the idle list. idle_lock held. */
void sched_idle_remove(struct worker *w);
/* Worker i's record (a spare: made by the monitor, before it counts it in S.n). */
struct worker *sched_new_worker(int i);
/* A worker thread's start routine (pthread_create). */
void *sched_worker_thread(void *arg);
#endif
