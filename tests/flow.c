/*
 * Tests of the flow run-time (src/flow.c) on the flows in tests/flux/rt_*.flux: routing by
 * conditions, fan-out, error handlers, splay and abstract sequences, every guard kind under
 * concurrency, the global guard order, stop versus kill with events in flight, and detached
 * nodes that block without slowing the others.
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "rt_detached_flow.h"
#include "rt_detsplay_flow.h"
#include "rt_guards_flow.h"
#include "rt_keys_flow.h"
#include "rt_route_flow.h"
#include "rt_splay_flow.h"
#include "rt_stop_flow.h"
#include "test.h"

static void nap(int64_t ns)
{
	weft_sleep_until(weft_now() + ns);
}

/* ---- routing ----------------------------------------------------------------------------- */

#define RN 200
static int rgen_next;
static atomic_int seen_even[RN], seen_small[RN], seen_o1[RN], seen_o2[RN], seen_err[RN];

bool isEven(int n)
{
	return n % 2 == 0;
}

bool isSmall(int n)
{
	return n < 50;
}

int RGen(const RGen_in *in, RGen_out *out, RGen_atoms *a)
{
	(void)in, (void)a;
	if (rgen_next == RN) {
		weft_flow_stop(&rt_route_flow);
		weft_flow_drop(out);
		return 0;
	}
	out->n = rgen_next++;
	out->tag = 7;
	return 0;
}

int Even(const Even_in *in, Even_out *out, Even_atoms *a)
{
	(void)out, (void)a;
	atomic_fetch_add(&seen_even[in->n], 1);
	return in->n % 10 == 0 ? 42 : 0; /* errors go to EvenErr */
}

int SmallOdd(const SmallOdd_in *in, SmallOdd_out *out, SmallOdd_atoms *a)
{
	(void)out, (void)a;
	atomic_fetch_add(&seen_small[in->n], 1);
	return 0;
}

int Odd1(const Odd1_in *in, Odd1_out *out, Odd1_atoms *a)
{
	(void)out, (void)a;
	atomic_fetch_add(&seen_o1[in->n], 1);
	return 0;
}

int Odd2(const Odd2_in *in, Odd2_out *out, Odd2_atoms *a)
{
	(void)out, (void)a;
	atomic_fetch_add(&seen_o2[in->n], 1);
	return 0;
}

int EvenErr(const EvenErr_in *in, EvenErr_out *out, EvenErr_atoms *a)
{
	(void)out, (void)a;
	if (in->err == 42 && in->tag == 7)
		atomic_fetch_add(&seen_err[in->n], 1);
	return 0;
}

TEST(routing_conditions_fanout_errors)
{
	CHECK_EQ(weft_flow_run(&rt_route_flow, 0, NULL), 0);
	for (int n = 0; n < RN; n++) {
		bool even = n % 2 == 0, small = n < 50;
		CHECK_EQ(seen_even[n], even);                    /* first rule wins */
		CHECK_EQ(seen_small[n], !even && small);         /* second: [isSmall, *] */
		CHECK_EQ(seen_o1[n], !even && !small);           /* third: fan-out to both */
		CHECK_EQ(seen_o2[n], !even && !small);
		CHECK_EQ(seen_err[n], even && n % 10 == 0);      /* handler got input + err */
	}
	weft_flow_stats s[16];
	int k = weft_flow_stats_get(&rt_route_flow, s, 16);
	CHECK(k > 0);
	for (int i = 0; i < k; i++) {
		if (!strcmp(s[i].name, "Even")) {
			CHECK_EQ(s[i].events, RN / 2);
			CHECK_EQ(s[i].errors, RN / 10);
		}
		if (!strcmp(s[i].name, "RGen"))
			CHECK_EQ(s[i].events, RN + 1);
	}
}

/* ---- splay, initial, abstract sequence, end without sources -------------------------------- */

static atomic_int collected[100], collect_sum;

