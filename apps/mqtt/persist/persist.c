/*
 * persist.c - `persistence true`: what the broker writes to the store (store.c, SQLite) and
 * reads back at start.
 *
 * The rule is that a PUBACK, PUBREC or PUBCOMP (and a SUBACK, an UNSUBACK, a CONNACK) goes
 * out only once what the broker promised with it is on disk. Every store call returns at once
 * with a ticket; the connection that read a batch of packets keeps the highest ticket its
 * handlers got (c->ticket) and its PUBACK/PUBREC/PUBCOMPs in a list (c->acks) instead of its
 * session's output (the other replies are in that output, written after the wait). At the end of the batch it waits once for
 * that ticket, then sends the acknowledgements in order: one fsync, shared with every other
 * connection waiting at the same time, covers the whole batch. The other way, a QoS 2 PUBLISH
 * or PUBREL to a stored session goes out only once its state is durable (session.c,
 * out_after). An inbound QoS 2 id and the message's copies for persistent sessions are one
 * store group (persist_group_begin): a crash keeps both or neither.
 *
 * While the store cannot write (store_failed), persistent sessions are refused at CONNECT
 * (persist_ok); the store retries its writes and recovers by itself when it can - unless the
 * failure lasted while 64 Ki writes piled up: then it refuses writes (store.h) and stays
 * failed until a restart. No store call waits, so they are made under sessions' locks and the
 * session table's, and the rest of the broker serves on whatever the disk does.
 *
 * What is stored: persistent sessions (3.1.1 without clean session, 5.0 with an expiry
 * interval), their subscriptions, the QoS 1/2 messages queued or inflight for them (with the
 * RETAIN flag and subscription ids each receiver gets), their packet ids once sent and the
 * QoS 2 state, inbound QoS 2 ids between PUBREC and PUBREL, their wills, and retained
 * messages. A clean session is never written. Calls that change a session's queue are made
 * under the session's lock, so the store sees each queue in the order the broker built it.
 *
 * A message routed to many persistent sessions is stored once: the msg keeps its store id in
 * m->smid, set by the first store_enqueue, and the others refer to it. The store keeps the
 * message pinned until the msg's last reference goes (msg_unref calls persist_release), since
 * until then another session may still be given it (the routing is not finished, or it is a
 * retained message sent on subscribe).
 *
 * Wills (a decision, see docs/weft-mqtt-durability.md): the will of a persistent session is
 * stored while its connection is up (due `delay` seconds after the connection ends) and while
 * it waits for its delay (with the time it is due). After a crash the connections that were up
 * ended without DISCONNECT, so their wills are published after the next start, the delay
 * counted from the start (MQTT 5.0 lets a server that fails defer wills until it restarts); a
 * will that was waiting at a shutdown or crash is published when it is due. The will's
 * publication and the deletion of its row are not one transaction: a crash between them
 * publishes it again after the restart (at least once).
 *
 * Times go to the store as Unix seconds: due times and disconnections rounded up (nothing
 * comes due early), message expiries rounded down (a message never gains time by a restart).
 *
 * Nothing here runs when persistence is off (persist_on false: one predictable branch).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "broker.h"

bool persist_on;

/* ---- acknowledgements held until durable (conn.c's PUBLISH and PUBREL) ----------------- */

static void send_ack(conn *c, int type, uint16_t pid, int rc)
{
	uint8_t b[8];
	session_send(c->s, b, mq_enc_ack(b, c->version, type, pid, rc, NULL), c);
}

/* A PUBLISH's acknowledgement. With persistence on it waits in c->acks for the end of the
 * batch, when what the batch wrote to the store is durable; in order, since MQTT wants
 * PUBACKs in the order of their PUBLISHes. */
typedef struct held_ack {
	uint8_t type, rc;
	uint16_t pid;
} held_ack;

void ack_pub(conn *c, int type, uint16_t pid, int rc)
{
	if (!persist_on) {
		send_ack(c, type, pid, rc);
		return;
	}
	held_ack *v = route_grow(&c->acks, sizeof *v, c->acks.n + 1);
	v[c->acks.n++] = (held_ack){ (uint8_t)type, (uint8_t)rc, pid };
}

