/*
 * store.h - weft-mqtt's durable state on SQLite: retained messages, persistent sessions with
 * their subscriptions, queued and inflight QoS 1/2 messages, inbound QoS 2 packet ids. See
 * store.c for the design and docs/weft-mqtt-durability.md for why SQLite and what it costs.
 *
 * Writes are asynchronous and ordered. Every write call copies its arguments, hands them to the
 * store's writer thread and returns at once with a ticket (> 0) - or -errno: -EPIPE after
 * store_close, -ENOMEM, -EINVAL, -EIO when refused (below). The writer applies the writes in ticket order, many per
 * transaction, and makes each transaction durable (fsync) before it reports the tickets in it
 * done (group commit). What is on disk is always every write up to some ticket: a write is
 * never dropped, not even while the store has failed (below), so after a crash the store holds
 * a state the caller had.
 *
 * Failure: when a transaction cannot be written (disk full, I/O error) the store is failed:
 * store_wait returns -EIO for every write not yet durable, and the writer tries the same writes
 * again (10 ms, doubling to 1 s, apart) until they commit - then the store works again, with
 * nothing lost in between. store_failed says which it is now. A failure that lasts while
 * 64 Ki writes pile up ends that: the next write is refused (-EIO), and so is every later one
 * (a group's end aside); nothing more is made durable, not even once the disk has room, and
 * store_failed stays true until the store is opened again, on the last state that was durable
 * - which is every write up to some ticket, as always (store_queue.c says why).
 *
 * The rule that matters: a message whose PUBACK/PUBREC the broker sends must be durable first.
 * So: store_enqueue... for each persistent receiver, then store_wait(last ticket) before
 * writing the PUBACK. A connection task that handled a batch of packets waits once, for the
 * last ticket of the batch; many connections waiting at once share one fsync.
 *
 * Calls may come from any task or thread at once. A write call never waits (so it may be made
 * under a lock): a task waits in store_wait only, parked on a task-aware condition variable.
 * What keeps the writer's backlog bounded is the caller waiting for its writes (the broker
 * does at the end of each batch of packets), and while failed the refusal above. store_open,
 * store_load and store_close do file I/O on the caller: call them at start-up and shutdown, or
 * from a thread of the blocking pool (weft_blocking).
 *
 * Strings (client ids, topics, filters) are byte strings with a length, as on the wire; they
 * need not be NUL-terminated. Times stored are Unix seconds (wall clock), since they must
 * survive a restart: the broker converts its monotonic deadlines.
 */
#ifndef WEFT_MQTT_STORE_H
#define WEFT_MQTT_STORE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct store store;

typedef struct store_opts {
	int max_batch; /* writes per transaction at most; 0: 8192. 1: one commit - one fsync - per
			* write (what group commit saves, for the benchmark) */
	bool no_sync;  /* commit without fsync: survives a process crash, not a power cut.
			* For measuring the cost of fsync only; the broker never sets it. */
	int64_t max_bytes; /* cap on the database file (0: none): a write past it fails the
			    * store, as a full disk does, instead of filling the disk */
	int commit_delay_ms; /* tests only: wait this long before each commit, as a slow disk
			      * would, so that a test can kill the broker while a write is
			      * handed over but not yet durable */
} store_opts;

/*
 * Open (creating it if needed) the store in directory dir (created too, mode 0700): the file
 * dir/weft-mqtt.db and its write-ahead log. Checks the database (SQLite quick_check) so a
 * damaged file is found now, not in the middle of serving. Returns NULL with a message in err
 * (cut to cap): "... is not a database", "... is damaged: ...", "cannot create ...: ...".
 * o may be NULL (defaults).
 */
store *store_open(const char *dir, const store_opts *o, char *err, size_t cap);

/*
 * Make every write made so far durable, stop the writer and close. Returns 0, or -EIO when the
 * store was failed (the writes it could not make are not on disk; store_error, asked before,
 * says why). A
 * task or thread in store_wait meanwhile gets its answer (0, -EIO, or -EPIPE) and st is freed
 * only once it has left; no write call may be made during or after store_close.
 */
int store_close(store *st);

