/*
 * tls.c - TLS (OpenSSL) over weft's task-aware sockets.
 *
 * OpenSSL does the protocol; weft does the waiting. Every SSL_* call is made on a
 * non-blocking socket, so it never sleeps a worker thread: when it says SSL_ERROR_WANT_READ or
 * SSL_ERROR_WANT_WRITE the socket returned EAGAIN underneath, and the calling task parks in
 * weft_fd_wait(fd, EPOLLIN or EPOLLOUT, deadline) - its worker runs other tasks - then repeats
 * the call. weft's waits are edge-triggered with a remembered edge: waiting right after an
 * EAGAIN never misses data that came in between.
 *
 * The socket BIO is our own (a dozen lines): send() with MSG_NOSIGNAL, so a peer that went
 * away gives EPIPE rather than killing the process with SIGPIPE, and recv().
 *
 * Sharing one connection between tasks. An SSL object must not be entered by two threads at
 * once, and the broker reads a connection in one task while others write to it. So each
 * tls_conn has `lock`, a weft_mutex held only around the non-blocking SSL calls - never across
 * a wait, so a reader parked for input does not hold up a writer. Writers are serialised
 * among themselves by `wlock`, held for a whole tls_write (waits included): OpenSSL wants a
 * write it could not finish repeated with the same record before anything else is written,
 * and two writers' bytes must not interleave. OpenSSL's error queue is per thread: each call
 * clears it first and reads it before unlocking, before the task could move to another worker.
 *
 * Waiting to read. A plaintext byte may sit in OpenSSL's buffer with nothing left on the socket
 * (and a complete record may sit in the socket after the edge that announced it was taken).
 * tls_wait_readable therefore looks first: plaintext buffered (SSL_pending) means ready; a
 * partial record buffered, or bytes on the socket (a one-byte recv with MSG_PEEK), mean asking
 * OpenSSL with a one-byte SSL_peek, which reads until it has a byte or the socket says EAGAIN.
 * It waits for the socket only when that says WANT_READ, or when nothing is anywhere - then
 * without calling OpenSSL at all, so that an idle connection holds no read buffer (with
 * SSL_MODE_RELEASE_BUFFERS OpenSSL frees it once drained, but a read attempt allocates it).
 *
 * Writes go out as records of at most 16 KiB (SSL_MODE_ENABLE_PARTIAL_WRITE: each record
 * counts as written once it is all on the socket); writev gathers small iovecs into one
 * record instead of a record each. A record half on the socket when the deadline passes stays
 * in OpenSSL; the count returned leaves it out, and the caller's next write, which starts with
 * those same bytes, completes it (SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER: from any address).
 *
 * Versions: TLS 1.2 and 1.3 only (min/max protocol version); renegotiation is off (a TLS 1.2
 * renegotiation would make a write wait for input); an unexpected end of file counts as the
 * peer closing, since MQTT clients often close without close_notify.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <weft.h>

#include "tls.h"

#define RECORD 16384 /* the largest TLS plaintext record */

struct tls_ctx {
	SSL_CTX *ssl;
	bool server;
	bool identity_username;
	char *servername; /* client: SNI */
};

struct tls_conn {
	tls_ctx *ctx;
	SSL *ssl;
	int fd;
	weft_mutex lock;  /* the SSL object: held only around non-blocking SSL calls */
	weft_mutex wlock; /* one writer at a time, across its waits */
	int wpend;        /* plaintext bytes of a record OpenSSL still has to finish */
	uint8_t *gather;  /* writev's record buffer (under wlock) */
	char *username;
	char err[256];
};

/* ---- the socket BIO ---------------------------------------------------------------------- */

static BIO_METHOD *bio_method;

static int bio_write(BIO *b, const char *p, int n)
{
	BIO_clear_retry_flags(b);
	ssize_t r = send(BIO_get_fd(b, NULL), p, (size_t)n, MSG_NOSIGNAL);
	if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
		BIO_set_retry_write(b);
	return (int)r;
}

