/*
 * stats.c - counters and the $SYS/broker/ topics.
 *
 * Counters are per worker (one cache line each) and bumped with plain relaxed loads and
 * stores: a worker's slot has one writer, so nothing is lost and no cache line bounces
 * between cores on the publish path. A reader sums the slots (a snapshot, as mosquitto's).
 * Every sys_interval seconds a task publishes them as retained messages under $SYS/broker/,
 * with the names mosquitto uses, so existing dashboards work.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker.h"

typedef struct slot {
	_Atomic uint64_t v[ST_COUNT];
	char pad[64];
} slot;

static slot *slots;
static int nslots;
int64_t broker_start;
atomic_int broker_stopping;

void stats_init(void)
{
	nslots = weft_worker_max() > 0 ? weft_worker_max() : 1;
	slots = calloc((size_t)nslots, sizeof *slots);
	if (!slots)
		abort();
}

void stats_add(int which, uint64_t n)
{
	int w = weft_worker_id();
	if (w < 0 || w >= nslots) {
		atomic_fetch_add_explicit(&slots[0].v[which], n, memory_order_relaxed);
		return;
	}
	_Atomic uint64_t *p = &slots[w].v[which];
	atomic_store_explicit(p, atomic_load_explicit(p, memory_order_relaxed) + n,
			      memory_order_relaxed);
}

uint64_t stats_sum(int which)
{
	uint64_t t = 0;
	for (int i = 0; i < nslots; i++)
		t += atomic_load_explicit(&slots[i].v[which], memory_order_relaxed);
	return t;
}

void stats_fini(void)
{
	free(slots);
	slots = NULL;
}

static void put(const char *topic, const char *fmt, unsigned long long v)
{
	char payload[64];
	int n = snprintf(payload, sizeof payload, fmt, v);
	msg *m = msg_new(topic, (uint16_t)strlen(topic), NULL, payload, (uint32_t)n, 0, 1, 0);
	topic_retain(m);
	topic_publish(m, NULL, NULL);
	msg_unref(m);
}

static void publish_all(void)
{
	msg *m = msg_new("$SYS/broker/version", 19, NULL, WEFT_MQTT_VERSION,
			 (uint32_t)strlen(WEFT_MQTT_VERSION), 0, 1, 0);
	topic_retain(m);
	topic_publish(m, NULL, NULL);
	msg_unref(m);
	long connected = conns_count(), total = sessions_count();
	put("$SYS/broker/uptime", "%llu seconds",
	    (unsigned long long)((weft_now() - broker_start) / 1000000000));
	put("$SYS/broker/clients/connected", "%llu", (unsigned long long)connected);
	put("$SYS/broker/clients/active", "%llu", (unsigned long long)connected);
	put("$SYS/broker/clients/total", "%llu", (unsigned long long)total);
	put("$SYS/broker/clients/disconnected", "%llu",
	    (unsigned long long)(total > connected ? total - connected : 0));
	put("$SYS/broker/messages/received", "%llu", stats_sum(ST_MSG_RECV));
	put("$SYS/broker/messages/sent", "%llu", stats_sum(ST_MSG_SENT));
	put("$SYS/broker/publish/messages/received", "%llu", stats_sum(ST_PUB_RECV));
	put("$SYS/broker/publish/messages/sent", "%llu", stats_sum(ST_PUB_SENT));
	put("$SYS/broker/publish/messages/dropped", "%llu", stats_sum(ST_PUB_DROPPED));
	put("$SYS/broker/bytes/received", "%llu", stats_sum(ST_BYTES_RECV));
	put("$SYS/broker/bytes/sent", "%llu", stats_sum(ST_BYTES_SENT));
	put("$SYS/broker/subscriptions/count", "%llu", (unsigned long long)topic_sub_count());
	put("$SYS/broker/retained messages/count", "%llu",
	    (unsigned long long)topic_retained_count());
	put("$SYS/broker/connections/total", "%llu", stats_sum(ST_CONNECTS));
	put("$SYS/broker/connections/refused", "%llu",
	    stats_sum(ST_REFUSED_MAX_CONN) + stats_sum(ST_REFUSED_RATE));
}

void stats_task(void *arg)
{
	(void)arg;
	/* The broker cancels this task when it stops: the sleep then returns -ECANCELED. */
	do
		publish_all();
	while (weft_sleep_until(weft_now() + (int64_t)conf.sys_interval * 1000000000) == 0);
}
