/*
 * Tests of the weft-mqtt broker as a program: bad input, sessions, and memory. Bad input is
 * the focus: the offending client is disconnected with the right reason code, and another
 * client goes on unaffected. Then a slow consumer that must not hold up the others, a session
 * resumed as it ends, and the memory a load gives back when it leaves.
 * broker_harness.h starts and stops the broker; broker_retained.c has the tests of the
 * retained backlog of a SUBSCRIBE.
 */
#include "broker_harness.h"

TEST(malformed_packet_disconnects_with_0x81)
{
	test_skip_emulated();
	start(NULL);
	int s = client(5, "bad", 60);
	puthex(s, "82 06 0001 0001 62 03"); /* SUBSCRIBE at QoS 3 */
	expect_disconnect(s, MQ_RC_MALFORMED);
	close(s);
	others_fine();
	CHECK_EQ(stop(), 0);
}

TEST(protocol_error_second_connect)
{
	test_skip_emulated();
	start(NULL);
	int s = client(5, "twice", 60);
	uint8_t b[64];
	put(s, b, mq_enc_connect(b, &(mq_connect_enc){
			.version = 5, .client_id = "twice", .clean = 1, .keep_alive = 60 }));
	expect_disconnect(s, MQ_RC_PROTOCOL_ERROR);
	close(s);
	others_fine();
	CHECK_EQ(stop(), 0);
}

TEST(oversized_packet_disconnects_with_0x95)
{
	test_skip_emulated();
	start("message_size_limit 100\n");
	int s = client(5, "big", 60);
	/* a PUBLISH announcing 1 MB: refused from its header alone */
	puthex(s, "30 80 80 40 0001 61");
	expect_disconnect(s, MQ_RC_PACKET_TOO_LARGE);
	close(s);
	/* under the packet limit but over message_size_limit: dropped, QoS 1 answered 0x97 */
	int t = client(5, "big2", 60);
	char payload[201];
	memset(payload, 'x', 200);
	payload[200] = 0;
	publish(t, 5, "a", payload, 1, 7);
	uint8_t b[64];
	CHECK(next(t, b, sizeof b) >= 5);
	CHECK_EQ(b[0], 0x40);
	CHECK_EQ(b[4], MQ_RC_QUOTA_EXCEEDED);
	close(t);
	others_fine();
	CHECK_EQ(stop(), 0);
}

TEST(half_packet_then_silence)
{
	test_skip_emulated();
	start(NULL);
	int s = client(5, "half", 1); /* keep-alive 1 s: cut after 1.5 s */
	puthex(s, "30 20 0003 612f62"); /* 7 of 34 bytes */
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	expect_disconnect(s, MQ_RC_KEEP_ALIVE_TIMEOUT);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double dt = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
	CHECK(dt > 1.2 && dt < 4);
	close(s);
	others_fine();
	CHECK_EQ(stop(), 0);
}

TEST(garbage_before_connect)
{
	test_skip_emulated();
	start(NULL);
	int s = dial();
	puthex(s, "ff ff ff ff ff ff");
	uint8_t b[64];
	CHECK_EQ(next(s, b, sizeof b), -1); /* closed without a word */
	close(s);
	/* a PUBLISH before CONNECT: closed */
	s = dial();
	puthex(s, "30 05 0001 61 6869");
	CHECK_EQ(next(s, b, sizeof b), -1);
	close(s);
	others_fine();
	CHECK_EQ(stop(), 0);
}

