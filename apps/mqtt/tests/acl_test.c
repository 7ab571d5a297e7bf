/* Tests of weft-mqtt's acl_file support (acl.c): topic matching, every rule kind and their
 * precedence, subscriptions, malformed files, reloads, and the same files decided by the real
 * mosquitto (read and write, for every identity and topic) compared with acl.c's decisions. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "codec.h"
#include "acl.h"
#include "test.h"

#ifndef MQTT_TEST_DATA
#define MQTT_TEST_DATA "apps/mqtt/tests/data"
#endif

static bool m(const char *f, const char *t)
{
	return mq_topic_match(f, strlen(f), t, strlen(t));
}

TEST(matching)
{
	static const struct {
		const char *f, *t;
		bool want;
	} cases[] = {
		{ "a/b", "a/b", 1 },     { "a/b", "a/c", 0 },       { "a/b", "a/b/c", 0 },
		{ "a/b/c", "a/b", 0 },   { "a/+", "a/b", 1 },       { "a/+", "a/", 1 },
		{ "a/+", "a", 0 },       { "a/+", "a/b/c", 0 },     { "+/+", "/x", 1 },
		{ "+", "/", 0 },         { "a/#", "a", 1 },         { "a/#", "a/", 1 },
		{ "a/#", "a/b/c", 1 },   { "a/#", "ab", 0 },        { "#", "a/b", 1 },
		{ "#", "/", 1 },         { "#", "$SYS/x", 0 },      { "+/x", "$SYS/x", 0 },
		{ "$SYS/#", "$SYS/x", 1 }, { "$SYS/#", "$SYS", 1 }, { "$SYS/+", "$SYS/x", 1 },
		{ "a/+/c", "a/b/c", 1 }, { "a/+/c", "a//c", 1 },    { "a//c", "a//c", 1 },
		{ "a/b", "a/b/", 0 },    { "A/b", "a/b", 0 },       { "+/+/#", "a", 0 },
		{ "+/#", "a", 1 },       { "x", "", 0 },
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		if (m(cases[i].f, cases[i].t) != cases[i].want)
			fprintf(stderr, "match(%s, %s) != %d\n", cases[i].f, cases[i].t, cases[i].want);
		CHECK(m(cases[i].f, cases[i].t) == cases[i].want);
	}
}

static bool cov(const char *c, const char *f)
{
	return mq_filter_covers(c, strlen(c), f, strlen(f));
}

static bool ovl(const char *a, const char *b)
{
	return mq_filter_overlaps(a, strlen(a), b, strlen(b)) && mq_filter_overlaps(b, strlen(b), a, strlen(a));
}

TEST(filter_relations)
{
	CHECK(cov("#", "a/b/#"));
	CHECK(cov("a/#", "a/+"));
	CHECK(cov("a/#", "a"));
	CHECK(cov("a/#", "a/#"));
	CHECK(cov("a/+", "a/+"));
	CHECK(cov("a/+", "a/b"));
	CHECK(!cov("a/+", "a/#"));
	CHECK(!cov("a/b", "a/+"));
	CHECK(!cov("a/+", "a"));
	CHECK(!cov("#", "$SYS/#"));
	CHECK(cov("$SYS/#", "$SYS/a/+"));
	CHECK(!cov("+/#", "$SYS/x"));
	CHECK(!cov("a/b/c", "a/b"));
	CHECK(ovl("a/+", "+/b"));
	CHECK(ovl("a/#", "a"));
	CHECK(ovl("#", "x/y/z"));
	CHECK(ovl("a/+/c", "a/b/#"));
	CHECK(!ovl("a/+", "a/b/c"));
	CHECK(!ovl("a/b", "a/c"));
	CHECK(!ovl("#", "$SYS/#"));
	CHECK(!ovl("+/x", "$SYS/x"));
	CHECK(ovl("$SYS/+", "$SYS/#"));
	CHECK(!ovl("a", "a/+"));
	/* a relation holds only if it holds for every/some topic: spot-check with topics */
	const char *topics[] = { "a", "a/b", "a/b/c", "x/b", "a/", "$SYS/x", "/b" };
	const char *filters[] = { "#", "a/#", "a/+", "+/b", "a/b", "a", "+/#", "$SYS/#", "+/+/+" };
	for (size_t i = 0; i < 9; i++)
		for (size_t j = 0; j < 9; j++) {
			bool all = true, some = false;
			for (size_t k = 0; k < 7; k++) {
				if (m(filters[j], topics[k]) && !m(filters[i], topics[k]))
					all = false;
				if (m(filters[j], topics[k]) && m(filters[i], topics[k]))
					some = true;
			}
			/* the sample is small: covers must not claim what a sample refutes, and
			 * a sampled common topic must be seen as overlap */
			if (cov(filters[i], filters[j]))
				CHECK(all);
			if (some)
				CHECK(ovl(filters[i], filters[j]));
		}
}

