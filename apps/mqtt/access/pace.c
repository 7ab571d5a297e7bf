/*
 * pace.c - the pace of password checks: how long a CONNECT waits before its password is
 * checked, and when it is not checked at all (auth.h, "The pace of password checks").
 *
 * Two GCRA tables of ratelimit.c (which the acceptor's max_connection_rate uses too): one per
 * (source address, username), one per source address whatever the name. A CONNECT books a turn
 * in both; its password is checked when the later of the two comes. The schedule is booked at
 * most AUTH_MAX_WAIT ahead, and an attempt that would have to wait longer is answered "try
 * later" unchecked, so no number of parallel connections gets more checks than the pace.
 *
 * Rejected: refusing an address after `burst` failures, which lets a stranger behind the
 * same NAT, or on localhost, lock every user of the address out with five guesses; delaying
 * only the answers to wrong passwords, which tells a guesser with many connections the right
 * one by its speed; checking every attempt past AUTH_MAX_WAIT after AUTH_MAX_WAIT, which gives
 * N parallel connections N checks a name every 10 s.
 *
 * What is left is a choice between two things nobody can have together while someone at an
 * address floods a name (or many names) from there: a bounded number of checks, and a bounded
 * wait for a right password from that address (before its check, a right password looks like
 * any guess). Bounded checks win; the flood's neighbours are told to try later (not that their
 * password is wrong), and the schedule is free again AUTH_MAX_WAIT after the flood stops.
 * sshd's MaxStartups makes the same choice.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "auth.h"
#include "ratelimit.h"

static _Atomic(rl_table *) lim[2]; /* per (address, username) pair; per address */
enum { PAIRS, ADDRS };

/* The tables, made on first use: for pairs 5 at once then one every 2 s; for addresses four
 * times as many. */
static rl_table *limits(int which)
{
	rl_table *t = atomic_load_explicit(&lim[which], memory_order_acquire);
	if (t)
		return t;
	rl_table *n = which == PAIRS ? rl_new(5, 2000000000LL) : rl_new(20, 500000000LL);
	if (!n)
		abort();
	if (atomic_compare_exchange_strong(&lim[which], &t, n))
		return n;
	rl_free(n);
	return t;
}

void auth_set_limits(const auth_limits *l)
{
	rl_set(limits(PAIRS), l->burst, l->interval_ns);
	rl_set(limits(ADDRS), 4 * l->burst, l->interval_ns / 4);
}

void auth_limit_reset(void)
{
	rl_reset(limits(PAIRS));
	rl_reset(limits(ADDRS));
}

/* The pair's tag: FNV-1a of the username, 1 for none. Names that collide share a cell. */
static uint64_t name_tag(const auth_req *r)
{
	if (!r->user)
		return 1;
	uint64_t h = 14695981039346656037ull;
	for (size_t i = 0; i < r->user_len; i++)
		h = (h ^ (uint8_t)r->user[i]) * 1099511628211ull;
	return h | 2;
}

int auth_turn(const auth_req *r, int64_t *at)
{
	*at = r->now;
	if (!r->from)
		return 0;
	int64_t a = rl_reserve(limits(PAIRS), r->from, name_tag(r), r->now, AUTH_MAX_WAIT);
	if (a < 0)
		return -EBUSY;
	int64_t b = rl_reserve(limits(ADDRS), r->from, 0, r->now, AUTH_MAX_WAIT);
	if (b < 0) {
		rl_refund(limits(PAIRS), r->from, name_tag(r), r->now, false);
		return -EBUSY;
	}
	*at = r->now + (a > b ? a : b);
	return 0;
}

void auth_turn_refund(const auth_req *r)
{
	rl_refund(limits(PAIRS), r->from, name_tag(r), r->now, true);
	rl_refund(limits(ADDRS), r->from, 0, r->now, false);
}

void auth_turn_cancel(const auth_req *r)
{
	rl_refund(limits(PAIRS), r->from, name_tag(r), r->now, false);
	rl_refund(limits(ADDRS), r->from, 0, r->now, false);
}
