/*
 * bench/packets: one million packets through one channel. 100 producer tasks and 100 consumer
 * tasks share one channel; each producer puts 10^4 one-word packets, each consumer takes 10^4:
 * 10^6 packets through one channel, timed from the first spawn to the last join.
 *
 * weft runs at capacities 1 (a one-slot rendezvous), 0 (hand-off), 1024, and unbounded (the
 * kind of SWI-Prolog's message queue), with the default workers and with WEFT_WORKERS=1. In the
 * same run, the baselines:
 *  - C: 100 + 100 pthreads over a two-semaphore rendezvous (POSIX semaphores, a static buffer
 *    with the length in data[0]), in this program;
 *  - Go (bench/peers/packets.go): capacities 0, 1 and 1024, GOMAXPROCS=1 and 2;
 *  - SWI-Prolog (bench/peers/packets.pl): the same exchange over one message queue;
 * the last two only where `go` and `swipl` are installed (a note on stderr otherwise).
 *
 * Also weft with a second channel in a row (a pipeline: producers, a stage of relay tasks,
 * consumers), capacity 16, where every packet passes through both.
 *
 * Each of weft's settings runs in one weft_run: a first exchange, then REPEAT timed ones, as
 * Go's baseline runs a warm-up and then its timed runs in one process. The first exchange of
 * the main run (capacity 1, default workers) is reported too: it maps and faults in the
 * tasks' stacks.
 *
 * Rows: packets/s of each (median of REPEAT runs, or of the first two when those took over
 * 4 s; the ms in params), weft's ratio to each baseline (at the default workers and at one),
 * the channel's size in bytes and the allocations per packet during the runs (malloc is
 * counted by the wrappers below; not in sanitizer builds, whose allocator is their own).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <unistd.h>

#include "bench.h"
#include "weft.h"

#define PRODUCERS 100
#define CONSUMERS 100
#define PER_TASK 10000
#define PACKETS ((long)PRODUCERS * PER_TASK)

/* ---- counting allocations ---------------------------------------------------------------- */

static atomic_long n_allocs, n_bytes;

#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define COUNTING 1
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);

static void *counted(void *p, size_t n)
{
	atomic_fetch_add_explicit(&n_allocs, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&n_bytes, (long)n, memory_order_relaxed);
	return p;
}

void *malloc(size_t n)
{
	return counted(__libc_malloc(n), n);
}

void *calloc(size_t k, size_t n)
{
	return counted(__libc_calloc(k, n), k * n);
}

void *realloc(void *p, size_t n)
{
	return counted(__libc_realloc(p, n), n);
}

void *aligned_alloc(size_t a, size_t n)
{
	return counted(__libc_memalign(a, n), n);
}

void *memalign(size_t a, size_t n)
{
	return counted(__libc_memalign(a, n), n);
}

int posix_memalign(void **p, size_t a, size_t n)
{
	*p = counted(__libc_memalign(a, n), n);
	return *p ? 0 : ENOMEM;
}
#else
#define COUNTING 0
#endif

/* ---- weft -------------------------------------------------------------------------------- */

static weft_chan *chan, *chan2; /* chan2: the pipeline's second channel, or NULL */
static atomic_long received;

static void produce(void *arg)
{
	(void)arg;
	long packet = 0;
	for (int i = 0; i < PER_TASK; i++)
		weft_chan_put(chan, &packet, sizeof packet);
}

static void consume(void *arg)
{
	(void)arg;
	weft_chan *from = chan2 ? chan2 : chan;
	long packet, n = 0;
	for (int i = 0; i < PER_TASK; i++)
		n += weft_chan_take(from, &packet, sizeof packet) == sizeof packet;
	atomic_fetch_add(&received, n);
}

/* The pipeline's middle stage: from chan to chan2. */
static void relay(void *arg)
{
	(void)arg;
	long packet;
	for (int i = 0; i < PER_TASK; i++) {
		weft_chan_take(chan, &packet, sizeof packet);
		weft_chan_put(chan2, &packet, sizeof packet);
	}
}

static void producers(void *arg)
{
	weft_execute(PRODUCERS, produce, arg);
}

static void relays(void *arg)
{
	weft_execute(PRODUCERS, relay, arg);
}

struct weft_result {
	double ns;
	long chan_bytes, chan_allocs, run_allocs;
	int runs;
};

static size_t capacity;
static bool pipeline; /* two channels in a row, with a stage of relays between them */
static struct weft_result res;

