/*
 * epoch.c - epoch-based reclamation for the topic tree.
 *
 * Publishers walk the topic tree and read subscriber arrays without taking any lock; a
 * subscribe or unsubscribe replaces an array (copy on write) under the tree's writer lock and
 * must not free the old one while a publisher may still be reading it. So every reader (each
 * connection, and the broker's own publishing tasks) has a slot: entering a read section
 * stores the global epoch there, leaving stores 0. A writer unlinks an object, then retires
 * it with the current epoch and advances the epoch. An object retired at epoch e can be freed
 * once every slot is 0 or above e: a reader that entered later loaded the epoch after the
 * unlink (both are sequentially consistent), so it cannot reach the object.
 *
 * The slots belong to tasks, not workers, so a read section may span a park (a contended
 * session lock on the publish path) on any worker. Slots are in a list under a mutex, walked
 * only by epoch_collect, which the broker's reaper task calls a few times a second: retiring is
 * rare (subscription changes) and freeing late costs only memory.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include <weft.h>

#include "epoch.h"

typedef struct retired {
	struct retired *next;
	void *p;
	void (*fn)(void *);
	uint64_t epoch;
} retired;

static _Atomic uint64_t global_epoch = 1;
static weft_mutex lock = WEFT_MUTEX_INIT;
static epoch_reader *readers;
static retired *pending;

void epoch_register(epoch_reader *r)
{
	atomic_store(&r->epoch, 0);
	WEFT_WITH_LOCK(&lock) {
		r->prev = NULL;
		r->next = readers;
		if (readers)
			readers->prev = r;
		readers = r;
		r->registered = 1;
	}
}

void epoch_unregister(epoch_reader *r)
{
	if (!r->registered)
		return;
	WEFT_WITH_LOCK(&lock) {
		if (r->prev)
			r->prev->next = r->next;
		else
			readers = r->next;
		if (r->next)
			r->next->prev = r->prev;
		r->registered = 0;
	}
}

void epoch_enter(epoch_reader *r)
{
	atomic_store(&r->epoch, atomic_load(&global_epoch));
}

void epoch_leave(epoch_reader *r)
{
	atomic_store_explicit(&r->epoch, 0, memory_order_release);
}

void epoch_retire(void *p, void (*fn)(void *))
{
	retired *x = malloc(sizeof *x);
	if (!x)
		abort();
	x->p = p;
	x->fn = fn;
	WEFT_WITH_LOCK(&lock) {
		x->epoch = atomic_fetch_add(&global_epoch, 1);
		x->next = pending;
		pending = x;
	}
}

void epoch_collect(int force)
{
	retired *done = NULL;
	WEFT_WITH_LOCK(&lock) {
		uint64_t min = UINT64_MAX;
		for (epoch_reader *r = readers; r && !force; r = r->next) {
			uint64_t e = atomic_load(&r->epoch);
			if (e && e < min)
				min = e;
		}
		retired **pp = &pending;
		while (*pp) {
			retired *x = *pp;
			if (force || x->epoch < min) {
				*pp = x->next;
				x->next = done;
				done = x;
			} else {
				pp = &x->next;
			}
		}
	}
	while (done) {
		retired *x = done;
		done = x->next;
		x->fn(x->p);
		free(x);
	}
}
