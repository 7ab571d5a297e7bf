/*
 * sched.c - the scheduler's core: run queues, switching, the worker loop, weft_run.
 *
 * weft runs tasks on one worker thread per core (weft_run makes the calling thread worker 0).
 * The shape is Go's and Tokio's. The scheduler is four files, each owning its share of the
 * state (sched.h groups struct worker's fields by owner, sched_state.h the shared state's):
 *   sched.c    queues, making tasks runnable, switching, the worker loop, workers' life;
 *   steal.c    how an idle worker takes work from the others (stealing, requesting work);
 *   idle.c     what a worker does without work (spinning, sleeping, backing off, standby),
 *              and waking idle workers;
 *   monitor.c  the monitor thread: rescues held workers, starts spares, parks workers.
 *
 * Queues. Each worker has a bounded local ring (runq.h), a one-task `next` slot and an inbox
 * (a stack other workers push onto). The global queue takes tasks made runnable by plain
 * threads and a full ring's overflow. A task woken by a task goes to the waker's `next` slot,
 * so a receiver runs right after its sender on the same core, with the data still in cache,
 * and contending tasks gather on one core. A run of `next` hand-offs is cut after NEXT_STREAK
 * so that a ping-pong pair cannot starve the ring. Every GLOBAL_EVERY switches a worker looks
 * at the global queue, its inbox, its timers and the poller first, for fairness.
 *
 * Switching. Tasks switch directly from one to the next (one assembly switch, no detour
 * through a scheduler stack). Only when a worker has nothing local to run does it switch to
 * the worker loop on its own stack (worker_loop), which runs expired timers, takes from the
 * global queue, steals (steal.c), and otherwise spins or sleeps (idle.c).
 *
 * Invariants:
 *  - A task is "on CPU" from the moment a worker switches to it until the next context has
 *    completed the switch away (finish_switch). A waker may make a task runnable while it is
 *    still switching away; whoever picks it up waits for on_cpu to clear, which takes a few
 *    instructions. This is what lets park publish the task before it has left its stack.
 *  - Only the owner pushes onto its ring and fills its `next` slot; thieves only take. While
 *    no thief is at it, the owner takes without atomic read-modify-writes (own_begin,
 *    sched_state.h).
 *  - Work made runnable by a worker wakes another worker only when the maker has more queued
 *    than the task it runs; work made runnable by a plain thread always looks for a sleeper
 *    (sched_wake_idle, after a seq_cst fence that pairs with a sleeper's last look).
 *  - Contended channels gather on one worker (chan.c, sched_note_contention): their waiters
 *    are woken there and their tasks move there (sched_move).
 *
 * Rejected: a scheduler stack between every two tasks (a second switch per park); a global
 * queue linked through the tasks (a cache miss per task under its lock when many timers fire
 * at once, where copying pointers costs none).
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
#define BUSY_POLL_NS 20000  /* a busy worker polls fds at most this often */
#define PREFETCH_QUEUE 8    /* see prefetch_next() */
#define PREFETCH_AHEAD 3    /* see prefetch_next(); below PREFETCH_QUEUE */

struct sched_state scheduler = { .global_lock = PTHREAD_MUTEX_INITIALIZER,
				 .idle_lock = PTHREAD_MUTEX_INITIALIZER };

static atomic_bool running;

const void *sched_runtime(void)
{
	return &scheduler;
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
		w->id_next = atomic_fetch_add(&scheduler.ids, 1024);
		w->id_end = w->id_next + 1024;
	}
	return w->id_next++;
}

/* ---- queues ------------------------------------------------------------------------------ */

/*
 * The global queue is a growable ring of task pointers under a mutex. Not a list linked
 * through the tasks: when many timers fire at once and spill here, walking such a list under
 * the lock costs a cache miss per task; copying pointers costs none. It only grows (by
 * doubling; it is freed when weft_run ends).
 */
