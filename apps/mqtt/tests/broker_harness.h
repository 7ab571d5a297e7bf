/*
 * broker_harness.h - what the tests of the weft-mqtt broker as a program share (broker.c,
 * broker_retained.c): each test starts build/bin/weft-mqtt (the one beside the test binary,
 * built with the same sanitizer) on a free loopback port, talks raw MQTT to it over plain
 * sockets, and stops it with SIGTERM, checking that it exits cleanly (under ASan that includes
 * no leak). Cross builds run under qemu-user ($RUNNER set) cannot start the broker: the tests
 * skip.
 *
 * Each test program is one translation unit that includes this header once: the broker's pid
 * and port are its statics, and the helpers are static inline so that a program that uses
 * only some of them compiles without warnings (as tests/test.h does).
 */
#ifndef WEFT_MQTT_BROKER_HARNESS_H
#define WEFT_MQTT_BROKER_HARNESS_H

#include <arpa/inet.h>
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>

#include "codec.h"
#include "test.h"

static pid_t broker_pid;
static int port;
static char errlog[64];

static inline int dial_rcvbuf(int rcvbuf)
{
	return test_dial(port, rcvbuf, 5);
}

static inline int dial(void)
{
	return test_dial(port, 0, 5);
}

static inline void broker_path(char *out, size_t cap)
{
	char tmp[PATH_MAX];
	snprintf(tmp, sizeof tmp, "%s", test_argv0);
	snprintf(out, cap, "%s/../bin/weft-mqtt", dirname(tmp));
}

/* Start the broker with extra configuration lines (or none: -p PORT). */
static inline void start(const char *conf)
{
	char bin[PATH_MAX], file[64];
	broker_path(bin, sizeof bin);
	port = test_free_port();
	snprintf(errlog, sizeof errlog, "/tmp/weft-mqtt-test-%d.log", (int)getpid());
	snprintf(file, sizeof file, "/tmp/weft-mqtt-test-%d.conf", (int)getpid());
	if (conf) {
		FILE *f = fopen(file, "w");
		CHECK(f);
		fprintf(f, "listener %d 127.0.0.1\n%s", port, conf);
		fclose(f);
	}
	broker_pid = fork();
	CHECK(broker_pid >= 0);
	if (broker_pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL); /* a failed CHECK must not leave a broker behind */
		FILE *e = freopen(errlog, "w", stderr);
		(void)e;
		char p[16];
		snprintf(p, sizeof p, "%d", port);
		if (conf)
			execl(bin, bin, "-c", file, (char *)NULL);
		else
			execl(bin, bin, "-p", p, (char *)NULL);
		_exit(127);
	}
	for (int i = 0; i < 250; i++) {
		int s = dial();
		if (s >= 0) {
			close(s);
			return;
		}
		int st;
		if (waitpid(broker_pid, &st, WNOHANG) == broker_pid) {
			fprintf(stderr, "broker exited early (status %d)\n", st);
			CHECK(0);
		}
		usleep(20000);
	}
	CHECK(!"the broker did not listen");
}

/* SIGTERM; returns the exit status (-signal if killed). */
static inline int stop(void)
{
	int rc = test_stop(broker_pid);
	if (rc > 0) {
		char buf[4096];
		FILE *f = fopen(errlog, "r");
		size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
		buf[n] = 0;
		if (f)
			fclose(f);
		fprintf(stderr, "broker stderr:\n%s\n", buf);
	}
	if (rc != -SIGKILL)
		unlink(errlog);
	return rc;
}

static inline void put(int s, const void *p, size_t n)
{
	CHECK_EQ(write(s, p, n), (long long)n);
}

static inline void puthex(int s, const char *h)
{
	uint8_t b[512];
	put(s, b, test_unhex(h, b));
}

static inline int readn(int s, uint8_t *p, size_t n)
{
	size_t got = 0;
	while (got < n) {
		ssize_t r = read(s, p + got, n - got);
		if (r <= 0)
			return -1;
		got += (size_t)r;
	}
	return 0;
}

/* One whole packet into buf (cap bytes); its length, or -1 at EOF/timeout. */
static inline int next(int s, uint8_t *buf, size_t cap)
{
	if (readn(s, buf, 2) < 0)
		return -1;
	size_t n = 2;
	while (buf[n - 1] & 0x80) {
		if (readn(s, buf + n, 1) < 0)
			return -1;
		n++;
	}
	int hdr;
	long total = mq_frame(buf, n, &hdr);
	CHECK(total > 0 && (size_t)total <= cap);
	if (readn(s, buf + n, (size_t)total - n) < 0)
		return -1;
	return (int)total;
}

