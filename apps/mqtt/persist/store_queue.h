/*
 * store_queue.h - the inside of the store (store.h) that its two halves share: the writes as
 * they wait for the writer (`op`) and the store itself. store_queue.c hands writes to the
 * writer and waits for them (what the broker's tasks run); store.c is the writer thread and
 * SQLite (opening, applying, committing, loading). Nothing else includes this.
 */
#ifndef WEFT_MQTT_STORE_QUEUE_H
#define WEFT_MQTT_STORE_QUEUE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <sqlite3.h>

#include <weft.h>

#include "store.h"

/* Writes not yet durable beyond which, while the store is failed, the next write is refused
 * (store_queue.c, submit). */
#define QUEUE_MAX 65536
#define STORE_NSTMT 24 /* store.c's prepared statements (it checks the count) */

enum {
	OP_PUT_RET, OP_DEL_RET, OP_PUT_SES, OP_DEL_SES, OP_PUT_SUB, OP_DEL_SUB, OP_ENQ,
	OP_ENQ_MID, OP_INFLIGHT, OP_ACK, OP_REL_ADD, OP_REL_DEL, OP_RELEASE, OP_PUT_WILL,
	OP_DEL_WILL, OP_GROUP, OP_GROUP_END
};

/* One write, with its strings and blobs copied after it. */
typedef struct op {
	int kind;
	int64_t ticket;
	uint64_t mid, seq;
	int64_t time, time2;   /* expiry, disconnected_at; a will's due time */
	uint32_t u32;          /* subid, expiry_interval, will delay */
	uint16_t id_len, s_len, pid;
	uint8_t qos, retain, state, opts, version, mqos, nsubid;
	bool pin;              /* OP_ENQ: a shared message, pinned until OP_RELEASE */
	bool anon;             /* OP_PUT_SES: owned by anonymous clients (s: the owner's name) */
	bool owned;            /* OP_PUT_SES: the owner is known */
	uint32_t subid[4];
	uint32_t props_len, payload_len;
	char *id, *s;          /* client id; topic or filter */
	uint8_t *props, *payload;
	char data[];
} op;

struct store {
	sqlite3 *db;
	sqlite3_stmt *st[STORE_NSTMT];
	store_opts o;
	char path[4096];
	/* submitting */
	weft_chan *ch;            /* op pointers, in ticket order (unbounded: a write never waits) */
	weft_mutex qlock;         /* ticket, mid and send together */
	int64_t next_ticket;
	uint64_t next_mid, next_seq;
	atomic_bool closed;       /* set under qlock; the writer reads it to give up retrying */
	bool started;             /* the writer thread runs */
	weft_mutex glock;         /* held from store_group_begin to store_group_end */
	struct op *gend;          /* the open group's end, made at its begin (cannot fail then) */
	_Atomic int64_t issued;   /* the last ticket handed out */
	atomic_bool lost;         /* a write was refused (set under qlock): nothing is committed
				   * any more, and every write but a group's end is refused */
	/* the writer thread */
	pthread_t writer;
	/* completion */
	_Atomic int64_t durable;
	atomic_int failed;
	weft_mutex dlock;
	weft_cond dcond;
	int waiters;              /* tasks and threads in store_wait (dlock) */
	bool closing;             /* store_close wakes them all and waits for them to leave (dlock) */
	char err[4800];           /* why it first failed (set once, before `failed`: read
				   * without a lock while failed) */
	char load_err[4800];      /* why store_load failed */
	_Atomic uint64_t writes, commits;
	_Atomic int64_t commit_ns;
};

/* The writer thread's body (store.c), started with the first write (store_queue.c). */
void *store_writer_main(void *arg);

#endif
