/*
 * store.c - weft-mqtt's durable state: SQLite in WAL mode, one writer thread, group commit.
 *
 * Why SQLite (docs/weft-mqtt-durability.md has the whole argument): a commit in WAL mode with
 * synchronous=FULL is one append to the log and one fsync, about what LMDB's two-page-write
 * commit costs; like LMDB it survives a crash at any instant (a torn commit is never seen:
 * WAL frames carry checksums and a commit marker); and unlike LMDB, which follows the
 * pointers of its memory-mapped file unchecked, a damaged file gives an error code
 * (SQLITE_CORRUPT, SQLITE_NOTADB) rather than a crash - SQLite is fuzzed against exactly that.
 * Both allow one writer at a time, which is what a broker has anyway.
 *
 * The writer. SQLite's calls block on the disk, so no weft worker makes them. Callers - the
 * broker's tasks - put each write, copied into one allocation (an `op`), on a bounded weft
 * channel and get a ticket back: tickets are handed out under `qlock` together with the send,
 * so the channel's order is the ticket order. A dedicated OS thread takes writes off the
 * channel: it waits for one, opens a transaction, applies it and then every write already
 * waiting (up to max_batch), and commits: one fsync for the whole batch. While it fsyncs, the
 * next writes pile up in the channel and go into the next transaction together, so under load
 * a batch grows until fsync time is shared by many messages (group commit) and with one
 * writer at a time the thread never waits for a lock.
 *
 * Completion. After a commit the writer publishes `durable`, the highest ticket committed, and
 * broadcasts a task-aware condition variable; store_wait parks on it until durable reaches its
 * ticket. A connection that handled a batch of publishes waits once, for its last ticket,
 * before sending the PUBACKs.
 *
 * Failure and recovery. If a transaction fails (disk full, I/O error) it is rolled back and the
 * store is failed: every wait returns -EIO (a broker must not acknowledge those writes) until
 * a transaction commits again. The writer keeps the failed transaction's writes and tries them
 * again - after 10 ms, doubling to 1 s - with whatever came since, so when the disk has room
 * again the store recovers by itself. No write is ever dropped, so what is on disk is always
 * every write up to some ticket, never a set with holes: the broker's memory and the disk
 * agree again once the store recovers, and a crash at any moment leaves a state the broker
 * had. (Dropping the writes made during a failure was rejected for that reason: an
 * acknowledgement or a QoS 2 state change lost from the middle would come back after the next
 * restart.) While failed, writes still queue, up to 64 Ki: then the next is refused, and the
 * store is lost until it is opened again (store_queue.c says why): the writer commits
 * nothing more.
 *
 * Groups. Writes between store_group_begin and store_group_end are one unit: the writer never
 * commits inside a group (when max_batch is reached in one, it goes on to the group's end), so
 * a crash keeps all of them or none. One group is open at a time (a task-aware lock), so the
 * writer finds the end of the group it is in after at most one group's writes.
 *
 * The data: sessions(id), subs(id, filter), msgs(mid) holding each message once, queue(id,
 * seq) saying which session holds which message and how it is delivered (QoS, RETAIN flag,
 * subscription ids; pid and state once inflight), rel(id, pid), wills(id), retained(topic).
 *
 * Sharing a message between sessions. A publish routed to N persistent sessions is one msgs
 * row and N queue rows. The row must outlive every delivery that refers to it, including the
 * ones the routing has yet to queue: the first receiver's acknowledgement can reach the store
 * before the routing task has queued the message for the last one. So a shared message is
 * pinned (a row in the in-memory table temp.pins) from the write that stores it until the
 * broker releases it (store_release, when its last in-memory reference goes); while pinned,
 * acknowledgements and session deletions leave its msgs row alone, and the release deletes it
 * if no queue row refers to it any more. Each write applies in one transaction, so a crash
 * never leaves a queue row without its message; what it can leave is a message nobody refers
 * to any more (its pin was in memory), and store_open deletes those.
 *
 * Row ids (queue.seq) and message ids are handed out with the tickets, under qlock, so a
 * caller knows them at once and a write that refers to a message always comes after the one
 * that stored it.
 *
 * Files: this one is the writer thread and SQLite (applying, committing, opening, loading);
 * store_queue.c what callers run (copying a write, its ticket, the hand-over, waiting for it);
 * store_queue.h what both see.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <sqlite3.h>

#include <weft.h>

#include "store_queue.h"

#define DEFAULT_BATCH 8192

/* The prepared statements, by name. */
#define STATEMENTS(X)                                                                          \
	X(ret_put, "INSERT OR REPLACE INTO retained(topic,qos,props,payload,expiry) "           \
		   "VALUES(?1,?2,?3,?4,?5)")                                                    \
	X(ret_del, "DELETE FROM retained WHERE topic=?1")                                       \
	X(ses_put, "INSERT OR REPLACE INTO sessions(id,version,expiry_interval,disconnected_at," \
		   "owner,owned) VALUES(?1,?2,?3,?4,?5,?6)")                                    \
	X(ses_del, "DELETE FROM sessions WHERE id=?1")                                          \
	X(ses_subs, "DELETE FROM subs WHERE id=?1")                                             \
	X(ses_rel, "DELETE FROM rel WHERE id=?1")                                               \
	X(ses_msgs, "DELETE FROM msgs WHERE mid IN (SELECT mid FROM queue WHERE id=?1) AND "    \
		    "NOT EXISTS (SELECT 1 FROM queue q WHERE q.mid=msgs.mid AND q.id<>?1) AND " \
		    "mid NOT IN (SELECT mid FROM temp.pins)")                                   \
	X(ses_will, "DELETE FROM wills WHERE id=?1")                                            \
	X(ses_queue, "DELETE FROM queue WHERE id=?1")                                           \
	X(sub_put, "INSERT OR REPLACE INTO subs(id,filter,opts,subid) VALUES(?1,?2,?3,?4)")     \
	X(sub_del, "DELETE FROM subs WHERE id=?1 AND filter=?2")                                \
	X(msg_put, "INSERT INTO msgs(mid,topic,qos,retain,props,payload,expiry) "               \
		   "VALUES(?1,?2,?3,?4,?5,?6,?7)")                                              \
	X(q_put, "INSERT OR REPLACE INTO queue(id,seq,mid,qos,pid,state,retain,subids) "         \
		 "VALUES(?1,?2,?3,?4,?7,0,?5,?6)")                                              \
	X(q_inflight, "UPDATE queue SET pid=?3, state=?4 WHERE id=?1 AND seq=?2")               \
	X(q_ack, "DELETE FROM queue WHERE id=?1 AND pid=?2 RETURNING mid")                      \
	X(msg_orphan, "DELETE FROM msgs WHERE mid=?1 AND NOT EXISTS "                           \
		      "(SELECT 1 FROM queue WHERE mid=?1) AND NOT EXISTS "                      \
		      "(SELECT 1 FROM temp.pins WHERE mid=?1)")                                 \
	X(pin, "INSERT OR IGNORE INTO temp.pins(mid) VALUES(?1)")                               \
	X(unpin, "DELETE FROM temp.pins WHERE mid=?1")                                          \
	X(will_put, "INSERT OR REPLACE INTO wills(id,topic,qos,retain,props,payload,expiry,"    \
		    "delay,at) VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9)")                             \
	X(rel_add, "INSERT OR IGNORE INTO rel(id,pid) VALUES(?1,?2)")                           \
	X(rel_del, "DELETE FROM rel WHERE id=?1 AND pid=?2")                                    \
	X(begin, "BEGIN")                                                                       \
	X(commit, "COMMIT")                                                                     \
	X(rollback, "ROLLBACK")

