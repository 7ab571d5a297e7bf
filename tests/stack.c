/*
 * Tests of the stack pool (src/stack.c) as a long-running program sees it: what the slots of
 * tasks that have ended cost, that slots given back to the kernel come back whole, and that an
 * overflow, with a guard page or without, names the task that made it.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "stack.h"
#include "task.h"
#include "test.h"

static void park_forever(void *arg)
{
	(void)arg;
	CHECK(weft_sleep_until(WEFT_FOREVER) < 0); /* until cancelled */
}

enum { CROWD = TEST_CAP(20000) };
static weft_task *crowd[CROWD];
static struct seen {
	char *rec;
	bool guarded;
} first[CROWD];

static void spawn_crowd(void)
{
	for (int i = 0; i < CROWD; i++)
		CHECK((crowd[i] = weft_spawn(park_forever, NULL)));
}

static void end_crowd(void)
{
	for (int i = 0; i < CROWD; i++)
		CHECK_EQ(weft_cancel(crowd[i]), 0);
	for (int i = 0; i < CROWD; i++)
		CHECK_EQ(weft_join(crowd[i]), 0);
}

static int cmp_seen(const void *a, const void *b)
{
	const char *x = ((const struct seen *)a)->rec, *y = ((const struct seen *)b)->rec;
	return x < y ? -1 : x > y;
}

/* A crowd of tasks that came and went leaves at most the workers' caches and the depot's
 * warm magazine holding their pages: 20,000 tasks kept 80 MB when every freed slot kept its
 * pages. Each costs its slot's top page (the record and the frames above the park). The next
 * crowd reuses the slots given back, their records written anew: the same place, size and
 * guard page as the first time. Under the sanitizers RSS means nothing (shadow memory, ASan's
 * larger stacks): the crowds run, the bound is not asserted. */
static int given_back_main(void *arg)
{
	(void)arg;
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	long base = test_rss_kb(0);
	uint32_t gen;
	spawn_crowd();
	for (int i = 0; i < CROWD; i++) {
		struct stack *s = (struct stack *)task_record(crowd[i], &gen); /* handles carry a generation */
		first[i] = (struct seen){ (char *)s, s->guarded };
	}
	qsort(first, CROWD, sizeof first[0], cmp_seen);
	long peak = test_rss_kb(0);
	end_crowd();
	long after = test_rss_kb(0);
	/* two magazines per worker, the depot's warm one, a partial one; two pages a slot */
	long bound = (long)((size_t)(weft_worker_max() * 2 + 2) * STACK_MAGAZINE * 2 * page / 1024);
	fprintf(stderr, "%d tasks came and went: RSS %ld KB before, %ld KB with them, %ld KB after "
			"(bound: before + %ld)\n", CROWD, base, peak, after, bound);
	if (!SLOW)
		CHECK(after - base <= bound);
	spawn_crowd();
	int again = 0;
	for (int i = 0; i < CROWD; i++) {
		struct stack *s = (struct stack *)task_record(crowd[i], &gen); /* handles carry a generation */
		struct seen key = { (char *)s, false };
		struct seen *f = bsearch(&key, first, CROWD, sizeof first[0], cmp_seen);
		CHECK(s->pooled && s->size > 0);
		CHECK((char *)s->lo == (char *)s->map + page);
		CHECK((char *)s->map + s->map_size - (char *)s < (long)page);
		if (f) {
			CHECK_EQ(s->guarded, f->guarded);
			again++;
		}
	}
	CHECK(again > CROWD / 2);
	end_crowd();
	return 0;
}

TEST(stacks_of_ended_tasks_are_given_back)
{
	RUN(given_back_main);
}

/* ---- overflows -------------------------------------------------------------------------- */

/* A stack overflow names the task: in a child process (this binary, with an argument), which
 * it aborts. */
static int depth(int n)
{
	volatile char pad[512];
	pad[0] = (char)n;
	return n <= 0 ? pad[0] : depth(n - 1) + pad[0];
}

