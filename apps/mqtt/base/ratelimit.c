/*
 * ratelimit.c - a generic cell rate algorithm (GCRA) cell per source address.
 *
 * Per address one number, `tat`: the time at which the address's debt is paid. An event moves
 * tat to max(tat, now) + interval. The address is over its limit while
 * tat - now > (burst - 1) * interval: `burst` events at once are allowed, then one per
 * interval, and the debt drains by itself with time (nothing needs a timer).
 *
 * Two ways to use a cell. rl_take admits an event within the limit or refuses it (the
 * acceptor's max_connection_rate). rl_reserve books the event's place in the schedule and says
 * how long until that place comes, so that events made at once are spread out one interval
 * apart, and refuses only when the schedule is booked further ahead than its caller allows
 * (pace.c makes a CONNECT's check wait for its place; rl_refund gives a place back). A cell
 * may carry a tag besides the address (pace.c: a hash of the username), so that (address,
 * name) pairs are counted apart from each other.
 *
 * Entries live in a fixed table of 1024 sets of 4 ways, indexed by a hash of the address mixed
 * with a random seed (so nobody can aim many addresses at one set), each set with its own lock:
 * memory stays fixed however many addresses come. An entry whose tat has passed is as good as
 * free; a full set gives up its entry with the smallest debt, so under a spread-out attack the
 * table forgets the least restricted addresses first. IPv6 addresses are keyed by their /64,
 * since one host usually owns a whole /64; IPv4-mapped IPv6 addresses by the IPv4 address.
 * Other families (unix sockets) are never limited.
 */
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include <weft.h>

#include "ratelimit.h"

#define SETS 1024
#define WAYS 4
#define KEY_LEN 24

typedef struct rl_ent {
	uint8_t key[KEY_LEN];       /* the address (addr_key), then the tag */
	int64_t tat;                /* 0: free */
} rl_ent;

typedef struct rl_group {
	weft_mutex lock;
	rl_ent e[WAYS];
} rl_group;

struct rl_table {
	_Atomic int burst;
	_Atomic int64_t interval;
	uint64_t seed;
	rl_group sets[SETS];
};

rl_table *rl_new(int burst, int64_t interval_ns)
{
	rl_table *t = calloc(1, sizeof *t);
	if (!t)
		return NULL;
	for (int i = 0; i < SETS; i++)
		weft_mutex_init(&t->sets[i].lock);
	if (getrandom(&t->seed, sizeof t->seed, 0) != sizeof t->seed)
		t->seed = (uint64_t)weft_now();
	t->seed |= 1;
	rl_set(t, burst, interval_ns);
	return t;
}

void rl_free(rl_table *t)
{
	free(t);
}

void rl_set(rl_table *t, int burst, int64_t interval_ns)
{
	atomic_store(&t->burst, burst < 0 ? 0 : burst);
	atomic_store(&t->interval, interval_ns > 0 ? interval_ns : 1);
}

void rl_reset(rl_table *t)
{
	for (int i = 0; i < SETS; i++)
		WEFT_WITH_LOCK(&t->sets[i].lock)
			memset(t->sets[i].e, 0, sizeof t->sets[i].e);
}

/* The key of an address and tag; false for families that are not limited (unix sockets). */
static bool addr_key(const struct sockaddr *sa, uint64_t tag, uint8_t key[KEY_LEN])
{
	memset(key, 0, KEY_LEN);
	memcpy(key + 16, &tag, 8);
	if (sa->sa_family == AF_INET) {
		key[10] = key[11] = 0xff;
		memcpy(key + 12, &((const struct sockaddr_in *)sa)->sin_addr, 4);
		return true;
	}
	if (sa->sa_family == AF_INET6) {
		const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
		memcpy(key, a, IN6_IS_ADDR_V4MAPPED(a) ? 16 : 8);
		return true;
	}
	return false;
}

static rl_group *set_of(rl_table *t, const uint8_t key[KEY_LEN])
{
	uint64_t a, b, c;
	memcpy(&a, key, 8);
	memcpy(&b, key + 8, 8);
	memcpy(&c, key + 16, 8);
	uint64_t h = (a ^ t->seed) * 0x9E3779B97F4A7C15ull;
	h = (h ^ (h >> 29) ^ b) * 0xBF58476D1CE4E5B9ull;
	h = (h ^ (h >> 31) ^ c) * 0x94D049BB133111EBull;
	h ^= h >> 32;
	return &t->sets[h % SETS];
}

/* The entry of key in s, or (make) NULL. Lock held. */
static rl_ent *lookup(rl_group *s, const uint8_t key[KEY_LEN], bool make, int64_t now)
{
	rl_ent *victim = &s->e[0];
	for (int i = 0; i < WAYS; i++) {
		rl_ent *e = &s->e[i];
		if (e->tat && !memcmp(e->key, key, KEY_LEN))
			return e;
		/* free or paid-off entries first, then the least indebted */
		int64_t vt = victim->tat > now ? victim->tat : 0;
		int64_t et = e->tat > now ? e->tat : 0;
		if (et < vt)
			victim = e;
	}
	if (!make)
		return NULL;
	memcpy(victim->key, key, KEY_LEN);
	victim->tat = 0;
	return victim;
}

enum { TAKE, RESERVE, REFUND, FORGET };

/* Do `op` on the cell of (from, tag) under its set's lock. TAKE returns 1 when the event was
 * over the limit (and not recorded); RESERVE records it and returns how long until its place,
 * or -1 (not recorded) when that is more than cap away; REFUND takes one
 * interval back; FORGET clears the cell. */
static int64_t cell(rl_table *t, const struct sockaddr *from, uint64_t tag, int64_t now, int op,
		    int64_t cap)
{
	int burst = atomic_load_explicit(&t->burst, memory_order_relaxed);
	uint8_t key[KEY_LEN];
	if (!burst || !from || !addr_key(from, tag, key))
		return 0;
	int64_t iv = atomic_load_explicit(&t->interval, memory_order_relaxed);
	int64_t free_ahead = (int64_t)(burst - 1) * iv; /* how far tat may be ahead, in limit */
	rl_group *s = set_of(t, key);
	int64_t r = 0;
	WEFT_WITH_LOCK(&s->lock) {
		rl_ent *e = lookup(s, key, op == TAKE || op == RESERVE, now);
		if (!e)
			break;
		int64_t base = e->tat > now ? e->tat : now;
		if (op == TAKE) {
			r = base - now > free_ahead;
			if (!r)
				e->tat = base + iv;
		} else if (op == RESERVE) {
			r = base - now - free_ahead;
			if (r > cap) {
				r = -1;
				break;
			}
			r = r < 0 ? 0 : r;
			e->tat = base + iv;
		} else if (op == REFUND) {
			e->tat = e->tat - iv > now ? e->tat - iv : 1; /* 1: paid off, still this key's */
		} else {
			e->tat = 0;
		}
	}
	return r;
}

bool rl_take(rl_table *t, const struct sockaddr *from, int64_t now)
{
	return !cell(t, from, 0, now, TAKE, 0);
}

int64_t rl_reserve(rl_table *t, const struct sockaddr *from, uint64_t tag, int64_t now,
		   int64_t cap)
{
	return cell(t, from, tag, now, RESERVE, cap);
}

void rl_refund(rl_table *t, const struct sockaddr *from, uint64_t tag, int64_t now, bool all)
{
	cell(t, from, tag, now, all ? FORGET : REFUND, 0);
}
