/*
 * msg.h - reference-counted messages, decoded once and shared by every delivery (msg.c).
 *
 * msg_stored_release is the table (of one hook) by which msg.c, below the store, reaches
 * persist/: persist.c installs it when persistence is on, and the last reference to a message
 * with a store id calls it. A pointer rather than a call, because base/ may not call persist/;
 * only stored messages (smid set) pay the indirect call.
 */
#ifndef WEFT_MQTT_MSG_H
#define WEFT_MQTT_MSG_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "codec.h"

typedef struct msg {
	atomic_uint refs;
	uint8_t qos, retain;
	uint16_t topic_len;
	uint32_t props_len, payload_len;
	int64_t expiry;            /* absolute (weft_now), 0: never */
	char *topic;               /* NUL-terminated */
	uint8_t *props;            /* 5.0 properties forwarded as they came (no alias/expiry) */
	uint8_t *payload;
	_Atomic uint64_t smid;     /* its id in the store once queued for a persistent session
				    * (persist.c), shared by every session it goes to; 0: none */
	uint8_t data[];
} msg;

/* A message with refs 1. props is the PUBLISH's raw property block (filtered here). */
msg *msg_new(const void *topic, uint16_t topic_len, const mq_bytes *props, const void *payload,
	     uint32_t payload_len, int qos, int retain, uint32_t expiry_s);
static inline msg *msg_ref(msg *m)
{
	atomic_fetch_add_explicit(&m->refs, 1, memory_order_relaxed);
	return m;
}
void msg_unref(msg *m);
/* The hook persist.c installs when persistence is on: the last reference to a message with a
 * store id (m->smid) went. msg.c sits below the store and so calls it through this pointer,
 * only for a stored message (smid set, which only persist.c does). */
extern void (*msg_stored_release)(uint64_t smid);
bool msg_expired(const msg *m, int64_t now);

#endif
