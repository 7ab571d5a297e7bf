/*
 * metrics.c - the Prometheus endpoint: GET /metrics over plain HTTP/1.1 (metrics_listener).
 *
 * An acceptor task takes connections on the metrics listener and gives each to a detached
 * task of its own, at most METRICS_CLIENTS at a time (more are closed at once), so a client
 * that connects and says nothing only holds its own task, never a worker or another client.
 * Each client task reads the request head with one deadline for the whole of it (a slow
 * sender cannot stretch it byte by byte) into a fixed buffer (a longer head is 431), answers
 * 400 to a malformed request line, 405 to a method other than GET or HEAD, 404 to a path
 * other than /metrics, and otherwise the text exposition format 0.0.4, with Connection:
 * close. The response is written with a deadline too, and the socket closed.
 *
 * The figures are read as the $SYS publisher reads them: the broker's per-worker counters
 * are summed with relaxed loads (stats.c), nothing on the publish path is locked; the
 * gauges that live behind a registry lock (connections, sessions, subscriptions, retained
 * messages) are read as $SYS reads them; so are the tree's and the pool's bytes, and malloc's
 * figures come from mallinfo2. Scheduler counters come from weft_stats() per worker
 * and weft_stats_waits() per kind of wait (only when weft counts waits: WEFT_STATS or
 * WEFT_TRACE set at start).
 *
 * At shutdown the acceptor is cancelled and every client socket is shut down (under a lock
 * held only to register, unregister and shut sockets), which wakes its task at once; the
 * broker waits until the last one has gone before it frees the counters.
 */
#include <errno.h>
#include <malloc.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <weft.h>

#include "bridge.h"
#include "broker.h"
#include "conf.h"
#include "conn_public.h"
#include "pool.h"
#include "retained.h"
#include "session.h"
#include "stats.h"
#include "topic.h"

#define METRICS_CLIENTS 32
#define METRICS_HEAD_MAX 4096
#define METRICS_TIMEOUT 5000000000LL /* ns: to read a request, and again to write the answer */

static int lfd = -1;
static weft_task *acc;
static weft_mutex mlock = WEFT_MUTEX_INIT;
static int cfds[METRICS_CLIENTS]; /* client sockets; -1: free slot */
static atomic_int nclients;

/* A growing text buffer; on allocation failure it stays short and `bad` is set. */
typedef struct tbuf {
	char *p;
	size_t len, cap;
	bool bad;
} tbuf;

static void tprintf(tbuf *b, const char *fmt, ...)
{
	for (;;) {
		va_list ap;
		va_start(ap, fmt);
		size_t room = b->cap - b->len;
		int n = vsnprintf(b->p ? b->p + b->len : NULL, room, fmt, ap);
		va_end(ap);
		if (n < 0 || b->bad)
			return;
		if ((size_t)n < room) {
			b->len += (size_t)n;
			return;
		}
		size_t cap = b->cap ? b->cap * 2 : 8192;
		while (cap - b->len <= (size_t)n)
			cap *= 2;
		char *p = realloc(b->p, cap);
		if (!p) {
			b->bad = true;
			return;
		}
		b->p = p, b->cap = cap;
	}
}

