/*
 * broker.h - the parts of weft-mqtt and how they meet (docs/weft-mqtt.md, "Architecture" and
 * "Folders"), in a section per file. The folders are layers, lowest first; a folder uses only
 * the folders below it (apps/mqtt/tests/layers.sh checks it on the objects):
 *
 *   wire/    codec.c, encode.c: the protocol's bytes (codec.h), no broker state
 *   base/    conf.c (the configuration's values), pool.c (per-worker free lists), msg.c
 *            (reference-counted messages, decoded once), epoch.c (epoch-based reclamation, which
 *            makes the lock-free matching safe), stats.c (counters), scratch.c (a batch's
 *            growable arrays), ratelimit.c, textfile.c
 *   access/  access.c: password_file and acl_file as the broker asks (auth.c, acl.c, pace.c)
 *   persist/ persist.c: what goes to the store (store.c) and when acknowledgements wait
 *   route/   topic.c (the subscription and retained tree, matched without a global lock),
 *            retained.c (the retained messages a SUBSCRIBE sends), session.c (what outlives a
 *            connection), delivery.c (how messages reach a session), writer.c (a session's
 *            output to its socket), deadline.c (when offline sessions need the reaper)
 *   conn/    one task per connection: conn.c, loop.c, handle_*.c (one per packet), login.c,
 *            acks.c, output.c, kick.c, tls.c, ws.c (conn.h is theirs alone)
 *   bridge/  bridges to other brokers: a conn whose role is a bridge's (bridge.h)
 *   top      main.c, config.c (the parser), metrics.c, sys.c ($SYS), restore.c (the store
 *            read back at start)
 *
 * Where a lower layer must reach a higher one, it calls through a table the higher one fills:
 * peer_ops (route/ -> a session's connection), conn_role (conn/ -> a client's or a bridge's
 * role), msg_stored_release (base/ -> persist/).
 */
#ifndef WEFT_MQTT_BROKER_H
#define WEFT_MQTT_BROKER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <weft.h>

#include "codec.h"

#define WEFT_MQTT_VERSION "weft-mqtt 0.1.0"

/* ---- configuration (base/conf.c; config.c parses) ------------------------------------------ */

#define MAX_LISTENERS 8

enum { PROTO_MQTT, PROTO_WEBSOCKETS };

typedef struct listener_conf {
	int port;
	char host[64];            /* "" : every address */
	int protocol;             /* PROTO_MQTT, or PROTO_WEBSOCKETS (MQTT in WebSocket frames) */
	/* TLS (tls.c): on when certfile is set */
	char certfile[256], keyfile[256], cafile[256], ciphers[256];
	int require_certificate, use_identity_as_username;
} listener_conf;

typedef struct broker_conf {
	listener_conf listeners[MAX_LISTENERS];
	int nlisteners;
	long max_connections;         /* -1: no limit */
	int max_inflight_messages;    /* outbound QoS 1/2 window per client (and receive maximum) */
	int max_queued_messages;      /* QoS 1/2 messages queued beyond the window per client */
	long max_queued_bytes;        /* and their payload bytes; 0: no limit */
	double conn_rate;             /* max_connection_rate: new connections a second per
				       * address (IPv6: /64); 0: no limit */
	int conn_burst;               /* ... of which this many at once */
	double pub_rate;              /* max_publish_rate: PUBLISHes a second per connection;
				       * 0: no limit */
	int pub_burst;                /* ... of which this many at once */
	double pw_rate;               /* password_pace: password checks a second per (address,
				       * username); 0: no pace (auth.h) */
	int pw_burst;                 /* ... of which this many at once */
	long message_size_limit;      /* payload bytes; 0: the protocol's limit */
	int max_keepalive;            /* seconds; 0: none */
	int allow_anonymous;          /* -1: only from loopback addresses (the default) */
	int sys_interval;             /* seconds between $SYS updates; 0: off */
	int verbose;
	long qos0_queue_bytes;        /* per client: QoS 0 beyond this many unsent bytes is dropped */
	long backlog_bytes;           /* retained_backlog_bytes: what one client's pending retained
				       * backlogs may cost (retained.c); 0: no limit */
	long backlog_bytes_total;     /* retained_backlog_bytes_total: and all clients' together */
	char password_file[256], acl_file[256], persistence_location[256];
	int persistence;
	int allow_plain_passwords;    /* accept clear-text user:password lines in password_file */
	int metrics_port;             /* metrics_listener: Prometheus /metrics over HTTP; 0: off */
	char metrics_host[64];        /* its bind address; "": 127.0.0.1 */
	int detach_delay_ms;          /* WEFT_MQTT_DETACH_DELAY_MS, for a test only: a session
				       * its connection let go of waits this long before it ends */
} broker_conf;

