/*
 * bench/mutex: one lock, contended. N tasks each increment one shared counter ITERS times,
 * each increment inside lock/unlock of one global weft_mutex; the count must come out
 * N*ITERS. Reported: ns per increment (whole run: spawn to last join), its
 * ratio to each baseline (baseline ns / weft ns: how many times faster weft is), and the
 * longest time any task waited for the lock.
 *
 * Baselines, in the same run: N pthreads with pthread_mutex_t, N pthreads with a
 * test-and-test-and-set spinlock, and where installed Go's sync.Mutex with N goroutines
 * (bench/peers/mutex.go) and Gambit's threads running the same loop (bench/peers/mutex.scm).
 *
 * ns per increment comes from the plain loop, lock / increment / unlock and nothing else:
 * medians of 5 runs for N <= 7, one run for N >= 100, the runs of the kinds alternating. The
 * longest wait comes from a second, separate run of a timed loop: a trylock first, and only
 * when it fails the clock is read around the blocking lock. (It is a separate run because the
 * timed loop changes what some baselines do: Go's sync.Mutex runs faster with a TryLock before
 * each Lock, a goroutine whose TryLock fails barging once more before it queues.) Slow
 * baselines use fewer increments per thread where noted in params, to keep the whole program
 * under ~90 s on 2 cores.
 */
#define _GNU_SOURCE
#include <libgen.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <unistd.h>

#include "bench.h"
#include "spin.h"
#include "weft.h"

#define ITERS 1000000L
#define RUNS 5
#define MAXN 1000

static const int Ns[] = { 1, 2, 4, 7, 100, 1000 };
#define NN (int)(sizeof Ns / sizeof Ns[0])

struct figure {
	double ns;        /* per increment; 0: not measured */
	double wait_ms;   /* longest wait for the lock; < 0: not measured */
	long iters;       /* per thread */
};

/* ---- the shared job ------------------------------------------------------------------------ */

static struct {
	int n;
	long iters;
	long count;                 /* guarded by the lock under test */
	_Atomic int64_t max_wait;
	int64_t elapsed;
} job;

static void note_wait(int64_t w)
{
	int64_t cur = atomic_load(&job.max_wait);
	while (w > cur && !atomic_compare_exchange_weak(&job.max_wait, &cur, w))
		;
}

static void start_job(int n, long iters)
{
	job.n = n;
	job.iters = iters;
	job.count = 0;
	atomic_store(&job.max_wait, 0);
}

static struct figure end_job(const char *what)
{
	if (job.count != job.n * job.iters) {
		fprintf(stderr, "bench/mutex: %s N=%d: count %ld, want %ld\n", what, job.n, job.count,
			job.n * job.iters);
		exit(1);
	}
	return (struct figure){ (double)job.elapsed / (double)(job.n * job.iters),
				(double)atomic_load(&job.max_wait) / 1e6, job.iters };
}

/* ---- weft ---------------------------------------------------------------------------------- */

static weft_mutex wlock = WEFT_MUTEX_INIT;

static void weft_plain(void *arg)
{
	(void)arg;
	for (long i = 0; i < job.iters; i++) {
		weft_mutex_lock(&wlock);
		job.count++;
		weft_mutex_unlock(&wlock);
	}
}

static void weft_timed(void *arg)
{
	(void)arg;
	int64_t longest = 0;
	for (long i = 0; i < job.iters; i++) {
		if (weft_mutex_trylock(&wlock) != 0) {
			int64_t t0 = bench_now();
			weft_mutex_lock(&wlock);
			int64_t w = bench_now() - t0;
			if (w > longest)
				longest = w;
		}
		job.count++;
		weft_mutex_unlock(&wlock);
	}
	note_wait(longest);
}

static int weft_main(void *arg)
{
	void (*body)(void *) = arg;
	static weft_task *t[MAXN];
	int64_t t0 = bench_now();
	for (int i = 0; i < job.n; i++)
		if (!(t[i] = weft_spawn(body, NULL)))
			return -1;
	for (int i = 0; i < job.n; i++)
		weft_join(t[i]);
	job.elapsed = bench_now() - t0;
	return 0;
}

static struct figure run_weft(int n, long iters, bool timed)
{
	start_job(n, iters);
	if (weft_run(weft_main, timed ? weft_timed : weft_plain) != 0) {
		fprintf(stderr, "bench/mutex: weft_run failed\n");
		exit(1);
	}
	return end_job("weft");
}

/* ---- pthreads: pthread_mutex_t and a spinlock ---------------------------------------------- */

static pthread_mutex_t plock = PTHREAD_MUTEX_INITIALIZER;
static spinlock slock = SPIN_INIT;

static void *pthread_plain(void *arg)
{
	(void)arg;
	for (long i = 0; i < job.iters; i++) {
		pthread_mutex_lock(&plock);
		job.count++;
		pthread_mutex_unlock(&plock);
	}
	return NULL;
}

