/*
 * tls_test.c - TLS over weft sockets (apps/mqtt/tls.c): an echo server on 127.0.0.1 in this
 * process, clients in this process and `openssl s_client`, with a CA, server and client
 * certificates (and a second, unrelated CA) that each test makes with the `openssl` command in
 * a temporary directory.
 *
 * The server runs as the broker will: a task per connection that waits with
 * tls_wait_readable (no buffer), reads what is there without waiting, writes it back. A line
 * containing BYE makes it echo, then shut the session down cleanly.
 *
 * Skipped (test_skip) where the `openssl` command is missing or the test runs under an
 * emulator ($RUNNER set).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include "test.h"
#include "tls.h"

static char path_buf[8][256];

static const char *file(int slot, const char *name)
{
	snprintf(path_buf[slot], sizeof path_buf[slot], "%s/%s", test_tmpdir(), name);
	return path_buf[slot];
}

/* Run a shell command in the scratch directory (from a task: on the blocking pool). Returns its exit status. */
struct shell {
	const char *cmd;
	int rc;
};
static void shell_run(void *arg)
{
	struct shell *s = arg;
	char full[4096];
	snprintf(full, sizeof full, "cd '%s' && { %s ; }", test_tmpdir(), s->cmd);
	int st = system(full);
	s->rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}
static int shell(const char *cmd)
{
	struct shell s = { cmd, -1 };
	if (weft_self())
		weft_blocking(shell_run, &s);
	else
		shell_run(&s);
	return s.rc;
}

/* EC keys: a certificate each in a few milliseconds. */
#define NEWKEY "-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes"
static const char *make_certs =
	"exec >gen.log 2>&1; set -e;"
	/* the CA and an unrelated one */
	"openssl req -x509 " NEWKEY " -keyout ca.key -out ca.crt -subj /CN=weft-test-ca -days 2;"
	"openssl req -x509 " NEWKEY " -keyout other.key -out other.crt -subj /CN=other-ca -days 2;"
	"printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > san.ext;"
	"openssl req " NEWKEY " -keyout server.key -out server.csr -subj /CN=localhost;"
	"openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2"
	" -extfile san.ext -out server.crt;"
	"openssl req " NEWKEY " -keyout client.key -out client.csr -subj /CN=alice;"
	"openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2"
	" -out client.crt;"
	"openssl req " NEWKEY " -keyout rogue.key -out rogue.csr -subj /CN=mallory;"
	"openssl x509 -req -in rogue.csr -CA other.crt -CAkey other.key -CAcreateserial -days 2"
	" -out rogue.crt";

/* Make the certificates, or skip the test saying why. */
static void setup(void)
{
	test_skip_emulated();
	if (system("command -v openssl >/dev/null 2>&1") != 0)
		test_skip("no openssl command (Debian: openssl)");
	test_tmpdir(); /* made here, before tasks and pool threads use it */
	if (shell(make_certs) != 0) {
		shell("cat gen.log >&2");
		CHECK(!"openssl could not make the test certificates");
	}
}

/* ---- the echo server --------------------------------------------------------------------- */

static tls_ctx *srv_ctx;
static int lfd, port;
static atomic_int srv_ok, srv_failed, srv_done, srv_accepted;
static weft_mutex srv_lock = WEFT_MUTEX_INIT;
static char srv_err[512], srv_user[128], srv_version[32];
static atomic_int workers_seen; /* bit per worker that ran a handshake */

static void echo_conn(void *arg)
{
	int fd = (int)(intptr_t)arg;
	tls_conn *t = tls_conn_new(srv_ctx, fd);
	CHECK(t);
	int r = tls_handshake(t, weft_now() + 10000 * MS);
	int w = weft_worker_id();
	if (w >= 0 && w < 31)
		atomic_fetch_or(&workers_seen, 1 << w);
	if (r < 0) {
		WEFT_WITH_LOCK(&srv_lock)
			snprintf(srv_err, sizeof srv_err, "%d %s", r, tls_error(t));
		atomic_fetch_add(&srv_failed, 1);
		goto out;
	}
	WEFT_WITH_LOCK(&srv_lock) {
		snprintf(srv_user, sizeof srv_user, "%s", tls_username(t) ? tls_username(t) : "");
		snprintf(srv_version, sizeof srv_version, "%s", tls_version(t));
	}
	atomic_fetch_add(&srv_ok, 1);
	char buf[8192];
	for (;;) {
		if (tls_wait_readable(t, weft_now() + 10000 * MS) < 0)
			break;
		ssize_t n = tls_read(t, buf, sizeof buf, 0);
		if (n == -ETIMEDOUT)
			continue;
		if (n == 0) { /* the client's close_notify (or end of file): answer it */
			tls_shutdown(t, weft_now() + 1000 * MS);
			break;
		}
		if (n < 0)
			break;
		if (tls_write(t, buf, (size_t)n, weft_now() + 10000 * MS) != n)
			break;
		if (memmem(buf, (size_t)n, "BYE", 3)) {
			tls_shutdown(t, weft_now() + 1000 * MS);
			break;
		}
	}
out:
	tls_free(t);
	weft_close(fd);
	atomic_fetch_add(&srv_done, 1);
}

