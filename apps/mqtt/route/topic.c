/*
 * topic.c - the topic tree: subscriptions and retained messages.
 *
 * One node per topic level. Publishers match against the tree concurrently and without any
 * lock; subscribe, unsubscribe and retained-message changes take one writer mutex. What makes
 * lock-free reading safe:
 *
 *  - A node's children are an open-addressing hash table that only grows: the writer fills an
 *    empty slot with a release store, so a reader sees the new child whole or not at all.
 *    When the table is half full the writer builds a twice-larger copy, publishes it, and
 *    retires the old one through epoch.c. A node left with no subscription, no retained
 *    message and no children is unlinked (its slot becomes a tombstone that probes step over
 *    and inserts reuse) and retired the same way, and so on up the tree: filters that come
 *    and go (a topic per client) do not leave dead nodes behind.
 *  - A node's subscribers are an array that readers walk without a lock. A new subscriber
 *    is written into the spare room past the published count, which a release store then
 *    raises; a removed one's session pointer becomes NULL (a tombstone readers skip); changed
 *    options (a subscription replaced) are one 64-bit store of subscription id and options,
 *    so a reader sees the old or the new, never half of each, and never both or neither. The
 *    array is rebuilt (live entries copied, the old one retired) only when it is full or
 *    three quarters tombstones. Copying the whole array on every change, as this did first,
 *    made n subscribers of one filter cost O(n^2) bytes: 4,000 clients subscribing to the
 *    same 5 filters retired about 1 GB of arrays, which reached 640 MB of RSS before the
 *    reaper freed it (and glibc kept most of it); rebuilding on growth keeps it at O(n).
 *  - A node's child table shrinks too: when a removal leaves it less than an eighth full, it
 *    is rebuilt at the size its live children need, and dropped when none is left, so a
 *    level that once held 40,000 topics does not keep their slots.
 *  - Shared subscriptions ($share/group/filter) are groups hanging off the filter's node, each
 *    with its own member array (as above) and a round-robin counter. A message goes to one
 *    member that may read it (its ACL checked while picking). Rejected: picking first and
 *    checking after, which drops the message for the whole group when the pick may not.
 *
 * Matching walks level by level keeping the set of nodes reached so far (exact child, '+'
 * child; a '#' child contributes its subscribers at once), so a deep topic needs no
 * recursion. Topics starting with '$' do not match a leading wildcard. A session subscribed
 * through several matching filters gets one copy at the highest QoS with every subscription
 * id: matches are sorted by session and merged, but only when more than one node matched.
 *
 * Retained messages sit in the nodes too, changed and read under the writer mutex (sending
 * retained messages happens on subscribe, not on the publish path: retained.c). Lock order:
 * the writer mutex, then a session's lock.
 */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <weft.h>

#include "access.h"
#include "epoch.h"
#include "msg.h"
#include "records.h"
#include "retained.h"
#include "scratch.h"
#include "session.h"
#include "topic.h"

typedef struct sub {
	_Atomic(session *) s;     /* NULL: removed */
	_Atomic uint64_t how;     /* subscription id << 8 | options */
} sub;

typedef struct subarr {
	_Atomic uint32_t n;       /* entries published: readers see e[0..n) */
	uint32_t cap, live;       /* the writer's: room, and entries not removed */
	sub e[];
} subarr;

typedef struct group {
	atomic_uint rr;
	_Atomic(subarr *) members;
	uint16_t len;
	char name[];
} group;

typedef struct grparr {
	uint32_t n;
	group *g[];
} grparr;

struct tnode;
typedef struct ctab {
	uint32_t mask, count, used; /* slots: live children; live and tombstones */
	_Atomic(struct tnode *) slot[];
} ctab;

typedef struct tnode {
	struct tnode *parent;
	uint32_t hash;
	uint16_t len;
	_Atomic(ctab *) kids;
	_Atomic(subarr *) subs;
	_Atomic(grparr *) groups;
	msg *retained;
	char name[];
} tnode;