static void *pthread_timed(void *arg)
{
	(void)arg;
	int64_t longest = 0;
	for (long i = 0; i < job.iters; i++) {
		if (pthread_mutex_trylock(&plock) != 0) {
			int64_t t0 = bench_now();
			pthread_mutex_lock(&plock);
			int64_t w = bench_now() - t0;
			if (w > longest)
				longest = w;
		}
		job.count++;
		pthread_mutex_unlock(&plock);
	}
	note_wait(longest);
	return NULL;
}

/* weft's own spinlock (src/spin.h), the one its workers use for their shortest sections */
static void *spin_plain(void *arg)
{
	(void)arg;
	for (long i = 0; i < job.iters; i++) {
		spin_lock(&slock);
		job.count++;
		spin_unlock(&slock);
	}
	return NULL;
}

static void *spin_timed(void *arg)
{
	(void)arg;
	int64_t longest = 0;
	for (long i = 0; i < job.iters; i++) {
		if (!spin_trylock(&slock)) {
			int64_t t0 = bench_now();
			spin_lock(&slock);
			int64_t w = bench_now() - t0;
			if (w > longest)
				longest = w;
		}
		job.count++;
		spin_unlock(&slock);
	}
	note_wait(longest);
	return NULL;
}

static struct figure run_threads(void *(*body)(void *), const char *what, int n, long iters)
{
	static pthread_t th[MAXN];
	start_job(n, iters);
	int64_t t0 = bench_now();
	for (int i = 0; i < n; i++)
		if (pthread_create(&th[i], NULL, body, NULL) != 0) {
			fprintf(stderr, "bench/mutex: pthread_create failed\n");
			exit(1);
		}
	for (int i = 0; i < n; i++)
		pthread_join(th[i], NULL);
	job.elapsed = bench_now() - t0;
	return end_job(what);
}

/* ---- peers (Go, Gambit) -------------------------------------------------------------------- */

static char peer_dir[512];   /* where peer binaries are built: <build>/peers */
static char src_dir[512];    /* bench/peers, from this file's path (run from the repo root) */

static bool installed(const char *prog)
{
	char cmd[256];
	snprintf(cmd, sizeof cmd, "command -v %s >/dev/null 2>&1", prog);
	return system(cmd) == 0;
}

/* Build a peer with `cmd` (a format taking source and output paths) into peer_dir/name. */
static bool build_peer(const char *tool, const char *cmd_fmt, const char *src, const char *name,
		       char *out, size_t cap)
{
	if (!installed(tool)) {
		fprintf(stderr, "  %s is not installed: no %s baseline (make bench-peers installs it)\n",
			tool, name);
		return false;
	}
	char srcpath[600], cmd[2048];
	snprintf(srcpath, sizeof srcpath, "%s/%s", src_dir, src);
	if (access(srcpath, R_OK) != 0) {
		fprintf(stderr, "  %s not found (run from the repository root): no %s baseline\n",
			srcpath, name);
		return false;
	}
	snprintf(out, cap, "%s/%s", peer_dir, name);
	snprintf(cmd, sizeof cmd, "mkdir -p '%s' && ", peer_dir);
	size_t l = strlen(cmd);
	snprintf(cmd + l, sizeof cmd - l, cmd_fmt, peer_dir, out, srcpath);
	fprintf(stderr, "  building the %s baseline...\n", name);
	if (system(cmd) != 0) {
		fprintf(stderr, "  could not build %s: no %s baseline\n", srcpath, name);
		return false;
	}
	return true;
}

static struct figure run_peer(const char *bin, int n, long iters, bool timed)
{
	char cmd[800];
	snprintf(cmd, sizeof cmd, "'%s' %d %ld%s", bin, n, iters, timed ? " timed" : "");
	struct figure f = { 0, -1, iters };
	FILE *p = popen(cmd, "r");
	double ns = 0, wait = -1;
	if (p && fscanf(p, "%lf %lf", &ns, &wait) == 2)
		f = (struct figure){ ns, wait < 0 ? -1 : wait / 1e6, iters };
	if (p)
		pclose(p);
	return f;
}

/* ---- driving ------------------------------------------------------------------------------- */

enum { WEFT, WEFT1, PMUTEX, SPIN, GO, GAMBIT, KINDS };
static const char *kind_name[KINDS] = { "weft", "weft", "pthread_mutex", "spinlock",
					"go sync.Mutex", "gambit" };
static struct figure fig[KINDS][NN];
static char go_bin[600], gambit_bin[600];

static struct figure run_once(int kind, int n, long iters, bool timed)
{
	switch (kind) {
	case WEFT:
		unsetenv("WEFT_WORKERS");
		return run_weft(n, iters, timed);
	case WEFT1:
		setenv("WEFT_WORKERS", "1", 1);
		return run_weft(n, iters, timed);
	case PMUTEX:
		return run_threads(timed ? pthread_timed : pthread_plain, "pthread_mutex", n, iters);
	case SPIN:
		return run_threads(timed ? spin_timed : spin_plain, "spinlock", n, iters);
	case GO:
		return run_peer(go_bin, n, iters, timed);
	default:
		return run_peer(gambit_bin, n, iters, timed);
	}
}