static acl_table *load(const char *name)
{
	char path[512], err[512];
	snprintf(path, sizeof path, "%s/%s", MQTT_TEST_DATA, name);
	acl_table *t = acl_table_load(path, err, sizeof err);
	if (!t)
		fprintf(stderr, "%s\n", err);
	CHECK(t);
	return t;
}

static bool can(acl_table *t, const char *user, const char *id, const char *topic, int access)
{
	acl_client *c = acl_bind_table(t, user, user ? strlen(user) : 0, id, strlen(id));
	bool ok = acl_check(c, topic, strlen(topic), access);
	acl_unbind(c);
	return ok;
}

enum { R = ACL_READ, W = ACL_WRITE };

/* The rules of rules.acl as mosquitto.conf(5) describes them. */
TEST(rule_kinds)
{
	acl_table *t = load("rules.acl");
	/* anonymous section: only for clients without a username */
	CHECK(can(t, NULL, "anon1", "public/x", R));
	CHECK(!can(t, NULL, "anon1", "public/x", W));
	CHECK(can(t, NULL, "anon1", "inbox/anon", W));
	CHECK(!can(t, NULL, "anon1", "public/private", R)); /* deny before the broader read */
	CHECK(!can(t, "alice", "a1", "public/x", R));
	/* a user's section */
	CHECK(can(t, "alice", "a1", "alice/x", R));
	CHECK(can(t, "alice", "a1", "alice/x", W));
	CHECK(!can(t, "alice", "a1", "alice/secret", W)); /* "alice/secret/#" covers it */
	CHECK(!can(t, "alice", "a1", "alice/secret/y", R));
	CHECK(can(t, "alice", "a1", "shared/a/status", R));
	CHECK(!can(t, "alice", "a1", "shared/a/status", W));
	CHECK(!can(t, "alice", "a1", "shared/a/b/status", R));
	CHECK(can(t, "alice", "a1", "shared/cmd", W));
	CHECK(!can(t, "alice", "a1", "shared/cmd", R));
	CHECK(can(t, "alice", "a1", "$app/alice", R));
	CHECK(can(t, "alice", "a1", "extra/alice", R)); /* second section */
	CHECK(can(t, "bob", "b1", "bob/z", W));          /* no access word: readwrite */
	CHECK(can(t, "bob", "b1", "bob/z", R));
	CHECK(can(t, "bob", "b1", "public/x", W));
	CHECK(!can(t, "bob", "b1", "public/x", R));
	CHECK(!can(t, "bob", "b1", "alice/x", R));
	/* a user without a section: patterns only */
	CHECK(!can(t, "carol", "c1", "public/x", R));
	CHECK(can(t, "carol", "c1", "clients/c1/t", W));
	CHECK(can(t, "carol", "c1", "users/carol/inbox", R));
	CHECK(!can(t, "carol", "c1", "users/carol/inbox", W));
	CHECK(can(t, "carol", "c1", "users/carol/outbox", W));
	CHECK(!can(t, "carol", "c1", "users/bob/inbox", R));
	CHECK(!can(t, "carol", "c1", "clients/c1/locked", W)); /* pattern deny first */
	CHECK(can(t, "carol", "c1", "room-carol/x", R));        /* %u inside a level */
	/* %c for anonymous clients; %u patterns do not apply to them */
	CHECK(can(t, NULL, "anon1", "clients/anon1/t", W));
	CHECK(!can(t, NULL, "anon1", "users/%u/inbox", R));
	/* wildcards in a name: patterns refuse, the user's own section still counts */
	CHECK(can(t, "ev+il", "e1", "public/x", W));
	CHECK(!can(t, "ev+il", "e1", "clients/e1/t", W));
	CHECK(can(t, "alice", "dev+1", "alice/x", W));
	CHECK(!can(t, "alice", "dev#1", "clients/dev#1/t", W));
	/* $ topics need a rule starting with $ */
	CHECK(!can(t, "alice", "a1", "$SYS/broker/x", R));
	CHECK(!can(t, "bob", "b1", "$app/alice", R));
	/* nothing granted: refused */
	CHECK(!can(t, "alice", "a1", "other/thing", R));
	/* no acl_file: everything */
	CHECK(can(NULL, "anyone", "x", "any/thing", W));
	CHECK_EQ(acl_table_rules(t), 18);
	acl_table_free(t);
}

static bool sub(acl_table *t, const char *user, const char *id, const char *f)
{
	acl_client *c = acl_bind_table(t, user, user ? strlen(user) : 0, id, strlen(id));
	bool ok = acl_check_subscribe(c, f, strlen(f));
	acl_unbind(c);
	return ok;
}

TEST(subscribe)
{
	acl_table *t = load("rules.acl");
	CHECK(sub(t, "alice", "a1", "alice/#"));
	CHECK(sub(t, "alice", "a1", "alice/+"));
	CHECK(sub(t, "alice", "a1", "#"));               /* overlaps alice/#: filtered per message */
	CHECK(!sub(t, "alice", "a1", "alice/secret/#")); /* all of it denied */
	CHECK(!sub(t, "alice", "a1", "alice/secret/x"));
	CHECK(!sub(t, "alice", "a1", "shared/cmd"));     /* write only */
	CHECK(sub(t, "alice", "a1", "shared/+/status"));
	CHECK(sub(t, "alice", "a1", "shared/#"));
	CHECK(!sub(t, "alice", "a1", "nothing/here"));
	CHECK(!sub(t, "alice", "a1", "$SYS/#"));
	CHECK(sub(t, "alice", "a1", "$app/+"));
	CHECK(sub(t, "alice", "a1", "$share/g/alice/x")); /* a shared subscription's filter */
	CHECK(!sub(t, "alice", "a1", "$share/g/bob/x"));
	CHECK(!sub(t, "bob", "b1", "public/#"));         /* write only */
	CHECK(sub(t, NULL, "anon1", "public/#"));
	CHECK(!sub(t, NULL, "anon1", "public/private"));
	CHECK(sub(t, "carol", "c1", "users/carol/inbox"));
	CHECK(!sub(t, "carol", "c1", "clients/c1/locked"));
	CHECK(sub(t, "carol", "c1", "clients/c1/#"));
	CHECK(!sub(t, "ev+il", "e1", "clients/e1/#"));
	CHECK(sub(NULL, "x", "y", "#"));
	acl_table_free(t);
}

TEST(parsing_quirks)
{
	acl_table *t = load("patterns.acl");
	CHECK(can(t, NULL, "a", "read", W)); /* "topic read": the topic is "read" */
	CHECK(can(t, NULL, "a", "read", R));
	CHECK(can(t, NULL, "a", "spaced/topic", W));
	CHECK(!can(t, NULL, "a", "spaced/topic", R));
	CHECK(can(t, "dave", "d1", "dave/x", R));         /* pattern %u/# */
	CHECK(can(t, "dave", "d1", "dave/x", W));         /* own section */
	CHECK(!can(t, "dave", "d1", "dave/blocked", R));  /* own deny beats the pattern */
	CHECK(!can(t, "dave", "d1", "dave/private", R));  /* pattern deny */
	CHECK(can(t, "dave", "d1", "dave/private", W));   /* own section allows first */
	CHECK(can(t, "erin", "e1", "e1/out", W));
	CHECK(!can(t, "erin", "e1", "e1/out", R));
	CHECK(can(t, "erin", "e1", "$app/e1", R));
	CHECK(!can(t, NULL, "e1", "e1/x", R));
	acl_table_free(t);
}

static const char *tmpfile_with(const char *name, const char *text)
{
	static char path[512];
	snprintf(path, sizeof path, "%s/%s", test_tmpdir(), name);
	FILE *f = fopen(path, "w");
	CHECK(f);
	fputs(text, f);
	fclose(f);
	return path;
}

TEST(malformed_lines)
{
	static const struct {
		const char *line, *why;
	} bad[] = {
		{ "topick read a", "unknown keyword" },
		{ "user", "missing user name" },
		{ "user   ", "missing user name" },
		{ "topic", "missing topic" },
		{ "pattern  ", "missing topic" },
		{ "topic reed a/b", "unknown access" },
		{ "topic read a/#/b", "misplaced wildcard" },
		{ "topic read a/b+", "misplaced wildcard" },
		{ "pattern write #/x", "misplaced wildcard" },
		{ "topic deny a#", "misplaced wildcard" },
	};
	char text[512], err[512], want[600];
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		snprintf(text, sizeof text, "# x\ntopic read ok/#\n\nuser u\n%s\ntopic a\n", bad[i].line);
		const char *path = tmpfile_with("bad.acl", text);
		err[0] = 0;
		acl_table *t = acl_table_load(path, err, sizeof err);
		if (t || !strstr(err, bad[i].why))
			fprintf(stderr, "line \"%s\": got \"%s\"\n", bad[i].line, err);
		CHECK(!t);
		snprintf(want, sizeof want, "%s:5: error: %s", path, bad[i].why);
		CHECK(!strncmp(err, want, strlen(want)));
	}
	CHECK(!acl_table_load("/nonexistent/acl", err, sizeof err));
	CHECK(strstr(err, "/nonexistent/acl: error: No such file"));
	/* a FIFO nobody writes, or a device, in the file's place: refused, not read forever */
	char fifo[512];
	snprintf(fifo, sizeof fifo, "%s/fifo.acl", test_tmpdir());
	CHECK_EQ(mkfifo(fifo, 0600), 0);
	const char *odd[] = { fifo, "/dev/zero", "/dev/null" };
	for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
		char want[600];
		snprintf(want, sizeof want, "%s: error: not a regular file", odd[i]);
		CHECK(!acl_table_load(odd[i], err, sizeof err));
		CHECK(!strcmp(err, want));
	}
	/* a sparse file of 300 MB: refused at its size, not read */
	char big[512];
	snprintf(big, sizeof big, "%s/big.acl", test_tmpdir());
	FILE *bf = fopen(big, "w");
	CHECK(bf && ftruncate(fileno(bf), 300l << 20) == 0);
	fclose(bf);
	CHECK(!acl_table_load(big, err, sizeof err));
	CHECK(strstr(err, "big.acl: error: larger than 256 MiB"));
	/* tabs and CRLF are fine */
	acl_table *t = acl_table_load(tmpfile_with("ok.acl", "\ttopic\tread\ta/b \r\n\r\n"), err,
				      sizeof err);
	CHECK(t);
	CHECK(can(t, NULL, "c", "a/b", R));
	CHECK(!can(t, NULL, "c", "a/b", W));
	acl_table_free(t);
}

/* 100,000 user sections: the table grows as they come, and every user finds its own rule. */
TEST(many_users)
{
	const char *path = tmpfile_with("many.acl", "");
	FILE *f = fopen(path, "w");
	CHECK(f);
	for (int i = 0; i < 100000; i++)
		fprintf(f, "user u%d\ntopic read t/%d\n", i, i);
	fclose(f);
	char err[512];
	acl_table *t = acl_table_load(path, err, sizeof err);
	CHECK(t);
	for (int i = 0; i < 100000; i += 7) {
		char u[16], mine[16], other[16];
		snprintf(u, sizeof u, "u%d", i);
		snprintf(mine, sizeof mine, "t/%d", i);
		snprintf(other, sizeof other, "t/%d", i + 1);
		CHECK(can(t, u, "c", mine, R));
		CHECK(!can(t, u, "c", other, R));
	}
	acl_table_free(t);
}

