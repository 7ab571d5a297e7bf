/*
 * sched.c - workers and the scheduler.
 *
 * weft runs tasks on one worker thread per core (weft_run makes the calling thread worker 0).
 * The shape is Go's and Tokio's:
 *
 *  - Each worker has a bounded local ring (runq.h) and a one-task `next` slot. A task woken by
 *    a task goes to the waker's `next` slot, so a receiver runs right after its sender on the
 *    same core, with the data still in cache, and contending tasks gather on one core. A run
 *    of `next` hand-offs is cut after NEXT_STREAK so that a ping-pong pair cannot starve the
 *    ring.
 *  - Tasks switch directly from one to the next (one assembly switch, no detour through a
 *    scheduler stack). Only when a worker has nothing local to run does it switch to its idle
 *    loop, which runs expired timers, takes from the global queue, steals half of another
 *    worker's ring (or asks a spawning one to give it: give()) and finally sleeps on a futex
 *    until its earliest deadline.
 *  - The global queue takes tasks woken by plain threads (and a full ring's overflow). Every
 *    GLOBAL_EVERY switches a worker looks there (and at its timers) first, for fairness.
 *  - A task is "on CPU" from the moment a worker switches to it until the next context has
 *    completed the switch away (finish_switch). A waker may make a task runnable while it is
 *    still switching away; whoever picks it up waits for on_cpu to clear, which takes a few
 *    instructions. This is what lets park publish the task before it has left its stack.
 *  - Idle workers: at most half the busy workers spin looking for work; the rest sleep. Making
 *    work runnable wakes a sleeping worker only when none is spinning (sched_wake_idle). A worker
 *    going to sleep first puts itself on the idle list, then looks once more for work, so a
 *    task queued in between is not stranded.
 *  - Contended channels gather on one worker (chan.c, sched_note_contention): their waiters are
 *    woken there and their tasks move there (sched_move); meanwhile idle workers leave that
 *    worker's queue alone unless it stalls, and rest (rest()) rather than spin beside it.
 *  - A monitor thread gives the queue of a worker held by one task (a blocking call the shim
 *    does not cover, a long computation) to an idle worker, or to a spare worker thread when
 *    none is idle; a spare goes to standby once it is not needed (standby()).
 *  - At a light load the monitor parks workers (park_or_unpark): they go to standby too, and
 *    the rest do the work without waking them; it brings them back as soon as work queues.
 *  - Deadlock: when every worker sleeps with no deadline pending, tasks are alive, and no
 *    thread outside weft could wake them, weft prints the blocked tasks and aborts.
 */
#define _GNU_SOURCE
#include "sched.h"

#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include "affinity.h"
#include "asym.h"
#include "blocking.h"
#include "futex.h"
#include "monitor.h"
#include "overflow.h"
#include "poll.h"
#include "sanitizer.h"
#include "sched_state.h"
#include "trace.h"
#include "waitstat.h"
#include "wait.h"
#include "weft.h"

#define NEXT_STREAK 64
#define GLOBAL_EVERY 61
#define STEAL_ROUNDS 4
#define NEXT_STEAL_NS 3000   /* see steal() */
#define BUSY_POLL_NS 20000  /* a busy worker polls fds at most this often */
#define SPIN_POLL_NS 2000   /* and a spinning one */
#define PREFETCH_QUEUE 8    /* see prefetch_next() */
#define PREFETCH_AHEAD 3    /* see prefetch_next(); below PREFETCH_QUEUE */
#define STALL_NS 10000      /* see steal() */
#define SPIN_NS 20000       /* an idle worker looks for work up to this long before sleeping */
#define SPIN_MIN_NS 1250    /* and at least this long: see worker_loop() */
#define REST_MIN_NS 50000   /* a spin that declined work sleeps this long, */
#define REST_MAX_NS 1000000 /* doubling up to this: see rest() */
#define TIMER_SPIN_NS 20000 /* it wakes this long before a deadline, then spins up to it:
			     * a futex timeout alone ends 20-60 us late on a virtual machine */

struct sched_state sched_state = { .gq_lock = PTHREAD_MUTEX_INITIALIZER,
				.idle_lock = PTHREAD_MUTEX_INITIALIZER };

static atomic_bool running;

const void *sched_runtime(void)
{
	return &S;
}

/* libweft-shim.so serves the weft of libweft.so. In a program that has weft linked in
 * statically as well, the shim does not know this copy's tasks: their blocking calls would
 * block their workers, silently. Say so. */
static void check_shim(void)
{
	const void *(*served)(void);
	*(void **)&served = dlsym(RTLD_DEFAULT, "weft__shim_runtime");
	if (served && served() != sched_runtime())
		fputs("weft: libweft-shim.so is loaded but serves libweft.so, not the copy of weft "
		      "linked into this program: blocking calls in its tasks will block their "
		      "workers. Link the program with -lweft to use the shim.\n", stderr);
}

_Atomic int64_t sched_coarse_now;
_Atomic int64_t sched_contended_at;
atomic_int sched_gather_on;
__thread struct worker *worker_tls __attribute__((tls_model("initial-exec")));

#if !defined(__x86_64__)
__attribute__((noinline)) struct worker *worker_self(void)
{
	__asm__ __volatile__("" ::: "memory");
	return worker_tls;
}
#endif

uint64_t sched_new_id(struct worker *w)
{
	if (w->id_next == w->id_end) {
		w->id_next = atomic_fetch_add(&S.ids, 1024);
		w->id_end = w->id_next + 1024;
	}
	return w->id_next++;
}

/* ---- queues ------------------------------------------------------------------------------ */

/*
 * The global queue is a growable ring of task pointers under a mutex. Not a list linked
 * through the tasks: when 10^5 timers fire at once and spill here, walking such a list under
 * the lock costs a cache miss per task (bench/sleepers spent a quarter of its time so); copying
 * pointers costs none. It only grows (by doubling; it is freed when weft_run ends).
 */
static void global_grow(uint32_t need)
{
	uint32_t cap = S.gq_cap ? S.gq_cap : 1024;
	while (cap < need)
		cap *= 2;
	weft_task **v = malloc(cap * sizeof *v);
	if (!v) {
		static const char msg[] = "weft: out of memory growing the global run queue\n";
		if (write(2, msg, sizeof msg - 1) < 0) {
		}
		abort();
	}
	uint32_t n = (uint32_t)atomic_load_explicit(&S.gq_n, memory_order_relaxed);
	for (uint32_t i = 0; i < n; i++)
		v[i] = S.gq[(S.gq_head + i) & (S.gq_cap - 1)];
	free(S.gq);
	S.gq = v;
	S.gq_cap = cap;
	S.gq_head = 0;
}

static void global_push(weft_task *const *batch, uint32_t n)
{
	pthread_mutex_lock(&S.gq_lock);
	uint32_t len = (uint32_t)atomic_load_explicit(&S.gq_n, memory_order_relaxed);
	if (len + n > S.gq_cap)
		global_grow(len + n);
	for (uint32_t i = 0; i < n; i++)
		S.gq[(S.gq_head + len + i) & (S.gq_cap - 1)] = batch[i];
	atomic_store_explicit(&S.gq_n, (int)(len + n), memory_order_relaxed);
	pthread_mutex_unlock(&S.gq_lock);
}