int Start(const Start_in *in, Start_out *out, Start_atoms *a)
{
	(void)in, (void)a;
	for (int i = 0; i < 99; i++) {
		out->i = i;
		CHECK_EQ(weft_flow_emit(out), 0);
	}
	out->i = 99; /* the last one goes out on return */
	return 0;
}

int Double(const Double_in *in, Double_out *out, Double_atoms *a)
{
	(void)a;
	out->i = in->i * 2;
	return 0;
}

int Collect(const Collect_in *in, Collect_out *out, Collect_atoms *a)
{
	(void)out, (void)a;
	CHECK(in->i % 2 == 0 && in->i < 200);
	atomic_fetch_add(&collected[in->i / 2], 1);
	atomic_fetch_add(&collect_sum, in->i);
	return 0;
}

TEST(splay_initial_sequence)
{
	CHECK_EQ(weft_flow_run(&rt_splay_flow, 0, NULL), 0); /* returns once no event is left */
	for (int i = 0; i < 100; i++)
		CHECK_EQ(collected[i], 1);
	CHECK_EQ(collect_sum, 99 * 100);
}

/* ---- guards ------------------------------------------------------------------------------ */

#define GN (SLOW ? 300 : 1000)
#define RO 20 /* the first records only go to readers, all of key RO_KEY */
#define RO_KEY 100
#define PO 10 /* the next ones only go to the pool's users, as key PO_KEY */
#define PO_KEY 200
#define KEYS 4
#define POOL 3
static int ggen_next;
static int cells[KEYS], tables[KEYS], conns[POOL], cfg, table_ro;
static atomic_int cell_holders[KEYS], readers[KEYS], writers[KEYS], conn_used[POOL];
static atomic_int max_readers, pool_max, pool_now, violations, ran;

int GGen(const GGen_in *in, GGen_out *out, GGen_atoms *a)
{
	(void)in, (void)a;
	if (ggen_next == GN) {
		weft_flow_stop(&rt_guards_flow);
		weft_flow_drop(out);
		return 0;
	}
	out->k = ggen_next < RO ? RO_KEY : ggen_next < RO + PO ? PO_KEY : ggen_next % KEYS;
	ggen_next++;
	return 0;
}

bool readOnly(int k)
{
	return k == RO_KEY;
}

bool poolOnly(int k)
{
	return k == PO_KEY;
}

static void hold_cell(int k, int **cell)
{
	if (*cell != &cells[k] || atomic_fetch_add(&cell_holders[k], 1) != 0)
		atomic_fetch_add(&violations, 1);
	nap(20000);
	atomic_fetch_sub(&cell_holders[k], 1);
}

static void hold_write(int k, int **t)
{
	if (*t != &tables[k] || atomic_fetch_add(&writers[k], 1) != 0 || atomic_load(&readers[k]))
		atomic_fetch_add(&violations, 1);
	nap(20000);
	atomic_fetch_sub(&writers[k], 1);
}

int Ex(const Ex_in *in, Ex_out *out, Ex_atoms *a)
{
	(void)out;
	hold_cell(in->k, a->cell);
	atomic_fetch_add(&ran, 1);
	return 0;
}

static atomic_int ro_readers, ro_started;

static void read_table(int k, int **t)
{
	if (k == RO_KEY) { /* only readers here: they must overlap */
		if (*t != &table_ro)
			atomic_fetch_add(&violations, 1);
		int r = atomic_fetch_add(&ro_readers, 1) + 1;
		for (int m = atomic_load(&max_readers); r > m;)
			if (atomic_compare_exchange_weak(&max_readers, &m, r))
				break;
		/* the first two wait for each other: a fixed nap raced with dispatch (under TSan) */
		if (atomic_fetch_add(&ro_started, 1) < 2)
			test_await(&max_readers, 2);
		nap(2000000);
		atomic_fetch_sub(&ro_readers, 1);
		return;
	}
	if (*t != &tables[k] || atomic_load(&writers[k]))
		atomic_fetch_add(&violations, 1);
	atomic_fetch_add(&readers[k], 1);
	nap(50000);
	atomic_fetch_sub(&readers[k], 1);
}