extern broker_conf conf;

void conf_defaults(broker_conf *c);
/* Parse a mosquitto-syntax file. 0, or -1 with a message "file:line: ..." on stderr. */
int conf_load(broker_conf *c, const char *path);
/* Parse the command line; returns 0 to run, 1 when --help/--version was handled, -1 on error. */
int conf_args(broker_conf *c, int argc, char **argv);
/* One option's value, for config.c and the bridges' options (bridge.c): 0 with *out set, or
 * -1 with "file:line: OPT needs ..." on stderr. */
int conf_number(const char *file, int line, const char *opt, const char *v, long lo, long hi,
		long *out);
int conf_bool(const char *file, int line, const char *opt, const char *v, int *out);

/* ---- per-worker allocation (pool.c) -------------------------------------------------------- */

/* Memory of at least n bytes: small sizes come from the calling worker's free lists. The
 * capacity actually given is pool_size(p). Never fails (aborts when memory is out). */
void *pool_alloc(size_t n);
void pool_free(void *p);
size_t pool_size(const void *p);
void pool_init(void);
/* malloc as the broker wants it (one arena): before weft_run starts the workers. */
void pool_malloc_setup(void);
/* Give back memory nothing uses (the reaper calls it): see pool.c. */
void pool_trim(int64_t now);
long pool_cached_bytes(void); /* held in the workers' free lists */
long mem_resident(void);      /* the process's RSS in bytes (0 if unknown) */

/* ---- messages (msg.c) ---------------------------------------------------------------------- */

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

/* ---- epoch-based reclamation (epoch.c) ----------------------------------------------------- */

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

/* ---- sessions (session.c) ------------------------------------------------------------------ */

struct conn;

/* One message waiting for a client: queued, or inflight (sent, not yet acknowledged). */
typedef struct delivery {
	struct delivery *next;
	msg *m;
	uint16_t pid;
	uint8_t qos, retain;
	uint8_t state;             /* inflight: 0 sent PUBLISH, 1 got PUBREC and sent PUBREL */
	uint8_t nsub;
	uint32_t subid[4];
	uint64_t mid;              /* its delivery row in the store (persist.c), 0: not stored */
} delivery;

/* A subscription a session holds (to remove them all when it ends). */
typedef struct subrec {
	struct subrec *next;
	uint16_t len;
	char filter[];             /* the whole filter as subscribed, $share/... included */
} subrec;

