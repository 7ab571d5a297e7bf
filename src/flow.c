/*
 * flow.c - the flow run-time: interprets the tables weft-flux generates from a .flux file
 * (docs/flows.md teaches the language).
 *
 * Events. An event is a node's input record plus a small header: which node, which guards it
 * has taken so far, and room for the node's output record. Events of one flow all have the
 * same size (the largest record of the flow) so that they come from one free list per worker
 * (no malloc per event); a worker's list that grows past EV_CACHE spills half to a global
 * list, from which a worker whose list is empty takes a batch.
 *
 * Running. Each event runs as a detached weft task (run_event). A node's output is copied into
 * a new event for each successor (an abstract successor first picks its targets with its
 * rules: the first rule whose test passes). The first new event is run next by the same task,
 * without a spawn (a continuation: a chain of nodes costs one task per input); the others are
 * spawned, so a fan-out runs concurrently. A source's event is never handed on: after each run
 * the same task runs the source again. It yields once every SOURCE_BATCH runs, so that the
 * events it emitted get their turn even on a single worker while an idle worker finds a batch
 * worth stealing, and it sleeps while too many events are in flight.
 *
 * Detached nodes run through weft_blocking: the task parks while a pool thread runs the
 * function, so a blocking call in it holds no worker. Pool threads keep the kernel's default
 * timer slack (rejected: 1 ns, as workers have): detached nodes that sleep wake up in great
 * numbers, and a slack of 1 ns stops the kernel from merging those wake-ups.
 *
 * Guards (flow_guard.c) are taken one after the other before a node runs; an event that cannot
 * take one waits as data on the guard's queue, and its task ends.
 *
 * Ending. in_flight counts the events that exist (a source's event exists until the source
 * stops). It is one shared counter, so it is touched as little as possible: new events are
 * counted in one addition before they are spawned (a source counts SOURCE_CREDIT ahead and
 * gives back what it did not use when it stops), a continuation takes over the count of the
 * event it follows, and a worker takes the events it frees off the count OWED_BATCH at a time,
 * so that a chain of nodes touches the shared line once per batch. While sources run the count
 * cannot reach zero anyway; once the flow stops (or in a flow without sources) frees go
 * straight to the count, and weft_flow_run sweeps up every millisecond what workers still owe
 * (one may not have seen the flag yet). Stop sets a flag the sources check after each run;
 * kill also makes every event that has not started yet (or is woken from a guard queue)
 * release what it holds and vanish, and stops the routing of outputs. The count reaching zero
 * posts `done`, and weft_flow_run returns.
 *
 * Counters. Each worker has a row of per-node counters, written only by that worker with
 * relaxed atomics and summed by readers. Reading the clock can cost more than running a small
 * node, so a node's time is measured on the first run of the node on each worker and one run in
 * 16 after it, and the total is estimated from those; with $WEFT_FLOW_STATS set every run is
 * timed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "flow.h"
#include "spin.h"
#include "weft.h"

#define EV_CACHE 512      /* events a worker keeps before spilling half */
#define EV_BATCH 64       /* events taken from the global list at once */
#define MAX_IN_FLIGHT 8192 /* a source pauses while more events than this exist */
#define SOURCE_BATCH 16    /* a source yields once per this many runs */
#define SOURCE_CREDIT 64   /* a source counts its events in flight this many at a time */
#define OWED_BATCH 32      /* a worker takes its freed events off the count this many at a time */

/* ---- counters ---------------------------------------------------------------------------- */

static struct nstat *stat_row(struct weft_flow_rt *rt, int node, bool *shared)
{
	int w = weft_worker_id();
	int row = w >= 0 && w < rt->nrows - 1 ? w : rt->nrows - 1;
	*shared = row == rt->nrows - 1;
	return &rt->stats[(size_t)row * (size_t)rt->f->nnodes + (size_t)node];
}

/* Is this run of node to be timed? The first run of each node on each worker and one run in
 * 16 after it (every run with $WEFT_FLOW_STATS set). */
static bool timing_due(struct weft_flow_rt *rt, int node)
{
	bool shared;
	struct nstat *s = stat_row(rt, node, &shared);
	return (atomic_load_explicit(&s->events, memory_order_relaxed) & rt->sample_mask) == 0;
}

