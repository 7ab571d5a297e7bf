/*
 * storm.c - the connect/disconnect storm (-C seq|par): CONNECT, CONNACK, DISCONNECT as fast as
 * one thread, or -W threads, can go for -d seconds; and connect_cycle, one such cycle, which
 * offline.c uses too.
 */
#define _GNU_SOURCE
#include <math.h>
#include <sys/socket.h>
#include <unistd.h>

#include "loadgen.h"

static atomic_long storm_done, storm_failed;

static void storm_on_connect(struct mosquitto *m, void *arg, int rc)
{
	(void)m;
	*(int *)arg = rc ? -1 : 1;
}

int connect_cycle(struct mosquitto *m, const char *id, bool clean, int64_t *connack_ns)
{
	int state = 0;
	mosquitto_reinitialise(m, id, clean, &state);
	mosquitto_int_option(m, MOSQ_OPT_PROTOCOL_VERSION, opt.version);
	mosquitto_connect_callback_set(m, storm_on_connect);
	int64_t t0 = now_ns();
	int rc;
	if (!clean && opt.version == MQTT_PROTOCOL_V5) { /* as traffic.c: an hour's expiry */
		mosquitto_property *props = NULL;
		mosquitto_property_add_int32(&props, MQTT_PROP_SESSION_EXPIRY_INTERVAL, 3600);
		rc = mosquitto_connect_bind_v5(m, opt.host, opt.port, opt.keepalive, NULL, props);
		mosquitto_property_free_all(&props);
	} else {
		rc = mosquitto_connect(m, opt.host, opt.port, opt.keepalive);
	}
	if (rc != MOSQ_ERR_SUCCESS) {
		usleep(1000);
		return -1;
	}
	/* The client closes first after DISCONNECT; an abortive close keeps thousands of
	 * connections a second from filling the port range with TIME_WAIT. */
	struct linger lg = { 1, 0 };
	setsockopt(mosquitto_socket(m), SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
	while (state == 0)
		if (mosquitto_loop(m, 1000, 1) != MOSQ_ERR_SUCCESS)
			break;
	if (state != 1)
		return -1;
	if (connack_ns)
		*connack_ns = now_ns() - t0;
	mosquitto_disconnect(m);
	while (mosquitto_loop(m, 1000, 1) == MOSQ_ERR_SUCCESS)
		;
	return 0;
}

static void *storm_thread(void *arg)
{
	long t = (long)arg, k = 0;
	char id[96];
	int64_t end = now_ns() + (int64_t)(opt.duration * 1e9);
	snprintf(id, sizeof id, "%s-storm%ld", opt.prefix, t);
	struct mosquitto *m = mosquitto_new(id, true, NULL);
	while (now_ns() < end && !atomic_load(&stop_all)) {
		snprintf(id, sizeof id, "%s-storm%ld-%ld", opt.prefix, t, k++);
		atomic_fetch_add(connect_cycle(m, id, true, NULL) ? &storm_failed : &storm_done, 1);
	}
	mosquitto_destroy(m);
	return NULL;
}

int run_storm(void)
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