static void acceptor(void *arg)
{
	(void)arg;
	for (;;) {
		int fd = weft_accept(lfd, NULL, NULL, 0, WEFT_FOREVER);
		if (fd < 0)
			return;
		atomic_fetch_add(&srv_accepted, 1);
		weft_spawn_opts o = { .name = "echo", .detached = 1 };
		CHECK(weft_spawn_opt(echo_conn, (void *)(intptr_t)fd, &o));
	}
}

static weft_task *acc;

static void server_start(const tls_opts *o)
{
	char err[256];
	srv_ctx = tls_ctx_server(o, err, sizeof err);
	if (!srv_ctx)
		fprintf(stderr, "server ctx: %s\n", err);
	CHECK(srv_ctx);
	lfd = weft_tcp_listen("127.0.0.1", 0, 1024);
	CHECK(lfd >= 0);
	struct sockaddr_in a;
	socklen_t len = sizeof a;
	CHECK(getsockname(lfd, (struct sockaddr *)&a, &len) == 0);
	port = ntohs(a.sin_port);
	acc = weft_spawn(acceptor, NULL);
	CHECK(acc);
}

static void server_stop(void)
{
	weft_close(lfd); /* the acceptor wakes with -EBADF */
	weft_join(acc);
	test_await(&srv_done, atomic_load(&srv_accepted)); /* every connection task is over */
}

static tls_opts server_opts(bool require)
{
	tls_opts o = { .certfile = file(0, "server.crt"), .keyfile = file(1, "server.key"),
		       .cafile = file(2, "ca.crt"), .require_certificate = require };
	return o;
}

/* ---- clients ----------------------------------------------------------------------------- */

static tls_ctx *client_ctx(const char *ca, const char *cert, const char *key)
{
	char err[256];
	tls_opts o = { .cafile = ca ? file(3, ca) : NULL, .certfile = cert ? file(4, cert) : NULL,
		       .keyfile = key ? file(5, key) : NULL, .servername = "127.0.0.1" };
	tls_ctx *c = tls_ctx_client(&o, err, sizeof err);
	if (!c)
		fprintf(stderr, "client ctx: %s\n", err);
	CHECK(c);
	return c;
}

static tls_conn *dial(tls_ctx *c, int *fd, int *rc)
{
	*fd = weft_tcp_connect("127.0.0.1", port, weft_now() + 3000 * MS);
	CHECK(*fd >= 0);
	tls_conn *t = tls_conn_new(c, *fd);
	CHECK(t);
	*rc = tls_handshake(t, weft_now() + 3000 * MS);
	return t;
}

/* Send msg, read the same bytes back. */
static void echo_once(tls_conn *t, const uint8_t *msg, size_t n)
{
	CHECK_EQ(tls_write(t, msg, n, weft_now() + 5000 * MS), n);
	uint8_t *back = malloc(n);
	size_t got = 0;
	while (got < n) {
		ssize_t r = tls_read(t, back + got, n - got, weft_now() + 5000 * MS);
		if (r <= 0)
			fprintf(stderr, "read: %zd %s\n", r, tls_error(t));
		CHECK(r > 0);
		got += (size_t)r;
	}
	CHECK(memcmp(back, msg, n) == 0);
	free(back);
}

static void hangup(tls_conn *t, int fd)
{
	tls_free(t);
	weft_close(fd);
}

/* ---- tests ------------------------------------------------------------------------------- */