static int bio_read(BIO *b, char *p, int n)
{
	BIO_clear_retry_flags(b);
	ssize_t r = recv(BIO_get_fd(b, NULL), p, (size_t)n, 0);
	if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
		BIO_set_retry_read(b);
	return (int)r;
}

static long bio_ctrl(BIO *b, int cmd, long num, void *ptr)
{
	switch (cmd) {
	case BIO_C_SET_FD:
		BIO_set_data(b, (void *)(intptr_t)*(int *)ptr);
		BIO_set_init(b, 1);
		(void)num;
		return 1;
	case BIO_C_GET_FD:
		if (ptr)
			*(int *)ptr = (int)(intptr_t)BIO_get_data(b);
		return (long)(intptr_t)BIO_get_data(b);
	case BIO_CTRL_FLUSH:
		return 1;
	default:
		return 0;
	}
}

static void bio_method_init(void)
{
	BIO_METHOD *m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "weft socket");
	if (!m)
		abort();
	BIO_meth_set_write(m, bio_write);
	BIO_meth_set_read(m, bio_read);
	BIO_meth_set_ctrl(m, bio_ctrl);
	bio_method = m;
}

/* ---- contexts ---------------------------------------------------------------------------- */

static bool set(const char *s)
{
	return s && *s;
}

/* OpenSSL's last error in words, after `what`. */
static void ssl_err(char *err, size_t cap, const char *what, const char *path)
{
	char e[200] = "";
	unsigned long code = ERR_peek_last_error();
	if (code)
		ERR_error_string_n(code, e, sizeof e);
	ERR_clear_error();
	if (path)
		snprintf(err, cap, "%s %s: %s", what, path, code ? e : "failed");
	else
		snprintf(err, cap, "%s: %s", what, code ? e : "failed");
}

