/*
 * pool.c - per-worker free lists for messages and buffers.
 *
 * Why: with every message allocated and freed through a shared heap, the publishers queue on
 * the heap's mutex. Here each weft worker
 * keeps a free list per size class (powers of two from 64 bytes to 64 KiB), used with no lock
 * at all: a task only touches the list of the worker it runs on, between two points where it
 * cannot be moved (nothing blocks in pool_alloc or pool_free). A block freed on another worker
 * than the one that allocated it simply joins that worker's list. Each list is capped (about
 * 256 KiB per class per worker); beyond the cap, and for larger sizes or callers that are not
 * weft workers, blocks go to malloc and free.
 *
 * Giving memory back (pool_trim, from the broker's reaper). A list also keeps its low-water
 * mark: the fewest blocks it held since the last trim. Those blocks sat unused through the
 * whole interval, so when the reaper moves the trim generation on, each worker frees them at
 * its next pool call (only the owner touches its lists, so the reaper cannot do it itself):
 * a list shrinks to what its worker's traffic actually cycles through. A worker that makes no
 * pool call at all keeps its lists, within the caps. Then malloc_trim: glibc returns the top
 * of a heap by itself, but free chunks below a live one stay resident until malloc_trim
 * releases their pages, and after a load that left (thousands of clients, a tree of topics)
 * that was most of the RSS. But a trim walks every arena's free chunks under the arena's
 * lock, and each page-sized run in them costs an madvise, whether its pages were given back
 * already or not: with tens of MB free a trim takes milliseconds, during which a worker that
 * calls malloc waits. So the broker trims when a load has left, not
 * while one runs: only when malloc holds TRIM_SLACK free, and while the broker is quiet
 * (fewer than TRIM_BUSY packets in the last second; busy, memory freed is soon used again)
 * at once when TRIM_SLACK has been freed since the last trim, else every TRIM_AGAIN, doubled
 * after each trim that gave back less than 1 MB, up to TRIM_MAX. "Freed" is what malloc had
 * in use at its peak since the last trim (sampled each second) less what it has now, or the
 * growth of its free space, whichever is more; its free space alone does not say whether
 * the pages are resident (after a trim most are not; memory reused and freed again is).
 * A broker that is never quiet still trims once 64 MB have been freed.
 *
 * One malloc arena (pool_malloc_setup, M_ARENA_MAX 1, before the workers start): malloc_trim
 * gives back the free chunks of every arena, but the top chunk of the main arena only. With an
 * arena per worker thread, each one's top chunk keeps what the load last freed there until a
 * large enough free happens to trim it. The publish path allocates from the pools, and small
 * blocks come from glibc's per-thread cache without the arena's lock, so one arena costs the
 * broker no CPU per message or per connection (docs/weft-mqtt.md, Memory). Rejected: a lower
 * M_TRIM_THRESHOLD (trims a top chunk only when a free reaches it, and fixes the mmap
 * threshold too), a fixed M_MMAP_THRESHOLD (would mmap and unmap a large output buffer on
 * every batch).
 *
 * The counts are atomics only so that pool_cached_bytes (a gauge for /metrics) may read
 * another worker's: the owner loads and stores them relaxed, plain moves, no read-modify-write.
 *
 * A 16-byte header before each block says its class, so pool_free needs no size.
 */
#include <malloc.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <weft.h>

#include "pool.h"
#include "stats.h"

#define NCLASS 11
#define MIN_SHIFT 6
#define HDR 16
#define BIG 0xff

typedef struct blk {
	struct blk *next;
} blk;

#define TRIM_EVERY 1000000000LL        /* ns: the reaper looks this often */
#define TRIM_AGAIN 5000000000LL        /* ns: trims at least this far apart... */
#define TRIM_MAX (600 * 1000000000LL)  /* ns: ... and at most this far apart */
#define TRIM_SLACK ((size_t)4 << 20)   /* bytes free in malloc worth a trim */
#define TRIM_BUSY 1000                 /* packets received in a second: a busy broker */

typedef struct wcache {
	blk *head[NCLASS];
	_Atomic uint32_t count[NCLASS];
	uint32_t low[NCLASS];      /* the least count[] since the last trim */
	unsigned gen;              /* the trim generation this cache last trimmed at */
	char pad[64];
} wcache;

static wcache *caches;
static int ncaches;
static _Atomic unsigned trim_gen;

static uint32_t count_of(wcache *w, int c)
{
	return atomic_load_explicit(&w->count[c], memory_order_relaxed);
}

static void count_set(wcache *w, int c, uint32_t n)
{
	atomic_store_explicit(&w->count[c], n, memory_order_relaxed);
}

void pool_malloc_setup(void)
{
	mallopt(M_ARENA_MAX, 1);
}

void pool_init(void)
{
	ncaches = weft_worker_max();
	caches = calloc((size_t)(ncaches > 0 ? ncaches : 1), sizeof *caches);
	if (!caches)
		abort();
}

