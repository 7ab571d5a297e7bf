/*
 * mqtt-loadgen: a load generator for MQTT brokers, built on libmosquitto so that it is neutral
 * between the brokers it measures (weft-mqtt and mosquitto run through the same client code).
 *
 * Traffic modes (-t):
 *   fanin   P publishers all publish to one topic, S subscribers (normally 1) subscribe to it;
 *   pairs   publisher i publishes to its own topic, subscriber i subscribes to it (P == S);
 *   fanout  one publisher, S subscribers of its topic.
 * Each message carries, in a payload of at least 64 bytes, the CLOCK_MONOTONIC time it was
 * handed to libmosquitto, the publisher's index and a sequence number. Subscribers compute the
 * end-to-end latency from it (into a log-linear histogram: p50/p99/p99.9) and mark the sequence
 * number in a bitmap per (subscriber, publisher), which gives the messages lost (expected but
 * never seen) and duplicated (seen twice) once the run has drained.
 *
 * How the connections are driven: W worker threads (default 2: the generator shares the cores
 * with the broker) each own a slice of the connections and run libmosquitto's non-blocking
 * loop over them: one epoll set of their sockets (EPOLLOUT only while libmosquitto has bytes
 * waiting), mosquitto_loop_read until the socket would block (libmosquitto reads one packet
 * per call otherwise; its reads go through a buffer, see "buffered reads" below), loop_write
 * when it wants to write, loop_misc every 100 ms. A publisher publishes from its worker,
 * outside any callback, so libmosquitto writes the packet at once.
 *
 * Flow control: an open-loop publisher at full speed measures the broker's buffers, not its
 * throughput. So each publisher keeps at most -w messages per subscriber in flight end to end:
 * it may publish while (sent * fanout - delivered) < w * fanout, where delivered is counted by
 * the subscribers' workers in per-worker counters (no shared cache line on the hot path); a
 * worker whose publishers all wait sleeps until a subscriber's worker wakes it (eventfd). At
 * QoS 0 a broker may drop messages, which would close the window for good; a publisher whose
 * window stays shut for 200 ms writes the missing deliveries off (they show up as lost). In
 * fixed-rate mode (-r, messages/s in total) publishers follow a schedule instead.
 *
 * Other modes:
 *   -I N      open N idle connections (64 at a time, each batch CONNACKed before the next, over
 *             as many processes as the descriptor limit asks), report the broker's RSS before
 *             and after (-b PID), hold them -d seconds;
 *   -C seq|par  connect/CONNACK/DISCONNECT storm for -d seconds: one connection at a time, or
 *             -W threads each doing the same; reports connections/s. The client closes with an
 *             abortive close after its DISCONNECT, or thousands of TIME_WAIT sockets a second
 *             would exhaust the local ports.
 *
 * Fresh connections are slow for their first messages (TCP and allocator warm-up, in any
 * broker), so the first -x seconds (default 0.5) of traffic are not measured: rates, CPU and
 * latencies count what arrives after them (what was sent after them, for latencies); losses
 * and duplicates count the whole run.
 *
 * With -b PID the broker's CPU time (utime+stime from /proc/PID/stat) is read at the end of the
 * warm-up and after the run drains; cpu_us_per_msg is that divided by the deliveries counted
 * in between.
 *
 * Against mosquitto 2.0.11, QoS 2 over 5.0 (-V 5 -q 2) needs -w 20 or less: with more in
 * flight, libmosquitto's subscribers drop their connections (receive maximum exceeded);
 * bench/mqtt runs 3.1.1.
 *
 * Output: one line of key=value pairs on stdout (bench/mqtt/run.sh parses it), a human summary
 * on stderr. The exit status is 1 when messages were lost at QoS 1 or 2, duplicated at QoS 2,
 * or when a connection failed (the counts are in the output at every QoS).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <mosquitto.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

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

static struct {
	const char *host;
	int port, npub, nsub, qos, size, version, window, nworkers, keepalive;
	enum shape shape;
	long count;      /* messages per publisher, or 0 */
	double duration; /* seconds, or 0 */
	double rate;     /* messages/s in total, or 0 */
	double warmup;   /* seconds of traffic before measuring */
	int idle;        /* -I: idle connections */
	const char *storm;
	int broker_pid;
	char prefix[64];
} opt = { .host = "127.0.0.1", .port = 1883, .npub = 1, .nsub = 1, .size = 64, .version = 4,
	  .window = 100, .nworkers = 2, .warmup = 0.5, .keepalive = 60, .shape = PAIRS };

static struct worker workers[MAX_WORKERS];
static struct conn *pubs, *subs;
static atomic_bool publishing, stop_publishing, stop_all;
static int64_t t_start;
static _Atomic int64_t t_measure = INT64_MAX; /* the end of the warm-up */

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void die(const char *what)
{
	fprintf(stderr, "mqtt-loadgen: %s\n", what);
	exit(2);
}

/* ---- the broker's /proc figures ----------------------------------------------------------- */

