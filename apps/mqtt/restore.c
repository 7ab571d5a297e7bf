/*
 * restore.c - at start, the store's contents back into the broker: persistent sessions, their
 * subscriptions, queued and inflight deliveries, inbound QoS 2 ids, wills, and retained
 * messages (persist.c opens the store and reads it; what is read is handed here).
 *
 * It sits above route/ because it rebuilds route's state (sessions, the topic tree): persist/
 * below route only writes, and so never calls up. A message queued for many sessions is one
 * row in the store and becomes one msg again (`loaded`, by store id). Wills already due are
 * published before any client is let in (sessions_reap).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <weft.h>

#include "broker.h"
#include "codec.h"
#include "conf.h"
#include "msg.h"
#include "persist.h"
#include "records.h"
#include "session.h"
#include "store.h"
#include "topic.h"

static msg *from_store(const store_msg *m)
{
	mq_bytes props = { m->props, m->props_len };
	return msg_new(m->topic, m->topic_len, &props, m->payload, m->payload_len, m->qos,
		       m->retain, persist_seconds_left(m->expiry));
}

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
	delivery d = { .m = m, .pid = sd->pid, .qos = sd->qos, .retain = sd->retain,
		  .state = sd->state, .nsub = sd->nsubid, .mid = sd->row };
	memcpy(d.subid, sd->subid, sizeof d.subid);
	session_restore_delivery(s, &d);
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
			     at ? persist_mono_from_unix(at) : weft_now() + (int64_t)delay * 1000000000);
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

int restore_open(void)
{
	store_callbacks cb = { ld_session, ld_sub, ld_queued, ld_rel, ld_will, ld_retained };
	loaded msgs = { 0 };
	int r = persist_open(&cb, &msgs);
	loaded_free(&msgs);
	if (r < 0 || !conf.persistence)
		return r;
	if (conf.verbose)
		fprintf(stderr, "weft-mqtt: persistence: %ld sessions, %ld retained messages loaded\n",
			sessions_count(), topic_retained_count());
	persist_start();
	sessions_reap(weft_now()); /* wills already due go out before any client is let in */
	return 0;
}