static int class_of(size_t n)
{
	size_t sz = (size_t)1 << MIN_SHIFT;
	for (int c = 0; c < NCLASS; c++, sz <<= 1)
		if (n + HDR <= sz)
			return c;
	return -1;
}

/* Free the blocks each list kept unused since the last trim. */
static void cache_trim(wcache *w, unsigned gen)
{
	for (int c = 0; c < NCLASS; c++) {
		for (; w->low[c]; w->low[c]--) {
			blk *b = w->head[c];
			w->head[c] = b->next;
			count_set(w, c, count_of(w, c) - 1);
			free(b);
		}
		w->low[c] = count_of(w, c);
	}
	w->gen = gen;
}

static wcache *mine(void)
{
	int i = weft_worker_id();
	wcache *w = i >= 0 && i < ncaches && caches ? &caches[i] : NULL;
	if (w) {
		unsigned gen = atomic_load_explicit(&trim_gen, memory_order_relaxed);
		if (w->gen != gen)
			cache_trim(w, gen);
	}
	return w;
}

void *pool_alloc(size_t n)
{
	int c = class_of(n);
	uint8_t *p;
	if (c < 0) {
		p = malloc(n + HDR);
		if (!p)
			abort();
		p[0] = BIG;
		memcpy(p + 8, &n, sizeof n);
		return p + HDR;
	}
	wcache *w = mine();
	if (w && w->head[c]) {
		blk *b = w->head[c];
		w->head[c] = b->next;
		uint32_t n = count_of(w, c) - 1;
		count_set(w, c, n);
		if (n < w->low[c])
			w->low[c] = n;
		p = (uint8_t *)b;
	} else {
		p = malloc((size_t)1 << (c + MIN_SHIFT));
		if (!p)
			abort();
	}
	p[0] = (uint8_t)c;
	return p + HDR;
}

size_t pool_size(const void *q)
{
	const uint8_t *p = (const uint8_t *)q - HDR;
	if (p[0] == BIG) {
		size_t n;
		memcpy(&n, p + 8, sizeof n);
		return n;
	}
	return ((size_t)1 << (p[0] + MIN_SHIFT)) - HDR;
}

void pool_free(void *q)
{
	if (!q)
		return;
	uint8_t *p = (uint8_t *)q - HDR;
	int c = p[0];
	wcache *w = c == BIG ? NULL : mine();
	if (w && count_of(w, c) < (262144u >> (c + MIN_SHIFT)) + 8) {
		blk *b = (blk *)p;
		b->next = w->head[c];
		w->head[c] = b;
		count_set(w, c, count_of(w, c) + 1);
		return;
	}
	free(p);
}

long pool_cached_bytes(void)
{
	long n = 0;
	for (int i = 0; i < ncaches; i++) /* racy reads of other workers' counts: a gauge */
		for (int c = 0; c < NCLASS; c++)
			n += (long)count_of(&caches[i], c) << (c + MIN_SHIFT);
	return n;
}

long mem_resident(void)
{
	long pages = 0;
	FILE *f = fopen("/proc/self/statm", "r");
	if (f) {
		if (fscanf(f, "%*s %ld", &pages) != 1)
			pages = 0;
		fclose(f);
	}
	return pages * sysconf(_SC_PAGESIZE);
}

void pool_trim(int64_t now)
{
	static int64_t next, due, interval = TRIM_AGAIN;
	static size_t kept, peak; /* malloc's free space after the last trim; its use since */
	static uint64_t packets;
	if (now < next)
		return;
	next = now + TRIM_EVERY;
	atomic_fetch_add_explicit(&trim_gen, 1, memory_order_relaxed);
	mine(); /* this worker's lists now: another's at its next pool call */
	uint64_t p = stats_sum(ST_MSG_RECV);
	bool busy = p - packets > TRIM_BUSY;
	packets = p;
	struct mallinfo2 mi = mallinfo2();
	size_t used = mi.uordblks + mi.hblkhd;
	if (used > peak)
		peak = used;
	if (mi.fordblks < kept) /* reused since: what is freed again is resident again */
		kept = mi.fordblks;
	size_t freed = peak - used > mi.fordblks - kept ? peak - used : mi.fordblks - kept;
	if (mi.fordblks < TRIM_SLACK ||
	    (busy ? freed < 16 * TRIM_SLACK : freed < TRIM_SLACK && now < due))
		return;
	long before = mem_resident();
	malloc_trim(0);
	bool gave = before - mem_resident() >= 1L << 20;
	interval = gave ? TRIM_AGAIN : interval * 2 < TRIM_MAX ? interval * 2 : TRIM_MAX;
	due = now + interval;
	mi = mallinfo2();
	kept = mi.fordblks;
	peak = mi.uordblks + mi.hblkhd;
}

void pool_fini(void)
{
	for (int i = 0; i < ncaches; i++)
		for (int c = 0; c < NCLASS; c++)
			while (caches[i].head[c]) {
				blk *b = caches[i].head[c];
				caches[i].head[c] = b->next;
				free(b);
			}
	free(caches);
	caches = NULL;
	ncaches = 0;
}