#define X_ENUM(name, sql) S_##name,
enum { STATEMENTS(X_ENUM) S_COUNT };
_Static_assert(S_COUNT == STORE_NSTMT, "store_queue.h: STORE_NSTMT");
#define X_SQL(name, sql) sql,
static const char *const stmt_sql[] = { STATEMENTS(X_SQL) };

/* Version 2 added queue.retain, queue.subids and wills (upgrade: schema_v1_to_v2); version 3
 * sessions.owner and owned (schema_v2_to_v3): who a session belongs to, the username or NULL
 * for anonymous; owned is 0 in rows written before, whose owner nobody knows. */
#define SCHEMA_VERSION 3
static const char *const schema =
	"CREATE TABLE IF NOT EXISTS meta(k TEXT PRIMARY KEY, v);"
	"INSERT OR IGNORE INTO meta VALUES('schema', 3);"
	"CREATE TABLE IF NOT EXISTS retained(topic BLOB PRIMARY KEY, qos INT, props BLOB,"
	" payload BLOB, expiry INT);"
	"CREATE TABLE IF NOT EXISTS sessions(id BLOB PRIMARY KEY, version INT,"
	" expiry_interval INT, disconnected_at INT, owner BLOB, owned INT NOT NULL DEFAULT 0);"
	"CREATE TABLE IF NOT EXISTS subs(id BLOB, filter BLOB, opts INT, subid INT,"
	" PRIMARY KEY(id, filter)) WITHOUT ROWID;"
	"CREATE TABLE IF NOT EXISTS msgs(mid INTEGER PRIMARY KEY, topic BLOB, qos INT,"
	" retain INT, props BLOB, payload BLOB, expiry INT);"
	"CREATE TABLE IF NOT EXISTS queue(id BLOB, seq INT, mid INT, qos INT, pid INT, state INT,"
	" retain INT NOT NULL DEFAULT 0, subids BLOB, PRIMARY KEY(id, seq)) WITHOUT ROWID;"
	"CREATE INDEX IF NOT EXISTS queue_mid ON queue(mid);"
	"CREATE INDEX IF NOT EXISTS queue_pid ON queue(id, pid);"
	"CREATE TABLE IF NOT EXISTS rel(id BLOB, pid INT, PRIMARY KEY(id, pid)) WITHOUT ROWID;"
	"CREATE TABLE IF NOT EXISTS wills(id BLOB PRIMARY KEY, topic BLOB, qos INT, retain INT,"
	" props BLOB, payload BLOB, expiry INT, delay INT, at INT);"
	/* in memory, this connection's: shared messages the broker may still queue */
	"CREATE TEMP TABLE IF NOT EXISTS pins(mid INTEGER PRIMARY KEY);";