static void bump(_Atomic uint64_t *c, uint64_t by, bool shared)
{
	if (shared) /* the row of foreign threads: a real read-modify-write */
		atomic_fetch_add_explicit(c, by, memory_order_relaxed);
	else /* owner-written: a load and a store, no locked instruction */
		atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + by,
				      memory_order_relaxed);
}

static void count(struct weft_flow_rt *rt, int node, bool error, bool timed, int64_t ns)
{
	bool shared;
	struct nstat *s = stat_row(rt, node, &shared);
	bump(&s->events, 1, shared);
	if (error)
		bump(&s->errors, 1, shared);
	if (timed) {
		bump(&s->timed, 1, shared);
		bump(&s->ns, (uint64_t)ns, shared);
	}
}

/* ---- events: per-worker free lists ------------------------------------------------------- */

static struct event *ev_alloc(struct weft_flow_rt *rt, int node)
{
	struct event *ev = NULL;
	int w = weft_worker_id();
	if (w >= 0 && w < rt->nrows - 1) {
		struct evcache *c = &rt->caches[w];
		/* refill a batch (nglobal read without the lock: a hint) */
		if (!c->head && atomic_load_explicit(&rt->nglobal, memory_order_relaxed)) {
			spin_lock(&rt->glock);
			for (int i = 0; i < EV_BATCH && rt->global; i++) {
				struct event *e = rt->global;
				rt->global = e->next;
				rt->nglobal--;
				e->next = c->head;
				c->head = e;
				c->n++;
			}
			spin_unlock(&rt->glock);
		}
		if ((ev = c->head)) {
			c->head = ev->next;
			c->n--;
		}
	} else {
		spin_lock(&rt->glock);
		if ((ev = rt->global)) {
			rt->global = ev->next;
			rt->nglobal--;
		}
		spin_unlock(&rt->glock);
	}
	if (!ev && !(ev = aligned_alloc(16, rt->ev_size)))
		return NULL;
	ev->next = ev->pending = NULL;
	ev->node = node;
	ev->nacq = ev->gi = 0;
	ev->started = ev->dropped = false;
	ev->rt = rt;
	*(struct event **)((char *)ev + rt->out_off - sizeof(void *)) = ev;
	return ev;
}

/* Count n more events in flight; done before they can run. */
static void flight_add(struct weft_flow_rt *rt, long n)
{
	if (n)
		atomic_fetch_add_explicit(&rt->in_flight, n, memory_order_relaxed);
}

/* n events fewer: the last one posts `done`. The release orders the events' last touches
 * (of the free lists too) before the waiter frees everything. */
static void flight_sub(struct weft_flow_rt *rt, long n)
{
	if (n && atomic_fetch_sub_explicit(&rt->in_flight, n, memory_order_acq_rel) == n)
		weft_sem_post(&rt->done);
}

/* One event fewer. A worker takes its events off the shared count OWED_BATCH at a time: a
 * chain's last node then touches no shared cache line. Once the flow is stopping (or has no
 * source, so that any event may be the last) every event goes at once, and weft_flow_run
 * sweeps up what workers still owe every millisecond, in case one had not yet seen the flag. */
static void flight_done(struct weft_flow_rt *rt)
{
	int w = weft_worker_id();
	if (w < 0 || w >= rt->nrows - 1 || rt->f->nsources == 0 ||
	    atomic_load_explicit(&rt->stopping, memory_order_relaxed)) {
		flight_sub(rt, 1);
		return;
	}
	atomic_long *owed = &rt->caches[w].owed;
	/* release: the free-list push above comes before whoever takes this unit */
	if (atomic_fetch_add_explicit(owed, 1, memory_order_release) + 1 >= OWED_BATCH)
		flight_sub(rt, atomic_exchange_explicit(owed, 0, memory_order_acq_rel));
}

/* Take what every worker owes off the shared count. */
static void flight_sweep(struct weft_flow_rt *rt)
{
	for (int w = 0; w < rt->nrows - 1; w++)
		flight_sub(rt, atomic_exchange_explicit(&rt->caches[w].owed, 0, memory_order_acq_rel));
}