/* Take a fair share of the global queue: one to run, the rest into w's ring. */
static weft_task *global_pop(struct worker *w)
{
	if (atomic_load_explicit(&S.gq_n, memory_order_relaxed) == 0)
		return NULL;
	weft_task *batch[RUNQ_SIZE + 1];
	/* only we push to our ring: its room can only grow while we copy */
	uint32_t room = RUNQ_SIZE - runq_len(&w->q), n;
	pthread_mutex_lock(&S.gq_lock);
	uint32_t len = (uint32_t)atomic_load_explicit(&S.gq_n, memory_order_relaxed);
	int working = atomic_load(&S.n) - atomic_load(&S.nstandby); /* spares in standby take none */
	n = len / (uint32_t)(working > 1 ? working : 1) + 1;
	if (n > len)
		n = len;
	if (n > room + 1)
		n = room + 1;
	for (uint32_t i = 0; i < n; i++)
		batch[i] = S.gq[(S.gq_head + i) & (S.gq_cap - 1)];
	S.gq_head = (S.gq_head + n) & (S.gq_cap - 1);
	atomic_store_explicit(&S.gq_n, (int)(len - n), memory_order_relaxed);
	if (n)
		atomic_store_explicit(&S.gq_taken,
				      atomic_load_explicit(&S.gq_taken, memory_order_relaxed) + 1,
				      memory_order_relaxed);
	pthread_mutex_unlock(&S.gq_lock);
	for (uint32_t i = 1; i < n; i++)
		runq_push(&w->q, batch[i]);
	return n ? batch[0] : NULL;
}

/* A full ring moves half of itself, plus t, to the global queue. */
static __attribute__((noinline)) void spill(struct worker *w, weft_task *t)
{
	weft_task *batch[RUNQ_SIZE / 2 + 1];
	uint32_t n = runq_grab(&w->q, batch, RUNQ_SIZE / 2);
	batch[n++] = t;
	global_push(batch, n);
}

static inline void push_local(struct worker *w, weft_task *t)
{
	if (!runq_push(&w->q, t))
		spill(w, t);
}

static bool work_anywhere(void)
{
	if (atomic_load(&S.gq_n))
		return true;
	for (int i = 0; i < S.n; i++)
		if (runq_len(&S.w[i]->q) || atomic_load(&S.w[i]->next) || atomic_load(&S.w[i]->inbox))
			return true;
	return false;
}

/* ---- idle workers ------------------------------------------------------------------------ */

/* v was taken off the idle list (lock held then), or rests or stands by off it: end its
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
	if (atomic_load(&S.nidle) == 0 || atomic_load(&S.nspinning) != 0)
		return;
	int zero = 0;
	if (!atomic_compare_exchange_strong(&S.nspinning, &zero, 1))
		return;
	pthread_mutex_lock(&S.idle_lock);
	struct worker *v = S.idle;
	if (v) {
		S.idle = v->idle_link;
		v->idle_link = NULL;
		v->in_idle = false;
		v->spinning = true; /* it takes over the nspinning count we added */
		atomic_fetch_sub(&S.nidle, 1);
	} else {
		atomic_fetch_sub(&S.nspinning, 1);
	}
	pthread_mutex_unlock(&S.idle_lock);
	if (v)
		sched_wake_worker(v);
}

static _Atomic int64_t foreign_wakes; /* tasks woken by plain threads */

/*
 * A worker takes from the head of its own ring and from its `next` slot at every switch, and
 * thieves take from the same places a few hundred times a second: each of the worker's takes
 * is a CAS or an exchange only to exclude them, half the cost of a yield. So the worker and
 * its thieves play Dekker's game with asymmetric fences (asym.h): the worker sets in_own and
 * then looks at `thieves`; a thief counts itself in `thieves`, runs asym_heavy and then waits
 * for in_own to clear. A worker that finds no thief works alone, with plain loads and stores,
 * until it clears in_own; one that finds a thief uses the atomic operations, as every worker
 * does where membarrier is missing. A worker preempted while alone could keep a thief waiting:
 * after THIEF_PATIENCE looks the thief gives up and tries elsewhere (as it does when membarrier
 * fails).
 */
#define THIEF_PATIENCE 1000

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

static void thief_end(struct worker *v)
{
	if (asym_on())
		atomic_fetch_sub_explicit(&v->thieves, 1, memory_order_release);
}

static _Atomic long fenced_steals;

long sched_fenced_steals(void)
{
	return atomic_load_explicit(&fenced_steals, memory_order_relaxed);
}

static bool thief_begin(struct worker *v)
{
	if (!asym_on())
		return true;
	atomic_fetch_add(&v->thieves, 1);
	atomic_fetch_add_explicit(&fenced_steals, 1, memory_order_relaxed);
	if (asym_heavy())
		for (int i = 0; i < THIEF_PATIENCE; i++) {
			if (!atomic_load_explicit(&v->in_own, memory_order_acquire))
				return true;
			cpu_relax();
		}
	thief_end(v);
	return false;
}

/* The owner takes its `next` task; `alone`: from own_begin. */
static inline weft_task *next_take(struct worker *w, bool alone)
{
	weft_task *t = atomic_load_explicit(&w->next, memory_order_relaxed);
	if (!t)
		return NULL;
	if (!alone)
		return atomic_exchange_explicit(&w->next, NULL, memory_order_acq_rel);
	atomic_store_explicit(&w->next, NULL, memory_order_relaxed);
	return t;
}

/* The owner puts t in `next`, returning the task it displaces. */
static inline weft_task *next_put(struct worker *w, weft_task *t)
{
	/* Only the owner puts a task in `next` (thieves only take it out), so an empty slot stays
	 * empty until we fill it: a plain store. */
	weft_task *old = atomic_load_explicit(&w->next, memory_order_relaxed);
	if (!old) {
		atomic_store_explicit(&w->next, t, memory_order_release);
		return NULL;
	}
	if (!own_begin(w))
		return atomic_exchange_explicit(&w->next, t, memory_order_acq_rel);
	old = atomic_load_explicit(&w->next, memory_order_relaxed); /* a thief may have taken it */
	atomic_store_explicit(&w->next, t, memory_order_release);
	own_end(w);
	return old;
}

/* noinline: gcc refuses its fence under TSan once it is inlined (into sched_ready_on); the
 * other callers are in other files anyway. */
__attribute__((noinline)) void sched_ready(weft_task *t)
{
	task_set_state(t, TASK_RUNNABLE);
	struct worker *w = worker_self();
	if (!w) {
		atomic_fetch_add_explicit(&foreign_wakes, 1, memory_order_relaxed);
		global_push(&t, 1);
		atomic_thread_fence(memory_order_seq_cst); /* pairs with idle()'s re-check */
		sched_wake_idle();
		return;
	}
	counter_inc(&w->wakes);
	weft_task *old = next_put(w, t);
	if (old) {
		push_local(w, old);
		sched_wake_idle();
	}
}

/* The inbox is a stack any worker pushes onto with a CAS, and its owner (or a worker allowed
 * to steal from it) empties with one exchange. Pushes the chain newest..oldest, linked through
 * `link` from newest to oldest. */
static void inbox_push_chain(struct worker *v, weft_task *newest, weft_task *oldest)
{
	weft_task *head = atomic_load_explicit(&v->inbox, memory_order_relaxed);
	do
		oldest->link = head;
	while (!atomic_compare_exchange_weak_explicit(&v->inbox, &head, newest,
						      memory_order_seq_cst, memory_order_relaxed));
}

static void inbox_push(struct worker *v, weft_task *t)
{
	inbox_push_chain(v, t, t);
}

/* Move v's inbox into w's ring, oldest first. Returns how many. */
static int inbox_drain(struct worker *w, struct worker *v)
{
	if (!atomic_load_explicit(&v->inbox, memory_order_relaxed))
		return 0;
	weft_task *t = atomic_exchange_explicit(&v->inbox, NULL, memory_order_acquire), *rev = NULL;
	int n = 0;
	while (t) {
		weft_task *next = t->link;
		t->link = rev;
		rev = t;
		t = next;
	}
	for (; rev; n++) {
		weft_task *next = rev->link;
		push_local(w, rev);
		rev = next;
	}
	return n;
}

/* Take w off the idle list. Lock held. */
void sched_idle_remove(struct worker *w)
{
	for (struct worker **p = &S.idle; *p; p = &(*p)->idle_link)
		if (*p == w) {
			*p = w->idle_link;
			w->idle_link = NULL;
			w->in_idle = false;
			atomic_fetch_sub(&S.nidle, 1);
			return;
		}
}