static const char *const schema_v1_to_v2 =
	"BEGIN;"
	"ALTER TABLE queue ADD COLUMN retain INT NOT NULL DEFAULT 0;"
	"ALTER TABLE queue ADD COLUMN subids BLOB;"
	"CREATE TABLE IF NOT EXISTS wills(id BLOB PRIMARY KEY, topic BLOB, qos INT, retain INT,"
	" props BLOB, payload BLOB, expiry INT, delay INT, at INT);"
	"UPDATE meta SET v=2 WHERE k='schema';"
	"COMMIT;";

static const char *const schema_v2_to_v3 =
	"BEGIN;"
	"ALTER TABLE sessions ADD COLUMN owner BLOB;"
	"ALTER TABLE sessions ADD COLUMN owned INT NOT NULL DEFAULT 0;"
	"UPDATE meta SET v=3 WHERE k='schema';"
	"COMMIT;";

/* ---- errors ------------------------------------------------------------------------------ */

/* A transaction failed: say why (once per failure), wake every waiter. Writer thread. */
static void fail(store *st, const char *what)
{
	if (atomic_load(&st->failed))
		return; /* still failing: said already */
	if (!st->err[0])
		snprintf(st->err, sizeof st->err, "%s: %s: %s", st->path, what,
			 sqlite3_errmsg(st->db));
	fprintf(stderr, "weft-mqtt: store failed, no write is durable until it can write again: "
			"%s: %s: %s\n", st->path, what, sqlite3_errmsg(st->db));
	weft_mutex_lock(&st->dlock);
	atomic_store(&st->failed, 1);
	weft_cond_broadcast(&st->dcond);
	weft_mutex_unlock(&st->dlock);
}

const char *store_error(store *st)
{
	return atomic_load(&st->failed) ? st->err : st->load_err;
}

bool store_failed(store *st)
{
	return atomic_load(&st->failed) || atomic_load(&st->lost);
}

/* ---- applying writes (writer thread) ----------------------------------------------------- */

static sqlite3_stmt *stmt(store *st, int which)
{
	sqlite3_stmt *s = st->st[which];
	sqlite3_reset(s);
	sqlite3_clear_bindings(s);
	return s;
}

static void bind_blob(sqlite3_stmt *s, int i, const void *p, size_t n)
{
	sqlite3_bind_blob(s, i, n ? p : "", (int)n, SQLITE_STATIC);
}

/* Step a statement that returns no rows: 0 or -1. */
static int run(sqlite3_stmt *s)
{
	int r = sqlite3_step(s);
	sqlite3_reset(s);
	return r == SQLITE_DONE || r == SQLITE_ROW ? 0 : -1;
}

/* Run statement `which` with the client id as ?1 and nothing else. */
static int by_id(store *st, int which, const op *o)
{
	sqlite3_stmt *s = stmt(st, which);
	bind_blob(s, 1, o->id, o->id_len);
	return run(s);
}


static int by_mid(store *st, int which, uint64_t mid)
{
	sqlite3_stmt *s = stmt(st, which);
	sqlite3_bind_int64(s, 1, (int64_t)mid);
	return run(s);
}

/* Subscription ids as stored: 4 bytes each, big-endian. */
static void subids_put(uint8_t *b, const uint32_t *v, int n)
{
	for (int i = 0; i < n; i++)
		b[4 * i] = (uint8_t)(v[i] >> 24), b[4 * i + 1] = (uint8_t)(v[i] >> 16),
		b[4 * i + 2] = (uint8_t)(v[i] >> 8), b[4 * i + 3] = (uint8_t)v[i];
}

static int enqueue_row(store *st, const op *o)
{
	uint8_t ids[16];
	sqlite3_stmt *s = stmt(st, S_q_put);
	bind_blob(s, 1, o->id, o->id_len);
	sqlite3_bind_int64(s, 2, (int64_t)o->seq);
	sqlite3_bind_int64(s, 3, (int64_t)o->mid);
	sqlite3_bind_int(s, 4, o->qos);
	sqlite3_bind_int(s, 5, o->retain);
	subids_put(ids, o->subid, o->nsubid);
	if (o->nsubid)
		sqlite3_bind_blob(s, 6, ids, 4 * o->nsubid, SQLITE_TRANSIENT);
	sqlite3_bind_int(s, 7, o->pid);
	return run(s);
}

