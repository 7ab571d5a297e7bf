/*
 * stats.c - the broker's counters (sys.c publishes them under $SYS/broker/, metrics.c for
 * Prometheus).
 *
 * Counters are per worker (one cache line each) and bumped with plain relaxed loads and
 * stores: a worker's slot has one writer, so nothing is lost and no cache line bounces
 * between cores on the publish path. A reader sums the slots (a snapshot, as mosquitto's).
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <weft.h>

#include "stats.h"

typedef struct slot {
	_Atomic uint64_t v[ST_COUNT];
	char pad[64];
} slot;

static slot *slots;
static int nslots;
int64_t broker_start;
atomic_int broker_stopping;

void stats_init(void)
{
	nslots = weft_worker_max() > 0 ? weft_worker_max() : 1;
	slots = calloc((size_t)nslots, sizeof *slots);
	if (!slots)
		abort();
}

void stats_add(int which, uint64_t n)
{
	int w = weft_worker_id();
	if (w < 0 || w >= nslots) {
		atomic_fetch_add_explicit(&slots[0].v[which], n, memory_order_relaxed);
		return;
	}
	_Atomic uint64_t *p = &slots[w].v[which];
	atomic_store_explicit(p, atomic_load_explicit(p, memory_order_relaxed) + n,
			      memory_order_relaxed);
}

uint64_t stats_sum(int which)
{
	uint64_t t = 0;
	for (int i = 0; i < nslots; i++)
		t += atomic_load_explicit(&slots[i].v[which], memory_order_relaxed);
	return t;
}

void stats_fini(void)
{
	free(slots);
	slots = NULL;
}
