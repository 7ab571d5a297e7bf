/*
 * idle.c - what a worker does when it has no work: spinning, sleeping on the idle list,
 * backing off beside a busy worker, standby; and waking idle workers when work comes.
 *
 * Algorithm. A worker that finds nothing to run (sched.c, find_work) spins for a while,
 * looking again and stealing (steal.c), because work often comes back within microseconds and
 * a futex sleep and wake-up cost several. At most half the busy workers spin at once
 * (idle_start_spinning); the rest sleep. The spin adapts, as adaptive mutexes do: it halves
 * each time it ends empty-handed (down to SPIN_MIN_NS) and doubles each time it finds work (up
 * to SPIN_NS); each round yields the core, so a spinning worker does not keep from a core the
 * thread that will send it work. When the spin ends the worker:
 *  - sleeps on the idle list (idle_sleep) until woken or until its earliest deadline; one idle
 *    worker sleeps in epoll while tasks wait on fds;
 *  - or backs off (back_off): when all it saw was work it declined to take (a hot channel
 *    gathered on another worker, steal.c), a timed sleep off the idle list, doubling while
 *    spins keep declining, so that it neither spins beside that worker nor is woken for each
 *    task it readies;
 *  - or goes to standby (standby): a spare the monitor started for a stuck worker, once no
 *    longer needed, or a nominal worker the monitor parked at a light load. It hands over what
 *    it still holds (hand_over_queued) and sleeps off the idle list until the monitor calls it
 *    back, as Go's runtime parks an M with no P.
 *
 * Waking. Making work runnable wakes a sleeping worker only when none is spinning
 * (sched_wake_idle): a spinner will find it. Work sent to one worker's inbox wakes that worker
 * (sched_wake_for_inbox).
 *
 * Invariants:
 *  - A worker going to sleep first announces itself (joins the idle list, or sets
 *    sleeping_off_list) and then looks once more for work, and a waker first publishes the
 *    work (seq_cst) and then looks for sleepers: one of the two sees the other, so no task is
 *    stranded with every worker asleep.
 *  - nspinning counts the workers with `spinning` set; a waker that takes a worker off the
 *    idle list hands it the count it claimed.
 *  - The idle list, nidle and in_idle change only under idle_lock.
 *  - Deadlock: when every worker sleeps with no deadline pending, tasks are alive, and no
 *    thread outside weft could wake them, weft prints the blocked tasks and aborts
 *    (check_deadlock, by the last worker to go to sleep).
 *
 * The state this file owns: in struct sched_state, the idle group (idle_lock, idle list,
 * nidle, nspinning, nstandby); in struct worker, the idle group (spinning, spin_ns,
 * back_off_ns, sleeping_off_list, in_idle, standby, in_epoll, wake_word, idle_link).
 *
 * Rejected: always spinning the full SPIN_NS (a program woken now and then would pay a spin
 * per wake-up, and take the CPU from whoever does the work on a shared machine); a worker
 * that declined work sleeping on the idle list (it would be woken for every task the busy
 * worker readies); spares left running (more workers than cores are time-sliced by the
 * kernel, and a task queued on a preempted worker waits milliseconds).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>

#include "blocking.h"
#include "futex.h"
#include "monitor.h"
#include "poll.h"
#include "sanitizer.h" /* WEFT_TSAN: idle_threads_before_run */
#include "sched_state.h"
#include "trace.h"
#include "wait.h"
#include "weft.h"

#define SPIN_NS 20000        /* an idle worker looks for work up to this long before sleeping */
#define SPIN_MIN_NS 1250     /* and at least this long */
#define SPIN_POLL_NS 2000    /* a spinning worker polls fds at most this often */
#define BACK_OFF_MIN_NS 50000 /* a spin that declined work sleeps this long, */
#define BACK_OFF_MAX_NS 1000000 /* doubling up to this: see back_off() */
#define TIMER_SPIN_NS 20000  /* it wakes this long before a deadline, then spins up to it: a
			      * futex timeout alone ends tens of microseconds late on a virtual
			      * machine */

/* ---- waking idle workers ----------------------------------------------------------------- */

/* v was taken off the idle list (lock held then), or backs off or stands by off it: end its
 * sleep. */
void sched_wake_worker(struct worker *v)
{
	atomic_store_explicit(&v->wake_word, 1, memory_order_release);
	if (atomic_load(&v->in_epoll))
		poll_interrupt();
	else
		futex_wake(&v->wake_word, 1);
}

