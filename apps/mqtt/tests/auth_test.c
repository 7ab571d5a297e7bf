/* Tests of weft-mqtt's password_file support (auth.c): files written by mosquitto_passwd at
 * test time and a committed one, every kind of malformed line, the CONNECT decision, reloads
 * under concurrent checks, and the pace of password checks per address and name (pace.c). */
#include <errno.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "auth.h"
#include "test.h"

#ifndef MQTT_TEST_DATA
#define MQTT_TEST_DATA "apps/mqtt/tests/data"
#endif

static const char *tmp(const char *name)
{
	static char path[512];
	snprintf(path, sizeof path, "%s/%s", test_tmpdir(), name);
	return path;
}

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	CHECK(f);
	fputs(text, f);
	fclose(f);
}

static int verify(const auth_table *t, const char *u, const char *p)
{
	return auth_table_verify(t, u, strlen(u), p, strlen(p));
}

/* Skip unless real tools can run here (not under an emulator) and mosquitto_passwd exists. */
static void need_passwd_tool(void)
{
	test_skip_emulated();
	if (system("command -v mosquitto_passwd >/dev/null 2>&1") != 0)
		test_skip("mosquitto_passwd is not installed (Debian: mosquitto)");
}

TEST(committed_file)
{
	char err[512];
	auth_table *t = auth_table_load(MQTT_TEST_DATA "/passwd", NULL, err, sizeof err);
	if (!t)
		fprintf(stderr, "%s\n", err);
	CHECK(t);
	CHECK_EQ(auth_table_count(t), 4);
	CHECK(verify(t, "alice", "alice-pw"));
	CHECK(verify(t, "bob", "b0b:with colon"));
	CHECK(verify(t, "émile", "pâté"));
	CHECK(verify(t, "old", "legacy-pw")); /* $6$ */
	CHECK(!verify(t, "alice", "alice-pW"));
	CHECK(!verify(t, "alice", "alice-pw "));
	CHECK(!verify(t, "alice", ""));
	CHECK(!verify(t, "bob", "alice-pw"));
	CHECK(!verify(t, "Alice", "alice-pw"));
	CHECK(!verify(t, "nobody", "alice-pw"));
	CHECK(!verify(t, "old", "legacy-pW"));
	CHECK(!auth_table_verify(t, "alice", 5, NULL, 0)); /* no password at all */
	auth_table_free(t);
}

/* Files made by mosquitto_passwd now, including its -U conversion of plain text. */
TEST(mosquitto_passwd_files)
{
	need_passwd_tool();
	char cmd[4096], out[512];
	const char *f = tmp("pw");
	char path[512];
	snprintf(path, sizeof path, "%s", f);
	snprintf(cmd, sizeof cmd,
		 "mosquitto_passwd -c -b %s u1 'first pass' && mosquitto_passwd -b %s u2 x && "
		 "mosquitto_passwd -b %s 'user three' 'ünïcödé €' && "
		 "mosquitto_passwd -b %s u4 \"$(head -c 300 /dev/zero | tr '\\0' 'p')\"",
		 path, path, path, path);
	CHECK_EQ(test_spawn(cmd, out, sizeof out), 0);
	char err[512];
	auth_table *t = auth_table_load(path, NULL, err, sizeof err);
	if (!t)
		fprintf(stderr, "%s\n", err);
	CHECK(t);
	CHECK_EQ(auth_table_count(t), 4);
	CHECK(verify(t, "u1", "first pass"));
	CHECK(verify(t, "u2", "x"));
	CHECK(verify(t, "user three", "ünïcödé €"));
	char longpw[301];
	memset(longpw, 'p', 300);
	longpw[300] = 0;
	CHECK(verify(t, "u4", longpw));
	longpw[299] = 'q';
	CHECK(!verify(t, "u4", longpw));
	CHECK(!verify(t, "u1", "first"));
	CHECK(!verify(t, "u2", "X"));
	auth_table_free(t);

	/* plain text: refused unless allowed; mosquitto_passwd -U hashes it in place */
	const char *plain = tmp("plain");
	snprintf(path, sizeof path, "%s", plain);
	write_file(path, "p1:secret one\np2:two\n");
	CHECK(!auth_table_load(path, NULL, err, sizeof err));
	CHECK(strstr(err, ":1: error: plain-text password"));
	auth_opts allow = { .allow_plain = true };
	t = auth_table_load(path, &allow, err, sizeof err);
	CHECK(t);
	CHECK(verify(t, "p1", "secret one"));
	CHECK(!verify(t, "p1", "secret"));
	auth_table_free(t);
	snprintf(cmd, sizeof cmd, "mosquitto_passwd -U %s", path);
	CHECK_EQ(test_spawn(cmd, out, sizeof out), 0);
	t = auth_table_load(path, NULL, err, sizeof err);
	CHECK(t);
	CHECK(verify(t, "p1", "secret one"));
	CHECK(verify(t, "p2", "two"));
	CHECK(!verify(t, "p2", "one"));
	auth_table_free(t);
}