static tls_ctx *ctx_new(const tls_opts *o, bool server, char *err, size_t cap)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	pthread_once(&once, bio_method_init);
	ERR_clear_error();
	if (server && (!set(o->certfile) || !set(o->keyfile))) {
		snprintf(err, cap, "a TLS listener needs certfile and keyfile");
		return NULL;
	}
	if (set(o->certfile) != set(o->keyfile)) {
		snprintf(err, cap, "certfile and keyfile go together");
		return NULL;
	}
	if (server && (o->require_certificate || o->use_identity_as_username) && !set(o->cafile)) {
		snprintf(err, cap, "require_certificate needs cafile (the CA of client certificates)");
		return NULL;
	}
	const char *files[][2] = { { "certfile", o->certfile }, { "keyfile", o->keyfile },
				   { "cafile", o->cafile } };
	for (int i = 0; i < 3; i++) /* OpenSSL would only say "system lib" */
		if (set(files[i][1]) && access(files[i][1], R_OK) < 0) {
			snprintf(err, cap, "%s %s: %s", files[i][0], files[i][1], strerror(errno));
			return NULL;
		}
	SSL_CTX *c = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
	if (!c) {
		ssl_err(err, cap, "SSL_CTX_new", NULL);
		return NULL;
	}
	SSL_CTX_set_min_proto_version(c, o->tls_version == 13 ? TLS1_3_VERSION : TLS1_2_VERSION);
	SSL_CTX_set_max_proto_version(c, o->tls_version == 12 ? TLS1_2_VERSION : TLS1_3_VERSION);
	SSL_CTX_set_options(c, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION |
				       SSL_OP_IGNORE_UNEXPECTED_EOF);
	SSL_CTX_set_mode(c, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER |
				    SSL_MODE_RELEASE_BUFFERS);
	if (set(o->ciphers) && !SSL_CTX_set_cipher_list(c, o->ciphers)) {
		ssl_err(err, cap, "ciphers", o->ciphers);
		goto fail;
	}
	if (set(o->certfile)) {
		if (!SSL_CTX_use_certificate_chain_file(c, o->certfile)) {
			ssl_err(err, cap, "certfile", o->certfile);
			goto fail;
		}
		if (!SSL_CTX_use_PrivateKey_file(c, o->keyfile, SSL_FILETYPE_PEM)) {
			ssl_err(err, cap, "keyfile", o->keyfile);
			goto fail;
		}
		if (!SSL_CTX_check_private_key(c)) {
			ssl_err(err, cap, "keyfile does not match certfile", o->keyfile);
			goto fail;
		}
	}
	if (set(o->cafile) || (!server && set(o->capath))) {
		const char *dir = !server && set(o->capath) ? o->capath : NULL;
		if (!SSL_CTX_load_verify_locations(c, set(o->cafile) ? o->cafile : NULL, dir)) {
			ssl_err(err, cap, set(o->cafile) ? "cafile" : "capath",
				set(o->cafile) ? o->cafile : o->capath);
			goto fail;
		}
		if (server) {
			STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(o->cafile);
			if (names)
				SSL_CTX_set_client_CA_list(c, names);
		}
	}
	int mode = SSL_VERIFY_NONE;
	if (server && set(o->cafile)) {
		mode = SSL_VERIFY_PEER;
		if (o->require_certificate || o->use_identity_as_username)
			mode |= SSL_VERIFY_FAIL_IF_NO_PEER_CERT;
	} else if (!server && (set(o->cafile) || set(o->capath))) {
		mode = SSL_VERIFY_PEER;
	}
	SSL_CTX_set_verify(c, mode, NULL);
	tls_ctx *ctx = calloc(1, sizeof *ctx);
	if (!ctx) {
		snprintf(err, cap, "out of memory");
		goto fail;
	}
	ctx->ssl = c;
	ctx->server = server;
	ctx->identity_username = server && o->use_identity_as_username;
	if (!server && set(o->servername)) {
		/* kept in the ctx's verify parameters: every connection checks this host */
		X509_VERIFY_PARAM *p = SSL_CTX_get0_param(c);
		ERR_set_mark();
		int ok = X509_VERIFY_PARAM_set1_ip_asc(p, o->servername); /* an address... */
		ERR_pop_to_mark();
		if (!ok) /* ...or a host name */
			ok = X509_VERIFY_PARAM_set1_host(p, o->servername, 0);
		if (!ok) {
			snprintf(err, cap, "servername %s: not usable", o->servername);
			free(ctx);
			goto fail;
		}
		if (!(ctx->servername = strdup(o->servername))) {
			snprintf(err, cap, "out of memory");
			free(ctx);
			goto fail;
		}
	}
	return ctx;
fail:
	SSL_CTX_free(c);
	return NULL;
}

tls_ctx *tls_ctx_server(const tls_opts *o, char *err, size_t cap)
{
	return ctx_new(o, true, err, cap);
}

tls_ctx *tls_ctx_client(const tls_opts *o, char *err, size_t cap)
{
	return ctx_new(o, false, err, cap);
}

void tls_ctx_free(tls_ctx *ctx)
{
	if (!ctx)
		return;
	free(ctx->servername);
	SSL_CTX_free(ctx->ssl);
	free(ctx);
}

/* ---- connections ------------------------------------------------------------------------- */

tls_conn *tls_conn_new(tls_ctx *ctx, int fd)
{
	tls_conn *t = calloc(1, sizeof *t);
	BIO *b = BIO_new(bio_method);
	SSL *s = SSL_new(ctx->ssl);
	if (!t || !b || !s) {
		free(t);
		BIO_free(b);
		SSL_free(s);
		ERR_clear_error();
		errno = ENOMEM;
		return NULL;
	}
	int fl = fcntl(fd, F_GETFL);
	if (fl >= 0 && !(fl & O_NONBLOCK))
		fcntl(fd, F_SETFL, fl | O_NONBLOCK);
	BIO_set_fd(b, fd, BIO_NOCLOSE);
	SSL_set_bio(s, b, b);
	if (ctx->server) {
		SSL_set_accept_state(s);
	} else {
		SSL_set_connect_state(s);
		if (ctx->servername)
			SSL_set_tlsext_host_name(s, ctx->servername);
	}
	t->ctx = ctx;
	t->ssl = s;
	t->fd = fd;
	weft_mutex_init(&t->lock);
	weft_mutex_init(&t->wlock);
	return t;
}