/* Put ev back on a free list; the count in flight is the caller's business. */
static void ev_release(struct event *ev)
{
	struct weft_flow_rt *rt = ev->rt;
	int w = weft_worker_id();
	if (w >= 0 && w < rt->nrows - 1) {
		struct evcache *c = &rt->caches[w];
		ev->next = c->head;
		c->head = ev;
		if (++c->n > EV_CACHE) { /* spill half */
			struct event *first = c->head, *last = first;
			for (int i = 1; i < EV_CACHE / 2; i++)
				last = last->next;
			c->head = last->next;
			c->n -= EV_CACHE / 2;
			spin_lock(&rt->glock);
			last->next = rt->global;
			rt->global = first;
			rt->nglobal += EV_CACHE / 2;
			spin_unlock(&rt->glock);
		}
	} else {
		spin_lock(&rt->glock);
		ev->next = rt->global;
		rt->global = ev;
		rt->nglobal++;
		spin_unlock(&rt->glock);
	}
}

static void ev_free(struct event *ev)
{
	struct weft_flow_rt *rt = ev->rt;
	ev_release(ev);
	flight_done(rt);
}

/* ---- guards: taking them, and starting the events a release woke ------------------------- */

static void run_task(void *arg);

static void spawn_event(struct event *ev)
{
	weft_spawn_opts o = { .detached = 1, .name = ev_node(ev)->name };
	if (!weft_spawn_opt(run_task, ev, &o)) {
		fprintf(stderr, "weft: flow %s: cannot spawn a task for node %s\n", ev->rt->f->name,
			ev_node(ev)->name);
		abort();
	}
}

/* Compute ev's acquisitions (flow_guard.c); a node without guards has none, and no call. */
static inline int prepare(struct event *ev)
{
	if (!ev_node(ev)->nuses) {
		ev->nacq = 0;
		return 0;
	}
	return flow_guards_prepare(ev);
}

/* Release the guards ev holds (in reverse order) and start the events that now have them. */
static inline void release_all(struct event *ev)
{
	if (!ev->gi) /* holds none: no call */
		return;
	struct event *woken = flow_guards_release(ev);
	while (woken) {
		struct event *w = woken;
		woken = w->next;
		spawn_event(w);
	}
}

/* ---- routing ----------------------------------------------------------------------------- */

/* New events, not yet counted in flight: whoever spawns them counts them first. */
struct evlist {
	struct event *head, *tail;
	long n;
};

static void push(struct evlist *l, struct event *ev)
{
	ev->next = NULL;
	if (l->tail)
		l->tail->next = ev;
	else
		l->head = ev;
	l->tail = ev;
	l->n++;
}

/* Deliver a record to node t: an event for a concrete node, the rules of an abstract one. */
static void deliver(struct weft_flow_rt *rt, int t, const void *rec, struct evlist *out)
{
	const weft_flow_node *n = &rt->f->nodes[t];
	if (n->flags & WEFT_FLOW_ABSTRACT) {
		for (int r = 0; r < n->nrules; r++) {
			const weft_flow_rule *rule = &n->rules[r];
			if (rule->test && !rule->test(rec))
				continue;
			for (int i = 0; i < rule->ntargets; i++)
				deliver(rt, rule->targets[i], rec, out);
			break;
		}
		return; /* no rule passed: the record goes nowhere */
	}
	struct event *ev = ev_alloc(rt, t);
	if (!ev) {
		fprintf(stderr, "weft: flow %s: out of memory for an event of %s\n", rt->f->name,
			n->name);
		abort();
	}
	memcpy(ev_in(ev), rec, n->in_size);
	push(out, ev);
}

/* Turn the output record of node n into events for its successors. */
static void route(struct weft_flow_rt *rt, const weft_flow_node *n, const void *rec,
		  struct evlist *out)
{
	if (atomic_load_explicit(&rt->killed, memory_order_relaxed))
		return;
	for (int i = 0; i < n->nnext; i++)
		deliver(rt, n->next[i], rec, out);
}

static void spawn_all(struct event *ev)
{
	while (ev) {
		struct event *n = ev->next;
		spawn_event(ev);
		ev = n;
	}
}