/* Every malformed line fails the load at its line, and nothing is loaded. */
TEST(malformed_lines)
{
	static const char good[] =
		"alice:$7$101$fuV6V7hCulKuPrFZ$ImrWR/hBhgIxB5iuaX39CMvz271YkeX29vCOBDRIdRr7ED1PHguX"
		"oDq6dl4Afku0Hv3hdtbobZ+Qywtc7Xxl2Q==\n";
	static const struct {
		const char *line, *why;
	} bad[] = {
		{ "nocolon", "expected user:password-hash" },
		{ ":$7$101$fuV6V7hCulKuPrFZ$x", "empty user name" },
		{ "u:", "empty password" },
		{ "u:plain", "plain-text password" },
		{ "u:$5$abc$def", "unknown hash type" },
		{ "u:$7$$fuV6V7hCulKuPrFZ$aGFzaA==", "bad iteration count" },
		{ "u:$7$abc$fuV6V7hCulKuPrFZ$aGFzaA==", "bad iteration count" },
		{ "u:$7$0$fuV6V7hCulKuPrFZ$aGFzaA==", "iteration count out of range" },
		{ "u:$7$99999999999$fuV6V7hCulKuPrFZ$aGFzaA==", "iteration count out of range" },
		{ "u:$7$101$fuV6V7hCulKuPrFZ", "missing hash" },
		{ "u:$7$101$fu*6V7hCulKuPrFZ$aGFzaA==", "bad salt" },
		{ "u:$7$101$$aGFzaA==", "bad salt" },
		{ "u:$7$101$fuV6V7hCulKuPrFZ$aGFzaA==", "bad hash" },
		{ "u:$7$101$fuV6V7hCulKuPrFZ$aGFz=A==", "bad hash" },
		{ "u:$6$fuV6V7hCulKuPrFZ$", "bad hash" },
		{ "alice:$7$101$fuV6V7hCulKuPrFZ$ImrWR/hBhgIxB5iuaX39CMvz271YkeX29vCOBDRIdRr7ED1PHgu"
		  "XoDq6dl4Afku0Hv3hdtbobZ+Qywtc7Xxl2Q==", "user listed twice" },
	};
	char path[512], text[1024], err[512], want[600];
	snprintf(path, sizeof path, "%s", tmp("bad"));
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		/* the bad line is line 4: after a comment, a good line and a blank one */
		snprintf(text, sizeof text, "# users\n%s\n%s\n", good, bad[i].line);
		write_file(path, text);
		err[0] = 0;
		auth_table *t = auth_table_load(path, NULL, err, sizeof err);
		if (t || !strstr(err, bad[i].why))
			fprintf(stderr, "line %s: got \"%s\"\n", bad[i].line, err);
		CHECK(!t);
		snprintf(want, sizeof want, "%s:4: error: %s", path, bad[i].why);
		CHECK(!strncmp(err, want, strlen(want)));
	}
	CHECK(!auth_table_load("/nonexistent/pw", NULL, err, sizeof err));
	CHECK(strstr(err, "/nonexistent/pw: error: No such file"));
	/* a FIFO nobody writes in the file's place: refused, not waited for */
	char fifo[512];
	snprintf(fifo, sizeof fifo, "%s/fifo.pw", test_tmpdir());
	CHECK_EQ(mkfifo(fifo, 0600), 0);
	CHECK(!auth_table_load(fifo, NULL, err, sizeof err));
	CHECK(strstr(err, ": error: not a regular file"));
	/* comments, blank lines and CRLF ends are fine; so is an empty file */
	write_file(path, "\r\n  # x\r\n\t\r\n");
	auth_table *t = auth_table_load(path, NULL, err, sizeof err);
	CHECK(t);
	CHECK_EQ(auth_table_count(t), 0);
	CHECK(!verify(t, "alice", "alice-pw"));
	auth_table_free(t);
	snprintf(text, sizeof text, "%.*s\r\n", (int)strlen(good) - 1, good);
	write_file(path, text);
	t = auth_table_load(path, NULL, err, sizeof err);
	CHECK(t);
	CHECK(verify(t, "alice", "alice-pw"));
	auth_table_free(t);
}