void tls_free(tls_conn *t)
{
	if (!t)
		return;
	SSL_free(t->ssl);
	free(t->gather);
	free(t->username);
	free(t);
}

const char *tls_error(const tls_conn *t)
{
	return t->err;
}

const char *tls_username(const tls_conn *t)
{
	return t->username;
}

const char *tls_version(tls_conn *t)
{
	const char *v;
	WEFT_WITH_LOCK(&t->lock)
		v = SSL_get_version(t->ssl);
	return v;
}

enum { WAIT_IN = 1, WAIT_OUT = 2 };

/*
 * The outcome of an SSL call that returned r <= 0, lock held, error queue fresh: WAIT_IN or
 * WAIT_OUT to wait and repeat, 0 for the peer's close, or -errno (t->err says why).
 */
static int outcome(tls_conn *t, int r)
{
	int saved = errno;
	int e = SSL_get_error(t->ssl, r);
	switch (e) {
	case SSL_ERROR_WANT_READ:
		return WAIT_IN;
	case SSL_ERROR_WANT_WRITE:
		return WAIT_OUT;
	case SSL_ERROR_ZERO_RETURN:
		return 0;
	case SSL_ERROR_SYSCALL:
		ERR_clear_error();
		if (r == 0 || saved == 0) {
			snprintf(t->err, sizeof t->err, "connection closed by the peer");
			return -ECONNRESET;
		}
		snprintf(t->err, sizeof t->err, "%s", strerror(saved));
		return -saved;
	default: {
		char e1[160] = "";
		unsigned long code = ERR_peek_last_error();
		if (code)
			ERR_error_string_n(code, e1, sizeof e1);
		ERR_clear_error();
		long v = SSL_get_verify_result(t->ssl);
		if (v != X509_V_OK)
			snprintf(t->err, sizeof t->err, "%s (%s)", e1,
				 X509_verify_cert_error_string(v));
		else
			snprintf(t->err, sizeof t->err, "%s", code ? e1 : "TLS error");
		return -EPROTO;
	}
	}
}

/* Park until the socket is ready for what OpenSSL asked. Another task of this connection may
 * already wait in that direction (a writer needing input while the reader waits): then poll
 * gently instead. */
static int wait_for(tls_conn *t, int what, int64_t deadline)
{
	int r = weft_fd_wait(t->fd, what == WAIT_IN ? EPOLLIN : EPOLLOUT, deadline);
	if (r != -EBUSY)
		return r;
	int64_t now = weft_now();
	if (now >= deadline)
		return -ETIMEDOUT;
	int64_t until = now + 1000000;
	return weft_sleep_until(until < deadline ? until : deadline);
}

/* Copy the peer certificate's CN into buf. Lock held. */
static int peer_cn(tls_conn *t, char *buf, size_t cap)
{
	X509 *x = SSL_get0_peer_certificate(t->ssl);
	if (!x)
		return -ENOENT;
	X509_NAME *n = X509_get_subject_name(x);
	int i = X509_NAME_get_index_by_NID(n, NID_commonName, -1);
	if (i < 0)
		return -ENOENT;
	ASN1_STRING *d = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(n, i));
	int len = ASN1_STRING_length(d);
	if (len <= 0)
		return -ENOENT;
	if ((size_t)len >= cap)
		return -ENOSPC;
	memcpy(buf, ASN1_STRING_get0_data(d), (size_t)len);
	buf[len] = 0;
	if (strlen(buf) != (size_t)len) /* a NUL inside the name: not a usable identity */
		return -ENOENT;
	return 0;
}

