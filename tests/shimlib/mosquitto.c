/*
 * libmosquitto inside tasks, under the shim: a client library written for threads, whose
 * mosquitto_loop() blocks in pselect() and then reads and writes its socket. 20 subscriber and
 * 20 publisher tasks, each with a client of its own, on ONE worker, exchange QoS 1 messages
 * through the weft-mqtt broker of this build. Each subscriber loops in mosquitto_loop() with a
 * 5 s timeout: were that pselect to hold the worker (as it did before the shim covered it),
 * every other client would wait behind it, and the run would take tens of seconds instead of a
 * fraction of one.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <libgen.h>
#include <mosquitto.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>

#include "test.h"

#define CLIENTS 20
#define MSGS 50

static int port, index_of[CLIENTS]; /* userdata: libmosquitto passes itself for NULL */
static atomic_int subscribed, got[CLIENTS];

static void on_subscribe(struct mosquitto *m, void *arg, int mid, int n, const int *qos)
{
	(void)m, (void)arg, (void)mid;
	CHECK(n == 1 && qos[0] == 1);
	atomic_fetch_add(&subscribed, 1);
}

static void on_message(struct mosquitto *m, void *arg, const struct mosquitto_message *msg)
{
	(void)m;
	int i = *(int *)arg, k;
	char want[32];
	CHECK(sscanf(msg->topic, "shim/%d", &k) == 1 && k == i);
	snprintf(want, sizeof want, "message %d", atomic_load(&got[i]));
	CHECK(msg->payloadlen == (int)strlen(want) && !memcmp(msg->payload, want, strlen(want)));
	atomic_fetch_add(&got[i], 1);
}

static struct mosquitto *client(const char *kind, int i)
{
	char id[32];
	snprintf(id, sizeof id, "shim-%s%d", kind, i);
	struct mosquitto *m = mosquitto_new(id, true, &index_of[i]);
	CHECK(m);
	CHECK_EQ(mosquitto_connect(m, "127.0.0.1", port, 60), MOSQ_ERR_SUCCESS);
	return m;
}

static void subscriber(void *arg)
{
	int i = (int)(intptr_t)arg;
	struct mosquitto *m = client("sub", i);
	mosquitto_subscribe_callback_set(m, on_subscribe);
	mosquitto_message_callback_set(m, on_message);
	char topic[32];
	snprintf(topic, sizeof topic, "shim/%d", i);
	CHECK_EQ(mosquitto_subscribe(m, NULL, topic, 1), MOSQ_ERR_SUCCESS);
	while (atomic_load(&got[i]) < MSGS)
		CHECK_EQ(mosquitto_loop(m, 5000, 1), MOSQ_ERR_SUCCESS);
	mosquitto_disconnect(m);
	mosquitto_destroy(m);
}

static atomic_int acked[CLIENTS];

static void on_publish(struct mosquitto *m, void *arg, int mid)
{
	(void)m, (void)mid;
	atomic_fetch_add(&acked[*(int *)arg], 1);
}

static void publisher(void *arg)
{
	int i = (int)(intptr_t)arg;
	struct mosquitto *m = client("pub", i);
	mosquitto_publish_callback_set(m, on_publish);
	while (atomic_load(&subscribed) < CLIENTS)
		CHECK_EQ(mosquitto_loop(m, 50, 1), MOSQ_ERR_SUCCESS);
	char topic[32], payload[32];
	snprintf(topic, sizeof topic, "shim/%d", i);
	for (int k = 0; k < MSGS; k++) {
		int n = snprintf(payload, sizeof payload, "message %d", k);
		CHECK_EQ(mosquitto_publish(m, NULL, topic, n, payload, 1, false), MOSQ_ERR_SUCCESS);
		CHECK_EQ(mosquitto_loop(m, 0, 1), MOSQ_ERR_SUCCESS);
	}
	while (atomic_load(&acked[i]) < MSGS)
		CHECK_EQ(mosquitto_loop(m, 5000, 1), MOSQ_ERR_SUCCESS);
	mosquitto_disconnect(m);
	mosquitto_destroy(m);
}

static int clients_main(void *arg)
{
	(void)arg;
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	weft_task *t[2 * CLIENTS];
	for (int i = 0; i < CLIENTS; i++)
		index_of[i] = i;
	for (int i = 0; i < CLIENTS; i++) {
		t[i] = weft_spawn(subscriber, (void *)(intptr_t)i);
		t[CLIENTS + i] = weft_spawn(publisher, (void *)(intptr_t)i);
	}
	for (int i = 0; i < 2 * CLIENTS; i++)
		CHECK_EQ(weft_join(t[i]), 0);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	long ms = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
	fprintf(stderr, "%d libmosquitto clients on one worker: %d messages each in %ld ms\n",
		2 * CLIENTS, MSGS, ms);
	for (int i = 0; i < CLIENTS; i++)
		CHECK_EQ(atomic_load(&got[i]), MSGS);
	CHECK(ms < 4000);
	return 0;
}

TEST(child_clients)
{
	setenv("WEFT_WORKERS", "1", 1);
	port = atoi(getenv("SHIM_BROKER_PORT"));
	mosquitto_lib_init();
	RUN(clients_main);
	mosquitto_lib_cleanup();
}

/* ---- the test: start the broker, run the clients in a child with the shim preloaded ----- */

TEST(libmosquitto_clients_in_tasks_share_one_worker)
{
	char dir[512], broker[600], ps[16];
	snprintf(dir, sizeof dir, "%s", test_argv0);
	snprintf(broker, sizeof broker, "%s/../bin/weft-mqtt", dirname(dir));
	int p = test_free_port();
	snprintf(ps, sizeof ps, "%d", p);
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		execl(broker, broker, "-p", ps, (char *)NULL);
		_exit(127);
	}
	for (int i = 0; i < 500 && !test_port_open(p); i++)
		usleep(10000);
	CHECK(test_port_open(p));
	setenv("SHIM_BROKER_PORT", ps, 1);
	test_run_shimmed("child_clients");
	CHECK_EQ(test_stop(pid), 0);
}
