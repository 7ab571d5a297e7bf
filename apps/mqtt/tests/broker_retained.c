/*
 * Tests of the weft-mqtt broker as a program: the retained backlog of a SUBSCRIBE
 * [MQTT-3.3.1-6]. Tens of thousands of retained messages go to a subscriber that reads
 * slowly, acknowledges late, unsubscribes, leaves, comes back, subscribes again, or never
 * reads: each time every message comes once (or as the protocol says, again with DUP), in
 * order with the live messages of its topic, and the broker exits clean.
 * broker_harness.h starts and stops the broker; broker.c has the tests of bad input,
 * sessions and memory.
 */
#include <limits.h>
#include <stdbool.h>
#include <stdlib.h>

#include "broker_harness.h"


/* Retain rt/0 .. rt/(n-1) at qos, each with its number as payload; all are retained once the
 * PUBACK of a later PUBLISH has come (a connection's packets are handled in order). */
static void retain_many(int n, int qos)
{
	int p = client(4, "retainer", 60);
	size_t cap = 1 << 16, len = 0;
	uint8_t *buf = malloc(cap), b[64];
	CHECK(buf);
	for (int i = 0; i <= n; i++) {
		char t[24], v[16];
		snprintf(t, sizeof t, i < n ? "rt/%d" : "sync", i);
		snprintf(v, sizeof v, "%d", i);
		mq_pub_enc e = { 4, i < n ? qos : 1, 0, i < n, (uint16_t)(i % 60000 + 1), t,
				 (uint16_t)strlen(t), NULL, 0, v, (uint32_t)strlen(v), NULL, 0 };
		if (len + 64 > cap) {
			put(p, buf, len);
			len = 0;
		}
		len += mq_enc_publish(buf + len, &e);
	}
	put(p, buf, len);
	free(buf);
	uint16_t last = (uint16_t)(n % 60000 + 1);
	for (;;) { /* PUBACKs, up to the one of "sync" */
		CHECK_EQ(next(p, b, sizeof b), 4);
		CHECK_EQ(b[0], 0x40);
		if ((b[2] << 8 | b[3]) == last)
			break;
	}
	close(p);
}

/* A client with a receive buffer of 4 KB, so that the broker meets a full socket. */
static int small_client(const char *id, int clean, int *present)
{
	int s = dial_rcvbuf(4096);
	CHECK(s >= 0);
	uint8_t b[64];
	put(s, b, mq_enc_connect(b, &(mq_connect_enc){
			.version = 4, .client_id = id, .clean = clean, .keep_alive = 60 }));
	CHECK_EQ(next(s, b, sizeof b), 4);
	CHECK_EQ(b[0], 0x20);
	CHECK_EQ(b[3], 0);
	if (present)
		*present = b[2] & 1;
	return s;
}

/* What a subscriber to rt/# got: how many times each rt/<i>. */
typedef struct seen {
	int n, distinct, dups, pubs, qos1;
	int v; /* the subscriber's protocol level: 0 is 4 */
	uint8_t *count;
	uint16_t pending[64]; /* QoS 1 packet ids not acknowledged (when acks are held) */
	int npending;
} seen;

/* Read from s until `until` distinct messages were seen, `pubs` PUBLISHes came, or the socket
 * is silent for 5 s. Each retained PUBLISH of rt/<i> (retain flag set, its number as
 * payload) is counted; QoS 1 is acknowledged at once unless `hold`. Slow at first when `slow`. */
static void take(int s, seen *w, int until, int pubs, bool hold, bool slow)
{
	uint8_t b[256];
	mq_packet pk;
	while (w->distinct < until && w->pubs < pubs) {
		int n = next(s, b, sizeof b);
		if (n <= 0)
			return;
		CHECK_EQ(mq_decode(b, (size_t)n, w->v ? w->v : 4, &pk), 0);
		CHECK_EQ(pk.type, MQ_PUBLISH);
		CHECK(pk.publish.retain);
		w->qos1 += pk.publish.qos == 1;
		char v[16];
		CHECK(pk.publish.payload.len < sizeof v);
		memcpy(v, pk.publish.payload.p, pk.publish.payload.len);
		v[pk.publish.payload.len] = 0;
		int i = atoi(v);
		CHECK(i >= 0 && i < w->n);
		if (w->count[i]++)
			w->dups++;
		else
			w->distinct++;
		w->pubs++;
		if (pk.publish.qos && hold) {
			CHECK(w->npending < 64);
			w->pending[w->npending++] = pk.packet_id;
		} else if (pk.publish.qos) {
			put(s, b, mq_enc_ack(b, 4, MQ_PUBACK, pk.packet_id, 0, NULL));
		}
		if (slow && w->pubs < 2000 && w->pubs % 100 == 0)
			usleep(2000); /* a slow start: the broker's writes meet a full socket */
	}
}