/* v was given work while it may be asleep: wake it (it may be on the idle list, or resting). */
static void wake_this(struct worker *v)
{
	if (atomic_load(&v->resting)) {
		sched_wake_worker(v);
		return;
	}
	pthread_mutex_lock(&S.idle_lock);
	bool asleep = v->in_idle;
	if (asleep)
		sched_idle_remove(v);
	pthread_mutex_unlock(&S.idle_lock);
	if (asleep)
		sched_wake_worker(v);
}

/* v has tasks in its inbox: make sure it is awake. After the seq_cst push: idle() and rest()
 * announce themselves before their last look. */
static void inbox_posted(struct worker *v)
{
	if (atomic_load(&S.nidle) || atomic_load(&v->resting))
		wake_this(v);
}

/* Make t runnable on v, through its inbox. */
static void ready_on(struct worker *v, weft_task *t)
{
	task_set_state(t, TASK_RUNNABLE);
	inbox_push(v, t);
	inbox_posted(v);
}

/*
 * Asking. A thief's fence (thief_begin) interrupts its victim's core: a few microseconds, and
 * on a virtual machine 10 or more, for each batch, however small. A worker spawning tasks one
 * by one beside an idle one would be interrupted for nearly every task, and spend more time on
 * that than on the spawns (200 spawns on two workers: 2.7 ms against 0.9 on one; 10^6 spawns
 * in a loop: 158,000 steals by the spares the monitor started). So a thief first asks a worker
 * that is spawning (ask(), in steal()), and the victim gives, with no fence: at its next switch
 * or spawn, it takes half its ring as a thief would (a CAS) and pushes it onto the asker's
 * inbox in one go. A victim that leaves the ask unanswered for STALL_NS runs one task that
 * neither switches nor spawns: then the thief steals. The asker spins that long at least, and
 * withdraws its asks once it stops looking (stop_looking): an answer would otherwise hand
 * tasks to a worker busy with others, or asleep and slow to wake, while their owner could run
 * them at once (weft-mqtt at a fixed 10,000 msgs/s: p99 470-3,000 us with such answers,
 * 150-1,000 without, as before). Only spawners are asked: a worker whose ring fills with
 * tasks woken by the poller is better stolen from at once (hello-http, wrk with 100
 * connections: p99 3.0 ms when its workers asked each other, 1.9 ms when they steal).
 */
static __attribute__((noinline)) void give(struct worker *w)
{
	/* One task queued: at a switch we are about to run it, at a spawn the next one makes two.
	 * The ask stays; should we hold on to that task past STALL_NS, the thief steals it. */
	if (runq_len(&w->q) < 2)
		return;
	/* An ask still out is one its asker has not withdrawn: it is still looking for work.
	 * Acquire, against the asker's release: the asker may be a spare whose record the monitor
	 * made after this worker last looked at S.n. */
	uint32_t who = atomic_exchange_explicit(&w->asked, 0, memory_order_acquire);
	weft_task *batch[RUNQ_SIZE / 2];
	uint32_t got = who ? runq_grab(&w->q, batch, RUNQ_SIZE / 2) : 0;
	if (!got)
		return;
	struct worker *v = S.w[who - 1];
	for (uint32_t k = 0; k + 1 < got; k++) /* newest first, as inbox_push leaves them */
		batch[k + 1]->link = batch[k];
	inbox_push_chain(v, batch[got - 1], batch[0]);
	atomic_fetch_add_explicit(&v->given, 1, memory_order_relaxed);
	inbox_posted(v);
	/* The asker found work meanwhile: it may look at its inbox only in a while. Thieves take
	 * from inboxes too. (seq_cst push, then `looking`; the asker clears `looking`, then looks
	 * at its inbox: stop_looking) */
	if (!atomic_load(&v->looking))
		sched_wake_idle();
}

static inline void answer(struct worker *w)
{
	if (__builtin_expect(atomic_load_explicit(&w->asked, memory_order_relaxed) != 0, 0))
		give(w);
}

void sched_ready_on(weft_task *t, int home)
{
	struct worker *w = worker_self();
	if (!w || w->id == home || home < 0 || home >= atomic_load(&S.n)) {
		sched_ready(t);
		return;
	}
	counter_inc(&w->wakes);
	ready_on(S.w[home], t);
}

/* Whether w has work queued besides the task it runs: only then is another worker woken for a
 * task made runnable here (sched_ready, sched_ready_tail, sched_ready_batch). */
static inline bool has_queued(struct worker *w)
{
	return runq_len(&w->q) || atomic_load_explicit(&w->next, memory_order_relaxed);
}

/* A new task goes to the back of the queue. As with sched_ready, another worker is woken only
 * when this one has more work than the task it runs: a task that spawns one other and then
 * waits (an accept loop) hands its worker over to it without a futex wake and a steal. If
 * the spawner computes on instead, the monitor rescues the new task (STUCK_NS). */
void sched_ready_tail(weft_task *t)
{
	task_set_state(t, TASK_RUNNABLE);
	struct worker *w = worker_self();
	if (!w) {
		global_push(&t, 1);
		atomic_thread_fence(memory_order_seq_cst);
		sched_wake_idle();
		return;
	}
	bool more = has_queued(w);
	push_local(w, t);
	if (more)
		sched_wake_idle();
	answer(w); /* a task spawning in a loop does not switch */
}

void sched_ready_batch(weft_task *const *v, int n)
{
	struct worker *w = worker_self();
	bool more = n > 1 || has_queued(w);
	int i = 0;
	for (int k = 0; k < n; k++)
		task_set_state(v[k], TASK_RUNNABLE);
	while (i < n && runq_push(&w->q, v[i]))
		i++;
	if (i < n)
		global_push(v + i, (uint32_t)(n - i));
	if (more) /* one sleeper woken on an idle worker: that worker runs it (sched_ready_tail) */
		sched_wake_idle();
}

/* ---- switching --------------------------------------------------------------------------- */

/* The first thing a context does once resumed: let go of the task switched away from. Every
 * switch_to sets w->prev just before it switches, and every context resumes through here
 * exactly once per switch, so prev needs no clearing. */
static inline __attribute__((always_inline)) void finish_switch(void *fake_stack)
{
#ifdef WEFT_ASAN
	__sanitizer_finish_switch_fiber(fake_stack, NULL, NULL);
#else
	(void)fake_stack;
#endif
	struct worker *w = worker_self();
	weft_task *p = w->prev;
	if (!p)
		return;
	if (task_state(p) == TASK_DONE && p->detached)
		task_release(p);
	else
		atomic_store_explicit(&p->on_cpu, 0, memory_order_release);
}

void sched_finish_switch(void)
{
	finish_switch(NULL);
}

static void switch_via_idle(struct worker *w, weft_task *from, weft_task *to, int left);