static tnode *root;
static weft_mutex wlock = WEFT_MUTEX_INIT;
static long nretained, nsubs, nnodes;
static long nbytes; /* held by the tree: nodes, tables, arrays, groups (topic_bytes) */

/* A removed child's slot: not empty (a probe goes on past it), never equal to a real node. */
static tnode tomb;
#define TOMB (&tomb)

static uint32_t hash(const char *s, size_t n)
{
	uint32_t h = 2166136261u;
	for (size_t i = 0; i < n; i++)
		h = (h ^ (uint8_t)s[i]) * 16777619u;
	return h;
}

static tnode *node_new(const char *name, uint16_t len, uint32_t h)
{
	tnode *n = calloc(1, sizeof *n + len + 1u);
	if (!n)
		abort();
	n->hash = h;
	n->len = len;
	memcpy(n->name, name, len);
	nnodes++;
	nbytes += (long)(sizeof *n + len + 1u);
	return n;
}

static void node_free(void *p)
{
	tnode *n = p;
	free(atomic_load_explicit(&n->kids, memory_order_relaxed));
	free(n);
}

/* Unlinked from the tree (writer lock held): freed once no reader can hold it. */
static void retire(void *p, size_t bytes, void (*fn)(void *))
{
	nbytes -= (long)bytes;
	epoch_retire(p, fn);
}

static size_t ctab_bytes(const ctab *t)
{
	return t ? sizeof *t + (t->mask + 1u) * sizeof(t->slot[0]) : 0;
}

long topic_bytes(void)
{
	long n = 0;
	WEFT_WITH_LOCK(&wlock)
		n = nbytes;
	return n;
}

long topic_node_count(void)
{
	long n = 0;
	WEFT_WITH_LOCK(&wlock)
		n = nnodes;
	return n;
}

void topic_init(void)
{
	root = node_new("", 0, 0);
}

static tnode *child(tnode *n, const char *s, uint16_t len, uint32_t h)
{
	ctab *t = atomic_load_explicit(&n->kids, memory_order_acquire);
	if (!t)
		return NULL;
	for (uint32_t i = h & t->mask;; i = (i + 1) & t->mask) {
		tnode *c = atomic_load_explicit(&t->slot[i], memory_order_acquire);
		if (!c)
			return NULL;
		if (c != TOMB && c->hash == h && c->len == len && !memcmp(c->name, s, len))
			return c;
	}
}

static ctab *ctab_new(uint32_t size)
{
	ctab *t = calloc(1, sizeof *t + size * sizeof(t->slot[0]));
	if (!t)
		abort();
	t->mask = size - 1;
	nbytes += (long)ctab_bytes(t);
	return t;
}

/* Put c in the first empty or tombstone slot of its probe (c is known to be absent). */
static void ctab_put(ctab *t, tnode *c)
{
	uint32_t i = c->hash & t->mask;
	tnode *x;
	while ((x = atomic_load_explicit(&t->slot[i], memory_order_relaxed)) && x != TOMB)
		i = (i + 1) & t->mask;
	atomic_store_explicit(&t->slot[i], c, memory_order_release);
	t->count++;
	if (!x)
		t->used++;
}

/* Replace n's table t (may be NULL) by one with room for `want` children, tombstones dropped:
 * four slots per child, so that it is a quarter full (and half full before the next rebuild).
 * want 0: no table at all. Writer lock held. */
static ctab *ctab_rebuild(tnode *n, ctab *t, uint32_t want)
{
	ctab *nt = NULL;
	if (want) {
		uint32_t size = 4;
		while (size < want * 4)
			size *= 2;
		nt = ctab_new(size);
		for (uint32_t i = 0; t && i <= t->mask; i++) {
			tnode *x = atomic_load_explicit(&t->slot[i], memory_order_relaxed);
			if (x && x != TOMB)
				ctab_put(nt, x);
		}
	}
	atomic_store_explicit(&n->kids, nt, memory_order_release);
	if (t)
		retire(t, ctab_bytes(t), free);
	return nt;
}