TEST(connack_reason_codes)
{
	test_skip_emulated();
	start(NULL);
	uint8_t b[64];
	/* protocol level 6: 3.1.1 CONNACK 1 (unacceptable protocol version) */
	int s = dial();
	puthex(s, "10 0e 0004 4d515454 06 02 003c 0002 6331");
	CHECK_EQ(next(s, b, sizeof b), 4);
	CHECK_EQ(b[3], MQ_V3_BAD_VERSION);
	close(s);
	/* 3.1.1, empty client id without clean session: 2 (identifier rejected) */
	s = dial();
	puthex(s, "10 0c 0004 4d515454 04 00 003c 0000");
	CHECK_EQ(next(s, b, sizeof b), 4);
	CHECK_EQ(b[3], MQ_V3_ID_REJECTED);
	close(s);
	/* 5.0 with an authentication method: 0x8C (bad authentication method) */
	s = dial();
	puthex(s, "10 14 0004 4d515454 05 02 003c 05 15 0002 7878 0002 6331");
	CHECK(next(s, b, sizeof b) >= 5);
	CHECK_EQ(b[3], MQ_RC_BAD_AUTH_METHOD);
	close(s);
	/* 5.0 with a malformed property: CONNACK 0x81 */
	s = dial();
	puthex(s, "10 11 0004 4d515454 05 02 001e 02 7f 00 0002 6331");
	CHECK(next(s, b, sizeof b) >= 5);
	CHECK_EQ(b[3], MQ_RC_MALFORMED);
	close(s);
	/* 5.0, empty client id: assigned */
	s = dial();
	puthex(s, "10 0d 0004 4d515454 05 02 003c 00 0000");
	int n = next(s, b, sizeof b);
	mq_packet pk;
	CHECK_EQ(mq_decode(b, (size_t)n, 5, &pk), 0);
	CHECK_EQ(pk.reason, 0);
	CHECK(pk.props.assigned_client_id.len > 0);
	close(s);
	CHECK_EQ(stop(), 0);
}

TEST(anonymous_refused_when_configured)
{
	test_skip_emulated();
	start("allow_anonymous false\n");
	int s = dial();
	uint8_t b[64];
	put(s, b, mq_enc_connect(b, &(mq_connect_enc){
			.version = 5, .client_id = "anon", .clean = 1, .keep_alive = 60 }));
	CHECK(next(s, b, sizeof b) >= 4);
	CHECK_EQ(b[3], MQ_RC_NOT_AUTHORIZED);
	close(s);
	CHECK_EQ(stop(), 0);
}

TEST(topic_alias_out_of_range)
{
	test_skip_emulated();
	start(NULL);
	int s = client(5, "alias", 60);
	puthex(s, "30 08 0001 61 03 23 00 0b 78"); /* alias 11 > the 10 we allow */
	expect_disconnect(s, MQ_RC_TOPIC_ALIAS_INVALID);
	close(s);
	s = client(5, "alias2", 60);
	puthex(s, "30 07 0000 03 23 00 02 78"); /* alias 2 never set */
	expect_disconnect(s, MQ_RC_PROTOCOL_ERROR);
	close(s);
	others_fine();
	CHECK_EQ(stop(), 0);
}

/* A topic alias the broker picks adds 3 bytes to the PUBLISH: when they would take it over the
 * client's maximum packet size, it goes without the alias (and none is spent), never over. */
