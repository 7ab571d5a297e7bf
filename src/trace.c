/*
 * trace.c - WEFT_TRACE=out.json: what every worker ran, and who woke whom.
 *
 * Recording. Every thread that records (workers, blocking-pool threads, plain threads waking
 * tasks) owns a ring of fixed-size events, allocated at its first event and registered once in
 * a list under a lock; after that it writes with no lock and no atomic read-modify-write. A
 * ring keeps the last WEFT_TRACE_EVENTS events (default 2^20) of its thread. An event is a
 * timestamp, a kind and two ids or pointers: a switch records the task left and the task
 * entered (how the first left, and what it waits for, come from its state and wait record), a
 * wake records the task made runnable, a spawn records the new task and, in a second event,
 * its name, so the writer never needs a task record that may be gone by then.
 *
 * Writing. weft_run ends with every worker joined; trace_stop merges all rings by time and
 * replays them: a switch closes the slice of the task that ran on that worker and opens one
 * for the next, a wake (or spawn) leaves a flow start on the waker's track that the woken
 * task's next slice binds to. The output is the Chrome trace-event format, which Perfetto
 * (ui.perfetto.dev) and chrome://tracing open: one track per thread, a slice per run of a task
 * named after the task, with how it ended (yield, exit or the wait it parked in) in its args.
 *
 * Timestamps are read from the CPU's counter (rdtsc, cntvct_el0) where the kernel says it runs
 * at a constant rate, in step on all cores: a fraction of the cost of clock_gettime, on every
 * event. trace_stop maps counts to weft_now() nanoseconds from two readings of both clocks.
 *
 * Rings of threads that have exited are freed after writing; a thread that outlives weft_run
 * keeps its ring for the next run. A thread still recording while the file is written (a plain
 * thread outside weft's control) may have its last events missed or torn.
 */
#define _GNU_SOURCE
#include "trace.h"

#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "sanitizer.h"
#include "sched.h"
#include "task.h"
#include "weft.h"

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

enum kind { EV_SWITCH, EV_WAKE, EV_SPAWN, EV_NAME, EV_STEAL, EV_IDLE, EV_CALL };

struct event {
	int64_t ts;
	uint32_t kind, x; /* x: how the task left (switch), by timer (wake), begin (idle, call) */
	uint64_t a;       /* a task id: from, waker, parent, named; a victim worker */
	union {
		struct {
			uint64_t b;             /* a task id: to, woken, child */
			const void *p, *q;      /* wait reason and object; fn of a call */
		};
		char name[32];
	};
};

struct ring {
	struct ring *next;
	uint64_t n;             /* events recorded; the latest are at (n - k) & mask */
	int tid;
	int slot;               /* its track while writing */
	atomic_bool orphan;     /* its thread has exited */
	char name[32];
	struct event ev[];
};

atomic_bool trace_on;

static struct {
	pthread_mutex_t lock;
	pthread_once_t once;
	pthread_key_t key;      /* its destructor marks a ring orphan */
	struct ring *rings;
	uint64_t mask;
	int next_tid;
	int64_t t0, tick0;      /* weft_now() and tick() when tracing began */
	double ns_per_tick;     /* 0 while tick() is weft_now() itself */
	char path[4096];
	bool active;            /* between trace_start and trace_stop, with a path: under lock */
} T = { .lock = PTHREAD_MUTEX_INITIALIZER, .once = PTHREAD_ONCE_INIT };

static __thread struct ring *my_ring;

static bool fast_ticks;

static inline int64_t tick(void)
{
	if (__builtin_expect(fast_ticks, 1)) {
#if defined(__x86_64__)
		return (int64_t)__rdtsc();
#elif defined(__aarch64__)
		uint64_t v;
		__asm__ __volatile__("isb; mrs %0, cntvct_el0" : "=r"(v));
		return (int64_t)v;
#endif
	}
	return weft_now();
}

/* The counter is usable when it ticks at a constant rate on every core: x86-64 with
 * constant_tsc and nonstop_tsc; aarch64's generic timer always does. */
