# weft - one Makefile builds everything. See README.md.
#
#   make                      libraries, pkg-config file, tools, examples, benchmarks
#   make test                 build and run every test
#   make test SANITIZE=address   ... under ASan+UBSan (build-asan/)
#   make test SANITIZE=thread    ... under TSan (build-tsan/)
#   make test ARCH=aarch64       ... cross-compiled, run under qemu-user (build-aarch64/)
#   make bench                run the benchmarks and print the table
#   make install PREFIX=/usr/local

PREFIX   ?= /usr/local
SANITIZE ?=
ARCH     ?=
WERROR   ?=
FRAME_POINTERS ?=

CC       ?= cc
CFLAGS   ?= -O2 -g
CFLAGS   += -std=gnu11 -Wall -Wextra -fPIC -pthread -Iinclude -iquote src
# A frame bigger than a page touches each page on the way down, so an overflow faults on the
# task's own guard page instead of landing in the stack below (another task's). weft.h and the
# README recommend it to programs (not forced through weft.pc: not every compiler has it); for
# loops and small frames it costs nothing.
CFLAGS   += -fstack-clash-protection
LDLIBS   += -pthread
ifeq ($(CI),true)
WERROR   := 1
endif
ifneq ($(WERROR),)
CFLAGS   += -Werror
endif

B        := build
RUNNER   :=
# No frame pointers by default (gcc's default at -O2): a park and its wake-up go through half a
# dozen functions, and the push, move and pop of rbp in each are a measurable share of the
# one-million-packet run (docs/design.md). The sanitizer builds keep them, for their fast unwinder; so does
# FRAME_POINTERS=1, for `perf record -g` (or use `perf record --call-graph dwarf`). With them,
# the inlined switch must save rbp itself (src/context.h): WEFT_FRAME_POINTERS says so.
ifneq ($(SANITIZE)$(FRAME_POINTERS),)
CFLAGS   += -fno-omit-frame-pointer
endif
ifneq ($(filter -fno-omit-frame-pointer,$(CFLAGS)),)
CFLAGS   += -DWEFT_FRAME_POINTERS
endif
ifeq ($(SANITIZE),address)
B        := build-asan
CFLAGS   += -fsanitize=address,undefined -fno-sanitize-recover=undefined
LDFLAGS  += -fsanitize=address,undefined
else ifeq ($(SANITIZE),thread)
B        := build-tsan
CFLAGS   += -fsanitize=thread
LDFLAGS  += -fsanitize=thread
endif
ifeq ($(ARCH),aarch64)
B        := build-aarch64
CC       := aarch64-linux-gnu-gcc
RUNNER   := qemu-aarch64 -L /usr/aarch64-linux-gnu
endif