TEST(topic_alias_never_takes_a_publish_over_the_maximum_packet_size)
{
	test_skip_emulated();
	start(NULL);
	int sub = dial();
	CHECK(sub >= 0);
	uint8_t pbuf[16], b[256];
	mq_pb pb = { pbuf, 0, sizeof pbuf, 0 };
	mq_pb_u32(&pb, MQ_P_MAX_PACKET_SIZE, 28);
	mq_pb_u16(&pb, MQ_P_TOPIC_ALIAS_MAX, 5);
	put(sub, b, mq_enc_connect(b, &(mq_connect_enc){ .version = 5, .client_id = "maxpk",
			.clean = 1, .keep_alive = 60, .props = &pb }));
	CHECK(next(sub, b, sizeof b) >= 4);
	CHECK_EQ(b[3], 0);
	subscribe(sub, 5, "a/t", 0);
	int pub = client(5, "maxpk-pub", 60);
	mq_packet pk;
	/* 20 bytes of payload: 28 bytes without an alias, 31 with a new one */
	publish(pub, 5, "a/t", "01234567890123456789", 0, 0);
	int n = next(sub, b, sizeof b);
	CHECK(n > 0 && n <= 28);
	CHECK_EQ(mq_decode(b, (size_t)n, 5, &pk), 0);
	CHECK_EQ(pk.type, MQ_PUBLISH);
	CHECK(pk.publish.topic.len == 3 && !memcmp(pk.publish.topic.p, "a/t", 3));
	CHECK_EQ(pk.props.topic_alias, 0);
	CHECK_EQ(pk.publish.payload.len, 20);
	/* a shorter one fits with the alias, which is then the first: nothing was spent */
	publish(pub, 5, "a/t", "short", 0, 0);
	n = next(sub, b, sizeof b);
	CHECK(n > 0 && n <= 28);
	CHECK_EQ(mq_decode(b, (size_t)n, 5, &pk), 0);
	CHECK(pk.publish.topic.len == 3 && !memcmp(pk.publish.topic.p, "a/t", 3));
	CHECK_EQ(pk.props.topic_alias, 1);
	/* and the next one on the topic carries the alias alone */
	publish(pub, 5, "a/t", "again", 0, 0);
	n = next(sub, b, sizeof b);
	CHECK(n > 0 && n <= 28);
	CHECK_EQ(mq_decode(b, (size_t)n, 5, &pk), 0);
	CHECK_EQ(pk.publish.topic.len, 0);
	CHECK_EQ(pk.props.topic_alias, 1);
	CHECK(pk.publish.payload.len == 5 && !memcmp(pk.publish.payload.p, "again", 5));
	close(sub);
	close(pub);
	CHECK_EQ(stop(), 0);
}

/* Two CONNECTs with one client id at once, while a third connection holds the session: each
 * takes over in turn, so both are accepted at once and the later one keeps the session (a
 * loser used to wait for the first winner to go, up to its 5 s, and be refused). */
TEST(two_takeovers_at_once_both_connect_and_the_later_wins)
{
	test_skip_emulated();
	start(NULL);
	for (int round = 0; round < 5; round++) {
		int hold = client(4, "race", 60), a = dial(), b = dial();
		CHECK(a >= 0 && b >= 0);
		uint8_t buf[64];
		size_t n = mq_enc_connect(buf, &(mq_connect_enc){ .version = 4, .client_id = "race",
				.clean = 1, .keep_alive = 60 });
		put(a, buf, n);
		put(b, buf, n);
		/* within the sockets' 5 s read timeout, both accepted */
		CHECK_EQ(next(a, buf, sizeof buf), 4);
		CHECK(buf[0] == 0x20 && buf[3] == 0);
		CHECK_EQ(next(b, buf, sizeof buf), 4);
		CHECK(buf[0] == 0x20 && buf[3] == 0);
		CHECK_EQ(next(hold, buf, sizeof buf), -1);
		/* one of them was taken over by the other: only the other answers a PINGREQ */
		int answered = 0;
		puthex(a, "c0 00");
		puthex(b, "c0 00");
		answered += next(a, buf, sizeof buf) == 2 && buf[0] == 0xd0;
		answered += next(b, buf, sizeof buf) == 2 && buf[0] == 0xd0;
		CHECK_EQ(answered, 1);
		close(hold);
		close(a);
		close(b);
	}
	others_fine();
	CHECK_EQ(stop(), 0);
}

TEST(qos2_resend_delivered_once)
{
	test_skip_emulated();
	start(NULL);
	int sub = client(4, "q2sub", 60), pub = client(4, "q2pub", 60);
	subscribe(sub, 4, "q2", 0);
	uint8_t b[64];
	publish(pub, 4, "q2", "once", 2, 9);
	CHECK_EQ(next(pub, b, sizeof b), 4);
	CHECK_EQ(b[0], 0x50); /* PUBREC */
	publish(pub, 4, "q2", "once", 2, 9); /* the same id again, before PUBREL */
	CHECK_EQ(next(pub, b, sizeof b), 4);
	CHECK_EQ(b[0], 0x50);
	puthex(pub, "62 02 0009"); /* PUBREL */
	CHECK_EQ(next(pub, b, sizeof b), 4);
	CHECK_EQ(b[0], 0x70); /* PUBCOMP */
	publish(pub, 4, "q2", "after", 0, 0);
	expect_pub(sub, 4, "once");
	expect_pub(sub, 4, "after"); /* not a second "once" */
	close(sub);
	close(pub);
	CHECK_EQ(stop(), 0);
}