int weft_flow_emit(void *out)
{
	if (!out)
		return -EINVAL;
	struct event *ev = ((struct event **)out)[-1];
	struct weft_flow_rt *rt = ev->rt;
	if (atomic_load_explicit(&rt->killed, memory_order_relaxed))
		return -ECANCELED;
	struct evlist l = { 0, 0, 0 };
	route(rt, ev_node(ev), out, &l);
	flight_add(rt, l.n);
	if (weft_self()) {
		spawn_all(l.head);
	} else if (l.head) { /* a detached node on a pool thread: its task spawns them */
		l.tail->next = ev->pending;
		ev->pending = l.head;
	}
	return 0;
}

void weft_flow_drop(void *out)
{
	if (out)
		((struct event **)out)[-1]->dropped = true;
}

/* ---- running an event -------------------------------------------------------------------- */

struct call {
	struct event *ev;
	void **atoms;
	int result;
};

static void detached_call(void *arg)
{
	struct call *c = arg;
	const weft_flow_node *n = ev_node(c->ev);
	c->result = n->call(ev_in(c->ev), ev_out(c->ev), c->atoms);
}

/* Call ev's node function with its atoms; the result is the function's. */
static int call_node(struct event *ev)
{
	const weft_flow_node *n = ev_node(ev);
	void *atoms[WEFT_FLOW_MAX_GUARDS];
	for (int i = 0; i < ev->nacq; i++) {
		struct acq *a = &ev->acq[i];
		struct acq *src = a;
		while (src->alias)
			src--;
		atoms[n->uses[a->use].atom] = n->uses[a->use].mode == WEFT_FLOW_POOL
						      ? (void *)&src->item
						      : (void *)&src->e->value;
	}
	memset(ev_out(ev), 0, n->out_size);
	if (!(n->flags & WEFT_FLOW_DETACHED))
		return n->call(ev_in(ev), ev_out(ev), atoms);
	struct call c = { ev, atoms, 0 };
	int r = weft_blocking(detached_call, &c);
	if (r < 0) {
		fprintf(stderr, "weft: flow %s: blocking pool: %s\n", ev->rt->f->name, strerror(-r));
		abort();
	}
	return c.result;
}

/* After a run: route the output (or the error), release the guards. The new events go on *l. */
static void finish(struct event *ev, int err, struct evlist *l)
{
	struct weft_flow_rt *rt = ev->rt;
	const weft_flow_node *n = ev_node(ev);
	if (ev->pending) {
		spawn_all(ev->pending);
		ev->pending = NULL;
	}
	release_all(ev);
	if (err && n->on_error >= 0) {
		if (!atomic_load_explicit(&rt->killed, memory_order_relaxed)) {
			const weft_flow_node *h = &rt->f->nodes[n->on_error];
			struct event *e = ev_alloc(rt, n->on_error);
			if (!e)
				abort();
			memset(ev_in(e), 0, h->in_size);
			memcpy(ev_in(e), ev_in(ev), n->in_size);
			memcpy((char *)ev_in(e) + n->err_offset, &err, sizeof err);
			push(l, e);
		}
	} else if (!err && !ev->dropped) {
		route(rt, n, ev_out(ev), l);
	}
	ev->dropped = false;
	ev->nacq = 0;
}

/* Drop an event that will not run (the flow was killed): release what it took. */
static void vanish(struct event *ev)
{
	release_all(ev);
	ev_free(ev);
}

/*
 * Run ev and then the continuation its output gives, until an event parks on a guard, the
 * chain ends, or (for a source) the flow stops.
 */
