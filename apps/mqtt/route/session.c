/*
 * session.c - sessions: what the broker keeps for a client id, the table of them, and their
 * lives: attach, take-over, detach, expiry, the will, restoring them from the store.
 *
 * A session holds the client's subscriptions (as records, to remove them from the tree when it
 * ends), its outbound QoS 1/2 state, its will, and its output buffer. One weft_mutex per
 * session guards all of it; nothing on the publish path takes a lock wider than one session.
 *
 * How messages get to a session - its output, packet ids, window, queue and acknowledgements -
 * is delivery.c's; writing the output to the socket is writer.c's.
 *
 * Lifetime. The session table holds a reference, an attached connection another. When the
 * last goes, the session is retired through epoch.c, because a publisher may have read it out
 * of a subscriber array just before the subscription was removed.
 *
 * Ownership. A session belongs to the identity that made it: the username the client proved
 * (against password_file, or the certificate's CN under use_identity_as_username), or nobody
 * for an anonymous client - and for every client where nothing checks usernames. A CONNECT
 * with its client id from another identity is refused (not authorized) before anything of the
 * session is touched: it neither resumes the session, nor discards it with clean start, nor
 * kicks the connection attached to it. Rejected: starting the newcomer on a clean session,
 * which hands anyone who learns a client id the power to destroy its owner's queued messages
 * and to knock its owner off the broker.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include <weft.h>

#include "access.h"
#include "codec.h"
#include "conf.h"
#include "epoch.h"
#include "msg.h"
#include "peer.h"
#include "persist.h"
#include "pool.h"
#include "records.h"
#include "retained.h"
#include "session.h"
#include "stats.h"
#include "topic.h"

#define NBUCKETS 16384

static session *table[NBUCKETS];
static weft_mutex tlock = WEFT_MUTEX_INIT;
static long nsessions;

static uint32_t id_hash(const char *id, uint16_t n)
{
	uint32_t h = 2166136261u;
	for (uint16_t i = 0; i < n; i++)
		h = (h ^ (uint8_t)id[i]) * 16777619u;
	return h;
}

long sessions_count(void)
{
	long n = 0;
	WEFT_WITH_LOCK(&tlock)
		n = nsessions;
	return n;
}

static session *find(const char *id, uint16_t n, uint32_t h)
{
	for (session *s = table[h % NBUCKETS]; s; s = s->hnext)
		if (s->hash == h && s->id_len == n && !memcmp(s->client_id, id, n))
			return s;
	return NULL;
}

static void unlink_locked(session *s)
{
	session **pp = &table[s->hash % NBUCKETS];
	while (*pp && *pp != s)
		pp = &(*pp)->hnext;
	if (*pp) {
		*pp = s->hnext;
		nsessions--;
	}
}

static void session_free(void *p)
{
	session *s = p;
	access_unbind(s);
	free(s->client_id);
	free(s->owner);
	free(s->rel_ids);
	free(s);
}

void session_unref(session *s)
{
	if (atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) == 1)
		epoch_retire(s, session_free);
}

static void dlv_free_list(delivery *d)
{
	while (d) {
		delivery *n = d->next;
		msg_unref(d->m);
		pool_free(d);
		d = n;
	}
}

/* Take s's will to publish it (lock of s held). Its message expiry counts from now: a will
 * published after a delay or a restart is not born old. */
static msg *take_will(session *s)
{
	msg *m = s->will;
	s->will = NULL;
	if (m && s->will_expiry)
		m->expiry = weft_now() + (int64_t)s->will_expiry * 1000000000;
	return m;
}

/* The session ends: out of the tree, its messages released. Not in the table any more. */
static void session_end(session *s)
{
	subrec *subs = NULL;
	delivery *q = NULL, *inf = NULL;
	msg *will = NULL;
	WEFT_WITH_LOCK(&s->lock) {
		s->dead = true;
		deadline_set(s, 0);
		persist_session_gone(s, NULL);
		subs = s->subs, s->subs = NULL;
		q = s->queue, s->queue = s->queue_tail = NULL;
		inf = s->inflight, s->inflight = s->inflight_tail = NULL;
		stats_add(ST_QUEUED, -(uint64_t)s->nqueued);
		s->nqueued = s->ninflight = 0;
		s->queued_bytes = 0;
		will = take_will(s);
		retained_drop_all(s);
		pool_free(s->out);
		s->out = NULL;
		s->out_len = s->out_cap = 0;
	}
	while (subs) {
		subrec *n = subs->next;
		topic_unsubscribe(s, subs->filter, subs->len);
		free(subs);
		subs = n;
	}
	dlv_free_list(q);
	dlv_free_list(inf);
	msg_unref(will);
	session_unref(s);
}

