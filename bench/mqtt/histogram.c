/*
 * histogram.c - latencies in a log-linear histogram: values under 64 ns exactly, above that
 * 64 sub-buckets per power of two (about 1.1% precision) in 4096 buckets of counts; each worker
 * fills its own, and the report adds them up and reads the quantiles off the sum.
 */
#define _GNU_SOURCE
#include <math.h>

#include "loadgen.h"

int bucket_of(uint64_t ns)
{
	if (ns < SUB)
		return (int)ns;
	int e = 63 - __builtin_clzll(ns); /* ns in [2^e, 2^(e+1)) */
	int shift = e - 6;
	return (e - 5) * SUB + (int)((ns >> shift) - SUB);
}

static double bucket_value(int b)
{
	if (b < SUB)
		return b;
	int e = b / SUB + 5, sub = b % SUB;
	return ldexp(SUB + sub + 0.5, e - 6);
}

double quantile(const uint64_t *h, uint64_t total, double q)
{
	if (!total)
		return NAN;
	uint64_t want = (uint64_t)ceil(q * (double)total), acc = 0;
	if (want < 1)
		want = 1;
	for (int b = 0; b < HBUCKETS; b++)
		if ((acc += h[b]) >= want)
			return bucket_value(b);
	return NAN;
}
