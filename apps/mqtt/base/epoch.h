/*
 * epoch.h - epoch-based reclamation (epoch.c): what a lock-free reader may still see is freed
 * only once every read section that could have seen it has closed.
 */
#ifndef WEFT_MQTT_EPOCH_H
#define WEFT_MQTT_EPOCH_H

#include <stdatomic.h>
#include <stdint.h>

typedef struct epoch_reader {
	_Atomic uint64_t epoch;      /* 0: outside a read section */
	struct epoch_reader *next, *prev;
	int registered;
} epoch_reader;

void epoch_register(epoch_reader *r);
void epoch_unregister(epoch_reader *r);
void epoch_enter(epoch_reader *r);
void epoch_leave(epoch_reader *r);
/* Free p with fn once no read section that could have seen it is still open. */
void epoch_retire(void *p, void (*fn)(void *));
/* Free what can be freed now (the reaper calls it; so does shutdown with force). */
void epoch_collect(int force);

#endif
