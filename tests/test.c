/* test.c - main() of every test binary (see test.h). */
#define _GNU_SOURCE
#include "test.h"

#include <arpa/inet.h>
#include <libgen.h>
#include <stdarg.h>
#include <linux/membarrier.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>

struct test {
	const char *name;
	void (*fn)(void);
};

static struct test tests[256];
static int ntests;
const char *test_argv0;

void test_register(const char *name, void (*fn)(void))
{
	if (ntests < 256)
		tests[ntests++] = (struct test){ name, fn };
}

void test_pause(void)
{
	if (weft_self())
		weft_sleep_until(weft_now() + 100000);
	else
		usleep(100);
}

void test_await(atomic_int *v, int want)
{
	int64_t give_up = weft_now() + 5000 * MS;
	while (atomic_load(v) < want) {
		CHECK(weft_now() < give_up);
		test_pause();
	}
}

static char tmpdir[64];

static void rm_tmpdir(void)
{
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", tmpdir);
}

void test_skip(const char *why, ...)
{
	va_list ap;
	va_start(ap, why);
	vprintf(why, ap);
	va_end(ap);
	printf("\n");
	exit(TEST_SKIPPED); /* exit, not _exit: the scratch directory goes as for a pass */
}

void test_skip_emulated(void)
{
	if (test_emulated())
		test_skip("the test starts real programs, which cannot run under %s",
			  getenv("RUNNER"));
}

const char *test_tmpdir(void)
{
	if (!tmpdir[0]) {
		strcpy(tmpdir, "/tmp/weft-test-XXXXXX");
		CHECK(mkdtemp(tmpdir));
		atexit(rm_tmpdir);
	}
	return tmpdir;
}

int test_spawn(const char *cmd, char *err, size_t cap)
{
	char full[1024];
	const char *runner = getenv("RUNNER"); /* qemu-user for cross builds: see tests/run.sh */
	snprintf(full, sizeof full, "%s %s 2>&1 >/dev/null", runner ? runner : "", cmd);
	FILE *p = popen(full, "r");
	if (!p)
		return -1;
	size_t n = fread(err, 1, cap - 1, p);
	err[n] = 0;
	int st = pclose(p);
	if (WIFSIGNALED(st))
		return -WTERMSIG(st);
	/* sh reports a child killed by a signal as 128 + signal */
	return WEXITSTATUS(st) > 128 ? -(WEXITSTATUS(st) - 128) : WEXITSTATUS(st);
}

int test_stop(pid_t pid)
{
	kill(pid, SIGTERM);
	int st = 0;
	for (int i = 0; i < 500; i++) {
		if (waitpid(pid, &st, WNOHANG) == pid)
			return WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
		usleep(10000);
	}
	kill(pid, SIGKILL);
	waitpid(pid, &st, 0);
	return -SIGKILL;
}

int main(int argc, char **argv)
{
	test_argv0 = argv[0];
	if (argc == 2 && strcmp(argv[1], "--list") == 0) {
		for (int i = 0; i < ntests; i++) /* child_*: helpers other tests run in a child */
			if (strncmp(tests[i].name, "child_", 6) != 0)
				printf("%s\n", tests[i].name);
		return 0;
	}
	for (int i = 0; argc >= 2 && i < ntests; i++)
		if (strcmp(argv[1], tests[i].name) == 0) {
			tests[i].fn();
			return 0;
		}
	fprintf(stderr, "usage: %s --list | TEST\n", argv[0]);
	return 2;
}

/* Run this binary's test `name` in a child; returns its status (test_spawn). `prefix` goes
 * between the runner and the binary: an environment for the child. */
static int spawn_child(const char *prefix, const char *name, char *err, size_t cap)
{
	char cmd[2048];
	snprintf(cmd, sizeof cmd, "%s %s %s", prefix, test_argv0, name);
	return test_spawn(cmd, err, cap);
}

static void run_child(const char *prefix, const char *name)
{
	char err[4096];
	int st = spawn_child(prefix, name, err, sizeof err);
	if (st != 0)
		fprintf(stderr, "child %s: status %d\n%s", name, st, err);
	CHECK_EQ(st, 0);
}

void test_run_child(const char *name)
{
	run_child("", name);
}