/* Many users: the table grows and finds every one. */
TEST(many_users)
{
	char path[512], err[512];
	snprintf(path, sizeof path, "%s", tmp("many"));
	FILE *f = fopen(path, "w");
	CHECK(f);
	for (int i = 0; i < 3000; i++)
		fprintf(f, "user%d:pw%d\n", i, i);
	fclose(f);
	auth_opts allow = { .allow_plain = true };
	auth_table *t = auth_table_load(path, &allow, err, sizeof err);
	CHECK(t);
	CHECK_EQ(auth_table_count(t), 3000);
	char u[32], p[32];
	for (int i = 0; i < 3000; i += 7) {
		snprintf(u, sizeof u, "user%d", i);
		snprintf(p, sizeof p, "pw%d", i);
		CHECK(verify(t, u, p));
		snprintf(p, sizeof p, "pw%d", i + 1);
		CHECK(!verify(t, u, p));
	}
	auth_table_free(t);
}

static struct sockaddr_in v4(const char *a)
{
	struct sockaddr_in s = { .sin_family = AF_INET };
	CHECK_EQ(inet_pton(AF_INET, a, &s.sin_addr), 1);
	return s;
}

static struct sockaddr_in6 v6(const char *a)
{
	struct sockaddr_in6 s = { .sin6_family = AF_INET6 };
	CHECK_EQ(inet_pton(AF_INET6, a, &s.sin6_addr), 1);
	return s;
}

static auth_result check(const char *u, const char *p, const void *from, bool anon, int64_t now)
{
	auth_req r = { .user = u, .user_len = u ? strlen(u) : 0, .password = p,
		       .password_len = p ? strlen(p) : 0, .from = from, .anonymous_ok = anon,
		       .now = now };
	return auth_check(&r);
}