static void run_event(struct event *ev)
{
	struct weft_flow_rt *rt = ev->rt;
	unsigned runs = 0;
	long credit = 0; /* a source's events counted ahead */
	while (ev) {
		if (atomic_load_explicit(&rt->killed, memory_order_relaxed)) {
			flight_sub(rt, credit);
			vanish(ev);
			return;
		}
		const weft_flow_node *n = ev_node(ev);
		if (!ev->started) {
			if (prepare(ev)) {
				fprintf(stderr, "weft: flow %s: out of memory for a guard\n", rt->f->name);
				abort();
			}
			ev->started = true;
		}
		while (ev->gi < ev->nacq) {
			if (!flow_guard_take(ev))
				return; /* parked: the event now waits as data on the guard's queue */
			ev->gi++;
		}
		bool timed = timing_due(rt, ev->node);
		int64_t t0 = timed ? weft_now() : 0;
		int err = call_node(ev);
		count(rt, ev->node, err != 0, timed, timed ? weft_now() - t0 : 0);
		struct evlist l = { 0, 0, 0 };
		finish(ev, err, &l);
		if (n->flags & WEFT_FLOW_SOURCE) {
			if (credit < l.n) { /* count ahead, in one addition per SOURCE_CREDIT */
				flight_add(rt, l.n + SOURCE_CREDIT);
				credit += l.n + SOURCE_CREDIT;
			}
			credit -= l.n;
			spawn_all(l.head);
			if (atomic_load_explicit(&rt->stopping, memory_order_relaxed)) {
				flight_sub(rt, credit);
				ev_free(ev);
				return;
			}
			ev->started = false;
			if (++runs % SOURCE_BATCH == 0)
				weft_yield(); /* let the events it emitted run, even on one worker */
			while (atomic_load_explicit(&rt->in_flight, memory_order_relaxed) >
				       MAX_IN_FLIGHT &&
			       !atomic_load_explicit(&rt->stopping, memory_order_relaxed))
				weft_sleep_until(weft_now() + 20000);
			continue;
		}
		if (!l.head) {
			ev_free(ev);
			return;
		}
		/* the continuation takes over ev's count: a chain costs no counting */
		flight_add(rt, l.n - 1);
		ev_release(ev);
		ev = l.head;
		spawn_all(ev->next);
	}
}

static void run_task(void *arg)
{
	run_event(arg);
}

/* ---- the flow ---------------------------------------------------------------------------- */

/* The run-time state of f, created on first use (guards may be set before the flow runs). */
struct weft_flow_rt *flow_rt_get(weft_flow *f)
{
	if (f->_rt)
		return f->_rt;
	struct weft_flow_rt *rt = calloc(1, sizeof *rt);
	if (!rt)
		return NULL;
	rt->f = f;
	rt->guards = calloc((size_t)f->nguards + 1, sizeof *rt->guards);
	if (!rt->guards) {
		free(rt);
		return NULL;
	}
	for (int i = 0; i < f->nguards; i++) {
		rt->guards[i].kind = f->guards[i].kind;
		rt->guards[i].key_size = f->guards[i].key_size;
	}
	size_t in = 0, out = 0;
	for (int i = 0; i < f->nnodes; i++) {
		in = f->nodes[i].in_size > in ? f->nodes[i].in_size : in;
		out = f->nodes[i].out_size > out ? f->nodes[i].out_size : out;
	}
	rt->out_off = (IN_OFF + in + sizeof(void *) + 15) & ~(size_t)15;
	rt->ev_size = (rt->out_off + out + 15) & ~(size_t)15;
	f->_rt = rt;
	return rt;
}

void weft_flow_stop(weft_flow *f)
{
	if (f && f->_rt)
		atomic_store(&f->_rt->stopping, true);
}

void weft_flow_kill(weft_flow *f)
{
	if (f && f->_rt) {
		atomic_store(&f->_rt->stopping, true);
		atomic_store(&f->_rt->killed, true);
	}
}

int weft_flow_stats_get(weft_flow *f, weft_flow_stats *out, int max)
{
	if (!f || !f->_rt || !f->_rt->stats)
		return 0;
	struct weft_flow_rt *rt = f->_rt;
	for (int i = 0; i < f->nnodes && i < max; i++) {
		weft_flow_stats s = { f->nodes[i].name, 0, 0, 0 };
		uint64_t timed = 0, ns = 0;
		for (int r = 0; r < rt->nrows; r++) {
			struct nstat *x = &rt->stats[(size_t)r * (size_t)f->nnodes + (size_t)i];
			s.events += atomic_load_explicit(&x->events, memory_order_relaxed);
			s.errors += atomic_load_explicit(&x->errors, memory_order_relaxed);
			timed += atomic_load_explicit(&x->timed, memory_order_relaxed);
			ns += atomic_load_explicit(&x->ns, memory_order_relaxed);
		}
		/* the runs timed stand for all of them */
		s.time_ns = timed ? (int64_t)((double)ns * (double)s.events / (double)timed) : 0;
		out[i] = s;
	}
	return f->nnodes;
}