TEST(sigterm_tells_v5_clients)
{
	test_skip_emulated();
	start(NULL);
	int s = client(5, "bye", 60);
	int t = client(4, "bye3", 60);
	kill(broker_pid, SIGTERM);
	expect_disconnect(s, MQ_RC_SERVER_SHUTTING_DOWN);
	uint8_t b[8];
	CHECK_EQ(next(t, b, sizeof b), -1);
	close(s);
	close(t);
	CHECK_EQ(stop(), 0);
}

TEST(config_errors_name_the_line)
{
	test_skip_emulated();
	char bin[PATH_MAX], cmd[PATH_MAX + 256], err[512];
	broker_path(bin, sizeof bin);
	const char *f = "/tmp/weft-mqtt-badconf.conf";
	FILE *o = fopen(f, "w");
	CHECK(o);
	fprintf(o, "# comment\nmax_queued_messages 10\nno_such_option 1\n");
	fclose(o);
	snprintf(cmd, sizeof cmd, "%s -c %s", bin, f);
	CHECK(test_spawn(cmd, err, sizeof err) != 0);
	CHECK(strstr(err, "weft-mqtt-badconf.conf:3: unknown option 'no_such_option'"));
	o = fopen(f, "w");
	fprintf(o, "max_inflight_messages lots\n");
	fclose(o);
	CHECK(test_spawn(cmd, err, sizeof err) != 0);
	CHECK(strstr(err, ":1: max_inflight_messages needs a number"));
	const char *rates[] = { "max_connection_rate", "max_connection_rate -1",
				"max_connection_rate 5/0", "max_connection_rate 5/", "max_connection_rate x",
				"max_connection_rate 2/3x", "max_queued_bytes -5",
				"max_publish_rate", "max_publish_rate fast", "max_publish_rate 10/0",
				"max_publish_rate 1e-11/1", "max_connection_rate 0.00009",
				"max_publish_rate 0.0001/1000000" };
	for (size_t i = 0; i < sizeof rates / sizeof *rates; i++) {
		o = fopen(f, "w");
		fprintf(o, "%s\n", rates[i]);
		fclose(o);
		CHECK(test_spawn(cmd, err, sizeof err) != 0);
		CHECK(strstr(err, ":1: max_"));
	}
	unlink(f);
	snprintf(cmd, sizeof cmd, "%s --help", bin);
	CHECK_EQ(test_spawn(cmd, err, sizeof err), 0);
}

/* A subscriber that reads nothing: QoS 0 to it is dropped once its buffer is full, and the
 * publisher and a healthy subscriber carry on; its keep-alive still ends it, writer and all. */