LIB_SRC  := $(filter-out src/shim.c,$(wildcard src/*.c))
LIB_ASM  := $(wildcard src/*.S)
LIB_OBJ  := $(LIB_SRC:src/%.c=$(B)/obj/%.o) $(LIB_ASM:src/%.S=$(B)/obj/%.o)
HDRS     := include/weft.h $(wildcard src/*.h)

TESTS    := $(patsubst tests/%.c,$(B)/tests/%,$(filter-out tests/test.c,$(wildcard tests/*.c)))
BENCHES  := $(patsubst bench/%.c,$(B)/bench/%,$(wildcard bench/*.c))
EXAMPLES := $(patsubst examples/%.c,$(B)/bin/%,$(wildcard examples/*.c))
# tests/house.sh: rules of the source tree (file sizes, the repository standing alone). A script,
# so not in cross builds: qemu-user cannot run it.
ifeq ($(ARCH),)
TESTS    += $(B)/tests/house
endif

# Larger parts (the .flux compiler, the MQTT broker) keep their rules beside their sources;
# each fragment adds its programs to ALL, its test binaries to TESTS, benchmarks to BENCHES and
# the make targets that run its fuzzers for $(FUZZ_TIME) seconds to FUZZ.
.DEFAULT_GOAL := all
ALL      :=
FUZZ     :=
FUZZ_TIME ?= 60
include $(wildcard tools/*/*.mk apps/*/*.mk bench/*/*.mk tests/*/*.mk)

all: $(B)/libweft.a $(B)/libweft.so $(B)/libweft-shim.so $(B)/weft.pc $(EXAMPLES) $(BENCHES) $(TESTS) $(ALL)
ifeq ($(B),build)
all: weft.pc
endif

# The library exports include/weft.h and nothing else (src/poll.h's SHIM_API aside): its
# internal names can then neither clash with a program's nor be interposed on, and its calls
# to them need no PLT. -Bsymbolic-functions binds its calls to its own public functions
# directly too.
LIB_CFLAGS := $(CFLAGS) -fvisibility=hidden
$(B)/obj/%.o: src/%.c $(HDRS) | $(B)/obj
	$(CC) $(LIB_CFLAGS) -c $< -o $@
$(B)/obj/%.o: src/%.S | $(B)/obj
	$(CC) $(LIB_CFLAGS) -c $< -o $@

$(B)/libweft.a: $(LIB_OBJ)
	$(AR) rcs $@ $^
$(B)/libweft.so: $(LIB_OBJ)
	$(CC) -shared $(LDFLAGS) -Wl,-Bsymbolic-functions -o $@ $^ $(LDLIBS)

# The shim calls into the program's own weft, so it links to libweft.so (found beside it).
$(B)/libweft-shim.so: src/shim.c $(HDRS) $(B)/libweft.so
	$(CC) $(CFLAGS) -shared $(LDFLAGS) -o $@ src/shim.c -L$(B) -lweft -Wl,-rpath,'$$ORIGIN' -ldl $(LDLIBS)

# pkg-config file for PREFIX (install writes it again for the PREFIX it installs to)
WRITE_PC = printf 'prefix=%s\nlibdir=$${prefix}/lib\nincludedir=$${prefix}/include\n\nName: weft\nDescription: lightweight tasks, channels and task-aware locks over one worker per core\nVersion: 0.1.0\nLibs: -L$${libdir} -lweft\nLibs.private: -pthread\nCflags: -I$${includedir}\n' '$(PREFIX)'

weft.pc $(B)/weft.pc: Makefile
	@mkdir -p $(B)
	$(WRITE_PC) > $@

$(B)/tests/%: tests/%.c tests/test.c tests/test.h $(B)/libweft.a | $(B)/tests
	$(CC) $(CFLAGS) -Itests $(LDFLAGS) -o $@ $< tests/test.c $(B)/libweft.a $(LDLIBS)
# Tests of the shim link to libweft.so, as programs that use the shim must.
$(B)/tests/shim: tests/shim.c tests/test.c tests/test.h $(B)/libweft.so $(B)/libweft-shim.so | $(B)/tests
	$(CC) $(CFLAGS) -Itests $(LDFLAGS) -o $@ $< tests/test.c -L$(B) -lweft -Wl,-rpath,'$$ORIGIN/..' $(LDLIBS)
$(B)/tests/house: tests/house.sh | $(B)/tests
	sed 's|@ROOT@|$(CURDIR)|' $< > $@
	chmod +x $@
$(B)/bench/http: bench/http.c bench/bench.h $(B)/bin/hello-http | $(B)/bench
	$(CC) $(CFLAGS) -Ibench $(LDFLAGS) -o $@ $< $(LDLIBS)
$(B)/bench/%: bench/%.c bench/bench.h $(B)/libweft.a | $(B)/bench
	$(CC) $(CFLAGS) -Ibench $(LDFLAGS) -o $@ $< $(B)/libweft.a $(LDLIBS)
$(B)/bin/%: examples/%.c $(B)/libweft.a | $(B)/bin
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< $(B)/libweft.a $(LDLIBS)

$(B)/obj $(B)/tests $(B)/bench $(B)/bin:
	mkdir -p $@

test: $(TESTS)
	@RUNNER='$(RUNNER)' sh tests/run.sh $(TESTS)

# Every build the CI checks: sanitizers, the aarch64 cross build under qemu-user, the fuzzers
# (libFuzzer, with clang), then the plain build, whose summary line comes last.
test-all:
	$(MAKE) -j2 test SANITIZE=address
	$(MAKE) -j2 test SANITIZE=thread
	$(MAKE) -j2 test ARCH=aarch64
	$(MAKE) fuzz
	$(MAKE) -j2 test

fuzz: $(FUZZ)

bench: $(BENCHES) $(B)/libweft.a
	@sh bench/run.sh $(B)/bench

# The programs weft is measured against (run as root): Go, SWI-Prolog, Gambit, wrk, nginx, mosquitto;
# gnuplot draws the charts.
bench-peers:
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq golang-go swi-prolog-nox gambc wrk nginx-light mosquitto mosquitto-clients libmosquitto-dev gnuplot-nox

install: $(B)/libweft.a $(B)/libweft.so $(B)/libweft-shim.so weft.pc
	install -d $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/lib/pkgconfig
	install -m 644 include/weft.h $(DESTDIR)$(PREFIX)/include/
	install -m 644 $(B)/libweft.a $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(B)/libweft.so $(B)/libweft-shim.so $(DESTDIR)$(PREFIX)/lib/
	$(WRITE_PC) > $(DESTDIR)$(PREFIX)/lib/pkgconfig/weft.pc

clean:
	rm -rf build build-* weft.pc

.PHONY: all test test-all fuzz bench bench-peers install clean
.SECONDARY:
