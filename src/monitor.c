/*
 * monitor.c - the monitor thread: it rescues the queue of a worker held by one task, starts
 * spares and puts them away (standby), parks and unparks workers, and sleeps while every
 * worker does. It watches the workers (sched.c, steal.c, idle.c) through sched_state.h, as
 * Go's sysmon watches its Ps.
 *
 * Algorithm. Every MONITOR_NS it looks at each worker's switch count (tick):
 *  - a worker whose count has not moved for STUCK_NS (BLOCKED_NS when its thread is blocked
 *    in the kernel) while work waits in its queues is held: an idle worker is woken to take
 *    that work, or, with none idle, a spare worker thread is started (rescue, start_spare);
 *  - spares beyond those needed go to standby once more workers than cores have been free for
 *    STANDBY_NS (spares_to_standby; idle.c puts them there on their way to sleep);
 *  - at a light load it parks nominal workers, and unparks them as soon as work waits
 *    (park_or_unpark);
 *  - it watches what no worker's queue shows: fds left unpolled, and the global queue left
 *    untaken.
 * With every worker asleep it sleeps too (monitor_pause), so an idle program takes no
 * wake-ups; the first worker to wake wakes it (monitor_resume).
 *
 * Invariants: only the monitor writes its own fields of struct worker (sched.h, the monitor
 * group), `active` and `capped`; it sets `spares_to_standby`, which only idle.c counts down
 * (claim_standby); a spare's record is made and counted in
 * scheduler.nworkers before its thread runs, so it is never idle uncounted; `active` is
 * stored before the look at a parked worker's `standby` (and the worker does the reverse), so
 * an unpark is never missed.
 *
 * Rejected: starting a spare for every worker that looks stuck at once (a worker preempted
 * by the kernel is runnable, not stuck: spare_helps waits a period to tell); the monitor
 * polling fds itself (a second kind of poller beside idle.c's); no cap on spares (a program
 * that needs thousands has lost its way, as Go's debug.SetMaxThreads says).
 */
#define _GNU_SOURCE
#include "monitor.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "futex.h"
#include "poll.h"
#include "sched_state.h"
#include "sys.h"
#include "weft.h"

#define STUCK_NS 10000000   /* a worker on one task this long with work queued is stuck;
			     * above an OS time slice, so a preempted worker does not count */
#define BLOCKED_NS 1000000  /* and this long when its thread is blocked in the kernel */

/* ---- the monitor: rescuing the queue of a worker stuck in one task ---------------------- */

/* A task that blocks in a call the shim does not cover, or computes without yielding, holds
 * its worker; the tasks queued behind it would wait. The monitor looks every MONITOR_NS: a
 * worker whose switch count has not moved for STUCK_NS while work waits in its queue is
 * stuck. Then an idle worker is woken to steal that work (thieves take the stuck worker's
 * `next` slot and due timers too), or, when every worker is busy, a spare worker thread is
 * started (Go's sysmon hands the P to a new M the same way). A spare goes to standby once
 * the worker it was started for is back (idle.c, standby()), and is woken again when needed. */
#define MONITOR_NS 1000000
/* A spare goes to standby once more workers than cores have been free this long ($WEFT_SPARE_MS
 * sets it): a program that holds a worker now and then (a loop of spawns, a long computation)
 * keeps its spares between the holds rather than hand their tasks over and call them back each
 * time. */
#define STANDBY_NS 1000000000

/* End v's standby: it comes back looking for work (idle.c, standby()). */
static void resume(struct worker *v)
{
	atomic_store(&v->standby, false);
	sched_wake_worker(v);
}

/*
 * Parking. At a light load a second worker costs more than it saves: the tasks it wakes for,
 * it steals with a fence (membarrier: an interrupt of the victim's core) or finds already run,
 * and every sleep and wake-up is a context switch on a second core: at a fixed modest message
 * rate, a server uses more CPU per message on two workers than on one. So the monitor keeps
 * only as many workers at work as the load needs, judging from their threads' CPU time and
 * their queues:
 *
 *  - It parks one when, over PARK_WINDOW_NS, the active workers together used less CPU time
 *    than one fewer could have given (their spinning counts too, so two workers at a light
 *    load use more of it than one would). The parked worker, the highest active id, goes to
 *    standby on its way to sleep (idle.c, claim_standby), handing over what it still holds, and
 *    sched_wake_idle no longer finds it.
 *  - It unparks one as soon as work waits: two tasks or more queued on an active worker (its
 *    ring and `next`), or any in its inbox, at UNPARK_QUEUED looks in a row; or every active
 *    worker busy for more than UNPARK_CPU percent of UNPARK_WINDOW_NS. A burst waits a few
 *    milliseconds for the parked worker; a worker held by one task is rescued by it before
 *    the monitor would start a spare (STUCK_NS), and start_spare unparks first too.
 *  - An unpark starts the window again: a worker once brought back stays at least that long.
 *  - A look that finds an active worker held by one task for STUCK_NS (free_to_work) starts
 *    it again too: the CPU time of such a window says nothing of what one fewer could do,
 *    since the held worker takes none of the other's work. A held worker blocked in the
 *    kernel, or one the kernel time-slices with other programs, beside an idle one, uses
 *    less than a core: parked, the idle one would leave the fds unpolled (the held one
 *    cannot poll) and every task queued to a rescue, and be called back for them.
 *
 * Idle workers are not parked: asleep on the idle list they cost nothing. $WEFT_PARK=0 keeps
 * every worker at work.
 */
#define PARK_WINDOW_NS 100000000
#define UNPARK_QUEUED 5
#define UNPARK_CPU 90
#define UNPARK_WINDOW_NS 10000000

static struct {
	int queued;          /* looks in a row with work waiting on an active worker */
	int64_t since;       /* start of the current short window (UNPARK_WINDOW_NS) */
	int64_t window_cpu;  /* CPU time of the active workers in this long window, */
	int64_t window_ns;   /* and its length so far */
	int64_t unparked_at; /* the last unpark */
	bool held;           /* an active worker was held at a look of this short window */
} park; /* the monitor's alone */

static int64_t thread_cpu(struct worker *w);
static bool nudge_to_standby(void);

/* Bring back the lowest parked worker; false if none is parked. */
static bool unpark(void)
{
	int active = atomic_load(&scheduler.active);
	if (active >= scheduler.nominal)
		return false;
	atomic_store(&scheduler.active, active + 1); /* before the look at `standby`: see idle.c */
	struct worker *v = scheduler.workers[active];
	if (atomic_load(&v->standby))
		resume(v);
	v->park_cpu = thread_cpu(v);
	park.window_cpu = park.window_ns = 0;
	park.unparked_at = weft_now();
	return true;
}

/* The CPU time the active workers used since the last short window; the least any used. */
static int64_t active_cpu(int active, int64_t *least)
{
	int64_t sum = 0;
	*least = INT64_MAX;
	for (int i = 0; i < active; i++) {
		struct worker *w = scheduler.workers[i];
		int64_t c = thread_cpu(w), used = c >= 0 && w->park_cpu >= 0 ? c - w->park_cpu : 0;
		w->park_cpu = c;
		sum += used;
		*least = used < *least ? used : *least;
	}
	return sum;
}

static bool work_waits(struct worker *w)
{
	return runq_len(&w->q) + (atomic_load(&w->next) != NULL) >= 2 || atomic_load(&w->inbox);
}