TEST(connect_decision)
{
	char err[512];
	auth_clear();
	CHECK_EQ(auth_count(), -1);
	/* no password file: a username proves nothing, allow_anonymous decides */
	CHECK_EQ(check(NULL, NULL, NULL, true, 0), AUTH_OK);
	CHECK_EQ(check("alice", "x", NULL, true, 0), AUTH_OK);
	CHECK_EQ(check("alice", "alice-pw", NULL, false, 0), AUTH_NOT_AUTHORIZED);
	CHECK_EQ(auth_reload(MQTT_TEST_DATA "/passwd", NULL, err, sizeof err), 0);
	CHECK_EQ(auth_count(), 4);
	CHECK_EQ(check("alice", "alice-pw", NULL, false, 0), AUTH_OK);
	CHECK_EQ(check("alice", "alice-pw", NULL, true, 0), AUTH_OK);
	CHECK_EQ(check("alice", "wrong", NULL, true, 0), AUTH_BAD_CREDENTIALS);
	CHECK_EQ(check("alice", NULL, NULL, true, 0), AUTH_BAD_CREDENTIALS);
	CHECK_EQ(check("mallory", "alice-pw", NULL, true, 0), AUTH_BAD_CREDENTIALS);
	CHECK_EQ(check(NULL, NULL, NULL, true, 0), AUTH_OK);
	CHECK_EQ(check(NULL, NULL, NULL, false, 0), AUTH_NOT_AUTHORIZED);
	/* CONNACK codes: 5.0 reason codes, 3.1.1 "not authorized" */
	CHECK_EQ(auth_connack_code(AUTH_BAD_CREDENTIALS, 5), 0x86);
	CHECK_EQ(auth_connack_code(AUTH_NOT_AUTHORIZED, 5), 0x87);
	CHECK_EQ(auth_connack_code(AUTH_BAD_CREDENTIALS, 4), 0x05);
	auth_clear();
}

/* A reload that fails keeps the old table; a good one replaces it. */
TEST(reload)
{
	char a[512], b[512], err[512];
	snprintf(a, sizeof a, "%s", tmp("a"));
	snprintf(b, sizeof b, "%s", tmp("b"));
	write_file(a, "ua:pa\n");
	write_file(b, "ub:pb\nbroken\n");
	auth_opts allow = { .allow_plain = true };
	CHECK_EQ(auth_reload(a, &allow, err, sizeof err), 0);
	CHECK_EQ(check("ua", "pa", NULL, false, 0), AUTH_OK);
	CHECK_EQ(auth_reload(b, &allow, err, sizeof err), -1);
	CHECK(strstr(err, ":2: error:"));
	CHECK_EQ(check("ua", "pa", NULL, false, 0), AUTH_OK);   /* old table still there */
	CHECK_EQ(check("ub", "pb", NULL, false, 0), AUTH_BAD_CREDENTIALS); /* nothing half-loaded */
	write_file(b, "ub:pb\n");
	CHECK_EQ(auth_reload(b, &allow, err, sizeof err), 0);
	CHECK_EQ(check("ub", "pb", NULL, false, 0), AUTH_OK);
	CHECK_EQ(check("ua", "pa", NULL, false, 0), AUTH_BAD_CREDENTIALS);
	auth_clear();
}

/* Checks on several threads while the table is swapped over and over: every answer is one
 * table's answer (the user both tables share always gets in; the others flip), and no table is
 * freed under a reader (ASan, TSan). */
static atomic_int stop_readers, bad_answers, checks_done;
static char rl_a[512], rl_b[512];

static void *reader(void *arg)
{
	(void)arg;
	while (!atomic_load(&stop_readers)) {
		if (check("both", "same", NULL, false, 0) != AUTH_OK)
			atomic_fetch_add(&bad_answers, 1);
		auth_result ra = check("ua", "pa", NULL, false, 0);
		if (ra != AUTH_OK && ra != AUTH_BAD_CREDENTIALS)
			atomic_fetch_add(&bad_answers, 1);
		atomic_fetch_add(&checks_done, 1);
	}
	return NULL;
}