/* Why the store failed (the first time), or "" while it works. */
const char *store_error(store *st);
/* Whether the store cannot write now: its last transaction failed (it is trying again), or a
 * write was refused (it stays failed until it is opened again). */
bool store_failed(store *st);

/* A message as stored. */
typedef struct store_msg {
	const char *topic;
	uint16_t topic_len;
	uint8_t qos;
	uint8_t retain;
	const void *props;     /* 5.0 properties as forwarded (may be NULL) */
	uint32_t props_len;
	const void *payload;
	uint32_t payload_len;
	int64_t expiry;        /* Unix seconds; 0: never expires */
} store_msg;

/* A persistent session, without its subscriptions and messages. */
typedef struct store_session {
	const char *id;
	uint16_t id_len;
	uint8_t version;          /* protocol level: 4 (3.1.1) or 5 */
	uint32_t expiry_interval; /* seconds; UINT32_MAX: never */
	int64_t disconnected_at;  /* Unix seconds, 0 while connected: the expiry counts from it */
	const char *owner;        /* the username it belongs to, NULL: anonymous clients' */
	uint16_t owner_len;
	bool owner_known;         /* false in rows from before owners were kept (schema < 3) */
} store_session;

/* ---- writes: each returns a ticket > 0 or -errno ------------------------------------------ */

/* Set the retained message of m->topic (an empty payload clears it), or clear it. */
int64_t store_put_retained(store *st, const store_msg *m);
int64_t store_del_retained(store *st, const char *topic, uint16_t topic_len);

/* Create or update a session; delete one with everything it holds (subscriptions, queued and
 * inflight messages, QoS 2 ids). */
int64_t store_put_session(store *st, const store_session *s);
int64_t store_del_session(store *st, const char *id, uint16_t id_len);

/* A subscription of session id: filter as subscribed ($share/... included), the SUBSCRIBE
 * options byte, the 5.0 subscription identifier (0: none). Put replaces. */
int64_t store_put_sub(store *st, const char *id, uint16_t id_len, const char *filter,
		      uint16_t filter_len, uint8_t opts, uint32_t subid);
int64_t store_del_sub(store *st, const char *id, uint16_t id_len, const char *filter,
		      uint16_t filter_len);

/* One delivery of a message to a session: what the receiver gets besides the message. */
typedef struct store_dlv {
	uint8_t qos;          /* 1 or 2 */
	uint8_t retain;       /* the RETAIN flag this receiver gets (retain-as-published, or a
			       * retained message sent on subscribe) */
	uint8_t nsubid;       /* 5.0 subscription identifiers it carries, up to 4 */
	uint32_t subid[4];
	/* given back by store_load */
	uint64_t row;         /* the delivery's id: store_inflight's key */
	uint64_t mid;         /* the message's id, shared by the sessions it was queued for */
	uint16_t pid;         /* 0: not sent yet */
	uint8_t state;
} store_dlv;

/*
 * Queue message m for session id as delivery d (qos, retain, subid; pid when it is sent at
 * once, as store_inflight(..., pid, 0) would say, 0 otherwise), after everything queued for it
 * before; *row receives the delivery's id.
 *
 * shared NULL: the message is stored with this delivery alone and goes with its
 * acknowledgement. shared not NULL: the message is stored once for every session it is
 * queued for. *shared is its id, 0 until the first store_enqueue with it stores the message
 * and sets it; later calls (any task) only add a queue row that refers to it. Such a message
 * is *pinned*: no acknowledgement or session deletion removes its row while the caller may
 * still queue it for another session; store_release(*shared) unpins it, and the row goes with
 * the last delivery that refers to it (at once if there is none). Setting *shared and handing
 * the write over happen under one lock, so a write that refers to a message always comes
 * after the one that stored it.
 */
int64_t store_enqueue(store *st, const char *id, uint16_t id_len, const store_msg *m,
		      const store_dlv *d, uint64_t *row, _Atomic uint64_t *shared);
int64_t store_release(store *st, uint64_t mid);
/*
 * Delivery row of session id went out with packet id pid: state 0 PUBLISH sent, 1 PUBREC
 * received and PUBREL sent (QoS 2). After a restart it is resent with the same pid (DUP), or
 * its PUBREL is.
 */