static int apply(store *st, const op *o)
{
	sqlite3_stmt *s;
	switch (o->kind) {
	case OP_PUT_RET:
		s = stmt(st, S_ret_put);
		bind_blob(s, 1, o->s, o->s_len);
		sqlite3_bind_int(s, 2, o->qos);
		bind_blob(s, 3, o->props, o->props_len);
		bind_blob(s, 4, o->payload, o->payload_len);
		sqlite3_bind_int64(s, 5, o->time);
		return run(s);
	case OP_DEL_RET:
		s = stmt(st, S_ret_del);
		bind_blob(s, 1, o->s, o->s_len);
		return run(s);
	case OP_PUT_SES:
		s = stmt(st, S_ses_put);
		bind_blob(s, 1, o->id, o->id_len);
		sqlite3_bind_int(s, 2, o->version);
		sqlite3_bind_int64(s, 3, o->u32);
		sqlite3_bind_int64(s, 4, o->time);
		if (o->anon)
			sqlite3_bind_null(s, 5);
		else
			bind_blob(s, 5, o->s, o->s_len);
		sqlite3_bind_int(s, 6, o->owned);
		return run(s);
	case OP_DEL_SES:
		return by_id(st, S_ses_del, o) || by_id(st, S_ses_subs, o) ||
		       by_id(st, S_ses_rel, o) || by_id(st, S_ses_msgs, o) ||
		       by_id(st, S_ses_queue, o) || by_id(st, S_ses_will, o) ? -1 : 0;
	case OP_PUT_SUB:
	case OP_DEL_SUB:
		s = stmt(st, o->kind == OP_PUT_SUB ? S_sub_put : S_sub_del);
		bind_blob(s, 1, o->id, o->id_len);
		bind_blob(s, 2, o->s, o->s_len);
		if (o->kind == OP_PUT_SUB) {
			sqlite3_bind_int(s, 3, o->opts);
			sqlite3_bind_int64(s, 4, o->u32);
		}
		return run(s);
	case OP_ENQ:
		s = stmt(st, S_msg_put);
		sqlite3_bind_int64(s, 1, (int64_t)o->mid);
		bind_blob(s, 2, o->s, o->s_len);
		sqlite3_bind_int(s, 3, o->mqos);
		sqlite3_bind_int(s, 4, o->opts); /* the message's own RETAIN flag */
		bind_blob(s, 5, o->props, o->props_len);
		bind_blob(s, 6, o->payload, o->payload_len);
		sqlite3_bind_int64(s, 7, o->time);
		if (run(s) || (o->pin && by_mid(st, S_pin, o->mid)))
			return -1;
		return enqueue_row(st, o);
	case OP_ENQ_MID:
		return enqueue_row(st, o);
	case OP_INFLIGHT:
		s = stmt(st, S_q_inflight);
		bind_blob(s, 1, o->id, o->id_len);
		sqlite3_bind_int64(s, 2, (int64_t)o->seq);
		sqlite3_bind_int(s, 3, o->pid);
		sqlite3_bind_int(s, 4, o->state);
		return run(s);
	case OP_ACK: {
		s = stmt(st, S_q_ack);
		bind_blob(s, 1, o->id, o->id_len);
		sqlite3_bind_int(s, 2, o->pid);
		uint64_t mids[4];
		int n = 0, r;
		while ((r = sqlite3_step(s)) == SQLITE_ROW)
			if (n < 4)
				mids[n++] = (uint64_t)sqlite3_column_int64(s, 0);
		sqlite3_reset(s);
		if (r != SQLITE_DONE)
			return -1;
		for (int i = 0; i < n; i++)
			if (by_mid(st, S_msg_orphan, mids[i]))
				return -1;
		return 0;
	}
	case OP_RELEASE:
		return by_mid(st, S_unpin, o->mid) || by_mid(st, S_msg_orphan, o->mid) ? -1 : 0;
	case OP_PUT_WILL:
		s = stmt(st, S_will_put);
		bind_blob(s, 1, o->id, o->id_len);
		bind_blob(s, 2, o->s, o->s_len);
		sqlite3_bind_int(s, 3, o->mqos);
		sqlite3_bind_int(s, 4, o->retain);
		bind_blob(s, 5, o->props, o->props_len);
		bind_blob(s, 6, o->payload, o->payload_len);
		sqlite3_bind_int64(s, 7, o->time);
		sqlite3_bind_int64(s, 8, o->u32);
		sqlite3_bind_int64(s, 9, o->time2);
		return run(s);
	case OP_DEL_WILL:
		return by_id(st, S_ses_will, o);
	case OP_REL_ADD:
	case OP_REL_DEL:
		s = stmt(st, o->kind == OP_REL_ADD ? S_rel_add : S_rel_del);
		bind_blob(s, 1, o->id, o->id_len);
		sqlite3_bind_int(s, 2, o->pid);
		return run(s);
	case OP_GROUP:
	case OP_GROUP_END:
		return 0; /* transact() keeps them whole */
	}
	return -1;
}