static void ack_pending(int s, seen *w)
{
	uint8_t b[8];
	for (int i = 0; i < w->npending; i++)
		put(s, b, mq_enc_ack(b, 4, MQ_PUBACK, w->pending[i], 0, NULL));
	w->npending = 0;
}

/* Nothing more comes: a PINGREQ is answered by the next packet. */
static void nothing_more(int s)
{
	uint8_t b[256];
	put(s, b, mq_enc_simple(b, MQ_PINGREQ));
	CHECK(next(s, b, sizeof b) > 0);
	CHECK_EQ(b[0], 0xd0);
}

TEST(retained_backlog_qos0_sent_whole_to_a_slow_reader)
{
	test_skip_emulated();
	start(NULL);
	int n = 100000;
	retain_many(n, 0);
	int s = small_client("rt-slow", 1, NULL);
	subscribe(s, 4, "rt/#", 0);
	seen w = { .n = n, .count = calloc((size_t)n, 1) };
	take(s, &w, n, INT_MAX, false, true);
	CHECK_EQ(w.distinct, n);
	CHECK_EQ(w.dups, 0);
	nothing_more(s);
	close(s);
	free(w.count);
	others_fine();
	CHECK_EQ(stop(), 0);
}

/* 5,000 retained QoS 1 messages to a subscriber acknowledging each as it comes; with
 * persistence, to a persistent session (each delivery stored as it is sent). */
static void qos1_backlog(bool persist)
{
	char conf[PATH_MAX + 64];
	snprintf(conf, sizeof conf, "persistence true\npersistence_location %s\n", test_tmpdir());
	start(persist ? conf : NULL);
	int n = 5000;
	retain_many(n, 1);
	int s = persist ? small_client("rt-q1", 0, NULL) : client(4, "rt-q1", 60);
	subscribe(s, 4, "rt/#", 1);
	seen w = { .n = n, .count = calloc((size_t)n, 1) };
	take(s, &w, n, INT_MAX, false, false);
	CHECK_EQ(w.distinct, n);
	CHECK_EQ(w.dups, 0);
	nothing_more(s);
	close(s);
	free(w.count);
	others_fine();
	CHECK_EQ(stop(), 0);
}

TEST(retained_backlog_qos1_sent_whole_as_acknowledged)
{
	test_skip_emulated();
	qos1_backlog(false);
}

TEST(retained_backlog_qos1_sent_whole_with_persistence)
{
	test_skip_emulated();
	qos1_backlog(true);
}

/* UNSUBSCRIBE ends the backlog: once the window sent is acknowledged nothing follows. A clean
 * client leaving mid-backlog, and the broker's exit with one pending, leak nothing (ASan). */
TEST(retained_backlog_ends_at_unsubscribe_or_disconnect)
{
	test_skip_emulated();
	start(NULL);
	int n = 5000;
	retain_many(n, 1);
	int s = client(4, "rt-unsub", 60);
	subscribe(s, 4, "rt/#", 1);
	seen w = { .n = n, .count = calloc((size_t)n, 1) };
	take(s, &w, n, 20, true, false); /* the inflight window, not acknowledged */
	CHECK_EQ(w.pubs, 20);
	puthex(s, "a2 08 0002 0004 72742f23"); /* UNSUBSCRIBE rt/# */
	uint8_t b[64];
	CHECK_EQ(next(s, b, sizeof b), 4);
	CHECK_EQ(b[0], 0xb0);
	ack_pending(s, &w);
	nothing_more(s);
	close(s);
	int gone = client(4, "rt-gone", 60);
	subscribe(gone, 4, "rt/#", 1);
	seen g = { .n = n, .count = calloc((size_t)n, 1) };
	take(gone, &g, n, 10, false, false);
	CHECK_EQ(g.pubs, 10);
	close(gone);
	int stays = client(4, "rt-stays", 60); /* its window unacknowledged at the broker's exit */
	subscribe(stays, 4, "rt/#", 1);
	others_fine();
	CHECK_EQ(stop(), 0);
	close(stays);
	free(w.count);
	free(g.count);
}

/* A persistent session that goes offline mid-backlog gets the rest when it comes back: the
 * window resent, then what was not sent yet. */
TEST(retained_backlog_resumes_when_a_persistent_session_returns)
{
	test_skip_emulated();
	start(NULL);
	int n = 5000, present = 0;
	retain_many(n, 1);
	int s = small_client("rt-keep", 0, &present);
	CHECK_EQ(present, 0);
	subscribe(s, 4, "rt/#", 1);
	seen w = { .n = n, .count = calloc((size_t)n, 1) };
	take(s, &w, n, 20, true, false);
	CHECK_EQ(w.pubs, 20);
	close(s);
	s = small_client("rt-keep", 0, &present);
	CHECK_EQ(present, 1);
	w.npending = 0;
	take(s, &w, n, INT_MAX, false, false);
	CHECK_EQ(w.distinct, n);
	CHECK_EQ(w.dups, 20); /* the window, resent with DUP */
	nothing_more(s);
	close(s);
	free(w.count);
	CHECK_EQ(stop(), 0);
}