static bool counter_usable(void)
{
#if defined(__x86_64__)
	FILE *f = fopen("/proc/cpuinfo", "r");
	if (!f)
		return false;
	char line[4096];
	bool ok = false;
	while (!ok && fgets(line, sizeof line, f))
		ok = strncmp(line, "flags", 5) == 0 && strstr(line, " constant_tsc") &&
		     strstr(line, " nonstop_tsc");
	fclose(f);
	return ok;
#elif defined(__aarch64__)
	return true;
#else
	return false;
#endif
}

static void orphan(void *r)
{
	atomic_store(&((struct ring *)r)->orphan, true);
}

static void make_key(void)
{
	pthread_key_create(&T.key, orphan);
}

static size_t ring_bytes(void)
{
	return sizeof(struct ring) + (T.mask + 1) * sizeof(struct event);
}

static struct ring *ring_new(void)
{
	struct ring *r = mmap(NULL, ring_bytes(), PROT_READ | PROT_WRITE,
			      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (r == MAP_FAILED)
		return NULL;
	pthread_mutex_lock(&T.lock);
	r->tid = 1000 + T.next_tid++;
	snprintf(r->name, sizeof r->name, "thread %d", r->tid - 1000);
	r->next = T.rings;
	T.rings = r;
	pthread_mutex_unlock(&T.lock);
	pthread_setspecific(T.key, r);
	return r;
}

static struct event *record(enum kind k, uint32_t x)
{
	struct ring *r = my_ring;
	if (__builtin_expect(!r, 0) && !(r = my_ring = ring_new()))
		return NULL;
	struct event *e = &r->ev[r->n++ & T.mask];
	e->ts = tick();
	e->kind = k;
	e->x = x;
	return e;
}

static uint64_t current_id(void)
{
	struct worker *w = worker_self();
	return w && w->cur ? w->cur->id : 0;
}

/* A parked `from` cannot run elsewhere (and re-arm its wait record) before this worker has
 * switched away from it, so its wait record is stable here. */
void trace_switch_(const weft_task *from, const weft_task *to, int left)
{
	struct event *e = record(EV_SWITCH, (uint32_t)left);
	if (!e)
		return;
	e->a = from ? from->id : 0;
	e->b = to ? to->id : 0;
	e->p = left == TRACE_PARK ? atomic_load_explicit(&from->wait.reason, memory_order_relaxed)
				  : NULL;
	e->q = left == TRACE_PARK ? atomic_load_explicit(&from->wait.object, memory_order_relaxed)
				  : NULL;
}

void trace_wake_(const weft_task *t, bool by_timer)
{
	struct event *e = record(EV_WAKE, by_timer);
	if (e) {
		e->a = current_id();
		e->b = t->id;
	}
}

void trace_spawn_(const weft_task *t)
{
	struct event *e = record(EV_SPAWN, 0);
	if (!e)
		return;
	e->a = current_id();
	e->b = t->id;
	if ((e = record(EV_NAME, 0))) {
		e->a = t->id;
		memcpy(e->name, t->name, sizeof e->name);
	}
}

void trace_steal_(int victim, unsigned n)
{
	struct event *e = record(EV_STEAL, n);
	if (e)
		e->a = (uint64_t)victim;
}

void trace_idle_(bool begin)
{
	record(EV_IDLE, begin);
}

void trace_call_(const void *fn, bool begin)
{
	struct event *e = record(EV_CALL, begin);
	if (e && my_ring->name[0] == 't') /* still "thread N": name the pool's track */
		snprintf(my_ring->name, sizeof my_ring->name, "blocking pool %d", my_ring->tid - 1000);
	if (e)
		e->p = fn;
}

void trace_thread_name(const char *fmt, int n)
{
	if (!atomic_load_explicit(&trace_on, memory_order_relaxed))
		return;
	struct ring *r = my_ring ? my_ring : (my_ring = ring_new());
	if (r) {
		snprintf(r->name, sizeof r->name, fmt, n);
		r->tid = n; /* workers: their index, below every other thread's */
	}
}

void trace_start(void)
{
	const char *p = getenv("WEFT_TRACE");
	if (!p || !*p || strlen(p) >= sizeof T.path)
		return;
	pthread_once(&T.once, make_key);
	const char *n = getenv("WEFT_TRACE_EVENTS");
	uint64_t want = n && *n ? strtoull(n, NULL, 10) : 1u << 20, size = 1024;
	while (size < want && size < (1ull << 32))
		size <<= 1;
	pthread_mutex_lock(&T.lock);
	if (!T.rings) /* the ring size cannot change under rings that live on */
		T.mask = size - 1;
	for (struct ring *r = T.rings; r; r = r->next)
		r->n = 0;
	strcpy(T.path, p);
	fast_ticks = counter_usable();
	T.t0 = weft_now();
	T.tick0 = tick();
	T.active = true;
	atomic_store(&trace_on, true);
	pthread_mutex_unlock(&T.lock);
}

/* ---- writing ----------------------------------------------------------------------------- */

/* Task ids to their names and to the flow (wake arrow) waiting for their next slice. */
struct task_info {
	uint64_t id, flow;
	const char *flow_name; /* "wake", "deadline" or "spawn": both ends carry it */
	char name[32];
};

struct table {
	struct task_info *v;
	size_t cap, len;
};

static struct task_info *lookup(struct table *t, uint64_t id)
{
	if (t->len * 2 >= t->cap) {
		struct table bigger = { calloc(t->cap ? t->cap * 2 : 1024, sizeof *t->v),
					t->cap ? t->cap * 2 : 1024, 0 };
		if (!bigger.v)
			return NULL;
		for (size_t i = 0; i < t->cap; i++)
			if (t->v[i].id)
				*lookup(&bigger, t->v[i].id) = t->v[i];
		free(t->v);
		*t = bigger;
	}
	size_t i = (id * 0x9e3779b97f4a7c15ull) & (t->cap - 1);
	while (t->v[i].id && t->v[i].id != id)
		i = (i + 1) & (t->cap - 1);
	if (!t->v[i].id) {
		t->v[i].id = id;
		t->len++;
	}
	return &t->v[i];
}

struct item {
	const struct event *e;
	const struct ring *r;
	uint64_t seq;
};

static int by_time(const void *a, const void *b)
{
	const struct item *x = a, *y = b;
	if (x->e->ts != y->e->ts)
		return x->e->ts < y->e->ts ? -1 : 1;
	if (x->r != y->r)
		return x->r < y->r ? -1 : 1;
	return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* What each track has open while replaying. */
struct track {
	uint64_t task;
	int64_t since, idle_since, call_since;
};

struct writer {
	FILE *f;
	struct table tasks;
	uint64_t flows;
	long events;
};

static void put_string(FILE *f, const char *s, size_t max)
{
	fputc('"', f);
	for (size_t i = 0; i < max && s[i]; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c == '"' || c == '\\')
			fprintf(f, "\\%c", c);
		else if (c < 0x20)
			fprintf(f, "\\u%04x", c);
		else
			fputc(c, f);
	}
	fputc('"', f);
}

/* Microseconds since tracing began, of a tick() reading. */
static double us(int64_t ticks)
{
	return (double)(ticks - T.tick0) * T.ns_per_tick / 1e3;
}

static void put_head(struct writer *wr, const char *ph, int64_t ts, int tid)
{
	fprintf(wr->f, ",\n{\"ph\":\"%s\",\"pid\":1,\"tid\":%d,\"ts\":%.3f", ph, tid, us(ts));
	wr->events++;
}

static const char *task_name(struct writer *wr, uint64_t id)
{
	struct task_info *ti = lookup(&wr->tasks, id);
	return ti && ti->name[0] ? ti->name : "task";
}

static void close_slice(struct writer *wr, struct track *tr, const struct event *e, int tid)
{
	if (!tr->task)
		return;
	put_head(wr, "X", tr->since, tid);
	fprintf(wr->f, ",\"dur\":%.3f,\"name\":", us(e->ts) - us(tr->since));
	put_string(wr->f, task_name(wr, tr->task), 32);
	fprintf(wr->f, ",\"args\":{\"task\":%" PRIu64 ",\"then\":", tr->task);
	if (e->x == TRACE_PARK) {
		fprintf(wr->f, "\"parked\",\"waits for\":");
		put_string(wr->f, e->p ? e->p : "?", 64);
		fprintf(wr->f, ",\"object\":\"%p\"}}", e->q);
	} else {
		fprintf(wr->f, "\"%s\"}}", e->x == TRACE_EXIT ? "exit" : "yield");
	}
	tr->task = 0;
}

/* A wake or spawn: an arrow from here to the woken task's next slice. */
static void flow_start(struct writer *wr, const struct event *e, int tid, const char *what)
{
	struct task_info *ti = lookup(&wr->tasks, e->b);
	if (!ti)
		return;
	ti->flow = ++wr->flows;
	ti->flow_name = what;
	put_head(wr, "s", e->ts, tid);
	fprintf(wr->f, ",\"id\":%" PRIu64 ",\"name\":\"%s\",\"cat\":\"wake\"}", ti->flow, what);
}

static void on_switch(struct writer *wr, struct track *tr, const struct event *e, int tid)
{
	close_slice(wr, tr, e, tid);
	if (!e->b)
		return;
	tr->task = e->b;
	tr->since = e->ts;
	struct task_info *ti = lookup(&wr->tasks, e->b);
	if (ti && ti->flow) {
		put_head(wr, "f", e->ts, tid);
		fprintf(wr->f, ",\"bp\":\"e\",\"id\":%" PRIu64 ",\"name\":\"%s\",\"cat\":\"wake\"}",
			ti->flow, ti->flow_name);
		ti->flow = 0;
	}
}

static void span(struct writer *wr, int64_t *since, const struct event *e, int tid,
		 const char *name)
{
	if (e->x) {
		*since = e->ts;
		return;
	}
	if (!*since)
		return;
	put_head(wr, "X", *since, tid);
	fprintf(wr->f, ",\"dur\":%.3f,\"name\":\"%s\"", us(e->ts) - us(*since), name);
	Dl_info di;
	if (e->kind == EV_CALL && dladdr(e->p, &di) && di.dli_sname)
		fprintf(wr->f, ",\"args\":{\"fn\":\"%s\"}", di.dli_sname);
	fputc('}', wr->f);
	*since = 0;
}

static void replay(struct writer *wr, const struct item *it, struct track *tr)
{
	const struct event *e = it->e;
	int tid = it->r->tid;
	switch (e->kind) {
	case EV_SWITCH:
		on_switch(wr, tr, e, tid);
		break;
	case EV_WAKE:
		flow_start(wr, e, tid, e->x ? "deadline" : "wake");
		break;
	case EV_SPAWN:
		flow_start(wr, e, tid, "spawn");
		break;
	case EV_NAME: {
		struct task_info *ti = lookup(&wr->tasks, e->a);
		if (ti)
			memcpy(ti->name, e->name, sizeof ti->name);
		break;
	}
	case EV_STEAL:
		put_head(wr, "i", e->ts, tid);
		fprintf(wr->f, ",\"s\":\"t\",\"name\":\"steal\",\"args\":{\"from worker\":%" PRIu64
			",\"tasks\":%u}}", e->a, e->x);
		break;
	case EV_IDLE:
		span(wr, &tr->idle_since, e, tid, "idle");
		break;
	case EV_CALL:
		span(wr, &tr->call_since, e, tid, "blocking call");
		break;
	}
}

/* Every ring's events, oldest first; each ring numbered with its track. */
static struct item *collect(size_t *count, size_t *nrings)
{
	size_t n = 0, k = 0;
	for (struct ring *r = T.rings; r; r = r->next, k++)
		n += r->n < T.mask + 1 ? r->n : T.mask + 1;
	struct item *v = malloc((n ? n : 1) * sizeof *v);
	if (!v)
		return NULL;
	size_t i = 0;
	k = 0;
	for (struct ring *r = T.rings; r; r = r->next) {
		uint64_t first = r->n > T.mask + 1 ? r->n - (T.mask + 1) : 0;
		r->slot = (int)k++;
		for (uint64_t s = first; s < r->n; s++)
			v[i++] = (struct item){ &r->ev[s & T.mask], r, s };
	}
	qsort(v, i, sizeof *v, by_time);
	*count = i;
	*nrings = k;
	return v;
}

static void put_metadata(struct writer *wr)
{
	fprintf(wr->f, "{\"traceEvents\":[\n{\"ph\":\"M\",\"pid\":1,\"name\":\"process_name\","
		       "\"args\":{\"name\":\"weft\"}}");
	for (struct ring *r = T.rings; r; r = r->next) {
		fprintf(wr->f, ",\n{\"ph\":\"M\",\"pid\":1,\"tid\":%d,\"name\":\"thread_name\","
			       "\"args\":{\"name\":", r->tid);
		put_string(wr->f, r->name, sizeof r->name);
		fprintf(wr->f, "}},\n{\"ph\":\"M\",\"pid\":1,\"tid\":%d,\"name\":"
			       "\"thread_sort_index\",\"args\":{\"sort_index\":%d}}", r->tid, r->tid);
	}
}

static int write_file(void)
{
	size_t n = 0, nrings = 0;
	struct item *v = collect(&n, &nrings);
	struct track *tracks = calloc(nrings ? nrings : 1, sizeof *tracks);
	struct writer wr = { .f = fopen(T.path, "w") };
	int err = !v || !tracks ? -ENOMEM : !wr.f ? -errno : 0;
	if (!err) {
		put_metadata(&wr);
		for (size_t i = 0; i < n; i++)
			replay(&wr, &v[i], &tracks[v[i].r->slot]);
		fprintf(wr.f, "\n],\"displayTimeUnit\":\"ns\"}\n");
		if (fclose(wr.f) != 0)
			err = -errno;
		else
			fprintf(stderr, "weft: trace of %ld events written to %s\n", wr.events, T.path);
	} else if (wr.f) {
		fclose(wr.f);
	}
	free(wr.tasks.v);
	free(tracks);
	free(v);
	return err;
}

/* Write the file from the rings as they are: counts mapped to nanoseconds from the clocks now. */
static int write_now(void)
{
	int64_t ticks = tick() - T.tick0, ns = weft_now() - T.t0;
	T.ns_per_tick = fast_ticks && ticks > 0 ? (double)ns / (double)ticks : 1.0;
	int err = write_file();
	if (err)
		fprintf(stderr, "weft: cannot write the trace to %s: %s\n", T.path, strerror(-err));
	return err;
}

/*
 * While weft runs. Recording stops for the write, since the writer reads rings that workers
 * would otherwise go on writing; a thread that read trace_on just before it was cleared may
 * still be writing one event, which may come out torn or missing (as in the last moment of a
 * plain thread's recording at trace_stop). Events of the write's own time are not recorded.
 * Rejected: copying every ring first (up to 64 MiB each) to record on meanwhile.
 */
int trace_flush(void)
{
	pthread_mutex_lock(&T.lock);
	int err = 0;
	if (T.active) {
		atomic_store(&trace_on, false);
		san_racy_begin();
		err = write_now();
		san_racy_end();
		atomic_store(&trace_on, true);
	}
	pthread_mutex_unlock(&T.lock);
	return err;
}

void trace_stop(void)
{
	pthread_mutex_lock(&T.lock);
	if (!T.active) {
		pthread_mutex_unlock(&T.lock);
		return;
	}
	T.active = false;
	atomic_store(&trace_on, false);
	write_now();
	for (struct ring **p = &T.rings; *p;) {
		struct ring *r = *p;
		if (atomic_load(&r->orphan)) {
			*p = r->next;
			munmap(r, ring_bytes());
		} else {
			p = &r->next;
		}
	}
	pthread_mutex_unlock(&T.lock);
}

int weft_trace_flush(void)
{
	return trace_flush();
}
