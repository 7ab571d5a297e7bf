/*
 * bench/flowchain: 10^6 records through a chain of 5 nodes (bench/flow/flowchain.flux: the
 * source Gen, then A, B, C, D, each adding one to a long), no sleeps, on all workers. Reports
 * node runs (events) per second - 5 x 10^6 of them - and records through the whole chain per
 * second, the median of 5 runs. The target is 5 million events/s on 2 cores.
 */
#include <stdatomic.h>

#include "bench.h"
#include "flowchain_flow.h"

#define N 1000000

static long made;
static atomic_long sum;

int Gen(const Gen_in *in, Gen_out *out, Gen_atoms *atoms)
{
	(void)in;
	(void)atoms;
	if (made == N) { /* only the source touches made */
		weft_flow_stop(&flowchain_flow);
		weft_flow_drop(out);
		return 0;
	}
	out->v = made++;
	return 0;
}

int A(const A_in *in, A_out *out, A_atoms *atoms)
{
	(void)atoms;
	out->v = in->v + 1;
	return 0;
}

int B(const B_in *in, B_out *out, B_atoms *atoms)
{
	(void)atoms;
	out->v = in->v + 1;
	return 0;
}

int C(const C_in *in, C_out *out, C_atoms *atoms)
{
	(void)atoms;
	out->v = in->v + 1;
	return 0;
}

int D(const D_in *in, D_out *out, D_atoms *atoms)
{
	(void)out;
	(void)atoms;
	atomic_fetch_add_explicit(&sum, in->v + 1, memory_order_relaxed);
	return 0;
}

int main(void)
{
	bench_progress("flowchain: 10^6 records through a 5-node chain");
	double v[REPEAT];
	for (int r = 0; r < REPEAT; r++) {
		made = 0;
		atomic_store(&sum, 0);
		int64_t t = bench_now();
		if (weft_flow_run(&flowchain_flow, 0, NULL))
			return 1;
		double s = (double)(bench_now() - t) / 1e9;
		long want = (long)N * (N - 1) / 2 + 4L * N;
		if (atomic_load(&sum) != want) {
			fprintf(stderr, "flowchain: sum %ld, want %ld\n", atomic_load(&sum), want);
			return 1;
		}
		v[r] = 5.0 * N / s;
	}
	double m = bench_quantile(v, REPEAT, 0.5);
	char params[128];
	snprintf(params, sizeof params, "records/s=%.3gM target>=5M events/s", m / 5 / 1e6);
	bench_emit("flowchain", "5-node chain, 10^6 records", "events/s", m, params);
	return 0;
}