int tls_peer_cn(tls_conn *t, char *buf, size_t cap)
{
	int r;
	WEFT_WITH_LOCK(&t->lock)
		r = peer_cn(t, buf, cap);
	return r;
}

int tls_handshake(tls_conn *t, int64_t deadline)
{
	t->err[0] = 0;
	for (;;) {
		int r, w;
		WEFT_WITH_LOCK(&t->lock) {
			ERR_clear_error();
			errno = 0;
			r = SSL_do_handshake(t->ssl);
			w = r == 1 ? 1 : outcome(t, r);
		}
		if (r == 1)
			break;
		if (w == 0) {
			snprintf(t->err, sizeof t->err, "connection closed during the handshake");
			return -ECONNRESET;
		}
		if (w < 0)
			return w;
		int e = wait_for(t, w, deadline);
		if (e < 0) {
			snprintf(t->err, sizeof t->err, "handshake: %s", strerror(-e));
			return e;
		}
	}
	if (t->ctx->identity_username) {
		char cn[256];
		int r = tls_peer_cn(t, cn, sizeof cn);
		if (r < 0) {
			snprintf(t->err, sizeof t->err,
				 "client certificate without a usable CN (use_identity_as_username)");
			return -EPROTO;
		}
		t->username = strdup(cn);
		if (!t->username)
			return -ENOMEM;
	}
	return 0;
}

ssize_t tls_read(tls_conn *t, void *buf, size_t n, int64_t deadline)
{
	if (n == 0)
		return 0;
	int want = n > INT_MAX ? INT_MAX : (int)n;
	for (;;) {
		int r, w = 0;
		WEFT_WITH_LOCK(&t->lock) {
			ERR_clear_error();
			errno = 0;
			r = SSL_read(t->ssl, buf, want);
			if (r <= 0)
				w = outcome(t, r);
		}
		if (r > 0)
			return r;
		if (w <= 0)
			return w;
		int e = wait_for(t, w, deadline);
		if (e < 0)
			return e;
	}
}

int tls_wait_readable(tls_conn *t, int64_t deadline)
{
	for (;;) {
		int w = 0;
		WEFT_WITH_LOCK(&t->lock) {
			if (SSL_pending(t->ssl) > 0)
				break;
			char c;
			if (!SSL_has_pending(t->ssl) &&
			    recv(t->fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) < 0 &&
			    (errno == EAGAIN || errno == EWOULDBLOCK)) {
				/* nothing anywhere: wait without asking OpenSSL, which would
				 * allocate its 16 KiB read buffer for an idle connection, and
				 * give back the buffers the handshake left */
				SSL_free_buffers(t->ssl);
				w = WAIT_IN;
				break;
			}
			ERR_clear_error();
			errno = 0;
			int r = SSL_peek(t->ssl, &c, 1);
			if (r <= 0)
				w = outcome(t, r);
		}
		if (w <= 0) /* data, the peer's close or an error: tls_read reports it at once */
			return 0;
		int e = wait_for(t, w, deadline);
		if (e < 0)
			return e;
	}
}

/* Write one record's worth (n <= RECORD): n, or what to wait for, or -errno. Lock not held. */
static int write_record(tls_conn *t, const void *p, int n, int *wait)
{
	int r;
	*wait = 0;
	WEFT_WITH_LOCK(&t->lock) {
		ERR_clear_error();
		errno = 0;
		r = SSL_write(t->ssl, p, n);
		if (r <= 0) {
			int w = outcome(t, r);
			if (w == 0) {
				snprintf(t->err, sizeof t->err, "connection closed by the peer");
				w = -EPIPE;
			}
			if (w > 0)
				*wait = w;
			r = w > 0 ? 0 : w;
		}
	}
	if (r > 0)
		t->wpend = 0;
	else if (*wait)
		t->wpend = n;
	return r;
}