/* Publish s's will m, if its client may still write there (checked again now, as mosquitto
 * does: the CONNECT's check may be a reload or a restart old). */
static void publish_will(session *s, msg *m)
{
	if (!access_will_allowed(s, m)) {
		if (conf.verbose)
			fprintf(stderr, "weft-mqtt: will of %.*s not published: its client may no "
					"longer write %.*s\n",
				(int)s->id_len, s->client_id, (int)m->topic_len, m->topic);
		msg_unref(m);
		return;
	}
	if (m->retain) {
		topic_retain(m);
		persist_retained(m, NULL);
	}
	topic_publish(m, NULL, NULL);
	msg_unref(m);
}

static session *session_new(const char *id, uint16_t n, uint32_t h)
{
	session *s = calloc(1, sizeof *s);
	if (!s)
		abort();
	weft_mutex_init(&s->lock);
	weft_cond_init(&s->idle);
	atomic_init(&s->refs, 1);
	s->client_id = malloc(n + 1u);
	if (!s->client_id)
		abort();
	memcpy(s->client_id, id, n);
	s->client_id[n] = 0;
	s->id_len = n;
	s->hash = h;
	s->next_pid = 1;
	return s;
}

/* Set s's owner: user (NUL-terminated, user_len bytes), or NULL for anonymous. */
static void own(session *s, const char *user, uint16_t user_len)
{
	free(s->owner);
	s->owner = NULL;
	s->owner_len = 0;
	s->owner_unknown = false;
	if (user) {
		s->owner = malloc(user_len + 1u);
		if (!s->owner)
			abort();
		memcpy(s->owner, user, user_len);
		s->owner[user_len] = 0;
		s->owner_len = user_len;
	}
}

/* Whether the identity user (NULL: anonymous) may use s. A session restored from a store
 * written before owners were kept goes to the first identity that connects to it. */
static bool owned_by(const session *s, const char *user, uint16_t user_len)
{
	if (s->owner_unknown)
		return true;
	if (!s->owner || !user)
		return !s->owner && !user;
	return s->owner_len == user_len && !memcmp(s->owner, user, user_len);
}

/* A client id for a 5.0 client that sent none: 128 random bits (getrandom), so that knowing
 * one assigned id tells nothing of another. A counter or a clock would let a client that got
 * one id guess its neighbours' and resume their sessions. */
static uint16_t assign_id(char *buf, size_t cap)
{
	uint8_t r[16];
	size_t got = 0;
	while (got < sizeof r) {
		ssize_t k = getrandom(r + got, sizeof r - got, 0);
		if (k < 0 && errno != EINTR)
			abort(); /* Linux >= 3.17 always has it; without it no id is safe to give */
		if (k > 0)
			got += (size_t)k;
	}
	int n = snprintf(buf, cap, "auto-");
	for (size_t i = 0; i < sizeof r; i++)
		n += snprintf(buf + n, cap - (size_t)n, "%02x", r[i]);
	return (uint16_t)n;
}

