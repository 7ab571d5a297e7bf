/*
 * test.h - the smallest test harness that does the job. A test file holds TEST(name) { ... }
 * blocks; the runner (tests/run.sh) runs each test in a process of its own:
 *   ./t_foo --list      names, one a line
 *   ./t_foo NAME        runs NAME; exit status 0 means it passed, TEST_SKIPPED (77, as
 *                       automake's harness has it) that it could not run here
 */
#ifndef WEFT_TEST_H
#define WEFT_TEST_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "weft.h"

/* TSan treats each task as a thread and allows at most 8,128 live at once: tests that keep
 * more tasks alive scale down to this under TSan (they run at full size in the other builds). */
#if defined(__SANITIZE_THREAD__)
#define TEST_MAX_LIVE 4000
#else
#define TEST_MAX_LIVE 1000000
#endif
#define TEST_CAP(n) ((n) < TEST_MAX_LIVE ? (n) : TEST_MAX_LIVE)

void test_register(const char *name, void (*fn)(void));

/* The exit status of a test that could not run here (a tool missing, an emulator): the runner
 * prints `skip NAME: why` and counts it as skipped, never as passed. */
#define TEST_SKIPPED 77
/* End this test as skipped, saying why (printf's format) on its last line of output. */
__attribute__((noreturn, format(printf, 1, 2))) void test_skip(const char *why, ...);
/* Skip when the broker or another real program cannot be started here: under an emulator
 * ($RUNNER set: tests/run.sh's qemu-user for cross builds). */
void test_skip_emulated(void);

#define TEST(name)                                                                         \
	static void name(void);                                                            \
	__attribute__((constructor)) static void reg_##name(void) { test_register(#name, name); } \
	static void name(void)

#define CHECK(cond)                                                                         \
	do {                                                                                \
		if (!(cond)) {                                                              \
			fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
			fflush(stderr);                                                     \
			_exit(1);                                                           \
		}                                                                           \
	} while (0)

#define CHECK_EQ(a, b)                                                                      \
	do {                                                                                \
		long long a_ = (long long)(a), b_ = (long long)(b);                         \
		if (a_ != b_) {                                                             \
			fprintf(stderr, "%s:%d: CHECK failed: %s == %s (%lld != %lld)\n",   \
				__FILE__, __LINE__, #a, #b, a_, b_);                        \
			fflush(stderr);                                                     \
			_exit(1);                                                           \
		}                                                                           \
	} while (0)

/* Run fn as weft's main task and check that it returned 0. */
#define RUN(fn) CHECK_EQ(weft_run((fn), NULL), 0)

#define MS 1000000LL

/* Hold the worker for ns: a computation that never yields. */
static inline void spin_for(int64_t ns)
{
	int64_t end = weft_now() + ns;
	while (weft_now() < end)
		;
}

/* Under the sanitizers stress tests run fewer iterations, with the same checks. */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define SLOW 1
#else
#define SLOW 0
#endif

/* Whether the tests run under an emulator (qemu-user for cross builds, $RUNNER: tests/run.sh),
 * where each instruction takes several times as long. */
static inline bool test_emulated(void)
{
	const char *r = getenv("RUNNER");
	return r && *r;
}

/* Bytes from a hex string ("10 0c ..."; spaces ignored) into out; their count. */
static inline size_t test_unhex(const char *s, uint8_t *out)
{
	size_t n = 0;
	while (*s) {
		if (*s == ' ') {
			s++;
			continue;
		}
		unsigned v;
		sscanf(s, "%2x", &v);
		out[n++] = (uint8_t)v;
		s += 2;
	}
	return n;
}

/* Pause 100 us: parks a task, sleeps a plain thread. */
void test_pause(void);
/* Poll until *v >= want; fails the test (instead of hanging) after 5 s. */
void test_await(atomic_int *v, int want);

/* Run `cmd` (via /bin/sh) and return its exit status (-signal when killed); stderr is
 * captured into err (NUL-terminated, cut to cap). */
int test_spawn(const char *cmd, char *err, size_t cap);
/* Stop child process pid with SIGTERM, SIGKILL if it has not exited after 5 s; returns its
 * exit status (-signal when killed). */
int test_stop(pid_t pid);
/* A scratch directory for this test process, made on first use and removed when the test
 * passes (a failing test ends with _exit and keeps it to look at). */
const char *test_tmpdir(void);

/* Run this binary's test `name` in a child process (which inherits the environment, so a
 * setenv before the call reaches weft's start-up); fails the test when the child fails, showing
 * its stderr. */
void test_run_child(const char *name);
/* Run child test `name` with `vars` ("A=1 B=2", or NULL) added to its environment (under qemu
 * too): its status (as test_spawn), its stderr in err. */
int test_spawn_child_env(const char *vars, const char *name, char *err, size_t cap);
/* Run child test `name`, which must die of a signal (abort()) with `message` in its stderr;
 * a child that exits TEST_SKIPPED skips the test, its stderr saying why. */
void test_expect_abort(const char *name, const char *message);
/* The same with more variables in its environment ("NAME=value", several separated by
 * spaces). */
void test_expect_abort_env(const char *var, const char *name, const char *message);
/* test_run_child with libweft-shim.so (in the directory above the binary's) preloaded. For
 * programs linked to libweft.so, as the shim needs. */
void test_run_shimmed(const char *name);
/* The same without judging: the child's status (as test_spawn), its stderr in err. */
int test_spawn_shimmed(const char *name, char *err, size_t cap);
/* Whether this Linux offers membarrier(2)'s private expedited command (asym.h needs it). */
bool test_have_membarrier(void);

/* A TCP connection to 127.0.0.1:port with TCP_NODELAY and reads that give up after timeout_s
 * seconds (so a test never hangs on a silent server); -1 when nobody accepts. rcvbuf, when
 * not 0, is the receive buffer, set before connecting (set after, one smaller than the window
 * already offered makes TCP stall 200 ms at a time). */
int test_dial(int port, int rcvbuf, int timeout_s);
/* Resident memory of process pid (0: this one), in KiB, from /proc/PID/status (VmRSS). */
long test_rss_kb(int pid);

/* A TCP port on 127.0.0.1 that was free a moment ago (for a server the test starts). */
int test_free_port(void);
/* Whether something accepts connections on 127.0.0.1:port (a server the test started). */
bool test_port_open(int port);

/* argv[0] of the test binary, to re-run itself in a child process. */
extern const char *test_argv0;
#endif
