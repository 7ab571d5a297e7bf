/*
 * session.h - sessions (session.c, delivery.c, writer.c, deadline.c): what outlives a
 * connection, how messages reach it, its output to the socket, and when an offline one needs
 * the reaper. The session record itself is base/records.h.
 */
#ifndef WEFT_MQTT_SESSION_H
#define WEFT_MQTT_SESSION_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "msg.h"
#include "records.h"
#include "scratch.h"

/* Find or make the session for client_id and attach c to it (taking over from a connection
 * still attached). *present says whether an old session was resumed. An empty id is replaced
 * by a random one. NULL when refused, with the 5.0 reason in *refuse: MQ_RC_NOT_AUTHORIZED
 * when the session belongs to another identity than c->user, MQ_RC_SERVER_UNAVAILABLE when
 * the connection attached does not let go. */
session *session_attach(struct conn *c, const char *id, uint16_t id_len, bool clean,
			bool *present, int *refuse);
/* Detach c from its session at the end of a connection; publishes or schedules the will
 * (unless `normal`); the session ends now or when its expiry passes. */
void session_detach(struct conn *c, bool publish_will);
void session_unref(session *s);
static inline void session_ref(session *s)
{
	atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);
}
/* Queue or encode one delivery of m to s (QoS already the granted one); s is marked dirty in
 * the publishing connection `by` (flushed at the end of its batch), or flushed at once if by
 * is NULL. */
void session_deliver(session *s, msg *m, int qos, int retain, const uint32_t *subids, int nsub,
		     struct conn *by);
/* session_deliver's work with s's lock held, now the time if m expires (else anything). With
 * `capped` off (a retained backlog's delivery, retained.c, which has bounds of its own)
 * qos0_queue_bytes, max_queued_messages and max_queued_bytes do not apply. */
void session_put(session *s, msg *m, int qos, int retain, const uint32_t *subids, int nsub,
		 struct conn *by, int64_t now, bool capped);
/* The limit a delivery to s at qos with payload_len bytes meets now (qos0_queue_bytes, or an
 * offline client, for QoS 0; max_queued_messages, max_queued_bytes beyond the window for QoS
 * 1/2): the ST_DROP_* it is counted as when dropped, or -1 when it has room. Lock held. */
int session_limit(const session *s, int qos, uint32_t payload_len);
/* Count a delivery dropped at limit `why` (session_limit's), as session_put does. */
void session_dropped(int why);
/* Room for n bytes at the end of s's output, which grows to take them (lock held). */
uint8_t *session_out_room(session *s, size_t n);
/* Whether s's connection takes output now: attached and not being torn down (lock held). */
bool session_taking_output(const session *s);
/* Take s's whole output to write it (lock of s held): its bytes (*len of them, a pool buffer
 * the caller frees) and the store ticket they must wait for (persist.c); s's output is empty
 * after. */
uint8_t *session_take_out(session *s, size_t *len, int64_t *need);
/* topic_send_retained's end, s's lock held: start s's backlog for filter with v[0..n), the
 * matching retained messages referenced (the array is s's now), in place of `reserved` bytes
 * of s's budget (retained_admit), then let the lock go. */
void session_retained(session *s, const char *filter, uint16_t len, msg **v, uint32_t n,
		      int max_qos, uint32_t subid, uint64_t reserved, struct conn *by);
/* Append a raw packet to s's output (acks, SUBACK, ...), marked dirty like a delivery. */
void session_send(session *s, const void *pkt, size_t n, struct conn *by);
/* Write out what is queued for s without waiting: what the socket does not take now is left
 * to a writer task. */
void session_flush(session *s);
/* Acknowledgements from the client for outbound QoS 1/2. */
void session_puback(session *s, uint16_t pid, struct conn *by);
void session_pubrec(session *s, uint16_t pid, int reason, struct conn *by);
void session_pubcomp(session *s, uint16_t pid, struct conn *by);
/* Inbound QoS 2 ids: add returns 0 (new), 1 (already there) or -1 (more than `max`). */
int session_rel_add(session *s, uint16_t pid, int max);
bool session_rel_del(session *s, uint16_t pid);
/* Resend inflight messages (DUP) and start queued ones, after a (re)connect. */
void session_resume(session *s, struct conn *by);
/* At start, from the store: an offline session (expiring at expire_at, 0 never) owned by
 * owner (NULL: anonymous; owner_known false: the store did not say), a queued or inflight
 * delivery of it (pid 0: not sent yet), and finding a session by id. */
session *session_restore(const char *id, uint16_t n, uint8_t version, uint32_t expiry_interval,
			 int64_t expire_at, const char *owner, uint16_t owner_len,
			 bool owner_known);
void session_restore_delivery(session *s, const delivery *d);
/* At start, from the store: s's will, waiting to be published at `at` (weft_now clock). */
void session_restore_will(session *s, msg *will, uint32_t delay, uint32_t expiry, int64_t at);
session *session_find(const char *id, uint16_t n);
/* Note a subscription in s's list (session.c; the SUBSCRIBE handler and restore.c call it). */
void subrec_add(session *s, const uint8_t *f, uint16_t len);
/* Whether s's list has the filter; take it out (and end a retained backlog pending for it). */
bool subrec_has(session *s, const uint8_t *f, uint16_t len);
void subrec_del(session *s, const uint8_t *f, uint16_t len);
/* Publish the delayed wills and end the offline sessions whose time has come. */
void sessions_reap(int64_t now);
/* deadline.c: the offline sessions that have a deadline, earliest first. deadline_set (under
 * s's lock; when 0: none) files s for when it next needs the reaper, which is
 * session_deadline(s); deadline_due takes out one whose deadline is at or before now, with a
 * reference, or returns NULL. */
void deadline_set(session *s, int64_t when);
int64_t session_deadline(const session *s);
session *deadline_due(int64_t now);
void deadline_free_all(void);
long sessions_count(void);
/* Kick every connection (server shutting down). */
void sessions_shutdown(void);
void sessions_free_all(void);
/* Note s as needing a flush at the end of c's current batch. */
static inline void conn_mark_dirty(conn *c, session *s)
{
	session **v = scratch_grow(&c->dirty, sizeof(session *), c->dirty.n + 1);
	v[c->dirty.n++] = s;
}

#endif