/* Switch from `from` (NULL: the idle loop) to `to` (NULL: the idle loop). */
static inline __attribute__((always_inline)) void switch_to(struct worker *w, weft_task *from,
							     weft_task *to, int left)
{
	/* The canary is read every time a task ends or parks with no deadline (it may never
	 * switch again), else at every CANARY_EVERY-th switch (stack.c). */
	if (from && !stack_intact(&from->stk, stack_pointer(),
				  left == TRACE_EXIT || (left == TRACE_PARK && !from->timer.wheel)))
		overflow_abort(from);
	if (to && __builtin_expect(atomic_load_explicit(&to->on_cpu, memory_order_acquire), 0)) {
		if (from) {
			switch_via_idle(w, from, to, left);
			return;
		}
		while (atomic_load_explicit(&to->on_cpu, memory_order_acquire))
			cpu_relax();
	}
	if (to) {
		atomic_store_explicit(&to->on_cpu, 1, memory_order_relaxed);
		task_set_state(to, TASK_RUNNING);
	}
	trace_switch(from, to, left);
	w->prev = from;
	/* Two plain stores: merged into one 16-byte store they cost a move into a vector register
	 * on every switch. */
	__asm__ volatile("" ::: "memory");
	w->cur = to;
	/* Only the owner writes tick: a plain increment, atomic only for the monitor's reads. */
	atomic_store_explicit(&w->tick, atomic_load_explicit(&w->tick, memory_order_relaxed) + 1,
			      memory_order_relaxed);
#ifdef WEFT_ASAN
	void **fake = !from ? &w->idle_fake_stack
			    : task_state(from) == TASK_DONE ? NULL : &from->asan_fake_stack;
	__sanitizer_start_switch_fiber(fake, to ? to->stk.lo : w->stack_bottom,
				       to ? to->stk.size : w->stack_size);
#endif
#ifdef WEFT_TSAN
	__tsan_switch_to_fiber(to ? to->tsan_fiber : w->tsan_fiber, 0);
#endif
	ctx_switch(from ? &from->ctx : &w->idle_ctx, to ? &to->ctx : &w->idle_ctx);
	/* Resumed: possibly on another worker, so `w` is stale; `from` is us. */
	finish_switch(from ? from->asan_fake_stack : worker_self()->idle_fake_stack);
}

/* `to` is still leaving another worker, which may itself be waiting for `from` to leave this
 * one: waiting here could deadlock. Go by the idle loop, which holds no task while it waits.
 * Out of line, so that the common path knows `to` is never NULL after all. */
static __attribute__((noinline)) void switch_via_idle(struct worker *w, weft_task *from,
						      weft_task *to, int left)
{
	push_local(w, to);
	switch_to(w, from, NULL, left);
}

static void run_timers(struct worker *w)
{
	if (atomic_load_explicit(&w->timers.first, memory_order_acquire) != INT64_MAX) {
		int64_t now = weft_now();
		if (atomic_load_explicit(&w->timers.first, memory_order_acquire) <= now)
			wait_expire(&w->timers, now, false);
	}
}

/* Poll fds without waiting, if nobody did in the last `every` ns: under load no worker sleeps
 * in epoll, and a spinning worker must see sockets too (as Go's findrunnable does), or a
 * readiness would wait for its spin to end. Returns the number of tasks woken. */
static int poll_now(int64_t every)
{
	if (!poll_waiters() || atomic_load_explicit(&S.polling, memory_order_relaxed))
		return 0;
	int64_t now = weft_now();
	if (now - atomic_load_explicit(&S.last_poll, memory_order_relaxed) < every ||
	    atomic_exchange(&S.polling, true))
		return 0;
	atomic_store_explicit(&S.last_poll, now, memory_order_relaxed);
	int n = poll_run(0);
	atomic_store(&S.polling, false);
	return n;
}

/* Start loading a task that will run soon, whose record and stack are long out of cache when
 * many tasks take turns (10^5 sleepers each run once per pass over all of them): its record,
 * and the frames it parked with, just below the record (stack.h). Not the next one but the
 * one PREFETCH_AHEAD places behind the head of the ring (itself the one after `next`): a
 * task's pages take a TLB walk and then a dozen misses, longer than a task's turn, and loading
 * the head left most of the wait in place (10^5 sleepers: 115 ms against 130).
 *
 * Only with PREFETCH_QUEUE or more tasks queued: behind fewer, a task is still in cache (the
 * one-million-packet run spent 9% of its instructions here when it always prefetched). By
 * address only: the pointer may be stale (a thief took it) and a prefetch never faults. Called
 * when a task parks, not when it yields: a yield ping-pong has nothing cold to load; nor when
 * the next task came from `next`: such hand-offs go on while the queue waits (at capacity 1,
 * 100+100 tasks on one worker: 2.5% of the instructions). */
static inline void prefetch_next(struct runq *q)
{
	uint32_t h = atomic_load_explicit(&q->head, memory_order_relaxed);
	if (atomic_load_explicit(&q->tail, memory_order_relaxed) - h < PREFETCH_QUEUE)
		return;
	uint32_t i = (h + PREFETCH_AHEAD) % RUNQ_SIZE;
	const char *t = (const char *)atomic_load_explicit(&q->ring[i], memory_order_relaxed);
#pragma GCC unroll 12
	for (int l = -8; l < 4; l++)
		__builtin_prefetch(t + 64 * l, 1);
}

/* The next task to run from w's own queues, or NULL. */
static inline __attribute__((always_inline)) weft_task *pick(struct worker *w)
{
	weft_task *t;
	answer(w);
	if (atomic_load_explicit(&w->tick, memory_order_relaxed) % GLOBAL_EVERY == 0) {
		/* weft_run is ending: back to the idle loop, which stops the worker */
		if (atomic_load_explicit(&S.stop, memory_order_relaxed))
			return NULL;
		run_timers(w);
		poll_now(BUSY_POLL_NS);
		inbox_drain(w, w);
		if ((t = global_pop(w)))
			return t;
	}
	bool alone = own_begin(w);
	if (w->next_streak < NEXT_STREAK && (t = next_take(w, alone))) {
		w->next_streak++;
	} else {
		w->next_streak = 0;
		t = alone ? runq_pop_alone(&w->q) : runq_pop(&w->q);
		if (!t)
			t = next_take(w, alone);
	}
	if (alone)
		own_end(w);
	return t;
}

void sched_park(void)
{
	struct worker *w = worker_self();
	weft_task *self = w->cur;
	task_set_state(self, TASK_PARKED);
	self->parked_at = atomic_load_explicit(&sched_coarse_now, memory_order_relaxed);
	counter_inc(&w->parks);
	weft_task *next = pick(w);
	if (next == self) { /* its deadline expired inside pick */
		task_set_state(self, TASK_RUNNING);
		return;
	}
	if (!w->next_streak) /* not a `next` hand-off, whose partner is still in cache */
		prefetch_next(&w->q);
	switch_to(w, self, next, TRACE_PARK);
}

_Noreturn void sched_exit(void)
{
	struct worker *w = worker_self();
	weft_task *self = w->cur;
	counter_inc(&w->exited);
	task_set_state(self, TASK_DONE);
	switch_to(w, self, pick(w), TRACE_EXIT);
	abort(); /* unreachable: nobody switches back to a finished task */
}

void weft_yield(void)
{
	struct worker *w = worker_self();
	if (!w || !w->cur) {
		sched_yield();
		return;
	}
	weft_task *self = w->cur;
	weft_task *next = pick(w);
	if (!next) { /* alone: the periodic checks in pick() would never come round */
		run_timers(w);
		poll_now(BUSY_POLL_NS);
		next = pick(w);
	}
	if (!next)
		next = global_pop(w);
	if (!next)
		return;
	task_set_state(self, TASK_RUNNABLE);
	push_local(w, self);
	switch_to(w, self, next, TRACE_YIELD);
}

/* sched.h: the tasks sent here by other workers join the queue, and the caller yields to it
 * (when alone, weft_yield still runs due timers and polls fds). */
void sched_slice_end(void)
{
	struct worker *w = worker_self();
	inbox_drain(w, w);
	weft_yield();
}

void sched_move(int to)
{
	struct worker *w = worker_self();
	if (!w || !w->cur || w->id == to || to < 0 || to >= atomic_load(&S.n))
		return;
	weft_task *self = w->cur;
	weft_task *next = pick(w);
	/* Published before we have left: whoever takes it waits for on_cpu (switch_to). */
	ready_on(S.w[to], self);
	switch_to(w, self, next, TRACE_YIELD);
}

weft_task *weft_self(void)
{
	struct worker *w = worker_self();
	return w && w->cur ? task_handle(w->cur) : NULL;
}

/* ---- the idle loop ----------------------------------------------------------------------- */

static uint32_t rnd(struct worker *w)
{
	w->rng ^= w->rng << 13;
	w->rng ^= w->rng >> 17;
	w->rng ^= w->rng << 5;
	return w->rng;
}