/*
 * Wake one sleeping worker to look for work, unless one is already looking. The spinner count
 * we add to claim the wake-up is given back, when the idle list turns out empty, under the
 * idle lock: a worker joining the list after our look then sees it given back (its lock after
 * our unlock), and so does a waker that sees that worker counted in nidle. Given back after the
 * unlock, a worker could join the list and look for work (none yet) in between, and a plain
 * thread's wake-up then see nspinning 1 and leave its task in the global queue for a spinner
 * that was not there; with every worker asleep the monitor sleeps too, and the task would
 * wait for good.
 */
void sched_wake_idle(void)
{
	if (atomic_load(&scheduler.nidle) == 0 || atomic_load(&scheduler.nspinning) != 0)
		return;
	int zero = 0;
	if (!atomic_compare_exchange_strong(&scheduler.nspinning, &zero, 1))
		return;
	pthread_mutex_lock(&scheduler.idle_lock);
	struct worker *v = scheduler.idle;
	if (v) {
		scheduler.idle = v->idle_link;
		v->idle_link = NULL;
		v->in_idle = false;
		v->spinning = true; /* it takes over the nspinning count we added */
		atomic_fetch_sub(&scheduler.nidle, 1);
	} else {
		atomic_fetch_sub(&scheduler.nspinning, 1);
	}
	pthread_mutex_unlock(&scheduler.idle_lock);
	if (v)
		sched_wake_worker(v);
}

/* Take w off the idle list. Lock held. */
void sched_idle_remove(struct worker *w)
{
	for (struct worker **p = &scheduler.idle; *p; p = &(*p)->idle_link)
		if (*p == w) {
			*p = w->idle_link;
			w->idle_link = NULL;
			w->in_idle = false;
			atomic_fetch_sub(&scheduler.nidle, 1);
			return;
		}
}

/* v was given work while it may be asleep: wake it (it may be on the idle list, or asleep off
 * it). */
static void wake_if_asleep(struct worker *v)
{
	if (atomic_load(&v->sleeping_off_list)) {
		sched_wake_worker(v);
		return;
	}
	pthread_mutex_lock(&scheduler.idle_lock);
	bool asleep = v->in_idle;
	if (asleep)
		sched_idle_remove(v);
	pthread_mutex_unlock(&scheduler.idle_lock);
	if (asleep)
		sched_wake_worker(v);
}

/* v has tasks in its inbox: make sure it is awake. After the seq_cst push: idle_sleep() and
 * back_off() announce themselves before their last look. */
void sched_wake_for_inbox(struct worker *v)
{
	if (atomic_load(&scheduler.nidle) || atomic_load(&v->sleeping_off_list))
		wake_if_asleep(v);
}

/* ---- spinning ---------------------------------------------------------------------------- */

/* w spun and found work. */
static void stop_spinning(struct worker *w)
{
	withdraw_work_requests(w, true);
	w->spinning = false;
	/* The last spinner found work: there may be more, let another look. */
	if (atomic_fetch_sub(&scheduler.nspinning, 1) == 1)
		sched_wake_idle();
}

/* ---- the deadlock check ------------------------------------------------------------------ */

static int count_threads(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[128];
	int n = -1;
	while (f && fgets(line, sizeof line, f))
		if (sscanf(line, "Threads: %d", &n) == 1)
			break;
	if (f)
		fclose(f);
	return n;
}

/* Threads that cannot wake a task: those that exist when libweft is loaded, before main (the
 * main thread, which calls weft_run and becomes worker 0; under qemu-user, its RCU thread),
 * and under TSan its background thread, which the first pthread_create starts. Any other
 * thread may hold a channel or lock a task waits on, even one started before weft_run (a
 * storage thread fed by a channel), so while one exists no deadlock is reported. */
static int threads_at_load;

__attribute__((constructor)) static void count_threads_at_load(void)
{
	threads_at_load = count_threads();
}

#ifdef WEFT_TSAN
static void *no_op(void *arg)
{
	return arg;
}
#endif

int idle_threads_before_run(void)
{
#ifdef WEFT_TSAN
	pthread_t t; /* make sure TSan's thread exists, whoever created threads before */
	if (pthread_create(&t, NULL, no_op, NULL) == 0)
		pthread_join(t, NULL);
	return threads_at_load + 1;
#else
	return threads_at_load;
#endif
}