TEST(reload_under_readers)
{
	char err[512];
	snprintf(rl_a, sizeof rl_a, "%s", tmp("ra"));
	snprintf(rl_b, sizeof rl_b, "%s", tmp("rb"));
	write_file(rl_a, "both:same\nua:pa\n");
	write_file(rl_b, "ub:pb\nboth:same\n");
	auth_opts allow = { .allow_plain = true };
	CHECK_EQ(auth_reload(rl_a, &allow, err, sizeof err), 0);
	pthread_t th[4];
	for (int i = 0; i < 4; i++)
		CHECK_EQ(pthread_create(&th[i], NULL, reader, NULL), 0);
	/* Go on reloading until the readers have checked a while too: on a busy machine the
	 * reloads alone could all be over before a reader thread first runs. */
	int reloads = 0;
	while (reloads < (SLOW ? 200 : 2000) || atomic_load(&checks_done) < 1000)
		CHECK_EQ(auth_reload(reloads++ & 1 ? rl_a : rl_b, &allow, err, sizeof err), 0);
	atomic_store(&stop_readers, 1);
	for (int i = 0; i < 4; i++)
		pthread_join(th[i], NULL);
	CHECK_EQ(atomic_load(&bad_answers), 0);
	CHECK(atomic_load(&checks_done) > 0);
	printf("%d reloads during %d checks\n", reloads, atomic_load(&checks_done));
	auth_clear();
}

#define BUSY (-1) /* attempt(): not checked, "try later" */

/* What the broker does with a CONNECT: book its turn, then check it at that time. Returns the
 * result, or BUSY when there was no turn; *turn_at (when not NULL) gets the turn. */
static int attempt(const char *u, const char *p, const void *from, int64_t now, int64_t *turn_at)
{
	auth_req r = { .user = u, .user_len = u ? strlen(u) : 0, .password = p,
		       .password_len = p ? strlen(p) : 0, .from = from, .now = now };
	int64_t t;
	if (auth_turn(&r, &t) < 0) {
		CHECK_EQ(auth_turn(&r, &t), -EBUSY); /* and nothing was booked: still busy */
		return BUSY;
	}
	CHECK(t >= now && t <= now + AUTH_MAX_WAIT);
	if (turn_at)
		*turn_at = t;
	r.now = t;
	return auth_check(&r);
}

/* Guessing is slowed down per (address, username) and per address, to a bounded number of
 * checks however many connections guess at once; a right password is never answered "wrong",
 * and gets in at its turn, however many wrong ones came from its address before. */
