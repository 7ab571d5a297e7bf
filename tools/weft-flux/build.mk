# weft-flux, the .flux compiler, and everything built from .flux files: the dwarves example,
# the flow tests and the flow benchmarks.
#
# The make rule users copy (docs/flows.md):  %_flow.c %_flow.h: %.flux build/bin/weft-flux
#
# FLUX_SRC is the compiler without its main(): driver.c (the command line, one compile),
# arena.c, lex.c, parse.c, check.c, gen.c, diag.c. weft-flux.c holds main() alone, so that
# tests/flux links FLUX_SRC and calls flux_main itself.
FLUX_SRC  := $(filter-out tools/weft-flux/weft-flux.c,$(wildcard tools/weft-flux/*.c))
FLUX_HDRS := tools/weft-flux/flux.h

$(B)/bin/weft-flux: tools/weft-flux/weft-flux.c $(FLUX_SRC) $(FLUX_HDRS) | $(B)/bin
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ tools/weft-flux/weft-flux.c $(FLUX_SRC)

# The compiler that generates code runs on the build machine: in a cross build, a native one.
ifeq ($(ARCH),)
FLUXC := $(B)/bin/weft-flux
else
FLUXC := $(B)/host/weft-flux
$(FLUXC): tools/weft-flux/weft-flux.c $(FLUX_SRC) $(FLUX_HDRS)
	@mkdir -p $(@D)
	cc -O2 -std=gnu11 -o $@ tools/weft-flux/weft-flux.c $(FLUX_SRC)
endif

ALL += $(B)/bin/weft-flux $(B)/bin/dwarves $(B)/bin/dwarves-detached

# Generated flows live in $(B)/gen/<name>/ (one pair of files per target: &: groups them).

# ---- the dwarves (examples/dwarves): linked to libweft.so and libweft-shim.so, so that the
# nodes' plain usleep() calls become task sleeps
$(B)/gen/dwarves/dwarves_flow.c $(B)/gen/dwarves/dwarves_flow.h &: examples/dwarves/dwarves.flux $(FLUXC)
	@mkdir -p $(@D)
	$(FLUXC) -o $(@D) $<
$(B)/gen/dwarves-detached/dwarves_flow.c $(B)/gen/dwarves-detached/dwarves_flow.h &: examples/dwarves/dwarves-detached.flux $(FLUXC)
	@mkdir -p $(@D)
	$(FLUXC) -n dwarves -o $(@D) $<

DWARVES_LINK = -L$(B) -Wl,--no-as-needed -lweft-shim -lweft -Wl,-rpath,'$$ORIGIN/..'
$(B)/bin/dwarves: examples/dwarves/dwarves.c $(B)/gen/dwarves/dwarves_flow.c $(B)/gen/dwarves/dwarves_flow.h $(B)/libweft.so $(B)/libweft-shim.so | $(B)/bin
	$(CC) $(CFLAGS) -I$(B)/gen/dwarves $(LDFLAGS) -o $@ examples/dwarves/dwarves.c $(B)/gen/dwarves/dwarves_flow.c $(DWARVES_LINK) $(LDLIBS)
$(B)/bin/dwarves-detached: examples/dwarves/dwarves.c $(B)/gen/dwarves-detached/dwarves_flow.c $(B)/gen/dwarves-detached/dwarves_flow.h $(B)/libweft.so $(B)/libweft-shim.so | $(B)/bin
	$(CC) $(CFLAGS) -I$(B)/gen/dwarves-detached $(LDFLAGS) -o $@ examples/dwarves/dwarves.c $(B)/gen/dwarves-detached/dwarves_flow.c $(DWARVES_LINK) $(LDLIBS)

# ---- tests: the compiler in-process (tests/flux.c), the run-time on tests/flux/rt_*.flux
$(B)/tests/flux: tests/flux.c $(FLUX_SRC) $(FLUX_HDRS) tests/test.c tests/test.h $(B)/libweft.a | $(B)/tests
	$(CC) $(CFLAGS) -Itests -Itools/weft-flux $(LDFLAGS) -o $@ tests/flux.c $(FLUX_SRC) tests/test.c $(B)/libweft.a $(LDLIBS)

FLOW_TEST_FLUX := $(wildcard tests/flux/rt_*.flux)
FLOW_TEST_GEN  := $(FLOW_TEST_FLUX:tests/flux/%.flux=$(B)/gen/tests/%_flow.c)
$(B)/gen/tests/%_flow.c $(B)/gen/tests/%_flow.h: tests/flux/%.flux $(FLUXC)
	@mkdir -p $(@D)
	$(FLUXC) -o $(@D) $<
# tests/flow also runs the dwarves programs
$(B)/tests/flow: tests/flow.c $(FLOW_TEST_GEN) $(FLOW_TEST_GEN:.c=.h) tests/test.c tests/test.h $(B)/libweft.a | $(B)/tests $(B)/bin/dwarves $(B)/bin/dwarves-detached
	$(CC) $(CFLAGS) -Itests -I$(B)/gen/tests $(LDFLAGS) -o $@ tests/flow.c $(FLOW_TEST_GEN) tests/test.c $(B)/libweft.a $(LDLIBS)

# ---- benchmarks
$(B)/gen/flowchain/flowchain_flow.c $(B)/gen/flowchain/flowchain_flow.h &: bench/flow/flowchain.flux $(FLUXC)
	@mkdir -p $(@D)
	$(FLUXC) -o $(@D) $<
$(B)/bench/flowchain: bench/flowchain.c $(B)/gen/flowchain/flowchain_flow.c $(B)/gen/flowchain/flowchain_flow.h bench/bench.h $(B)/libweft.a | $(B)/bench
	$(CC) $(CFLAGS) -Ibench -I$(B)/gen/flowchain $(LDFLAGS) -o $@ bench/flowchain.c $(B)/gen/flowchain/flowchain_flow.c $(B)/libweft.a $(LDLIBS)
$(B)/bench/dwarves: bench/dwarves.c bench/bench.h $(B)/bin/dwarves $(B)/bin/dwarves-detached | $(B)/bench
	$(CC) $(CFLAGS) -Ibench $(LDFLAGS) -o $@ bench/dwarves.c $(LDLIBS)