static double broker_cpu_s(void)
{
	char path[64], buf[1024];
	snprintf(path, sizeof path, "/proc/%d/stat", opt.broker_pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return NAN;
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = 0;
	char *p = strrchr(buf, ')'); /* the command name may hold spaces */
	unsigned long ut = 0, st = 0;
	if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
		return NAN;
	return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static long broker_rss_kb(void)
{
	char path[64], line[256];
	long kb = -1;
	snprintf(path, sizeof path, "/proc/%d/status", opt.broker_pid);
	FILE *f = fopen(path, "r");
	while (f && fgets(line, sizeof line, f))
		if (sscanf(line, "VmRSS: %ld", &kb) == 1)
			break;
	if (f)
		fclose(f);
	return kb;
}

/* ---- latency histogram ---------------------------------------------------------------------- */

static int bucket_of(uint64_t ns)
{
	if (ns < SUB)
		return (int)ns;
	int e = 63 - __builtin_clzll(ns); /* ns in [2^e, 2^(e+1)) */
	int shift = e - 6;
	return (e - 5) * SUB + (int)((ns >> shift) - SUB);
}

static double bucket_value(int b)
{
	if (b < SUB)
		return b;
	int e = b / SUB + 5, sub = b % SUB;
	return ldexp(SUB + sub + 0.5, e - 6);
}

static double quantile(const uint64_t *h, uint64_t total, double q)
{
	if (!total)
		return NAN;
	uint64_t want = (uint64_t)ceil(q * (double)total), acc = 0;
	if (want < 1)
		want = 1;
	for (int b = 0; b < HBUCKETS; b++)
		if ((acc += h[b]) >= want)
			return bucket_value(b);
	return NAN;
}

/* ---- callbacks -------------------------------------------------------------------------------- */

static void on_connect(struct mosquitto *m, void *arg, int rc)
{
	struct conn *c = arg;
	if (rc) {
		fprintf(stderr, "mqtt-loadgen: CONNACK %d (%s)\n", rc, mosquitto_connack_string(rc));
		STORE(c->failed, true);
		return;
	}
	STORE(c->connected, true);
	if (!c->is_pub && !opt.idle) {
		char topic[128];
		if (opt.shape == PAIRS)
			snprintf(topic, sizeof topic, "%s/pair/%d", opt.prefix, c->idx);
		else
			snprintf(topic, sizeof topic, "%s/%s", opt.prefix,
				 opt.shape == FANIN ? "fanin" : "fanout");
		if (mosquitto_subscribe(m, NULL, topic, opt.qos) != MOSQ_ERR_SUCCESS)
			STORE(c->failed, true);
	}
}

static void on_subscribe(struct mosquitto *m, void *arg, int mid, int n, const int *granted)
{
	(void)m, (void)mid;
	struct conn *c = arg;
	if (n < 1 || granted[0] != opt.qos) {
		fprintf(stderr, "mqtt-loadgen: subscription granted QoS %d\n", n ? granted[0] : -1);
		STORE(c->failed, true);
	}
	STORE(c->subscribed, true);
}

static void on_publish(struct mosquitto *m, void *arg, int mid)
{
	(void)m, (void)mid;
	((struct conn *)arg)->acked++;
}

static void mark_seen(struct seen *s, uint64_t seq)
{
	if (seq >= s->cap) {
		uint64_t cap = s->cap ? s->cap : 4096;
		while (cap <= seq)
			cap *= 2;
		s->bits = realloc(s->bits, cap / 8);
		if (!s->bits)
			die("out of memory");
		memset((char *)s->bits + s->cap / 8, 0, (cap - s->cap) / 8);
		s->cap = cap;
	}
	uint64_t bit = 1ull << (seq & 63);
	s->total++;
	if (!(s->bits[seq >> 6] & bit)) {
		s->bits[seq >> 6] |= bit;
		s->distinct++;
	}
}

static void on_message(struct mosquitto *m, void *arg, const struct mosquitto_message *msg)
{
	(void)m;
	struct conn *c = arg;
	struct worker *w = c->w;
	struct payload p;
	if (msg->payloadlen < (int)sizeof p)
		return;
	memcpy(&p, msg->payload, sizeof p);
	if (p.magic != MAGIC || p.pub >= (uint32_t)opt.npub)
		return;
	int64_t t = now_ns(), tm = atomic_load_explicit(&t_measure, memory_order_relaxed);
	if ((int64_t)p.ts >= tm) /* fresh connections are slow at first: not counted */
		w->hist[bucket_of((uint64_t)(t - (int64_t)p.ts))]++;
	if (t >= tm)
		w->measured++;
	STORE(w->received, w->received + 1);
	w->last_recv_ns = t;
	mark_seen(&c->seen[p.pub], p.seq);
	atomic_fetch_add(&w->delivered[p.pub], 1); /* seq_cst: see wake_waiting */
}

/* ---- connections ----------------------------------------------------------------------------- */

static void conn_open(struct conn *c, const char *kind)
{
	char id[96];
	snprintf(id, sizeof id, "%s-%s%d", opt.prefix, kind, c->idx);
	c->m = mosquitto_new(id, true, c);
	if (!c->m)
		die("mosquitto_new failed");
	mosquitto_int_option(c->m, MOSQ_OPT_PROTOCOL_VERSION, opt.version);
	mosquitto_int_option(c->m, MOSQ_OPT_TCP_NODELAY, 1);
	mosquitto_connect_callback_set(c->m, on_connect);
	mosquitto_subscribe_callback_set(c->m, on_subscribe);
	mosquitto_publish_callback_set(c->m, on_publish);
	mosquitto_message_callback_set(c->m, on_message);
	/* libmosquitto's own limit of 20 QoS 1/2 messages in flight per connection stays: a broker
	 * may drop what goes past its own limit (mosquitto 2.0.11 drops the QoS 2 PUBLISHes of a
	 * 3.1.1 client past its max_inflight_messages without a PUBREC: lost for good), and in
	 * 5.0 libmosquitto keeps to the broker's Receive Maximum instead. */
	int rc = mosquitto_connect_async(c->m, opt.host, opt.port, opt.keepalive);
	if (rc != MOSQ_ERR_SUCCESS) {
		fprintf(stderr, "mqtt-loadgen: connect %s:%d: %s\n", opt.host, opt.port,
			rc == MOSQ_ERR_ERRNO ? strerror(errno) : mosquitto_strerror(rc));
		exit(2);
	}
}

/* ---- buffered reads under libmosquitto ------------------------------------------------------
 * libmosquitto reads each packet with three read() calls or more (the type byte, the length
 * one byte at a time, the rest): at 100,000 messages/s that is the generator's main cost, and
 * the generator shares the cores with the broker. So read() is interposed (libmosquitto calls
 * it through the PLT): on a socket registered here it refills a 64 KiB buffer with one system
 * call and serves libmosquitto's small reads from it. Only the worker that owns a connection
 * reads its socket, so a buffer needs no lock. Since epoll cannot see bytes already in the
 * buffer, conn_read reads until the buffer and the socket are both empty (or marks the
 * connection pending when it stops early). */
#define RBUF (64 << 10)
struct rbuf {
	char *data;
	size_t off, len;
};
static struct rbuf *rbufs; /* indexed by fd; NULL: no buffering (idle and storm modes) */
static int nrbufs;

ssize_t read(int fd, void *buf, size_t n)
{
	struct rbuf *b = rbufs && fd >= 0 && fd < nrbufs && rbufs[fd].data ? &rbufs[fd] : NULL;
	if (!b)
		return syscall(SYS_read, fd, buf, n);
	if (b->off == b->len) {
		if (n >= RBUF)
			return syscall(SYS_read, fd, buf, n);
		ssize_t k = syscall(SYS_read, fd, b->data, RBUF);
		if (k <= 0)
			return k;
		b->off = 0;
		b->len = (size_t)k;
	}
	size_t k = n < b->len - b->off ? n : b->len - b->off;
	memcpy(buf, b->data + b->off, k);
	b->off += k;
	return (ssize_t)k;
}

static void rbuf_register(int fd)
{
	if (!rbufs || fd < 0 || fd >= nrbufs || rbufs[fd].data)
		return;
	rbufs[fd].data = malloc(RBUF);
	rbufs[fd].off = rbufs[fd].len = 0;
}

static bool rbuf_pending(int fd)
{
	return rbufs && fd >= 0 && fd < nrbufs && rbufs[fd].off < rbufs[fd].len;
}

/* Read until the socket would block (libmosquitto reads one packet per call); returns false
 * when the connection is lost. Stops after 4096 packets to let the others in. errno is how
 * libmosquitto says "would block", but a write it makes while handling a packet (PUBACK,
 * PUBREC, ...) can leave EAGAIN there too with bytes still in the buffer: so whatever the
 * reason for stopping, c->pending says whether the buffer still holds bytes. */
static bool conn_read(struct conn *c)
{
	for (int k = 0; k < 4096; k++) {
		errno = 0;
		int rc = mosquitto_loop_read(c->m, 1);
		if (rc != MOSQ_ERR_SUCCESS) {
			c->pending = false;
			return false;
		}
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			break;
	}
	c->pending = rbuf_pending(mosquitto_socket(c->m));
	return true;
}

static bool may_publish(struct conn *c, int64_t now)
{
	if (opt.count && c->sent >= (uint64_t)opt.count)
		return false;
	if (opt.rate > 0)
		return now >= c->next_ns;
	uint64_t delivered = 0;
	for (int i = 0; i < opt.nworkers; i++)
		delivered += atomic_load(&workers[i].delivered[c->idx]);
	uint64_t owed = c->sent * (uint64_t)c->fanout - c->written_off;
	if (owed - delivered < (uint64_t)opt.window * (uint64_t)c->fanout) {
		c->blocked_since = 0;
		return true;
	}
	if (!c->blocked_since)
		c->blocked_since = now;
	else if (opt.qos == 0 && now - c->blocked_since > 200000000) {
		c->written_off += owed - delivered; /* dropped by the broker: stop waiting */
		c->blocked_since = 0;
	}
	return false;
}

static void publish_one(struct conn *c, int64_t now)
{
	static __thread char buf[1 << 16];
	char topic[128];
	if (opt.shape == PAIRS)
		snprintf(topic, sizeof topic, "%s/pair/%d", opt.prefix, c->idx);
	else
		snprintf(topic, sizeof topic, "%s/%s", opt.prefix, opt.shape == FANIN ? "fanin" : "fanout");
	struct payload p = { .ts = (uint64_t)now, .seq = c->sent, .pub = (uint32_t)c->idx, .magic = MAGIC };
	memcpy(buf, &p, sizeof p);
	int rc = mosquitto_publish(c->m, NULL, topic, opt.size, buf, opt.qos, false);
	if (rc != MOSQ_ERR_SUCCESS) {
		fprintf(stderr, "mqtt-loadgen: publish: %s\n", mosquitto_strerror(rc));
		STORE(c->failed, true);
		return;
	}
	STORE(c->sent, c->sent + 1);
	if (opt.rate > 0)
		c->next_ns += (int64_t)(1e9 * opt.npub / opt.rate);
}

/* Publish what the window or the schedule allows; returns whether more could go at once. */
static bool publish_some(struct worker *w, int64_t *next_due)
{
	bool more = false;
	int64_t now = now_ns();
	for (int i = 0; i < w->n; i++) {
		struct conn *c = w->c[i];
		if (!c->is_pub || c->failed)
			continue;
		for (int k = 0; k < 16 && may_publish(c, now); k++)
			publish_one(c, now = now_ns());
		if (opt.rate > 0 && (!opt.count || c->sent < (uint64_t)opt.count) &&
		    c->next_ns < *next_due)
			*next_due = c->next_ns;
		else if (opt.rate <= 0 && may_publish(c, now))
			more = true;
	}
	return more;
}

/* Keep the socket's registration in step with whether libmosquitto has bytes to write. */
static void conn_watch(struct conn *c)
{
	int fd = mosquitto_socket(c->m);
	bool out = mosquitto_want_write(c->m);
	if (fd < 0 || (fd == c->fd && out == c->watching_out))
		return;
	struct epoll_event ev = { .events = EPOLLIN | (out ? EPOLLOUT : 0), .data.ptr = c };
	if (epoll_ctl(c->w->epfd, fd == c->fd ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, fd, &ev) == 0)
		c->fd = fd, c->watching_out = out;
	rbuf_register(fd);
}

/* Wake the workers whose publishers wait for deliveries this worker has just counted. A
 * waiting worker sets `waiting`, then reads the counters; this one adds to the counters, then
 * reads `waiting`: all sequentially consistent, so one of the two sees the other (and a
 * missed wake-up would cost 1 ms, the waiting worker's timeout). */
static void wake_waiting(struct worker *self)
{
	for (int i = 0; i < opt.nworkers; i++) {
		struct worker *w = &workers[i];
		if (w != self && atomic_load(&w->waiting) && atomic_exchange(&w->waiting, false)) {
			uint64_t one = 1;
			if (write(w->efd, &one, sizeof one) < 0)
				continue;
		}
	}
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	struct epoll_event evs[256];
	int64_t last_misc = now_ns();
	for (int i = 0; i < w->n; i++)
		w->c[i]->fd = -1, conn_watch(w->c[i]);
	while (!atomic_load(&stop_all)) {
		int64_t next_due = INT64_MAX, now, wait = 10000000;
		bool active = atomic_load(&publishing) && !atomic_load(&stop_publishing);
		if (active) {
			bool more = publish_some(w, &next_due);
			if (!more && next_due == INT64_MAX && opt.rate <= 0) {
				/* Shut windows: ask to be woken, then look once more. */
				atomic_store(&w->waiting, true);
				more = publish_some(w, &next_due);
				wait = 1000000;
			}
			now = now_ns();
			if (more)
				wait = 0;
			else if (next_due != INT64_MAX)
				wait = next_due > now ? next_due - now : 0;
			if (wait > 10000000)
				wait = 10000000;
		}
		bool pending = false;
		for (int i = 0; i < w->n; i++) {
			conn_watch(w->c[i]);
			pending |= w->c[i]->pending;
		}
		if (pending)
			wait = 0;
		struct timespec ts = { wait / 1000000000, wait % 1000000000 }; /* to the schedule's ns */
		int n = epoll_pwait2(w->epfd, evs, 256, &ts, NULL);
		if (n < 0 && errno != EINTR)
			die("epoll_wait failed");
		atomic_store_explicit(&w->waiting, false, memory_order_relaxed);
		uint64_t got = w->received;
		for (int i = 0; i < n; i++) {
			struct conn *c = evs[i].data.ptr;
			if (!c) { /* the eventfd */
				uint64_t v;
				if (read(w->efd, &v, sizeof v) < 0)
					continue;
				continue;
			}
			if (evs[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP))
				if (!conn_read(c) && !atomic_load(&stop_all)) {
					if (!c->failed)
						fprintf(stderr, "mqtt-loadgen: connection %s%d lost\n",
							c->is_pub ? "pub" : "sub", c->idx);
					STORE(c->failed, true);
				}
			if (evs[i].events & EPOLLOUT)
				mosquitto_loop_write(c->m, 1);
		}
		for (int i = 0; pending && i < w->n; i++)
			if (w->c[i]->pending && !conn_read(w->c[i]))
				STORE(w->c[i]->failed, true);
		if (w->received != got && opt.rate <= 0)
			wake_waiting(w);
		if ((now = now_ns()) - last_misc > 100000000) {
			last_misc = now;
			for (int i = 0; i < w->n; i++)
				mosquitto_loop_misc(w->c[i]->m);
		}
	}
	return NULL;
}

/* ---- run phases --------------------------------------------------------------------------- */

static int count_where(struct conn *cs, int n, int what)
{
	int k = 0;
	for (int i = 0; i < n; i++)
		k += what == 0 ? LOAD(cs[i].connected) : what == 1 ? LOAD(cs[i].subscribed) : LOAD(cs[i].failed);
	return k;
}

static void wait_ready(void)
{
	int64_t deadline = now_ns() + 30000000000;
	for (;;) {
		int failed = count_where(pubs, opt.npub, 2) + count_where(subs, opt.nsub, 2);
		if (failed)
			die("connections failed while setting up");
		int ready = count_where(pubs, opt.npub, 0) +
			    (opt.idle ? count_where(subs, opt.nsub, 0) : count_where(subs, opt.nsub, 1));
		if (ready == opt.npub + opt.nsub)
			return;
		if (now_ns() > deadline) {
			fprintf(stderr, "mqtt-loadgen: only %d of %d connections ready after 30 s\n", ready,
				opt.npub + opt.nsub);
			exit(2);
		}
		usleep(2000);
	}
}

static uint64_t total_sent(void)
{
	uint64_t s = 0;
	for (int i = 0; i < opt.npub; i++)
		s += LOAD(pubs[i].sent);
	return s;
}

static uint64_t total_received(void)
{
	uint64_t r = 0;
	for (int i = 0; i < opt.nworkers; i++)
		r += LOAD(workers[i].received);
	return r;
}

static uint64_t expected_deliveries(void)
{
	uint64_t e = 0;
	for (int i = 0; i < opt.npub; i++)
		e += LOAD(pubs[i].sent) * (uint64_t)pubs[i].fanout;
	return e;
}

/* Wait until every delivery arrived (QoS 1/2), or none arrived for 500 ms, or 10 s passed. */
static void drain(void)
{
	int64_t deadline = now_ns() + 10000000000, quiet_since = now_ns();
	uint64_t last = total_received();
	for (;;) {
		usleep(5000);
		uint64_t r = total_received();
		int64_t t = now_ns();
		if (r >= expected_deliveries() && (opt.qos == 0 || r == last))
			break;
		if (r != last)
			quiet_since = t, last = r;
		if (t - quiet_since > 500000000 || t > deadline)
			break;
	}
}

/* Thousands of connections at once overflow the broker's accept queue, and a dropped SYN is
 * retried only after a second: idle connections are opened 64 at a time. */
static void await_connacks(struct conn *cs, int n)
{
	struct pollfd pfd[64];
	int64_t deadline = now_ns() + 5000000000;
	for (;;) {
		int k = 0;
		for (int i = 0; i < n; i++)
			if (!cs[i].connected && !cs[i].failed)
				pfd[k].fd = mosquitto_socket(cs[i].m), pfd[k].events = POLLIN, k++;
		if (!k || now_ns() > deadline || poll(pfd, (nfds_t)k, 100) < 0)
			return;
		for (int i = 0; i < n; i++)
			if (!cs[i].connected && !cs[i].failed && !conn_read(&cs[i]))
				STORE(cs[i].failed, true);
	}
}

static void connect_all(void)
{
	pubs = calloc((size_t)opt.npub, sizeof *pubs);
	subs = calloc((size_t)opt.nsub, sizeof *subs);
	int total = opt.npub + opt.nsub;
	for (int i = 0; i < opt.nworkers; i++) {
		workers[i].id = i;
		workers[i].epfd = epoll_create1(EPOLL_CLOEXEC);
		workers[i].efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		struct epoll_event ev = { .events = EPOLLIN, .data.ptr = NULL };
		if (workers[i].epfd < 0 || workers[i].efd < 0 ||
		    epoll_ctl(workers[i].epfd, EPOLL_CTL_ADD, workers[i].efd, &ev) < 0)
			die("epoll or eventfd failed");
		workers[i].c = calloc((size_t)total, sizeof(struct conn *));
		workers[i].delivered = calloc((size_t)opt.npub, sizeof(_Atomic uint64_t));
	}
	/* Publisher i and subscriber i on different workers where possible, so that a pair's
	 * traffic crosses threads as it would between separate client processes. */
	for (int i = 0; i < opt.nsub; i++) {
		struct conn *c = &subs[i];
		c->idx = i;
		c->w = &workers[i % opt.nworkers];
		c->seen = calloc((size_t)opt.npub, sizeof *c->seen);
		c->w->c[c->w->n++] = c;
		conn_open(c, "sub");
		if (opt.idle && (i % 64 == 63 || i == opt.nsub - 1))
			await_connacks(subs + i / 64 * 64, i % 64 + 1);
	}
	for (int i = 0; i < opt.npub; i++) {
		struct conn *c = &pubs[i];
		c->idx = i;
		c->is_pub = true;
		c->fanout = opt.shape == PAIRS ? 1 : opt.nsub;
		c->w = &workers[(i + 1) % opt.nworkers];
		c->w->c[c->w->n++] = c;
		conn_open(c, "pub");
	}
	for (int i = 0; i < opt.nworkers; i++)
		pthread_create(&workers[i].th, NULL, worker_main, &workers[i]);
}

static void stop_workers(void)
{
	atomic_store(&stop_all, true);
	for (int i = 0; i < opt.nworkers; i++)
		pthread_join(workers[i].th, NULL);
}

static int run_traffic(void)
{
	struct rlimit rl;
	getrlimit(RLIMIT_NOFILE, &rl);
	nrbufs = rl.rlim_cur < 1 << 20 ? (int)rl.rlim_cur : 1 << 20;
	const char *unbuf = getenv("LOADGEN_UNBUFFERED"); /* to measure what the buffers save */
	if (!unbuf || !*unbuf)
		rbufs = calloc((size_t)nrbufs, sizeof *rbufs);
	connect_all();
	wait_ready();
	t_start = now_ns();
	for (int i = 0; i < opt.npub && opt.rate > 0; i++) /* staggered over one interval */
		pubs[i].next_ns = t_start + (int64_t)(1e9 / opt.rate * i);
	atomic_store(&publishing, true);
	usleep((useconds_t)(opt.warmup * 1e6));
	double cpu0 = opt.broker_pid ? broker_cpu_s() : NAN;
	uint64_t sent0 = total_sent();
	atomic_store(&t_measure, now_ns());
	if (opt.count) {
		while (total_sent() < (uint64_t)opt.count * (uint64_t)opt.npub &&
		       (!opt.duration || now_ns() - t_start < (int64_t)(opt.duration * 1e9)))
			usleep(1000);
	} else {
		usleep((useconds_t)(opt.duration * 1e6));
	}
	atomic_store(&stop_publishing, true);
	int64_t t_sent = now_ns();
	drain();
	double cpu1 = opt.broker_pid ? broker_cpu_s() : NAN;
	stop_workers();

	uint64_t hist[HBUCKETS] = { 0 }, received = 0, measured = 0, distinct = 0, total = 0;
	uint64_t timed = 0;
	int64_t tm = atomic_load(&t_measure), last = tm;
	for (int i = 0; i < opt.nworkers; i++) {
		for (int b = 0; b < HBUCKETS; b++)
			hist[b] += workers[i].hist[b], timed += workers[i].hist[b];
		received += workers[i].received;
		measured += workers[i].measured;
		if (workers[i].last_recv_ns > last)
			last = workers[i].last_recv_ns;
	}
	for (int s = 0; s < opt.nsub; s++)
		for (int p = 0; p < opt.npub; p++)
			distinct += subs[s].seen[p].distinct, total += subs[s].seen[p].total;
	uint64_t sent = total_sent(), expected = expected_deliveries();
	uint64_t lost = expected > distinct ? expected - distinct : 0, dup = total - distinct;
	int failed = count_where(pubs, opt.npub, 2) + count_where(subs, opt.nsub, 2);
	/* Rates and CPU over what happened after the warm-up, to the last delivery. */
	double send_s = (double)(t_sent - tm) / 1e9, recv_s = (double)(last - tm) / 1e9;
	double cpu_us = (cpu1 - cpu0) * 1e6, sent_rate = (double)(sent - sent0) / send_s;
	double recv_rate = (double)measured / recv_s;
	double p50 = quantile(hist, timed, 0.5) / 1e3, p99 = quantile(hist, timed, 0.99) / 1e3;
	printf("sent=%llu received=%llu expected=%llu lost=%llu dup=%llu failed=%d "
	       "send_s=%.3f recv_s=%.3f sent_rate=%.0f recv_rate=%.0f "
	       "p50_us=%.1f p99_us=%.1f p999_us=%.1f max_us=%.1f broker_cpu_s=%.3f cpu_us_per_msg=%.3f\n",
	       (unsigned long long)sent, (unsigned long long)received, (unsigned long long)expected,
	       (unsigned long long)lost, (unsigned long long)dup, failed, send_s, recv_s,
	       sent_rate, recv_rate, p50, p99, quantile(hist, timed, 0.999) / 1e3,
	       quantile(hist, timed, 1.0) / 1e3, cpu_us / 1e6,
	       measured ? cpu_us / (double)measured : NAN);
	fflush(stdout);
	fprintf(stderr, "    sent %.0f/s, received %.0f/s, %.2f us broker CPU each, lost %llu, dup %llu, "
		"p50 %.1f us, p99 %.1f us\n", sent_rate, recv_rate,
		measured ? cpu_us / (double)measured : NAN, (unsigned long long)lost,
		(unsigned long long)dup, p50, p99);
	if (failed)
		return 1;
	/* At least once allows duplicates; exactly once does not. */
	return (opt.qos > 0 && lost) || (opt.qos == 2 && dup) ? 1 : 0;
}

/* One process's share of the idle connections: connect, say so on `ready`, hold them until
 * `hold` is closed. */
static void idle_child(int share, int ready, int hold)
{
	char c = 1;
	opt.npub = 0;
	opt.nsub = share;
	connect_all();
	wait_ready();
	if (count_where(subs, opt.nsub, 2) == 0 && write(ready, &c, 1) < 0)
		_exit(1);
	while (read(hold, &c, 1) > 0)
		;
	stop_workers();
	_exit(0);
}

/* Idle connections are spread over as many processes as the descriptor limit asks (it cannot
 * be raised without CAP_SYS_RESOURCE). */
static int run_idle(void)
{
	struct rlimit rl;
	getrlimit(RLIMIT_NOFILE, &rl);
	int per = (int)((rl.rlim_cur - 64) / 3), nproc = (opt.idle + per - 1) / per;
	int hold[2];
	if (pipe(hold))
		die("pipe failed");
	long rss0 = opt.broker_pid ? broker_rss_kb() : -1;
	int64_t t0 = now_ns();
	pid_t kids[64];
	int up = 0;
	if (nproc > 64)
		die("too many idle connections for the descriptor limit");
	/* One process after the other: two connecting at once overflow the accept queue. */
	for (int i = 0, left = opt.idle; i < nproc; i++) {
		int share = left / (nproc - i), ready[2];
		char c;
		left -= share;
		if (pipe(ready))
			die("pipe failed");
		if ((kids[i] = fork()) == 0) {
			close(ready[0]), close(hold[1]);
			size_t len = strlen(opt.prefix);
			snprintf(opt.prefix + len, sizeof opt.prefix - len, "i%d", i);
			idle_child(share, ready[1], hold[0]);
		}
		close(ready[1]);
		if (read(ready[0], &c, 1) == 1)
			up++;
		close(ready[0]);
	}
	close(hold[0]);
	double conn_s = (double)(now_ns() - t0) / 1e9;
	usleep(500000); /* let the broker settle its buffers */
	long rss1 = opt.broker_pid ? broker_rss_kb() : -1;
	if (opt.duration > 0.5)
		usleep((useconds_t)((opt.duration - 0.5) * 1e6));
	close(hold[1]);
	int failed = 0, st;
	for (int i = 0; i < nproc; i++)
		if (waitpid(kids[i], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st))
			failed++;
	if (up < nproc)
		fprintf(stderr, "mqtt-loadgen: %d of %d processes could not connect all theirs\n",
			nproc - up, nproc);
	printf("connections=%d processes=%d failed=%d connect_s=%.3f rss_before_kb=%ld "
	       "rss_after_kb=%ld rss_per_conn_bytes=%.0f\n", opt.idle, nproc, failed, conn_s, rss0,
	       rss1, (double)(rss1 - rss0) * 1024 / opt.idle);
	fflush(stdout);
	fprintf(stderr, "    %d idle connections in %.2f s; broker RSS %ld -> %ld KiB (%.0f bytes each)\n",
		opt.idle, conn_s, rss0, rss1, (double)(rss1 - rss0) * 1024 / opt.idle);
	return failed || up < nproc ? 1 : 0;
}

/* ---- connect/disconnect storm ------------------------------------------------------------- */

static atomic_long storm_done, storm_failed;

static void storm_on_connect(struct mosquitto *m, void *arg, int rc)
{
	(void)m;
	*(int *)arg = rc ? -1 : 1;
}

static void *storm_thread(void *arg)
{
	long t = (long)arg, k = 0;
	int state;
	char id[96];
	int64_t end = now_ns() + (int64_t)(opt.duration * 1e9);
	snprintf(id, sizeof id, "%s-storm%ld", opt.prefix, t);
	struct mosquitto *m = mosquitto_new(id, true, &state);
	mosquitto_int_option(m, MOSQ_OPT_PROTOCOL_VERSION, opt.version);
	mosquitto_connect_callback_set(m, storm_on_connect);
	while (now_ns() < end && !atomic_load(&stop_all)) {
		snprintf(id, sizeof id, "%s-storm%ld-%ld", opt.prefix, t, k++);
		mosquitto_reinitialise(m, id, true, &state);
		mosquitto_int_option(m, MOSQ_OPT_PROTOCOL_VERSION, opt.version);
		mosquitto_connect_callback_set(m, storm_on_connect);
		state = 0;
		if (mosquitto_connect(m, opt.host, opt.port, opt.keepalive) != MOSQ_ERR_SUCCESS) {
			atomic_fetch_add(&storm_failed, 1);
			usleep(1000);
			continue;
		}
		/* The client closes first after DISCONNECT; an abortive close keeps thousands
		 * of connections a second from filling the port range with TIME_WAIT. */
		struct linger lg = { 1, 0 };
		setsockopt(mosquitto_socket(m), SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
		while (state == 0)
			if (mosquitto_loop(m, 1000, 1) != MOSQ_ERR_SUCCESS)
				break;
		if (state != 1) {
			atomic_fetch_add(&storm_failed, 1);
			continue;
		}
		mosquitto_disconnect(m);
		while (mosquitto_loop(m, 1000, 1) == MOSQ_ERR_SUCCESS)
			;
		atomic_fetch_add(&storm_done, 1);
	}
	mosquitto_destroy(m);
	return NULL;
}

static int run_storm(void)
{
	int threads = strcmp(opt.storm, "seq") == 0 ? 1 : opt.nworkers;
	pthread_t th[MAX_WORKERS];
	double cpu0 = opt.broker_pid ? broker_cpu_s() : NAN;
	int64_t t0 = now_ns();
	for (long i = 0; i < threads; i++)
		pthread_create(&th[i], NULL, storm_thread, (void *)i);
	for (int i = 0; i < threads; i++)
		pthread_join(th[i], NULL);
	double s = (double)(now_ns() - t0) / 1e9;
	double cpu = opt.broker_pid ? broker_cpu_s() - cpu0 : NAN;
	long done = atomic_load(&storm_done), failed = atomic_load(&storm_failed);
	printf("connections=%ld failed=%ld seconds=%.3f conn_rate=%.0f broker_cpu_s=%.3f "
	       "cpu_us_per_conn=%.2f\n", done, failed, s, done / s, cpu, done ? cpu * 1e6 / done : NAN);
	fflush(stdout);
	fprintf(stderr, "    %ld connect/disconnects in %.2f s (%.0f/s, %d threads), %ld failed\n",
		done, s, done / s, threads, failed);
	return failed * 100 > done ? 1 : 0;
}

/* ---- command line ---------------------------------------------------------------------------- */

static void usage(void)
{
	fputs("usage: mqtt-loadgen [-h host] [-p port] [-t fanin|pairs|fanout] [-P publishers]\n"
	      "         [-S subscribers] [-q qos] [-s payload bytes] [-n msgs per publisher]\n"
	      "         [-d seconds] [-r total msgs/s] [-w window] [-W worker threads] [-V 3|5]\n"
	      "         [-b broker pid] [-x warm-up seconds] [-I idle connections] [-C seq|par]\n", stderr);
	exit(2);
}

/* libmosquitto takes three descriptors per connection (the socket and a wake-up pair). */
static void raise_fd_limit(void)
{
	struct rlimit rl;
	rlim_t want = 3 * (rlim_t)(opt.idle + opt.npub + opt.nsub) + 64;
	if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
		return;
	if (rl.rlim_max < want) { /* root may raise the hard limit too */
		struct rlimit more = { want, want };
		if (setrlimit(RLIMIT_NOFILE, &more) == 0)
			return;
	}
	rl.rlim_cur = rl.rlim_max;
	setrlimit(RLIMIT_NOFILE, &rl);
}

int main(int argc, char **argv)
{
	int ch;
	while ((ch = getopt(argc, argv, "h:p:t:P:S:q:s:n:d:r:w:W:V:b:I:C:x:")) != -1) {
		switch (ch) {
		case 'h': opt.host = optarg; break;
		case 'p': opt.port = atoi(optarg); break;
		case 't':
			opt.shape = strcmp(optarg, "fanin") == 0 ? FANIN :
				    strcmp(optarg, "fanout") == 0 ? FANOUT :
				    strcmp(optarg, "pairs") == 0 ? PAIRS : (usage(), PAIRS);
			break;
		case 'P': opt.npub = atoi(optarg); break;
		case 'S': opt.nsub = atoi(optarg); break;
		case 'q': opt.qos = atoi(optarg); break;
		case 's': opt.size = atoi(optarg); break;
		case 'n': opt.count = atol(optarg); break;
		case 'd': opt.duration = atof(optarg); break;
		case 'r': opt.rate = atof(optarg); break;
		case 'w': opt.window = atoi(optarg); break;
		case 'W': opt.nworkers = atoi(optarg); break;
		case 'V': opt.version = atoi(optarg) == 5 ? MQTT_PROTOCOL_V5 : MQTT_PROTOCOL_V311; break;
		case 'b': opt.broker_pid = atoi(optarg); break;
		case 'I': opt.idle = atoi(optarg); break;
		case 'C': opt.storm = optarg; break;
		case 'x': opt.warmup = atof(optarg); break;
		default: usage();
		}
	}
	if (opt.shape == FANOUT)
		opt.npub = 1;
	if (opt.shape == PAIRS)
		opt.nsub = opt.npub;
	if (opt.size < 64 || opt.size > 1 << 16)
		die("payload size must be between 64 and 65536 bytes");
	if (opt.qos < 0 || opt.qos > 2 || opt.npub < 1 || opt.nsub < 1 || opt.window < 1 ||
	    opt.nworkers < 1 || opt.nworkers > MAX_WORKERS || opt.port < 1)
		usage();
	if (!opt.idle && !opt.storm && !opt.count && opt.duration <= 0)
		die("give a message count (-n) or a duration (-d)");
	if (opt.storm && opt.duration <= 0)
		die("a storm needs a duration (-d)");
	snprintf(opt.prefix, sizeof opt.prefix, "lg%d", (int)getpid());
	raise_fd_limit();
	mosquitto_lib_init();
	int rc = opt.storm ? run_storm() : opt.idle ? run_idle() : run_traffic();
	mosquitto_lib_cleanup();
	return rc;
}
