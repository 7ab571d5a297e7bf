/*
 * offline.c - persistent sessions left offline (-O N): what holding them costs a broker with
 * nothing else to do. -W threads make the N sessions (CONNECT with clean start off - in 5.0
 * with an hour's session expiry, so that each has a deadline to keep - then DISCONNECT). After
 * a second's rest the broker's CPU is read over -d seconds of quiet; then, for -d seconds more,
 * one fresh client connects and disconnects every 5 ms: its CONNACK latency shows whatever
 * holds up the broker's session table.
 */
#define _GNU_SOURCE
#include <math.h>
#include <unistd.h>

#include "loadgen.h"

static atomic_long made, failed;

static void *maker(void *arg)
{
	char id[96];
	struct mosquitto *m = mosquitto_new("maker", true, NULL);
	if (!m)
		die("mosquitto_new failed");
	for (long i = (long)arg; i < opt.offline; i += opt.nworkers) {
		snprintf(id, sizeof id, "%s-off%ld", opt.prefix, i);
		atomic_fetch_add(connect_cycle(m, id, false, NULL) ? &failed : &made, 1);
	}
	mosquitto_destroy(m);
	return NULL;
}

int run_offline(void)
{
	pthread_t th[MAX_WORKERS];
	int64_t t0 = now_ns();
	for (long i = 0; i < opt.nworkers; i++)
		pthread_create(&th[i], NULL, maker, (void *)i);
	for (int i = 0; i < opt.nworkers; i++)
		pthread_join(th[i], NULL);
	double make_s = (double)(now_ns() - t0) / 1e9;
	fprintf(stderr, "    %ld offline sessions made in %.1f s, %ld failed\n", atomic_load(&made),
		make_s, atomic_load(&failed));
	sleep(1);

	double cpu0 = opt.broker_pid ? broker_cpu_s() : NAN;
	usleep((useconds_t)(opt.duration * 1e6));
	double idle_pct = opt.broker_pid ? (broker_cpu_s() - cpu0) / opt.duration * 100 : NAN;

	static uint64_t hist[HBUCKETS];
	uint64_t n = 0;
	char id[96];
	snprintf(id, sizeof id, "%s-probe", opt.prefix);
	struct mosquitto *m = mosquitto_new(id, true, NULL);
	for (int64_t end = now_ns() + (int64_t)(opt.duration * 1e9); now_ns() < end;) {
		int64_t ns;
		if (connect_cycle(m, id, true, &ns) == 0) {
			hist[bucket_of((uint64_t)ns)]++;
			n++;
		}
		usleep(5000);
	}
	mosquitto_destroy(m);
	printf("offline_sessions=%ld failed=%ld make_seconds=%.2f idle_cpu_pct=%.2f connects=%llu "
	       "connack_p50_us=%.1f connack_p99_us=%.1f connack_max_us=%.1f\n",
	       atomic_load(&made), atomic_load(&failed), make_s, idle_pct, (unsigned long long)n,
	       quantile(hist, n, 0.5) / 1e3, quantile(hist, n, 0.99) / 1e3,
	       quantile(hist, n, 1.0) / 1e3);
	fflush(stdout);
	return atomic_load(&failed) * 100 > atomic_load(&made) || !n ? 1 : 0;
}