session *session_attach(conn *c, const char *id, uint16_t n, bool clean, bool *present,
			int *refuse)
{
	char gen[48];
	uint32_t h;
	if (n == 0) { /* 2^-64 odds of meeting an id in use at 2^32 sessions; checked anyway */
		bool taken = true;
		while (taken) {
			n = assign_id(gen, sizeof gen);
			h = id_hash(gen, n);
			WEFT_WITH_LOCK(&tlock)
				taken = find(gen, n, h) != NULL;
		}
		id = gen;
	}
	h = id_hash(id, n);
	session *s = NULL, *old = NULL;
	const char *who = c->user_proven ? c->user : NULL;
	*refuse = MQ_RC_SERVER_UNAVAILABLE;
	/* take over from a connection still attached: kick it, wait for it to let go. Another
	 * newcomer may attach first while we wait: then it is the one attached, and is kicked in
	 * turn (the later CONNECT wins, as the first one did over the old connection). */
	conn *kicked = NULL;
	int64_t give_up = weft_now() + 5000000000;
	for (;;) {
		conn *busy = NULL;
		WEFT_WITH_LOCK(&tlock) {
			s = find(id, n, h);
			if (s && !owned_by(s, who, c->user_len)) {
				*refuse = MQ_RC_NOT_AUTHORIZED;
				s = NULL;
				break; /* out of WEFT_WITH_LOCK, which unlocks */
			}
			if (s)
				WEFT_WITH_LOCK(&s->lock) {
					busy = s->conn;
					if (busy && busy != kicked) { /* under the lock: busy cannot close */
						busy->peer->kick(busy, MQ_RC_SESSION_TAKEN_OVER);
						kicked = busy;
					}
				}
			if (!busy && s && clean) {
				unlink_locked(s);
				old = s;
				s = NULL;
			}
			if (!busy && !s) {
				s = session_new(id, n, h);
				own(s, who, c->user_len);
				s->hnext = table[h % NBUCKETS];
				table[h % NBUCKETS] = s;
				nsessions++;
				*present = false;
			} else if (!busy) {
				*present = true;
			}
			if (!busy) {
				WEFT_WITH_LOCK(&s->lock) {
					if (s->owner_unknown)
						own(s, who, c->user_len);
					s->conn = c;
					atomic_store(&s->online, 1);
					s->will_pending = false;
					s->will_gen++;
					s->expire_at = 0;
					deadline_set(s, 0);
					pool_free(s->out);
					s->out = NULL;
					s->out_len = s->out_cap = 0;
				}
				session_ref(s);
			}
		}
		if (!busy)
			break;
		if (weft_now() > give_up) /* the old connection is stuck; refuse */
			return NULL;
		weft_sleep_until(weft_now() + 1000000);
	}
	if (old) {
		msg *will = NULL;
		WEFT_WITH_LOCK(&old->lock) {
			if (old->will_pending)
				will = take_will(old);
			old->will_pending = false;
			/* the CONNACK says "no session": only once that is true on disk too */
			persist_session_gone(old, c);
		}
		if (will)
			publish_will(old, will);
		session_end(old);
	}
	return s;
}

session *session_find(const char *id, uint16_t n)
{
	session *s;
	WEFT_WITH_LOCK(&tlock)
		s = find(id, n, id_hash(id, n));
	return s;
}

session *session_restore(const char *id, uint16_t n, uint8_t version, uint32_t expiry_interval,
			 int64_t expire_at, const char *owner, uint16_t owner_len, bool owner_known)
{
	uint32_t h = id_hash(id, n);
	session *s;
	WEFT_WITH_LOCK(&tlock) {
		s = find(id, n, h);
		if (!s) {
			s = session_new(id, n, h);
			s->hnext = table[h % NBUCKETS];
			table[h % NBUCKETS] = s;
			nsessions++;
		}
		own(s, owner, owner_len);
		s->owner_unknown = !owner_known;
		/* not bound to any rules until its client comes back (a bridge's own session has
		 * no user, and one restored from an older store no known owner: the anonymous rules
		 * would drop what they may read); what it queues meanwhile is checked as it goes
		 * out (delivery.c's fill_window) */
		s->version = version;
		s->expiry_interval = expiry_interval;
		s->expire_at = expire_at;
		s->window = 1;
		s->stored = true;
		WEFT_WITH_LOCK(&s->lock)
			deadline_set(s, session_deadline(s));
	}
	return s;
}

void session_restore_will(session *s, msg *will, uint32_t delay, uint32_t expiry, int64_t at)
{
	WEFT_WITH_LOCK(&s->lock) {
		msg_unref(s->will);
		s->will = will;
		s->will_delay = delay;
		s->will_expiry = expiry;
		s->will_pending = true;
		s->will_at = at;
		s->will_stored = true;
		deadline_set(s, session_deadline(s));
	}
}

/* A session that ends with its connection leaves the table in the same step, under the
 * table's lock, as the connection lets go of it. Rejected: letting go under the session's
 * lock and taking it out of the table after. In between, the session was listed and
 * unattached, so a CONNECT without clean start (a client back at once, or taking over) took
 * it as present and resumed it - and then it ended under that connection: dead, nothing
 * delivered to it, and what it subscribed to afterwards stayed in the tree after it was
 * freed. A client that closes its socket and connects again at once meets that window. */
