/*
 * weft.h - the whole public API of weft, a runtime for very many lightweight tasks
 * multiplexed over one worker thread per core.
 *
 * Conventions (see docs/design.md):
 *  - Functions return 0 (or a non-negative count) on success and a negative errno value on
 *    failure. Constructors that return a handle return NULL and set errno.
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
 * the number of online CPUs. Tasks still alive when main_task returns are discarded, as in Go:
 * their stacks are released without running them further. weft_run may be called again
 * afterwards, but not from inside a task. Returns -EINVAL for a NULL main_task, -EBUSY when
 * weft is already running, -ENOMEM or -EAGAIN when workers cannot be created.
 *
 * Environment: WEFT_WORKERS=n; WEFT_DEADLOCK=0 turns off deadlock detection.
 */
int weft_run(int (*main_task)(void *), void *arg);

/* ------------------------------------------------------------------------------------------ */
/* Tasks                                                                                      */
/* ------------------------------------------------------------------------------------------ */

typedef struct weft_task weft_task;

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
 * Wait for t to finish and release it. Returns 0; -EINVAL for NULL, a detached task, joining
 * oneself, a task another caller is already joining, or a handle already joined; -ECANCELED if
 * the caller was cancelled while waiting (t stays joinable). A joined handle's memory is reused
 * by later spawns: once a newer task has taken it over, joining the old handle again is
 * undefined, as with pthread_join.
 */
int weft_join(weft_task *t);

/* Let the other runnable tasks of this worker run. From a plain thread: sched_yield(). */
void weft_yield(void);

/*
 * Sleep until the deadline. Returns 0, or -ECANCELED. From a plain thread it sleeps the thread
 * (clock_nanosleep, absolute).
 */
int weft_sleep_until(int64_t deadline);

/* Run n tasks of fn(arg) and return when all have finished: 0, or -EINVAL (n <= 0, fn NULL). */
int weft_execute(int n, void (*fn)(void *), void *arg);

/* The calling task, or NULL on a thread that is not running a weft task. */
weft_task *weft_self(void);

/* The task's id (unique for the process, > 0) and name. */
uint64_t weft_task_id(const weft_task *t);
const char *weft_task_name(const weft_task *t);

/*
 * Cancel t: its current blocking call and every later one return -ECANCELED (sleeping, joining,
 * channel and lock waits alike). The task decides how to wind up; nothing is unwound by force.
 * Returns 0 or -EINVAL. t must not have been joined yet.
 */
int weft_cancel(weft_task *t);

/* Nonzero when the calling task has been cancelled. */
int weft_cancelled(void);

/* ------------------------------------------------------------------------------------------ */
/* Channels                                                                                   */
/* ------------------------------------------------------------------------------------------ */

/* @@CHANNELS@@ */

/* ------------------------------------------------------------------------------------------ */
/* Locks and other synchronisation                                                            */
/* ------------------------------------------------------------------------------------------ */

/* @@SYNC@@ */

#ifdef __cplusplus
}
#endif
#endif /* WEFT_H */