static int t_roundtrip(void *arg)
{
	(void)arg;
	tls_opts o = server_opts(false);
	server_start(&o);
	tls_ctx *c = client_ctx("ca.crt", NULL, NULL);
	int fd, rc;
	tls_conn *t = dial(c, &fd, &rc);
	if (rc)
		fprintf(stderr, "handshake: %s\n", tls_error(t));
	CHECK_EQ(rc, 0);
	CHECK(strcmp(tls_version(t), "TLSv1.3") == 0);
	CHECK(tls_username(t) == NULL);
	/* sizes around a record, and one of many records (partial writes on the socket) */
	size_t sizes[] = { 1, 100, 16383, 16384, 16385, 70000, 1 << 20 };
	uint8_t *big = malloc(1 << 20);
	for (size_t i = 0; i < (1 << 20); i++)
		big[i] = (uint8_t)(i * 7 + i / 251);
	for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
		echo_once(t, big, sizes[i]);
	/* writev gathers small pieces into records */
	struct iovec v[40];
	size_t total = 0;
	for (int i = 0; i < 40; i++) {
		v[i].iov_base = big + total;
		v[i].iov_len = 1 + (size_t)i * 997;
		total += v[i].iov_len;
	}
	CHECK_EQ(tls_writev(t, v, 40, weft_now() + 5000 * MS), total);
	uint8_t *back = malloc(total);
	for (size_t got = 0; got < total;) {
		ssize_t r = tls_read(t, back + got, total - got, weft_now() + 5000 * MS);
		CHECK(r > 0);
		got += (size_t)r;
	}
	CHECK(memcmp(back, big, total) == 0);
	/* nothing more to read: the wait times out */
	CHECK_EQ(tls_wait_readable(t, weft_now() + 50 * MS), -ETIMEDOUT);
	CHECK_EQ(tls_read(t, back, 10, 0), -ETIMEDOUT);
	/* clean shutdown from our side: the server sees the end */
	CHECK_EQ(tls_shutdown(t, weft_now() + 2000 * MS), 0);
	hangup(t, fd);
	test_await(&srv_done, 1);
	free(back);
	free(big);
	server_stop();
	tls_ctx_free(c);
	tls_ctx_free(srv_ctx);
	return 0;
}

TEST(roundtrip)
{
	setup();
	RUN(t_roundtrip);
}

static int t_identity(void *arg)
{
	(void)arg;
	tls_opts o = server_opts(true);
	o.use_identity_as_username = true;
	server_start(&o);
	tls_ctx *c = client_ctx("ca.crt", "client.crt", "client.key");
	int fd, rc;
	tls_conn *t = dial(c, &fd, &rc);
	CHECK_EQ(rc, 0);
	echo_once(t, (const uint8_t *)"hello", 5);
	test_await(&srv_ok, 1);
	WEFT_WITH_LOCK(&srv_lock)
		CHECK(strcmp(srv_user, "alice") == 0);
	char cn[64];
	CHECK_EQ(tls_peer_cn(t, cn, sizeof cn), 0); /* the client sees the server's CN */
	CHECK(strcmp(cn, "localhost") == 0);
	CHECK_EQ(tls_peer_cn(t, cn, 4), -ENOSPC);
	/* the server ends the session on BYE: the client reads the end */
	echo_once(t, (const uint8_t *)"BYE", 3);
	char b[8];
	CHECK_EQ(tls_read(t, b, sizeof b, weft_now() + 2000 * MS), 0);
	hangup(t, fd);
	server_stop();
	tls_ctx_free(c);
	tls_ctx_free(srv_ctx);
	return 0;
}

TEST(client_certificate_identity)
{
	setup();
	RUN(t_identity);
}

/* The client handshake result and the server's error, for one client configuration. */
static int refused(tls_opts *so, const char *ca, const char *cert, const char *key,
		   char *cerr, size_t cap)
{
	server_start(so);
	tls_ctx *c = client_ctx(ca, cert, key);
	int fd, rc;
	tls_conn *t = dial(c, &fd, &rc);
	if (rc == 0) {
		/* TLS 1.3: the server judges the client's certificate after the client's
		 * handshake is over; its refusal (an alert) is what the first read finds. Not
		 * writing first: a write to the socket the server closed would draw a reset,
		 * which discards the alert. */
		char b[8];
		rc = (int)tls_read(t, b, sizeof b, weft_now() + 2000 * MS);
	}
	snprintf(cerr, cap, "%s", tls_error(t));
	hangup(t, fd);
	test_await(&srv_failed, 1);
	server_stop();
	tls_ctx_free(c);
	tls_ctx_free(srv_ctx);
	return rc;
}

