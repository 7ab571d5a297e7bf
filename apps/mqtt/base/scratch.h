/*
 * scratch.h - a batch's growable arrays (scratch.c): match results, the frontier, the dirty
 * sessions, the held acknowledgements.
 */
#ifndef WEFT_MQTT_SCRATCH_H
#define WEFT_MQTT_SCRATCH_H

#include <stddef.h>
#include <stdint.h>

/* Scratch space of a publishing task: match results, frontier, dirty sessions. */
typedef struct scratch_buf {
	void *v;
	uint32_t n, cap;
} scratch_buf;
/* Room for `need` elements of `elem` bytes in b (scratch.c): b->v, grown if needed. */
void *scratch_grow(scratch_buf *b, size_t elem, uint32_t need);

#endif