/* The prefix (for spawn_child) that adds `vars` ("A=1 B=2") to a child's environment: qemu-user
 * takes the guest's with one -E per variable. */
static void env_prefix(char *out, size_t cap, const char *vars)
{
	bool qemu = test_emulated();
	size_t n = (size_t)snprintf(out, cap, "%s", qemu ? "" : "env");
	char copy[1024];
	snprintf(copy, sizeof copy, "%s", vars);
	for (char *save, *v = strtok_r(copy, " ", &save); v && n < cap; v = strtok_r(NULL, " ", &save))
		n += (size_t)snprintf(out + n, cap - n, "%s %s", qemu ? " -E" : "", v);
}

int test_spawn_child_env(const char *vars, const char *name, char *err, size_t cap)
{
	char prefix[1024] = "";
	if (vars)
		env_prefix(prefix, sizeof prefix, vars);
	return spawn_child(prefix, name, err, cap);
}

void test_expect_abort_env(const char *var, const char *name, const char *message)
{
	char err[4096];
	int st = test_spawn_child_env(var, name, err, sizeof err);
	if (st == TEST_SKIPPED)
		test_skip("%s", err);
	if (st >= 0 || !strstr(err, message))
		fprintf(stderr, "child %s: status %d, stderr:\n%s\n", name, st, err);
	CHECK(st < 0); /* killed by a signal: abort() */
	CHECK(strstr(err, message));
}

void test_expect_abort(const char *name, const char *message)
{
	test_expect_abort_env(NULL, name, message);
}

static void shimmed(char *prefix, size_t cap)
{
	char dir[512], vars[1024];
	snprintf(dir, sizeof dir, "%s", test_argv0);
	/* ASan must be told that a preloaded library comes before it */
	snprintf(vars, sizeof vars,
		 "LD_PRELOAD=%s/../libweft-shim.so ASAN_OPTIONS=verify_asan_link_order=0", dirname(dir));
	env_prefix(prefix, cap, vars);
}

void test_run_shimmed(const char *name)
{
	char prefix[1024];
	shimmed(prefix, sizeof prefix);
	run_child(prefix, name);
}

int test_spawn_shimmed(const char *name, char *err, size_t cap)
{
	char prefix[1024];
	shimmed(prefix, sizeof prefix);
	return spawn_child(prefix, name, err, cap);
}

bool test_have_membarrier(void)
{
	long cmds = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
	return cmds >= 0 && (cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED);
}

int test_free_port(void)
{
	int s = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof a;
	CHECK(bind(s, (struct sockaddr *)&a, sizeof a) == 0);
	CHECK(getsockname(s, (struct sockaddr *)&a, &len) == 0);
	close(s);
	return ntohs(a.sin_port);
}

bool test_port_open(int port)
{
	int s = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	bool ok = connect(s, (struct sockaddr *)&a, sizeof a) == 0;
	close(s);
	return ok;
}

int test_dial(int port, int rcvbuf, int timeout_s)
{
	int s = socket(AF_INET, SOCK_STREAM, 0);
	if (s >= 0 && rcvbuf)
		setsockopt(s, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	struct sockaddr_in me;
	socklen_t len = sizeof me;
	if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof a) < 0 ||
	    getsockname(s, (struct sockaddr *)&me, &len) < 0 || me.sin_port == a.sin_port) {
		/* the last: test_free_port's port is an ephemeral one, and before the server
		 * listens a connect can land on its own port (TCP's simultaneous open) and
		 * "succeed" */
		if (s >= 0)
			close(s);
		return -1;
	}
	int one = 1;
	setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	struct timeval tv = { timeout_s, 0 };
	setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	return s;
}

long test_rss_kb(int pid)
{
	char path[64], line[256];
	if (pid)
		snprintf(path, sizeof path, "/proc/%d/status", pid);
	else
		snprintf(path, sizeof path, "/proc/self/status");
	FILE *f = fopen(path, "r");
	CHECK(f);
	long kb = -1;
	while (kb < 0 && fgets(line, sizeof line, f))
		if (!strncmp(line, "VmRSS:", 6))
			kb = atol(line + 6);
	fclose(f);
	CHECK(kb > 0);
	return kb;
}