/* A second SUBSCRIBE to the filter (retain handling 0) starts its retained messages over:
 * what was sent of the first backlog, then all of them. */
TEST(retained_backlog_restarts_on_a_second_subscribe)
{
	test_skip_emulated();
	start(NULL);
	int n = 5000;
	retain_many(n, 1);
	int s = client(4, "rt-again", 60);
	subscribe(s, 4, "rt/#", 1);
	seen w = { .n = n, .count = calloc((size_t)n, 1) };
	take(s, &w, n, 20, true, false);
	subscribe(s, 4, "rt/#", 1);
	ack_pending(s, &w);
	take(s, &w, n, n + 20, false, false);
	CHECK_EQ(w.distinct, n);
	CHECK_EQ(w.pubs, n + 20);
	nothing_more(s);
	close(s);
	free(w.count);
	CHECK_EQ(stop(), 0);
}

/* A second SUBSCRIBE that sends no retained messages (5.0 retain handling 2) lets the pending
 * backlog go on, at the new subscription's QoS: nothing is sent twice. */
TEST(retained_backlog_goes_on_under_a_subscribe_without_retained)
{
	test_skip_emulated();
	start(NULL);
	int n = 5000;
	retain_many(n, 1);
	int s = client(5, "rt-rh2", 60);
	subscribe(s, 5, "rt/#", 1);
	seen w = { .n = n, .v = 5, .count = calloc((size_t)n, 1) };
	take(s, &w, n, 20, true, false);
	CHECK_EQ(w.qos1, 20);
	subscribe(s, 5, "rt/#", 0 | 2 << 4); /* QoS 0 now, retain handling 2 */
	ack_pending(s, &w);
	take(s, &w, n, INT_MAX, false, false);
	CHECK_EQ(w.distinct, n);
	CHECK_EQ(w.dups, 0);
	CHECK_EQ(w.qos1, 20); /* the rest at QoS 0 */
	nothing_more(s);
	close(s);
	free(w.count);
	CHECK_EQ(stop(), 0);
}

/* Live messages to a client with a backlog pending: on each topic the retained message (older)
 * comes before the live one, and every one of both comes. */
TEST(retained_backlog_not_overtaken_by_live_messages_on_a_topic)
{
	test_skip_emulated();
	start(NULL);
	int n = 100000, live = 200;
	retain_many(n, 0);
	int s = small_client("rt-order", 1, NULL);
	subscribe(s, 4, "rt/#", 0);
	int pub = client(4, "rt-live", 60);
	for (int i = 0; i < live; i++) {
		char t[24];
		snprintf(t, sizeof t, "rt/%d", i * (n / live));
		publish(pub, 4, t, "live", 0, 0);
	}
	uint8_t *count = calloc((size_t)n, 1), b[256];
	int retained = 0, lives = 0;
	mq_packet pk;
	while (retained < n || lives < live) {
		int k = next(s, b, sizeof b);
		CHECK(k > 0);
		CHECK_EQ(mq_decode(b, (size_t)k, 4, &pk), 0);
		CHECK_EQ(pk.type, MQ_PUBLISH);
		char t[24];
		CHECK(pk.publish.topic.len < sizeof t);
		memcpy(t, pk.publish.topic.p, pk.publish.topic.len);
		t[pk.publish.topic.len] = 0;
		int i = atoi(t + 3);
		CHECK(i >= 0 && i < n);
		if (pk.publish.retain) {
			CHECK_EQ(count[i], 0); /* once, and before the live one */
			count[i] = 1;
			retained++;
		} else {
			CHECK_EQ(count[i], 1);
			count[i] = 2;
			lives++;
		}
	}
	nothing_more(s);
	close(s);
	close(pub);
	free(count);
	CHECK_EQ(stop(), 0);
}

/* A client that never reads, with a retained backlog pending (QoS 0): the socket pushes back,
 * its keep-alive still ends it (writer and all), and the broker exits clean (ASan: no leak). */
TEST(retained_backlog_to_a_client_that_never_reads_ends_at_its_keep_alive)
{
	test_skip_emulated();
	start("sys_interval 1\n");
	retain_many(100000, 0);
	int dead = dial_rcvbuf(4096);
	uint8_t b[256];
	put(dead, b, mq_enc_connect(b, &(mq_connect_enc){
			.version = 4, .client_id = "rt-dead", .clean = 1, .keep_alive = 1 }));
	CHECK_EQ(next(dead, b, sizeof b), 4);
	subscribe(dead, 4, "rt/#", 0);
	int watch = client(4, "rt-watch", 60);
	subscribe(watch, 4, "$SYS/broker/clients/connected", 0);
	await_watcher_alone(watch, b, sizeof b);
	close(watch);
	close(dead);
	others_fine();
	CHECK_EQ(stop(), 0);
}
