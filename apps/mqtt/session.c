/*
 * session.c - sessions: what the broker keeps for a client id, and how messages get to it.
 *
 * A session holds the client's subscriptions (as records, to remove them from the tree when it
 * ends), its outbound QoS 1/2 state, its will, and its output buffer. One weft_mutex per
 * session guards all of it; nothing on the publish path takes a lock wider than one session.
 *
 * Delivery. A publisher's task encodes each delivery straight into the receiving session's
 * output buffer (QoS 0, or QoS 1/2 within the client's receive window) or queues a reference
 * to the shared message (QoS 1/2 beyond the window, or while the client is offline, up to
 * max_queued_messages and max_queued_bytes of payload, whichever comes first; QoS 0 beyond
 * qos0_queue_bytes of unsent output is dropped and counted). So what a client that reads
 * nothing costs is bounded: qos0_queue_bytes plus a window of messages in its output (and
 * as much again in the buffer its writer task holds), plus its queue's references.
 * It then notes the session as dirty in its own connection; at the end of the batch of
 * packets it read, the publisher flushes every dirty session: one write() carries every
 * message queued for that client since its last write. Under load a batch holds many
 * messages, so the broker makes far fewer system calls than messages.
 *
 * Writing. Whoever flushes takes the buffer (the `writing` flag makes one writer at a time),
 * writes it without waiting (a deadline already past), and loops while more arrived. If the
 * socket does not take everything, the rest goes to a writer task spawned for the purpose,
 * which waits for the socket and keeps draining until the buffer is empty, then ends: an idle
 * connection has no writer task and no output buffer. The same task waits when the buffer
 * holds QoS 2 state of a stored session that is not yet durable (out_after).
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>

#include "bridge.h"
#include "broker.h"

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
		ebr_retire(s, session_free);
}

static void dlv_free_list(dlv *d)
{
	while (d) {
		dlv *n = d->next;
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
	dlv *q = NULL, *inf = NULL;
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

static void publish_will(msg *m)
{
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
	/* take over from a connection still attached: kick it, wait for it to let go */
	for (int tries = 0;; tries++) {
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
					if (busy && tries == 0) /* under the lock: busy cannot close */
						conn_kick(busy, MQ_RC_SESSION_TAKEN_OVER);
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
		if (tries > 5000) /* 5 s: the old connection is stuck; refuse */
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
			publish_will(will);
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
		/* what it may read until its client binds again: its owner's rules (the anonymous
		 * ones where the owner was not kept), never none at all */
		access_bind(s, owner, owner_len);
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

static void inflight_append(session *s, dlv *d);
static void queue_append(session *s, dlv *d);

void session_restore_dlv(session *s, const dlv *proto)
{
	dlv *d = pool_alloc(sizeof *d);
	*d = *proto;
	msg_ref(d->m);
	uint16_t pid = d->pid;
	WEFT_WITH_LOCK(&s->lock) {
		if (pid) {
			inflight_append(s, d);
			if (pid >= s->next_pid)
				s->next_pid = (uint16_t)(pid + 1) ? (uint16_t)(pid + 1) : 1;
		} else {
			queue_append(s, d);
		}
	}
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
		publish_will(will);
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
		publish_will(will);
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

/* ---- output --------------------------------------------------------------------------------- */

/* Whether s's connection still takes output: attached and not being torn down. Output added
 * once it closes would be discarded unwritten, and a QoS 1/2 delivery with it would stay inflight
 * as if sent: resent on the client's return even after its message expired. Lock held. */
static bool taking_output(const session *s)
{
	return s->conn && !s->conn->closing;
}

static uint8_t *out_room(session *s, size_t n)
{
	if (s->out_len + n > s->out_cap) {
		size_t want = (s->out_len + n) * 2;
		if (want < 4096 - 16)
			want = 4096 - 16;
		uint8_t *b = pool_alloc(want);
		if (s->out_len)
			memcpy(b, s->out, s->out_len);
		pool_free(s->out);
		s->out = b;
		s->out_cap = (uint32_t)pool_size(b);
	}
	uint8_t *p = s->out + s->out_len;
	s->out_len += (uint32_t)n;
	return p;
}

/* The topic alias to use for topic on c (0: none); *fresh when the mapping is new (the topic
 * must then be sent with it). */
static uint16_t alias_for(conn *c, const msg *m, bool *fresh)
{
	*fresh = false;
	if (!c->out_alias_max)
		return 0;
	uint32_t h = 2166136261u;
	for (uint16_t i = 0; i < m->topic_len; i++)
		h = (h ^ (uint8_t)m->topic[i]) * 16777619u;
	for (uint16_t i = 0; i < c->out_alias_n; i++) {
		alias_ent *a = &c->out_alias[i];
		if (a->hash == h && a->len == m->topic_len && !memcmp(a->topic, m->topic, a->len))
			return (uint16_t)(i + 1);
	}
	if (c->out_alias_n >= c->out_alias_max)
		return 0;
	if (!c->out_alias) {
		c->out_alias = calloc(c->out_alias_max, sizeof(alias_ent));
		if (!c->out_alias)
			abort();
	}
	alias_ent *a = &c->out_alias[c->out_alias_n];
	a->topic = malloc(m->topic_len + 1u);
	if (!a->topic)
		abort();
	memcpy(a->topic, m->topic, m->topic_len);
	a->hash = h;
	a->len = m->topic_len;
	*fresh = true;
	return ++c->out_alias_n;
}

/* Encode a PUBLISH of m into s's output. Lock held, s->conn set. Returns 0, or -1 when the
 * client's maximum packet size does not allow it (dropped). */
static int encode_pub(session *s, msg *m, int qos, uint16_t pid, int dup, int retain,
		      const uint32_t *subids, int nsub, int64_t now)
{
	conn *c = s->conn;
	uint8_t pre[64];
	mq_pb pb = { pre, 0, sizeof pre, 0 };
	const char *topic = m->topic;
	uint16_t tlen = m->topic_len;
	char *mapped = NULL; /* a bridge's: the topic in the remote's terms */
	if (c->bridge && bridge_out_topic(c, m, &topic, &tlen, &mapped, &retain) < 0)
		return -1;
	mq_pub_enc e = { s->version, qos, dup, retain, pid, topic, tlen, NULL, 0,
			 m->payload, m->payload_len, NULL, 0 };
	if (s->version == 5) {
		if (m->expiry) {
			int64_t left = (m->expiry - now + 999999999) / 1000000000;
			mq_pb_u32(&pb, MQ_P_MESSAGE_EXPIRY, (uint32_t)(left > 0 ? left : 1));
		}
		for (int i = 0; i < nsub; i++)
			mq_pb_varint(&pb, MQ_P_SUBSCRIPTION_ID, subids[i]);
		e.props = pre;
		e.props_len = pb.len;
		e.props2 = m->props;
		e.props2_len = m->props_len;
		if (s->max_packet && mq_enc_publish_len(&e) > s->max_packet) {
			free(mapped);
			return -1;
		}
		bool fresh;
		uint16_t alias = c->out_alias_max ? alias_for(c, m, &fresh) : 0;
		if (alias) {
			mq_pb_u16(&pb, MQ_P_TOPIC_ALIAS, alias);
			e.props_len = pb.len;
			if (!fresh)
				e.topic_len = 0;
		}
	}
	size_t n = mq_enc_publish_len(&e);
	if (c->bridge && s->max_packet && n > s->max_packet) { /* bridge_max_packet_size */
		free(mapped);
		return -1;
	}
	mq_enc_publish(out_room(s, n), &e);
	free(mapped);
	stats_add(ST_PUB_SENT, 1);
	stats_add(ST_MSG_SENT, 1);
	return 0;
}

static uint16_t new_pid(session *s)
{
	for (;;) {
		uint16_t p = s->next_pid++;
		if (!s->next_pid)
			s->next_pid = 1;
		bool used = false;
		for (dlv *d = s->inflight; d && !used; d = d->next)
			used = d->pid == p;
		if (!used)
			return p;
	}
}

static void inflight_append(session *s, dlv *d)
{
	d->next = NULL;
	if (s->inflight_tail)
		s->inflight_tail->next = d;
	else
		s->inflight = d;
	s->inflight_tail = d;
	s->ninflight++;
}

/* The queue beyond the inflight window, counted in messages and payload bytes (the two limits
 * of max_queued_messages and max_queued_bytes). Lock held. */
static void queue_append(session *s, dlv *d)
{
	d->next = NULL;
	if (s->queue_tail)
		s->queue_tail->next = d;
	else
		s->queue = d;
	s->queue_tail = d;
	s->nqueued++;
	s->queued_bytes += d->m->payload_len;
	stats_add(ST_QUEUED, 1);
}

static dlv *queue_pop(session *s)
{
	dlv *d = s->queue;
	s->queue = d->next;
	if (!s->queue)
		s->queue_tail = NULL;
	s->nqueued--;
	s->queued_bytes -= d->m->payload_len;
	stats_add(ST_QUEUED, -(uint64_t)1);
	return d;
}

/* s's output from now on goes out once store write t is durable (failed: never). A stored QoS 2
 * PUBLISH with id X waits for X to be on disk (else a crash frees X while the client holds it:
 * the next message with X is taken for a resend and lost), a PUBREL for its PUBREC (else the
 * PUBLISH is resent after a crash to a client done with X: delivered twice). QoS 1 may be
 * resent anyway: it does not wait. Lock held. */
static void out_after(session *s, int qos, int64_t t)
{
	if (qos != 2)
		return;
	if (t < 0)
		t = INT64_MAX;
	if (t > s->out_ticket)
		s->out_ticket = t;
}

static dlv *dlv_new(msg *m, int qos, int retain, const uint32_t *subids, int nsub)
{
	dlv *d = pool_alloc(sizeof *d);
	*d = (dlv){ NULL, msg_ref(m), 0, (uint8_t)qos, (uint8_t)retain, 0, (uint8_t)nsub, { 0 }, 0 };
	memcpy(d->subid, subids, (size_t)nsub * sizeof *subids);
	return d;
}

/* Send d now: it becomes inflight (or is dropped when too large). Lock held, connected. */
/* A stored delivery dropped (expired, too large for the client): the store forgets it too.
 * The store deletes deliveries by packet id, so one that never had an id gets one first. */
static void forget(session *s, dlv *d)
{
	if (!d->mid)
		return;
	if (!d->pid) {
		d->pid = new_pid(s);
		persist_inflight(s, d);
	}
	persist_ack(s, d->pid);
}

static void start(session *s, dlv *d, int64_t now)
{
	bool known = d->pid != 0; /* given before it was stored: the store has it already */
	if (!known)
		d->pid = new_pid(s);
	d->state = 0;
	if (d->mid && !known)
		out_after(s, d->qos, persist_inflight(s, d));
	if (encode_pub(s, d->m, d->qos, d->pid, 0, d->retain, d->subid, d->nsub, now) < 0) {
		stats_add(ST_PUB_DROPPED, 1);
		if (d->mid)
			persist_ack(s, d->pid);
		msg_unref(d->m);
		pool_free(d);
		return;
	}
	inflight_append(s, d);
}

/* Move queued messages into the window. Lock held. */
static void fill_window(session *s)
{
	if (!taking_output(s))
		return;
	int64_t now = weft_now();
	while (s->queue && s->ninflight < s->window) {
		dlv *d = queue_pop(s);
		/* checked against the client's rules again as it goes out: they were the session's
		 * binding when it was queued, and may have been reloaded since */
		bool expired = msg_expired(d->m, now);
		if (expired || !access_read(s, d->m)) {
			stats_add(expired ? ST_DROP_EXPIRED : ST_PUB_DROPPED, 1);
			forget(s, d);
			msg_unref(d->m);
			pool_free(d);
			continue;
		}
		start(s, d, now);
	}
}

/* After output was added under the lock: should `by` flush s at the end of its batch? */
static bool want_flush(session *s, conn *by)
{
	if (!taking_output(s) || !s->out_len || s->writing)
		return false;
	if (!by)
		return true;
	if (s->dirty_owner == by && s->dirty_batch == by->batch)
		return false; /* already in by's list */
	s->dirty_owner = by;
	s->dirty_batch = by->batch;
	return true;
}

static void after(session *s, conn *by, bool flush)
{
	if (!flush)
		return;
	if (by)
		conn_mark_dirty(by, s);
	else
		session_flush(s);
}

void session_deliver(session *s, msg *m, int qos, int retain, const uint32_t *subids, int nsub,
		     conn *by)
{
	bool flush = false, dropped = false;
	int64_t now = m->expiry ? weft_now() : 0;
	weft_mutex_lock(&s->lock);
	if (s->dead) {
		weft_mutex_unlock(&s->lock);
		return;
	}
	if (qos == 0) {
		if (!taking_output(s) || s->out_len > conf.qos0_queue_bytes) {
			dropped = true;
			stats_add(ST_DROP_QOS0, 1);
		} else
			dropped = encode_pub(s, m, 0, 0, 0, retain, subids, nsub, now) < 0;
	} else if (taking_output(s) && !s->queue && s->ninflight < s->window) {
		dlv *d = dlv_new(m, qos, retain, subids, nsub);
		if (s->stored) { /* stored as sent already: one write instead of two */
			d->pid = new_pid(s);
			out_after(s, qos, persist_enqueue(s, d, by));
		}
		start(s, d, now);
	} else if (s->nqueued >= (uint32_t)conf.max_queued_messages) {
		dropped = true;
		stats_add(ST_DROP_QUEUE_FULL, 1);
	} else if (conf.max_queued_bytes &&
		   s->queued_bytes + m->payload_len > (uint64_t)conf.max_queued_bytes) {
		dropped = true;
		stats_add(ST_DROP_QUEUE_BYTES, 1);
	} else {
		dlv *d = dlv_new(m, qos, retain, subids, nsub);
		if (s->stored)
			persist_enqueue(s, d, by);
		queue_append(s, d);
	}
	flush = want_flush(s, by);
	weft_mutex_unlock(&s->lock);
	if (dropped)
		stats_add(ST_PUB_DROPPED, 1);
	after(s, by, flush);
}

void session_send(session *s, const void *pkt, size_t n, conn *by)
{
	bool flush = false;
	WEFT_WITH_LOCK(&s->lock) {
		if (!taking_output(s))
			break;
		memcpy(out_room(s, n), pkt, n);
		flush = want_flush(s, by);
	}
	stats_add(ST_MSG_SENT, 1);
	after(s, by, flush);
}

static void writer(void *arg);

void session_flush(session *s)
{
	weft_mutex_lock(&s->lock);
	conn *c = s->conn;
	if (s->writing || !c || !s->out_len || c->closing) {
		weft_mutex_unlock(&s->lock);
		return;
	}
	s->writing = true;
	for (;;) {
		uint8_t *buf = s->out;
		uint32_t len = s->out_len;
		int64_t need = s->out_ticket;
		s->out = NULL;
		s->out_len = s->out_cap = 0;
		weft_mutex_unlock(&s->lock);
		buf = conn_frame(c, buf, &len);
		/* QoS 2 state not yet durable (out_after): the writer task waits for it, not us */
		ssize_t n = persist_durable(need) ? conn_write(c, buf, len, 0) : 0;
		weft_mutex_lock(&s->lock);
		if (n == (ssize_t)len) {
			stats_add(ST_BYTES_SENT, len);
			pool_free(buf);
			if (s->out_len && s->conn == c && !c->closing)
				continue;
			break;
		}
		if (n >= 0 || n == -ETIMEDOUT) { /* the socket is full: a writer task waits */
			c->wbuf = buf;
			c->wlen = len;
			c->woff = n > 0 ? (uint32_t)n : 0;
			c->wneed = need;
			weft_spawn_opts o = { .name = "mqtt-writer", .detached = 1 };
			if (weft_spawn_opt(writer, c, &o)) {
				weft_mutex_unlock(&s->lock);
				return;
			}
			pool_free(c->wbuf);
			c->wbuf = NULL;
		} else {
			pool_free(buf);
		}
		shutdown(c->fd, SHUT_RDWR); /* broken: the reader will see it and end */
		break;
	}
	s->writing = false;
	weft_cond_broadcast(&s->idle);
	weft_mutex_unlock(&s->lock);
}

/* Drain c's session output while the socket pushes back, or once the store has what it waits
 * for (a store that failed: the connection ends, the client gets it all again on its return);
 * ends when the output is empty. */
static void writer(void *arg)
{
	conn *c = arg;
	session *s = c->s;
	for (;;) {
		ssize_t n = -EIO;
		if (persist_wait_ticket(c->wneed, WEFT_FOREVER) == 0)
			n = conn_write(c, c->wbuf + c->woff, c->wlen - c->woff, WEFT_FOREVER);
		if (n > 0)
			stats_add(ST_BYTES_SENT, (uint64_t)n);
		pool_free(c->wbuf);
		c->wbuf = NULL;
		weft_mutex_lock(&s->lock);
		if (n != (ssize_t)(c->wlen - c->woff))
			shutdown(c->fd, SHUT_RDWR);
		else if (s->out_len && !c->closing) {
			uint8_t *buf = s->out;
			uint32_t len = s->out_len;
			c->wneed = s->out_ticket;
			s->out = NULL;
			s->out_len = s->out_cap = 0;
			weft_mutex_unlock(&s->lock);
			c->wbuf = conn_frame(c, buf, &len);
			c->wlen = len;
			c->woff = 0;
			continue;
		}
		s->writing = false;
		weft_cond_broadcast(&s->idle);
		weft_mutex_unlock(&s->lock);
		return;
	}
}

/* ---- acknowledgements ----------------------------------------------------------------------- */

/* Unlink and return the inflight delivery with pid (and qos, state), or NULL. Lock held. */
static dlv *inflight_find(session *s, uint16_t pid, int qos, int state, bool unlink)
{
	dlv *prev = NULL;
	for (dlv *d = s->inflight; d; prev = d, d = d->next) {
		if (d->pid != pid)
			continue;
		if (d->qos != qos || d->state != state)
			return NULL;
		if (unlink) {
			if (prev)
				prev->next = d->next;
			else
				s->inflight = d->next;
			if (s->inflight_tail == d)
				s->inflight_tail = prev;
			s->ninflight--;
		}
		return d;
	}
	return NULL;
}

static void done(session *s, dlv *d)
{
	if (d->mid)
		persist_ack(s, d->pid);
	msg_unref(d->m);
	pool_free(d);
	fill_window(s);
}

/* The last acknowledgement of an outbound flow (PUBACK of QoS 1, PUBCOMP of QoS 2 after
 * PUBREC): the delivery is done. */
static void flow_ends(session *s, uint16_t pid, int qos, int state, conn *by)
{
	bool flush = false;
	WEFT_WITH_LOCK(&s->lock) {
		dlv *d = inflight_find(s, pid, qos, state, true);
		if (d)
			done(s, d);
		flush = want_flush(s, by);
	}
	after(s, by, flush);
}

void session_puback(session *s, uint16_t pid, conn *by)
{
	flow_ends(s, pid, 1, 0, by);
}

void session_pubrec(session *s, uint16_t pid, int reason, conn *by)
{
	bool flush = false;
	WEFT_WITH_LOCK(&s->lock) {
		dlv *d = inflight_find(s, pid, 2, 0, reason >= 0x80);
		if (d && reason >= 0x80) {
			done(s, d); /* the client refused it: the flow ends here */
		} else {
			if (d) {
				d->state = 1;
				if (d->mid) /* the PUBREL waits for it */
					out_after(s, 2, persist_inflight(s, d));
			}
			if (!taking_output(s))
				break; /* the PUBREL goes out when the client is back (session_resume) */
			uint8_t pkt[8];
			size_t n = mq_enc_ack(pkt, s->version, MQ_PUBREL, pid,
					      d ? 0 : MQ_RC_PACKET_ID_NOT_FOUND, NULL);
			memcpy(out_room(s, n), pkt, n);
		}
		flush = want_flush(s, by);
	}
	after(s, by, flush);
}

void session_pubcomp(session *s, uint16_t pid, conn *by)
{
	flow_ends(s, pid, 2, 1, by);
}

void session_resume(session *s, conn *by)
{
	bool flush = false;
	int64_t now = weft_now();
	WEFT_WITH_LOCK(&s->lock) {
		dlv *prev = NULL;
		for (dlv *d = s->inflight; d;) {
			dlv *next = d->next;
			int r = 0;
			if (d->state == 0 && !access_read(s, d->m)) { /* the rules changed */
				r = -1;
			} else if (d->state == 0) {
				r = encode_pub(s, d->m, d->qos, d->pid, 1, d->retain, d->subid, d->nsub, now);
			} else {
				uint8_t pkt[8];
				size_t n = mq_enc_ack(pkt, s->version, MQ_PUBREL, d->pid, 0, NULL);
				memcpy(out_room(s, n), pkt, n);
			}
			if (r < 0) { /* too large for this connection, or not to be read: dropped */
				if (d->mid)
					persist_ack(s, d->pid);
				if (prev)
					prev->next = next;
				else
					s->inflight = next;
				if (s->inflight_tail == d)
					s->inflight_tail = prev;
				s->ninflight--;
				msg_unref(d->m);
				pool_free(d);
			} else {
				prev = d;
			}
			d = next;
		}
		fill_window(s);
		flush = want_flush(s, by);
	}
	after(s, by, flush);
}

int session_rel_add(session *s, uint16_t pid, int max)
{
	int r = 0;
	WEFT_WITH_LOCK(&s->lock) {
		for (uint16_t i = 0; i < s->nrel; i++)
			if (s->rel_ids[i] == pid) {
				r = 1;
				break;
			}
		if (r)
			break;
		if (s->nrel >= max) {
			r = -1;
			break;
		}
		if (s->nrel == s->rel_cap) {
			uint16_t cap = s->rel_cap ? (uint16_t)(s->rel_cap * 2) : 8;
			uint16_t *v = realloc(s->rel_ids, cap * sizeof *v);
			if (!v)
				abort();
			s->rel_ids = v;
			s->rel_cap = cap;
		}
		s->rel_ids[s->nrel++] = pid;
	}
	return r;
}

bool session_rel_del(session *s, uint16_t pid)
{
	bool found = false;
	WEFT_WITH_LOCK(&s->lock) {
		for (uint16_t i = 0; i < s->nrel; i++)
			if (s->rel_ids[i] == pid) {
				s->rel_ids[i] = s->rel_ids[--s->nrel];
				found = true;
				break;
			}
	}
	return found;
}