/* At every look of the monitor (MONITOR_NS). */
static void park_or_unpark(int64_t now)
{
	int active = atomic_load(&scheduler.active);
	bool waits = false;
	for (int i = 0; i < active; i++) {
		waits |= work_waits(scheduler.workers[i]);
		park.held |= now - scheduler.workers[i]->moved_at >= STUCK_NS; /* as free_to_work() says */
	}
	park.queued = waits ? park.queued + 1 : 0;
	if (park.queued >= UNPARK_QUEUED && unpark())
		return;
	int64_t span = now - park.since;
	if (span < UNPARK_WINDOW_NS)
		return;
	park.since = now;
	bool held = park.held;
	park.held = false;
	int64_t least, cpu = active_cpu(active, &least);
	if (span > 2 * UNPARK_WINDOW_NS) /* the monitor slept, as every worker did */
		return;
	if (100 * least > UNPARK_CPU * span && unpark())
		return;
	if (active < 2)
		return;
	if (held) {
		park.window_cpu = park.window_ns = 0;
		return;
	}
	park.window_cpu += cpu;
	park.window_ns += span;
	if (park.window_ns < PARK_WINDOW_NS)
		return;
	if (park.window_cpu < (active - 1) * park.window_ns) {
		atomic_store(&scheduler.active, active - 1);
		nudge_to_standby();
	}
	park.window_cpu = park.window_ns = 0;
}

static bool has_work(struct worker *w, int64_t now)
{
	return runq_len(&w->q) || atomic_load(&w->next) || atomic_load(&w->inbox) ||
	       atomic_load(&w->timers.first) <= now;
}

/*
 * Spare workers the monitor may start: $WEFT_MAX_SPARES, else MAX_SPARES, or RLIMIT_NPROC when
 * that is lower (threads beyond it would not start anyway). Each spare stands for a worker held
 * in a call the shim does not cover, or in one it leaves to libc because the task holds a
 * pthread lock (shim.c), so the cap bounds how many such calls wait at once: a small cap makes
 * many blocked tasks wait for each other in turns. Go has no cap of its own on the
 * threads blocked in system calls but stops the program at 10,000 (debug.SetMaxThreads): a
 * program that needs more is more likely to have lost its way. The records of spares are made
 * as they start, so a high cap costs nothing until used; only arrays indexed by worker id
 * (weft_worker_max) grow with it.
 */
#define MAX_SPARES 10000
static int max_spares(void)
{
	const char *e = getenv("WEFT_MAX_SPARES");
	long n = MAX_SPARES;
	struct rlimit r;
	if (e && *e)
		n = strtol(e, NULL, 10);
	else if (getrlimit(RLIMIT_NPROC, &r) == 0 && r.rlim_cur != RLIM_INFINITY &&
		 r.rlim_cur < (rlim_t)n)
		n = (long)r.rlim_cur;
	return n < 0 ? 0 : n > 1000000 ? 1000000 : (int)n;
}

/* The monitor could start no spare (err: 0 when at the cap, else pthread_create's): tasks queued
 * behind held workers wait for them. Said once a run. */
static void spares_ran_out(int err)
{
	if (scheduler.capped)
		return;
	scheduler.capped = true;
	if (err)
		fprintf(stderr, "weft: could not start a spare worker (%s) with %d running: tasks "
				"queued behind workers held in blocking calls wait for them\n",
			strerror(err), atomic_load(&scheduler.nworkers));
	else if (scheduler.cap == scheduler.nominal)
		fputs("weft: WEFT_MAX_SPARES=0: tasks queued behind workers held in blocking calls "
		      "wait for them\n", stderr);
	else
		fprintf(stderr, "weft: all %d spare workers are in use (WEFT_MAX_SPARES): tasks "
				"queued behind workers held in blocking calls wait for them\n",
			scheduler.cap - scheduler.nominal);
}

/* A parked worker goes back to work, else a spare in standby does; else a new one starts. */
static void start_spare(void)
{
	if (unpark())
		return;
	int n = atomic_load(&scheduler.nworkers);
	for (int i = scheduler.nominal; i < n; i++) {
		struct worker *v = scheduler.workers[i];
		if (atomic_load(&v->standby)) {
			resume(v);
			return;
		}
	}
	if (n >= scheduler.cap) {
		spares_ran_out(0);
		return;
	}
	/* kept if a start failed */
	struct worker *w = scheduler.workers[n] ? scheduler.workers[n] : sched_new_worker(n);
	if (!w) {
		spares_ran_out(ENOMEM);
		return;
	}
	/* Counted before it runs: it must never be idle without being one of scheduler.nworkers
	 * (the deadlock check compares the two). Its queues are empty until then. */
	w->started = true;
	w->seen_since = weft_now(); /* for the monitor, which alone calls this */
	w->blocked = -1;
	atomic_store_explicit(&scheduler.nworkers, n + 1, memory_order_release);
	int err = pthread_create(&w->thread, NULL, sched_worker_thread, w);
	if (err) {
		w->started = false;
		atomic_store_explicit(&scheduler.nworkers, n, memory_order_release);
		spares_ran_out(err);
	}
}

