/*
 * timer.c - the monotonic clock and the per-worker timing wheels (see timer.h).
 *
 * Why a wheel. Timed waits come and go by the hundred thousand (10^5 tasks sleeping 1 ms in a
 * loop) and nearly all of them expire rather than being cancelled. A binary or 4-ary heap pays
 * O(log n) per pop, and each step of a sift moves an entry whose timer must learn its new
 * index: a cache miss on another task's record per level, most of the work at that size. A
 * hierarchical timing wheel (Varghese & Lauck; Linux's timer wheel, Netty, Tokio) does insert
 * and remove in O(1) and expires a whole slot at a time.
 *
 * The layout. Time is counted in ticks of 2^10 ns (about 1 us). There are WHEEL_LEVELS levels
 * of 64 slots; a slot of level L spans 64^L ticks, so level 0 covers the next 64 us, level 1
 * 4 ms, level 2 268 ms, level 3 17 s, ... and 9 levels of 6 bits cover all 53 bits of an
 * int64_t deadline's ticks: no overflow list. `elapsed` is the tick expiry has reached. An
 * entry of tick t sits on the level of the highest 6-bit group where t and elapsed differ, in
 * the slot that group names (Tokio's rule): so every entry of level L agrees with elapsed above
 * that group and lies after it, every entry on a lower level comes before every entry on a
 * higher one, and the earliest deadline is in the first occupied slot at or after elapsed on
 * the lowest occupied level - found with one count-trailing-zeros per level on a 64-bit
 * occupancy mask. A deadline already past is filed at elapsed, and fires at the next expiry.
 *
 * Exact deadlines. Ticks only choose slots; entries keep their deadline to the nanosecond, and
 * expiry fires an entry only once its own deadline has passed, never because its slot has
 * started: the level-0 slot of the current tick may be partly due, and its entries not yet due
 * stay in it. When expiry reaches an occupied slot of a higher level it fires the entries that
 * are already due and re-files the others relative to the slot's start (a cascade: each entry
 * moves down at most once per level, and a 1 ms sleep cascades at most once or twice). Under
 * load, when expiry runs late, most entries are due by the time their slot is reached and fire
 * straight from it: a cascade touches each timer it moves (a miss on a cold task record), so
 * skipping it is most of what a busy wheel saves. `first`, which the idle loop sleeps until,
 * is the `min` of the first occupied slot: each slot keeps the least deadline filed into it
 * (and a level-0 slot, once expiry has looked through it, that of the entries it kept), which
 * is the earliest deadline of the wheel, since every entry of a later slot lies after it. A
 * cancel leaves it be: then it is early, and the worker wakes once for nothing and corrects it.
 *
 * Slots are arrays of {deadline, timer}, not lists linked through the timers: filing appends
 * to a warm array and writes only the filing task's own timer, where linking would write the
 * previous head, another task's cold record; a cancelled entry is swapped with its slot's last
 * (one write to that entry's timer, on the rarer path). Expiry and cascades walk the array
 * and prefetch the timers a few entries ahead, since claiming or re-filing each is a miss.
 * Drained arrays above SMALL_CAP entries are freed, so a burst does not pin memory in every
 * slot it passed through.
 *
 * Costs: insert O(1) (an append; a realloc when a slot grows); cancel O(1); expiry O(1) per
 * fired timer plus O(1) per cascade step (at most WHEEL_LEVELS - 1 per timer, one in practice
 * for waits under 4 ms); finding the next slot is at most 9 mask tests. Memory: 14 KB of slot
 * headers per worker, plus 16 bytes per queued timer. A cascade that cannot grow a slot's
 * array aborts the program, as the global run queue does: the entries it holds have nowhere
 * else to go.
 *
 * Firing: claimed timers are handed to fire() in batches of TIMER_FIRE_BATCH, with the lock
 * dropped, while they are still in cache from being claimed; fire() makes a whole batch
 * runnable in one operation (sched_ready_batch). Dropping the lock part way through a slot is
 * safe because a slot is taken from its end, so the entries left keep their places for
 * timer_del, and the wheel notes the slot as `busy`: whoever expires next (this worker, or a
 * thief) finishes it first, before the lower-level slots its due-later entries went to, and
 * elapsed does not move past it meanwhile. A filing worker waits one batch at most.
 *
 * One call fires TIMER_EXPIRE_MAX timers at most (a run queue's worth) and leaves the rest due,
 * `first` still at or before them, for the worker's next look a few dozen switches later: when
 * 10^5 deadlines pass at once, expiring them all in one go would keep the worker from switching
 * for milliseconds (long enough for the monitor to take it for a stuck worker and start a
 * spare) only to push most of them to the global queue.
 */
#include "timer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "weft.h"

#define TICK_SHIFT 10
#define SMALL_CAP 512  /* a drained slot keeps an array up to this size for reuse */
#define PREFETCH 8     /* how far ahead expiry and cascades prefetch timers */