/* The child named s, created if missing. Writer lock held. */
static tnode *child_make(tnode *n, const char *s, uint16_t len)
{
	uint32_t h = hash(s, len);
	tnode *c = child(n, s, len, h);
	if (c)
		return c;
	c = node_new(s, len, h);
	c->parent = n;
	ctab *t = atomic_load_explicit(&n->kids, memory_order_relaxed);
	if (!t || (t->used + 1) * 2 > t->mask + 1)
		t = ctab_rebuild(n, t, t ? t->count + 1 : 1);
	ctab_put(t, c);
	return c;
}

static bool node_empty(tnode *n)
{
	ctab *t = atomic_load_explicit(&n->kids, memory_order_relaxed);
	return (!t || !t->count) && !n->retained &&
	       !atomic_load_explicit(&n->subs, memory_order_relaxed) &&
	       !atomic_load_explicit(&n->groups, memory_order_relaxed);
}

/* Unlink n and its ancestors while they are empty. Writer lock held. */
static void prune(tnode *n)
{
	while (n && n != root && node_empty(n)) {
		tnode *p = n->parent;
		ctab *t = atomic_load_explicit(&p->kids, memory_order_relaxed);
		for (uint32_t i = n->hash & t->mask;; i = (i + 1) & t->mask)
			if (atomic_load_explicit(&t->slot[i], memory_order_relaxed) == n) {
				atomic_store_explicit(&t->slot[i], TOMB, memory_order_release);
				break;
			}
		t->count--;
		if (!t->count || (t->mask + 1 > 8 && t->count * 8 < t->mask + 1))
			ctab_rebuild(p, t, t->count); /* mostly empty: shrink it */
		nnodes--;
		retire(n, sizeof *n + n->len + 1u + ctab_bytes(atomic_load_explicit(
								&n->kids, memory_order_relaxed)),
		       node_free);
		n = p;
	}
}

/* Split off the level of s[*pos..len): its start and length; advances *pos past the '/'. */
static const char *level(const char *s, uint16_t len, uint32_t *pos, uint16_t *n)
{
	const char *p = s + *pos;
	const char *slash = memchr(p, '/', len - *pos);
	*n = (uint16_t)(slash ? slash - p : s + len - p);
	*pos += *n + 1u;
	return p;
}

/* The node of a topic or filter, created along the way. Writer lock held. */
static tnode *path_make(const char *s, uint16_t len)
{
	tnode *n = root;
	uint32_t pos = 0;
	while (pos <= len) {
		uint16_t k;
		const char *l = level(s, len, &pos, &k);
		n = child_make(n, l, k);
	}
	return n;
}

static tnode *path_find(const char *s, uint16_t len)
{
	tnode *n = root;
	uint32_t pos = 0;
	while (n && pos <= len) {
		uint16_t k;
		const char *l = level(s, len, &pos, &k);
		n = child(n, l, k, hash(l, k));
	}
	return n;
}

/* ---- subscriber arrays (writer lock held) ------------------------------------------------ */

static size_t subarr_bytes(const subarr *a)
{
	return a ? sizeof *a + a->cap * sizeof(sub) : 0;
}

static uint64_t sub_how(uint32_t subid, uint8_t opts)
{
	return (uint64_t)subid << 8 | opts;
}

/* Publish a copy of a's live entries with room for `cap` (0: no array), and retire a. */
static subarr *subarr_rebuild(_Atomic(subarr *) *slot, subarr *a, uint32_t cap)
{
	subarr *b = NULL;
	if (cap) {
		b = malloc(sizeof *b + cap * sizeof(sub));
		if (!b)
			abort();
		b->cap = cap;
		b->live = 0;
		uint32_t n = a ? atomic_load_explicit(&a->n, memory_order_relaxed) : 0;
		for (uint32_t i = 0; i < n; i++) {
			session *x = atomic_load_explicit(&a->e[i].s, memory_order_relaxed);
			if (!x)
				continue;
			atomic_init(&b->e[b->live].s, x);
			atomic_init(&b->e[b->live].how,
				    atomic_load_explicit(&a->e[i].how, memory_order_relaxed));
			b->live++;
		}
		atomic_init(&b->n, b->live);
		nbytes += (long)subarr_bytes(b);
	}
	atomic_store_explicit(slot, b, memory_order_release);
	if (a)
		retire(a, subarr_bytes(a), free);
	return b;
}