static int t_wrong_ca(void *arg)
{
	(void)arg;
	char cerr[256];
	/* the client trusts another CA: it refuses the server */
	tls_opts o = server_opts(false);
	int rc = refused(&o, "other.crt", NULL, NULL, cerr, sizeof cerr);
	fprintf(stderr, "client: %d %s\nserver: %s\n", rc, cerr, srv_err);
	CHECK_EQ(rc, -EPROTO);
	CHECK(strstr(cerr, "certificate verify failed"));
	CHECK(strstr(cerr, "self-signed certificate in certificate chain"));
	/* the client's certificate comes from a CA the server does not know */
	atomic_store(&srv_failed, 0);
	o = server_opts(true);
	rc = refused(&o, "ca.crt", "rogue.crt", "rogue.key", cerr, sizeof cerr);
	fprintf(stderr, "client: %d %s\nserver: %s\n", rc, cerr, srv_err);
	CHECK(rc < 0);
	CHECK(strstr(srv_err, "certificate verify failed"));
	return 0;
}

TEST(wrong_ca_refused)
{
	setup();
	RUN(t_wrong_ca);
}

static int t_missing(void *arg)
{
	(void)arg;
	char cerr[256];
	tls_opts o = server_opts(true);
	int rc = refused(&o, "ca.crt", NULL, NULL, cerr, sizeof cerr);
	fprintf(stderr, "client: %d %s\nserver: %s\n", rc, cerr, srv_err);
	CHECK(rc < 0);
	CHECK(strstr(srv_err, "peer did not return a certificate"));
	CHECK(strstr(cerr, "certificate required"));
	return 0;
}

TEST(missing_client_certificate_refused)
{
	setup();
	RUN(t_missing);
}

/* `openssl s_client` with the given options, stdin from a file; output kept in out.txt. */
static int s_client(const char *opts, const char *input)
{
	char cmd[1024];
	FILE *f = fopen(file(6, "in.txt"), "w");
	CHECK(f);
	fputs(input, f);
	fclose(f);
	snprintf(cmd, sizeof cmd,
		 "timeout 10 openssl s_client -connect 127.0.0.1:%d -quiet %s "
		 "<in.txt >out.txt 2>err.txt",
		 port, opts);
	return shell(cmd);
}

static bool out_has(const char *name, const char *what)
{
	char buf[8192] = "";
	FILE *f = fopen(file(7, name), "r");
	if (!f)
		return false;
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	buf[n] = 0;
	fclose(f);
	return strstr(buf, what) != NULL;
}

static int t_tls11(void *arg)
{
	(void)arg;
	tls_opts o = server_opts(false);
	server_start(&o);
	/* TLS 1.1 needs the legacy security level on the client to be offered at all */
	int rc = s_client("-tls1_1 -cipher DEFAULT@SECLEVEL=0 -CAfile ca.crt", "hello\n");
	CHECK(rc != 0);
	test_await(&srv_failed, 1);
	fprintf(stderr, "server: %s\n", srv_err);
	CHECK(strstr(srv_err, "unsupported protocol"));
	/* TLS 1.2 is still welcome */
	rc = s_client("-tls1_2 -CAfile ca.crt", "tls12 BYE\n");
	CHECK_EQ(rc, 0);
	CHECK(out_has("out.txt", "tls12 BYE"));
	WEFT_WITH_LOCK(&srv_lock)
		CHECK(strcmp(srv_version, "TLSv1.2") == 0);
	server_stop();
	tls_ctx_free(srv_ctx);
	return 0;
}

TEST(tls11_refused_tls12_accepted)
{
	setup();
	RUN(t_tls11);
}