/* Called with idle_lock held by the last worker to go idle. */
static void check_deadlock(void)
{
	if (!scheduler.deadlock_check || !all_asleep() || sched_work_anywhere())
		return;
	int64_t live = 0;
	for (int i = 0; i < scheduler.nworkers; i++) {
		if (atomic_load(&scheduler.workers[i]->timers.first) != INT64_MAX)
			return;
		live += atomic_load_explicit(&scheduler.workers[i]->spawned, memory_order_relaxed) -
			atomic_load_explicit(&scheduler.workers[i]->exited, memory_order_relaxed);
	}
	if (live <= 0 || atomic_load(&wait_foreign_parked) > 0 || poll_waiters() > 0 ||
	    blocking_jobs() > 0)
		return;
	if (count_threads() - scheduler.threads_at_start - (scheduler.nworkers - 1) - 1 -
		    blocking_threads() > 0)
		return; /* a thread outside weft might still wake someone */
	fprintf(stderr, "weft: all tasks are blocked (deadlock): %lld task%s\n", (long long)live,
		live == 1 ? "" : "s");
	dump_tasks(2, 20, false);
	abort();
}

/* ---- sleeping ---------------------------------------------------------------------------- */

/* Before a sleep: no longer one of the spinners (a waker may make it spin again). */
static void quit_spinning(struct worker *w)
{
	if (w->spinning) {
		w->spinning = false;
		atomic_fetch_sub(&scheduler.nspinning, 1);
	}
	withdraw_work_requests(w, false);
}

/* When a sleeping w must be up: TIMER_SPIN_NS before its earliest deadline (INT64_MAX: none). */
static int64_t wake_by(struct worker *w)
{
	int64_t first = atomic_load(&w->timers.first);
	return first == INT64_MAX ? first : first - TIMER_SPIN_NS;
}

/* Sleep in epoll (collecting into pb: the poller) or on w's futex word (pb NULL) until
 * `until`, counted as idle time. */
static void sleep_until(struct worker *w, struct poll_batch *pb, int64_t until)
{
	int64_t slept = weft_now();
	trace_idle(true);
	if (pb)
		poll_collect(pb, until);
	else
		futex_wait(&w->wake_word, 0, until);
	trace_idle(false);
	atomic_store_explicit(&w->idle_ns, atomic_load_explicit(&w->idle_ns, memory_order_relaxed) +
				      weft_now() - slept, memory_order_relaxed);
}

/*
 * Nothing to do: sleep until woken or until w's earliest deadline. While tasks wait on fds,
 * one idle worker sleeps in epoll rather than on its futex. It wakes their tasks only once it
 * is off the idle list: the second task it readies wakes an idle worker (sched_ready), and
 * that must be another one, not itself through the eventfd.
 */
static void idle_sleep(struct worker *w)
{
	quit_spinning(w); /* before joining the idle list */
	bool poller = poll_waiters() > 0 && !atomic_exchange(&scheduler.polling, true);
	struct poll_batch pb; /* not zeroed: 3 KB */
	pb.n = 0;
	pthread_mutex_lock(&scheduler.idle_lock);
	w->idle_link = scheduler.idle;
	scheduler.idle = w;
	w->in_idle = true;
	atomic_store(&w->in_epoll, poller);
	atomic_store(&w->wake_word, 0);
	atomic_fetch_add(&scheduler.nidle, 1);
	pthread_mutex_unlock(&scheduler.idle_lock);
	int64_t deadline = wake_by(w);
	if (!sched_work_anywhere() && !atomic_load(&scheduler.stop)) {
		if (deadline == INT64_MAX && !poller) {
			pthread_mutex_lock(&scheduler.idle_lock);
			check_deadlock();
			pthread_mutex_unlock(&scheduler.idle_lock);
		}
		sleep_until(w, poller ? &pb : NULL, deadline);
	} else if (poller) {
		poll_collect(&pb, 0);
	}
	pthread_mutex_lock(&scheduler.idle_lock);
	atomic_store(&w->in_epoll, false);
	if (w->in_idle)
		sched_idle_remove(w);
	pthread_mutex_unlock(&scheduler.idle_lock);
	if (poller) {
		poll_dispatch(&pb);
		atomic_store(&scheduler.last_poll, weft_now());
		atomic_store(&scheduler.polling, false);
	}
	monitor_resume();
}