/* s's entry in a, or NULL. */
static sub *subarr_find(subarr *a, session *s)
{
	uint32_t n = a ? atomic_load_explicit(&a->n, memory_order_relaxed) : 0;
	for (uint32_t i = 0; i < n; i++)
		if (atomic_load_explicit(&a->e[i].s, memory_order_relaxed) == s)
			return &a->e[i];
	return NULL;
}

/* Add s's subscription to the array in slot, or change its options; 1 if it was there. */
static int subs_put(_Atomic(subarr *) *slot, session *s, uint32_t subid, uint8_t opts)
{
	subarr *a = atomic_load_explicit(slot, memory_order_relaxed);
	sub *e = subarr_find(a, s);
	if (e) {
		atomic_store_explicit(&e->how, sub_how(subid, opts), memory_order_relaxed);
		return 1;
	}
	uint32_t n = a ? atomic_load_explicit(&a->n, memory_order_relaxed) : 0;
	if (!a || n == a->cap)
		a = subarr_rebuild(slot, a, a && a->live >= 2 ? a->live * 2 : 4);
	n = atomic_load_explicit(&a->n, memory_order_relaxed);
	atomic_store_explicit(&a->e[n].s, s, memory_order_relaxed);
	atomic_store_explicit(&a->e[n].how, sub_how(subid, opts), memory_order_relaxed);
	a->live++;
	atomic_store_explicit(&a->n, n + 1, memory_order_release); /* the entry, whole */
	return 0;
}

/* Remove s's subscription from the array in slot; 1 if it was there. */
static int subs_del(_Atomic(subarr *) *slot, session *s)
{
	subarr *a = atomic_load_explicit(slot, memory_order_relaxed);
	sub *e = subarr_find(a, s);
	if (!e)
		return 0;
	atomic_store_explicit(&e->s, NULL, memory_order_relaxed);
	a->live--;
	uint32_t n = atomic_load_explicit(&a->n, memory_order_relaxed);
	if (!a->live)
		subarr_rebuild(slot, a, 0);
	else if (n >= 16 && a->live * 4 <= n) /* mostly tombstones: compact */
		subarr_rebuild(slot, a, a->live * 2);
	return 1;
}

static void group_free(void *p)
{
	group *g = p;
	free(atomic_load_explicit(&g->members, memory_order_relaxed));
	free(g);
}

/* Split "$share/group/filter": returns the filter part and sets the group, or NULL group.
 * The filter was checked (mq_topic_filter_check); one without its filter part is taken as it
 * is, not shared, rather than read past. */
static const char *share_split(const char *f, uint16_t *len, const char **g, uint16_t *glen)
{
	*g = NULL;
	if (*len < 7 || memcmp(f, "$share/", 7))
		return f;
	const char *name = f + 7;
	const char *slash = memchr(name, '/', *len - 7u);
	if (!slash)
		return f;
	*g = name;
	*glen = (uint16_t)(slash - name);
	*len = (uint16_t)(*len - (slash + 1 - f));
	return slash + 1;
}