/* The writes of the transaction being built: applied, and applied again after a failure. */
typedef struct txn {
	op **v;
	int n, cap;
} txn;

static void txn_add(txn *t, op *o)
{
	if (t->n == t->cap) {
		int cap = t->cap ? 2 * t->cap : 256;
		op **v = realloc(t->v, (size_t)cap * sizeof *v);
		if (!v)
			abort();
		t->v = v;
		t->cap = cap;
	}
	t->v[t->n++] = o;
}

/*
 * One transaction: the writes in t (again, after a failure), then whatever else is waiting, up
 * to max_batch writes - and on to the end of a group it is in. 0 when committed (the writes are
 * durable), -1 when it failed: rolled back, t keeps every write to try again.
 */
static int transact(store *st, txn *t)
{
	int64_t t0 = weft_now();
	bool group = false;
	const char *what = "begin";
	if (run(stmt(st, S_begin)))
		goto failed;
	what = "write";
	for (int i = 0;; i++) {
		if (i == t->n) {
			op *o;
			int r;
			if (group) /* its end is on its way: one group is open at a time */
				r = weft_chan_recv(st->ch, &o, sizeof o, WEFT_FOREVER);
			else if (i >= st->o.max_batch)
				break;
			else
				r = weft_chan_poll(st->ch, &o, sizeof o);
			if (r < 0 && group)
				goto cut; /* closed inside a group (its task did not end it) */
			if (r < 0)
				break;
			txn_add(t, o);
		}
		op *o = t->v[i];
		if (o->kind == OP_GROUP || o->kind == OP_GROUP_END)
			group = o->kind == OP_GROUP;
		else if (apply(st, o))
			goto failed;
	}
	if (st->o.commit_delay_ms)
		nanosleep(&(struct timespec){ st->o.commit_delay_ms / 1000,
					      st->o.commit_delay_ms % 1000 * 1000000L }, NULL);
	if (atomic_load(&st->lost))
		goto cut; /* a write was refused: nothing after it, nor the group it cut, may go */
	what = "commit";
	if (run(stmt(st, S_commit)))
		goto failed;
	atomic_fetch_add_explicit(&st->writes, (uint64_t)t->n, memory_order_relaxed);
	atomic_fetch_add_explicit(&st->commits, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&st->commit_ns, weft_now() - t0, memory_order_relaxed);
	weft_mutex_lock(&st->dlock);
	atomic_store(&st->durable, t->v[t->n - 1]->ticket);
	int was_failed = atomic_exchange(&st->failed, 0);
	weft_cond_broadcast(&st->dcond);
	weft_mutex_unlock(&st->dlock);
	if (was_failed && !atomic_load(&st->lost))
		fprintf(stderr, "weft-mqtt: store recovered, writes are durable again: %s\n",
			st->path);
	return 0;
failed:
	fail(st, what);
cut:
	run(stmt(st, S_rollback));
	return -1;
}

void *store_writer_main(void *arg)
{
	store *st = arg;
	txn t = { NULL, 0, 0 };
	long backoff_ms = 0;
	weft_unpin(); /* started by a task: not on its worker's CPU only */
	for (;;) {
		op *o;
		if (!t.n) {
			if (weft_chan_recv(st->ch, &o, sizeof o, WEFT_FOREVER) < 0)
				break; /* -EPIPE: closed, drained */
			txn_add(&t, o);
		}
		if (transact(st, &t) == 0) {
			for (int i = 0; i < t.n; i++)
				free(t.v[i]);
			t.n = 0;
			backoff_ms = 0;
			continue;
		}
		/* closing while failed, or lost: what is left was never reported durable */
		if (atomic_load(&st->closed) || atomic_load(&st->lost))
			break;
		backoff_ms = backoff_ms ? (backoff_ms < 500 ? 2 * backoff_ms : 1000) : 10;
		for (long ms = 0; ms < backoff_ms && !atomic_load(&st->closed) &&
				  !atomic_load(&st->lost); ms += 10) /* a close ends the pause */
			nanosleep(&(struct timespec){ 0, 10000000L }, NULL);
	}
	for (int i = 0; i < t.n; i++)
		free(t.v[i]);
	free(t.v);
	for (op *o; weft_chan_poll(st->ch, &o, sizeof o) >= 0;)
		free(o);
	return NULL;
}

