/*
 * persist.h - what the broker writes to the store and when acknowledgements wait for it
 * (persist.c; the store itself is store.h). With persistence off every write is a no-op and
 * every ticket is durable.
 */
#ifndef WEFT_MQTT_PERSIST_H
#define WEFT_MQTT_PERSIST_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "msg.h"
#include "records.h"

struct store_callbacks;

extern bool persist_on;
/* Open the store and read it back through cb (arg given to each), then turn persistence on:
 * 0, or -1 with a message (restore.c, which knows where what is read goes, calls it at start).
 * Persistence is still off (persist_start turns it on).
 * Close it after the connections ended: open_conns says how many did not (the store is then
 * left as it is). */
int persist_open(const struct store_callbacks *cb, void *arg);
/* After the load: persistence on (the store's writes begin). */
void persist_start(void);
void persist_close(long open_conns);
/* Times as the store keeps them (Unix seconds) as weft_now deadlines: due times (rounded up),
 * and the seconds left of a message expiry (0: none; 1 at least). */
int64_t persist_mono_from_unix(int64_t unix_s);
uint32_t persist_seconds_left(int64_t unix_s);
/* c's batch waits, besides its own writes, for every write made so far (ack_earlier). */
void persist_cover_earlier(struct conn *c);
/* Store writes; `by` is the connection whose batch must wait for them before acknowledging
 * (NULL: nobody waits). Lock of s held for persist_session, _enqueue, _inflight and _ack. */
void persist_session(session *s, bool connected, struct conn *by);
void persist_session_gone(session *s, struct conn *by);
/* s's will was published: its row goes (lock of s held). */
void persist_will_gone(session *s);
void persist_sub(session *s, const char *f, uint16_t len, uint8_t opts, uint32_t subid,
		 struct conn *by);
void persist_unsub(session *s, const char *f, uint16_t len, struct conn *by);
/* These two return the write's ticket (<= 0 when nothing was written, -1 when it failed). */
int64_t persist_enqueue(session *s, delivery *d, struct conn *by);
int64_t persist_inflight(session *s, delivery *d);
void persist_ack(session *s, uint16_t pid);
void persist_rel(session *s, uint16_t pid, bool add, struct conn *by);
void persist_retained(const msg *m, struct conn *by);
/* Wait until c's writes so far are durable: 0, or -EIO (do not acknowledge). */
int persist_wait(struct conn *c);
/* Write ticket t (from the two above; INT64_MAX: one that failed) is durable: without waiting,
 * and waiting until deadline (0, -EIO: the store is failed, -ETIMEDOUT). t <= 0: it is. */
bool persist_durable(int64_t t);
int persist_wait_ticket(int64_t t, int64_t deadline);
/* An inbound QoS 2 message from persistent session s: its packet id and its copies for the
 * persistent sessions it goes to are one unit in the store (store_group_begin), so that a
 * crash keeps both or neither. True when the group was opened: persist_group_end after the
 * routing, with no wait for the store in between. */
bool persist_group_begin(session *s);
void persist_group_end(void);
/* Whether a persistent session can be taken now: persistence off, or the store can write. */
bool persist_ok(void);

#endif