/* End of a batch with persistence on: wait for the store, then acknowledge. -1 when the
 * store failed: nothing is acknowledged (the client will send the messages again). */
int acks_release(conn *c)
{
	int r = persist_wait(c);
	held_ack *v = c->acks.v;
	for (uint32_t i = 0; r == 0 && i < c->acks.n; i++)
		send_ack(c, v[i].type, v[i].pid, v[i].rc);
	c->acks.n = 0;
	return r < 0 ? -1 : 0;
}

#ifndef MQTT_NO_STORE
#include "store.h"

static store *st;

/* The wall clock in ns: the store keeps Unix seconds, since it outlives the process. */
static int64_t real_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Now, in Unix seconds rounded up: what starts now (a disconnection) is never moved earlier. */
static int64_t unix_now(void)
{
	return (real_ns() + 999999999) / 1000000000;
}

/* weft_now-based deadlines <-> Unix seconds, rounded up (nothing comes due early) */
static int64_t to_unix(int64_t mono)
{
	if (!mono)
		return 0;
	int64_t left = mono - weft_now();
	return (real_ns() + (left > 0 ? left : 0) + 999999999) / 1000000000;
}

static int64_t from_unix(int64_t unix_s)
{
	int64_t left = unix_s * 1000000000 - real_ns();
	return weft_now() + (left > 0 ? left : 0);
}

static uint32_t left_s(int64_t unix_s)
{
	if (!unix_s)
		return 0;
	int64_t left = (unix_s * 1000000000 - real_ns()) / 1000000000;
	return left > 0 ? (uint32_t)left : 1; /* expired, inflight: its delivery had started */
}

/* A message's expiry in Unix seconds, rounded down: it never gains time by being stored. */
static int64_t expiry_unix(int64_t mono)
{
	if (!mono)
		return 0;
	int64_t left = mono - weft_now(), t = (real_ns() + (left > 0 ? left : 0)) / 1000000000;
	return t > 0 ? t : 1;
}

static void to_store(const msg *m, store_msg *o)
{
	*o = (store_msg){ m->topic, m->topic_len, m->qos, m->retain, m->props, m->props_len,
			  m->payload, m->payload_len, expiry_unix(m->expiry) };
}

static msg *from_store(const store_msg *m)
{
	mq_bytes props = { m->props, m->props_len };
	return msg_new(m->topic, m->topic_len, &props, m->payload, m->payload_len, m->qos,
		       m->retain, left_s(m->expiry));
}

/* Note write t for the batch of `by` (NULL: nobody waits for it); t as given. */
static int64_t ticket(conn *by, int64_t t)
{
	if (t < 0) {
		if (t != -EIO) /* refused by a failed store, which said why, once */
			fprintf(stderr, "weft-mqtt: persistence: %s\n", strerror((int)-t));
		if (by)
			by->ticket = -1; /* the batch's acknowledgements are not sent */
		return t;
	}
	if (by && by->ticket >= 0 && t > by->ticket)
		by->ticket = t;
	return t;
}

/* ---- start-up ------------------------------------------------------------------------------- */

static void ld_session(void *arg, const store_session *ss)
{
	(void)arg;
	int64_t expire_at = 0;
	if (ss->expiry_interval != UINT32_MAX) {
		int64_t since = ss->disconnected_at ? (int64_t)time(NULL) - ss->disconnected_at : 0;
		int64_t left = (int64_t)ss->expiry_interval - (since > 0 ? since : 0);
		expire_at = weft_now() + (left > 0 ? left : 0) * 1000000000 + 1;
	}
	session_restore(ss->id, ss->id_len, ss->version, ss->expiry_interval, expire_at, ss->owner,
			ss->owner_len, ss->owner_known);
}

static void ld_sub(void *arg, const char *id, uint16_t id_len, const char *f, uint16_t flen,
		   uint8_t opts, uint32_t subid)
{
	(void)arg;
	session *s = session_find(id, id_len);
	if (!s)
		return;
	topic_subscribe(s, f, flen, opts, subid);
	subrec_add(s, (const uint8_t *)f, flen);
}

/* Messages read back so far, by store id: a message queued for many sessions is one row, and
 * becomes one msg again (open addressing; only during store_load). */