static void global_grow(uint32_t need)
{
	uint32_t cap = scheduler.global_cap ? scheduler.global_cap : 1024;
	while (cap < need)
		cap *= 2;
	weft_task **v = malloc(cap * sizeof *v);
	if (!v) {
		static const char msg[] = "weft: out of memory growing the global run queue\n";
		if (write(2, msg, sizeof msg - 1) < 0) {
		}
		abort();
	}
	uint32_t n = (uint32_t)atomic_load_explicit(&scheduler.global_len, memory_order_relaxed);
	for (uint32_t i = 0; i < n; i++)
		v[i] = scheduler.global_ring[(scheduler.global_head + i) & (scheduler.global_cap - 1)];
	free(scheduler.global_ring);
	scheduler.global_ring = v;
	scheduler.global_cap = cap;
	scheduler.global_head = 0;
}

void sched_global_push(weft_task *const *batch, uint32_t n)
{
	pthread_mutex_lock(&scheduler.global_lock);
	uint32_t len = (uint32_t)atomic_load_explicit(&scheduler.global_len, memory_order_relaxed);
	if (len + n > scheduler.global_cap)
		global_grow(len + n);
	for (uint32_t i = 0; i < n; i++)
		scheduler.global_ring[(scheduler.global_head + len + i) & (scheduler.global_cap - 1)] = batch[i];
	atomic_store_explicit(&scheduler.global_len, (int)(len + n), memory_order_relaxed);
	pthread_mutex_unlock(&scheduler.global_lock);
}

/* Take a fair share of the global queue: one to run, the rest into w's ring. */
weft_task *sched_global_pop(struct worker *w)
{
	if (atomic_load_explicit(&scheduler.global_len, memory_order_relaxed) == 0)
		return NULL;
	weft_task *batch[RUNQ_SIZE + 1];
	/* only we push to our ring: its room can only grow while we copy */
	uint32_t room = RUNQ_SIZE - runq_len(&w->q), n;
	pthread_mutex_lock(&scheduler.global_lock);
	uint32_t len = (uint32_t)atomic_load_explicit(&scheduler.global_len, memory_order_relaxed);
	/* spares in standby take none */
	int working = atomic_load(&scheduler.nworkers) - atomic_load(&scheduler.nstandby);
	n = len / (uint32_t)(working > 1 ? working : 1) + 1;
	if (n > len)
		n = len;
	if (n > room + 1)
		n = room + 1;
	for (uint32_t i = 0; i < n; i++)
		batch[i] = scheduler.global_ring[(scheduler.global_head + i) & (scheduler.global_cap - 1)];
	scheduler.global_head = (scheduler.global_head + n) & (scheduler.global_cap - 1);
	atomic_store_explicit(&scheduler.global_len, (int)(len - n), memory_order_relaxed);
	if (n)
		atomic_store_explicit(&scheduler.global_takes,
				      atomic_load_explicit(&scheduler.global_takes, memory_order_relaxed) + 1,
				      memory_order_relaxed);
	pthread_mutex_unlock(&scheduler.global_lock);
	for (uint32_t i = 1; i < n; i++)
		runq_push(&w->q, batch[i]);
	return n ? batch[0] : NULL;
}

/* A full ring moves half of itself, plus t, to the global queue. */
__attribute__((noinline)) void sched_spill(struct worker *w, weft_task *t)
{
	weft_task *batch[RUNQ_SIZE / 2 + 1];
	uint32_t n = runq_grab(&w->q, batch, RUNQ_SIZE / 2);
	batch[n++] = t;
	sched_global_push(batch, n);
}

bool sched_work_anywhere(void)
{
	if (atomic_load(&scheduler.global_len))
		return true;
	for (int i = 0; i < scheduler.nworkers; i++) {
		struct worker *v = scheduler.workers[i];
		if (runq_len(&v->q) || atomic_load(&v->next) || atomic_load(&v->inbox))
			return true;
	}
	return false;
}

/* ---- making tasks runnable --------------------------------------------------------------- */

static _Atomic int64_t foreign_wakes; /* tasks woken by plain threads */

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

/* t was made runnable by a plain thread (one that is not a worker: it has no ring): it goes to
 * the global queue, and a sleeping worker is woken to take it. The one path for both wakes and
 * spawns from plain threads. noinline: gcc refuses its fence under TSan once it is inlined. */