int64_t weft_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void timer_wheel_init(struct timer_wheel *h)
{
	*h = (struct timer_wheel){ .lock = SPIN_INIT, .first = INT64_MAX, .busy = -1 };
	for (int l = 0; l < WHEEL_LEVELS; l++)
		for (int s = 0; s < WHEEL_SLOTS; s++)
			h->slot[l][s].min = INT64_MAX;
	h->elapsed = (uint64_t)weft_now() >> TICK_SHIFT;
}

void timer_wheel_destroy(struct timer_wheel *h)
{
	for (int l = 0; l < WHEEL_LEVELS; l++)
		for (int s = 0; s < WHEEL_SLOTS; s++)
			free(h->slot[l][s].a);
	timer_wheel_init(h);
}

static uint64_t tick_of(int64_t when)
{
	return when < 0 ? 0 : (uint64_t)when >> TICK_SHIFT;
}

/* The level for tick t: that of the highest 6-bit group in which it differs from elapsed. */
static int level_of(uint64_t elapsed, uint64_t t)
{
	return (63 - __builtin_clzll((t ^ elapsed) | (WHEEL_SLOTS - 1))) / WHEEL_BITS;
}

/* First tick of slot s of level l, relative to elapsed. */
static uint64_t slot_start(const struct timer_wheel *h, int l, int s)
{
	int shift = WHEEL_BITS * (l + 1);
	uint64_t base = shift >= 64 ? 0 : h->elapsed >> shift << shift;
	return base | (uint64_t)s << (WHEEL_BITS * l);
}

static int grow(struct timer_slot *sl)
{
	int cap = sl->cap ? 2 * sl->cap : 8;
	struct timer_entry *a = realloc(sl->a, (size_t)cap * sizeof *a);
	if (!a)
		return -ENOMEM;
	sl->a = a;
	sl->cap = cap;
	return 0;
}

/* File e by its deadline relative to elapsed. Lock held. */
static int file(struct timer_wheel *h, struct timer_entry e)
{
	uint64_t t = tick_of(e.when);
	if (t < h->elapsed)
		t = h->elapsed;
	int l = level_of(h->elapsed, t), s = (int)(t >> (WHEEL_BITS * l)) & (WHEEL_SLOTS - 1);
	struct timer_slot *sl = &h->slot[l][s];
	if (sl->n == sl->cap && grow(sl) < 0)
		return -ENOMEM;
	e.t->idx = sl->n;
	e.t->slot = (uint16_t)(l * WHEEL_SLOTS + s);
	sl->a[sl->n++] = e;
	if (e.when < sl->min)
		sl->min = e.when;
	h->occupied[l] |= 1ULL << s;
	return 0;
}

/* The first occupied slot: false when the wheel is empty. */
static bool next_slot(const struct timer_wheel *h, int *lp, int *sp)
{
	for (int l = 0; l < WHEEL_LEVELS; l++) {
		int at = (int)(h->elapsed >> (WHEEL_BITS * l)) & (WHEEL_SLOTS - 1);
		uint64_t m = h->occupied[l] >> at;
		if (m) {
			*lp = l;
			*sp = at + __builtin_ctzll(m);
			return true;
		}
	}
	return false;
}

/* Recompute `first` (see the top of the file). Lock held. */
static void publish_first(struct timer_wheel *h)
{
	int l, s;
	int64_t first = h->n && next_slot(h, &l, &s) ? h->slot[l][s].min : INT64_MAX;
	atomic_store_explicit(&h->first, first, memory_order_release);
}

static void lower_first(struct timer_wheel *h, int64_t when)
{
	if (when < atomic_load_explicit(&h->first, memory_order_relaxed))
		atomic_store_explicit(&h->first, when, memory_order_release);
}

int timer_add(struct timer_wheel *h, struct timer *t, int64_t when)
{
	spin_lock(&h->lock);
	t->when = when;
	if (file(h, (struct timer_entry){ when, t }) < 0) {
		spin_unlock(&h->lock);
		return -ENOMEM;
	}
	t->wheel = h;
	h->n++;
	lower_first(h, when);
	spin_unlock(&h->lock);
	return 0;
}

static void slot_drained(struct timer_wheel *h, int l, int s)
{
	struct timer_slot *sl = &h->slot[l][s];
	h->occupied[l] &= ~(1ULL << s);
	sl->min = INT64_MAX;
	if (sl->cap > SMALL_CAP) {
		free(sl->a);
		*sl = (struct timer_slot){ .min = INT64_MAX };
	}
}

