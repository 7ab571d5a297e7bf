/*
 * pool.c - per-worker free lists for messages and buffers.
 *
 * The seed of this broker is a benchmark lost to allocator locks: every message allocated and
 * freed through a shared heap made the publishers queue on its mutex. Here each weft worker
 * keeps a free list per size class (powers of two from 64 bytes to 64 KiB), used with no lock
 * at all: a task only touches the list of the worker it runs on, between two points where it
 * cannot be moved (nothing blocks in pool_alloc or pool_free). A block freed on another worker
 * than the one that allocated it simply joins that worker's list. Each list is capped (about
 * 256 KiB per class per worker); beyond the cap, and for larger sizes or callers that are not
 * weft workers, blocks go to malloc and free.
 *
 * A 16-byte header before each block says its class, so pool_free needs no size.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker.h"

#define NCLASS 11
#define MIN_SHIFT 6
#define HDR 16
#define BIG 0xff

typedef struct blk {
	struct blk *next;
} blk;

typedef struct wcache {
	blk *head[NCLASS];
	uint32_t count[NCLASS];
	char pad[64];
} wcache;

static wcache *caches;
static int ncaches;

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

static wcache *mine(void)
{
	int w = weft_worker_id();
	return w >= 0 && w < ncaches && caches ? &caches[w] : NULL;
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
		w->count[c]--;
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
	if (w && w->count[c] < (262144u >> (c + MIN_SHIFT)) + 8) {
		blk *b = (blk *)p;
		b->next = w->head[c];
		w->head[c] = b;
		w->count[c]++;
		return;
	}
	free(p);
}

/* Release every cached block (at exit, so that leak checkers see a clean heap). */
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