static group *group_find(tnode *n, const char *g, uint16_t glen, int make)
{
	grparr *a = atomic_load_explicit(&n->groups, memory_order_relaxed);
	for (uint32_t i = 0; a && i < a->n; i++)
		if (a->g[i]->len == glen && !memcmp(a->g[i]->name, g, glen))
			return a->g[i];
	if (!make)
		return NULL;
	group *x = calloc(1, sizeof *x + glen);
	if (!x)
		abort();
	x->len = glen;
	memcpy(x->name, g, glen);
	uint32_t k = a ? a->n : 0;
	grparr *b = malloc(sizeof *b + (k + 1) * sizeof(group *));
	if (!b)
		abort();
	b->n = k + 1;
	for (uint32_t i = 0; i < k; i++)
		b->g[i] = a->g[i];
	b->g[k] = x;
	nbytes += (long)(sizeof *x + glen + sizeof *b + (k + 1) * sizeof(group *));
	atomic_store_explicit(&n->groups, b, memory_order_release);
	if (a)
		retire(a, sizeof *a + k * sizeof(group *), free);
	return x;
}

static void group_drop_if_empty(tnode *n, group *x)
{
	if (atomic_load_explicit(&x->members, memory_order_relaxed))
		return;
	grparr *a = atomic_load_explicit(&n->groups, memory_order_relaxed);
	grparr *b = NULL;
	if (a->n > 1) {
		b = malloc(sizeof *b + (a->n - 1) * sizeof(group *));
		if (!b)
			abort();
		b->n = 0;
		for (uint32_t i = 0; i < a->n; i++)
			if (a->g[i] != x)
				b->g[b->n++] = a->g[i];
		nbytes += (long)(sizeof *b + b->n * sizeof(group *));
	}
	atomic_store_explicit(&n->groups, b, memory_order_release);
	retire(a, sizeof *a + a->n * sizeof(group *), free);
	retire(x, sizeof *x + x->len, group_free);
}

int topic_subscribe(session *s, const char *f, uint16_t len, uint8_t opts, uint32_t subid)
{
	const char *g;
	uint16_t glen = 0;
	f = share_split(f, &len, &g, &glen);
	int found = 0;
	WEFT_WITH_LOCK(&wlock) {
		tnode *n = path_make(f, len);
		_Atomic(subarr *) *slot = &n->subs;
		if (g)
			slot = &group_find(n, g, glen, 1)->members;
		found = subs_put(slot, s, subid, opts);
		if (!found)
			nsubs++;
	}
	return found;
}

int topic_unsubscribe(session *s, const char *f, uint16_t len)
{
	const char *g;
	uint16_t glen = 0;
	f = share_split(f, &len, &g, &glen);
	int found = 0;
	WEFT_WITH_LOCK(&wlock) {
		tnode *n = path_find(f, len);
		if (!n)
			break;
		group *x = g ? group_find(n, g, glen, 0) : NULL;
		if (g && !x)
			break;
		found = subs_del(x ? &x->members : &n->subs, s);
		if (found) {
			nsubs--;
			if (x)
				group_drop_if_empty(n, x);
			prune(n);
		}
	}
	return found;
}

long topic_sub_count(void)
{
	long n = 0;
	WEFT_WITH_LOCK(&wlock)
		n = nsubs;
	return n;
}

/* ---- matching ------------------------------------------------------------------------------- */

typedef struct hit {
	session *s;
	uint32_t subid;
	uint8_t opts;
	uint8_t shared;   /* a group's pick: its read access already checked */
} hit;