/* Deadlines due on a worker busy with one task would wait for it: expire them here, unless
 * that worker is at its wheel right now (it is expiring them itself, or filing one). */
static void steal_timers(struct worker *v)
{
	int64_t first = atomic_load_explicit(&v->timers.first, memory_order_relaxed);
	if (first != INT64_MAX) {
		int64_t now = weft_now();
		if (first <= now)
			wait_expire(&v->timers, now, true);
	}
}

/* w's last look at v (w's own: only w reads and writes it). The array grows with the workers
 * (spares start while w runs); should it fail to, every victim beyond it shares one entry,
 * which only makes w's judgement of them rougher. */
static struct peek *peek_at(struct worker *w, struct worker *v)
{
	if (v->id >= w->npeek) {
		int n = atomic_load_explicit(&S.n, memory_order_relaxed), want = 2 * w->npeek;
		want = want > n ? want : n;
		want = want < S.cap ? want : S.cap;
		struct peek *p = realloc(w->peek, (size_t)want * sizeof *p);
		if (p && want > v->id) {
			memset(p + w->npeek, 0, (size_t)(want - w->npeek) * sizeof *p);
			w->peek = p;
			w->npeek = want;
		} else {
			w->peek = p ? p : w->peek;
			return &w->peek_rest;
		}
	}
	return &w->peek[v->id];
}

/* take_next: also take a victim's `next` slot, which is about to run there; only once we have
 * been looking for a few microseconds (Go waits 3 us too), or the hand-off to the waker's core
 * would be undone at once. */
/* Has v been running one task for STALL_NS, as far as w has seen? */
static bool stalled(struct worker *w, struct worker *v)
{
	struct peek *p = peek_at(w, v);
	uint32_t tick = atomic_load_explicit(&v->tick, memory_order_relaxed);
	int64_t now = weft_now();
	if (tick != p->tick || now - p->since > 4 * STALL_NS) {
		p->tick = tick;
		p->since = now;
		return false;
	}
	return now - p->since >= STALL_NS;
}

/*
 * Gathered tasks contend no more, so gathering lapses a quiet spell after it began; an idle
 * worker then steals half the gathering worker's queue, and the stolen tasks find the channel
 * contended again and move back. While the same tasks keep at it, that cycle repeats every
 * spell, fences and a hundred moves each time (100+100 tasks on a capacity-1 channel on two
 * workers: every 2 ms). So a spell that ends in contention within another spell was too short:
 * the next one is twice as long, up to SCHED_GATHER_MAX_NS; a quiet spell twice as long brings
 * it back to SCHED_CONTENDED_NS (sched_next_spell). Workers that notice the same lapse at once
 * store the same value.
 */
static _Atomic int64_t gather_ns = SCHED_CONTENDED_NS; /* the spell */

int64_t sched_next_spell(int64_t quiet, int64_t spell)
{
	if (quiet > 2 * spell)
		return SCHED_CONTENDED_NS;
	return spell < SCHED_GATHER_MAX_NS / 2 ? 2 * spell : SCHED_GATHER_MAX_NS;
}

void sched_note_contention(int me)
{
	if (me < 0 || me >= atomic_load_explicit(&S.n, memory_order_relaxed))
		me = weft_worker_id();
	int64_t now = atomic_load_explicit(&sched_coarse_now, memory_order_relaxed);
	int64_t at = atomic_load_explicit(&sched_contended_at, memory_order_relaxed);
	int64_t spell = atomic_load_explicit(&gather_ns, memory_order_relaxed);
	if (now - at > spell) {
		atomic_store_explicit(&sched_gather_on, me, memory_order_relaxed);
		atomic_store_explicit(&gather_ns, sched_next_spell(now - at, spell),
				      memory_order_relaxed);
	}
	if (at != now)
		atomic_store_explicit(&sched_contended_at, now, memory_order_relaxed);
}

/* Whether tasks contending for channels are being gathered on one worker (sched.h). */
static bool gathering(void)
{
	return atomic_load_explicit(&sched_coarse_now, memory_order_relaxed) -
		       atomic_load_explicit(&sched_contended_at, memory_order_relaxed) <=
	       atomic_load_explicit(&gather_ns, memory_order_relaxed);
}

/* The global queue, for an idle worker. While tasks are being gathered, the gathering worker's
 * overflow goes there too (a full ring spills half of itself): another worker taking it would
 * only spread them again, so it leaves the queue to that worker, which looks at it every
 * GLOBAL_EVERY switches, unless that worker has stalled (a 2-stage pipeline of 100 tasks per
 * stage on two workers: 120 ms against 35 ms on one). Leaving only long queues (a spill's
 * length) is not enough: the gathering worker takes a fair share, and the rest spreads (100
 * ms). The price: a task woken by a plain thread meanwhile waits for the gathering worker's
 * next look, up to GLOBAL_EVERY task runs of 10 us (a longer one counts as a stall). */
static weft_task *global_take(struct worker *w)
{
	if (!atomic_load_explicit(&S.gq_n, memory_order_relaxed))
		return NULL;
	int home = atomic_load_explicit(&sched_gather_on, memory_order_relaxed);
	/* the home may be a spare started since: its record is ours to read once S.n says so */
	if (w->id != home && home < atomic_load_explicit(&S.n, memory_order_acquire) &&
	    gathering() && !stalled(w, S.w[home])) {
		w->declined = true;
		return NULL;
	}
	return global_pop(w);
}

/* Has v spawned a task within STALL_NS, as far as w has seen? */
static bool spawning(struct worker *w, struct worker *v, int64_t now)
{
	struct peek *p = peek_at(w, v);
	int64_t n = atomic_load_explicit(&v->spawned, memory_order_relaxed);
	if (n != p->spawned) {
		p->spawned = n;
		p->spawned_at = now;
	}
	return now - p->spawned_at < STALL_NS;
}

/* Ask a spawning v for half its ring (see give()). True when w should steal instead: v is not
 * spawning, or an ask, ours or another thief's, has been left unanswered for STALL_NS. (Its
 * time is written just after its asker; read in between, it is an older time, and costs at
 * worst an early steal.) */
static bool ask(struct worker *w, struct worker *v)
{
	int64_t now = weft_now();
	if (!spawning(w, v, now))
		return true;
	/* a load first: a spinning thief must not take the line v reads at every switch */
	uint32_t who = atomic_load_explicit(&v->asked, memory_order_relaxed);
	if (!who) {
		atomic_store(&w->looking, true); /* before v can answer */
		if (atomic_compare_exchange_strong_explicit(&v->asked, &who, (uint32_t)w->id + 1,
							    memory_order_release,
							    memory_order_relaxed)) {
			atomic_store_explicit(&v->asked_at, now, memory_order_relaxed);
			w->ask_until = now + STALL_NS; /* to take the answer, or steal */
			return false;
		}
	}
	return now - atomic_load_explicit(&v->asked_at, memory_order_relaxed) >= STALL_NS;
}

/* w stops looking for work: an answer now would hand tasks to a worker busy with others, or
 * asleep, while their owner could run them at once. An answer already on its way lands in w's
 * inbox: a worker going to sleep looks there last (idle(), rest(), standby()); one that found
 * work moves it to its ring, where has_queued() and thieves see it, unless give() saw
 * `looking` cleared first and woke a thief. */
static void stop_looking(struct worker *w, bool found_work)
{
	if (!atomic_load_explicit(&w->looking, memory_order_relaxed))
		return;
	atomic_store(&w->looking, false);
	uint32_t me = (uint32_t)w->id + 1;
	for (int i = 0; i < atomic_load(&S.n); i++) {
		uint32_t who = me;
		if (atomic_load_explicit(&S.w[i]->asked, memory_order_relaxed) == me)
			atomic_compare_exchange_strong_explicit(&S.w[i]->asked, &who, 0,
								memory_order_relaxed,
								memory_order_relaxed);
	}
	if (found_work && atomic_load(&w->inbox) && inbox_drain(w, w))
		sched_wake_idle();
}