static int64_t thread_cpu(struct worker *w)
{
	struct timespec ts;
	if (!atomic_load_explicit(&w->tid, memory_order_acquire) || w->cpu_clock == (clockid_t)-1 ||
	    clock_gettime(w->cpu_clock, &ts) != 0)
		return -1;
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Whether w's thread is runnable (state R: on a core, or waiting for one) rather than blocked
 * in the kernel. */
static bool runnable(struct worker *w)
{
	/* raw system calls, not stdio: the dump calls this from its SIGQUIT handler and from
	 * tasks, under the shim too */
	char path[64], buf[256];
	snprintf(path, sizeof path, "/proc/self/task/%d/stat", (int)atomic_load(&w->tid));
	int fd = (int)syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC);
	ssize_t n = fd >= 0 ? sys_read(fd, buf, sizeof buf - 1) : -1;
	if (fd >= 0)
		sys_close(fd);
	buf[n > 0 ? n : 0] = 0;
	const char *p = strrchr(buf, ')'); /* after the command name, which may hold anything */
	return p && p[1] == ' ' && p[2] == 'R';
}

int monitor_running(const weft_task *t, int64_t now, int64_t *ns, bool *in_kernel)
{
	int n = atomic_load(&scheduler.nworkers);
	for (int i = 0; i < n; i++) {
		struct worker *w = scheduler.workers[i];
		if (!w || w->cur != t)
			continue;
		uint32_t seen = atomic_load_explicit(&w->run_tick, memory_order_acquire);
		int64_t since = atomic_load_explicit(&w->run_since, memory_order_relaxed);
		bool known = seen == atomic_load_explicit(&w->tick, memory_order_relaxed) && since;
		*ns = known && now > since ? now - since : -1;
		*in_kernel = known && !runnable(w);
		return i;
	}
	return -1;
}

/* No worker is idle: start a spare, unless w's thread is merely waiting for a core. On an
 * overloaded machine the kernel may keep a worker off the CPU for longer than STUCK_NS, and
 * another thread would only lengthen the queue for the cores. So the monitor first notes the
 * thread's CPU time, then looks again a period later: a thread that computed (it used at least
 * half that time) or that is blocked in a system call gets a spare; one that was runnable
 * without running is left to the kernel. */
static bool spare_helps(struct worker *w, int64_t now)
{
	if (!w->probe_at) {
		w->probe_at = now;
		w->probe_cpu = thread_cpu(w);
		return false;
	}
	if (now - w->probe_at < MONITOR_NS)
		return false;
	int64_t cpu = thread_cpu(w), span = now - w->probe_at;
	w->probe_at = 0;
	return cpu < 0 || w->probe_cpu < 0 || 2 * (cpu - w->probe_cpu) >= span || !runnable(w);
}

/*
 * Whether w, on one task since seen_since with work queued, has held that work long enough to
 * be rescued: STUCK_NS, or only BLOCKED_NS when its thread is blocked in the kernel (a system
 * call the shim does not cover, or one it leaves to libc because the task holds a pthread
 * lock: shim.c). Waiting out a time slice is for threads the kernel may merely have preempted,
 * which are runnable; a blocked one may stay so for as long as its call lasts, as Go's sysmon
 * assumes of a thread in a system call when it hands its P over after 20 us to 10 ms. The
 * state is read once a period below STUCK_NS (a /proc read, tens of microseconds): a computing
 * task is looked at once, not every millisecond, and spares for many blocked tasks start
 * several times as fast as waiting STUCK_NS for each would.
 */