static void add_subs(tnode *n, const msg *m, session *from, scratch_buf *out, int *nodes)
{
	subarr *a = atomic_load_explicit(&n->subs, memory_order_acquire);
	grparr *ga = atomic_load_explicit(&n->groups, memory_order_acquire);
	uint32_t k = a ? atomic_load_explicit(&a->n, memory_order_acquire) : 0;
	if (k) {
		hit *h = scratch_grow(out, sizeof(hit), out->n + k);
		for (uint32_t i = 0; i < k; i++) {
			session *s = atomic_load_explicit(&a->e[i].s, memory_order_relaxed);
			uint64_t how = atomic_load_explicit(&a->e[i].how, memory_order_relaxed);
			if (!s || ((how & SUB_NL) && s == from))
				continue;
			h[out->n++] = (hit){ s, (uint32_t)(how >> 8), (uint8_t)how, 0 };
		}
		(*nodes)++;
	}
	for (uint32_t i = 0; ga && i < ga->n; i++) {
		group *g = ga->g[i];
		subarr *mb = atomic_load_explicit(&g->members, memory_order_acquire);
		k = mb ? atomic_load_explicit(&mb->n, memory_order_acquire) : 0;
		if (!k)
			continue;
		/* one member per message, round robin, preferring members that are online, among
		 * those that may read it */
		uint32_t start = atomic_fetch_add_explicit(&g->rr, 1, memory_order_relaxed);
		session *pick = NULL;
		uint64_t how = 0;
		for (uint32_t j = 0; j < k; j++) {
			const sub *e = &mb->e[(start + j) % k];
			session *s = atomic_load_explicit(&e->s, memory_order_relaxed);
			if (!s || (pick && !atomic_load_explicit(&s->online, memory_order_relaxed)) ||
			    !access_read(s, m))
				continue;
			pick = s;
			how = atomic_load_explicit(&e->how, memory_order_relaxed);
			if (atomic_load_explicit(&s->online, memory_order_relaxed))
				break;
		}
		if (!pick)
			continue;
		hit *h = scratch_grow(out, sizeof(hit), out->n + 1);
		h[out->n++] = (hit){ pick, (uint32_t)(how >> 8), (uint8_t)how, 1 };
	}
}

static int hit_cmp(const void *a, const void *b)
{
	const hit *x = a, *y = b;
	if (x->shared != y->shared)
		return x->shared - y->shared;
	return x->s < y->s ? -1 : x->s > y->s;
}

static void push_node(scratch_buf *b, tnode *n)
{
	tnode **v = scratch_grow(b, sizeof(tnode *), b->n + 1);
	v[b->n++] = n;
}

/* Find every subscription matching topic into out (hits). Returns the nodes that matched. */
static int match(const msg *m, session *from, scratch_buf *out, scratch_buf *front,
		 scratch_buf *next)
{
	const char *topic = m->topic;
	uint16_t len = m->topic_len;
	/* per call, not a lazily set static: publishers match concurrently (a race TSan caught) */
	const uint32_t hplus = hash("+", 1), hhash = hash("#", 1);
	int nodes = 0;
	int dollar = len && topic[0] == '$';
	out->n = front->n = 0;
	push_node(front, root);
	uint32_t pos = 0;
	for (int depth = 0; pos <= len && front->n; depth++) {
		uint16_t k;
		const char *l = level(topic, len, &pos, &k);
		uint32_t h = hash(l, k);
		next->n = 0;
		for (uint32_t i = 0; i < front->n; i++) {
			tnode *n = ((tnode **)front->v)[i];
			if (!(depth == 0 && dollar)) {
				tnode *w = child(n, "#", 1, hhash);
				if (w)
					add_subs(w, m, from, out, &nodes);
				w = child(n, "+", 1, hplus);
				if (w)
					push_node(next, w);
			}
			tnode *c = child(n, l, k, h);
			if (c)
				push_node(next, c);
		}
		scratch_buf t = *front;
		*front = *next;
		*next = t;
	}
	for (uint32_t i = 0; i < front->n; i++) {
		tnode *n = ((tnode **)front->v)[i];
		add_subs(n, m, from, out, &nodes);
		tnode *w = child(n, "#", 1, hhash); /* "a/#" matches "a" */
		if (w)
			add_subs(w, m, from, out, &nodes);
	}
	return nodes;
}