int weft_flow_stats_print(weft_flow *f, int fd)
{
	if (!f)
		return -EINVAL;
	weft_flow_stats s[f->nnodes + 1];
	int n = weft_flow_stats_get(f, s, f->nnodes);
	dprintf(fd, "weft flow %s:\n%-24s %12s %10s %12s %10s\n", f->name, "node", "events",
		"errors", "time ms", "us/event");
	for (int i = 0; i < n; i++) {
		if (f->nodes[i].flags & WEFT_FLOW_ABSTRACT)
			continue;
		dprintf(fd, "%-24s %12llu %10llu %12.3f %10.3f\n", s[i].name,
			(unsigned long long)s[i].events, (unsigned long long)s[i].errors,
			(double)s[i].time_ns / 1e6,
			s[i].events ? (double)s[i].time_ns / 1e3 / (double)s[i].events : 0.0);
	}
	return 0;
}

static void caches_free(struct weft_flow_rt *rt)
{
	for (int w = 0; w < rt->nrows - 1; w++)
		for (struct event *e = rt->caches[w].head, *n; e; e = n) {
			n = e->next;
			free(e);
		}
	for (struct event *e = rt->global, *n; e; e = n) {
		n = e->next;
		free(e);
	}
	rt->global = NULL;
	rt->nglobal = 0;
	for (int w = 0; w < rt->nrows - 1; w++) { /* the array stays: see flight_done */
		rt->caches[w].head = NULL;
		rt->caches[w].n = 0;
	}
}

static int flow_body(weft_flow *f, int argc, char **argv)
{
	struct weft_flow_rt *rt = flow_rt_get(f);
	if (!rt)
		return -ENOMEM;
	int idle = 0;
	if (!atomic_compare_exchange_strong(&rt->running, &idle, 1))
		return -EBUSY;
	int workers = weft_worker_max();
	rt->nrows = workers + 1;
	free(rt->stats);
	rt->stats = calloc((size_t)rt->nrows * (size_t)f->nnodes + 1, sizeof *rt->stats);
	if (rt->ncaches < workers + 1) { /* a later weft_run with more workers */
		free(rt->caches);
		rt->caches = aligned_alloc(64, sizeof *rt->caches * (size_t)(workers + 1));
		if (rt->caches)
			memset(rt->caches, 0, sizeof *rt->caches * (size_t)(workers + 1));
		rt->ncaches = rt->caches ? workers + 1 : 0;
	}
	if (!rt->stats || !rt->caches) {
		atomic_store(&rt->running, 0);
		return -ENOMEM;
	}
	const char *e = getenv("WEFT_FLOW_STATS");
	bool print = e && *e && *e != '0';
	rt->sample_mask = print ? 0 : 15;
	atomic_store(&rt->stopping, false);
	atomic_store(&rt->killed, false);
	atomic_store(&rt->in_flight, 1); /* ours, until everything has started */
	weft_sem_init(&rt->done, 0);
	if (f->init)
		f->init(argc, argv);
	for (int i = 0; i < f->ninitials; i++) {
		struct event *ev = ev_alloc(rt, f->initials[i]);
		if (!ev)
			abort();
		flight_add(rt, 1);
		run_event(ev);
	}
	for (int i = 0; i < f->nsources; i++) {
		struct event *ev = ev_alloc(rt, f->sources[i]);
		if (!ev)
			abort();
		flight_add(rt, 1);
		spawn_event(ev);
	}
	flight_sub(rt, 1);
	while (weft_sem_wait_until(&rt->done, weft_now() + 1000000) == -ETIMEDOUT)
		if (f->nsources == 0 || atomic_load(&rt->stopping))
			flight_sweep(rt);
	/* the last ev_free posted `done` after its last touch of the lists; taking the lock
	 * once orders that before the frees below */
	spin_lock(&rt->glock);
	spin_unlock(&rt->glock);
	caches_free(rt);
	if (f->deinit)
		f->deinit();
	if (print)
		weft_flow_stats_print(f, 2);
	atomic_store(&rt->running, 0);
	return 0;
}

struct flow_args {
	weft_flow *f;
	int argc;
	char **argv;
};

static int flow_main(void *arg)
{
	struct flow_args *a = arg;
	return flow_body(a->f, a->argc, a->argv);
}

int weft_flow_run(weft_flow *f, int argc, char **argv)
{
	if (!f)
		return -EINVAL;
	struct flow_args a = { f, argc, argv };
	if (weft_self())
		return flow_main(&a);
	return weft_run(flow_main, &a);
}