typedef struct session {
	weft_mutex lock;
	weft_cond idle;            /* signalled when `writing` drops to 0 */
	atomic_int refs;
	struct session *hnext;     /* session table chain */
	uint32_t hash;
	uint16_t id_len;
	char *client_id;
	/* who it belongs to (session.c: a CONNECT from anyone else is refused): the username
	 * (NUL-terminated), NULL for anonymous; owner_unknown for a session restored from a store
	 * that did not keep owners. Written under the session table's lock and s's lock both
	 * (when first connected to), so read under either. */
	char *owner;
	uint16_t owner_len;
	bool owner_unknown;
	struct conn *conn;         /* the connection attached, or NULL */
	bool dead;                 /* removed: deliveries to it are dropped */
	bool writing;              /* a task is writing out[] (or its taken copy) */
	bool will_pending;         /* a will waits for its delay */
	atomic_int online;         /* a connection is attached (read without the lock) */
	int64_t will_at;           /* when a pending will is due */
	uint8_t version;
	uint32_t expiry_interval;  /* seconds, UINT32_MAX never */
	int64_t expire_at;         /* when offline with an expiry */
	int64_t dl_at;             /* its deadline and place in the reaper's heap (deadline.c) */
	uint32_t dl_pos;
	/* outbound */
	uint8_t *out;              /* encoded packets not yet written */
	size_t out_len, out_cap;
	delivery *inflight, *inflight_tail;
	uint32_t ninflight;
	delivery *queue, *queue_tail;
	uint32_t nqueued;
	uint64_t queued_bytes;     /* payload bytes of the queue (max_queued_bytes) */
	uint16_t next_pid;
	uint16_t window;           /* outbound inflight limit */
	uint32_t max_packet;       /* the client's maximum packet size */
	/* inbound QoS 2 packet ids awaiting PUBREL */
	uint16_t *rel_ids;
	uint16_t nrel, rel_cap;
	subrec *subs;
	struct rbacklog *backlog;  /* retained messages of SUBSCRIBEs still to send (retained.c) */
	uint64_t backlog_bytes;    /* what they cost, and what SUBSCRIBEs reserved (retained.c) */
	/* will */
	msg *will;
	uint32_t will_delay;
	uint32_t will_expiry;       /* its message expiry interval (s), from its publication */
	uint64_t will_gen;
	/* batching marks: which publisher's dirty list holds this session */
	void *dirty_owner;
	uint64_t dirty_batch;
	/* what the client may read (acl.c), NULL: everything. Read without the lock by every
	 * publisher that routes to s; replaced by access_bind, the old one freed through epoch.c */
	_Atomic(struct acl_client *) acl;
	bool stored;               /* written to the store (persistent, persistence on) */
	int64_t out_ticket;        /* the store write that out[] must wait for: QoS 2 PUBLISHes
				    * and PUBRELs go out only once their state is durable
				    * (INT64_MAX: a write failed, it never goes) */
	bool will_stored;          /* its will is in the store */
} session;

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

/* ---- topic tree (topic.c) ------------------------------------------------------------------ */

/* subscription options as in the SUBSCRIBE byte: qos bits 0-1, no-local 2, rap 3, rh 4-5 */
#define SUB_NL 4
#define SUB_RAP 8

void topic_init(void);
/* Add or replace s's subscription; returns 1 if it replaced one, 0 if new. */
int topic_subscribe(session *s, const char *filter, uint16_t len, uint8_t opts, uint32_t subid);
/* Remove it; returns 1 if it existed. */
int topic_unsubscribe(session *s, const char *filter, uint16_t len);
/* Set (or with an empty payload clear) the retained message of m's topic. */
void topic_retain(msg *m);
/* Send s every retained message matching filter (qos capped at max_qos), as the client takes
 * them: a backlog of s (retained.c) that replaces one pending for the same filter, in place
 * of the `reserved` bytes retained_admit reserved for it (0: none). */
void topic_send_retained(session *s, const char *filter, uint16_t len, int max_qos,
			 uint32_t subid, uint64_t reserved, struct conn *by);
/* What a backlog of the retained messages matching filter would cost now (retained_cost of
 * each), counted without taking them; the walk stops once it passes limit. */
uint64_t topic_retained_cost(const char *filter, uint16_t len, uint64_t limit);
/* The hash of topic names and levels the tree uses. */
uint32_t topic_hash(const char *s, size_t n);
long topic_retained_count(void);
long topic_sub_count(void);
long topic_node_count(void); /* nodes in the tree, the root included */
long topic_bytes(void);      /* bytes its nodes, child tables and subscriber arrays hold */
void topic_free_all(void);