/* Copy up to one record of bytes from iov[i] at off onwards into t->gather; returns how many. */
static size_t gather(tls_conn *t, const struct iovec *iov, int cnt, int i, size_t off)
{
	size_t g = 0;
	while (g < RECORD && i < cnt) {
		size_t k = iov[i].iov_len - off;
		if (k > RECORD - g)
			k = RECORD - g;
		memcpy(t->gather + g, (const uint8_t *)iov[i].iov_base + off, k);
		g += k;
		off += k;
		if (off == iov[i].iov_len) {
			i++;
			off = 0;
		}
	}
	return g;
}

/* Move the position (*i, *off) on by k bytes. */
static void advance(const struct iovec *iov, int *i, size_t *off, size_t k)
{
	while (k > 0) {
		size_t step = iov[*i].iov_len - *off;
		if (step > k)
			step = k;
		*off += step;
		k -= step;
		if (*off == iov[*i].iov_len && k) {
			(*i)++;
			*off = 0;
		}
	}
}

/* Write the bytes of iov[0..cnt), one record at a time; wlock held. */
static ssize_t write_all(tls_conn *t, const struct iovec *iov, int cnt, int64_t deadline)
{
	size_t total = 0, done = 0;
	for (int i = 0; i < cnt; i++)
		total += iov[i].iov_len;
	int i = 0;
	size_t off = 0; /* into iov[i] */
	while (done < total) {
		while (off == iov[i].iov_len) {
			i++;
			off = 0;
		}
		const uint8_t *p = (const uint8_t *)iov[i].iov_base + off;
		size_t len = iov[i].iov_len - off;
		if (len < RECORD && done + len < total) { /* small pieces: one record for several */
			if (!t->gather && !(t->gather = malloc(RECORD)))
				return done ? (ssize_t)done : -ENOMEM;
			len = gather(t, iov, cnt, i, off);
			p = t->gather;
		}
		if (len > RECORD)
			len = RECORD;
		if (t->wpend > 0 && len < (size_t)t->wpend) /* not the bytes left unwritten */
			return done ? (ssize_t)done : -EINVAL;
		int w;
		int r = write_record(t, p, (int)len, &w);
		if (r < 0)
			return done ? (ssize_t)done : r;
		if (r > 0) {
			done += (size_t)r;
			advance(iov, &i, &off, (size_t)r);
			continue;
		}
		int e = wait_for(t, w, deadline);
		if (e < 0)
			return done ? (ssize_t)done : e;
	}
	return (ssize_t)done;
}

ssize_t tls_writev(tls_conn *t, const struct iovec *iov, int n, int64_t deadline)
{
	if (n < 0 || (n > 0 && !iov))
		return -EINVAL;
	ssize_t r;
	WEFT_WITH_LOCK(&t->wlock)
		r = write_all(t, iov, n, deadline);
	return r;
}

ssize_t tls_write(tls_conn *t, const void *buf, size_t n, int64_t deadline)
{
	struct iovec v = { (void *)buf, n };
	return tls_writev(t, &v, 1, deadline);
}

int tls_shutdown(tls_conn *t, int64_t deadline)
{
	for (;;) {
		int r, k = 0, w = 0;
		WEFT_WITH_LOCK(&t->lock) {
			ERR_clear_error();
			errno = 0;
			r = SSL_shutdown(t->ssl); /* 0: ours is sent; 1: theirs came too */
			if (r == 0) {
				/* the peer's close_notify comes after whatever it still sends */
				char junk[256];
				k = SSL_read(t->ssl, junk, sizeof junk);
				if (k <= 0)
					w = outcome(t, k);
			} else if (r < 0) {
				w = outcome(t, r);
			}
		}
		if (r == 1)
			return 0;
		if (k > 0) /* data still arriving before the close_notify: read on */
			continue;
		if (w <= 0)
			return w;
		int e = wait_for(t, w, deadline);
		if (e < 0)
			return e;
	}
}