TEST(slow_consumer_does_not_block_others)
{
	test_skip_emulated();
	start("sys_interval 1\n");
	int slow = dial();
	int small = 4096;
	setsockopt(slow, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
	uint8_t b[2048];
	put(slow, b, mq_enc_connect(b, &(mq_connect_enc){
			.version = 5, .client_id = "slow", .clean = 1, .keep_alive = 1 }));
	CHECK(next(slow, b, sizeof b) > 0);
	subscribe(slow, 5, "flood", 0);
	int fast = client(4, "fast", 60), pub = client(4, "flooder", 60);
	subscribe(fast, 4, "flood", 0);
	char payload[1001];
	memset(payload, 'p', 1000);
	payload[1000] = 0;
	/* the fast subscriber reads as we go, so only the slow one falls behind */
	int got_last = 0;
	mq_packet pk;
	for (int i = 0; i < 3000; i++) {
		publish(pub, 4, "flood", i == 2999 ? "last" : payload, 0, 0);
		struct pollfd p = { fast, POLLIN, 0 };
		while (poll(&p, 1, 0) > 0) {
			int n = next(fast, b, sizeof b);
			CHECK(n > 0);
			CHECK_EQ(mq_decode(b, (size_t)n, 4, &pk), 0);
			got_last |= pk.publish.payload.len == 4;
		}
	}
	while (!got_last) {
		int n = next(fast, b, sizeof b);
		CHECK(n > 0);
		CHECK_EQ(mq_decode(b, (size_t)n, 4, &pk), 0);
		got_last |= pk.publish.payload.len == 4;
	}
	close(pub);
	close(fast);
	/* the slow one is cut by its keep-alive (1.5 s) although a writer may be stuck on it:
	 * $SYS/broker/clients/connected comes down to 1, the client watching it */
	int watch = client(4, "watch", 60);
	subscribe(watch, 4, "$SYS/broker/clients/connected", 0);
	await_watcher_alone(watch, b, sizeof b);
	close(watch);
	close(slow);
	others_fine();
	CHECK_EQ(stop(), 0);
}

/* A session that ends with its connection (expiry 0) is gone once that connection goes, also
 * for a client that takes its id at that moment without clean start: it gets a new session
 * (not "present"), and what it subscribes to is delivered. The broker holds the old
 * connection's session between letting go of it and ending it (WEFT_MQTT_DETACH_DELAY_MS),
 * as a busy machine may by chance. A newcomer that resumed the session in that window would
 * see it end under it: nothing would reach it, and its subscriptions would stay in the tree
 * after the session was freed. Once with the old socket closed first (as the Paho
 * interoperability suite's client does before it connects again), once left open (taken
 * over: DISCONNECT 0x8E). */
TEST(resume_meets_ending_session)
{
	test_skip_emulated();
	setenv("WEFT_MQTT_DETACH_DELAY_MS", "500", 1);
	start(NULL);
	unsetenv("WEFT_MQTT_DETACH_DELAY_MS");
	int pub = client(5, "ending-pub", 60);
	for (int open = 0; open < 2; open++) {
		int present;
		int old = client_resume("ending", 0, &present);
		if (!open)
			close(old);
		int s = client_resume("ending", 99999, &present);
		CHECK_EQ(present, 0);
		if (open) {
			expect_disconnect(old, MQ_RC_SESSION_TAKEN_OVER);
			close(old);
		}
		subscribe(s, 5, "ending/t", 1);
		/* and still is when the old session's end has come: for three times the window */
		struct timespec t0, t;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		for (int i = 0;; i++) {
			clock_gettime(CLOCK_MONOTONIC, &t);
			if ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 > 1500)
				break;
			char m[32];
			snprintf(m, sizeof m, "%s %d", open ? "taken over" : "closed first", i);
			publish(pub, 5, "ending/t", m, 0, 0);
			expect_pub(s, 5, m);
			usleep(20000); /* pace: a few dozen messages over the span */
		}
		close(s);
	}
	close(pub);
	others_fine();
	CHECK_EQ(stop(), 0);
}

/* ---- memory given back ------------------------------------------------------------------- */

/* n clients connect, each subscribes to nsub filters (the same ones for all, or its own),
 * and the broker's RSS is taken; then they all say goodbye. Returns that RSS in KB. */
static long crowd(int n, int nsub, bool own, const char *tag)
{
	int *fd = calloc((size_t)n, sizeof *fd);
	CHECK(fd);
	char id[64], f[64];
	uint8_t b[256];
	for (int i = 0; i < n; i++) {
		snprintf(id, sizeof id, "%s-%d", tag, i);
		fd[i] = client(4, id, 600);
		for (int k = 0; k < nsub; k++) {
			if (own)
				snprintf(f, sizeof f, "mem/%s/%d/%d", tag, i, k);
			else
				snprintf(f, sizeof f, "mem/shared/%d", k);
			put(fd[i], b, mq_enc_subscribe(b, 4, (uint16_t)(k + 1), f, 1, NULL));
		}
		for (int k = 0; k < nsub; k++) {
			CHECK(next(fd[i], b, sizeof b) > 0);
			CHECK_EQ(b[0], 0x90);
		}
	}
	long kb = test_rss_kb(broker_pid);
	for (int i = 0; i < n; i++) {
		put(fd[i], b, mq_enc_disconnect(b, 4, 0, NULL));
		close(fd[i]);
	}
	free(fd);
	return kb;
}