/* Route m to every matching subscription: one copy per session at the highest matching QoS
 * with all its subscription ids; one member of each shared group. Returns the number of
 * deliveries. from is the publishing session (no-local), by its connection. */
int topic_publish(msg *m, session *from, struct conn *by);

/* ---- retained backlogs (retained.c); s's lock held unless said ------------------------------ */

typedef struct rbacklog rbacklog;
/* What a pending backlog entry of m is counted as: its slots in the backlog and m itself,
 * which the entry keeps alive once the store lets m go. */
uint64_t retained_cost(const msg *m);
/* Before a SUBSCRIBE's filter is subscribed: whether the backlog of its retained messages fits
 * s's budget (retained_backlog_bytes) and the broker's (retained_backlog_bytes_total), a
 * backlog pending for the same filter counted as gone. If it does, its cost is reserved
 * (*reserved; topic_send_retained or retained_unreserve gives it back) and true is returned.
 * Takes s's lock and the tree's: call it with neither. */
bool retained_admit(session *s, const char *filter, uint16_t len, uint64_t *reserved);
void retained_unreserve(session *s, uint64_t reserved); /* takes the lock */
/* What the pending backlogs of every session cost together, reservations included. */
uint64_t retained_backlog_bytes(void);
/* Start s's backlog for filter: v[0..n) the matching retained messages, referenced (the array
 * becomes the backlog's), charged in place of `reserved`; one pending for the filter is
 * dropped first. */
void retained_start(session *s, const char *filter, uint16_t len, msg **v, uint32_t n,
		    int max_qos, uint32_t subid, uint64_t reserved);
/* Move what has room now into s's output and window: whether anything was added. */
bool retained_drain(session *s);
/* A live delivery of m to s at qos comes: the entry of m's topic pending in a backlog goes
 * first, if the limits of live delivery leave it room. -1, or, when an entry of the same QoS
 * stays for want of room, the limit (session_limit) that m is to be dropped at: it would
 * overtake that entry. */
int retained_overtake(session *s, const msg *m, int qos, struct conn *by);
/* A SUBSCRIBE replaced filter's subscription and sends no retained messages: a backlog
 * pending for it goes on with the new options (takes the lock). */
void retained_resubscribed(session *s, const char *filter, uint16_t len, int max_qos,
			   uint32_t subid);
/* filter was unsubscribed: its backlog ends. */
void retained_forget(session *s, const char *filter, uint16_t len);
/* s ends: every backlog goes. */
void retained_drop_all(session *s);

/* ---- password_file and acl_file (access.c) ------------------------------------------------- */

/* Load (start) or reload (SIGHUP) the configured password and ACL files. At start an error is
 * printed and -1 returned; on reload it is printed and the old rules stay. */
int access_load(bool start);
/* Whether an acl_file is configured (checks are skipped entirely when not). */
extern bool access_acl_on;
/* Bind s to the current ACL rules for this username (NULL: anonymous) and its client id. */
void access_bind(session *s, const char *user, size_t user_len);
/* s's binding to the rules in force (made again here if a reload came since it was made), or
 * NULL when no acl_file is configured. Valid within the caller's read section (epoch.c). */
struct acl_client *access_binding(session *s);
/* May s's client receive m, by the rules in force? Lock-free: one load when no acl_file is
 * configured; with one, a load and a compare more (a reload?) before the check. In a read
 * section. */
bool access_read_slow(session *s, struct acl_client *a, const msg *m);
static inline bool access_read(session *s, const msg *m)
{
	struct acl_client *a = atomic_load_explicit(&s->acl, memory_order_acquire);
	return !a || access_read_slow(s, a, m);
}
/* Whether s's client may write its will's topic under the rules in force now (a reload or a
 * restart since its CONNECT may have changed them); a restored session unbound so far is bound
 * to its owner first. Takes s's lock: call it without. */
bool access_will_allowed(session *s, const msg *m);
/* Free s's binding (the session is being freed: nobody reads it any more). */
void access_unbind(session *s);