void timer_del(struct timer *t)
{
	struct timer_wheel *h = t->wheel;
	if (!h)
		return;
	spin_lock(&h->lock);
	if (t->idx >= 0) {
		int l = t->slot / WHEEL_SLOTS, s = t->slot % WHEEL_SLOTS;
		struct timer_slot *sl = &h->slot[l][s];
		if (--sl->n > t->idx) {
			sl->a[t->idx] = sl->a[sl->n];
			sl->a[t->idx].t->idx = t->idx;
		}
		t->idx = -1;
		if (sl->n == 0)
			slot_drained(h, l, s);
		/* `first` stays a valid lower bound; an early wake-up corrects it */
		if (--h->n == 0)
			atomic_store_explicit(&h->first, INT64_MAX, memory_order_release);
	}
	spin_unlock(&h->lock);
	t->wheel = NULL;
}

_Noreturn static void out_of_memory(void)
{
	static const char msg[] = "weft: out of memory cascading the timer wheel\n";
	if (write(2, msg, sizeof msg - 1) < 0) {
	}
	abort();
}

/* Take the due entries of slot s of level l into batch[*n..TIMER_FIRE_BATCH), claiming them,
 * until the batch is full. An entry not yet due moves: on level 0 (the current tick) to the
 * front of the slot, where it stays; on a higher level one level down at least, relative to
 * the slot's start, now elapsed (a cascade). Entries are taken from the end, so taking one
 * moves no other, and the rest stay where timer_del finds them while the lock is dropped to
 * fire a batch. A slot reached late, its entries already due, fires them with no cascade.
 * Lock held. */
static void take(struct timer_wheel *h, int l, int s, int64_t now,
		 bool (*claim)(struct timer *), struct timer **batch, int *n)
{
	struct timer_slot *sl = &h->slot[l][s];
	int keep = 0;
	int64_t min = INT64_MAX; /* of the entries kept */
	while (sl->n > keep && *n < TIMER_FIRE_BATCH) {
		int j = sl->n - 1;
		if (j - PREFETCH >= keep)
			__builtin_prefetch(sl->a[j - PREFETCH].t, 1);
		struct timer_entry e = sl->a[j];
		if (e.when <= now) {
			sl->n--;
			h->n--;
			e.t->idx = -1;
			if (claim(e.t))
				batch[(*n)++] = e.t;
		} else if (l > 0) {
			sl->n--;
			if (file(h, e) < 0) /* never into this slot: see level_of */
				out_of_memory();
		} else {
			if (j != keep) {
				sl->a[j] = sl->a[keep];
				sl->a[j].t->idx = j;
				sl->a[keep] = e;
				e.t->idx = keep;
			}
			keep++;
			if (e.when < min)
				min = e.when;
		}
	}
	if (!sl->n)
		slot_drained(h, l, s);
	else if (sl->n == keep) /* all looked at: what is left is exactly the kept */
		sl->min = min;
}

static bool take_lock(struct timer_wheel *h, bool try)
{
	if (try)
		return spin_trylock(&h->lock);
	spin_lock(&h->lock);
	return true;
}

/* Claimed timers are fired a batch at a time with the lock dropped, while the timers are still
 * in cache from claiming them, and so that filing on this wheel waits for one batch at most. */
int timer_expire(struct timer_wheel *h, int64_t now, bool try, bool (*claim)(struct timer *),
		 void (*fire)(struct timer **, int))
{
	struct timer *batch[TIMER_FIRE_BATCH];
	int n = 0, total = 0, l, s;
	if (!take_lock(h, try))
		return 0;
	uint64_t nowt = tick_of(now);
	for (;;) {
		if (h->busy >= 0) { /* left while a batch was fired: it comes first */
			l = h->busy / WHEEL_SLOTS;
			s = h->busy % WHEEL_SLOTS;
		} else {
			if (!h->n || !next_slot(h, &l, &s))
				break;
			uint64_t start = slot_start(h, l, s);
			if (start > nowt)
				break;
			h->elapsed = start;
		}
		take(h, l, s, now, claim, batch, &n);
		if (n < TIMER_FIRE_BATCH) { /* nothing due is left in the slot */
			h->busy = -1;
			if (l == 0 && h->slot[0][s].n)
				break; /* the rest of the current tick is not due yet */
			continue;
		}
		/* Its entries stay put until we are back, by whoever expires next: its slot is
		 * taken first, before the entries it has moved to lower levels, and elapsed does
		 * not move past it meanwhile. `first` is still a lower bound: entries only left
		 * or moved down with their deadlines. */
		h->busy = h->slot[l][s].n ? l * WHEEL_SLOTS + s : -1;
		spin_unlock(&h->lock);
		fire(batch, n);
		total += n;
		n = 0;
		if (total >= TIMER_EXPIRE_MAX || !take_lock(h, try))
			return total;
	}
	if (nowt > h->elapsed)
		h->elapsed = nowt;
	publish_first(h);
	spin_unlock(&h->lock);
	if (n)
		fire(batch, n);
	return total + n;
}
