/*
 * persist.c - `persistence true`: what the broker writes to the store (store.c, SQLite), and
 * the store's opening and reading back at start for restore.c, which puts what is read where
 * it belongs (above route/, which it rebuilds; persist/ below route/ only writes).
 *
 * The rule is that a PUBACK, PUBREC or PUBCOMP (and a SUBACK, an UNSUBACK, a CONNACK) goes
 * out only once what the broker promised with it is on disk. Every store call returns at once
 * with a ticket; the connection that read a batch of packets keeps the highest ticket its
 * handlers got (c->ticket) and its PUBACK/PUBREC/PUBCOMPs in a list (c->acks, conn/acks.c)
 * instead of its session's output (the other replies are in that output, written after the
 * wait). At the end of the batch it waits once for that ticket, then sends the
 * acknowledgements in order: one fsync, shared with every other
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
 * message pinned until the msg's last reference goes (msg_unref calls persist_release, through
 * the hook msg_stored_release that persist_open installs: base/ sits below persist/), since
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
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <weft.h>

#include "conf.h"
#include "msg.h"
#include "persist.h"
#include "records.h"

bool persist_on;

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

int64_t persist_mono_from_unix(int64_t unix_s)
{
	int64_t left = unix_s * 1000000000 - real_ns();
	return weft_now() + (left > 0 ? left : 0);
}

uint32_t persist_seconds_left(int64_t unix_s)
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

/* The hook msg.c calls when a stored message's last reference goes. */
static void persist_release(uint64_t smid);

int persist_open(const struct store_callbacks *cb, void *arg)
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
	msg_stored_release = persist_release;
	if (store_load(st, cb, arg) < 0) {
		fprintf(stderr, "weft-mqtt: persistence: %s\n", store_error(st));
		store_close(st);
		st = NULL;
		return -1;
	}
	return 0;
}

void persist_start(void)
{
	if (st)
		persist_on = true;
}

void persist_close(long open_conns)
{
	if (!st)
		return;
	/* A connection that did not end may still write, or be in store_wait: the store stays
	 * open under it, and the exit leaves the database as a crash would (everything
	 * acknowledged is durable already). Rejected: closing it anyway, which freed the store
	 * under those tasks. */
	long left = open_conns;
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
int64_t persist_enqueue(session *s, delivery *d, conn *by)
{
	store_msg sm;
	to_store(d->m, &sm);
	store_dlv sd = { .qos = d->qos, .retain = d->retain, .nsubid = d->nsub, .pid = d->pid };
	memcpy(sd.subid, d->subid, sizeof sd.subid);
	return ticket(by, store_enqueue(st, s->client_id, s->id_len, &sm, &sd, &d->mid,
					&d->m->smid));
}

static void persist_release(uint64_t smid)
{
	if (persist_on)
		ticket(NULL, store_release(st, smid));
}

int64_t persist_inflight(session *s, delivery *d)
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
void persist_cover_earlier(conn *c)
{
	if (persist_on && c->s->stored)
		ticket(c, store_issued(st));
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

int persist_open(const struct store_callbacks *cb, void *arg)
{
	(void)cb, (void)arg;
	if (!conf.persistence)
		return 0;
	fprintf(stderr, "weft-mqtt: persistence needs a weft-mqtt built with SQLite\n");
	return -1;
}

int64_t persist_mono_from_unix(int64_t unix_s) { return (void)unix_s, weft_now(); }
uint32_t persist_seconds_left(int64_t unix_s) { return (void)unix_s, 0; }
void persist_start(void) {}
void persist_close(long open_conns) { (void)open_conns; }
void persist_session(session *s, bool connected, conn *by) { (void)s, (void)connected, (void)by; }
void persist_session_gone(session *s, conn *by) { (void)s, (void)by; }
void persist_will_gone(session *s) { (void)s; }
void persist_sub(session *s, const char *f, uint16_t len, uint8_t opts, uint32_t subid, conn *by)
{
	(void)s, (void)f, (void)len, (void)opts, (void)subid, (void)by;
}
void persist_unsub(session *s, const char *f, uint16_t len, conn *by)
{
	(void)s, (void)f, (void)len, (void)by;
}
int64_t persist_enqueue(session *s, delivery *d, conn *by) { return (void)s, (void)d, (void)by, 0; }
int64_t persist_inflight(session *s, delivery *d) { return (void)s, (void)d, 0; }
bool persist_group_begin(session *s) { return (void)s, false; }
void persist_group_end(void) {}
bool persist_ok(void) { return true; }
void persist_cover_earlier(conn *c) { (void)c; }
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