TEST(pace_bounds_checks_and_never_locks_out)
{
	char err[512];
	CHECK_EQ(auth_reload(MQTT_TEST_DATA "/passwd", NULL, err, sizeof err), 0);
	auth_limits l = { .burst = 3, .interval_ns = 1000 * MS };
	auth_set_limits(&l);
	auth_limit_reset();
	struct sockaddr_in a = v4("10.0.0.1"), b = v4("10.0.0.2");
	int64_t t0 = 1000000 * MS, at;
	for (int i = 0; i < 3; i++) { /* the burst: checked at once */
		CHECK_EQ(attempt("alice", "guess", &a, t0, &at), AUTH_BAD_CREDENTIALS);
		CHECK_EQ(at, t0);
	}
	/* the fourth waits an interval, and the right password is not refused: it gets in */
	CHECK_EQ(attempt("alice", "alice-pw", &a, t0, &at), AUTH_OK);
	CHECK_EQ(at, t0 + 1000 * MS);
	/* ...and gave its pair's debt back: the next is checked at once */
	CHECK_EQ(attempt("alice", "alice-pw", &a, t0 + 1000 * MS, &at), AUTH_OK);
	CHECK_EQ(at, t0 + 1000 * MS);
	/* guesses made at once, as from many connections, are spaced one interval apart */
	int64_t t1 = t0 + 100000 * MS;
	for (int i = 0; i < 6; i++) {
		CHECK_EQ(attempt("bob", "guess", &a, t1, &at), AUTH_BAD_CREDENTIALS);
		CHECK_EQ(at, t1 + (i < 3 ? 0 : (i - 2) * 1000 * MS));
	}
	/* another name at the address, and the same name at another address, are not held up */
	CHECK_EQ(attempt("alice", "alice-pw", &a, t1, &at), AUTH_OK);
	CHECK_EQ(at, t1);
	CHECK_EQ(attempt("bob", "b0b:with colon", &b, t1, &at), AUTH_OK);
	CHECK_EQ(at, t1);
	/* bob's right password at a waits its turn behind the guesses, then gets in */
	CHECK_EQ(attempt("bob", "b0b:with colon", &a, t1, &at), AUTH_OK);
	CHECK_EQ(at, t1 + 4000 * MS);
	/* however many connections guess at once, a pair gets burst + AUTH_MAX_WAIT / interval
	 * checks (3 + 10), none waiting more than AUTH_MAX_WAIT; the rest are not checked */
	int64_t t2 = t1 + 100000 * MS;
	int checked = 0, busy = 0;
	for (int i = 0; i < 50; i++) {
		int r = attempt("bob", "guess", &a, t2, &at);
		if (r == BUSY) {
			busy++;
		} else {
			CHECK_EQ(r, AUTH_BAD_CREDENTIALS);
			checked++;
		}
	}
	CHECK_EQ(checked, 13);
	CHECK_EQ(busy, 37);
	/* while the flood lasts, the right password is told to try later, never that it is
	 * wrong; each interval frees one turn, AUTH_MAX_WAIT ahead */
	CHECK_EQ(attempt("bob", "b0b:with colon", &a, t2, &at), BUSY);
	CHECK_EQ(attempt("bob", "b0b:with colon", &a, t2 + 1000 * MS, &at), AUTH_OK);
	CHECK_EQ(at, t2 + 1000 * MS + AUTH_MAX_WAIT);
	/* bob's other addresses and alice at a are not held up */
	CHECK_EQ(attempt("bob", "b0b:with colon", &b, t2, &at), AUTH_OK);
	CHECK_EQ(at, t2);
	CHECK_EQ(attempt("alice", "alice-pw", &a, t2, &at), AUTH_OK);
	CHECK_EQ(at, t2);
	/* an address guessing many names fills its own schedule (4 x 3 at once, then four an
	 * interval: 12 + 40 turns), and then everyone there is told to try later */
	int64_t t2b = t2 + 50000 * MS;
	char nm[32];
	checked = busy = 0;
	for (int i = 0; i < 100; i++) {
		snprintf(nm, sizeof nm, "n%d", i);
		int r = attempt(nm, "guess", &a, t2b, &at);
		r == BUSY ? busy++ : checked++;
	}
	CHECK_EQ(checked, 52);
	CHECK_EQ(busy, 48);
	CHECK_EQ(attempt("alice", "alice-pw", &a, t2b, &at), BUSY);
	CHECK_EQ(attempt("alice", "alice-pw", &b, t2b, &at), AUTH_OK);
	/* one address trying many names (four times the burst at once, then four an interval) */
	int64_t t3 = t2 + 100000 * MS;
	char name[32];
	for (int i = 0; i < 14; i++) {
		snprintf(name, sizeof name, "user%d", i);
		CHECK_EQ(attempt(name, "guess", &b, t3, &at), AUTH_BAD_CREDENTIALS);
		CHECK_EQ(at, t3 + (i < 12 ? 0 : (i - 11) * 250 * MS));
	}
	/* anonymous clients refused count as a name of their own */
	for (int i = 0; i < 4; i++)
		attempt(NULL, NULL, &a, t3, &at);
	CHECK_EQ(at, t3 + 1000 * MS);

	/* IPv6: one /64 is one client; v4-mapped addresses are the IPv4 address */
	auth_limit_reset();
	struct sockaddr_in6 x1 = v6("2001:db8:1:2::1"), x2 = v6("2001:db8:1:2:ffff::9"),
			    y = v6("2001:db8:1:3::1"), m = v6("::ffff:10.0.0.1");
	for (int i = 0; i < 3; i++)
		attempt("bob", "guess", &x1, t3, NULL);
	attempt("bob", "b0b:with colon", &x2, t3, &at);
	CHECK_EQ(at, t3 + 1000 * MS);
	attempt("bob", "b0b:with colon", &y, t3, &at);
	CHECK_EQ(at, t3);
	for (int i = 0; i < 3; i++)
		attempt("carol", "guess", &a, t3, NULL);
	attempt("carol", "guess", &m, t3, &at);
	CHECK_EQ(at, t3 + 1000 * MS);

	/* a flood of addresses with one attempt each does not push out the indebted pair */
	for (int i = 0; i < 20000; i++) {
		struct sockaddr_in s = { .sin_family = AF_INET };
		s.sin_addr.s_addr = htonl(0x0b000000u + (uint32_t)i);
		attempt("alice", "guess", &s, t3, NULL);
	}
	attempt("carol", "guess", &a, t3, &at);
	CHECK_EQ(at, t3 + 2000 * MS);
	/* burst 0: no pacing */
	l.burst = 0;
	auth_set_limits(&l);
	attempt("carol", "guess", &a, t3, &at);
	CHECK_EQ(at, t3);
	auth_clear();
}

