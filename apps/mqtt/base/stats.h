/*
 * stats.h - the broker's counters (stats.c), summed over the workers when read, and the two
 * facts about the broker's life every layer may read: when it started and whether it is
 * stopping.
 */
#ifndef WEFT_MQTT_STATS_H
#define WEFT_MQTT_STATS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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
/* Free the counters (at exit). */
void stats_fini(void);
void stats_add(int which, uint64_t n);
uint64_t stats_sum(int which);
/* The $SYS publisher task's body (sys.c; runs until shutdown). */
extern int64_t broker_start;
/* Set once the broker begins to stop (main.c); the bridges and the metrics listener watch it. */
extern atomic_int broker_stopping;

#endif
