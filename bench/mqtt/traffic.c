/*
 * traffic.c - the traffic modes (fan-in, pairs, fan-out; window or fixed rate): the
 * callbacks, the connections, the worker threads that drive them and the run's phases (connect,
 * warm up, measure, drain, report). The design is in loadgen.c.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "loadgen.h"

static int64_t t_start;

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
	c->m = mosquitto_new(id, !opt.persistent, c);
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
	int rc;
	if (opt.persistent && opt.version == MQTT_PROTOCOL_V5) {
		/* 5.0: the session outlives the connection by its expiry interval (an hour). Only
		 * the blocking connect takes CONNECT properties; to 127.0.0.1 it does not wait. */
		mosquitto_property *props = NULL;
		mosquitto_property_add_int32(&props, MQTT_PROP_SESSION_EXPIRY_INTERVAL, 3600);
		rc = mosquitto_connect_bind_v5(c->m, opt.host, opt.port, opt.keepalive, NULL, props);
		mosquitto_property_free_all(&props);
		int fd = mosquitto_socket(c->m); /* left blocking: the workers need it not to */
		if (rc == MOSQ_ERR_SUCCESS && fd >= 0)
			fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	} else {
		rc = mosquitto_connect_async(c->m, opt.host, opt.port, opt.keepalive);
	}
	if (rc != MOSQ_ERR_SUCCESS) {
		fprintf(stderr, "mqtt-loadgen: connect %s:%d: %s\n", opt.host, opt.port,
			rc == MOSQ_ERR_ERRNO ? strerror(errno) : mosquitto_strerror(rc));
		exit(2);
	}
}

/* Read until the socket would block (libmosquitto reads one packet per call); returns false
 * when the connection is lost. Stops after 4096 packets to let the others in. errno is how
 * libmosquitto says "would block", but a write it makes while handling a packet (PUBACK,
 * PUBREC, ...) can leave EAGAIN there too with bytes still in the buffer: so whatever the
 * reason for stopping, c->pending says whether the buffer still holds bytes. */
bool conn_read(struct conn *c)
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

int count_where(struct conn *cs, int n, int what)
{
	int k = 0;
	for (int i = 0; i < n; i++)
		k += what == 0 ? LOAD(cs[i].connected) : what == 1 ? LOAD(cs[i].subscribed) : LOAD(cs[i].failed);
	return k;
}

void wait_ready(void)
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

void connect_all(void)
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

void stop_workers(void)
{
	atomic_store(&stop_all, true);
	for (int i = 0; i < opt.nworkers; i++)
		pthread_join(workers[i].th, NULL);
}

int run_traffic(void)
{
	rbuf_init();
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
