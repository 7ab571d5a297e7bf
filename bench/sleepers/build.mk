# bench/sleepers: 10^5 tasks sleeping through the shim (sleepers.c), against Go and against
# sleepers-floor (floor.c), the least a runtime with a stack per task can do for them.
BENCHES += $(B)/bench/sleepers
ALL     += $(B)/bin/sleepers-floor

# It links to libweft.so, as programs that use the shim must, and runs the floor from $(B)/bin.
$(B)/bench/sleepers: bench/sleepers/sleepers.c bench/bench.h $(B)/libweft.so $(B)/libweft-shim.so $(B)/bin/sleepers-floor | $(B)/bench
	$(CC) $(CFLAGS) -Ibench $(LDFLAGS) -o $@ $< -L$(B) -lweft -Wl,-rpath,'$$ORIGIN/..' $(LDLIBS)
# The floor uses weft's context switch (src/context.h), which only the static library exports.
$(B)/bin/sleepers-floor: bench/sleepers/floor.c bench/bench.h $(B)/libweft.a | $(B)/bin
	$(CC) $(CFLAGS) -Ibench $(LDFLAGS) -o $@ $< $(B)/libweft.a $(LDLIBS)