TEST(reload_and_stale)
{
	char err[512];
	acl_clear();
	acl_client *c = acl_bind("u", 1, "c", 1);
	CHECK(!acl_stale(c));
	CHECK(acl_check(c, "x", 1, W)); /* no acl_file */
	char path[512];
	snprintf(path, sizeof path, "%s", tmpfile_with("one.acl", "user u\ntopic read x\n"));
	CHECK_EQ(acl_reload(path, err, sizeof err), 0);
	CHECK(acl_stale(c));
	CHECK(acl_check(c, "x", 1, W)); /* the old binding decides until rebound */
	acl_unbind(c);
	c = acl_bind("u", 1, "c", 1);
	CHECK(!acl_stale(c));
	CHECK(!acl_check(c, "x", 1, W));
	CHECK(acl_check(c, "x", 1, R));
	/* a bad file changes nothing */
	snprintf(path, sizeof path, "%s", tmpfile_with("two.acl", "user u\ntopic write x\nbad\n"));
	CHECK_EQ(acl_reload(path, err, sizeof err), -1);
	CHECK(strstr(err, ":3: error: unknown keyword"));
	CHECK(!acl_stale(c));
	acl_client *d = acl_bind("u", 1, "c", 1);
	CHECK(!acl_check(d, "x", 1, W));
	acl_unbind(d);
	CHECK(acl_allowed("u", 1, "c", 1, "x", 1, R));
	CHECK(!acl_allowed("u", 1, "c", 1, "x", 1, W));
	CHECK(!acl_allowed(NULL, 0, "c", 1, "x", 1, R));
	/* the old table lives while a client holds it */
	acl_clear();
	CHECK(acl_stale(c));
	CHECK(acl_check(c, "x", 1, R));
	acl_unbind(c);
}

/* acl_rebind binds the same client (username, client id, or anonymous) to the rules in force:
 * what the broker does with a binding it finds stale after a reload (access.c). */
TEST(rebind_same_client_new_rules)
{
	char err[512], path[512];
	snprintf(path, sizeof path, "%s",
		 tmpfile_with("r1.acl", "topic read anon/old\nuser alice\ntopic read old/#\n"
					"pattern read in/%u/%c\n"));
	CHECK_EQ(acl_reload(path, err, sizeof err), 0);
	acl_client *a = acl_bind("alice", 5, "dev1", 4), *n = acl_bind(NULL, 0, "anon1", 5);
	CHECK(acl_check(a, "old/x", 5, R));
	CHECK(acl_check(a, "in/alice/dev1", 13, R));
	CHECK(acl_check(n, "anon/old", 8, R));
	snprintf(path, sizeof path, "%s",
		 tmpfile_with("r2.acl", "topic read anon/new\nuser alice\ntopic read new/#\n"
					"pattern read to/%u/%c\npattern read all/%c\n"));
	CHECK_EQ(acl_reload(path, err, sizeof err), 0);
	CHECK(acl_stale(a) && acl_stale(n));
	acl_client *a2 = acl_rebind(a), *n2 = acl_rebind(n);
	CHECK(!acl_stale(a2) && !acl_stale(n2));
	CHECK(acl_check(a, "old/x", 5, R)); /* the old binding is left as it was */
	CHECK(!acl_check(a2, "old/x", 5, R));
	CHECK(acl_check(a2, "new/x", 5, R));
	CHECK(!acl_check(a2, "in/alice/dev1", 13, R));
	CHECK(acl_check(a2, "to/alice/dev1", 13, R)); /* %u and %c: the same client */
	CHECK(!acl_check(a2, "to/bob/dev1", 11, R));
	CHECK(!acl_check(n2, "anon/old", 8, R)); /* anonymous stays anonymous */
	CHECK(acl_check(n2, "anon/new", 8, R));
	CHECK(acl_check(n2, "all/anon1", 9, R));
	CHECK(!acl_check(n2, "to//anon1", 9, R)); /* %u: not for a client without a name */
	acl_unbind(a);
	acl_unbind(n);
	acl_clear();
	CHECK(acl_stale(a2));
	acl_client *a3 = acl_rebind(a2);
	CHECK(acl_check(a3, "anything", 8, W)); /* no acl_file: everything */
	acl_unbind(a2);
	acl_unbind(n2);
	acl_unbind(a3);
}

/* ---- the same files decided by mosquitto ---------------------------------------------------- */

typedef struct ident {
	const char *user, *id;
} ident;

static void need_mosquitto(void)
{
	test_skip_emulated();
	if (system("PATH=$PATH:/usr/sbin command -v mosquitto >/dev/null 2>&1 && "
		   "command -v mosquitto_pub >/dev/null 2>&1 && "
		   "command -v mosquitto_sub >/dev/null 2>&1 && "
		   "command -v mosquitto_passwd >/dev/null 2>&1") != 0)
		test_skip("mosquitto, mosquitto-clients not installed (Debian: mosquitto, "
			  "mosquitto-clients)");
}

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...)
{
	char cmd[8192];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(cmd, sizeof cmd, fmt, ap);
	va_end(ap);
	return system(cmd);
}

/* Wait (up to 20 s) until dir/<prefix>0 .. <prefix>n-1 all exist. */
static void wait_files(const char *dir, const char *prefix, int n)
{
	for (int tries = 0; tries < 2000; tries++) {
		int have = 0;
		for (int i = 0; i < n; i++) {
			char p[600];
			struct stat st;
			snprintf(p, sizeof p, "%s/%s%d", dir, prefix, i);
			have += stat(p, &st) == 0;
		}
		if (have == n)
			return;
		usleep(10000);
	}
	CHECK(!"the mosquitto clients did not finish in 20 s");
}

/* Credentials options for mosquitto_pub/sub. */
static void creds(const ident *who, char *out, size_t cap)
{
	if (who->user)
		snprintf(out, cap, "-u '%s' -P 'pw-%s' -i '%s'", who->user, who->user, who->id);
	else
		snprintf(out, cap, "-i '%s'", who->id);
}

/*
 * Start mosquitto with two listeners: `port` applies the ACL file and password file; `open`
 * has neither (per_listener_settings), for the publisher of the read checks. Then ask, for each
 * identity and topic, whether a publish is refused (QoS 1 on 5.0: PUBACK 0x87, which
 * mosquitto_pub reports as "Not authorized") and whether a message published on the open
 * listener reaches a subscriber to '#' (and to every $ topic) with that identity. Compare each
 * answer with acl.c's.
 */
static void compare(const char *acl_name, const ident *ids, int nid, const char **topics, int nt)
{
	need_mosquitto();
	char dir[] = "/tmp/weft-aclm-XXXXXX", acl[600], err[512], c[256];
	CHECK(mkdtemp(dir));
	snprintf(acl, sizeof acl, "%s/%s", MQTT_TEST_DATA, acl_name);
	acl_table *t = acl_table_load(acl, err, sizeof err);
	CHECK(t);
	CHECK_EQ(sh("mosquitto_passwd -c -b %s/pw nobody x", dir), 0);
	for (int i = 0; i < nid; i++)
		if (ids[i].user)
			CHECK_EQ(sh("mosquitto_passwd -b %s/pw '%s' 'pw-%s'", dir, ids[i].user,
				    ids[i].user), 0);
	/* mosquitto started as root reads its files as the user mosquitto */
	CHECK_EQ(sh("chmod 755 %s && chmod 644 %s/pw", dir, dir), 0);
	int port = test_free_port(), open = test_free_port();
	char conf[700];
	snprintf(conf, sizeof conf, "%s/mosquitto.conf", dir);
	FILE *f = fopen(conf, "w");
	CHECK(f);
	fprintf(f, "per_listener_settings true\nlistener %d 127.0.0.1\npassword_file %s/pw\n"
		   "acl_file %s\nallow_anonymous true\nlistener %d 127.0.0.1\nallow_anonymous true\n",
		port, dir, acl, open);
	fclose(f);
	pid_t broker = fork();
	CHECK(broker >= 0);
	if (broker == 0) {
		execlp("sh", "sh", "-c", "PATH=$PATH:/usr/sbin exec mosquitto -c \"$0\" >/dev/null 2>&1",
		       conf, (char *)NULL);
		_exit(127);
	}
	for (int i = 0; i < 500 && !(test_port_open(port) && test_port_open(open)); i++)
		usleep(10000);
	CHECK(test_port_open(port) && test_port_open(open));

	/* writes: every identity publishes every topic (in parallel per identity) */
	for (int i = 0; i < nid; i++) {
		creds(&ids[i], c, sizeof c);
		char script[6000];
		size_t n = (size_t)snprintf(script, sizeof script, "(");
		for (int k = 0; k < nt; k++)
			n += (size_t)snprintf(script + n, sizeof script - n,
					      "mosquitto_pub -p %d %s -V 5 -q 1 -t '%s' -m w "
					      "2>&1 | grep -q 'Not authorized' && echo '%s' >> %s/wdeny%d;",
					      port, c, topics[k], topics[k], dir, i);
		snprintf(script + n, sizeof script - n, "touch %s/wdone%d) &", dir, i);
		CHECK(n < sizeof script - 10);
		CHECK_EQ(system(script), 0);
	}
	wait_files(dir, "wdone", nid);
	/* reads: every topic is retained from the open listener first, so a subscriber gets what
	 * it may read the moment it subscribes (no race with the subscription) */
	for (int k = 0; k < nt; k++)
		CHECK_EQ(sh("mosquitto_pub -p %d -q 1 -r -t '%s' -m r", open, topics[k]), 0);
	for (int i = 0; i < nid; i++) {
		creds(&ids[i], c, sizeof c);
		char filters[2048] = "-t '#'";
		for (int k = 0; k < nt; k++)
			if (topics[k][0] == '$')
				snprintf(filters + strlen(filters), sizeof filters - strlen(filters),
					 " -t '%s'", topics[k]);
		CHECK_EQ(sh("(mosquitto_sub -p %d %s -V 5 -v -W 1 %s > %s/read%d 2>/dev/null; "
			    "touch %s/rdone%d) &", port, c, filters, dir, i, dir, i), 0);
	}
	wait_files(dir, "rdone", nid);
	kill(broker, SIGTERM);
	waitpid(broker, NULL, 0);

	int compared = 0, allowed = 0, mismatches = 0;
	for (int i = 0; i < nid; i++) {
		acl_client *ac = acl_bind_table(t, ids[i].user, ids[i].user ? strlen(ids[i].user) : 0,
						ids[i].id, strlen(ids[i].id));
		for (int k = 0; k < nt; k++) {
			char line[512];
			snprintf(line, sizeof line, "grep -qxF '%s' %s/wdeny%d 2>/dev/null", topics[k],
				 dir, i);
			bool mw = system(line) != 0;
			snprintf(line, sizeof line, "grep -qxF '%s r' %s/read%d", topics[k], dir, i);
			bool mr = system(line) == 0;
			bool ww = acl_check(ac, topics[k], strlen(topics[k]), ACL_WRITE);
			bool wr = acl_check(ac, topics[k], strlen(topics[k]), ACL_READ);
			if (mw != ww || mr != wr) {
				fprintf(stderr, "%s/%s %s: mosquitto read %d write %d, weft read %d write %d\n",
					ids[i].user ? ids[i].user : "(anonymous)", ids[i].id, topics[k],
					mr, mw, wr, ww);
				mismatches++;
			}
			compared += 2;
			allowed += mw + mr;
		}
		acl_unbind(ac);
	}
	printf("%s: %d decisions compared with mosquitto (%d allowed, %d refused), %d differ\n",
	       acl_name, compared, allowed, compared - allowed, mismatches);
	sh("rm -rf %s", dir);
	acl_table_free(t);
	CHECK_EQ(mismatches, 0);
	CHECK(allowed > 0 && allowed < compared);
}