static int exchange(void)
{
	long a0 = atomic_load(&n_allocs), b0 = atomic_load(&n_bytes);
	chan = weft_chan_new(capacity, sizeof(long));
	if (!chan)
		return -errno;
	res.chan_allocs = atomic_load(&n_allocs) - a0;
	res.chan_bytes = atomic_load(&n_bytes) - b0;
	if (pipeline && !(chan2 = weft_chan_new(capacity, sizeof(long))))
		return -errno;
	atomic_store(&received, 0);
	a0 = atomic_load(&n_allocs);
	int64_t t0 = bench_now();
	weft_task *p = weft_spawn(producers, NULL);
	weft_task *r = pipeline ? weft_spawn(relays, NULL) : NULL;
	weft_execute(CONSUMERS, consume, NULL);
	weft_join(p);
	if (r)
		weft_join(r);
	res.ns = (double)(bench_now() - t0);
	res.run_allocs = atomic_load(&n_allocs) - a0;
	weft_chan_free(chan);
	if (chan2)
		weft_chan_free(chan2);
	chan2 = NULL;
	return atomic_load(&received) == PACKETS ? 0 : -EPROTO;
}

static double timed[REPEAT], first_ns;
static int n_timed;
static long timed_allocs;

/* A first exchange, then REPEAT timed ones, in one weft_run, as Go's baseline runs a warm-up
 * and then its timed runs in one process: the first maps and faults in the tasks' stacks, the
 * later ones reuse them. */
static int exchanges(void *arg)
{
	(void)arg;
	int e = exchange();
	first_ns = res.ns;
	double spent = 0;
	n_timed = 0;
	timed_allocs = 0;
	while (!e && n_timed < REPEAT && (n_timed < 2 || spent < 4e9)) { /* fewer repeats of a
									  * pathological run */
		e = exchange();
		timed[n_timed++] = res.ns;
		spent += res.ns;
		timed_allocs += res.run_allocs;
	}
	return e;
}

/* Median time of the timed exchanges at capacity cap; the channel figures of the last one. */
static double weft_ns(size_t cap, const char *workers, struct weft_result *out)
{
	if (workers)
		setenv("WEFT_WORKERS", workers, 1);
	else
		unsetenv("WEFT_WORKERS");
	capacity = cap;
	int e = weft_run(exchanges, NULL);
	if (e) {
		fprintf(stderr, "packets: weft run failed: %d\n", e);
		exit(1);
	}
	*out = res;
	out->run_allocs = timed_allocs;
	out->runs = n_timed;
	return bench_quantile(timed, n_timed, 0.5);
}

/* ---- the pthread baseline: a two-semaphore rendezvous ----------------------------------- */

#define MAX_DATA 128

static struct rendezvous {
	sem_t head; /* 1: full */
	sem_t tail; /* 1: empty */
	long data[1 + MAX_DATA];
} rv;

static void rv_put(const long *state, int max)
{
	sem_wait(&rv.tail);
	rv.data[0] = max;
	for (int i = 0; i < max; i++)
		rv.data[1 + i] = state[i];
	sem_post(&rv.head);
}

static int rv_take(long *state, int max)
{
	sem_wait(&rv.head);
	int len = (int)rv.data[0];
	for (int i = 0; i < max; i++)
		state[i] = i < len ? rv.data[1 + i] : 0;
	sem_post(&rv.tail);
	return len;
}

static void *rv_producer(void *arg)
{
	(void)arg;
	long packet[1] = { 0 };
	for (int i = 0; i < PER_TASK; i++)
		rv_put(packet, 1);
	return NULL;
}

static void *rv_consumer(void *arg)
{
	(void)arg;
	long packet[1], n = 0;
	for (int i = 0; i < PER_TASK; i++)
		n += rv_take(packet, 1) == 1;
	atomic_fetch_add(&received, n);
	return NULL;
}

static double pthread_ns(void)
{
	static pthread_t th[PRODUCERS + CONSUMERS];
	pthread_attr_t a;
	pthread_attr_init(&a);
	pthread_attr_setstacksize(&a, 64 * 1024);
	sem_init(&rv.head, 0, 0);
	sem_init(&rv.tail, 0, 1);
	atomic_store(&received, 0);
	int64_t t0 = bench_now();
	for (int i = 0; i < PRODUCERS + CONSUMERS; i++)
		if (pthread_create(&th[i], &a, i < PRODUCERS ? rv_producer : rv_consumer, NULL)) {
			perror("pthread_create");
			exit(1);
		}
	for (int i = 0; i < PRODUCERS + CONSUMERS; i++)
		pthread_join(th[i], NULL);
	double ns = (double)(bench_now() - t0);
	pthread_attr_destroy(&a);
	sem_destroy(&rv.head);
	sem_destroy(&rv.tail);
	if (atomic_load(&received) != PACKETS) {
		fprintf(stderr, "packets: the pthread baseline lost packets\n");
		exit(1);
	}
	return ns;
}