/* ---- opening and closing ----------------------------------------------------------------- */

/* The first row's first column of sql, as text into buf; 0 or -1 (message in err). */
static int query_text(store *st, const char *sql, char *buf, size_t cap)
{
	sqlite3_stmt *s;
	buf[0] = 0;
	if (sqlite3_prepare_v2(st->db, sql, -1, &s, NULL) != SQLITE_OK)
		return -1;
	int r = sqlite3_step(s);
	if (r == SQLITE_ROW && sqlite3_column_text(s, 0))
		snprintf(buf, cap, "%s", (const char *)sqlite3_column_text(s, 0));
	sqlite3_finalize(s);
	return r == SQLITE_ROW || r == SQLITE_DONE ? 0 : -1;
}

static int64_t query_int(store *st, const char *sql)
{
	char b[32];
	if (query_text(st, sql, b, sizeof b))
		return -1;
	return atoll(b);
}

static void close_db(store *st)
{
	for (int i = 0; i < S_COUNT; i++)
		sqlite3_finalize(st->st[i]);
	sqlite3_close(st->db);
}

/* Open the database file, check it, create the tables. 0, or -1 with err filled. */
static int open_db(store *st, char *err, size_t cap)
{
	char b[512];
	/* NOMUTEX: one thread at a time uses the connection (the opener, then the writer, then the
	 * closer, which joins the writer first), so SQLite need not lock on every call */
	int r = sqlite3_open_v2(st->path, &st->db,
				SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL);
	if (r != SQLITE_OK) {
		snprintf(err, cap, "%s: cannot open: %s", st->path,
			 st->db ? sqlite3_errmsg(st->db) : sqlite3_errstr(r));
		return -1;
	}
	sqlite3_extended_result_codes(st->db, 1);
	/* one broker per database: a second one is told so instead of sharing it */
	if (query_text(st, "PRAGMA locking_mode=EXCLUSIVE", b, sizeof b) ||
	    query_text(st, "PRAGMA journal_mode=WAL", b, sizeof b))
		goto sql_error;
	if (strcmp(b, "wal") != 0) {
		snprintf(err, cap, "%s: cannot use a write-ahead log (journal mode %s)", st->path, b);
		return -1;
	}
	if (query_text(st, st->o.no_sync ? "PRAGMA synchronous=OFF" : "PRAGMA synchronous=FULL",
		       b, sizeof b))
		goto sql_error;
	if (st->o.max_bytes > 0) {
		char q[64];
		int64_t page = query_int(st, "PRAGMA page_size");
		snprintf(q, sizeof q, "PRAGMA max_page_count=%lld",
			 (long long)(st->o.max_bytes / (page > 0 ? page : 4096)));
		if (query_text(st, q, b, sizeof b))
			goto sql_error;
	}
	if (query_text(st, "PRAGMA quick_check", b, sizeof b))
		goto sql_error;
	if (strcmp(b, "ok") != 0) {
		snprintf(err, cap, "%s is damaged: %s", st->path, b);
		return -1;
	}
	if (query_text(st, "PRAGMA temp_store=MEMORY", b, sizeof b))
		goto sql_error;
	/* a database of schema 1 has no meta row saying 2 yet: read the version first */
	int64_t v = 0;
	if (query_int(st, "SELECT count(*) FROM sqlite_master WHERE name='meta'") > 0)
		v = query_int(st, "SELECT v FROM meta WHERE k='schema'");
	static const char *const upgrade[] = { NULL, schema_v1_to_v2, schema_v2_to_v3 };
	for (; v >= 1 && v < SCHEMA_VERSION; v++)
		if (sqlite3_exec(st->db, upgrade[v], NULL, NULL, NULL) != SQLITE_OK) {
			snprintf(err, cap, "%s: upgrading from schema %lld: %s", st->path,
				 (long long)v, sqlite3_errmsg(st->db));
			sqlite3_exec(st->db, "ROLLBACK", NULL, NULL, NULL);
			return -1;
		}
	if (sqlite3_exec(st->db, schema, NULL, NULL, NULL) != SQLITE_OK)
		goto sql_error;
	v = query_int(st, "SELECT v FROM meta WHERE k='schema'");
	if (v != SCHEMA_VERSION) {
		snprintf(err, cap, "%s: unknown schema version %lld", st->path, (long long)v);
		return -1;
	}
	for (int i = 0; i < S_COUNT; i++)
		if (sqlite3_prepare_v3(st->db, stmt_sql[i], -1, SQLITE_PREPARE_PERSISTENT, &st->st[i],
				       NULL) != SQLITE_OK)
			goto sql_error;
	/* What expired while the broker was down goes: deliveries not started yet (one already
	 * sent must be completed, expired or not) and retained messages. Then a message without
	 * a queue row is nobody's: its pin, or the rest of a write cut short, was in memory. */
	char sweep[512];
	long long now = (long long)time(NULL);
	snprintf(sweep, sizeof sweep,
		 "BEGIN;"
		 "DELETE FROM queue WHERE pid=0 AND mid IN"
		 " (SELECT mid FROM msgs WHERE expiry>0 AND expiry<=%lld);"
		 "DELETE FROM retained WHERE expiry>0 AND expiry<=%lld;"
		 "DELETE FROM msgs WHERE mid NOT IN (SELECT mid FROM queue);"
		 "COMMIT;", now, now);
	if (sqlite3_exec(st->db, sweep, NULL, NULL, NULL) != SQLITE_OK)
		goto sql_error;
	int64_t mid = query_int(st, "SELECT COALESCE(MAX(mid),0) FROM msgs");
	int64_t seq = query_int(st, "SELECT COALESCE(MAX(seq),0) FROM queue");
	if (mid < 0 || seq < 0)
		goto sql_error;
	st->next_mid = (uint64_t)mid;
	st->next_seq = (uint64_t)seq;
	return 0;
sql_error:;
	int code = sqlite3_errcode(st->db) & 0xff;
	if (code == SQLITE_NOTADB)
		snprintf(err, cap, "%s is not a database (damaged or another file): %s", st->path,
			 sqlite3_errmsg(st->db));
	else if (code == SQLITE_CORRUPT)
		snprintf(err, cap, "%s is damaged: %s", st->path, sqlite3_errmsg(st->db));
	else if (code == SQLITE_BUSY)
		snprintf(err, cap, "%s is in use by another process", st->path);
	else
		snprintf(err, cap, "%s: %s", st->path, sqlite3_errmsg(st->db));
	return -1;
}