/*
 * The last spin found work only on workers busy with a hot channel (steal.c): taking it would
 * only make those tasks fight across cores, so there is nothing to do here for now. A worker
 * that went on spinning, or slept on the idle list, would be woken for each task the busy
 * worker readies, and each look at the busy worker's queue takes its cache lines away from
 * it. So it backs off instead: a timed sleep off the idle list, which only the arrival of a
 * task in its own inbox (or weft_run's end) cuts short. The back-off doubles while spins keep
 * declining, up to BACK_OFF_MAX_NS, the longest another worker's queue waits for it when the
 * work turns out to be parallel after all; the spin after a back-off is long enough for
 * steal.c to tell a stalled worker.
 */
static void back_off(struct worker *w)
{
	quit_spinning(w);
	int64_t until = weft_now() + w->back_off_ns, due = wake_by(w);
	atomic_store(&w->wake_word, 0);
	atomic_store(&w->sleeping_off_list, true);
	if (!atomic_load(&w->inbox) && !atomic_load(&scheduler.stop))
		sleep_until(w, NULL, until < due ? until : due);
	atomic_store(&w->sleeping_off_list, false);
	if (w->back_off_ns < BACK_OFF_MAX_NS)
		w->back_off_ns *= 2;
	w->declined_work = false;
}

/* Give the workers at work what is still queued on w: its due timers' tasks, its inbox, its
 * ring and `next`, through the global queue. */
static void hand_over_queued(struct worker *w)
{
	sched_run_timers(w);
	sched_inbox_drain(w, w);
	weft_task *batch[RUNQ_SIZE / 2 + 1];
	uint32_t n;
	bool gave = false;
	while ((n = runq_grab(&w->q, batch, RUNQ_SIZE / 2))) {
		sched_global_push(batch, n);
		gave = true;
	}
	weft_task *t = atomic_exchange(&w->next, NULL);
	if (t) {
		sched_global_push(&t, 1);
		gave = true;
	}
	if (gave)
		sched_wake_idle();
}

/* A spare about to go idle may go to standby instead once the monitor has counted more workers
 * free to work than cores for STANDBY_NS (scheduler.spares_to_standby: the worker it was
 * started for is back); a nominal worker, once the monitor has parked it. */
static bool claim_standby(struct worker *w)
{
	if (w->id < scheduler.nominal)
		return parked(w);
	int n = atomic_load(&scheduler.spares_to_standby);
	while (n > 0)
		if (atomic_compare_exchange_weak(&scheduler.spares_to_standby, &n, n - 1))
			return true;
	return false;
}

/* Until the monitor ends w's standby (monitor.c, resume) or unparks it. A parked worker looks
 * at `active` after its store of `standby`: the monitor that unparks it stores `active` before
 * it looks at `standby`, so one of the two sees the other. A spare is never wanted this way
 * (its id is at least scheduler.active). */
static bool stays_in_standby(struct worker *w)
{
	return atomic_load(&w->standby) && !atomic_load(&scheduler.stop) &&
	       w->id >= atomic_load(&scheduler.active);
}

/*
 * Standby: a spare the monitor started for a stuck worker (monitor.c), once it is no longer
 * needed, or a nominal worker the monitor parked. Left running, spares would add up, and a
 * program would go on with more workers than cores, which the kernel then time-slices: a task
 * queued on a worker it has preempted waits milliseconds. So a spare stops taking work, as
 * Go's runtime parks an M with no P, and the monitor wakes it again (start_spare) rather than
 * start another thread next time. It sleeps off the idle list, so no new work wakes it; only
 * what is still its own does (sleeping_off_list: sched_wake_for_inbox wakes it for its inbox,
 * where a hot channel's home may send tasks; and its timers, for tasks that parked on it with
 * a deadline), and it hands that over (hand_over_queued). Should every other worker be held by
 * a task meanwhile, the monitor sees the global queue wait and wakes it back.
 *
 * It counts as asleep (scheduler.nstandby, for the deadlock check and the monitor's pause)
 * only while it sleeps: while it hands over, it holds tasks that no queue shows.
 */
