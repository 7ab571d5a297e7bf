/* timer.c - the monotonic clock and the per-worker deadline heaps (see timer.h). */
#include "timer.h"

#include <errno.h>
#include <stdlib.h>
#include <time.h>

#include "weft.h"

int64_t weft_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void timer_heap_init(struct timer_heap *h)
{
	*h = (struct timer_heap){ .lock = SPIN_INIT, .first = INT64_MAX };
}

void timer_heap_destroy(struct timer_heap *h)
{
	free(h->a);
	h->a = NULL;
	h->n = h->cap = 0;
}

#define ARITY 4

static void place(struct timer_heap *h, int i, struct timer_slot e)
{
	h->a[i] = e;
	e.t->idx = i;
}

static void sift_up(struct timer_heap *h, int i)
{
	struct timer_slot e = h->a[i];
	while (i > 0) {
		int p = (i - 1) / ARITY;
		if (h->a[p].when <= e.when)
			break;
		place(h, i, h->a[p]);
		i = p;
	}
	place(h, i, e);
}

static void sift_down(struct timer_heap *h, int i)
{
	struct timer_slot e = h->a[i];
	for (;;) {
		int c = ARITY * i + 1, best = c;
		if (c >= h->n)
			break;
		for (int k = c + 1; k < c + ARITY && k < h->n; k++)
			if (h->a[k].when < h->a[best].when)
				best = k;
		if (e.when <= h->a[best].when)
			break;
		place(h, i, h->a[best]);
		i = best;
	}
	place(h, i, e);
}

static void publish_first(struct timer_heap *h)
{
	atomic_store_explicit(&h->first, h->n ? h->a[0].when : INT64_MAX, memory_order_release);
}

/* Remove the entry at i; lock held. */
static void remove_at(struct timer_heap *h, int i)
{
	h->a[i].t->idx = -1;
	if (--h->n > i) {
		struct timer *m = h->a[h->n].t;
		place(h, i, h->a[h->n]);
		sift_down(h, i);
		sift_up(h, m->idx);
	}
}

int timer_add(struct timer_heap *h, struct timer *t, int64_t when)
{
	spin_lock(&h->lock);
	if (h->n == h->cap) {
		int cap = h->cap ? 2 * h->cap : 64;
		struct timer_slot *a = realloc(h->a, (size_t)cap * sizeof *a);
		if (!a) {
			spin_unlock(&h->lock);
			return -ENOMEM;
		}
		h->a = a;
		h->cap = cap;
	}
	t->when = when;
	t->heap = h;
	place(h, h->n++, (struct timer_slot){ when, t });
	sift_up(h, t->idx);
	publish_first(h);
	spin_unlock(&h->lock);
	return 0;
}

void timer_del(struct timer *t)
{
	struct timer_heap *h = t->heap;
	if (!h)
		return;
	spin_lock(&h->lock);
	if (t->idx >= 0) {
		remove_at(h, t->idx);
		publish_first(h);
	}
	spin_unlock(&h->lock);
	t->heap = NULL;
}

int timer_expire(struct timer_heap *h, int64_t now, bool (*claim)(struct timer *),
		 void (*fire)(struct timer *))
{
	struct timer *list = NULL;
	int n = 0;
	spin_lock(&h->lock);
	while (h->n && h->a[0].when <= now) {
		struct timer *t = h->a[0].t;
		remove_at(h, 0);
		if (claim(t)) {
			t->fired = list;
			list = t;
		}
	}
	publish_first(h);
	spin_unlock(&h->lock);
	while (list) {
		struct timer *t = list;
		list = t->fired;
		fire(t);
		n++;
	}
	return n;
}