int64_t store_inflight(store *st, const char *id, uint16_t id_len, uint64_t row, uint16_t pid,
		       uint8_t state);
/* The client acknowledged pid (PUBACK, or PUBCOMP for QoS 2): forget that delivery. */
int64_t store_ack(store *st, const char *id, uint16_t id_len, uint16_t pid);

/* Inbound QoS 2: the broker sent PUBREC for pid (add) or got its PUBREL (del). */
int64_t store_rel_add(store *st, const char *id, uint16_t id_len, uint16_t pid);
int64_t store_rel_del(store *st, const char *id, uint16_t id_len, uint16_t pid);

/*
 * The will of session id (a persistent one): message m (m->expiry here is the message expiry
 * interval in seconds, 0 none, since it counts from publication), published `delay` seconds
 * after its connection ends. at: Unix seconds when it is due, once the connection has ended;
 * 0 while the connection is up (after a crash it counts from the next start). Put replaces;
 * del when it was published, cancelled (DISCONNECT, a new connection) or replaced by none.
 */
int64_t store_put_will(store *st, const char *id, uint16_t id_len, const store_msg *m,
		       uint32_t delay, int64_t at);
int64_t store_del_will(store *st, const char *id, uint16_t id_len);

/*
 * The writes the calling task makes between store_group_begin and store_group_end are one unit:
 * a crash keeps all of them or none, and once any of them is durable all are. One group is open
 * at a time: begin waits (a task-aware lock) for the group before to end, so make no other
 * store_group_begin, nor wait for anything another task's group may need, in between. Both
 * return a ticket or -errno (begin: no group is open then).
 */
int64_t store_group_begin(store *st);
int64_t store_group_end(store *st);

/* ---- durability -------------------------------------------------------------------------- */

/*
 * Wait until the write with this ticket (and so every earlier one) is durable. From a task it
 * parks the task; from a thread it sleeps the thread. Returns 0; -EIO when the store is failed
 * and the ticket not durable (do not acknowledge the write: it may be lost in a crash, or
 * become durable once the store recovers); -ETIMEDOUT; -ECANCELED; -EPIPE when store_close
 * ended the wait.
 */
int store_wait(store *st, int64_t ticket, int64_t deadline);
/* The highest ticket known durable (a snapshot, never waits). */
int64_t store_durable(store *st);
/* The last ticket handed out: waiting for it waits for every write made so far. */
int64_t store_issued(store *st);

/* Counters since store_open: writes applied and transactions committed (each one fsync). */
typedef struct store_stats {
	uint64_t writes, commits;
	int64_t commit_ns; /* time spent committing (fsync included) */
} store_stats;
void store_stats_get(store *st, store_stats *out);

/* ---- start-up ---------------------------------------------------------------------------- */

/* What store_load gives back; NULL callbacks are skipped. Pointers are valid during the call. */
typedef struct store_callbacks {
	void (*session)(void *arg, const store_session *s);
	void (*sub)(void *arg, const char *id, uint16_t id_len, const char *filter,
		    uint16_t filter_len, uint8_t opts, uint32_t subid);
	/* queued and inflight deliveries of each session in the order they were queued */
	void (*queued)(void *arg, const char *id, uint16_t id_len, const store_msg *m,
		       const store_dlv *d);
	void (*rel)(void *arg, const char *id, uint16_t id_len, uint16_t pid);
	void (*will)(void *arg, const char *id, uint16_t id_len, const store_msg *m,
		     uint32_t delay, int64_t at);
	void (*retained)(void *arg, const store_msg *m);
} store_callbacks;

/*
 * Read everything back, at start-up: sessions first, then their subscriptions, queued
 * messages, QoS 2 ids and wills, then retained messages. Deliveries not sent yet whose message
 * expired while the broker was down, and expired retained messages, are deleted at
 * store_open and not given back. Returns 0, or -EIO with store_error saying what (a damaged
 * database).
 */
int store_load(store *st, const store_callbacks *cb, void *arg);

#endif