store *store_open(const char *dir, const store_opts *o, char *err, size_t cap)
{
	store *st = calloc(1, sizeof *st);
	if (!st) {
		snprintf(err, cap, "out of memory");
		return NULL;
	}
	if (o)
		st->o = *o;
	if (st->o.max_batch <= 0)
		st->o.max_batch = DEFAULT_BATCH;
	struct stat sb;
	if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
		snprintf(err, cap, "cannot create %s: %s", dir, strerror(errno));
		goto fail;
	}
	if (stat(dir, &sb) < 0 || !S_ISDIR(sb.st_mode)) {
		snprintf(err, cap, "%s is not a directory", dir);
		goto fail;
	}
	snprintf(st->path, sizeof st->path, "%s/weft-mqtt.db", dir);
	if (open_db(st, err, cap)) {
		close_db(st);
		goto fail;
	}
	weft_mutex_init(&st->qlock);
	weft_mutex_init(&st->dlock);
	weft_mutex_init(&st->glock);
	weft_cond_init(&st->dcond);
	st->ch = weft_chan_new(WEFT_UNBOUNDED, sizeof(op *)); /* store_queue.c: what bounds it */
	if (!st->ch) {
		snprintf(err, cap, "out of memory");
		close_db(st);
		goto fail;
	}
	weft_chan_set_name(st->ch, "store writes");
	return st;
fail:
	free(st);
	return NULL;
}

int store_close(store *st)
{
	weft_mutex_lock(&st->qlock);
	st->closed = true;
	weft_mutex_unlock(&st->qlock);
	weft_chan_close(st->ch); /* the writer commits what is queued, then ends */
	if (st->started)
		pthread_join(st->writer, NULL);
	/* a task in store_wait now has its answer (durable, -EIO, or -EPIPE): st goes once the
	 * last has left */
	weft_mutex_lock(&st->dlock);
	st->closing = true;
	weft_cond_broadcast(&st->dcond);
	while (st->waiters)
		weft_cond_wait(&st->dcond, &st->dlock);
	weft_mutex_unlock(&st->dlock);
	for (op *o; weft_chan_poll(st->ch, &o, sizeof o) >= 0;) /* after a writer that gave up */
		free(o);
	weft_chan_free(st->ch);
	int failed = store_failed(st);
	if (!failed) /* fold the log into the database: the next open reads less */
		sqlite3_exec(st->db, "PRAGMA wal_checkpoint(TRUNCATE)", NULL, NULL, NULL);
	close_db(st);
	free(st);
	return failed ? -EIO : 0;
}

/* ---- loading ----------------------------------------------------------------------------- */

static const char *col_blob(sqlite3_stmt *s, int i, uint32_t *len)
{
	const void *p = sqlite3_column_blob(s, i);
	*len = (uint32_t)sqlite3_column_bytes(s, i);
	return p ? p : "";
}