static weft_task *steal(struct worker *w, bool take_next)
{
	weft_task *batch[RUNQ_SIZE / 2];
	int n = atomic_load_explicit(&S.n, memory_order_acquire);
	/* While tasks contend for a channel, a worker that keeps switching is serving its queue
	 * fast and moving its tasks here would only make them fight across cores: take only from
	 * one that has stopped switching. */
	bool picky = gathering();
	for (int round = 0; round < STEAL_ROUNDS; round++) {
		int start = (int)(rnd(w) % (uint32_t)n);
		for (int i = 0, j = start; i < n; i++, j = j + 1 < n ? j + 1 : 0) {
			struct worker *v = S.w[j];
			/* A spare in standby hands over what it holds itself (standby()); after a
			 * burst of blocking calls there may be a hundred, each a few lines to miss. */
			if (v == w || atomic_load_explicit(&v->standby, memory_order_relaxed))
				continue;
			if (round == 0)
				steal_timers(v);
			if (picky && !stalled(w, v)) {
				w->declined |= has_queued(v) || atomic_load(&v->inbox);
				continue;
			}
			if (inbox_drain(w, v))
				return pick(w);
			bool next_too = take_next && round == STEAL_ROUNDS - 1;
			bool ring = runq_len(&v->q) != 0;
			if (!ring && !(next_too && atomic_load(&v->next)))
				continue;
			if (ring && !ask(w, v))
				continue;
			if (!thief_begin(v))
				continue;
			uint32_t got = runq_grab(&v->q, batch, RUNQ_SIZE / 2);
			weft_task *t = !got && next_too ? atomic_exchange(&v->next, NULL) : NULL;
			thief_end(v);
			if (got) {
				counter_inc(&w->steals);
				trace_steal(v->id, got);
				/* not runq_push: timers stolen above may have filled our ring */
				for (uint32_t k = 1; k < got; k++)
					push_local(w, batch[k]);
				return batch[0];
			}
			if (t)
				return t;
		}
	}
	return NULL;
}

static void stop_spinning(struct worker *w)
{
	stop_looking(w, true);
	w->spinning = false;
	/* The last spinner found work: there may be more, let another look. */
	if (atomic_fetch_sub(&S.nspinning, 1) == 1)
		sched_wake_idle();
}

static weft_task *find_work(struct worker *w, bool take_next)
{
	weft_task *t;
	run_timers(w);
	if ((t = pick(w)) || (inbox_drain(w, w) && (t = pick(w))) || (t = global_take(w)))
		return t;
	if (!w->spinning) {
		int busy = S.n - atomic_load(&S.nidle) - atomic_load(&S.nstandby);
		if (2 * atomic_load(&S.nspinning) >= busy)
			return NULL;
		w->spinning = true;
		atomic_fetch_add(&S.nspinning, 1);
	}
	return steal(w, take_next);
}

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

static int threads_before_run(void)
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
	if (!S.deadlock_check || !all_asleep() || work_anywhere())
		return;
	int64_t live = 0;
	for (int i = 0; i < S.n; i++) {
		if (atomic_load(&S.w[i]->timers.first) != INT64_MAX)
			return;
		live += atomic_load_explicit(&S.w[i]->spawned, memory_order_relaxed) -
			atomic_load_explicit(&S.w[i]->exited, memory_order_relaxed);
	}
	if (live <= 0 || atomic_load(&wait_foreign_parked) > 0 || poll_waiters() > 0 ||
	    blocking_jobs() > 0)
		return;
	if (count_threads() - S.threads_at_start - (S.n - 1) - 1 - blocking_threads() > 0)
		return; /* a thread outside weft might still wake someone */
	fprintf(stderr, "weft: all tasks are blocked (deadlock): %lld task%s\n", (long long)live,
		live == 1 ? "" : "s");
	dump_tasks(2, 20, false);
	abort();
}


