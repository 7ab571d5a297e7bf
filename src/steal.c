/*
 * steal.c - how an idle worker takes work from the others: stealing, and asking a spawning
 * worker for work instead.
 *
 * Stealing. A worker with nothing of its own to run (sched.c, find_work) looks at the other
 * workers in a random order, STEAL_ROUNDS times over: it expires their due timers (a worker
 * held by one task cannot), empties their inbox into its own ring, or takes half their ring
 * (runq_grab, as Go's runqsteal); in the last round, once it has looked for NEXT_STEAL_NS, it
 * takes a victim's `next` task too. The owner of a ring takes from its head without atomic
 * read-modify-writes while no thief is at it (sched_state.h, own_begin): a thief first
 * announces itself with an asymmetric fence (thief_begin), which interrupts the victim's core.
 *
 * Asking. That fence costs the victim a few microseconds (more on a virtual machine) for every
 * batch, however small, so a worker spawning tasks one by one beside an idle one would spend
 * more on being interrupted than on its spawns. So a thief first asks a worker that is
 * spawning (request_work), and the spawner grants the request with no fence: at its next
 * switch or spawn (serve_work_request) it takes half its ring as a thief would (a CAS) and
 * pushes it onto the requester's inbox in one go (grant_work_request). A request left
 * unanswered for STALL_NS means the spawner runs one task that neither switches nor spawns:
 * then the thief steals. The requester spins that long at least, and withdraws its requests
 * once it stops looking (withdraw_work_requests), or a grant would hand tasks to a worker busy
 * with others, or asleep and slow to wake, while their owner could run them at once. Only
 * spawners are asked: a worker whose ring fills with tasks woken by the poller is better
 * stolen from at once.
 *
 * Gathering. Tasks contending for a channel run slower spread over cores than together on one
 * (chan.c gathers them on one worker: sched_note_contention). While that lasts, a thief
 * leaves a worker that keeps switching alone, and takes only from one that has stalled
 * (STALL_NS on one task, as far as the thief has seen: stalled()); it also leaves the global
 * queue to the gathering worker (steal_from_global). A thief that declined work so says
 * (w->declined_work), and backs off instead of spinning beside the busy worker (idle.c).
 *
 * Invariants: only the owner pushes onto a ring and fills `next`; thieves take from the head
 * and empty `next`. A request word holds at most one requester (1 + its id, set by CAS); it
 * is cleared by the spawner that grants it or by the requester withdrawing it. A grant lands
 * in the requester's inbox, which the requester looks at last before it sleeps, so no
 * granted task is stranded (withdraw_work_requests, grant_work_request).
 *
 * The state this file owns: in struct worker, the stealing group (rng, the request line,
 * requesting_work, request_wait_until, requests_granted, the victims seen) and `declined_work`
 * (read by idle.c); the gathering period (gather_period_ns).
 *
 * Rejected: a thief always fencing (the cost above); asking every victim (a poller's ring
 * waits for the request to time out); thieves taking a gathering worker's queue (the tasks
 * come straight back to the contended channel).
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "asym.h"
#include "sched_state.h"
#include "trace.h"
#include "wait.h"
#include "weft.h"

#define STEAL_ROUNDS 4
#define NEXT_STEAL_NS 3000  /* take a victim's `next` only after looking this long (as Go) */
#define THIEF_PATIENCE 1000 /* see thief_begin */

/* ---- the thief's half of own_begin's protocol (sched_state.h) ---------------------------- */

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

/* ---- asking ----------------------------------------------------------------------------- */

/* The spawner's side: a worker requested half of w's ring (serve_work_request saw it). */
__attribute__((noinline)) void grant_work_request(struct worker *w)
{
	/* One task queued: at a switch we are about to run it, at a spawn the next one makes two.
	 * The request stays; should we hold on to that task past STALL_NS, the thief steals it. */
	if (runq_len(&w->q) < 2)
		return;
	/* A request still out is one its requester has not withdrawn: it is still looking for
	 * work. Acquire, against the requester's release: the requester may be a spare whose
	 * record the monitor made after this worker last looked at scheduler.nworkers. */
	uint32_t who = atomic_exchange_explicit(&w->work_request, 0, memory_order_acquire);
	weft_task *batch[RUNQ_SIZE / 2];
	uint32_t got = who ? runq_grab(&w->q, batch, RUNQ_SIZE / 2) : 0;
	if (!got)
		return;
	struct worker *v = scheduler.workers[who - 1];
	for (uint32_t k = 0; k + 1 < got; k++) /* newest first, as an inbox holds them */
		batch[k + 1]->link = batch[k];
	sched_inbox_push_chain(v, batch[got - 1], batch[0]);
	atomic_fetch_add_explicit(&v->requests_granted, 1, memory_order_relaxed);
	sched_wake_for_inbox(v);
	/* The requester found work meanwhile: it may look at its inbox only in a while. Thieves
	 * take from inboxes too. (seq_cst push, then `requesting_work`; the requester clears
	 * `requesting_work`, then looks at its inbox: withdraw_work_requests) */
	if (!atomic_load(&v->requesting_work))
		sched_wake_idle();
}


