/*
 * sys.c - the $SYS/broker/ topics: every sys_interval seconds a task publishes the counters
 * (stats.c) and the broker's sizes as retained messages, with the names mosquitto uses, so
 * that existing dashboards work. It sits on top: it reads every layer (connections, sessions,
 * the topic tree) and publishes through the topic tree like a client.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <weft.h>

#include "broker.h"
#include "conf.h"
#include "conn_public.h"
#include "msg.h"
#include "session.h"
#include "stats.h"
#include "topic.h"

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