void session_detach(conn *c, bool publish_will_now)
{
	session *s = c->s;
	msg *will = NULL;
	bool end = false, mine = false;
	int64_t now = weft_now();
	/* conn_end marked c closing under this lock, so no writer starts once this one is done:
	 * the wait is over before the table's lock is taken, not under it. Whether the session
	 * ends is known here already: only its connection, c, changes its expiry while attached. */
	WEFT_WITH_LOCK(&s->lock) {
		while (s->writing)
			weft_cond_wait(&s->idle, &s->lock);
		end = s->expiry_interval == 0;
	}
	/* the table's lock only for a session that leaves it: a persistent one's store write
	 * (persist_session) may wait for the store, and every CONNECT would wait behind it */
	if (end)
		weft_mutex_lock(&tlock);
	weft_mutex_lock(&s->lock);
	s->conn = NULL;
	atomic_store(&s->online, 0);
	pool_free(s->out);
	s->out = NULL;
	s->out_len = s->out_cap = 0;
	if (!publish_will_now) {
		msg_unref(s->will);
		s->will = NULL;
	}
	if (s->will) {
		uint32_t delay = s->will_delay;
		if (delay > s->expiry_interval)
			delay = s->expiry_interval;
		if (delay == 0 || end) {
			will = take_will(s);
		} else {
			s->will_pending = true;
			s->will_at = now + (int64_t)delay * 1000000000;
		}
	}
	if (!end && s->expiry_interval != UINT32_MAX)
		s->expire_at = now + (int64_t)s->expiry_interval * 1000000000;
	if (!end) {
		deadline_set(s, session_deadline(s));
		persist_session(s, false, NULL); /* when it went: its expiry counts from then */
	} else if (find(s->client_id, s->id_len, s->hash) == s) {
		unlink_locked(s);
		mine = true;
	}
	weft_mutex_unlock(&s->lock);
	if (end)
		weft_mutex_unlock(&tlock);
	if (conf.detach_delay_ms)
		weft_sleep_until(weft_now() + (int64_t)conf.detach_delay_ms * 1000000);
	if (will)
		publish_will(s, will);
	if (mine)
		session_end(s);
	c->s = NULL;
	session_unref(s);
}

/* s's deadline has come (deadline_due): publish its will if that is due, end it if it has
 * expired, else file it for what is left. Nothing when a client has come back for it. */
static void reap_one(session *s, int64_t now)
{
	msg *will = NULL;
	bool expired = false;
	WEFT_WITH_LOCK(&tlock) WEFT_WITH_LOCK(&s->lock) {
		if (s->conn || s->dead)
			break;
		if (s->will_pending && s->will_at <= now) {
			will = take_will(s);
			s->will_pending = false;
			persist_will_gone(s);
		}
		/* not in the table: whoever took it out is ending it */
		bool listed = find(s->client_id, s->id_len, s->hash) == s;
		expired = listed && s->expire_at && s->expire_at <= now;
		if (expired) {
			unlink_locked(s);
			if (s->will_pending) /* the session ends before the will delay */
				will = take_will(s);
		} else if (listed) {
			deadline_set(s, session_deadline(s));
		}
	}
	if (will)
		publish_will(s, will);
	if (expired)
		session_end(s);
}

void sessions_reap(int64_t now)
{
	session *s;
	while ((s = deadline_due(now))) {
		reap_one(s, now);
		session_unref(s);
	}
}

void sessions_free_all(void)
{
	deadline_free_all();
	for (int b = 0; b < NBUCKETS; b++)
		while (table[b]) {
			session *s = table[b];
			table[b] = s->hnext;
			session_end(s);
		}
	nsessions = 0;
}

/* ---- the subscriptions a session keeps (to remove them all when it ends) ----------------- */

void subrec_add(session *s, const uint8_t *f, uint16_t len)
{
	WEFT_WITH_LOCK(&s->lock) {
		for (subrec *r = s->subs; r; r = r->next)
			if (r->len == len && !memcmp(r->filter, f, len))
				goto out;
		subrec *r = malloc(sizeof *r + len);
		if (!r)
			abort();
		r->len = len;
		memcpy(r->filter, f, len);
		r->next = s->subs;
		s->subs = r;
	out:;
	}
}

bool subrec_has(session *s, const uint8_t *f, uint16_t len)
{
	bool found = false;
	WEFT_WITH_LOCK(&s->lock)
		for (subrec *r = s->subs; r && !found; r = r->next)
			found = r->len == len && !memcmp(r->filter, f, len);
	return found;
}

void subrec_del(session *s, const uint8_t *f, uint16_t len)
{
	WEFT_WITH_LOCK(&s->lock) {
		for (subrec **pp = &s->subs; *pp; pp = &(*pp)->next)
			if ((*pp)->len == len && !memcmp((*pp)->filter, f, len)) {
				subrec *r = *pp;
				*pp = r->next;
				free(r);
				retained_forget(s, (const char *)f, len);
				break;
			}
	}
}
