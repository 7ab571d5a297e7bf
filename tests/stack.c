/*
 * Tests of the stack pool (src/stack.c) as a long-running program sees it: what the slots of
 * tasks that have ended cost, and that slots given back to the kernel come back whole.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