/* The cost of one check, and that an unknown user costs what a known one does: the fastest of
 * many single calls of each, alternating, so that a busy machine does not decide. */
TEST(check_cost)
{
	char err[512];
	auth_table *t = auth_table_load(MQTT_TEST_DATA "/passwd", NULL, err, sizeof err);
	CHECK(t);
	int n = SLOW ? 50 : 300;
	int64_t known = INT64_MAX, unknown = INT64_MAX;
	for (int i = 0; i < n; i++) {
		int64_t s = weft_now();
		CHECK(!verify(t, "alice", "wrong"));
		int64_t d = weft_now() - s;
		known = d < known ? d : known;
		s = weft_now();
		CHECK(!verify(t, "nobody", "wrong"));
		d = weft_now() - s;
		unknown = d < unknown ? d : unknown;
	}
	printf("per check: known user %.1f us, unknown user %.1f us\n", known / 1e3,
	       unknown / 1e3);
	CHECK(unknown * 3 > known * 2 && known * 3 > unknown * 2);
	auth_table_free(t);
}

/* Random files made of password-file pieces and junk: each loads, or fails with file:line. */
TEST(random_files)
{
	static const char *parts[] = { "u", ":", "$7$", "$6$", "$", "101", "0", "99999999999",
				       "fuV6V7hCulKuPrFZ", "aGFzaA==", "==", "\n", "\r\n", "#",
				       " ", "\xc3\xa9", ("ImrWR/hBhgIxB5iuaX39CMvz271YkeX29vCOBDRIdRr7ED1PHgu"
				       "XoDq6dl4Afku0Hv3hdtbobZ+Qywtc7Xxl2Q=="), "" };
	uint64_t s = 0x2545F4914F6CDD1Dull;
	int runs = SLOW ? 300 : 3000, ok = 0;
	char text[4096], err[512], path[512];
	snprintf(path, sizeof path, "%s", tmp("rand"));
	auth_opts allow = { .allow_plain = true };
	for (int i = 0; i < runs; i++) {
		size_t n = 0;
		int k = 1 + (int)(s % 40);
		for (int j = 0; j < k && n < sizeof text - 128; j++) {
			s ^= s << 13, s ^= s >> 7, s ^= s << 17;
			n += (size_t)snprintf(text + n, sizeof text - n, "%s", parts[s % 18]);
		}
		write_file(path, text);
		err[0] = 0;
		auth_table *t = auth_table_load(path, i & 1 ? &allow : NULL, err, sizeof err);
		if (t) {
			ok++;
			verify(t, "u", "x");
			auth_table_free(t);
		} else {
			CHECK(!strncmp(err, path, strlen(path)) && err[strlen(path)] == ':' &&
			      strstr(err, ": error: "));
		}
	}
	printf("%d of %d random files loaded, the rest refused with file:line\n", ok, runs);
	CHECK(ok > 0 && ok < runs);
}