static int t_s_client(void *arg)
{
	(void)arg;
	tls_opts o = server_opts(true);
	o.use_identity_as_username = true;
	server_start(&o);
	int rc = s_client("-CAfile ca.crt -verify_return_error -cert client.crt -key client.key",
			  "hello from s_client BYE\n");
	if (rc)
		shell("cat err.txt >&2");
	CHECK_EQ(rc, 0);
	CHECK(out_has("out.txt", "hello from s_client BYE"));
	test_await(&srv_done, 1);
	WEFT_WITH_LOCK(&srv_lock) {
		CHECK(strcmp(srv_user, "alice") == 0);
		CHECK(strcmp(srv_version, "TLSv1.3") == 0);
	}
	/* without its certificate s_client is turned away */
	rc = s_client("-CAfile ca.crt", "no cert\n");
	test_await(&srv_failed, 1);
	CHECK(!out_has("out.txt", "no cert"));
	server_stop();
	tls_ctx_free(srv_ctx);
	return 0;
}

TEST(openssl_s_client_end_to_end)
{
	setup();
	RUN(t_s_client);
}

/* Many connections at once on every worker, while some peers stall: stalled handshakes and
 * idle sessions park their tasks, so the others keep going. */
#define STALL_TCP 8
#define STALL_TLS 4
static tls_ctx *many_ctx;
static atomic_int many_ok;

static void many_client(void *arg)
{
	int id = (int)(intptr_t)arg;
	int fd, rc;
	tls_conn *t = dial(many_ctx, &fd, &rc);
	CHECK_EQ(rc, 0);
	uint8_t msg[600];
	for (int i = 0; i < 20; i++) {
		memset(msg, 'a' + (id + i) % 26, sizeof msg);
		echo_once(t, msg, 1 + (size_t)((id * 31 + i * 17) % (int)sizeof msg));
	}
	tls_shutdown(t, weft_now() + 1000 * MS);
	hangup(t, fd);
	atomic_fetch_add(&many_ok, 1);
}

static int t_many(void *arg)
{
	(void)arg;
	tls_opts o = server_opts(false);
	server_start(&o);
	many_ctx = client_ctx("ca.crt", NULL, NULL);
	int stalled[STALL_TCP + STALL_TLS];
	tls_conn *idle[STALL_TLS];
	for (int i = 0; i < STALL_TCP; i++) { /* connect, never say a word */
		stalled[i] = weft_tcp_connect("127.0.0.1", port, weft_now() + 1000 * MS);
		CHECK(stalled[i] >= 0);
	}
	for (int i = 0; i < STALL_TLS; i++) { /* handshake, then silence */
		int rc;
		idle[i] = dial(many_ctx, &stalled[STALL_TCP + i], &rc);
		CHECK_EQ(rc, 0);
	}
	int n = SLOW ? 60 : 200;
	int64_t t0 = weft_now();
	weft_task *tasks[200];
	for (int i = 0; i < n; i++)
		CHECK(tasks[i] = weft_spawn(many_client, (void *)(intptr_t)i));
	for (int i = 0; i < n; i++)
		weft_join(tasks[i]);
	int64_t took = weft_now() - t0;
	fprintf(stderr, "%d clients x 20 echoes in %lld ms on %d workers (seen mask %#x)\n", n,
		(long long)(took / MS), weft_worker_max(), atomic_load(&workers_seen));
	CHECK_EQ(atomic_load(&many_ok), n);
	CHECK(took < 8000 * MS); /* before the stalled handshakes time out (10 s) */
	CHECK_EQ(atomic_load(&srv_failed), 0);
	if (weft_worker_max() > 1) /* handshakes ran on more than one worker */
		CHECK(__builtin_popcount((unsigned)atomic_load(&workers_seen)) > 1);
	for (int i = 0; i < STALL_TLS; i++)
		tls_free(idle[i]);
	for (int i = 0; i < STALL_TCP + STALL_TLS; i++)
		weft_close(stalled[i]);
	test_await(&srv_done, n + STALL_TCP + STALL_TLS);
	server_stop();
	tls_ctx_free(many_ctx);
	tls_ctx_free(srv_ctx);
	return 0;
}

TEST(many_connections_all_workers)
{
	setup();
	RUN(t_many);
}