/* ---- persistence (persist.c) --------------------------------------------------------------- */

struct conn;
extern bool persist_on;
/* Open the store and read it back through cb (arg given to each), then turn persistence on:
 * 0, or -1 with a message (restore.c, which knows where what is read goes, calls it at start).
 * Persistence is still off (persist_start turns it on).
 * Close it after the connections ended: open_conns says how many did not (the store is then
 * left as it is). */
struct store_callbacks;
int persist_open(const struct store_callbacks *cb, void *arg);
/* After the load: persistence on (the store's writes begin). */
void persist_start(void);
void persist_close(long open_conns);
/* At start: open the store and rebuild the sessions, subscriptions, queues, wills and retained
 * messages it holds (restore.c): 0, or -1 with a message. */
int restore_open(void);
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
/* A PUBACK, PUBREC or PUBCOMP of c's: sent at once with persistence off, else held until the
 * end of the batch; then acks_release waits for the batch's writes and sends them in order
 * (0), or, the store failed, sends none (-1). */
void ack_pub(struct conn *c, int type, uint16_t pid, int rc);
int acks_release(struct conn *c);
/* ack_pub for a PUBREC of a resent QoS 2 PUBLISH, or a PUBCOMP of a PUBREL for an id not
 * known: what it vouches for was written by an earlier batch, so it waits for every write
 * made so far, not only its own batch's. */
void ack_earlier(struct conn *c, int type, uint16_t pid, int rc);

/* ---- connections (conn.c) ------------------------------------------------------------------ */

typedef struct alias_ent {
	uint32_t hash;
	uint16_t len;
	char *topic;
} alias_ent;

/* Scratch space of a publishing task: match results, frontier, dirty sessions. */
typedef struct scratch_buf {
	void *v;
	uint32_t n, cap;
} scratch_buf;
/* Room for `need` elements of `elem` bytes in b (scratch.c): b->v, grown if needed. */
void *scratch_grow(scratch_buf *b, size_t elem, uint32_t need);

/* What route/ needs of whoever a session's output goes to (s->conn->peer). route/ sits below
 * the connections (conn/) and the bridges (bridge/) and reaches them only through this table:
 * one indirect call where a direct call was (a flush's write, a take-over's kick). A client's
 * table is conn.c's (conn_client_peer); a bridge's is bridge.c's, which maps topics. */
typedef struct peer_ops {
	/* write to the socket as weft_write does (conn_write) */
	ssize_t (*write)(struct conn *c, const void *buf, size_t n, int64_t deadline);
	/* out[], taken whole, as it goes to the socket (conn_frame) */
	uint8_t *(*frame)(struct conn *c, uint8_t *buf, size_t *len);
	/* ask the connection to end (conn_kick) */
	void (*kick)(struct conn *c, int reason);
	/* an outgoing PUBLISH's topic in the peer's terms and its retain flag: 0, or -1 when it
	 * cannot be sent (bridge_out_topic). NULL: the topic as it is. */
	int (*out_topic)(struct conn *c, const msg *m, const char **topic, uint16_t *tlen,
			 char **mapped, int *retain);
} peer_ops;

/* What conn/'s read loop asks of a connection's role: a client's (conn.c, conn_client_role)
 * or a bridge's (bridge.c: we are the client of a remote broker). conn/ sits below bridge/ and
 * calls it only through this table, instead of branching on "is it a bridge". */
