/*
 * select.c - weft_select: wait on several channel operations at once (Go's selectgo).
 *
 * Lock every channel of the cases in address order (each once), pick uniformly at random among
 * the cases possible right now (reservoir sampling) and do it. If none is, queue one node per
 * case, all pointing to the one wait record, unlock and park. The first waker to claim the
 * record wins; the others fail to claim and drop their nodes. On waking, the select unlinks
 * its nodes still queued (taking each such channel's lock alone). A select cannot pair its own
 * send with its own receive: its nodes are queued only while it is parked, and a parked select
 * wakes nobody.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "chan.h"
#include "sched.h"
#include "wait.h"
#include "weft.h"

static __thread uint32_t sel_rng;

static uint32_t sel_random(void)
{
	uint32_t x = sel_rng;
	if (!x)
		x = (uint32_t)(uintptr_t)&x ^ (uint32_t)weft_now() ^ 0x9e3779b9u;
	x ^= x << 13;
	x ^= x >> 17;
	x ^= x << 5;
	return sel_rng = x ? x : 1;
}

/* The distinct channels of the cases, in address order: the order they are locked in. */
static int lock_order(const weft_select_case *k, int n, weft_chan **order)
{
	int m = 0;
	for (int i = 0; i < n; i++) {
		weft_chan *c = k[i].chan;
		if (!c)
			continue;
		int j = m;
		while (j > 0 && order[j - 1] > c)
			j--;
		if (j > 0 && order[j - 1] == c)
			continue;
		memmove(&order[j + 1], &order[j], (size_t)(m - j) * sizeof *order);
		order[j] = c;
		m++;
	}
	return m;
}

static void lock_all(weft_chan **order, int m)
{
	for (int i = 0; i < m; i++)
		chan_select_lock(order[i]);
}

static void unlock_all(weft_chan **order, int m)
{
	for (int i = m - 1; i >= 0; i--)
		chan_select_unlock(order[i]);
}

static int check_cases(const weft_select_case *k, int n)
{
	if (n < 0 || n > WEFT_SELECT_MAX || (n && !k))
		return -EINVAL;
	for (int i = 0; i < n; i++) {
		if (k[i].op != WEFT_SELECT_SEND && k[i].op != WEFT_SELECT_RECV)
			return -EINVAL;
		if (!k[i].buf && k[i].len)
			return -EINVAL;
		if (k[i].chan && k[i].op == WEFT_SELECT_SEND && k[i].len > chan_packet_size(k[i].chan))
			return -EMSGSIZE;
	}
	return 0;
}

/* Could case k be done right now? (All its channels are locked.) */
static bool case_ready(const weft_select_case *k)
{
	return chan_ready(k->chan, k->op == WEFT_SELECT_SEND);
}

/* Try case k; 1 when it was done (result stored), 0 when it must wait after all. */
static int case_try(weft_select_case *k, struct waiter **wk)
{
	int r = chan_try(k->chan, k->op == WEFT_SELECT_SEND, k->buf, k->len, wk);
	if (r == -EAGAIN)
		return 0;
	k->result = r;
	return 1;
}

/* One ready case chosen uniformly at random, or -1. */
static int pick_ready(const weft_select_case *k, int n)
{
	int pick = -1;
	uint32_t seen = 0;
	for (int i = 0; i < n; i++)
		if (k[i].chan && case_ready(&k[i]) && sel_random() % ++seen == 0)
			pick = i;
	return pick;
}

static int select_park(weft_select_case *k, int n, weft_chan **order, int m, int64_t deadline)
{
	struct waiter nodes[n ? n : 1];
	struct waiter *won = NULL;
	struct wait *w = wait_begin("select", k);
	for (int i = 0; i < n; i++) {
		nodes[i] = (struct waiter){ .w = w, .len = k[i].len, .won = &won, .c = k[i].chan };
		if (!k[i].chan)
			continue;
		if (k[i].op == WEFT_SELECT_SEND)
			nodes[i].src = k[i].packet;
		else
			nodes[i].dst = k[i].buf;
		chan_enqueue(k[i].chan, k[i].op == WEFT_SELECT_SEND, &nodes[i]);
	}
	unlock_all(order, m);
	int r = wait_park(w, deadline);
	for (int i = 0; i < n; i++)
		if (k[i].chan && &nodes[i] != won)
			chan_leave(&nodes[i], k[i].op == WEFT_SELECT_SEND);
	if (r != 0 && r != -EPIPE)
		return r;
	int i = (int)(won - nodes);
	k[i].result = r ? r : k[i].op == WEFT_SELECT_SEND ? 0 : (int)won->got;
	return i;
}

int weft_select(weft_select_case *k, int n, int64_t deadline)
{
	int r = check_cases(k, n);
	if (r)
		return r;
	weft_chan *order[WEFT_SELECT_MAX];
	int m = lock_order(k, n, order);
	lock_all(order, m);
	int i;
	while ((i = pick_ready(k, n)) >= 0) {
		struct waiter *wk = NULL;
		if (case_try(&k[i], &wk)) {
			unlock_all(order, m);
			if (wk)
				chan_wake(k[i].chan, wk, 0);
			if (k[i].result == -ENOMEM)
				return -ENOMEM;
			sched_slice(); /* as a send or receive that did not wait */
			return i;
		}
	}
	if ((r = chan_may_wait(deadline))) {
		unlock_all(order, m);
		return r;
	}
	return select_park(k, n, order, m, deadline);
}