static void overflow(void *arg)
{
	(void)arg;
	depth(1 << 20);
}

static int overflows(void *arg)
{
	(void)arg;
	weft_spawn_opts o = { .name = "deep" };
	weft_join(weft_spawn_opt(overflow, NULL, &o));
	return 0;
}

TEST(child_overflow)
{
	weft_run(overflows, NULL);
}

TEST(stack_overflow_is_reported)
{
	test_expect_abort("child_overflow", "(deep) overflowed its ");
}

/* Beyond the guard budget a slot has no guard page (src/stack.c): an overflow there is caught
 * by the canary at the slot's lowest word, read within CANARY_EVERY switches of the task and
 * when it ends or parks with no deadline. The children run with WEFT_STACK_GUARDS=0. The
 * overflowing task writes about a kilobyte below its stack, which lands on the page the guard
 * would have been, and returns. Not instrumented by ASan, whose fake stack (with
 * detect_stack_use_after_return) would put these buffers elsewhere. Volatile stores: a memset
 * of a buffer nobody reads may be dropped. */
#define ON_REAL_STACK __attribute__((noinline, no_sanitize_address))

ON_REAL_STACK static void fill(volatile char *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		p[i] = 0x5a;
}

ON_REAL_STACK static void splash(void)
{
	volatile char big[2048];
	fill(big, sizeof big);
}

/* Frames of about 256 bytes down to a kilobyte above lo, then one of 2 KiB across it. */
ON_REAL_STACK static int dig(const char *lo, int depth)
{
	volatile char pad[256];
	fill(pad, sizeof pad);
	if ((const char *)pad < lo + 1024 || depth > 100000)
		splash();
	else
		dig(lo, depth + 1);
	return pad[0];
}

static void overflow_quietly(void *arg)
{
	weft_task *self = weft_self();
	if (self->stk.guarded) { /* the guard page would catch it: not what is tested */
		fprintf(stderr, "task has a guard page\n");
		_exit(3);
	}
	dig(self->stk.lo, 0);
	if (!arg)
		return; /* caught as it ends */
	if (strcmp(arg, "park") == 0) { /* caught as it parks with no deadline, for ever */
		char b;
		weft_chan *never = weft_chan_new(0, 1);
		CHECK(never);
		weft_chan_take(never, &b, 1);
	} else {
		/* A sleep parks, a switch even with nothing else to run; but one whose deadline
		 * has passed by then (a slow machine, qemu) returns without switching, so count
		 * the switches the check itself counted. */
		for (int n = 0, tries = 0; n < CANARY_EVERY && tries < 1000; tries++) {
			uint8_t before = self->stk.switches;
			weft_sleep_until(weft_now() + MS);
			n += self->stk.switches != before;
		}
	}
	fprintf(stderr, "not caught\n");
	_exit(4);
}

static int unguarded(void *how)
{
	weft_join(weft_spawn_opt(overflow_quietly, how, &(weft_spawn_opts){ .name = "deep" }));
	return 0;
}

TEST(child_overflow_unguarded_switch)
{
	weft_run(unguarded, "sleep");
}

TEST(child_overflow_unguarded_park)
{
	weft_run(unguarded, "park");
}

TEST(child_overflow_unguarded_exit)
{
	weft_run(unguarded, NULL);
}

TEST(unguarded_overflow_is_reported_at_a_switch)
{
	test_expect_abort_env("WEFT_STACK_GUARDS=0", "child_overflow_unguarded_switch",
			      "(deep) overflowed its ");
}

TEST(unguarded_overflow_is_reported_when_the_task_parks_for_good)
{
	test_expect_abort_env("WEFT_STACK_GUARDS=0", "child_overflow_unguarded_park",
			      "(deep) overflowed its ");
}

TEST(unguarded_overflow_is_reported_when_the_task_ends)
{
	test_expect_abort_env("WEFT_STACK_GUARDS=0", "child_overflow_unguarded_exit",
			      "(deep) overflowed its ");
}