TEST(vs_mosquitto_rules)
{
	static const ident ids[] = {
		{ NULL, "anon1" }, { "alice", "a1" }, { "bob", "b1" }, { "carol", "c1" },
		{ "ev+il", "e1" }, { "alice", "dev+1" },
	};
	static const char *topics[] = {
		"public/x", "public/private", "inbox/anon", "alice/x", "alice/secret",
		"alice/secret/y", "shared/a/status", "shared/a/b/status", "shared/cmd", "$app/alice",
		"bob/z", "alice/news", "clients/a1/t", "clients/b1/t", "clients/c1/t",
		"clients/anon1/t", "clients/e1/t", "clients/a1/locked", "clients/c1/locked",
		"users/alice/inbox", "users/alice/outbox", "users/carol/inbox", "users/bob/outbox",
		"room-alice/x", "room-carol/x", "extra/alice", "other/thing",
	};
	compare("rules.acl", ids, 6, topics, (int)(sizeof topics / sizeof topics[0]));
}

TEST(vs_mosquitto_patterns)
{
	static const ident ids[] = { { NULL, "anon2" }, { "dave", "d1" }, { "erin", "e1" } };
	static const char *topics[] = {
		"read", "spaced/topic", "dave/x", "dave/blocked", "dave/private", "erin/x",
		"erin/private", "e1/out", "d1/out", "anon2/out", "$app/e1", "$app/d1", "other",
	};
	compare("patterns.acl", ids, 3, topics, (int)(sizeof topics / sizeof topics[0]));
}

/* What a per-message check costs with rules.acl (printed; bounded only loosely). */
TEST(check_cost)
{
	acl_table *t = load("rules.acl");
	acl_client *c = acl_bind_table(t, "carol", 5, "c1", 2);
	int n = SLOW ? 100000 : 1000000, yes = 0;
	int64_t s = weft_now();
	for (int i = 0; i < n; i++)
		yes += acl_check(c, "users/carol/inbox", 17, i & 1 ? ACL_READ : ACL_WRITE);
	int64_t d = weft_now() - s;
	CHECK_EQ(yes, n / 2);
	printf("acl_check through a user without a section and 5 patterns: %.0f ns\n",
	       (double)d / n);
	CHECK(d / n < 20000);
	acl_unbind(c);
	acl_table_free(t);
}

/* Random files made of ACL words, wildcards and junk: each loads, or fails with file:line. */
TEST(random_files)
{
	static const char *words[] = { "topic", "pattern", "user", "read", "write", "readwrite",
				       "deny", "a/b", "+", "#", "a/#", "%u", "%c", "/", " ", "\t",
				       "\n", "\r\n", "#x", "$SYS/#", "a+", "x#", "\xff\xfe", "" };
	uint64_t s = 0x9E3779B97F4A7C15ull;
	int runs = SLOW ? 300 : 3000, ok = 0;
	char text[2048], err[512], path[512];
	snprintf(path, sizeof path, "%s", tmpfile_with("rand.acl", ""));
	for (int i = 0; i < runs; i++) {
		size_t n = 0;
		int k = 1 + (int)(s % 60);
		for (int j = 0; j < k && n < sizeof text - 32; j++) {
			s ^= s << 13, s ^= s >> 7, s ^= s << 17;
			n += (size_t)snprintf(text + n, sizeof text - n, "%s", words[s % 24]);
			if (s & 0x100)
				text[n++] = ' ';
		}
		text[n] = 0;
		FILE *f = fopen(path, "w");
		CHECK(f);
		fwrite(text, 1, n, f);
		fclose(f);
		err[0] = 0;
		acl_table *t = acl_table_load(path, err, sizeof err);
		if (t) {
			ok++;
			acl_client *c = acl_bind_table(t, "u+", 2, "%c", 2);
			acl_check(c, "a/b", 3, ACL_READ);
			acl_check_subscribe(c, "a/#", 3);
			acl_unbind(c);
			acl_table_free(t);
		} else {
			CHECK(!strncmp(err, path, strlen(path)) && err[strlen(path)] == ':' &&
			      strstr(err, ": error: "));
		}
	}
	printf("%d of %d random files loaded, the rest refused with file:line\n", ok, runs);
	CHECK(ok > 0 && ok < runs);
}