int Rd(const Rd_in *in, Rd_out *out, Rd_atoms *a)
{
	(void)out;
	read_table(in->k, a->t);
	atomic_fetch_add(&ran, 1);
	return 0;
}

int Rd2(const Rd2_in *in, Rd2_out *out, Rd2_atoms *a)
{
	(void)out;
	read_table(in->k, a->t);
	atomic_fetch_add(&ran, 1);
	return 0;
}

int Wr(const Wr_in *in, Wr_out *out, Wr_atoms *a)
{
	(void)out;
	hold_write(in->k, a->t);
	atomic_fetch_add(&ran, 1);
	return 0;
}

/* The first POOL of PO_KEY's holders hold until all of them hold at once: a fixed nap made
 * that a race with dispatch, which under TSan, with fresh stacks to fault in, it lost (2 ms
 * naps: 1 or 2 holders at most). They count each other, not every holder: counting pool_now
 * let the first pass beside two other keys' holders, and the last two could then wait for a
 * third holder after every other event had run. */
static atomic_int po_started, po_now;

int Pl(const Pl_in *in, Pl_out *out, Pl_atoms *a)
{
	(void)out;
	int *c = *a->c;
	if (c < conns || c >= conns + POOL || *a->cfg != &cfg)
		atomic_fetch_add(&violations, 1);
	else if (atomic_fetch_add(&conn_used[c - conns], 1) != 0)
		atomic_fetch_add(&violations, 1); /* one item, two holders */
	int now = atomic_fetch_add(&pool_now, 1) + 1;
	for (int m = atomic_load(&pool_max); now > m;)
		if (atomic_compare_exchange_weak(&pool_max, &m, now))
			break;
	if (in->k == PO_KEY && atomic_fetch_add(&po_started, 1) < POOL) {
		atomic_fetch_add(&po_now, 1);
		test_await(&po_now, POOL);
	}
	nap(30000);
	atomic_fetch_sub(&pool_now, 1);
	if (c >= conns && c < conns + POOL)
		atomic_fetch_sub(&conn_used[c - conns], 1);
	atomic_fetch_add(&ran, 1);
	return 0;
}

int CellFirst(const CellFirst_in *in, CellFirst_out *out, CellFirst_atoms *a)
{
	(void)out;
	hold_cell(in->k, a->c);
	hold_write(in->k, a->t);
	atomic_fetch_add(&ran, 1);
	return 0;
}

int TableFirst(const TableFirst_in *in, TableFirst_out *out, TableFirst_atoms *a)
{
	(void)out;
	hold_write(in->k, a->t);
	hold_cell(in->k, a->c);
	atomic_fetch_add(&ran, 1);
	return 0;
}

static void guard_setup(void)
{
	for (int k = 0; k < KEYS; k++) {
		CHECK_EQ(Cell_set(k, &cells[k]), 0);
		CHECK_EQ(Table_set(k, &tables[k]), 0);
	}
	CHECK_EQ(Table_set(RO_KEY, &table_ro), 0);
	for (int i = 0; i < POOL; i++)
		CHECK_EQ(Conn_add(&conns[i]), 0);
	CHECK_EQ(Cfg_set(&cfg), 0);
}

TEST(guards_exclusive_readwrite_pool_free)
{
	guard_setup();
	CHECK_EQ(weft_flow_run(&rt_guards_flow, 0, NULL), 0);
	CHECK_EQ(violations, 0);
	CHECK_EQ(ran, 2 * RO + PO + 6 * (GN - RO - PO)); /* no deadlock: CellFirst vs TableFirst */
	CHECK(max_readers > 1); /* readers shared */
	CHECK_EQ(pool_max, POOL); /* holders overlapped, never more than the items */
}

