/*
 * scratch.c - a growable array, the scratch space of a connection's batch: the topic tree's
 * match results and frontiers (topic.c), the sessions a batch wrote to (the dirty list), the
 * acknowledgements held until the batch is durable (acks.c).
 *
 * It doubles (from 16) and never shrinks here: whoever owns it gives a big one back at the end
 * of a batch (conn/loop.c, flush_dirty), since nothing in it is live then. Out of memory aborts, as
 * the pool does: a broker that cannot grow a few kilobytes cannot serve.
 */
#include <stdint.h>
#include <stdlib.h>

#include "scratch.h"

void *scratch_grow(scratch_buf *b, size_t elem, uint32_t need)
{
	if (need > b->cap) {
		uint32_t cap = b->cap ? b->cap * 2 : 16;
		while (cap < need)
			cap *= 2;
		void *v = realloc(b->v, (size_t)cap * elem);
		if (!v)
			abort();
		b->v = v;
		b->cap = cap;
	}
	return b->v;
}