typedef struct loaded {
	uint64_t *mid;
	msg **m;
	size_t n, cap; /* cap: a power of two, or 0 */
} loaded;

static msg *loaded_get(loaded *l, const store_msg *sm, uint64_t mid)
{
	if (2 * (l->n + 1) > l->cap) {
		loaded b = { NULL, NULL, 0, l->cap ? 2 * l->cap : 1024 };
		b.mid = calloc(b.cap, sizeof *b.mid);
		b.m = calloc(b.cap, sizeof *b.m);
		if (!b.mid || !b.m)
			abort();
		for (size_t i = 0; i < l->cap; i++)
			if (l->m[i]) {
				size_t j = l->mid[i] & (b.cap - 1);
				while (b.m[j])
					j = (j + 1) & (b.cap - 1);
				b.mid[j] = l->mid[i], b.m[j] = l->m[i];
			}
		b.n = l->n;
		free(l->mid);
		free(l->m);
		*l = b;
	}
	size_t j = mid & (l->cap - 1);
	for (; l->m[j]; j = (j + 1) & (l->cap - 1))
		if (l->mid[j] == mid)
			return msg_ref(l->m[j]);
	l->mid[j] = mid;
	l->m[j] = from_store(sm);
	l->n++;
	return msg_ref(l->m[j]);
}

static void loaded_free(loaded *l)
{
	for (size_t i = 0; i < l->cap; i++)
		msg_unref(l->m[i]);
	free(l->mid);
	free(l->m);
}

static void ld_queued(void *arg, const char *id, uint16_t id_len, const store_msg *sm,
		      const store_dlv *sd)
{
	session *s = session_find(id, id_len);
	if (!s)
		return;
	msg *m = loaded_get(arg, sm, sd->mid);
	dlv d = { .m = m, .pid = sd->pid, .qos = sd->qos, .retain = sd->retain,
		  .state = sd->state, .nsub = sd->nsubid, .mid = sd->row };
	memcpy(d.subid, sd->subid, sizeof d.subid);
	session_restore_dlv(s, &d);
	msg_unref(m);
}

static void ld_will(void *arg, const char *id, uint16_t id_len, const store_msg *sm,
		    uint32_t delay, int64_t at)
{
	(void)arg;
	session *s = session_find(id, id_len);
	if (!s)
		return;
	mq_bytes props = { sm->props, sm->props_len };
	msg *m = msg_new(sm->topic, sm->topic_len, &props, sm->payload, sm->payload_len, sm->qos,
			 sm->retain, 0);
	/* up at the crash: it ended now, as far as anyone can tell */
	session_restore_will(s, m, delay, (uint32_t)sm->expiry,
			     at ? from_unix(at) : weft_now() + (int64_t)delay * 1000000000);
}

static void ld_rel(void *arg, const char *id, uint16_t id_len, uint16_t pid)
{
	(void)arg;
	session *s = session_find(id, id_len);
	if (s)
		session_rel_add(s, pid, 65535);
}

static void ld_retained(void *arg, const store_msg *sm)
{
	(void)arg;
	msg *m = from_store(sm);
	topic_retain(m);
	msg_unref(m);
}

int persist_open(void)
{
	if (!conf.persistence)
		return 0;
	char err[512];
	const char *dir = conf.persistence_location[0] ? conf.persistence_location : ".";
	/* WEFT_MQTT_STORE_COMMIT_DELAY_MS: for the tests of what a crash between a write and
	 * its durability does (see store_opts) */
	const char *delay = getenv("WEFT_MQTT_STORE_COMMIT_DELAY_MS");
	store_opts o = { .commit_delay_ms = delay ? atoi(delay) : 0 };
	st = store_open(dir, &o, err, sizeof err);
	if (!st) {
		fprintf(stderr, "weft-mqtt: persistence: %s\n", err);
		return -1;
	}
	store_callbacks cb = { ld_session, ld_sub, ld_queued, ld_rel, ld_will, ld_retained };
	loaded msgs = { 0 };
	int r = store_load(st, &cb, &msgs);
	loaded_free(&msgs);
	if (r < 0) {
		fprintf(stderr, "weft-mqtt: persistence: %s\n", store_error(st));
		store_close(st);
		st = NULL;
		return -1;
	}
	if (conf.verbose)
		fprintf(stderr, "weft-mqtt: persistence: %ld sessions, %ld retained messages loaded\n",
			sessions_count(), topic_retained_count());
	persist_on = true;
	sessions_reap(weft_now()); /* wills already due go out before any client is let in */
	return 0;
}