#define CONN_PASS 2
typedef struct conn_role {
	/* max_publish_rate applies to what the peer publishes */
	bool publish_rate;
	/* a packet after the CONNECT/CONNACK prelude: CONN_PASS to handle it as a client's, 0
	 * when handled, or a negative reason code. NULL: every packet is a client's. */
	int (*on_packet)(struct conn *c, const mq_packet *pk);
	/* an incoming PUBLISH's topic: whether it may be published (false: dropped, counted and
	 * acknowledged as not authorized); *topic, *tlen replaced when it is mapped (*mapped
	 * then holds memory to free) */
	bool (*in_topic)(struct conn *c, const uint8_t **topic, uint16_t *tlen, char **mapped);
	/* keep-alive (c->keep_alive set): when to wake without input, last being when bytes last
	 * came in; and on waking then, 0 to go on (a PINGREQ was sent) or -1 to end */
	int64_t (*keepalive_deadline)(struct conn *c, int64_t last);
	int (*keepalive_expired)(struct conn *c, int64_t last);
	/* the last packets when the broker stops (written to out, cap bytes; their length).
	 * NULL: a 5.0 DISCONNECT with the reason, as for any end. */
	size_t (*goodbye)(struct conn *c, uint8_t *out, size_t cap);
} conn_role;

typedef struct conn {
	const peer_ops *peer;     /* route/'s view of it */
	const conn_role *role;    /* a client's, or a bridge's */
	int fd;
	uint8_t version;
	bool loopback;
	bool closing;             /* being torn down: set by conn_end, under the session's lock */
	bool connected;           /* CONNECT accepted */
	session *s;
	epoch_reader reader;
	struct conn *next, *prev; /* every connection, for shutdown and $SYS */
	weft_task *task;
	uint16_t keep_alive;
	uint32_t max_in_packet;   /* largest packet we accept */
	int64_t pub_tat;          /* max_publish_rate: when the client's publishing debt is paid */
	/* topic aliases: client -> broker (ours to keep), broker -> client (we assign) */
	char **in_alias;
	uint16_t in_alias_max;
	alias_ent *out_alias;
	uint16_t out_alias_max, out_alias_n;
	/* batching */
	scratch_buf match, front, front_next, dirty;
	uint64_t batch;
	/* writer state when the socket pushed back */
	uint8_t *wbuf;
	size_t wlen, woff;
	int64_t wneed;            /* the writer task writes wbuf once this write is durable */
	bool writer_running;
	atomic_int kick_rc;       /* set by conn_kick: the reason to give a 5.0 client */
	atomic_bool napping;      /* in conn_nap_until (kick.c): conn_kick must wake it */
	char *user;               /* the CONNECT's username, or the certificate's CN under
				   * use_identity_as_username (NUL-terminated), or NULL */
	bool user_proven;         /* user was checked (password_file, certificate): it owns the
				   * session (session.c); otherwise the client is anonymous there */
	uint16_t user_len;
	struct ws *ws;            /* a WebSockets listener's client: the framing (ws.c), or NULL */
	struct tls_conn *tls;     /* a TLS listener's client (tls.c), or NULL */
	int64_t ticket;           /* the store's ticket this batch waits for (-1: store failed) */
	scratch_buf acks;           /* PUBACK/PUBRECs held until the batch is durable */
	const char *tls_user;     /* the certificate's CN under use_identity_as_username */
	struct bridge *bridge;    /* a bridge's connection to its remote broker (bridge.c), or NULL */
	bool peer_bridge;         /* the client is another broker's 3.1.1 bridge (level 0x84) */
	bool peer_gone;           /* the client closed its end while max_publish_rate held it */
} conn;

/* A connection to a remote broker (bridge.c), its CONNACK already read, with the bridge's peer
 * and role; registered like an accepted one and not yet running. NULL when out of memory. */
struct bridge;
conn *conn_open_bridge(int fd, struct tls_conn *t, struct bridge *b, int version,
		       uint16_t keep_alive, const peer_ops *peer, const conn_role *role);
/* Run c's read loop in the calling task until the connection ends (c is freed then); with no
 * session attached (c->s NULL), only end it. */
void conn_run(conn *c);
extern const peer_ops conn_client_peer;
extern const conn_role conn_client_role;
/* Serve a client on fd (accepted from a listener speaking `protocol`, over TLS when tls is
 * not NULL) in a task of its own. */
