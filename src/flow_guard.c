/*
 * flow_guard.c - the guards of the flow run-time (flow.c runs the events; flow.h has the
 * records they share).
 *
 * Guards. A guard is a hash map from key (bytes, built from the input record by a generated
 * function) to an entry: the value, who holds it, and a FIFO of events waiting for it. A
 * node's guards are taken one after the other in the flow's global order (the compiler sorts
 * them: declaration order or `precedence`, then - for one guard used twice - by key), so no
 * cycle of waits can form. An event that cannot take a guard is queued on the entry and its
 * task simply ends: the event waits as data, holding no task and no worker. The node that
 * releases the guard hands it to the first waiter (exclusive and write modes), to every reader
 * at the head of the queue (readers share, but queue behind a waiting writer), or gives its
 * pool item to the first waiter directly; the woken events are handed back to flow.c, which
 * spawns them, and they go on taking their remaining guards. Each guard has one spinlock, held
 * only for the table operations. Entries live until the flow is released: a guard is for
 * long-lived state keyed by a small set of keys.
 *
 * A node's acquisitions are computed once per event (flow_guards_prepare): the key of each use,
 * its entry (created on first use), and, for uses of one guard, the order by key; a repeat of
 * the same guard and key is an alias of the first and takes nothing. A pool guard has no
 * entries: its free items are a stack, and its waiters a FIFO of its own.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "flow.h"

static uint64_t hash(const unsigned char *k, unsigned n)
{
	uint64_t h = 1469598103934665603ULL;
	for (unsigned i = 0; i < n; i++)
		h = (h ^ k[i]) * 1099511628211ULL;
	return h ^ (h >> 29);
}

static int grow(struct guard_rt *g)
{
	size_t nb = g->nbuckets ? g->nbuckets * 2 : 64;
	struct entry **b = calloc(nb, sizeof *b);
	if (!b)
		return -ENOMEM;
	for (size_t i = 0; i < g->nbuckets; i++)
		for (struct entry *e = g->buckets[i], *n; e; e = n) {
			n = e->hnext;
			size_t j = hash(e->key, g->key_size) & (nb - 1);
			e->hnext = b[j];
			b[j] = e;
		}
	free(g->buckets);
	g->buckets = b;
	g->nbuckets = nb;
	return 0;
}

/* The entry for key, created if missing. Guard lock held. */
static struct entry *lookup(struct guard_rt *g, const void *key)
{
	static const unsigned char none[1];
	if (!key) /* a guard without key: one entry */
		key = none;
	if (g->count >= g->nbuckets && grow(g) && !g->nbuckets)
		return NULL;
	size_t i = hash(key, g->key_size) & (g->nbuckets - 1);
	for (struct entry *e = g->buckets[i]; e; e = e->hnext)
		if (!memcmp(e->key, key, g->key_size))
			return e;
	struct entry *e = calloc(1, sizeof *e + g->key_size);
	if (!e)
		return NULL;
	memcpy(e->key, key, g->key_size);
	e->hnext = g->buckets[i];
	g->buckets[i] = e;
	g->count++;
	return e;
}

static void enqueue(struct event **head, struct event **tail, struct event *ev)
{
	ev->next = NULL;
	if (*tail)
		(*tail)->next = ev;
	else
		*head = ev;
	*tail = ev;
}

static int use_mode(struct event *ev, int i)
{
	return ev_node(ev)->uses[ev->acq[i].use].mode;
}

/* Take acquisition gi of ev, or queue ev on it: true when taken. */
bool flow_guard_take(struct event *ev)
{
	struct acq *a = &ev->acq[ev->gi];
	if (a->alias)
		return true;
	const weft_flow_use *u = &ev_node(ev)->uses[a->use];
	struct guard_rt *g = &ev->rt->guards[u->guard];
	bool ok;
	spin_lock(&g->lock);
	switch (u->mode) {
	case WEFT_FLOW_POOL:
		if ((ok = g->nitems > 0))
			a->item = g->items[--g->nitems];
		else
			enqueue(&g->wq, &g->wq_tail, ev);
		break;
	case WEFT_FLOW_READ:
		if ((ok = a->e->holders >= 0 && !a->e->wq))
			a->e->holders++;
		else
			enqueue(&a->e->wq, &a->e->wq_tail, ev);
		break;
	case WEFT_FLOW_FREE:
		ok = true;
		break;
	default: /* exclusive, write */
		if ((ok = a->e->holders == 0 && !a->e->wq))
			a->e->holders = -1;
		else
			enqueue(&a->e->wq, &a->e->wq_tail, ev);
		break;
	}
	spin_unlock(&g->lock);
	return ok;
}

/* Hand a free entry to the waiters at the head of its queue: one writer, or every reader up
 * to the next writer. The events granted are pushed on *woken. Guard lock held. */