/* The committed file and one mosquitto_passwd writes now, given to the real mosquitto: it lets
 * in exactly the user/password pairs auth.c accepts. */
TEST(vs_mosquitto)
{
	need_passwd_tool();
	if (system("PATH=$PATH:/usr/sbin command -v mosquitto >/dev/null && "
		   "command -v mosquitto_pub >/dev/null") != 0)
		test_skip("needs mosquitto and mosquitto_pub (Debian: mosquitto, mosquitto-clients)");
	static const char *pairs[][2] = {
		{ "alice", "alice-pw" }, { "alice", "alice-pW" }, { "bob", "b0b:with colon" },
		{ "bob", "b0b" },        { "émile", "pâté" },      { "émile", "pate" },
		{ "old", "legacy-pw" },  { "old", "legacy" },      { "nobody", "alice-pw" },
		{ "g1", "gen one" },     { "g1", "gen two" },      { "g2", "ünï €" },
	};
	int np = (int)(sizeof pairs / sizeof pairs[0]);
	char dir[] = "/tmp/weft-authm-XXXXXX", cmd[4096], out[512], err[512];
	CHECK(mkdtemp(dir));
	/* mosquitto started as root reads its files as the user mosquitto */
	snprintf(cmd, sizeof cmd, "cp %s/passwd %s/pw && mosquitto_passwd -b %s/pw g1 'gen one' && "
		 "mosquitto_passwd -b %s/pw g2 'ünï €' && chmod 755 %s && chmod 644 %s/pw",
		 MQTT_TEST_DATA, dir, dir, dir, dir, dir);
	CHECK_EQ(test_spawn(cmd, out, sizeof out), 0);
	snprintf(cmd, sizeof cmd, "%s/pw", dir);
	auth_table *t = auth_table_load(cmd, NULL, err, sizeof err);
	CHECK(t);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof a;
	int s = socket(AF_INET, SOCK_STREAM, 0);
	CHECK(s >= 0 && bind(s, (struct sockaddr *)&a, sizeof a) == 0);
	CHECK(getsockname(s, (struct sockaddr *)&a, &len) == 0);
	close(s);
	int port = ntohs(a.sin_port);
	snprintf(cmd, sizeof cmd,
		 "printf 'listener %d 127.0.0.1\\npassword_file %s/pw\\nallow_anonymous false\\n' > "
		 "%s/conf && (PATH=$PATH:/usr/sbin mosquitto -c %s/conf >/dev/null 2>&1 & echo $! > "
		 "%s/pid) && for i in $(seq 100); do mosquitto_pub -p %d -u alice -P alice-pw -t t "
		 "-m m 2>/dev/null && break; sleep 0.05; done",
		 port, dir, dir, dir, dir, port);
	CHECK_EQ(test_spawn(cmd, out, sizeof out), 0);
	int differ = 0, accepted = 0;
	for (int i = 0; i < np; i++) {
		snprintf(cmd, sizeof cmd, "mosquitto_pub -p %d -u '%s' -P '%s' -t t -m m", port,
			 pairs[i][0], pairs[i][1]);
		bool m = test_spawn(cmd, out, sizeof out) == 0;
		bool w = verify(t, pairs[i][0], pairs[i][1]);
		if (m != w) {
			fprintf(stderr, "%s / %s: mosquitto %d, weft %d\n", pairs[i][0], pairs[i][1], m, w);
			differ++;
		}
		accepted += m;
	}
	snprintf(cmd, sizeof cmd, "kill $(cat %s/pid); rm -rf %s", dir, dir);
	test_spawn(cmd, out, sizeof out);
	auth_table_free(t);
	printf("%d user/password pairs: mosquitto and auth.c agree on %d (%d accepted)\n", np,
	       np - differ, accepted);
	CHECK_EQ(differ, 0);
	CHECK_EQ(accepted, 6);
}
