/*
 * chan_name.c - channel names, for the task dump.
 *
 * The dump names the channel a task waits on, but that task may be woken and its channel freed
 * while the dump reads (a dump is a snapshot of a running program). So the dump reads only the
 * names of channels in this set, under its lock, and weft_chan_free takes a named channel out
 * of it before the memory goes. An open-addressing set of pointers with linear probing: a
 * program with no named channels never touches it. The name itself lives in the channel
 * (chan_name_buf), so weft_chan_name needs no lock.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chan.h"
#include "spin.h"
#include "weft.h"

static struct {
	spinlock lock;
	weft_chan **slot; /* cap entries, NULL where free */
	size_t cap, n;    /* cap: 0 or a power of two, at least twice n */
} named = { SPIN_INIT, NULL, 0, 0 };

static size_t named_home(const void *c)
{
	return (size_t)(((uintptr_t)c * 0x9E3779B97F4A7C15ull) >> 32) & (named.cap - 1);
}

/* c's slot, or the free slot where it would go. Lock held, cap > 0. */
static size_t named_find(const void *c)
{
	size_t i = named_home(c);
	while (named.slot[i] && named.slot[i] != c)
		i = (i + 1) & (named.cap - 1);
	return i;
}

static bool named_grow(void)
{
	size_t cap = named.cap ? 2 * named.cap : 16;
	weft_chan **old = named.slot, **slot = calloc(cap, sizeof *slot);
	if (!slot)
		return false;
	size_t oldcap = named.cap;
	named.slot = slot;
	named.cap = cap;
	for (size_t i = 0; i < oldcap; i++)
		if (old[i])
			named.slot[named_find(old[i])] = old[i];
	free(old);
	return true;
}

/* Lock held. False when out of memory: c then keeps its name, but the dump shows its address. */
static bool named_add(weft_chan *c)
{
	if (2 * (named.n + 1) > named.cap && !named_grow())
		return false;
	size_t i = named_find(c);
	if (!named.slot[i]) {
		named.slot[i] = c;
		named.n++;
	}
	return true;
}

/* Lock held. Backward-shift deletion: later entries of the run move up, so no tombstones. */
static void named_remove(const weft_chan *c)
{
	if (!named.cap)
		return;
	size_t i = named_find(c), mask = named.cap - 1;
	if (!named.slot[i])
		return;
	named.n--;
	for (size_t j = (i + 1) & mask; named.slot[j]; j = (j + 1) & mask) {
		size_t h = named_home(named.slot[j]);
		/* the entry at j may fill the hole at i if its home is not in (i, j] */
		if (((j - h) & mask) >= ((j - i) & mask)) {
			named.slot[i] = named.slot[j];
			i = j;
		}
	}
	named.slot[i] = NULL;
}

void weft_chan_set_name(weft_chan *c, const char *name)
{
	if (!c)
		return;
	size_t n = name ? strnlen(name, CHAN_NAME_MAX - 1) : 0;
	spin_lock(&named.lock);
	memcpy(chan_name_buf(c), name ? name : "", n);
	chan_name_buf(c)[n] = 0;
	if (n)
		named_add(c);
	else
		named_remove(c);
	spin_unlock(&named.lock);
}

const char *weft_chan_name(const weft_chan *c)
{
	return c ? chan_name_buf(c) : "";
}

bool chan_name_of(const void *obj, char *out, size_t cap, bool may_wait)
{
	if (may_wait)
		spin_lock(&named.lock);
	else if (!spin_trylock(&named.lock))
		return false;
	bool found = named.cap && named.slot[named_find(obj)];
	if (found)
		snprintf(out, cap, "%s", chan_name_buf(obj));
	spin_unlock(&named.lock);
	return found;
}

void chan_name_forget(weft_chan *c)
{
	spin_lock(&named.lock);
	named_remove(c);
	spin_unlock(&named.lock);
}