TEST(bad_files_clear_errors)
{
	setup();
	char err[256];
	tls_opts o = { .certfile = "/nonexistent/server.crt", .keyfile = file(1, "server.key") };
	CHECK(!tls_ctx_server(&o, err, sizeof err));
	fprintf(stderr, "%s\n", err);
	CHECK(strstr(err, "certfile /nonexistent/server.crt: No such file or directory"));
	o.certfile = file(0, "server.crt");
	o.keyfile = file(1, "client.key"); /* another key */
	CHECK(!tls_ctx_server(&o, err, sizeof err));
	fprintf(stderr, "%s\n", err);
	CHECK(strstr(err, "key values mismatch"));
	o.keyfile = file(1, "server.key");
	o.require_certificate = true;
	CHECK(!tls_ctx_server(&o, err, sizeof err));
	CHECK(strstr(err, "cafile"));
	o.cafile = file(2, "san.ext"); /* not a certificate */
	CHECK(!tls_ctx_server(&o, err, sizeof err));
	fprintf(stderr, "%s\n", err);
	CHECK(strstr(err, "cafile"));
	tls_opts none = { 0 };
	CHECK(!tls_ctx_server(&none, err, sizeof err));
	CHECK(strstr(err, "certfile and keyfile"));
}

/* ---- one connection shared by tasks, and writes that do not wait ------------------------- */

#define DUPLEX_BYTES (SLOW ? (1 << 20) : (8 << 20))

static tls_conn *dup_t;
static uint8_t *dup_back;
static atomic_int dup_read_done;

static uint8_t pattern(size_t i)
{
	return (uint8_t)(i * 2654435761u >> 13);
}

/* Reads the echo while another task writes on the same connection. */
static void duplex_reader(void *arg)
{
	(void)arg;
	size_t got = 0;
	while (got < DUPLEX_BYTES) {
		if (tls_wait_readable(dup_t, weft_now() + 10000 * MS) < 0)
			break;
		ssize_t r = tls_read(dup_t, dup_back + got, DUPLEX_BYTES - got, 0);
		if (r == -ETIMEDOUT)
			continue;
		CHECK(r > 0);
		got += (size_t)r;
	}
	CHECK_EQ(got, DUPLEX_BYTES);
	atomic_store(&dup_read_done, 1);
}

static int t_duplex(void *arg)
{
	(void)arg;
	tls_opts o = server_opts(false);
	server_start(&o);
	tls_ctx *c = client_ctx("ca.crt", NULL, NULL);
	int fd, rc;
	dup_t = dial(c, &fd, &rc);
	CHECK_EQ(rc, 0);
	int small = 8192; /* a small send buffer: writes that do not wait get cut short */
	CHECK(setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &small, sizeof small) == 0);
	uint8_t *out = malloc(DUPLEX_BYTES);
	dup_back = malloc(DUPLEX_BYTES);
	for (size_t i = 0; i < DUPLEX_BYTES; i++)
		out[i] = pattern(i);
	weft_task *rd = weft_spawn(duplex_reader, NULL);
	/* writes of odd sizes, as a broker's batches, some without waiting (deadline 0): a short
	 * count means the rest is written by the next call, starting where it stopped */
	size_t off = 0;
	int partial = 0;
	while (off < DUPLEX_BYTES) {
		size_t n = 1 + (off * 7919) % 50000;
		if (n > DUPLEX_BYTES - off)
			n = DUPLEX_BYTES - off;
		int64_t dl = (off / 50000) % 2 ? 0 : weft_now() + 10000 * MS;
		ssize_t w;
		if (n >= 3 && (off / 3) % 2) { /* or in three pieces, gathered into records */
			struct iovec v[3] = { { out + off, n / 3 }, { out + off + n / 3, 1 },
					      { out + off + n / 3 + 1, n - n / 3 - 1 } };
			w = tls_writev(dup_t, v, 3, dl);
		} else {
			w = tls_write(dup_t, out + off, n, dl);
		}
		if (dl == 0 && w == -ETIMEDOUT) {
			partial++;
			weft_yield();
			continue;
		}
		CHECK(w > 0);
		partial += (size_t)w < n;
		off += (size_t)w;
	}
	weft_join(rd);
	CHECK(memcmp(out, dup_back, DUPLEX_BYTES) == 0);
	fprintf(stderr, "%d MiB through one connection, %d writes cut short and resumed\n",
		DUPLEX_BYTES >> 20, partial);
	CHECK(partial > 0);
	CHECK_EQ(tls_shutdown(dup_t, weft_now() + 2000 * MS), 0);
	hangup(dup_t, fd);
	server_stop();
	tls_ctx_free(c);
	tls_ctx_free(srv_ctx);
	free(out);
	free(dup_back);
	return 0;
}

TEST(full_duplex_tasks_and_short_writes)
{
	setup();
	RUN(t_duplex);
}