/* One client sets n retained messages (payload 64 bytes), or clears them (empty payload);
 * the PINGRESP after them says the broker has handled them all. */
static void retain_all(int s, int n, bool set)
{
	char topic[64], payload[65];
	memset(payload, 'r', 64);
	payload[set ? 64 : 0] = 0;
	static uint8_t b[65536];
	size_t len = 0;
	for (int i = 0; i < n; i++) {
		snprintf(topic, sizeof topic, "mem/retained/%d/%d", i / 1000, i);
		mq_pub_enc e = { 4, 0, 0, 1, 0, topic, (uint16_t)strlen(topic), NULL, 0, payload,
				 (uint32_t)strlen(payload), NULL, 0 };
		len += mq_enc_publish(b + len, &e);
		if (len > sizeof b - 256 || i == n - 1) {
			put(s, b, len);
			len = 0;
		}
	}
	put(s, b, mq_enc_simple(b, MQ_PINGREQ));
	CHECK(next(s, b, sizeof b) == 2);
	CHECK_EQ(b[0], 0xd0);
}

/* Wait (10 s at most, polling) for the broker's RSS to come within bound_kb of base_kb once
 * a load has left: the connections end, the reaper frees and trims, asynchronously. */
static void comes_back(const char *what, long base_kb, long peak_kb, long bound_kb)
{
	long kb = test_rss_kb(broker_pid);
	for (int i = 0; !SLOW && i < 100 && kb > base_kb + bound_kb; i++) {
		usleep(100000);
		kb = test_rss_kb(broker_pid);
	}
	fprintf(stderr, "%s: RSS %.1f MB at start, %.1f MB loaded, %.1f MB after\n", what,
		base_kb / 1024.0, peak_kb / 1024.0, kb / 1024.0);
	if (!SLOW)
		CHECK(kb <= base_kb + bound_kb);
}

/* The loads of a broker that runs for months: crowds of clients that come and go, a tree of
 * topics that grows and empties, retained messages set and cleared. Each time the RSS comes
 * back within 16 MB of what it was at start: up to 12 MB of that is the stack slots weft keeps
 * warm for the next tasks (two magazines of 512 per worker, the depot's warm one and a partial
 * one: 3,071 slots of 4 KB on two workers, src/stack.c), 4 MB what malloc holds free before the
 * broker trims it (pool.c). 4,000 connected clients must cost less than 16 KB each. Under the
 * sanitizers the loads are smaller and RSS means nothing (their allocators, shadow memory): the
 * loads run, the figures are printed, nothing is asserted of them. */
TEST(memory_comes_back_after_load_leaves)
{
	test_skip_emulated();
	start(NULL);
	int n = SLOW ? 400 : 4000, retained = SLOW ? 10000 : 100000;
	long bound = 16 * 1024;
	long base = test_rss_kb(broker_pid);
	char what[64];
	for (int round = 0; round < 2; round++) {
		long peak = crowd(n, 5, false, round ? "crowd2" : "crowd1");
		if (!SLOW)
			CHECK(peak - base < n * 16L);
		snprintf(what, sizeof what, "%d clients x 5 filters%s", n, round ? ", again" : "");
		comes_back(what, base, peak, bound);
	}
	long peak = crowd(n, 10, true, "topics");
	snprintf(what, sizeof what, "%d topics", n * 10);
	comes_back(what, base, peak, bound);
	int s = client(4, "retainer", 600);
	retain_all(s, retained, true);
	peak = test_rss_kb(broker_pid);
	retain_all(s, retained, false);
	put(s, (uint8_t[]){ 0xe0, 0 }, 2);
	close(s);
	snprintf(what, sizeof what, "%d retained messages", retained);
	comes_back(what, base, peak, bound);
	others_fine();
	CHECK_EQ(stop(), 0);
}