static void standby(struct worker *w)
{
	/* A waker that saw us spinning left its task for us to find (sched_wake_idle):
	 * idle_sleep() looks once more after it stops spinning, and so must we, or that task
	 * waits in the global queue with every worker asleep. */
	quit_spinning(w);
	if (sched_work_anywhere())
		sched_wake_idle();
	atomic_store(&w->sleeping_off_list, true);
	atomic_store(&w->standby, true);
	int home = w->id;
	atomic_compare_exchange_strong(&sched_gather_on, &home, 0);
	stack_cache_drain(&w->stacks);
	/* One idle worker polls fds, chosen as it goes to sleep (idle_sleep()); if that was this one,
	 * an idle worker must come round again to take its place. The monitor's watch for
	 * unpolled fds would not: it sleeps too once every worker does. */
	if (poll_waiters() > 0 && !atomic_load(&scheduler.polling))
		sched_wake_idle();
	while (stays_in_standby(w)) {
		atomic_store(&w->wake_word, 0);
		hand_over_queued(w);
		atomic_fetch_add(&scheduler.nstandby, 1);
		int64_t first = atomic_load(&w->timers.first);
		if (first == INT64_MAX) { /* it may be the last to sleep, as in idle_sleep() */
			pthread_mutex_lock(&scheduler.idle_lock);
			check_deadlock();
			pthread_mutex_unlock(&scheduler.idle_lock);
		}
		if (stays_in_standby(w) && !atomic_load(&w->inbox))
			sleep_until(w, NULL, first);
		/* Under the lock, as nidle changes: a check_deadlock in progress read the count
		 * before it looked at the queues, and this spare is about to hold tasks again. */
		pthread_mutex_lock(&scheduler.idle_lock);
		atomic_fetch_sub(&scheduler.nstandby, 1);
		pthread_mutex_unlock(&scheduler.idle_lock);
	}
	atomic_store(&w->standby, false);
	atomic_store(&w->sleeping_off_list, false);
	if (!atomic_load(&scheduler.stop)) { /* back to look for work, as monitor.c's rescue() wakes an
				      * idle worker */
		w->spinning = true;
		atomic_fetch_add(&scheduler.nspinning, 1);
	}
}

/* ---- the spin and what follows it ------------------------------------------------------- */

/* w found nothing of its own: may it spin, looking at the other workers (steal.c)? At most
 * half the busy workers spin; a worker already spinning goes on. */
bool idle_start_spinning(struct worker *w)
{
	if (w->spinning)
		return true;
	int busy = scheduler.nworkers - atomic_load(&scheduler.nidle) - atomic_load(&scheduler.nstandby);
	if (2 * atomic_load(&scheduler.nspinning) >= busy)
		return false;
	w->spinning = true;
	atomic_fetch_add(&scheduler.nspinning, 1);
	return true;
}

/* w's look for work came back empty: spin on (return at once, to look again), or end the spin
 * in a sleep of the right kind (see the head of this file). *spin_since: when the spin began,
 * 0 when it has not; set here, and cleared once the spin ends. A spin that saw work but
 * declined it (a hot channel, steal.c) keeps its length: there is work about, it just belongs
 * on another core. */
void idle_no_work(struct worker *w, int64_t *spin_since)
{
	int64_t now = weft_now();
	if (!*spin_since)
		*spin_since = now;
	int64_t due = atomic_load_explicit(&w->timers.first, memory_order_relaxed);
	/* after a back-off: long enough to tell a stalled worker (steal.c, stalled()) */
	int64_t spin = w->back_off_ns > BACK_OFF_MIN_NS ? 2 * STALL_NS : w->spin_ns;
	if ((w->spinning && (now - *spin_since < spin || now < w->request_wait_until)) ||
	    due - now < TIMER_SPIN_NS) {
		/* a thread waiting for this core goes first (sched_yield, a no-op when nothing else
		 * wants it), unless a grant of our request is due: it would wait in our inbox for
		 * as long as that thread keeps the core */
		if (!sched_poll_now(SPIN_POLL_NS) && now >= w->request_wait_until)
			sched_yield();
		return;
	}
	if (w->declined_work) {
		back_off(w);
	} else {
		if (w->spinning && w->spin_ns > SPIN_MIN_NS)
			w->spin_ns /= 2;
		w->back_off_ns = BACK_OFF_MIN_NS;
		if (claim_standby(w))
			standby(w);
		else
			idle_sleep(w);
	}
	*spin_since = 0;
}

/* w found work after spinning since spin_since (0: it did not spin). */
void idle_found_work(struct worker *w, int64_t spin_since)
{
	if (spin_since && w->spin_ns < SPIN_NS)
		w->spin_ns *= 2;
	w->back_off_ns = BACK_OFF_MIN_NS;
	w->declined_work = false;
	if (w->spinning)
		stop_spinning(w);
}

/* A new worker's record. */
void idle_init_worker(struct worker *w)
{
	w->spin_ns = SPIN_NS;
	w->back_off_ns = BACK_OFF_MIN_NS;
}