static bool held_long(struct worker *w, int64_t now)
{
	int64_t held = now - w->seen_since;
	if (held >= STUCK_NS)
		return true;
	if (held < BLOCKED_NS || atomic_load(&w->in_idle) || atomic_load(&w->sleeping_off_list))
		return false;
	if (w->blocked < 0)
		w->blocked = !runnable(w);
	return w->blocked;
}

/* Wake a worker asleep on the idle list to look for work, whether or not another is spinning
 * (unlike sched_wake_idle: that one has not taken the work in question). The spinner count is
 * given back under the lock, as sched_wake_idle does, and for the same reason. */
static void wake_one_idle(void)
{
	atomic_fetch_add(&scheduler.nspinning, 1);
	pthread_mutex_lock(&scheduler.idle_lock);
	struct worker *v = scheduler.idle;
	if (v) {
		sched_idle_remove(v);
		v->spinning = true;
	} else {
		atomic_fetch_sub(&scheduler.nspinning, 1);
	}
	pthread_mutex_unlock(&scheduler.idle_lock);
	if (v)
		sched_wake_worker(v);
}

/* w has held its work too long (held_long). Returns whether it was dealt with (else: look
 * again). */
static bool rescue(struct worker *w, int64_t now)
{
	if (atomic_load(&scheduler.nidle) == 0) {
		if (now - park.unparked_at < STUCK_NS)
			return false; /* a worker just unparked is on its way to take that queue */
		if (w->blocked <= 0 && !spare_helps(w, now))
			return w->probe_at == 0; /* still looking, or the kernel's business */
		start_spare();
		return true;
	}
	wake_one_idle();
	return true;
}

/* More workers are free than there are cores, or one was parked: a spare or a parked worker
 * asleep on the idle list is woken, to go to standby (it does so only on its way to sleep:
 * claim_standby), where sched_wake_idle no longer finds it. */
static bool nudge_to_standby(void)
{
	pthread_mutex_lock(&scheduler.idle_lock);
	struct worker *v = scheduler.idle;
	while (v && v->id < scheduler.nominal && !parked(v))
		v = v->idle_link;
	if (v)
		sched_idle_remove(v);
	pthread_mutex_unlock(&scheduler.idle_lock);
	if (v)
		sched_wake_worker(v);
	return v;
}

/* Spares that may stay free for STANDBY_NS before they go to standby; any more go at once.
 * Kept a while, spares spare a program that holds a worker now and then the hand-over and the
 * call back (see STANDBY_NS); but after a burst of blocking calls had started a hundred, they
 * took the work of the two workers between them for that second, and the kernel time-sliced
 * them, slowing a channel-bound program several times over. */
static int spares_kept(void)
{
	return scheduler.nominal > 4 ? scheduler.nominal : 4;
}

/* With every worker asleep the monitor pauses, unless spares beyond those kept are still on
 * the idle list, where a wake-up would find them and spread the next work over them: it looks
 * on, nudging them to standby, until they are there. */
static bool spares_to_put_away(void)
{
	return atomic_load(&scheduler.nworkers) - atomic_load(&scheduler.nstandby) >
	       scheduler.nominal + spares_kept();
}

/* Time stuck counts from now: at the monitor's start (before it, the workers were starting,
 * not stuck: counted from 0, worker 0 with the main task queued looked stuck at the first look,
 * and on a slow machine got a spare) and after it slept. */
static void monitor_start_clocks(void)
{
	int64_t now = weft_now();
	for (int i = 0; i < atomic_load(&scheduler.nworkers); i++)
		scheduler.workers[i]->seen_since = scheduler.workers[i]->moved_at = now,
		scheduler.workers[i]->blocked = -1;
}

/* Whether w is free to take work, as far as the monitor can tell: not in standby, and not held
 * by one task for STUCK_NS (blocked in a call the shim does not cover, or computing). */
static bool free_to_work(struct worker *w, uint32_t tick, int64_t now)
{
	if (tick != w->moved_tick || atomic_load(&w->in_idle) || atomic_load(&w->sleeping_off_list)) {
		w->moved_tick = tick;
		w->moved_at = now;
	}
	return !atomic_load(&w->standby) && now - w->moved_at < STUCK_NS;
}

