/*
 * sleepers-floor: the least a runtime that gives each task its own stack can do for
 * bench/sleepers, to measure what the memory system alone charges on this machine. Not a
 * scheduler: no timers, no run queues, no spawning. Each of 10^5 contexts has a stack slot of
 * WEFT_STACK_DEFAULT bytes with its record at the top, as weft's tasks do, and the threads (as
 * many as weft's workers, pinned as they are: affinity.c) resume their share of them ten times
 * each, in the order the slots lie in memory, every context switching straight to the next one.
 *
 * That is the one thing a sleeper's wake-up cannot skip: resuming a task whose stack and record
 * were last touched a whole round of switches ago, a TLB miss on its page and cache misses on
 * its lines. A run that meets bench/sleepers' target (twice the ideal 10 ms) keeps at least
 * half of the 10^5 tasks alive on average (Little's law), and 5 x 10^4 stacks resumed twenty
 * times cost what 10^5 resumed ten times do: so a runtime that keeps a stack per task (in 4 KB
 * pages) takes at least this long for such a run, whatever its timers and queues cost.
 * bench/sleepers runs it beside weft.
 *
 * Prints the median of REPEAT runs as `ms=<milliseconds>`; the stacks are faulted in before.
 * $WEFT_WORKERS and $WEFT_PIN act on the threads as they do on weft's workers.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "affinity.h"
#include "bench.h"
#include "context.h"
#include "weft.h"

#define TASKS 100000
#define ROUNDS 10

struct record {
	weft_ctx ctx;
	weft_ctx *next; /* resumed after this one: the next record's, or the thread's own */
};

struct share {
	int id;
	int n; /* records */
	struct record *first;
	weft_ctx home;
	pthread_t thread;
};

static pthread_barrier_t go, done;

static void body(void *arg)
{
	struct record *r = arg;
	for (;;)
		ctx_switch(&r->ctx, r->next);
}

/* n slots in one mapping, each with its record at the top, chained in address order. */
static struct record *carve(struct share *s)
{
	size_t slot = WEFT_STACK_DEFAULT;
	char *map = mmap(NULL, slot * (size_t)s->n, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (map == MAP_FAILED) {
		perror("sleepers-floor: mmap");
		exit(1);
	}
	struct record *prev = NULL, *first = NULL;
	for (int i = 0; i < s->n; i++) {
		char *lo = map + slot * (size_t)i;
		struct record *r = (struct record *)(lo + slot) - 1;
		ctx_init(&r->ctx, lo, slot - sizeof *r, body, r);
		r->next = &s->home;
		if (prev)
			prev->next = &r->ctx;
		else
			first = r;
		prev = r;
	}
	return first;
}

static void *thread(void *arg)
{
	struct share *s = arg;
	affinity_worker(s->id);
	s->first = carve(s);
	ctx_switch(&s->home, &s->first->ctx); /* each context's first run faults its stack in */
	for (int run = 0; run < REPEAT; run++) {
		pthread_barrier_wait(&go);
		for (int k = 0; k < ROUNDS; k++)
			ctx_switch(&s->home, &s->first->ctx);
		pthread_barrier_wait(&done);
	}
	return NULL;
}

int main(void)
{
	int n = affinity_workers(affinity_init());
	affinity_plan(n);
	struct share *s = calloc((size_t)n, sizeof *s);
	pthread_barrier_init(&go, NULL, (unsigned)n + 1);
	pthread_barrier_init(&done, NULL, (unsigned)n + 1);
	for (int i = 0; i < n; i++) {
		s[i].id = i;
		s[i].n = TASKS / n + (i < TASKS % n);
		pthread_create(&s[i].thread, NULL, thread, &s[i]);
	}
	double ms[REPEAT];
	for (int run = 0; run < REPEAT; run++) {
		pthread_barrier_wait(&go);
		int64_t t0 = bench_now();
		pthread_barrier_wait(&done);
		ms[run] = (double)(bench_now() - t0) / 1e6;
	}
	for (int i = 0; i < n; i++)
		pthread_join(s[i].thread, NULL);
	printf("ms=%.3f\n", bench_quantile(ms, REPEAT, 0.5));
	return 0;
}
