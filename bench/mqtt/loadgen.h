/*
 * loadgen.h - what the parts of mqtt-loadgen share (see loadgen.c for the design): the
 * options, the connections and the workers that drive them.
 */
#ifndef WEFT_MQTT_LOADGEN_H
#define WEFT_MQTT_LOADGEN_H

#include <mosquitto.h>
#include <mqtt_protocol.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

/* Counters and flags that one thread writes and another reads (the main thread watches the
 * workers' progress): release/acquire accesses for those, plain ones elsewhere. */
#define LOAD(x) __atomic_load_n(&(x), __ATOMIC_ACQUIRE)
#define STORE(x, v) __atomic_store_n(&(x), (v), __ATOMIC_RELEASE)

#define MAGIC 0x77656674u /* "weft": tells our payloads from stray ones */
#define MAX_WORKERS 64

enum shape { FANIN, PAIRS, FANOUT };

struct payload {
	uint64_t ts;   /* ns, CLOCK_MONOTONIC, when handed to libmosquitto */
	uint64_t seq;  /* 0, 1, 2, ... per publisher */
	uint32_t pub;  /* publisher index */
	uint32_t magic;
};

/* One bitmap of sequence numbers seen, per (subscriber, publisher); grown as needed. */
struct seen {
	uint64_t *bits;
	uint64_t cap; /* bits */
	uint64_t distinct, total;
};

struct worker;

struct conn {
	struct mosquitto *m;
	struct worker *w;
	int idx;         /* publisher or subscriber index */
	int fd;          /* as registered with the worker's epoll */
	bool watching_out;
	bool pending; /* bytes left in its read buffer */
	bool is_pub;
	bool connected, subscribed, failed;
	/* publisher */
	uint64_t sent, acked, written_off;
	int fanout;      /* subscribers each of its messages goes to */
	int64_t next_ns; /* fixed rate: when the next message is due */
	int64_t blocked_since;
	/* subscriber */
	struct seen *seen; /* [npub] */
};

/* Latency histogram: 64 sub-buckets per power of two of nanoseconds (about 1.1% precision). */
#define SUB 64
#define HBUCKETS (64 * SUB)
struct worker {
	pthread_t th;
	int id, epfd, efd;
	atomic_bool waiting; /* its publishers wait for deliveries: wake it through efd */
	struct conn **c;
	int n;
	uint64_t hist[HBUCKETS];
	uint64_t received, measured; /* all, and those that arrived after the warm-up */
	int64_t last_recv_ns;
	_Atomic uint64_t *delivered; /* [npub]: deliveries of each publisher's messages seen here */
} __attribute__((aligned(64)));

struct options {
	const char *host;
	int port, npub, nsub, qos, size, version, window, nworkers, keepalive;
	enum shape shape;
	long count;      /* messages per publisher, or 0 */
	double duration; /* seconds, or 0 */
	double rate;     /* messages/s in total, or 0 */
	double warmup;   /* seconds of traffic before measuring */
	int idle;        /* -I: idle connections */
	const char *storm;
	int offline;     /* -O: persistent sessions left offline */
	int broker_pid;
	bool persistent; /* -c: persistent sessions (clean session off; 5.0: session expiry) */
	char prefix[64]; /* of client ids and topics: lg<pid>, or -i's */
};

extern struct options opt;

extern struct worker workers[MAX_WORKERS];
extern struct conn *pubs, *subs;
extern atomic_bool publishing, stop_publishing, stop_all;
extern _Atomic int64_t t_measure;

/* loadgen.c */
int64_t now_ns(void);
void die(const char *what);

/* brokerstat.c: the broker's figures from /proc */
double broker_cpu_s(void);
long broker_rss_kb(void);

/* histogram.c: latencies */
int bucket_of(uint64_t ns);
double quantile(const uint64_t *h, uint64_t total, double q);

/* readbuf.c: buffered reads under libmosquitto */
void rbuf_init(void);
void rbuf_register(int fd);
bool rbuf_pending(int fd);

/* traffic.c: publishers, subscribers and the workers that drive them */
bool conn_read(struct conn *c);
int count_where(struct conn *cs, int n, int what);
void wait_ready(void);
void connect_all(void);
void stop_workers(void);
int run_traffic(void);

/* idle.c, storm.c, offline.c */
int run_idle(void);
int run_storm(void);
int run_offline(void);
/* CONNECT (clean, or a persistent session: 5.0 with an hour's expiry), CONNACK, DISCONNECT on
 * m as client `id`: 0, or -1 when refused or failed. *connack_ns (if not NULL): the time from
 * the connect call to the CONNACK. */
int connect_cycle(struct mosquitto *m, const char *id, bool clean, int64_t *connack_ns);
#endif