int topic_publish(msg *m, session *from, conn *by)
{
	scratch_buf lm = { 0 }, lf = { 0 }, ln = { 0 };
	epoch_reader local;
	scratch_buf *out = by ? &by->match : &lm, *front = by ? &by->front : &lf,
		  *next = by ? &by->front_next : &ln;
	if (!by) {
		epoch_register(&local);
		epoch_enter(&local);
	}
	int nodes = match(m, from, out, front, next);
	hit *h = out->v;
	uint32_t n = out->n;
	if (nodes > 1)
		qsort(h, n, sizeof *h, hit_cmp);
	int sent = 0;
	for (uint32_t i = 0; i < n;) {
		/* merge the run of one session's non-shared hits */
		uint32_t j = i + 1;
		int qos = h[i].opts & 3, rap = h[i].opts & SUB_RAP;
		uint32_t ids[4];
		int nids = 0;
		if (h[i].subid)
			ids[nids++] = h[i].subid;
		while (nodes > 1 && !h[i].shared && j < n && !h[j].shared && h[j].s == h[i].s) {
			if ((h[j].opts & 3) > qos)
				qos = h[j].opts & 3;
			rap |= h[j].opts & SUB_RAP;
			if (h[j].subid && nids < 4)
				ids[nids++] = h[j].subid;
			j++;
		}
		if (qos > m->qos)
			qos = m->qos;
		if (h[i].shared || access_read(h[i].s, m)) {
			session_deliver(h[i].s, m, qos, rap ? m->retain : 0, ids, nids, by);
			sent++;
		}
		i = j;
	}
	if (!by) {
		epoch_leave(&local);
		epoch_unregister(&local);
		free(lm.v);
		free(lf.v);
		free(ln.v);
	}
	return sent;
}

/* ---- retained messages ---------------------------------------------------------------------- */

void topic_retain(msg *m)
{
	WEFT_WITH_LOCK(&wlock) {
		tnode *n = m->payload_len ? path_make(m->topic, m->topic_len)
					  : path_find(m->topic, m->topic_len);
		if (!n)
			break;
		msg *old = n->retained;
		n->retained = m->payload_len ? msg_ref(m) : NULL;
		nretained += (n->retained != NULL) - (old != NULL);
		msg_unref(old);
		prune(n);
	}
}

long topic_retained_count(void)
{
	long n = 0;
	WEFT_WITH_LOCK(&wlock)
		n = nretained;
	return n;
}

typedef struct walk {
	tnode *n;
	uint32_t pos;  /* filter position of the level to match next */
	int depth;
	int all;       /* collect the whole subtree ('#') */
} walk;

/* Where retained_match puts what it finds: references in out, or (out NULL) their cost
 * summed, the walk ending once it passes limit. */
typedef struct found {
	scratch_buf *out;
	uint64_t cost, limit;
} found;

static void collect(tnode *n, found *to)
{
	if (!n->retained)
		return;
	if (!to->out) {
		to->cost += retained_cost(n->retained);
		return;
	}
	msg **v = scratch_grow(to->out, sizeof(msg *), to->out->n + 1);
	v[to->out->n++] = msg_ref(n->retained);
}