static void col_msg(sqlite3_stmt *s, int i, store_msg *m)
{
	uint32_t n;
	m->topic = col_blob(s, i, &n);
	m->topic_len = (uint16_t)n;
	m->qos = (uint8_t)sqlite3_column_int(s, i + 1);
	m->retain = (uint8_t)sqlite3_column_int(s, i + 2);
	m->props = col_blob(s, i + 3, &m->props_len);
	m->payload = col_blob(s, i + 4, &m->payload_len);
	m->expiry = sqlite3_column_int64(s, i + 5);
}

enum { L_SESSIONS, L_SUBS, L_QUEUE, L_REL, L_WILLS, L_RETAINED };
static const char *const load_sql[] = {
	("SELECT id, version, expiry_interval, disconnected_at, owner, owned FROM sessions"
	 " ORDER BY id"),
	"SELECT id, filter, opts, subid FROM subs",
	("SELECT q.id, q.mid, q.qos, q.pid, q.state, m.topic, m.qos, m.retain, m.props, m.payload,"
	 " m.expiry, q.seq, q.retain, q.subids FROM queue q JOIN msgs m ON m.mid = q.mid"
	 " ORDER BY q.id, q.seq"),
	"SELECT id, pid FROM rel",
	"SELECT id, delay, at, topic, qos, retain, props, payload, expiry FROM wills ORDER BY id",
	"SELECT topic, qos, 0, props, payload, expiry FROM retained ORDER BY topic",
};

static void load_row(int what, sqlite3_stmt *s, const store_callbacks *cb, void *arg)
{
	uint32_t n, n2;
	const char *id = col_blob(s, 0, &n);
	switch (what) {
	case L_SESSIONS:
		if (cb->session) {
			store_session ss = {
				.id = id,
				.id_len = (uint16_t)n,
				.version = (uint8_t)sqlite3_column_int(s, 1),
				.expiry_interval = (uint32_t)sqlite3_column_int64(s, 2),
				.disconnected_at = sqlite3_column_int64(s, 3),
			};
			if (sqlite3_column_type(s, 4) != SQLITE_NULL)
				ss.owner = col_blob(s, 4, &n2), ss.owner_len = (uint16_t)n2;
			ss.owner_known = sqlite3_column_int(s, 5) != 0;
			cb->session(arg, &ss);
		}
		break;
	case L_SUBS:
		if (cb->sub) {
			const char *f = col_blob(s, 1, &n2);
			cb->sub(arg, id, (uint16_t)n, f, (uint16_t)n2,
				(uint8_t)sqlite3_column_int(s, 2), (uint32_t)sqlite3_column_int64(s, 3));
		}
		break;
	case L_QUEUE:
		if (cb->queued) {
			store_msg m;
			col_msg(s, 5, &m);
			store_dlv d = { .qos = (uint8_t)sqlite3_column_int(s, 2),
					.retain = (uint8_t)sqlite3_column_int(s, 12),
					.row = (uint64_t)sqlite3_column_int64(s, 11),
					.mid = (uint64_t)sqlite3_column_int64(s, 1),
					.pid = (uint16_t)sqlite3_column_int(s, 3),
					.state = (uint8_t)sqlite3_column_int(s, 4) };
			const uint8_t *b = (const uint8_t *)col_blob(s, 13, &n2);
			for (uint32_t i = 0; i + 4 <= n2 && d.nsubid < 4; i += 4)
				d.subid[d.nsubid++] = (uint32_t)b[i] << 24 | (uint32_t)b[i + 1] << 16 |
						      (uint32_t)b[i + 2] << 8 | b[i + 3];
			cb->queued(arg, id, (uint16_t)n, &m, &d);
		}
		break;
	case L_WILLS:
		if (cb->will) {
			store_msg m;
			col_msg(s, 3, &m);
			cb->will(arg, id, (uint16_t)n, &m, (uint32_t)sqlite3_column_int64(s, 1),
				 sqlite3_column_int64(s, 2));
		}
		break;
	case L_REL:
		if (cb->rel)
			cb->rel(arg, id, (uint16_t)n, (uint16_t)sqlite3_column_int(s, 1));
		break;
	case L_RETAINED:
		if (cb->retained) {
			store_msg m;
			col_msg(s, 0, &m);
			m.retain = 1;
			cb->retained(arg, &m);
		}
		break;
	}
}

int store_load(store *st, const store_callbacks *cb, void *arg)
{
	for (int what = L_SESSIONS; what <= L_RETAINED; what++) {
		sqlite3_stmt *s;
		if (sqlite3_prepare_v2(st->db, load_sql[what], -1, &s, NULL) != SQLITE_OK)
			goto error;
		int r;
		while ((r = sqlite3_step(s)) == SQLITE_ROW)
			load_row(what, s, cb, arg);
		sqlite3_finalize(s);
		if (r != SQLITE_DONE)
			goto error;
	}
	return 0;
error:
	snprintf(st->load_err, sizeof st->load_err, "%s: reading back: %s", st->path,
		 sqlite3_errmsg(st->db));
	return -EIO;
}