/* A frame bigger than a page, compiled without -fstack-clash-protection (weft's own code and
 * tests are built with it): the stack pointer jumps past the task's own guard page, and the
 * memset's first write lands far below it - in the slots of other tasks, or, as here, in memory
 * that is no stack at all (reserved PROT_NONE below the task's stack, so that nothing is
 * corrupted and the fault is certain). The task to name is the one whose stack pointer left
 * its stack, though the fault is on no guard page. */
#define HUGE_FRAME (200 * 1024)
#define BELOW HUGE_FRAME /* more than the frame reaches below the guard page */

__attribute__((noinline, no_sanitize_address
#if !defined(__clang__)
	       , optimize("no-stack-clash-protection")
#endif
	       )) static int huge_frame(int n)
{
	volatile char a[HUGE_FRAME];
	memset((char *)a, n, sizeof a);
	return a[n];
}

/* Reserve BELOW bytes under the running task's guard page; false when something is there. */
static bool reserve_below(void)
{
	char *guard = (char *)weft_self()->stk.lo - sysconf(_SC_PAGESIZE);
	void *want = guard - BELOW;
	void *got = mmap(want, BELOW, PROT_NONE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	if (got != MAP_FAILED && got != want) /* a kernel before 4.17: a hint, not a demand */
		munmap(got, BELOW);
	return got == want;
}

static weft_chan *placed;

static void huge(void *arg)
{
	(void)arg;
	bool ok = reserve_below();
	CHECK_EQ(weft_chan_put(placed, &ok, sizeof ok), 0);
	if (ok)
		huge_frame(1);
	weft_sleep_until(WEFT_FOREVER); /* keeps its stack, so that the next one maps elsewhere */
}

static int overflows_hugely(void *arg)
{
	(void)arg;
	placed = weft_chan_new(0, sizeof(bool));
	/* not the default size: a stack of its own mapping, with nothing of weft's below; a
	 * sanitizer's mappings may lie there, so try a few */
	weft_spawn_opts o = { .name = "huge", .stack_size = 68 * 1024 };
	for (int i = 0; i < 32; i++) {
		bool ok;
		weft_spawn_opt(huge, NULL, &o);
		CHECK_EQ(weft_chan_take(placed, &ok, sizeof ok), (int)sizeof ok);
		if (ok)
			weft_sleep_until(WEFT_FOREVER); /* until the overflow ends the program */
	}
	fprintf(stderr, "the memory below every stack tried is taken\n");
	_exit(TEST_SKIPPED);
}

TEST(child_overflow_huge_frame)
{
	weft_run(overflows_hugely, NULL);
}

TEST(huge_frame_overflow_names_the_task_that_made_it)
{
	test_expect_abort("child_overflow_huge_frame", "(huge) overflowed its ");
}

/* A task that writes to another task's guard page, its own stack pointer in place, is named as
 * touching it: a wild pointer, not the other task's overflow. */
static weft_task *victim;

__attribute__((no_sanitize_address)) static void wild(void *arg)
{
	(void)arg;
	uint32_t gen;
	weft_task *v = task_record(victim, &gen);
	if (!v->stk.guarded) {
		fprintf(stderr, "the victim's stack has no guard page\n");
		_exit(TEST_SKIPPED);
	}
	volatile char *guard = (char *)v->stk.lo - sysconf(_SC_PAGESIZE);
	guard[100] = 1;
}

static int writes_wildly(void *arg)
{
	(void)arg;
	victim = weft_spawn_opt(park_forever, NULL, &(weft_spawn_opts){ .name = "victim" });
	weft_join(weft_spawn_opt(wild, NULL, &(weft_spawn_opts){ .name = "wild" }));
	return 0;
}

TEST(child_wild_pointer)
{
	weft_run(writes_wildly, NULL);
}

TEST(a_wild_write_to_a_guard_page_names_the_writer)
{
	test_expect_abort("child_wild_pointer", "(wild) touched the guard page below task ");
}