void persist_close(void)
{
	if (!st)
		return;
	/* A connection that did not end may still write, or be in store_wait: the store stays
	 * open under it, and the exit leaves the database as a crash would (everything
	 * acknowledged is durable already). Rejected: closing it anyway, which freed the store
	 * under those tasks. */
	long left = conns_count();
	if (left) {
		fprintf(stderr, "weft-mqtt: persistence: %ld connections did not end: the store is "
				"left as it is\n", left);
		return;
	}
	persist_on = false;
	char why[512]; /* store_close frees st: why it failed is read before */
	snprintf(why, sizeof why, "%s", store_error(st));
	if (store_close(st) < 0)
		fprintf(stderr, "weft-mqtt: persistence: the last writes are not durable%s%s\n",
			why[0] ? ": " : "", why);
	st = NULL;
}

/* ---- sessions ------------------------------------------------------------------------------- */

/* The will as it stands: up with the connection, waiting for its delay, or none. Lock held. */
static void put_will(session *s, bool connected, conn *by)
{
	if (s->will && (connected || s->will_pending)) {
		store_msg sm;
		to_store(s->will, &sm);
		sm.expiry = s->will_expiry; /* the interval: it counts from the publication */
		ticket(by, store_put_will(st, s->client_id, s->id_len, &sm, s->will_delay,
					  connected ? 0 : to_unix(s->will_at)));
		s->will_stored = true;
	} else if (s->will_stored) {
		s->will_stored = false;
		ticket(by, store_del_will(st, s->client_id, s->id_len));
	}
}

void persist_session(session *s, bool connected, conn *by)
{
	if (!persist_on)
		return;
	if (s->expiry_interval == 0) { /* clean: forget a persistent one it replaces */
		if (s->stored) {
			s->stored = false;
			s->will_stored = false;
			ticket(by, store_del_session(st, s->client_id, s->id_len));
		}
		return;
	}
	store_session ss = { s->client_id, s->id_len, s->version, s->expiry_interval,
			     connected ? 0 : unix_now(), s->owner, s->owner_len, !s->owner_unknown };
	s->stored = true;
	ticket(by, store_put_session(st, &ss));
	put_will(s, connected, by);
}

void persist_will_gone(session *s)
{
	if (persist_on && s->will_stored) {
		s->will_stored = false;
		ticket(NULL, store_del_will(st, s->client_id, s->id_len));
	}
}

void persist_session_gone(session *s, conn *by)
{
	if (persist_on && s->stored) {
		s->stored = false;
		ticket(by, store_del_session(st, s->client_id, s->id_len));
	}
}

void persist_sub(session *s, const char *f, uint16_t len, uint8_t opts, uint32_t subid, conn *by)
{
	if (persist_on && s->stored)
		ticket(by, store_put_sub(st, s->client_id, s->id_len, f, len, opts, subid));
}

void persist_unsub(session *s, const char *f, uint16_t len, conn *by)
{
	if (persist_on && s->stored)
		ticket(by, store_del_sub(st, s->client_id, s->id_len, f, len));
}

/* ---- messages ------------------------------------------------------------------------------- */

/* The message is stored once for all the sessions it goes to (m->smid), the delivery - QoS,
 * RETAIN flag, subscription ids - once per session (d->mid: its row). */
int64_t persist_enqueue(session *s, dlv *d, conn *by)
{
	store_msg sm;
	to_store(d->m, &sm);
	store_dlv sd = { .qos = d->qos, .retain = d->retain, .nsubid = d->nsub, .pid = d->pid };
	memcpy(sd.subid, d->subid, sizeof sd.subid);
	return ticket(by, store_enqueue(st, s->client_id, s->id_len, &sm, &sd, &d->mid,
					&d->m->smid));
}

void persist_release(uint64_t smid)
{
	if (persist_on)
		ticket(NULL, store_release(st, smid));
}