/* Before a sleep: no longer one of the spinners (a waker may make it spin again). */
static void quit_spinning(struct worker *w)
{
	if (w->spinning) {
		w->spinning = false;
		atomic_fetch_sub(&S.nspinning, 1);
	}
	stop_looking(w, false);
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
static void idle(struct worker *w)
{
	quit_spinning(w); /* before joining the idle list */
	bool poller = poll_waiters() > 0 && !atomic_exchange(&S.polling, true);
	struct poll_batch pb; /* not zeroed: 3 KB */
	pb.n = 0;
	pthread_mutex_lock(&S.idle_lock);
	w->idle_link = S.idle;
	S.idle = w;
	w->in_idle = true;
	atomic_store(&w->in_epoll, poller);
	atomic_store(&w->wake_word, 0);
	atomic_fetch_add(&S.nidle, 1);
	pthread_mutex_unlock(&S.idle_lock);
	int64_t deadline = wake_by(w);
	if (!work_anywhere() && !atomic_load(&S.stop)) {
		if (deadline == INT64_MAX && !poller) {
			pthread_mutex_lock(&S.idle_lock);
			check_deadlock();
			pthread_mutex_unlock(&S.idle_lock);
		}
		sleep_until(w, poller ? &pb : NULL, deadline);
	} else if (poller) {
		poll_collect(&pb, 0);
	}
	pthread_mutex_lock(&S.idle_lock);
	atomic_store(&w->in_epoll, false);
	if (w->in_idle)
		sched_idle_remove(w);
	pthread_mutex_unlock(&S.idle_lock);
	if (poller) {
		poll_dispatch(&pb);
		atomic_store(&S.last_poll, weft_now());
		atomic_store(&S.polling, false);
	}
	monitor_resume();
}

/*
 * The last spin found work only on workers busy with a hot channel (see steal()): taking it
 * would only make those tasks fight across cores, so there is nothing to do here for now. A
 * worker that went on spinning, or slept on the idle list, would be woken for each task the
 * busy worker readies, and each look at the busy worker's queue takes its cache lines away
 * from it (100 producers and 100 consumers on one capacity-1 channel: 37 ms on two workers
 * against 30 ms on one). So it rests instead: a timed sleep off the idle list, which only the
 * arrival of a task in its own inbox (or weft_run's end) cuts short. The rest doubles while
 * spins keep declining, up to REST_MAX_NS, the longest another worker's queue waits for it
 * when the work turns out to be parallel after all; the spin after a rest is long enough for
 * steal() to tell a stalled worker.
 */
static void rest(struct worker *w)
{
	quit_spinning(w);
	int64_t until = weft_now() + w->rest_ns, due = wake_by(w);
	atomic_store(&w->wake_word, 0);
	atomic_store(&w->resting, true);
	if (!atomic_load(&w->inbox) && !atomic_load(&S.stop))
		sleep_until(w, NULL, until < due ? until : due);
	atomic_store(&w->resting, false);
	if (w->rest_ns < REST_MAX_NS)
		w->rest_ns *= 2;
	w->declined = false;
}

/* Give the workers at work what is still queued on w: its due timers' tasks, its inbox, its
 * ring and `next`, through the global queue. */
static void hand_over(struct worker *w)
{
	run_timers(w);
	inbox_drain(w, w);
	weft_task *batch[RUNQ_SIZE / 2 + 1];
	uint32_t n;
	bool gave = false;
	while ((n = runq_grab(&w->q, batch, RUNQ_SIZE / 2))) {
		global_push(batch, n);
		gave = true;
	}
	weft_task *t = atomic_exchange(&w->next, NULL);
	if (t) {
		global_push(&t, 1);
		gave = true;
	}
	if (gave)
		sched_wake_idle();
}

/* A spare about to go idle may go to standby instead once the monitor has counted more workers
 * free to work than cores for STANDBY_NS (S.surplus: the worker it was started for is back);
 * a nominal worker, once the monitor has parked it. */
static bool take_surplus(struct worker *w)
{
	if (w->id < S.nominal)
		return parked(w);
	int n = atomic_load(&S.surplus);
	while (n > 0)
		if (atomic_compare_exchange_weak(&S.surplus, &n, n - 1))
			return true;
	return false;
}

/* Until the monitor ends w's standby (resume) or unparks it. A parked worker looks at `active`
 * after its store of `standby`: the monitor that unparks it stores `active` before it looks at
 * `standby`, so one of the two sees the other. A spare is never wanted this way (its id is at
 * least S.active). */
static bool stays_in_standby(struct worker *w)
{
	return atomic_load(&w->standby) && !atomic_load(&S.stop) && w->id >= atomic_load(&S.active);
}

/*
 * Standby: a spare the monitor started for a stuck worker (see the monitor below), once it is
 * no longer needed. Left running, spares would add up, and a program would go on with more
 * workers than cores, which the kernel then time-slices: a task queued on a worker it has
 * preempted waits milliseconds. So a spare stops taking work, as Go's runtime parks an M with
 * no P, and the monitor wakes it again (start_spare) rather than start another thread next
 * time. It sleeps off the idle list, so no new work wakes it; only what is still its own does
 * (resting: ready_on wakes it for its inbox, where a hot channel's home may send tasks; and its
 * timers, for tasks that parked on it with a deadline), and it hands that over (hand_over).
 * Should every other worker be held by a task meanwhile, the monitor sees the global queue
 * wait and wakes it back (see the monitor).
 *
 * It counts as asleep (S.nstandby, for the deadlock check and the monitor's pause) only while
 * it sleeps: while it hands over, it holds tasks that no queue shows.
 */
static void standby(struct worker *w)
{
	/* A waker that saw us spinning left its task for us to find (sched_wake_idle): idle() looks
	 * once more after it stops spinning, and so must we, or that task waits in the global
	 * queue with every worker asleep (a TSan run of tests/observe.c hung so, once parking
	 * sent workers here often). */
	quit_spinning(w);
	if (work_anywhere())
		sched_wake_idle();
	atomic_store(&w->resting, true);
	atomic_store(&w->standby, true);
	int home = w->id;
	atomic_compare_exchange_strong(&sched_gather_on, &home, 0);
	stack_cache_drain(&w->stacks);
	/* One idle worker polls fds, chosen as it goes to sleep (idle()); if that was this one,
	 * an idle worker must come round again to take its place. The monitor's watch for
	 * unpolled fds would not: it sleeps too once every worker does. */
	if (poll_waiters() > 0 && !atomic_load(&S.polling))
		sched_wake_idle();
	while (stays_in_standby(w)) {
		atomic_store(&w->wake_word, 0);
		hand_over(w);
		atomic_fetch_add(&S.nstandby, 1);
		int64_t first = atomic_load(&w->timers.first);
		if (first == INT64_MAX) { /* it may be the last to sleep, as in idle() */
			pthread_mutex_lock(&S.idle_lock);
			check_deadlock();
			pthread_mutex_unlock(&S.idle_lock);
		}
		if (stays_in_standby(w) && !atomic_load(&w->inbox))
			sleep_until(w, NULL, first);
		/* Under the lock, as nidle changes: a check_deadlock in progress read the count
		 * before it looked at the queues, and this spare is about to hold tasks again. */
		pthread_mutex_lock(&S.idle_lock);
		atomic_fetch_sub(&S.nstandby, 1);
		pthread_mutex_unlock(&S.idle_lock);
	}
	atomic_store(&w->standby, false);
	atomic_store(&w->resting, false);
	if (!atomic_load(&S.stop)) { /* back to look for work, as rescue() wakes an idle worker */
		w->spinning = true;
		atomic_fetch_add(&S.nspinning, 1);
	}
}

/*
 * Keep looking a little while before sleeping: work often comes back within microseconds, and
 * a futex sleep and wake-up cost several. But a program woken now and then (a server at a
 * modest rate) would pay a spin per wake-up for nothing, and on a shared machine take the CPU
 * from whoever does the work. So the spin adapts, as adaptive mutexes do: it halves each time
 * it ends empty-handed (down to SPIN_MIN_NS) and doubles each time it finds work (up to
 * SPIN_NS). A spin that saw work but declined it (a hot channel, see steal()) keeps its
 * length: there is work about, it just belongs on another core. Each round of the spin yields
 * the core (sched_yield, a no-op when nothing else wants it): on a machine shared with other
 * programs, a spinning worker must not keep from a core the thread that will send it work
 * (weft-mqtt beside its load generator: +20% msgs/s and -40% CPU per message at QoS 1, +30%
 * connections/s in the connect storm).
 */
static void worker_loop(struct worker *w)
{
	int64_t spin_since = 0;
	while (!atomic_load(&S.stop)) {
		weft_task *t = find_work(w, spin_since && weft_now() - spin_since >= NEXT_STEAL_NS);
		if (!t) {
			int64_t now = weft_now();
			if (!spin_since)
				spin_since = now;
			int64_t due = atomic_load_explicit(&w->timers.first, memory_order_relaxed);
			/* after a rest: long enough to tell a stalled worker (steal()) */
			int64_t spin = w->rest_ns > REST_MIN_NS ? 2 * STALL_NS : w->spin_ns;
			if ((w->spinning && (now - spin_since < spin || now < w->ask_until)) ||
			    due - now < TIMER_SPIN_NS) {
				/* a thread waiting for this core goes first, unless an answer to our
				 * ask is due: it would wait in our inbox for as long as that thread
				 * keeps the core */
				if (!poll_now(SPIN_POLL_NS) && now >= w->ask_until)
					sched_yield();
				continue;
			}
			if (w->declined) {
				rest(w);
			} else {
				if (w->spinning && w->spin_ns > SPIN_MIN_NS)
					w->spin_ns /= 2;
				w->rest_ns = REST_MIN_NS;
				if (take_surplus(w))
					standby(w);
				else
					idle(w);
			}
			spin_since = 0;
			continue;
		}
		if (spin_since && w->spin_ns < SPIN_NS)
			w->spin_ns *= 2;
		w->rest_ns = REST_MIN_NS;
		w->declined = false;
		spin_since = 0;
		if (w->spinning)
			stop_spinning(w);
		switch_to(w, NULL, t, TRACE_YIELD);
	}
}

/* ---- workers' life ----------------------------------------------------------------------- */

static void worker_enter(struct worker *w)
{
	worker_tls = w;
	trace_thread_name("worker %d", w->id);
	prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0); /* sleep until deadlines to the microsecond */
	affinity_worker(w->id);
	if (pthread_getcpuclockid(pthread_self(), &w->cpu_clock) != 0)
		w->cpu_clock = -1;
	atomic_store_explicit(&w->tid, gettid(), memory_order_release); /* the monitor reads both */
	stack_t ss = { .ss_sp = w->altstack, .ss_size = 64 * 1024 };
	sigaltstack(&ss, NULL);
	pthread_attr_t a;
	if (pthread_getattr_np(pthread_self(), &a) == 0) {
		void *lo;
		pthread_attr_getstack(&a, &lo, &w->stack_size);
		w->stack_bottom = lo;
		pthread_attr_destroy(&a);
	}
#ifdef WEFT_TSAN
	w->tsan_fiber = __tsan_get_current_fiber();
#endif
}

static void worker_leave(struct worker *w)
{
	stack_t ss = { .ss_flags = SS_DISABLE };
	sigaltstack(&ss, NULL);
	(void)w;
	worker_tls = NULL;
}

void *sched_worker_thread(void *arg)
{
	struct worker *w = arg;
	worker_enter(w);
	worker_loop(w);
	worker_leave(w);
	return NULL;
}

/* Worker i's record, made when it first starts (a spare: by the monitor, before it counts it
 * in S.n). */