static __attribute__((noinline)) void ready_from_plain_thread(weft_task *t)
{
	sched_global_push(&t, 1);
	/* pairs with a sleeper's last look: idle.c joins the idle list, then looks for work */
	atomic_thread_fence(memory_order_seq_cst);
	sched_wake_idle();
}

/* noinline: gcc refuses its fence under TSan once it is inlined (into sched_ready_on); the
 * other callers are in other files anyway. */
__attribute__((noinline)) void sched_ready(weft_task *t)
{
	task_set_state(t, TASK_RUNNABLE);
	struct worker *w = worker_self();
	if (!w) {
		atomic_fetch_add_explicit(&foreign_wakes, 1, memory_order_relaxed);
		ready_from_plain_thread(t);
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
void sched_inbox_push_chain(struct worker *v, weft_task *newest, weft_task *oldest)
{
	weft_task *head = atomic_load_explicit(&v->inbox, memory_order_relaxed);
	do
		oldest->link = head;
	while (!atomic_compare_exchange_weak_explicit(&v->inbox, &head, newest,
						      memory_order_seq_cst, memory_order_relaxed));
}

static void inbox_push(struct worker *v, weft_task *t)
{
	sched_inbox_push_chain(v, t, t);
}

/* Move v's inbox into w's ring, oldest first. Returns how many. */
int sched_inbox_drain(struct worker *w, struct worker *v)
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

/* Make t runnable on v, through its inbox. */
static void ready_on(struct worker *v, weft_task *t)
{
	task_set_state(t, TASK_RUNNABLE);
	inbox_push(v, t);
	sched_wake_for_inbox(v);
}

void sched_ready_on(weft_task *t, int home)
{
	struct worker *w = worker_self();
	if (!w || w->id == home || home < 0 || home >= atomic_load(&scheduler.nworkers)) {
		sched_ready(t);
		return;
	}
	counter_inc(&w->wakes);
	ready_on(scheduler.workers[home], t);
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
		ready_from_plain_thread(t);
		return;
	}
	bool more = has_queued(w);
	push_local(w, t);
	if (more)
		sched_wake_idle();
	serve_work_request(w); /* a task spawning in a loop does not switch */
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
		sched_global_push(v + i, (uint32_t)(n - i));
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

void sched_run_timers(struct worker *w)
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
int sched_poll_now(int64_t every)
{
	if (!poll_waiters() || atomic_load_explicit(&scheduler.polling, memory_order_relaxed))
		return 0;
	int64_t now = weft_now();
	if (now - atomic_load_explicit(&scheduler.last_poll, memory_order_relaxed) < every ||
	    atomic_exchange(&scheduler.polling, true))
		return 0;
	atomic_store_explicit(&scheduler.last_poll, now, memory_order_relaxed);
	int n = poll_run(0);
	atomic_store(&scheduler.polling, false);
	return n;
}

/* Start loading a task that will run soon, whose record and stack are long out of cache when
 * many tasks take turns (many sleepers each run once per pass over all of them): its record,
 * and the frames it parked with, just below the record (stack.h). Not the next one but the
 * one PREFETCH_AHEAD places behind the head of the ring (itself the one after `next`): a
 * task's pages take a TLB walk and then a dozen misses, longer than a task's turn, and loading
 * the head left most of the wait in place.
 *
 * Only with PREFETCH_QUEUE or more tasks queued: behind fewer, a task is still in cache, and
 * the prefetch is pure cost. By address only: the pointer may be stale (a thief took it) and a
 * prefetch never faults. Called when a task parks, not when it yields: a yield ping-pong has
 * nothing cold to load; nor when the next task came from `next`: such hand-offs go on while
 * the queue waits. */
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
	serve_work_request(w);
	if (atomic_load_explicit(&w->tick, memory_order_relaxed) % GLOBAL_EVERY == 0) {
		/* weft_run is ending: back to the worker loop, which stops the worker */
		if (atomic_load_explicit(&scheduler.stop, memory_order_relaxed))
			return NULL;
		sched_run_timers(w);
		sched_poll_now(BUSY_POLL_NS);
		sched_inbox_drain(w, w);
		if ((t = sched_global_pop(w)))
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

/* pick(), for steal.c, off the switch path. */
weft_task *sched_pick(struct worker *w)
{
	return pick(w);
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
		sched_run_timers(w);
		sched_poll_now(BUSY_POLL_NS);
		next = pick(w);
	}
	if (!next)
		next = sched_global_pop(w);
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
	sched_inbox_drain(w, w);
	weft_yield();
}

void sched_move(int to)
{
	struct worker *w = worker_self();
	if (!w || !w->cur || w->id == to || to < 0 || to >= atomic_load(&scheduler.nworkers))
		return;
	weft_task *self = w->cur;
	weft_task *next = pick(w);
	/* Published before we have left: whoever takes it waits for on_cpu (switch_to). */
	ready_on(scheduler.workers[to], self);
	switch_to(w, self, next, TRACE_YIELD);
}

weft_task *weft_self(void)
{
	struct worker *w = worker_self();
	return w && w->cur ? task_handle(w->cur) : NULL;
}

/* ---- the worker loop -------------------------------------------------------------------- */

/* Work for the worker loop: w's own queues, the global queue, and then, if w may spin, the
 * other workers' (steal.c). spin_since: when w began looking (0: just now). */
static weft_task *find_work(struct worker *w, int64_t spin_since)
{
	weft_task *t;
	sched_run_timers(w);
	if ((t = pick(w)) || (sched_inbox_drain(w, w) && (t = pick(w))) ||
	    (t = steal_from_global(w)))
		return t;
	if (!idle_start_spinning(w))
		return NULL;
	return steal(w, spin_since);
}

/* A worker thread's own stack: it runs here when it has no task, until weft_run ends. */
static void worker_loop(struct worker *w)
{
	int64_t spin_since = 0;
	while (!atomic_load(&scheduler.stop)) {
		weft_task *t = find_work(w, spin_since);
		if (!t) {
			idle_no_work(w, &spin_since); /* spin on, or sleep */
			continue;
		}
		idle_found_work(w, spin_since);
		spin_since = 0;
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
 * in scheduler.nworkers). */
struct worker *sched_new_worker(int i)
{
	struct worker *w = aligned_alloc(64, (sizeof *w + 63) & ~(size_t)63);
	if (!w)
		return NULL;
	memset(w, 0, sizeof *w);
	w->id = i;
	w->rng = 0x9e3779b9u * (uint32_t)(i + 1);
	idle_init_worker(w);
	timer_wheel_init(&w->timers);
	if (!(w->altstack = malloc(64 * 1024))) {
		free(w);
		return NULL;
	}
	return scheduler.workers[i] = w;
}

/* weft_run is ending: wake every worker and the monitor. Not through sched_wake_worker, which
 * wakes a sleeper the one way it sleeps (its futex, or the poller when in_epoll says so): here
 * each worker's futex is woken and the poller interrupted once, whatever each is doing, so
 * that none stays asleep, whichever way it sleeps or is about to. */
static void stop_all(void)
{
	atomic_store(&scheduler.stop, true);
	for (int i = 0; i < atomic_load(&scheduler.nworkers); i++) {
		atomic_store(&scheduler.workers[i]->wake_word, 1);
		futex_wake(&scheduler.workers[i]->wake_word, 1);
	}
	poll_interrupt();
	atomic_store(&scheduler.monitor_word, 1);
	futex_wake(&scheduler.monitor_word, 1);
	monitor_resume();
}

static void main_entry(void *arg)
{
	(void)arg;
	scheduler.main_result = scheduler.main_fn(scheduler.main_arg);
	stop_all();
}

static void free_workers(void)
{
	for (int i = 0; scheduler.workers && i < scheduler.cap; i++) {
		if (!scheduler.workers[i])
			continue;
		timer_wheel_destroy(&scheduler.workers[i]->timers);
		free(scheduler.workers[i]->altstack);
		free(scheduler.workers[i]->seen);
		free(scheduler.workers[i]);
	}
	free(scheduler.workers);
	scheduler.workers = NULL;
}

/* n workers, and room for the spares the monitor may start (max_spares()); their records are
 * made as they start. */
static int init_workers(int n)
{
	atomic_store(&scheduler.nworkers, n);
	scheduler.nominal = n;
	atomic_store(&scheduler.nstandby, 0);
	monitor_init(n);
	scheduler.workers = calloc((size_t)scheduler.cap, sizeof *scheduler.workers);
	if (!scheduler.workers)
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
	return atomic_load(&running) ? scheduler.cap : 0;
}

/* ---- statistics -------------------------------------------------------------------------- */

int weft_stats(weft_worker_stats *out, int max, uint64_t *foreign)
{
	if (!atomic_load(&running) || !scheduler.workers || max < 0 || (max && !out))
		return -EINVAL;
	int n = atomic_load(&scheduler.nworkers);
	for (int i = 0; i < n && i < max; i++) {
		struct worker *w = scheduler.workers[i];
		out[i] = (weft_worker_stats){
			.switches = atomic_load_explicit(&w->tick, memory_order_relaxed),
			.parks = (uint64_t)atomic_load_explicit(&w->parks, memory_order_relaxed),
			.wakes = (uint64_t)atomic_load_explicit(&w->wakes, memory_order_relaxed),
			.steals = (uint64_t)(atomic_load_explicit(&w->steals, memory_order_relaxed) +
					     atomic_load_explicit(&w->requests_granted,
								  memory_order_relaxed)),
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
	scheduler.deadlock_check = !(dl && strcmp(dl, "0") == 0);
	scheduler.main_fn = main_task;
	scheduler.main_arg = arg;
	scheduler.main_result = 0;
	atomic_store(&scheduler.stop, false);
	atomic_store(&scheduler.ids, 1);
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
	steal_reset();
	atomic_store(&sched_gather_on, 0);
	int old_slack = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
	scheduler.threads_at_start = idle_threads_before_run();
	scheduler.threads_at_start += finish_install(); /* its thread wakes no task */
	trace_start();
	waitstat_start(scheduler.cap);
	worker_enter(scheduler.workers[0]);
	weft_task *m = task_spawn(scheduler.workers[0], main_entry, NULL,
				  &(weft_spawn_opts){ .name = "main", .detached = 1 },
				  __builtin_return_address(0));
	int started = 1;
	if (!m) {
		err = -ENOMEM;
		stop_all();
	}
	for (; !err && started < n; started++) {
		if ((err = -pthread_create(&scheduler.workers[started]->thread, NULL, sched_worker_thread,
					   scheduler.workers[started]))) {
			stop_all();
			break;
		}
	}
	atomic_store(&scheduler.monitor_word, 0);
	bool monitoring = !err && pthread_create(&scheduler.monitor, NULL, monitor_thread, NULL) == 0;
	scheduler.threads_at_start -= !monitoring; /* the deadlock check counts a monitor */
	worker_loop(scheduler.workers[0]);
	if (monitoring) /* first: it may be starting a spare */
		pthread_join(scheduler.monitor, NULL);
	for (int i = 1; i < scheduler.cap && scheduler.workers[i]; i++)
		if (i < started || scheduler.workers[i]->started)
			pthread_join(scheduler.workers[i]->thread, NULL);
	finish_uninstall();
	sched_print_stats();
	waitstat_stop();
	trace_stop();
	worker_leave(scheduler.workers[0]);
	affinity_restore();
	prctl(PR_SET_TIMERSLACK, (unsigned long)old_slack, 0, 0, 0);
	overflow_uninstall();
	dump_uninstall();
	stack_each_live(discard_task, NULL);
	stack_release_all();
	free_workers();
	free(scheduler.global_ring);
	scheduler.global_ring = NULL;
	scheduler.global_cap = scheduler.global_head = 0;
	atomic_store(&scheduler.global_len, 0);
	atomic_store(&scheduler.nidle, 0);
	atomic_store(&scheduler.nspinning, 0);
	scheduler.idle = NULL;
	atomic_store(&scheduler.polling, false);
	atomic_store(&running, false);
	return err ? err : scheduler.main_result;
}