int64_t persist_inflight(session *s, dlv *d)
{
	return ticket(NULL, store_inflight(st, s->client_id, s->id_len, d->mid, d->pid, d->state));
}

void persist_ack(session *s, uint16_t pid)
{
	ticket(NULL, store_ack(st, s->client_id, s->id_len, pid));
}

void persist_rel(session *s, uint16_t pid, bool add, conn *by)
{
	if (!persist_on || !s->stored)
		return;
	ticket(by, add ? store_rel_add(st, s->client_id, s->id_len, pid)
		       : store_rel_del(st, s->client_id, s->id_len, pid));
}

void persist_retained(const msg *m, conn *by)
{
	if (!persist_on)
		return;
	if (m->payload_len) {
		store_msg sm;
		to_store(m, &sm);
		ticket(by, store_put_retained(st, &sm));
	} else {
		ticket(by, store_del_retained(st, m->topic, m->topic_len));
	}
}

bool persist_group_begin(session *s)
{
	return persist_on && s->stored && ticket(NULL, store_group_begin(st)) > 0;
}

void persist_group_end(void)
{
	ticket(NULL, store_group_end(st));
}

bool persist_ok(void)
{
	return !persist_on || !store_failed(st);
}

/* The write that stored the id (a resend) or forgot it (a PUBREL for an id not known) was made
 * by an earlier batch, perhaps of an earlier connection of the session: every write made so
 * far covers it, whichever task made it. A session not stored keeps no id on disk. */
void ack_earlier(conn *c, int type, uint16_t pid, int rc)
{
	if (persist_on && c->s->stored)
		ticket(c, store_issued(st));
	ack_pub(c, type, pid, rc);
}

bool persist_durable(int64_t t)
{
	return t <= 0 || (t != INT64_MAX && store_durable(st) >= t);
}

int persist_wait_ticket(int64_t t, int64_t deadline)
{
	if (t <= 0)
		return 0;
	return t == INT64_MAX ? -EIO : store_wait(st, t, deadline);
}

int persist_wait(conn *c)
{
	int64_t t = c->ticket;
	c->ticket = 0;
	if (t < 0)
		return -EIO;
	return persist_wait_ticket(t, WEFT_FOREVER);
}

#else /* built without SQLite: persistence true stops the broker at start */

int persist_open(void)
{
	if (!conf.persistence)
		return 0;
	fprintf(stderr, "weft-mqtt: persistence needs a weft-mqtt built with SQLite\n");
	return -1;
}

void persist_close(void) {}
void persist_session(session *s, bool connected, conn *by) { (void)s, (void)connected, (void)by; }
void persist_session_gone(session *s, conn *by) { (void)s, (void)by; }
void persist_will_gone(session *s) { (void)s; }
void persist_release(uint64_t smid) { (void)smid; }
void persist_sub(session *s, const char *f, uint16_t len, uint8_t opts, uint32_t subid, conn *by)
{
	(void)s, (void)f, (void)len, (void)opts, (void)subid, (void)by;
}
void persist_unsub(session *s, const char *f, uint16_t len, conn *by)
{
	(void)s, (void)f, (void)len, (void)by;
}
int64_t persist_enqueue(session *s, dlv *d, conn *by) { return (void)s, (void)d, (void)by, 0; }
int64_t persist_inflight(session *s, dlv *d) { return (void)s, (void)d, 0; }
bool persist_group_begin(session *s) { return (void)s, false; }
void persist_group_end(void) {}
bool persist_ok(void) { return true; }
void ack_earlier(conn *c, int type, uint16_t pid, int rc) { ack_pub(c, type, pid, rc); }
bool persist_durable(int64_t t) { return (void)t, true; }
int persist_wait_ticket(int64_t t, int64_t deadline) { return (void)t, (void)deadline, 0; }
void persist_ack(session *s, uint16_t pid) { (void)s, (void)pid; }
void persist_rel(session *s, uint16_t pid, bool add, conn *by)
{
	(void)s, (void)pid, (void)add, (void)by;
}
void persist_retained(const msg *m, conn *by) { (void)m, (void)by; }
int persist_wait(conn *c)
{
	c->ticket = 0;
	return 0;
}

#endif