/* With every worker asleep nothing can be stuck: the monitor sleeps too, so that an idle
 * program takes no wake-ups at all, until a worker leaves its idle sleep (idle.c,
 * monitor_resume). The flag is set before the last look at nidle, and a worker clears it after
 * leaving the idle list (both seq_cst): one of the two sees the other. */
static void monitor_pause(void)
{
	atomic_store(&scheduler.monitor_off, 1);
	if (all_asleep() && !atomic_load(&scheduler.stop))
		futex_wait(&scheduler.monitor_off, 1, INT64_MAX);
	atomic_store(&scheduler.monitor_off, 0);
	monitor_start_clocks(); /* the time asleep is nobody's time stuck */
}

void monitor_resume(void)
{
	if (atomic_load(&scheduler.monitor_off) && atomic_exchange(&scheduler.monitor_off, 0)) {
		/* the coarse clock stood still while the monitor slept: the tasks about to run
		 * must not park with the time it fell asleep (a short sleep would show in
		 * dumps as the whole pause); the monitor takes over again from its next look */
		atomic_store_explicit(&sched_coarse_now, weft_now(), memory_order_relaxed);
		futex_wake(&scheduler.monitor_off, 1);
	}
}

void *monitor_thread(void *arg)
{
	(void)arg;
	weft_unpin(); /* started by worker 0: its CPU set (affinity.c) */
	monitor_start_clocks();
	/* since when the global queue has waited for everyone; since when nobody has taken from
	 * it, which scheduler.global_takes tells; since when more workers have been free than
	 * cores */
	int64_t global_waited_since = weft_now(), global_untaken_since = global_waited_since;
	uint32_t global_takes_seen = 0;
	int64_t spare_since = 0;
	while (!atomic_load(&scheduler.stop)) {
		/* Not while tasks wait in the global queue: every worker asleep beside them is a
		 * wake-up lost, which the watch of the queue below makes up for. */
		if (all_asleep() && !spares_to_put_away() && !atomic_load(&scheduler.global_len))
			monitor_pause();
		int64_t now = weft_now();
		atomic_store_explicit(&sched_coarse_now, now, memory_order_relaxed);
		int n = atomic_load(&scheduler.nworkers), free = 0;
		for (int i = 0; i < n; i++) {
			struct worker *w = scheduler.workers[i];
			uint32_t tick = atomic_load_explicit(&w->tick, memory_order_relaxed);
			if (tick != atomic_load_explicit(&w->run_tick, memory_order_relaxed)) {
				atomic_store_explicit(&w->run_since, now, memory_order_relaxed);
				atomic_store_explicit(&w->run_tick, tick, memory_order_release);
			}
			free += free_to_work(w, tick, now);
			if (tick != w->seen_tick || !has_work(w, now)) {
				w->seen_tick = tick;
				w->seen_since = now;
				w->probe_at = 0;
				w->blocked = -1;
			} else if (held_long(w, now) && rescue(w, now)) {
				w->seen_since = now;
				w->blocked = -1;
			}
		}
		if (free <= scheduler.nominal)
			spare_since = 0;
		else if (!spare_since)
			spare_since = now;
		bool spare_idle = spare_since && now - spare_since >= scheduler.standby_ns;
		int unneeded = free - scheduler.nominal;
		if (!spare_idle && unneeded > 0)
			unneeded = unneeded > spares_kept() ? unneeded - spares_kept() : 0;
		atomic_store(&scheduler.spares_to_standby, unneeded);
		for (int k = 0; k < unneeded && nudge_to_standby(); k++)
			;
		if (scheduler.parking)
			park_or_unpark(now);
		/*
		 * Fds waited on and nobody polling for STUCK_NS: the poller went off to run a task
		 * that now holds its worker (the poller is chosen as a worker goes to sleep, in
		 * idle.c), and the other idle workers sleep on their futexes. Wake one: it comes
		 * back through idle_sleep() and polls.
		 *
		 * With none on the idle list, the worker that would have polled may be parked (a
		 * light load parked it before the worker at work was held): the fds are left to the
		 * workers at work, and those are held. Nothing else brings it back: the readers are
		 * parked on fds, not queued, so no rescue sees them, and park_or_unpark unparks for
		 * CPU only when a held worker computes above UNPARK_CPU, which one blocked in the
		 * kernel never does, nor one the kernel time-slices on a loaded machine. So unpark
		 * it: a nominal worker, no thread beyond the cores. Rejected: starting a spare when
		 * none is parked (the watch cannot tell a ready fd from one merely waited on, and
		 * would add a thread beside workers that may only be preempted); the monitor
		 * polling itself, as Go's sysmon does (the tasks it readied would wait in the
		 * global queue for that watch to unpark, STUCK_NS more, and a second kind of poller
		 * beside idle_sleep()'s); not parking while fds are waited on (a server's light load,
		 * which parking is for, always has them).
		 */
		if (poll_waiters() > 0 && !atomic_load(&scheduler.polling) &&
		    now - atomic_load(&scheduler.last_poll) >= STUCK_NS) {
			if (atomic_load(&scheduler.nidle))
				sched_wake_idle();
			else
				unpark();
		}
		/*
		 * The global queue. has_work() sees a worker's own queues only, so it is watched
		 * here. Workers take from it when they run out of work and every GLOBAL_EVERY
		 * switches, a fair share at a time (global_pop); a worker asleep on the idle list
		 * only once woken. Tasks waiting there for STUCK_NS:
		 *  - with no worker free to take them (every one held by a task, or in standby: a
		 *    plain thread woke those tasks, or a spare handed them over) get a spare;
		 *  - with nobody taking from it meanwhile and a worker asleep on the idle list,
		 *    that worker is woken. free_to_work() counts it free, and it is, but only once
		 *    woken, and nothing else may wake it: the queue also fills without a wake-up
		 *    (a ring's overflow, say as a worker drains an inbox a hot channel filled), and
		 *    a wake-up from a worker may be missed by design, since the waker is to take
		 *    the work itself, a share at a time. When its task then blocks it in a call
		 *    the shim does not cover, what it left in the queue waited for good.
		 * Waking on every spill instead would not do: any missed wake-up leaves the same
		 * state, and only the monitor sees the worker held afterwards. Nor would counting
		 * sleeping workers as not free: a spare would start where a wake-up does. The
		 * wait is STUCK_NS, not BLOCKED_NS: while tasks gather on a hot channel's home,
		 * the others leave the queue to it (steal_from_global) and it takes from it only every
		 * GLOBAL_EVERY switches, so a shorter wait would wake workers that decline.
		 */
		int queued = atomic_load(&scheduler.global_len);
		if (free > 0 || !queued)
			global_waited_since = now;
		else if (now - global_waited_since >= STUCK_NS) {
			start_spare();
			global_waited_since = now;
		}
		uint32_t taken = atomic_load_explicit(&scheduler.global_takes, memory_order_relaxed);
		if (!queued || taken != global_takes_seen || !atomic_load(&scheduler.nidle)) {
			global_takes_seen = taken;
			global_untaken_since = now;
		} else if (now - global_untaken_since >= STUCK_NS) {
			wake_one_idle();
			global_untaken_since = now;
		}
		futex_wait(&scheduler.monitor_word, 0, now + MONITOR_NS);
	}
	return NULL;
}

/* Per run: the spares' cap and standby time, parking (init_workers, before the records). */
void monitor_init(int n)
{
	const char *e = getenv("WEFT_SPARE_MS");
	scheduler.standby_ns = e && *e ? strtoll(e, NULL, 10) * 1000000 : STANDBY_NS;
	atomic_store(&scheduler.spares_to_standby, 0);
	atomic_store(&scheduler.active, n);
	e = getenv("WEFT_PARK");
	scheduler.parking = n > 1 && !(e && strcmp(e, "0") == 0);
	memset(&park, 0, sizeof park);
	scheduler.cap = n + max_spares();
	scheduler.capped = false;
}
