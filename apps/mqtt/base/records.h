/*
 * records.h - the records the layers share: a session's state (session, its deliveries and
 * subscriptions) and a connection's (conn). Only the layouts: what is done with them is
 * declared by the layer that owns them (route/session.h, conn/conn_public.h, ...).
 *
 * Why in base/: the layers below their owners read their fields directly. access/ keeps a
 * session's ACL binding (s->acl, under s->lock) and persist/ writes a session's rows (its id,
 * owner, will) and a connection's store ticket (c->ticket, c->acks); route/ reads a
 * connection's batch and writer state. A field read is not a call across layers: the layering
 * (tests/layers.sh) is about calls, and a record must be defined at or below its lowest
 * reader. Rejected: opaque records with accessor functions in the owning layer (a call per
 * field on the publish path, and the accessor would itself be a call upward); defining each
 * record in its owner's header (access/ and persist/ would then include a header above them).
 * The tables that point upward (peer_ops, conn_role) are named here only as incomplete
 * structs; their layouts are in the lowest layer that calls through them.
 */
#ifndef WEFT_MQTT_RECORDS_H
#define WEFT_MQTT_RECORDS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <weft.h>

#include "epoch.h"
#include "msg.h"
#include "scratch.h"

struct conn;
struct peer_ops;
struct conn_role;
struct acl_client;
struct rbacklog;
struct ws;
struct tls_conn;
struct bridge;

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
	uint32_t max_packet;       /* the peer's maximum packet size (0: none): a 5.0 client's, or
				    * a bridge's remote's (bridge_max_packet_size) */
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

typedef struct alias_ent {
	uint32_t hash;
	uint16_t len;
	char *topic;
} alias_ent;

typedef struct conn {
	const struct peer_ops *peer; /* route/'s view of it (route/peer.h) */
	const struct conn_role *role; /* a client's, or a bridge's (conn/conn_public.h) */
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

#endif