struct worker *sched_new_worker(int i)
{
	struct worker *w = aligned_alloc(64, (sizeof *w + 63) & ~(size_t)63);
	if (!w)
		return NULL;
	memset(w, 0, sizeof *w);
	w->id = i;
	w->rng = 0x9e3779b9u * (uint32_t)(i + 1);
	w->spin_ns = SPIN_NS;
	w->rest_ns = REST_MIN_NS;
	timer_wheel_init(&w->timers);
	if (!(w->altstack = malloc(64 * 1024))) {
		free(w);
		return NULL;
	}
	return S.w[i] = w;
}

static void stop_all(void)
{
	atomic_store(&S.stop, true);
	for (int i = 0; i < atomic_load(&S.n); i++) {
		atomic_store(&S.w[i]->wake_word, 1);
		futex_wake(&S.w[i]->wake_word, 1);
	}
	poll_interrupt();
	atomic_store(&S.monitor_word, 1);
	futex_wake(&S.monitor_word, 1);
	monitor_resume();
}

static void main_entry(void *arg)
{
	(void)arg;
	S.main_result = S.main_fn(S.main_arg);
	stop_all();
}

static void free_workers(void)
{
	for (int i = 0; S.w && i < S.cap; i++) {
		if (!S.w[i])
			continue;
		timer_wheel_destroy(&S.w[i]->timers);
		free(S.w[i]->altstack);
		free(S.w[i]->peek);
		free(S.w[i]);
	}
	free(S.w);
	S.w = NULL;
}

/* n workers, and room for the spares the monitor may start (max_spares()); their records are
 * made as they start. */
static int init_workers(int n)
{
	atomic_store(&S.n, n);
	S.nominal = n;
	atomic_store(&S.nstandby, 0);
	monitor_init(n);
	S.w = calloc((size_t)S.cap, sizeof *S.w);
	if (!S.w)
		return -ENOMEM;
	for (int i = 0; i < n; i++)
		if (!sched_new_worker(i))
			return -ENOMEM;
	return 0;
}

int weft_worker_id(void)
{
	struct worker *w = worker_self();
	return w ? w->id : -1;
}

int weft_worker_max(void)
{
	return atomic_load(&running) ? S.cap : 0;
}

/* ---- statistics -------------------------------------------------------------------------- */

int weft_stats(weft_worker_stats *out, int max, uint64_t *foreign)
{
	if (!atomic_load(&running) || !S.w || max < 0 || (max && !out))
		return -EINVAL;
	int n = atomic_load(&S.n);
	for (int i = 0; i < n && i < max; i++) {
		struct worker *w = S.w[i];
		out[i] = (weft_worker_stats){
			.switches = atomic_load_explicit(&w->tick, memory_order_relaxed),
			.parks = (uint64_t)atomic_load_explicit(&w->parks, memory_order_relaxed),
			.wakes = (uint64_t)atomic_load_explicit(&w->wakes, memory_order_relaxed),
			.steals = (uint64_t)(atomic_load_explicit(&w->steals, memory_order_relaxed) +
					     atomic_load_explicit(&w->given, memory_order_relaxed)),
			.idle_ns = atomic_load_explicit(&w->idle_ns, memory_order_relaxed),
			.standby = atomic_load(&w->standby),
		};
	}
	if (foreign)
		*foreign = (uint64_t)atomic_load_explicit(&foreign_wakes, memory_order_relaxed);
	return n;
}

/* WEFT_STATS=1: the table on stderr when weft_run ends (or a signal ends it: finish.c). */
void sched_print_stats(void)
{
	const char *e = getenv("WEFT_STATS");
	if (!e || !*e || strcmp(e, "0") == 0)
		return;
	weft_worker_stats st[64];
	uint64_t foreign;
	int n = weft_stats(st, 64, &foreign);
	fprintf(stderr, "weft: statistics (%d workers; %llu wake-ups from plain threads)\n"
			"  worker     switches        parks        wakes   steals   idle ms\n",
		n, (unsigned long long)foreign);
	for (int i = 0; i < n && i < 64; i++)
		fprintf(stderr, "  %6d %12llu %12llu %12llu %8llu %9.1f%s\n", i,
			(unsigned long long)st[i].switches, (unsigned long long)st[i].parks,
			(unsigned long long)st[i].wakes, (unsigned long long)st[i].steals,
			(double)st[i].idle_ns / 1e6, st[i].standby ? "  (standby)" : "");
	waitstat_print();
}

static void discard_task(struct stack *s, void *ctx)
{
	(void)ctx;
#ifdef WEFT_TSAN
	weft_task *t = (weft_task *)s;
	if (t->tsan_fiber)
		__tsan_destroy_fiber(t->tsan_fiber);
#else
	(void)s;
#endif
}

int weft_run(int (*main_task)(void *), void *arg)
{
	if (!main_task)
		return -EINVAL;
	if (worker_self() || atomic_exchange(&running, true))
		return -EBUSY;
	check_shim();
	const char *dl = getenv("WEFT_DEADLOCK");
	S.deadlock_check = !(dl && strcmp(dl, "0") == 0);
	S.main_fn = main_task;
	S.main_arg = arg;
	S.main_result = 0;
	atomic_store(&S.stop, false);
	atomic_store(&S.ids, 1);
	atomic_store(&foreign_wakes, 0);
	stack_init(sizeof(weft_task));
	int n = affinity_workers(affinity_init()), err = init_workers(n);
	if (!err)
		err = poll_init();
	if (err) {
		free_workers();
		atomic_store(&running, false);
		return err;
	}
	affinity_plan(n);
	overflow_install();
	dump_install();
	atomic_store(&sched_coarse_now, weft_now());
	/* no contention yet: nothing gathers on a worker of an earlier weft_run */
	atomic_store(&sched_contended_at, INT64_MIN / 2);
	atomic_store(&gather_ns, SCHED_CONTENDED_NS);
	atomic_store(&sched_gather_on, 0);
	int old_slack = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
	S.threads_at_start = threads_before_run();
	S.threads_at_start += finish_install(); /* its thread wakes no task */
	trace_start();
	waitstat_start(S.cap);
	worker_enter(S.w[0]);
	weft_task *m = task_spawn(S.w[0], main_entry, NULL,
				  &(weft_spawn_opts){ .name = "main", .detached = 1 },
				  __builtin_return_address(0));
	int started = 1;
	if (!m) {
		err = -ENOMEM;
		stop_all();
	}
	for (; !err && started < n; started++) {
		if ((err = -pthread_create(&S.w[started]->thread, NULL, sched_worker_thread,
					   S.w[started]))) {
			stop_all();
			break;
		}
	}
	atomic_store(&S.monitor_word, 0);
	bool monitoring = !err && pthread_create(&S.monitor, NULL, monitor_thread, NULL) == 0;
	S.threads_at_start -= !monitoring; /* the deadlock check counts a monitor */
	worker_loop(S.w[0]);
	if (monitoring) /* first: it may be starting a spare */
		pthread_join(S.monitor, NULL);
	for (int i = 1; i < S.cap && S.w[i]; i++)
		if (i < started || S.w[i]->started)
			pthread_join(S.w[i]->thread, NULL);
	finish_uninstall();
	sched_print_stats();
	waitstat_stop();
	trace_stop();
	worker_leave(S.w[0]);
	affinity_restore();
	prctl(PR_SET_TIMERSLACK, (unsigned long)old_slack, 0, 0, 0);
	overflow_uninstall();
	dump_uninstall();
	stack_each_live(discard_task, NULL);
	stack_release_all();
	free_workers();
	free(S.gq);
	S.gq = NULL;
	S.gq_cap = S.gq_head = 0;
	atomic_store(&S.gq_n, 0);
	atomic_store(&S.nidle, 0);
	atomic_store(&S.nspinning, 0);
	S.idle = NULL;
	atomic_store(&S.polling, false);
	atomic_store(&running, false);
	return err ? err : S.main_result;
}