static void grant(struct entry *e, struct event **woken)
{
	while (e->wq && e->holders >= 0) {
		struct event *w = e->wq;
		bool reader = use_mode(w, w->gi) == WEFT_FLOW_READ;
		if (!reader && e->holders > 0)
			break;
		e->wq = w->next;
		if (!e->wq)
			e->wq_tail = NULL;
		e->holders = reader ? e->holders + 1 : -1;
		w->gi++;
		w->next = *woken;
		*woken = w;
	}
}

static void release_one(struct event *ev, int i, struct event **woken)
{
	struct acq *a = &ev->acq[i];
	if (a->alias)
		return;
	int mode = use_mode(ev, i);
	if (mode == WEFT_FLOW_FREE)
		return;
	struct guard_rt *g = &ev->rt->guards[ev_node(ev)->uses[a->use].guard];
	spin_lock(&g->lock);
	if (mode == WEFT_FLOW_POOL) {
		struct event *w = g->wq;
		if (w) { /* the item goes straight to the first waiter */
			g->wq = w->next;
			if (!g->wq)
				g->wq_tail = NULL;
			w->acq[w->gi].item = a->item;
			w->gi++;
			w->next = *woken;
			*woken = w;
		} else {
			g->items[g->nitems++] = a->item;
		}
	} else {
		if (mode == WEFT_FLOW_READ)
			a->e->holders--;
		else
			a->e->holders = 0;
		grant(a->e, woken);
	}
	spin_unlock(&g->lock);
}

/* Release what ev holds, last taken first; the woken events go back to the caller. */
struct event *flow_guards_release(struct event *ev)
{
	struct event *woken = NULL;
	for (int i = ev->gi - 1; i >= 0; i--)
		release_one(ev, i, &woken);
	ev->gi = 0;
	return woken;
}

/* Compute ev's acquisitions: keys, entries, and the order among uses of one guard. */
int flow_guards_prepare(struct event *ev)
{
	const weft_flow_node *n = ev_node(ev);
	for (int i = 0; i < n->nuses; i++) {
		const weft_flow_use *u = &n->uses[i];
		struct guard_rt *g = &ev->rt->guards[u->guard];
		struct acq *a = &ev->acq[i];
		*a = (struct acq){ .use = i };
		if (u->mode == WEFT_FLOW_POOL)
			continue;
		unsigned char key[g->key_size + 1];
		memset(key, 0, sizeof key);
		if (u->key)
			u->key(ev_in(ev), key);
		spin_lock(&g->lock);
		a->e = lookup(g, key);
		spin_unlock(&g->lock);
		if (!a->e)
			return -ENOMEM;
	}
	/* uses of one guard are adjacent (the compiler sorted them): order them by key, and let
	 * a repeat of the same key share the first acquisition */
	for (int i = 1; i < n->nuses; i++)
		for (int j = i; j > 0; j--) {
			struct acq *p = &ev->acq[j - 1], *q = &ev->acq[j];
			if (n->uses[p->use].guard != n->uses[q->use].guard || !p->e)
				break;
			unsigned ks = ev->rt->guards[n->uses[p->use].guard].key_size;
			if (memcmp(p->e->key, q->e->key, ks) <= 0)
				break;
			struct acq t = *p;
			*p = *q;
			*q = t;
		}
	for (int i = 1; i < n->nuses; i++) {
		struct acq *p = &ev->acq[i - 1], *q = &ev->acq[i];
		q->alias = p->e && q->e == p->e;
	}
	ev->nacq = (unsigned char)n->nuses;
	return 0;
}

/* ---- set-up by the program -------------------------------------------------------------- */

int weft_flow_guard_set(weft_flow *f, int g, const void *key, void *value)
{
	if (!f || g < 0 || g >= f->nguards || f->guards[g].kind == WEFT_FLOW_POOL ||
	    (!key && f->guards[g].key_size))
		return -EINVAL;
	struct weft_flow_rt *rt = flow_rt_get(f);
	if (!rt)
		return -ENOMEM;
	struct guard_rt *gr = &rt->guards[g];
	spin_lock(&gr->lock);
	struct entry *e = lookup(gr, key);
	if (e)
		e->value = value;
	spin_unlock(&gr->lock);
	return e ? 0 : -ENOMEM;
}

int weft_flow_guard_add(weft_flow *f, int g, void *item)
{
	if (!f || g < 0 || g >= f->nguards || f->guards[g].kind != WEFT_FLOW_POOL)
		return -EINVAL;
	struct weft_flow_rt *rt = flow_rt_get(f);
	if (!rt)
		return -ENOMEM;
	struct guard_rt *gr = &rt->guards[g];
	int r = 0;
	spin_lock(&gr->lock);
	if (gr->nitems == gr->cap) {
		size_t cap = gr->cap ? gr->cap * 2 : 16;
		void **p = realloc(gr->items, cap * sizeof *p);
		if (p) {
			gr->items = p;
			gr->cap = cap;
		} else {
			r = -ENOMEM;
		}
	}
	if (!r)
		gr->items[gr->nitems++] = item;
	spin_unlock(&gr->lock);
	return r;
}