/* ---- stealing ---------------------------------------------------------------------------- */

static uint32_t random_next(struct worker *w)
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
static struct victim_seen *victim_seen(struct worker *w, struct worker *v)
{
	if (v->id >= w->nseen) {
		int n = atomic_load_explicit(&scheduler.nworkers, memory_order_relaxed), want = 2 * w->nseen;
		want = want > n ? want : n;
		want = want < scheduler.cap ? want : scheduler.cap;
		struct victim_seen *p = realloc(w->seen, (size_t)want * sizeof *p);
		if (p && want > v->id) {
			memset(p + w->nseen, 0, (size_t)(want - w->nseen) * sizeof *p);
			w->seen = p;
			w->nseen = want;
		} else {
			w->seen = p ? p : w->seen;
			return &w->seen_rest;
		}
	}
	return &w->seen[v->id];
}

/* Has v been running one task for STALL_NS, as far as w has seen? */
static bool stalled(struct worker *w, struct worker *v)
{
	struct victim_seen *p = victim_seen(w, v);
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
 * Gathered tasks contend no more, so gathering lapses a quiet period after it began; an idle
 * worker then steals half the gathering worker's queue, and the stolen tasks find the channel
 * contended again and move back. While the same tasks keep at it, that cycle repeats every
 * period, with fences and a hundred moves each time. So a period that ends in contention
 * within another period was too short: the next one is twice as long, up to
 * SCHED_GATHER_MAX_NS; a quiet time twice as long brings it back to SCHED_CONTENDED_NS
 * (sched_next_gather_period). Workers that notice the same lapse at once store the same value.
 */
static _Atomic int64_t gather_period_ns = SCHED_CONTENDED_NS;

int64_t sched_next_gather_period(int64_t quiet, int64_t period)
{
	if (quiet > 2 * period)
		return SCHED_CONTENDED_NS;
	return period < SCHED_GATHER_MAX_NS / 2 ? 2 * period : SCHED_GATHER_MAX_NS;
}

/* A new weft_run: no contention yet. */
void steal_reset(void)
{
	atomic_store(&gather_period_ns, SCHED_CONTENDED_NS);
}

void sched_note_contention(int me)
{
	if (me < 0 || me >= atomic_load_explicit(&scheduler.nworkers, memory_order_relaxed))
		me = weft_worker_id();
	int64_t now = atomic_load_explicit(&sched_coarse_now, memory_order_relaxed);
	int64_t at = atomic_load_explicit(&sched_contended_at, memory_order_relaxed);
	int64_t period = atomic_load_explicit(&gather_period_ns, memory_order_relaxed);
	if (now - at > period) {
		atomic_store_explicit(&sched_gather_on, me, memory_order_relaxed);
		atomic_store_explicit(&gather_period_ns, sched_next_gather_period(now - at, period),
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
	       atomic_load_explicit(&gather_period_ns, memory_order_relaxed);
}

/* The global queue, for an idle worker. While tasks are being gathered, the gathering worker's
 * overflow goes there too (a full ring spills half of itself): another worker taking it would
 * only spread them again, so it leaves the queue to that worker, which looks at it every
 * GLOBAL_EVERY switches, unless that worker has stalled. Leaving only long queues (a spill's
 * length) is not enough: the gathering worker takes a fair share, and the rest spreads. The
 * price: a task woken by a plain thread meanwhile waits for the gathering worker's next look,
 * up to GLOBAL_EVERY task runs of STALL_NS (a longer one counts as a stall). */
weft_task *steal_from_global(struct worker *w)
{
	if (!atomic_load_explicit(&scheduler.global_len, memory_order_relaxed))
		return NULL;
	int home = atomic_load_explicit(&sched_gather_on, memory_order_relaxed);
	/* the home may be a spare started since: its record is ours to read once
	 * scheduler.nworkers says so */
	if (w->id != home && home < atomic_load_explicit(&scheduler.nworkers, memory_order_acquire) &&
	    gathering() && !stalled(w, scheduler.workers[home])) {
		w->declined_work = true;
		return NULL;
	}
	return sched_global_pop(w);
}

/* Has v spawned a task within STALL_NS, as far as w has seen? */
static bool spawning(struct worker *w, struct worker *v, int64_t now)
{
	struct victim_seen *p = victim_seen(w, v);
	int64_t n = atomic_load_explicit(&v->spawned, memory_order_relaxed);
	if (n != p->spawned) {
		p->spawned = n;
		p->spawned_at = now;
	}
	return now - p->spawned_at < STALL_NS;
}

/* Request half of a spawning v's ring (see grant_work_request). True when w should steal
 * instead: v is not spawning, or a request, ours or another thief's, has been left unanswered
 * for STALL_NS. (Its time is written just after its requester; read in between, it is an older
 * time, and costs at worst an early steal.) */
static bool request_work(struct worker *w, struct worker *v)
{
	int64_t now = weft_now();
	if (!spawning(w, v, now))
		return true;
	/* a load first: a spinning thief must not take the line v reads at every switch */
	uint32_t who = atomic_load_explicit(&v->work_request, memory_order_relaxed);
	if (!who) {
		atomic_store(&w->requesting_work, true); /* before v can grant it */
		if (atomic_compare_exchange_strong_explicit(&v->work_request, &who,
							    (uint32_t)w->id + 1,
							    memory_order_release,
							    memory_order_relaxed)) {
			atomic_store_explicit(&v->work_request_at, now, memory_order_relaxed);
			w->request_wait_until = now + STALL_NS; /* to take the grant, or steal */
			return false;
		}
	}
	return now - atomic_load_explicit(&v->work_request_at, memory_order_relaxed) >= STALL_NS;
}

/* w stops looking for work: a grant now would hand tasks to a worker busy with others, or
 * asleep, while their owner could run them at once. A grant already on its way lands in w's
 * inbox: a worker going to sleep looks there last (idle.c: idle_sleep, back_off, standby); one
 * that found work moves it to its ring, where has_queued() and thieves see it, unless
 * grant_work_request saw `requesting_work` cleared first and woke a thief. */
void withdraw_work_requests(struct worker *w, bool found_work)
{
	if (!atomic_load_explicit(&w->requesting_work, memory_order_relaxed))
		return;
	atomic_store(&w->requesting_work, false);
	uint32_t me = (uint32_t)w->id + 1;
	for (int i = 0; i < atomic_load(&scheduler.nworkers); i++) {
		uint32_t who = me;
		if (atomic_load_explicit(&scheduler.workers[i]->work_request, memory_order_relaxed) == me)
			atomic_compare_exchange_strong_explicit(&scheduler.workers[i]->work_request, &who, 0,
								memory_order_relaxed,
								memory_order_relaxed);
	}
	if (found_work && atomic_load(&w->inbox) && sched_inbox_drain(w, w))
		sched_wake_idle();
}

/* spin_since: when w began looking (0: just now). Once it has looked NEXT_STEAL_NS, the last
 * round also takes a victim's `next` task, which is about to run there: sooner, the hand-off
 * to the waker's core would be undone at once. */
weft_task *steal(struct worker *w, int64_t spin_since)
{
	bool take_next = spin_since && weft_now() - spin_since >= NEXT_STEAL_NS;
	weft_task *batch[RUNQ_SIZE / 2];
	int n = atomic_load_explicit(&scheduler.nworkers, memory_order_acquire);
	/* While tasks contend for a channel, a worker that keeps switching is serving its queue
	 * fast and moving its tasks here would only make them fight across cores: take only from
	 * one that has stopped switching. */
	bool picky = gathering();
	for (int round = 0; round < STEAL_ROUNDS; round++) {
		int start = (int)(random_next(w) % (uint32_t)n);
		for (int i = 0, j = start; i < n; i++, j = j + 1 < n ? j + 1 : 0) {
			struct worker *v = scheduler.workers[j];
			/* A spare in standby hands over what it holds itself (idle.c); after a
			 * burst of blocking calls there may be a hundred, each a few lines to miss. */
			if (v == w || atomic_load_explicit(&v->standby, memory_order_relaxed))
				continue;
			if (round == 0)
				steal_timers(v);
			if (picky && !stalled(w, v)) {
				w->declined_work |= has_queued(v) || atomic_load(&v->inbox);
				continue;
			}
			if (sched_inbox_drain(w, v))
				return sched_pick(w);
			bool next_too = take_next && round == STEAL_ROUNDS - 1;
			bool ring = runq_len(&v->q) != 0;
			if (!ring && !(next_too && atomic_load(&v->next)))
				continue;
			if (ring && !request_work(w, v))
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