/*
 * dwarves - Snow White and the dwarves on weft flows (dwarves.flux): the source
 * SnowWhite hands out an apple and naps 0.1 ms with plain usleep(); each apple goes to a
 * Dwarf, which naps ten times 0.1 ms. After DWARVES_APPLES apples (10,000) Snow White kills
 * the flow, and deinit prints the rate:
 *
 *   ran S seconds, dispatched D dwarves per second
 *
 * The program links libweft-shim.so, so the plain usleep() in a node run by a worker parks
 * the task, not the worker. Built twice: as dwarves.flux says, and with the Dwarf detached
 * (dwarves-detached.flux: it runs on the blocking pool, where usleep blocks a pool thread).
 * DWARF_WORK_US=n makes each Dwarf also spin n microseconds of CPU after each nap, which shows
 * the run-time's own overhead instead of the timers' precision.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "dwarves_flow.h"

static atomic_long dwarf_count;
static int apples_max = 10000;
static long work_ns;
static struct timespec start;

static double since(const struct timespec *t)
{
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	return (double)(now.tv_sec - t->tv_sec) + (double)(now.tv_nsec - t->tv_nsec) / 1e9;
}

static void spin_for(long ns)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	while (since(&t) * 1e9 < (double)ns)
		;
}

int SnowWhite(const SnowWhite_in *in, SnowWhite_out *out, SnowWhite_atoms *atoms)
{
	(void)in;
	(void)atoms;
	static int apples; /* only the source touches it, one run at a time */
	out->apple_id = apples++;
	if (apples > apples_max)
		weft_flow_kill(&dwarves_flow);
	usleep(100);
	return 0;
}

int Dwarf(const Dwarf_in *in, Dwarf_out *out, Dwarf_atoms *atoms)
{
	(void)in;
	(void)out;
	(void)atoms;
	atomic_fetch_add(&dwarf_count, 1);
	for (int i = 0; i < 10; i++) {
		usleep(100);
		if (work_ns)
			spin_for(work_ns);
	}
	return 0;
}

void init(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	const char *e = getenv("DWARVES_APPLES");
	if (e && atoi(e) > 0)
		apples_max = atoi(e);
	e = getenv("DWARF_WORK_US");
	if (e)
		work_ns = atol(e) * 1000;
	clock_gettime(CLOCK_MONOTONIC, &start);
}

void deinit(void)
{
	double s = since(&start);
	printf("ran %f seconds, dispatched %f dwarves per second\n", s, (double)dwarf_count / s);
}

int main(int argc, char **argv)
{
	int r = weft_flow_run(&dwarves_flow, argc, argv);
	if (r) {
		fprintf(stderr, "dwarves: weft_flow_run: %d\n", r);
		return 1;
	}
	return 0;
}