static void head(tbuf *b, const char *name, const char *type, const char *help)
{
	tprintf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void one(tbuf *b, const char *name, const char *type, const char *help, uint64_t v)
{
	head(b, name, type, help);
	tprintf(b, "%s %llu\n", name, (unsigned long long)v);
}

/* One series of a counter broken down by reason: NAME{reason="WHY"} V. */
static void by_reason(tbuf *b, const char *name, const char *why, uint64_t v)
{
	tprintf(b, "%s{reason=\"%s\"} %llu\n", name, why, (unsigned long long)v);
}

static void broker_metrics(tbuf *b)
{
	long connected = conns_count();
	one(b, "weft_mqtt_clients_connected", "gauge", "Clients connected now.",
	    (uint64_t)connected);
	one(b, "weft_mqtt_sessions", "gauge", "Sessions held (connected or not).",
	    (uint64_t)sessions_count());
	one(b, "weft_mqtt_connections_total", "counter", "CONNECT packets accepted.",
	    stats_sum(ST_CONNECTS));
	one(b, "weft_mqtt_packets_received_total", "counter", "MQTT packets received.",
	    stats_sum(ST_MSG_RECV));
	one(b, "weft_mqtt_packets_sent_total", "counter", "MQTT packets sent.",
	    stats_sum(ST_MSG_SENT));
	one(b, "weft_mqtt_messages_received_total", "counter", "PUBLISH packets received.",
	    stats_sum(ST_PUB_RECV));
	one(b, "weft_mqtt_messages_sent_total", "counter", "PUBLISH packets sent.",
	    stats_sum(ST_PUB_SENT));
	one(b, "weft_mqtt_bytes_received_total", "counter", "Bytes received from clients.",
	    stats_sum(ST_BYTES_RECV));
	one(b, "weft_mqtt_bytes_sent_total", "counter", "Bytes sent to clients.",
	    stats_sum(ST_BYTES_SENT));
	one(b, "weft_mqtt_messages_dropped_total", "counter",
	    "Messages dropped (all reasons, as $SYS/broker/publish/messages/dropped).",
	    stats_sum(ST_PUB_DROPPED));
	head(b, "weft_mqtt_deliveries_dropped_total", "counter",
	     "Deliveries to one client dropped, by reason.");
	by_reason(b, "weft_mqtt_deliveries_dropped_total", "qos0_queue_full",
		  stats_sum(ST_DROP_QOS0));
	by_reason(b, "weft_mqtt_deliveries_dropped_total", "queue_full",
		  stats_sum(ST_DROP_QUEUE_FULL));
	by_reason(b, "weft_mqtt_deliveries_dropped_total", "expired", stats_sum(ST_DROP_EXPIRED));
	by_reason(b, "weft_mqtt_deliveries_dropped_total", "queue_bytes_full",
		  stats_sum(ST_DROP_QUEUE_BYTES));
	head(b, "weft_mqtt_connections_refused_total", "counter",
	     "Connections closed as they were accepted, by reason.");
	by_reason(b, "weft_mqtt_connections_refused_total", "max_connections",
		  stats_sum(ST_REFUSED_MAX_CONN));
	by_reason(b, "weft_mqtt_connections_refused_total", "rate", stats_sum(ST_REFUSED_RATE));
	one(b, "weft_mqtt_password_checks_total", "counter",
	    "Passwords checked against password_file, right or wrong.",
	    stats_sum(ST_PASSWORD_CHECKS));
	head(b, "weft_mqtt_password_checks_refused_total", "counter",
	     "CONNECTs told to try later without a password check, by reason: the pace of their "
	     "address, or of their name there, was booked 10 s ahead (pace), or the CONNECTs "
	     "waiting for their turn held all the memory they may (memory).");
	by_reason(b, "weft_mqtt_password_checks_refused_total", "pace", stats_sum(ST_REFUSED_PACE));
	by_reason(b, "weft_mqtt_password_checks_refused_total", "memory",
		  stats_sum(ST_REFUSED_WAITING));
	head(b, "weft_mqtt_subscriptions_refused_total", "counter",
	     "SUBSCRIBE filters refused, by reason: with quota exceeded, the retained messages they "
	     "would send passing retained_backlog_bytes or retained_backlog_bytes_total "
	     "(retained_backlog).");
	by_reason(b, "weft_mqtt_subscriptions_refused_total", "retained_backlog",
		  stats_sum(ST_REFUSED_BACKLOG));
	/* A gauge kept as per-worker sums of +1 and -1: the total is right modulo 2^64. */
	one(b, "weft_mqtt_queued_messages", "gauge",
	    "QoS 1/2 messages queued beyond the clients' inflight windows.",
	    stats_sum(ST_QUEUED));
	one(b, "weft_mqtt_retained_messages", "gauge", "Retained messages.",
	    (uint64_t)topic_retained_count());
	one(b, "weft_mqtt_subscriptions", "gauge", "Subscriptions.",
	    (uint64_t)topic_sub_count());
	/* mallinfo2 walks malloc's free lists under each arena's lock: a scrape is rare */
	struct mallinfo2 mi = mallinfo2();
	head(b, "weft_mqtt_memory_bytes", "gauge",
	     "Memory the broker holds, by part (docs/weft-mqtt.md, Memory).");
	tprintf(b, "weft_mqtt_memory_bytes{part=\"resident\"} %ld\n", mem_resident());
	tprintf(b, "weft_mqtt_memory_bytes{part=\"malloc_in_use\"} %zu\n", mi.uordblks + mi.hblkhd);
	tprintf(b, "weft_mqtt_memory_bytes{part=\"malloc_free\"} %zu\n", mi.fordblks);
	tprintf(b, "weft_mqtt_memory_bytes{part=\"pool_free_lists\"} %ld\n", pool_cached_bytes());
	tprintf(b, "weft_mqtt_memory_bytes{part=\"topic_tree\"} %ld\n", topic_bytes());
	tprintf(b, "weft_mqtt_memory_bytes{part=\"retained_backlogs\"} %llu\n",
		(unsigned long long)retained_backlog_bytes());
	head(b, "weft_mqtt_uptime_seconds", "gauge", "Seconds since the broker started.");
	tprintf(b, "weft_mqtt_uptime_seconds %.3f\n", (double)(weft_now() - broker_start) / 1e9);
	char *br = bridge_metrics_text();
	if (br)
		tprintf(b, "%s", br);
	free(br);
}

static void sched_metrics(tbuf *b)
{
	int max = weft_worker_max();
	weft_worker_stats *ws = calloc((size_t)(max > 0 ? max : 1), sizeof *ws);
	uint64_t foreign = 0;
	int n = ws ? weft_stats(ws, max, &foreign) : -ENOMEM;
	if (n > max)
		n = max;
	static const struct {
		const char *name, *help;
		size_t off;
	} f[] = {
		{ "weft_worker_switches_total", "Switches into tasks, per worker.",
		  offsetof(weft_worker_stats, switches) },
		{ "weft_worker_parks_total", "Times a task parked, per worker.",
		  offsetof(weft_worker_stats, parks) },
		{ "weft_worker_wakes_total", "Tasks woken, per worker.",
		  offsetof(weft_worker_stats, wakes) },
		{ "weft_worker_steals_total", "Batches of tasks stolen from other workers.",
		  offsetof(weft_worker_stats, steals) },
	};
	for (size_t k = 0; n > 0 && k < sizeof f / sizeof f[0]; k++) {
		head(b, f[k].name, "counter", f[k].help);
		for (int i = 0; i < n; i++) {
			uint64_t v;
			memcpy(&v, (char *)&ws[i] + f[k].off, sizeof v);
			tprintf(b, "%s{worker=\"%d\"} %llu\n", f[k].name, i, (unsigned long long)v);
		}
	}
	if (n > 0) {
		head(b, "weft_worker_idle_seconds_total", "counter",
		     "Time a worker spent asleep waiting for work.");
		for (int i = 0; i < n; i++)
			tprintf(b, "weft_worker_idle_seconds_total{worker=\"%d\"} %.6f\n", i,
				(double)ws[i].idle_ns / 1e9);
		one(b, "weft_foreign_wakes_total", "counter", "Tasks woken by plain threads.",
		    foreign);
	}
	free(ws);
	weft_wait_stats wt[64];
	int nw = weft_stats_waits(wt, 64);
	if (nw > 0) {
		head(b, "weft_waits_total", "counter",
		     "Times a task or thread parked, by what it waited for.");
		for (int i = 0; i < nw; i++)
			tprintf(b, "weft_waits_total{kind=\"%s\"} %llu\n", wt[i].what,
				(unsigned long long)wt[i].waits);
		head(b, "weft_wait_seconds_total", "counter",
		     "Time tasks and threads spent parked, by what they waited for.");
		for (int i = 0; i < nw; i++)
			tprintf(b, "weft_wait_seconds_total{kind=\"%s\"} %.6f\n", wt[i].what,
				(double)wt[i].wait_ns / 1e9);
	}
}

static void reply(int fd, int code, const char *reason, const char *ctype, const char *body,
		  size_t blen, bool with_body)
{
	char h[256];
	int n = snprintf(h, sizeof h,
			 "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
			 "Connection: close\r\n\r\n",
			 code, reason, ctype, blen);
	int64_t deadline = weft_now() + METRICS_TIMEOUT;
	if (weft_write(fd, h, (size_t)n, deadline) == n && with_body && blen)
		weft_write(fd, body, blen, deadline);
}

static void http_error(int fd, int code, const char *reason)
{
	char body[64];
	int n = snprintf(body, sizeof body, "%d %s\n", code, reason);
	reply(fd, code, reason, "text/plain; charset=utf-8", body, (size_t)n, true);
}

/* Read the request head (up to the blank line) into buf; its length, or -1. */
static int read_head(int fd, char *buf, size_t cap, bool *too_long)
{
	int64_t deadline = weft_now() + METRICS_TIMEOUT;
	size_t len = 0;
	*too_long = false;
	for (;;) {
		if (len == cap - 1) {
			*too_long = true;
			return -1;
		}
		ssize_t r = weft_read(fd, buf + len, cap - 1 - len, deadline);
		if (r <= 0)
			return -1;
		len += (size_t)r;
		buf[len] = 0;
		if (strstr(buf, "\r\n\r\n") || strstr(buf, "\n\n"))
			return (int)len;
	}
}

static void serve(int fd)
{
	char buf[METRICS_HEAD_MAX];
	bool too_long;
	if (read_head(fd, buf, sizeof buf, &too_long) < 0) {
		if (too_long)
			http_error(fd, 431, "Request Header Fields Too Large");
		return;
	}
	/* request-line = method SP request-target SP HTTP-version */
	char *eol = strpbrk(buf, "\r\n");
	*eol = 0;
	char *sp1 = strchr(buf, ' '), *sp2 = sp1 ? strchr(sp1 + 1, ' ') : NULL;
	if (!sp1 || !sp2 || sp1 == buf || sp2 == sp1 + 1 || strchr(sp2 + 1, ' ') ||
	    strncmp(sp2 + 1, "HTTP/1.", 7) || sp1[1] != '/') {
		http_error(fd, 400, "Bad Request");
		return;
	}
	*sp1 = *sp2 = 0;
	const char *method = buf, *target = sp1 + 1;
	size_t plen = strcspn(target, "?");
	if (plen != 8 || strncmp(target, "/metrics", 8)) {
		http_error(fd, 404, "Not Found");
		return;
	}
	bool get = !strcmp(method, "GET");
	if (!get && strcmp(method, "HEAD")) {
		http_error(fd, 405, "Method Not Allowed");
		return;
	}
	tbuf b = { 0 };
	broker_metrics(&b);
	sched_metrics(&b);
	if (b.bad)
		http_error(fd, 500, "Internal Server Error");
	else
		reply(fd, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", b.p, b.len, get);
	free(b.p);
}

static void client(void *arg)
{
	int slot = (int)(intptr_t)arg, fd;
	WEFT_WITH_LOCK(&mlock)
		fd = cfds[slot];
	serve(fd);
	WEFT_WITH_LOCK(&mlock) {
		cfds[slot] = -1;
		weft_close(fd);
	}
	atomic_fetch_sub(&nclients, 1);
}

/* A free slot for fd, or -1 when METRICS_CLIENTS are being served. */
static int take_slot(int fd)
{
	int slot = -1;
	WEFT_WITH_LOCK(&mlock)
		for (int i = 0; i < METRICS_CLIENTS && slot < 0; i++)
			if (cfds[i] < 0)
				cfds[slot = i] = fd;
	return slot;
}

static void acceptor(void *arg)
{
	(void)arg;
	weft_spawn_opts o = { .name = "mqtt-metrics", .detached = 1 };
	while (!atomic_load(&broker_stopping)) {
		int fd = weft_accept(lfd, NULL, NULL, 0, WEFT_FOREVER);
		if (fd < 0) {
			if (fd == -EBADF || fd == -ECANCELED || atomic_load(&broker_stopping))
				return;
			weft_sleep_until(weft_now() + 10000000); /* out of fds: let some close */
			continue;
		}
		int slot = take_slot(fd);
		if (slot < 0) {
			weft_close(fd);
			continue;
		}
		atomic_fetch_add(&nclients, 1);
		if (!weft_spawn_opt(client, (void *)(intptr_t)slot, &o)) {
			WEFT_WITH_LOCK(&mlock)
				cfds[slot] = -1;
			atomic_fetch_sub(&nclients, 1);
			weft_close(fd);
		}
	}
}

int metrics_start(void)
{
	if (!conf.metrics_port)
		return 0;
	for (int i = 0; i < METRICS_CLIENTS; i++)
		cfds[i] = -1;
	const char *host = conf.metrics_host[0] ? conf.metrics_host : "127.0.0.1";
	lfd = weft_tcp_listen(host, conf.metrics_port, 128);
	if (lfd < 0) {
		fprintf(stderr, "weft-mqtt: cannot listen on %s:%d for metrics: %s\n", host,
			conf.metrics_port, strerror(-lfd));
		return -1;
	}
	if (conf.verbose)
		fprintf(stderr, "weft-mqtt: metrics on http://%s:%d/metrics\n", host,
			conf.metrics_port);
	weft_spawn_opts o = { .name = "mqtt-metrics-accept" };
	acc = weft_spawn_opt(acceptor, NULL, &o);
	if (!acc) {
		weft_close(lfd);
		lfd = -1;
		return -1;
	}
	return 0;
}

void metrics_stop(void)
{
	if (lfd < 0)
		return;
	weft_cancel(acc);
	weft_join(acc);
	weft_close(lfd);
	lfd = -1;
	WEFT_WITH_LOCK(&mlock)
		for (int i = 0; i < METRICS_CLIENTS; i++)
			if (cfds[i] >= 0)
				shutdown(cfds[i], SHUT_RDWR);
	while (atomic_load(&nclients) > 0)
		weft_sleep_until(weft_now() + 1000000);
}