struct tls_ctx;
void conn_serve(int fd, int protocol, struct tls_ctx *tls);
/* Write to c's socket (through TLS on a TLS listener) as weft_write does. */
ssize_t conn_write(conn *c, const void *buf, size_t n, int64_t deadline);
/* What goes to the socket from out[] (taken whole, from the pool): as it is, or for a WebSocket
 * client in one binary frame (a new pool buffer; buf is freed). *len is updated. */
uint8_t *conn_frame(conn *c, uint8_t *buf, size_t *len);
/* Note s as needing a flush at the end of c's current batch. */
static inline void conn_mark_dirty(conn *c, session *s)
{
	session **v = scratch_grow(&c->dirty, sizeof(session *), c->dirty.n + 1);
	v[c->dirty.n++] = s;
}
void conns_shutdown(void);
long conns_count(void);
/* Ask c to end (session take-over, shutdown): its task sees the socket shut (kick.c). */
void conn_kick(conn *c, int reason);
/* Wait until `until` (weft_now's clock), holding nothing of the broker but the connection,
 * unless it is kicked or its task cancelled: 0, or -1 when it is to end (kick.c). */
int conn_nap_until(conn *c, int64_t until);
/* A CONNACK refusing the connection (before any session): rc5 for 5.0, rc3 for 3.1.1. */
void conn_refuse(conn *c, int version, int rc5, int rc3);
/* Establish who pk's client is (password file, certificate, anonymous), waiting for its
 * password's turn (pace.c) while keeping `held` bytes: 0, or -1 once refused (CONNACK sent)
 * or kicked (login.c). Sets c->user and c->user_proven. */
int conn_login(conn *c, const mq_packet *pk, long held);

/* ---- statistics (stats.c) ------------------------------------------------------------------ */

enum {
	ST_MSG_RECV, ST_MSG_SENT, ST_PUB_RECV, ST_PUB_SENT, ST_PUB_DROPPED, ST_BYTES_RECV,
	ST_BYTES_SENT, ST_CONNECTS,
	ST_DROP_QOS0,       /* QoS 0 deliveries dropped: client offline or qos0_queue_bytes full */
	ST_DROP_QUEUE_FULL, /* QoS 1/2 deliveries dropped: max_queued_messages reached */
	ST_DROP_EXPIRED,    /* queued deliveries whose message expired before they were sent */
	ST_QUEUED,          /* a gauge: +1 and -1 (mod 2^64) as deliveries enter and leave queues */
	ST_DROP_QUEUE_BYTES, /* QoS 1/2 deliveries dropped: max_queued_bytes reached */
	ST_REFUSED_MAX_CONN, /* connections closed at accept: max_connections reached */
	ST_REFUSED_RATE,    /* connections closed at accept: max_connection_rate exceeded */
	ST_PASSWORD_CHECKS, /* passwords checked against password_file */
	ST_REFUSED_PACE,    /* CONNECTs answered "try later" unchecked: password checks of their
			     * address, or of their name there, booked AUTH_MAX_WAIT ahead */
	ST_REFUSED_BACKLOG, /* SUBSCRIBE filters refused (quota exceeded): the backlog of their
			     * retained messages would pass a retained_backlog_bytes budget */
	ST_REFUSED_WAITING, /* CONNECTs answered "try later" unchecked: the CONNECTs waiting for
			     * their password's turn hold all the memory they may (login.c) */
	ST_COUNT
};
void stats_init(void);
void stats_add(int which, uint64_t n);
uint64_t stats_sum(int which);
/* The $SYS publisher task's body (sys.c; runs until shutdown). */
void stats_task(void *arg);
extern int64_t broker_start;

/* ---- the Prometheus endpoint (metrics.c) --------------------------------------------------- */

/* Listen on conf.metrics_port (when set) and serve GET /metrics: 0, or -1 with a message. */
int metrics_start(void);
/* Stop listening and wait for the clients being served (their sockets are shut). */
void metrics_stop(void);
extern atomic_int broker_stopping;

#endif