/* Which kinds run at which N, with how many increments per thread (0: not run). */
static long iters_for(int kind, int n)
{
	if (kind == SPIN && n > 7)
		return 0; /* 100 spinning threads on 2 cores: the holder is preempted for whole slices */
	if (kind == PMUTEX && n > 100)
		return 0; /* as the issue: pthreads up to N = 100 */
	if (n >= 1000 && (kind == GO || kind == GAMBIT))
		return ITERS / 10;
	return ITERS;
}

/*
 * Every kind that runs at N, measured together: the plain runs go round the kinds `runs` times
 * (so a few hundred milliseconds of a noisy neighbour, common on a shared VM, fall on one run of
 * several kinds rather than on every run of one), then ns is each kind's median; the longest
 * wait comes from one timed run of each (not for Gambit).
 */
static void measure(int i, int runs, const bool *present)
{
	double ns[KINDS][RUNS];
	for (int r = 0; r < runs; r++)
		for (int k = 0; k < KINDS; k++)
			if (present[k])
				ns[k][r] = run_once(k, Ns[i], iters_for(k, Ns[i]), false).ns;
	for (int k = 0; k < KINDS; k++) {
		if (!present[k])
			continue;
		long iters = iters_for(k, Ns[i]);
		fig[k][i] = (struct figure){ bench_quantile(ns[k], runs, 0.5), -1, iters };
		if (k != GAMBIT)
			fig[k][i].wait_ms = run_once(k, Ns[i], iters, true).wait_ms;
	}
}

static void emit(int kind, int i, const char *workers)
{
	struct figure *f = &fig[kind][i];
	if (f->ns <= 0)
		return;
	char name[64], params[400], wait[32] = "not timed";
	snprintf(name, sizeof name, "%s N=%d", kind_name[kind], Ns[i]);
	if (f->wait_ms >= 0)
		snprintf(wait, sizeof wait, "%.3gms", f->wait_ms);
	int l = snprintf(params, sizeof params, "%s max_wait=%s", workers, wait);
	if (f->iters != ITERS)
		l += snprintf(params + l, sizeof params - l, " iters=%ld/thread", f->iters);
	if (kind == WEFT || kind == WEFT1) {
		l += snprintf(params + l, sizeof params - l, " x_self_N1=%.2f",
			      f->ns / fig[kind][0].ns);
		for (int b = PMUTEX; b < KINDS; b++)
			if (fig[b][i].ns > 0)
				l += snprintf(params + l, sizeof params - l, " vs_%s=%.2fx",
					      b == PMUTEX ? "pthread" : b == SPIN ? "spin" : b == GO ? "go" : "gambit",
					      fig[b][i].ns / f->ns);
	}
	bench_emit("mutex", name, "ns/incr", f->ns, params);
}

/* dir/rel made absolute (peers are built and run from other directories than ours). */
static void absolute(char *out, size_t cap, const char *path, const char *rel)
{
	char tmp[512], cwd[400] = ".";
	snprintf(tmp, sizeof tmp, "%s", path);
	const char *dir = dirname(tmp);
	if (dir[0] != '/' && getcwd(cwd, sizeof cwd))
		snprintf(out, cap, "%s/%s/%s", cwd, dir, rel);
	else
		snprintf(out, cap, "%s/%s", dir, rel);
}

int main(int argc, char **argv)
{
	(void)argc;
	absolute(peer_dir, sizeof peer_dir, argv[0], "../peers");
	absolute(src_dir, sizeof src_dir, __FILE__, "peers");
	bool go = build_peer("go", "GOCACHE=\"${GOCACHE:-%s/go-cache}\" go build -o '%s' '%s'",
			     "mutex.go", "go-mutex", go_bin, sizeof go_bin);
	bool gambit = build_peer("gsc", "%.0sgsc -exe -o '%s' '%s' >/dev/null", "mutex.scm",
				 "gambit-mutex", gambit_bin, sizeof gambit_bin);

	for (int i = 0; i < NN; i++) {
		int n = Ns[i], runs = n <= 7 ? RUNS : 1;
		char what[80];
		snprintf(what, sizeof what, "mutex: N=%d", n);
		bench_progress(what);
		bool present[KINDS];
		for (int k = 0; k < KINDS; k++)
			present[k] = iters_for(k, n) && (k != GO || go) && (k != GAMBIT || gambit);
		measure(i, runs, present);
	}
	char dflt[32];
	snprintf(dflt, sizeof dflt, "workers=%ld", sysconf(_SC_NPROCESSORS_ONLN));
	for (int i = 0; i < NN; i++) {
		for (int k = PMUTEX; k < KINDS; k++)
			emit(k, i, k == GO ? "GOMAXPROCS=default" : "");
		emit(WEFT, i, dflt);
		emit(WEFT1, i, "workers=1");
	}
	return 0;
}