/* Connect with CONNECT at version v, clean, keep-alive ka; check CONNACK success. */
static inline int client(int v, const char *id, int ka)
{
	int s = dial();
	CHECK(s >= 0);
	uint8_t b[256];
	put(s, b, mq_enc_connect(b, &(mq_connect_enc){
			.version = v, .client_id = id, .clean = 1, .keep_alive = (uint16_t)ka }));
	int n = next(s, b, sizeof b);
	CHECK(n >= 4);
	CHECK_EQ(b[0], 0x20);
	CHECK_EQ(b[3], 0);
	return s;
}

/* Connect at 5.0 without clean start, with a session expiry interval (0: none sent); the
 * CONNACK's session-present flag goes to *present. */
static inline int client_resume(const char *id, uint32_t expiry, int *present)
{
	int s = dial();
	CHECK(s >= 0);
	uint8_t pbuf[16], b[256];
	mq_pb pb = { pbuf, 0, sizeof pbuf, 0 };
	if (expiry)
		mq_pb_u32(&pb, MQ_P_SESSION_EXPIRY, expiry);
	put(s, b, mq_enc_connect(b, &(mq_connect_enc){
			.version = 5, .client_id = id, .keep_alive = 60, .props = &pb }));
	int n = next(s, b, sizeof b);
	CHECK(n >= 4);
	CHECK_EQ(b[0], 0x20);
	CHECK_EQ(b[3], 0);
	*present = b[2] & 1;
	return s;
}

static inline void subscribe(int s, int v, const char *filter, int qos)
{
	uint8_t b[256];
	put(s, b, mq_enc_subscribe(b, v, 1, filter, (uint8_t)qos, NULL));
	CHECK(next(s, b, sizeof b) > 0);
	CHECK_EQ(b[0], 0x90);
}

static inline void publish(int s, int v, const char *topic, const char *payload, int qos,
			   uint16_t id)
{
	uint8_t b[2048];
	CHECK(strlen(topic) + strlen(payload) < 2000);
	mq_pub_enc e = { v, qos, 0, 0, id, topic, (uint16_t)strlen(topic), NULL, 0, payload,
			 (uint32_t)strlen(payload), NULL, 0 };
	put(s, b, mq_enc_publish(b, &e));
}

/* Expect a PUBLISH of payload on s. */
static inline void expect_pub(int s, int v, const char *payload)
{
	uint8_t b[512];
	int n = next(s, b, sizeof b);
	CHECK(n > 0);
	mq_packet pk;
	CHECK_EQ(mq_decode(b, (size_t)n, v, &pk), 0);
	CHECK_EQ(pk.type, MQ_PUBLISH);
	CHECK(pk.publish.payload.len == strlen(payload) &&
	      !memcmp(pk.publish.payload.p, payload, pk.publish.payload.len));
}

/* The next packet is a 5.0 DISCONNECT with reason rc, then EOF. */
static inline void expect_disconnect(int s, int rc)
{
	uint8_t b[64];
	int n = next(s, b, sizeof b);
	CHECK(n >= 3);
	CHECK_EQ(b[0], 0xe0);
	CHECK_EQ(b[2], rc);
	CHECK_EQ(next(s, b, sizeof b), -1);
}

/* Wait on watch (subscribed to $SYS/broker/clients/connected at 3.1.1) until the count it
 * publishes comes down to 1, the watcher alone; b is room for a packet. */
static inline void await_watcher_alone(int watch, uint8_t *b, size_t cap)
{
	mq_packet pk;
	int ok = 0;
	for (int i = 0; i < 20 && !ok; i++) {
		int n = next(watch, b, cap);
		CHECK(n > 0);
		CHECK_EQ(mq_decode(b, (size_t)n, 4, &pk), 0);
		ok = pk.publish.payload.len == 1 && pk.publish.payload.p[0] == '1';
	}
	CHECK(ok);
}

/* A healthy client still gets service. */
static inline void others_fine(void)
{
	int sub = client(4, "healthy-sub", 60), pub = client(5, "healthy-pub", 60);
	subscribe(sub, 4, "ok/+", 1);
	publish(pub, 5, "ok/1", "still here", 0, 0);
	expect_pub(sub, 4, "still here");
	close(sub);
	close(pub);
}

#endif