/* Every retained message under a filter. Writer lock held. Iterative: topics may be deep. */
static void retained_match(const char *f, uint16_t len, found *out, scratch_buf *stack)
{
	walk *w = scratch_grow(stack, sizeof(walk), 1);
	w[0] = (walk){ root, 0, 0, 0 };
	stack->n = 1;
	while (stack->n && (out->out || out->cost <= out->limit)) {
		walk x = ((walk *)stack->v)[--stack->n];
		ctab *t = atomic_load_explicit(&x.n->kids, memory_order_relaxed);
		if (x.all) {
			collect(x.n, out);
			for (uint32_t i = 0; t && i <= t->mask; i++) {
				tnode *c = atomic_load_explicit(&t->slot[i], memory_order_relaxed);
				if (!c || c == TOMB || (x.depth == 0 && c->len && c->name[0] == '$'))
					continue;
				w = scratch_grow(stack, sizeof(walk), stack->n + 1);
				w[stack->n++] = (walk){ c, 0, x.depth + 1, 1 };
			}
			continue;
		}
		if (x.pos > len) {
			collect(x.n, out);
			continue;
		}
		uint32_t pos = x.pos;
		uint16_t k;
		const char *l = level(f, len, &pos, &k);
		if (k == 1 && l[0] == '#') {
			x.all = 1;
			if (x.depth == 0) { /* "#" at the top: not the node itself, not $ topics */
				for (uint32_t i = 0; t && i <= t->mask; i++) {
					tnode *c = atomic_load_explicit(&t->slot[i], memory_order_relaxed);
					if (!c || c == TOMB || (c->len && c->name[0] == '$'))
						continue;
					w = scratch_grow(stack, sizeof(walk), stack->n + 1);
					w[stack->n++] = (walk){ c, 0, 1, 1 };
				}
				continue;
			}
			w = scratch_grow(stack, sizeof(walk), stack->n + 1);
			w[stack->n++] = x;
		} else if (k == 1 && l[0] == '+') {
			for (uint32_t i = 0; t && i <= t->mask; i++) {
				tnode *c = atomic_load_explicit(&t->slot[i], memory_order_relaxed);
				if (!c || c == TOMB || (x.depth == 0 && c->len && c->name[0] == '$'))
					continue;
				w = scratch_grow(stack, sizeof(walk), stack->n + 1);
				w[stack->n++] = (walk){ c, pos, x.depth + 1, 0 };
			}
		} else {
			tnode *c = child(x.n, l, k, hash(l, k));
			if (c) {
				w = scratch_grow(stack, sizeof(walk), stack->n + 1);
				w[stack->n++] = (walk){ c, pos, x.depth + 1, 0 };
			}
		}
	}
}

/* The snapshot of the backlog (retained.c), and s's lock taken before the tree's is let go:
 * a retained message changed after the snapshot is delivered live after the backlog is in
 * place, and so never overtaken by the older one (retained_overtake). */
void topic_send_retained(session *s, const char *f, uint16_t len, int max_qos, uint32_t subid,
			 uint64_t reserved, conn *by)
{
	scratch_buf out = { 0 }, stack = { 0 };
	found to = { &out, 0, 0 };
	weft_mutex_lock(&wlock);
	retained_match(f, len, &to, &stack);
	weft_mutex_lock(&s->lock);
	weft_mutex_unlock(&wlock);
	free(stack.v);
	session_retained(s, f, len, out.v, out.n, max_qos, subid, reserved, by);
}

uint64_t topic_retained_cost(const char *f, uint16_t len, uint64_t limit)
{
	scratch_buf stack = { 0 };
	found to = { NULL, 0, limit };
	WEFT_WITH_LOCK(&wlock)
		retained_match(f, len, &to, &stack);
	free(stack.v);
	return to.cost;
}

uint32_t topic_hash(const char *s, size_t n)
{
	return hash(s, n);
}

/* Free the whole tree (at exit, after every task that reads it has ended). */
void topic_free_all(void)
{
	scratch_buf stack = { 0 };
	tnode **v = scratch_grow(&stack, sizeof(tnode *), 1);
	v[0] = root;
	stack.n = 1;
	while (stack.n) {
		tnode *n = ((tnode **)stack.v)[--stack.n];
		ctab *t = atomic_load_explicit(&n->kids, memory_order_relaxed);
		for (uint32_t i = 0; t && i <= t->mask; i++) {
			tnode *c = atomic_load_explicit(&t->slot[i], memory_order_relaxed);
			if (c && c != TOMB) {
				v = scratch_grow(&stack, sizeof(tnode *), stack.n + 1);
				v[stack.n++] = c;
			}
		}
		free(t);
		free(atomic_load_explicit(&n->subs, memory_order_relaxed));
		grparr *ga = atomic_load_explicit(&n->groups, memory_order_relaxed);
		for (uint32_t i = 0; ga && i < ga->n; i++)
			group_free(ga->g[i]);
		free(ga);
		msg_unref(n->retained);
		free(n);
	}
	free(stack.v);
	root = NULL;
	nnodes = 0;
	nbytes = 0;
}
