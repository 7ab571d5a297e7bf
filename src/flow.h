/*
 * flow.h - the records the flow run-time shares between its two files: flow.c (events, their
 * free lists, running and routing them, the count in flight, the counters, and the flow's
 * life) and flow_guard.c (the guards' tables and wait queues).
 *
 * An event is a node's input record plus a small header (which node, the guards it has taken
 * so far) and room for the node's output record; all events of a flow have one size, set when
 * the flow's run-time state is made (flow_rt_get). struct weft_flow_rt is that state: what
 * every event reads (the tables, the flags) apart from what many workers write (the count in
 * flight, the free lists), each on its own cache line.
 *
 * Guards live in flow_guard.c, which never spawns a task: releasing a guard returns the events
 * it woke, and flow.c spawns them. The calls into flow_guard.c are made only for nodes that use
 * guards (flow.c checks first, in static inline wrappers), so a chain of nodes without guards
 * makes no call across files: keeping the guards out of flow.c costs that chain nothing.
 */
#ifndef WEFT_FLOW_H
#define WEFT_FLOW_H

#include <stdalign.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "spin.h"
#include "weft.h"

struct entry {
	struct entry *hnext;
	void *value;
	int holders;                /* readers, or -1 for an exclusive or write holder */
	struct event *wq, *wq_tail; /* events waiting, FIFO */
	alignas(16) unsigned char key[];
};

struct guard_rt {
	spinlock lock;
	int kind;
	unsigned key_size;
	size_t nbuckets, count;
	struct entry **buckets;
	void **items;               /* pool: free items (a stack) and all items ever added */
	size_t nitems, cap;
	struct event *wq, *wq_tail; /* pool: events waiting for an item */
};

struct acq {
	struct entry *e;            /* NULL for a pool */
	void *item;                 /* a pool item */
	int use;                    /* index in the node's uses */
	bool alias;                 /* same guard and key as the previous acquisition: shared */
};

struct event {
	struct event *next;         /* free list or guard wait queue */
	struct event *pending;      /* a detached node's splayed outputs, spawned on return */
	int node;
	unsigned char nacq, gi;     /* acquisitions computed, and taken so far */
	bool started, dropped;
	struct weft_flow_rt *rt;
	struct acq acq[WEFT_FLOW_MAX_GUARDS];
	/* the input record at IN_OFF, the output record at rt->out_off, preceded by a pointer
	 * back to the event (weft_flow_emit finds its event from the out pointer) */
};

#define IN_OFF ((sizeof(struct event) + 15) & ~(size_t)15)

struct nstat {
	_Atomic uint64_t events, errors;
	_Atomic uint64_t timed, ns;  /* runs timed, and their total time */
};

struct evcache {
	alignas(64) struct event *head;
	int n;
	atomic_long owed;           /* events freed here, not yet taken off in_flight */
};

struct weft_flow_rt {
	/* read by every event: written only when the flow starts, stops or is killed */
	weft_flow *f;
	size_t ev_size, out_off;
	struct guard_rt *guards;
	atomic_int running;
	atomic_bool stopping, killed;
	uint64_t sample_mask;       /* time runs whose per-worker count & mask is 0 */
	/* written by many workers: a cache line of its own, or every event's reads of the
	 * flags above would miss each time another worker changed the count */
	alignas(64) atomic_long in_flight;
	char pad[64 - sizeof(atomic_long)];
	weft_sem done;
	int nrows;                  /* workers, plus one row for other threads */
	struct nstat *stats;        /* nrows x nnodes */
	struct evcache *caches;     /* one per worker; kept from run to run */
	int ncaches;
	spinlock glock;             /* the global list of free events */
	struct event *global;
	atomic_int nglobal;         /* read without the lock as a hint */
};

static inline void *ev_in(struct event *ev)
{
	return (char *)ev + IN_OFF;
}

static inline void *ev_out(struct event *ev)
{
	return (char *)ev + ev->rt->out_off;
}

static inline const weft_flow_node *ev_node(struct event *ev)
{
	return &ev->rt->f->nodes[ev->node];
}

/* flow.c: the run-time state of f, created on first use (guards may be set before the flow
 * runs); NULL when out of memory. */
struct weft_flow_rt *flow_rt_get(weft_flow *f);

/* flow_guard.c. Compute ev's acquisitions (keys, entries, the order among uses of one guard);
 * 0 or -ENOMEM. Called once per event, before its first acquisition. */
int flow_guards_prepare(struct event *ev);
/* Take acquisition ev->gi, or queue ev on its guard: true when taken. */
bool flow_guard_take(struct event *ev);
/* Release every guard ev holds, in reverse order; returns the events that now have the guards
 * they waited for (linked by next), for the caller to spawn. */
struct event *flow_guards_release(struct event *ev);

#endif
