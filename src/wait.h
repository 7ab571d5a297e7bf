/*
 * wait.h - the one parking primitive every blocking call in weft is built on.
 *
 * Each task owns one wait record (in its task struct); a plain OS thread owns one in
 * thread-local storage. A blocking primitive follows the same three steps:
 *
 *   lock the primitive; find it must wait;  w = wait_begin(reason);
 *   publish w in the primitive's queue;      unlock;
 *   r = wait_park(w, deadline);              -- always called after wait_begin
 *
 * Whoever wants to wake w first claims it (wait_claim: PARKED -> CLAIMED, one winner), may
 * then write results into memory the waiter pointed it to, and finishes it with a result
 * (wait_finish), which makes the task runnable or futex-wakes the thread. A deadline or
 * weft_cancel races for the same claim, so exactly one of them wins. The winner touches w
 * only while holding the primitive's lock, and the waiter takes that lock to unpublish itself
 * after waking, so a record is never used after its owner has moved on.
 *
 * The state word holds WAIT_PARKED, WAIT_CLAIMED or the final result (0 or -errno), so the
 * result is delivered by the same atomic store that releases the waiter.
 */
#ifndef WEFT_WAIT_H
#define WEFT_WAIT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/* PARKED_NC: parked, and weft_cancel must not interrupt it (wait_begin_nocancel). */
enum { WAIT_PARKED = 1, WAIT_CLAIMED = 2, WAIT_PARKED_NC = 3 };

typedef struct weft_task weft_task;

struct wait {
	_Atomic uint32_t state;  /* WAIT_PARKED, WAIT_CLAIMED, or (uint32_t)result */
	weft_task *task;         /* NULL for a plain thread */
	/* For dumps and traces, which read them from other threads (hence atomic, relaxed): */
	const char *_Atomic reason; /* what it waits for: "sleep", "join", ... (static strings) */
	const void *_Atomic object; /* the primitive it waits on */
};

/* The caller's wait record, armed (state PARKED). reason is a static string. */
struct wait *wait_begin(const char *reason, const void *object);
/* Same, but weft_cancel does not interrupt it (for waits that must run to completion). */
struct wait *wait_begin_nocancel(const char *reason, const void *object);

/* Park until claimed and finished, the deadline passes (-ETIMEDOUT) or the task is cancelled
 * (-ECANCELED). Returns the result given to wait_finish. */
int wait_park(struct wait *w, int64_t deadline);

/* wait_park for a wait whose only outcome is the time it takes (a sleep): a deadline that
 * passed within the last coarse clock tick parks briefly rather than costing a clock read on
 * every call; the wait still never ends before its deadline. */
int wait_sleep(struct wait *w, int64_t deadline);

/* Give up a wait_begin that turned out to be unnecessary. If someone has already claimed w,
 * parks until they finish it. Returns the result that ended the wait (0 if abandoned). */
int wait_abandon(struct wait *w);

static inline bool wait_claim(struct wait *w)
{
	uint32_t s = atomic_load_explicit(&w->state, memory_order_relaxed);
	while (s == WAIT_PARKED || s == WAIT_PARKED_NC)
		if (atomic_compare_exchange_weak_explicit(&w->state, &s, WAIT_CLAIMED,
							  memory_order_acquire, memory_order_relaxed))
			return true;
	return false;
}

/* Finish a wait claimed with wait_claim: the waiter resumes with `result`, which must be 0 or
 * -errno (positive values would read as PARKED or CLAIMED). */
void wait_finish(struct wait *w, int result);

/* wait_finish, but a task resumes on worker `home` (sched_ready_on). */
void wait_finish_on(struct wait *w, int result, int home);

/* Claim and finish in one go; false when somebody else claimed w first. */
static inline bool wait_wake(struct wait *w, int result)
{
	if (!wait_claim(w))
		return false;
	wait_finish(w, result);
	return true;
}

/* Cancel t's current wait if it is parked in one that may be cancelled; false when it is not
 * (running, runnable, or in a wait that must not be interrupted). Called after storing t's
 * `cancelled`; a false answer needs the heavy half of the fence described at the top of
 * wait.c before asking again (group.c does that for weft_cancel). */
bool wait_cancel_parked(weft_task *t);

/* Expire the deadlines due in h: their tasks resume with -ETIMEDOUT. Returns how many. With
 * `try`, does nothing when another worker holds h's lock (timer_expire). */
struct timer_wheel;
int wait_expire(struct timer_wheel *h, int64_t now, bool try);

/* Number of plain threads parked in wait_park right now (for deadlock detection). */
extern atomic_int wait_foreign_parked __attribute__((visibility("hidden")));
#endif