/* `precedence Table < Cell`: both nodes take Table first, whatever their input order says. */
TEST(guards_global_order)
{
	const weft_flow *f = &rt_guards_flow;
	int found = 0;
	for (int i = 0; i < f->nnodes; i++) {
		const weft_flow_node *n = &f->nodes[i];
		if (strcmp(n->name, "CellFirst") && strcmp(n->name, "TableFirst"))
			continue;
		CHECK_EQ(n->nuses, 2);
		CHECK(!strcmp(f->guards[n->uses[0].guard].name, "Table"));
		CHECK(!strcmp(f->guards[n->uses[1].guard].name, "Cell"));
		found++;
	}
	CHECK_EQ(found, 2);
}

/* ---- one guard, two keys ------------------------------------------------------------------ */

#define KN (SLOW ? 200 : 600)
static int kgen_next, pair_values[4];
static atomic_int pair_holders[4], pair_bad, pair_ran;

int KGen(const KGen_in *in, KGen_out *out, KGen_atoms *a)
{
	(void)in, (void)a;
	if (kgen_next == KN) {
		weft_flow_stop(&rt_keys_flow);
		weft_flow_drop(out);
		return 0;
	}
	static const int pairs[3][2] = { { 1, 2 }, { 2, 1 }, { 3, 3 } };
	out->a = pairs[kgen_next % 3][0];
	out->b = pairs[kgen_next % 3][1];
	kgen_next++;
	return 0;
}

int Two(const Two_in *in, Two_out *out, Two_atoms *a)
{
	(void)out;
	if (*a->x != &pair_values[in->a] || *a->y != &pair_values[in->b])
		atomic_fetch_add(&pair_bad, 1);
	atomic_fetch_add(&pair_holders[in->a], 1);
	if (in->b != in->a)
		atomic_fetch_add(&pair_holders[in->b], 1);
	if (atomic_load(&pair_holders[in->a]) != 1 || atomic_load(&pair_holders[in->b]) != 1)
		atomic_fetch_add(&pair_bad, 1); /* a key held twice */
	nap(20000);
	atomic_fetch_sub(&pair_holders[in->a], 1);
	if (in->b != in->a)
		atomic_fetch_sub(&pair_holders[in->b], 1);
	atomic_fetch_add(&pair_ran, 1);
	return 0;
}

TEST(guard_taken_twice_ordered_by_key)
{
	for (int k = 1; k < 4; k++)
		CHECK_EQ(Pair_set(k, &pair_values[k]), 0);
	CHECK_EQ(weft_flow_run(&rt_keys_flow, 0, NULL), 0); /* no deadlock */
	CHECK_EQ(pair_ran, KN);
	CHECK_EQ(pair_bad, 0);
}

/* ---- stop and kill ----------------------------------------------------------------------- */

#define SN 60
#define SLOW_MS (SLOW ? 20 : 4) /* each Slow event: under TSan, tearing down the dropped
				* events of a kill took 112 ms, and 4 ms events drained as fast */
static atomic_int sgen_next;
static atomic_int slow_started, slow_done, one_holders, one_bad;
static int one_value;

int SGen(const SGen_in *in, SGen_out *out, SGen_atoms *a)
{
	(void)in, (void)a;
	if (sgen_next == SN) { /* then idle until stopped */
		weft_flow_drop(out);
		nap(1000000);
		return 0;
	}
	out->i = sgen_next++;
	return 0;
}

int Slow(const Slow_in *in, Slow_out *out, Slow_atoms *a)
{
	(void)in, (void)out;
	if (*a->one != &one_value || atomic_fetch_add(&one_holders, 1))
		atomic_fetch_add(&one_bad, 1);
	atomic_fetch_add(&slow_started, 1);
	nap(SLOW_MS * 1000000);
	atomic_fetch_sub(&one_holders, 1);
	atomic_fetch_add(&slow_done, 1);
	return 0;
}

static atomic_int stop_kind;
static _Atomic int64_t stopped_at;
static atomic_int slow_started_at_stop;