/* ---- the peers: Go and SWI-Prolog, via popen -------------------------------------------- */

static char peers[PATH_MAX + 16];

/* bench/peers of this source tree: the binary is <tree>/build*\/bench/packets. */
static void find_peers(const char *argv0)
{
	char self[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
	if (n <= 0 || !argv0) {
		snprintf(peers, sizeof peers, "bench/peers");
		return;
	}
	self[n] = 0;
	for (int up = 0; up < 3; up++) {
		char *slash = strrchr(self, '/');
		if (slash)
			*slash = 0;
	}
	snprintf(peers, sizeof peers, "%s/bench/peers", self);
	if (access(peers, R_OK) != 0)
		snprintf(peers, sizeof peers, "bench/peers");
}

static bool have(const char *tool)
{
	char cmd[256];
	snprintf(cmd, sizeof cmd, "command -v %s >/dev/null 2>&1", tool);
	return system(cmd) == 0;
}

/* Run cmd and collect the "cap=N ns=T" (or "ns=T") lines it prints: ns[i] for caps[i]. */
static int run_peer(const char *cmd, const int *caps, double *ns, int n)
{
	FILE *p = popen(cmd, "r");
	if (!p)
		return -1;
	char line[256];
	int got = 0;
	while (fgets(line, sizeof line, p)) {
		int cap = -1;
		long long t;
		if (sscanf(line, "cap=%d ns=%lld", &cap, &t) == 2 || sscanf(line, "ns=%lld", &t) == 1)
			for (int i = 0; i < n; i++)
				if (caps[i] == cap) {
					ns[i] = (double)t;
					got++;
				}
	}
	return pclose(p) == 0 && got == n ? 0 : -1;
}

/* ---- the table ------------------------------------------------------------------------- */

static void emit_rate(const char *name, double ns, const char *extra)
{
	char p[128];
	snprintf(p, sizeof p, "ms=%.1f%s%s", ns / 1e6, extra && *extra ? " " : "", extra ? extra : "");
	bench_emit("packets", name, "packets/s", (double)PACKETS / (ns / 1e9), p);
}

static void emit_ratio(const char *name, double weft, double base, const char *params)
{
	bench_emit("packets", name, "x", base / weft, params);
}

enum { NCAPS = 4 };
static const size_t caps[NCAPS] = { 1, 0, 1024, WEFT_UNBOUNDED };
static const char *cap_name[NCAPS] = { "1", "0", "1024", "unbounded" };

int main(int argc, char **argv)
{
	(void)argc;
	find_peers(argv[0]);
	double w[NCAPS][2]; /* [cap][default workers, 1 worker] */
	struct weft_result r[NCAPS];
	long allocs[NCAPS];
	int runs[NCAPS];
	for (int i = 0; i < NCAPS; i++) {
		char what[64], name[64];
		snprintf(what, sizeof what, "packets: weft capacity %s", cap_name[i]);
		bench_progress(what);
		w[i][0] = weft_ns(caps[i], NULL, &r[i]);
		double first = first_ns;
		allocs[i] = r[i].run_allocs;
		runs[i] = r[i].runs;
		w[i][1] = weft_ns(caps[i], "1", &r[i]);
		allocs[i] += r[i].run_allocs;
		runs[i] += r[i].runs;
		snprintf(name, sizeof name, "weft cap=%s", cap_name[i]);
		emit_rate(name, w[i][0], i == 0 ? "workers=default target<25ms" : "workers=default");
		emit_rate(name, w[i][1], "workers=1");
		if (i == 0) {
			snprintf(name, sizeof name, "weft cap=%s, first run", cap_name[i]);
			emit_rate(name, first, "workers=default, stacks mapped and faulted in");
		}
	}
	/* Tasks using two channels: both gather on one worker (docs/design.md, hot channels). */
	bench_progress("packets: weft pipeline, two channels of 16");
	pipeline = true;
	struct weft_result pr;
	double pipe_w = weft_ns(16, NULL, &pr), pipe_1 = weft_ns(16, "1", &pr);
	pipeline = false;
	emit_rate("weft pipeline cap=16", pipe_w, "2 channels, 100 tasks per stage, workers=default");
	emit_rate("weft pipeline cap=16", pipe_1, "2 channels, 100 tasks per stage, workers=1");

	bench_progress("packets: pthreads over the two-semaphore RendezVous");
	double v[3];
	for (int k = 0; k < 3; k++)
		v[k] = pthread_ns();
	double pth = bench_quantile(v, 3, 0.5);
	emit_rate("pthreads 2-semaphore", pth, "100+100 threads");

	/* Go: best of GOMAXPROCS=1 and 2 for capacities 0, 1, 1024. */
	static const int gocaps[3] = { 0, 1, 1024 };
	static const int goidx[3] = { 1, 0, 2 }; /* index in caps[] */
	double go[2][3], gobest[3] = { 0, 0, 0 };
	bool have_go = have("go");
	for (int procs = 1; have_go && procs <= 2; procs++) {
		char cmd[PATH_MAX + 128];
		bench_progress(procs == 1 ? "packets: Go, GOMAXPROCS=1" : "packets: Go, GOMAXPROCS=2");
		snprintf(cmd, sizeof cmd, "cd '%s' && GOMAXPROCS=%d go run packets.go 0 1 1024", peers,
			 procs);
		if (run_peer(cmd, gocaps, go[procs - 1], 3)) {
			fprintf(stderr, "packets: the Go baseline failed\n");
			have_go = false;
		}
	}
	if (!have("go"))
		fprintf(stderr, "packets: no `go` here: Go baseline skipped (apt install golang-go)\n");
	for (int i = 0; have_go && i < 3; i++) {
		char name[64], p[64];
		gobest[i] = go[0][i] < go[1][i] ? go[0][i] : go[1][i];
		for (int procs = 1; procs <= 2; procs++) {
			snprintf(name, sizeof name, "go cap=%d", gocaps[i]);
			snprintf(p, sizeof p, "GOMAXPROCS=%d", procs);
			emit_rate(name, go[procs - 1][i], p);
		}
	}

	double swi = 0;
	if (have("swipl")) {
		char cmd[PATH_MAX + 128];
		static const int nocap[1] = { -1 };
		bench_progress("packets: SWI-Prolog message queue");
		snprintf(cmd, sizeof cmd, "cd '%s' && swipl -g main -t halt packets.pl", peers);
		if (run_peer(cmd, nocap, &swi, 1) == 0)
			emit_rate("swipl message queue", swi, "100+100 threads, unbounded");
		else {
			fprintf(stderr, "packets: the SWI-Prolog baseline failed\n");
			swi = 0;
		}
	} else {
		fprintf(stderr, "packets: no `swipl` here: SWI-Prolog baseline skipped "
				"(apt install swi-prolog-nox)\n");
	}

	/* weft's ratios, at the default workers (the main run is capacity 1). */
	emit_ratio("weft cap=1 / pthreads", w[0][0], pth, "target>=25");
	emit_ratio("weft cap=1 / pthreads", w[0][1], pth, "weft workers=1");
	if (swi > 0) {
		emit_ratio("weft cap=1 / swipl", w[0][0], swi, "target>=20");
		emit_ratio("weft cap=1 / swipl", w[0][1], swi, "weft workers=1");
		emit_ratio("weft unbounded / swipl", w[3][0], swi, "like for like");
	}
	for (int i = 0; have_go && i < 3; i++) {
		char name[64], p[64];
		snprintf(name, sizeof name, "weft cap=%d / go best", gocaps[i]);
		snprintf(p, sizeof p, "go GOMAXPROCS=%d target>=%d", go[0][i] <= go[1][i] ? 1 : 2,
			 gocaps[i] == 1024 ? 2 : 3);
		emit_ratio(name, w[goidx[i]][0], gobest[i], p);
		snprintf(p, sizeof p, "weft workers=1, go GOMAXPROCS=%d", go[0][i] <= go[1][i] ? 1 : 2);
		emit_ratio(name, w[goidx[i]][1], gobest[i], p);
	}

	for (int i = 0; COUNTING && i < NCAPS; i++) {
		char name[64], p[64];
		snprintf(name, sizeof name, "chan cap=%s memory", cap_name[i]);
		snprintf(p, sizeof p, "%ld allocation%s, 8-byte packets", r[i].chan_allocs,
			 r[i].chan_allocs == 1 ? "" : "s");
		bench_emit("packets", name, "bytes", (double)r[i].chan_bytes, p);
		/* every malloc of the timed runs, by anyone (weft, libc): 0 is the goal; an
		 * unbounded channel allocates a segment per 256 packets of peak backlog */
		snprintf(name, sizeof name, "weft cap=%s allocations", cap_name[i]);
		snprintf(p, sizeof p, "%ld in %d runs of 10^6 packets", allocs[i], runs[i]);
		bench_emit("packets", name, "allocs/packet", (double)allocs[i] / ((double)PACKETS * runs[i]),
			   p);
	}
	return 0;
}
