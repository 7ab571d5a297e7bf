/*
 * bench.h - helpers shared by the benchmark programs. Each program prints one JSON object per
 * measurement on stdout:
 *   {"bench":"switch","name":"weft yield","unit":"ns/switch","value":3.1,"params":"workers=1"}
 * and bench/run.sh turns them into the table. Figures are medians of REPEAT runs.
 */
#ifndef WEFT_BENCH_H
#define WEFT_BENCH_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define REPEAT 5

static inline int64_t bench_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline void bench_emit(const char *bench, const char *name, const char *unit,
			      double value, const char *params)
{
	printf("{\"bench\":\"%s\",\"name\":\"%s\",\"unit\":\"%s\",\"value\":%.6g,\"params\":\"%s\"}\n",
	       bench, name, unit, value, params ? params : "");
	fflush(stdout);
}

static int bench_cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* The q-quantile (0..1) of n values; sorts them. */
static inline double bench_quantile(double *v, int n, double q)
{
	qsort(v, (size_t)n, sizeof *v, bench_cmp);
	int i = (int)(q * (n - 1) + 0.5);
	return v[i];
}

static inline void bench_progress(const char *what)
{
	fprintf(stderr, "  %s...\n", what);
}
#endif