static void stop_later(void *arg)
{
	(void)arg;
	while (atomic_load(&slow_started) < 3 || atomic_load(&sgen_next) < SN)
		nap(1000000); /* all emitted, most still queued on the guard */
	atomic_store(&slow_started_at_stop, atomic_load(&slow_started));
	atomic_store(&stopped_at, weft_now());
	if (atomic_load(&stop_kind))
		weft_flow_kill(&rt_stop_flow);
	else
		weft_flow_stop(&rt_stop_flow);
}

static int stop_main(void *arg)
{
	(void)arg;
	CHECK_EQ(One_set(&one_value), 0);
	CHECK(weft_spawn_opt(stop_later, NULL, &(weft_spawn_opts){ .detached = 1 }));
	CHECK_EQ(weft_flow_run(&rt_stop_flow, 0, NULL), 0);
	return (int)((weft_now() - atomic_load(&stopped_at)) / 1000000); /* ms after stop/kill */
}

TEST(stop_drains_events_in_flight)
{
	atomic_store(&stop_kind, 0);
	int ms = weft_run(stop_main, NULL);
	CHECK_EQ(one_bad, 0);
	CHECK_EQ(slow_started, SN); /* every emitted event ran, one at a time */
	CHECK_EQ(slow_done, SN);
	/* the events still queued at stop ran one after the other, SLOW_MS each */
	CHECK(ms >= SLOW_MS * (SN - slow_started_at_stop - 1));
}

TEST(kill_drops_events_not_started)
{
	atomic_store(&stop_kind, 1);
	int ms = weft_run(stop_main, NULL);
	CHECK_EQ(one_bad, 0);
	CHECK(slow_started >= 3);
	CHECK(slow_started < SN);             /* the queued ones were dropped */
	CHECK_EQ(slow_done, slow_started);    /* the running one finished its call */
	fprintf(stderr, "done %d ms after the kill, %d of %d events ran\n", ms, (int)slow_started,
		SN);
	/* far sooner than draining the events still queued would have taken */
	CHECK(SN - slow_started_at_stop >= 10);
	CHECK(ms < SLOW_MS * (SN - slow_started_at_stop)); /* draining: SLOW_MS each */
}

/* ---- detached ---------------------------------------------------------------------------- */

#define DN 200
static int dgen_next;
static atomic_int quick_done, block_done, blocking, quick_while_blocked;
static atomic_llong quick_last;

bool isFourth(int i)
{
	return i < 4 * 40 && i % 40 == 0; /* 4 blocking events, early */
}

int DGen(const DGen_in *in, DGen_out *out, DGen_atoms *a)
{
	(void)in, (void)a;
	if (dgen_next == DN) {
		weft_flow_stop(&rt_detached_flow);
		weft_flow_drop(out);
		return 0;
	}
	out->i = dgen_next++;
	nap(500000); /* 0.5 ms between events: 100 ms in all */
	return 0;
}

int Block(const Block_in *in, Block_out *out, Block_atoms *a)
{
	(void)in, (void)out, (void)a;
	CHECK(weft_self() == NULL); /* on a pool thread, not a worker */
	atomic_fetch_add(&blocking, 1);
	usleep(100000);             /* blocks this thread, and only it */
	atomic_fetch_sub(&blocking, 1);
	atomic_fetch_add(&block_done, 1);
	return 0;
}

int Quick(const Quick_in *in, Quick_out *out, Quick_atoms *a)
{
	(void)in, (void)out, (void)a;
	atomic_fetch_add(&quick_done, 1);
	atomic_fetch_add(&quick_while_blocked, atomic_load(&blocking) > 0);
	atomic_store(&quick_last, weft_now());
	return 0;
}

