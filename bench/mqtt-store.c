/*
 * mqtt-store.c - what durability costs weft-mqtt: durable message writes per second through
 * apps/mqtt/store.c (SQLite, WAL, fsync per commit), as a broker makes them before each PUBACK:
 * store_enqueue, then store_wait for that message's ticket.
 *
 *   group commit       64 publisher tasks, each waiting for its own message: the writer thread
 *                      commits whatever has piled up, one fsync for many messages
 *   fsync per message  the same load with max_batch = 1: a commit (an fsync) per message
 *   one publisher      a single task waiting for each message: no one to share an fsync with
 *   batch of 100       one task queueing 100 messages, then waiting for the last ticket (a
 *                      connection that read 100 PUBLISHes in one batch)
 *   no fsync           group commit without fsync (synchronous=OFF): the ceiling, to show
 *                      what the fsyncs themselves cost; not a durable mode
 *
 * Each figure is the median of REPEAT runs of RUN_MS each, on a fresh database in
 * $WEFT_STORE_DIR (default /var/tmp, which should be a real disk: on tmpfs fsync is free).
 * Also printed: the writes per commit and the time per commit under group commit.
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <weft.h>

#include "bench.h"
#include "store.h"

#define RUN_MS 400
#define PAYLOAD 100

typedef struct mode {
	const char *name;
	int publishers;
	int per_wait;  /* messages queued before each store_wait */
	int max_batch; /* 0: default (group commit) */
	bool no_sync;
} mode;

static const mode modes[] = {
	{ "group commit", 64, 1, 0, false },
	{ "fsync per message", 64, 1, 1, false },
	{ "one publisher", 1, 1, 0, false },
	{ "batch of 100", 1, 100, 0, false },
	{ "no fsync", 64, 1, 0, true },
};
#define NMODES (int)(sizeof modes / sizeof *modes)

static store *st;
static const mode *cur;
static atomic_long done;
static int64_t stop_at;
static char base[256];

static void publisher(void *arg)
{
	char client[16], payload[PAYLOAD];
	snprintf(client, sizeof client, "c%d", (int)(intptr_t)arg);
	memset(payload, 'x', sizeof payload);
	store_msg m = { .topic = "bench/store", .topic_len = 11, .qos = 1, .payload = payload,
			.payload_len = PAYLOAD };
	while (weft_now() < stop_at) {
		int64_t t = 0;
		for (int i = 0; i < cur->per_wait; i++) {
			store_dlv d = { .qos = 1 };
			uint64_t row;
			t = store_enqueue(st, client, (uint16_t)strlen(client), &m, &d, &row, NULL);
			if (t < 0) {
				fprintf(stderr, "store_enqueue: %lld\n", (long long)t);
				exit(1);
			}
		}
		if (store_wait(st, t, WEFT_FOREVER)) {
			fprintf(stderr, "store_wait failed: %s\n", store_error(st));
			exit(1);
		}
		atomic_fetch_add(&done, cur->per_wait);
	}
}

/* One run of mode m: durable messages per second; *per_commit, *commit_ms from the store. */
static double run(const mode *m, int k, double *per_commit, double *commit_ms)
{
	char dir[320], err[512];
	snprintf(dir, sizeof dir, "%s/run-%d", base, k);
	store_opts o = { .max_batch = m->max_batch, .no_sync = m->no_sync };
	st = store_open(dir, &o, err, sizeof err);
	if (!st) {
		fprintf(stderr, "%s\n", err);
		exit(1);
	}
	cur = m;
	atomic_store(&done, 0);
	int64_t t0 = weft_now();
	stop_at = t0 + RUN_MS * 1000000LL;
	weft_task *t[64];
	for (int i = 0; i < m->publishers; i++)
		t[i] = weft_spawn(publisher, (void *)(intptr_t)i);
	for (int i = 0; i < m->publishers; i++)
		weft_join(t[i]);
	double secs = (double)(weft_now() - t0) / 1e9;
	store_stats s;
	store_stats_get(st, &s);
	*per_commit = s.commits ? (double)s.writes / (double)s.commits : 0;
	*commit_ms = s.commits ? (double)s.commit_ns / 1e6 / (double)s.commits : 0;
	store_close(st);
	char cmd[400];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", dir);
	return (double)atomic_load(&done) / secs;
}

static int bench(void *arg)
{
	(void)arg;
	double med[NMODES];
	int k = 0;
	for (int i = 0; i < NMODES; i++) {
		const mode *m = &modes[i];
		bench_progress(m->name);
		double v[REPEAT], pc[REPEAT], cm[REPEAT];
		for (int r = 0; r < REPEAT; r++)
			v[r] = run(m, k++, &pc[r], &cm[r]);
		char params[128];
		snprintf(params, sizeof params, "publishers=%d wait_every=%d payload=%d%s",
			 m->publishers, m->per_wait, PAYLOAD, m->no_sync ? " not durable" : "");
		med[i] = bench_quantile(v, REPEAT, 0.5);
		char name[64];
		snprintf(name, sizeof name, "durable msgs, %s", m->name);
		if (m->no_sync)
			snprintf(name, sizeof name, "msgs, %s", m->name);
		bench_emit("mqtt-store", name, "msgs/s", med[i], params);
		if (i == 0) {
			bench_emit("mqtt-store", "group commit: msgs per fsync", "msgs",
				   bench_quantile(pc, REPEAT, 0.5), params);
			bench_emit("mqtt-store", "group commit: time per commit", "ms",
				   bench_quantile(cm, REPEAT, 0.5), params);
		}
		if (i == 1)
			bench_emit("mqtt-store", "fsync per message: time per commit", "ms",
				   bench_quantile(cm, REPEAT, 0.5), params);
	}
	bench_emit("mqtt-store", "group commit / fsync per message", "x", med[0] / med[1],
		   "publishers=64");
	bench_emit("mqtt-store", "no fsync / group commit", "x", med[4] / med[0],
		   "publishers=64");
	return 0;
}

int main(void)
{
	const char *d = getenv("WEFT_STORE_DIR");
	snprintf(base, sizeof base, "%s/weft-store-bench-XXXXXX", d && *d ? d : "/var/tmp");
	if (!mkdtemp(base)) {
		perror(base);
		return 1;
	}
	int r = weft_run(bench, NULL);
	rmdir(base);
	return r;
}