TEST(detached_blocking_does_not_slow_others)
{
	setenv("WEFT_WORKERS", "1", 1); /* one worker: a block on it would stall everything */
	int64_t t = weft_now();
	CHECK_EQ(weft_flow_run(&rt_detached_flow, 0, NULL), 0);
	CHECK_EQ(block_done, 4);
	CHECK_EQ(quick_done, DN - 4);
	/* Quick events ran while blocks were blocking: the source makes one every 0.5 ms, and
	 * the four 100 ms blocks overlap most of its 100 ms. That the blocks ran on pool threads,
	 * not on the only worker, Block checks itself (a block on the worker would stall the
	 * others until the monitor handed its queue to a spare, 10 ms on). Counted rather than
	 * timed, so that a loaded machine, which slows everything, does not fail the test (it
	 * did: 426 ms against a 350 ms bound, under TSan beside a benchmark). */
	int64_t quick_ms = (quick_last - t) / 1000000;
	fprintf(stderr, "quick events done after %lld ms, %d of them while a block blocked\n",
		(long long)quick_ms, atomic_load(&quick_while_blocked));
	CHECK(atomic_load(&quick_while_blocked) >= 10);
}

/* ---- the dwarves example, end to end ------------------------------------------------------ */

/* Run build/bin/<prog> (beside this binary's directory) on 300 apples: it must print its
 * rate, and the counters must show the apples eaten. */
static void dwarves(const char *prog)
{
	test_skip_emulated();
#if defined(__SANITIZE_THREAD__)
	/* a TSan program linked to libweft-shim.so hangs as it starts: the shim's fcntl looks
	 * libc's up with dlsym, whose error path frees memory TSan did not allocate */
	test_skip("a TSan program linked to libweft-shim.so cannot start (dlsym in the shim)");
#endif
	char dir[1024], cmd[1400], out[4096];
	snprintf(dir, sizeof dir, "%s", test_argv0);
	char *slash = strrchr(dir, '/');
	if (slash)
		*slash = 0;
	snprintf(cmd, sizeof cmd, "DWARVES_APPLES=300 WEFT_FLOW_STATS=1 '%s/../bin/%s' 2>&1", dir,
		 prog);
	FILE *p = popen(cmd, "r");
	CHECK(p);
	size_t n = fread(out, 1, sizeof out - 1, p);
	out[n] = 0;
	CHECK_EQ(pclose(p), 0);
	fputs(out, stderr);
	double secs = 0, rate = 0;
	char *ran = strstr(out, "ran ");
	CHECK(ran && sscanf(ran, "ran %lf seconds, dispatched %lf dwarves per second", &secs,
			    &rate) == 2);
	CHECK(rate > 0);
	char *d = strstr(out, "\nDwarf ");
	long events = 0;
	CHECK(d && sscanf(d, "\nDwarf %ld", &events) == 1);
	/* Snow White kills the flow with the last apples not yet eaten: those are dropped */
	CHECK(events >= 290 && events <= 300);
}

TEST(dwarves_example)
{
	dwarves("dwarves");
}

TEST(dwarves_detached_example)
{
	dwarves("dwarves-detached");
}

/* ---- splay from a detached node ---------------------------------------------------------- */

static atomic_int dcollected[20];

int DStart(const DStart_in *in, DStart_out *out, DStart_atoms *a)
{
	(void)in, (void)a;
	out->n = 20;
	return 0;
}

int DSplay(const DSplay_in *in, DSplay_out *out, DSplay_atoms *a)
{
	(void)a;
	CHECK(weft_self() == NULL); /* a pool thread */
	for (int i = 0; i < in->n - 1; i++) {
		out->i = i;
		CHECK_EQ(weft_flow_emit(out), 0);
	}
	out->i = in->n - 1;
	return 0;
}

int DCollect(const DCollect_in *in, DCollect_out *out, DCollect_atoms *a)
{
	(void)out, (void)a;
	CHECK(in->i >= 0 && in->i < 20);
	atomic_fetch_add(&dcollected[in->i], 1);
	return 0;
}

TEST(detached_splay)
{
	CHECK_EQ(weft_flow_run(&rt_detsplay_flow, 0, NULL), 0);
	for (int i = 0; i < 20; i++)
		CHECK_EQ(dcollected[i], 1);
}
