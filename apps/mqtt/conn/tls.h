/*
 * tls.h - TLS 1.2/1.3 (OpenSSL) over weft's task-aware sockets, for weft-mqtt's listeners and
 * bridges. See tls.c for how it works and docs/weft-mqtt-durability.md for the options.
 *
 * A tls_ctx is one per listener (or per bridge): certificates, CA, verification policy. It is
 * shared by every connection made from it and may be used from any task at once.
 *
 * A tls_conn wraps one connected socket. Every call on it parks the calling task, never the
 * worker, while the socket is not ready; deadlines are absolute (weft_now()), a deadline
 * already past means "do not wait", as in weft.h. One task may read while another writes
 * (the broker's connection task reads, publishers and its writer task write): the calls on one
 * tls_conn serialise on a task-aware lock held only for the non-blocking OpenSSL calls.
 *
 * Errors are -errno as in weft.h; a TLS-level failure (handshake refused, bad certificate,
 * protocol version, a corrupt record) is -EPROTO and tls_error() says what happened in words.
 */
#ifndef WEFT_MQTT_TLS_H
#define WEFT_MQTT_TLS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

typedef struct tls_ctx tls_ctx;
typedef struct tls_conn tls_conn;

/* The listener options (mosquitto's names). Strings are paths; NULL or "" when not set. */
typedef struct tls_opts {
	const char *certfile;          /* PEM certificate chain: ours (server; client optional) */
	const char *keyfile;           /* PEM private key of certfile */
	const char *cafile;            /* PEM CA(s): server: to verify client certificates;
					* client: to verify the server (NULL: no verification) */
	bool require_certificate;      /* server: a client without a valid certificate is refused */
	bool use_identity_as_username; /* server: the client certificate's CN is the username
					* (implies require_certificate) */
	const char *ciphers;           /* TLS 1.2 cipher list (OpenSSL syntax); NULL: default */
	const char *servername;        /* client: SNI and the host name checked in the server's
					* certificate (NULL: none checked) */
	const char *capath;            /* client: a directory of hashed CA certificates (openssl
					* rehash), beside or instead of cafile */
	int tls_version;               /* 12 or 13: only TLS 1.2 or only 1.3; 0: either */
} tls_opts;

/*
 * A context for a listener (tls_ctx_server) or for outgoing connections (tls_ctx_client):
 * TLS 1.2 and 1.3 only, no renegotiation, no compression. Loads and checks the files now, so a
 * bad path, a key that does not match its certificate or an unreadable CA is reported at
 * start-up. Returns NULL with a message in err (cut to cap) on failure.
 */
tls_ctx *tls_ctx_server(const tls_opts *o, char *err, size_t cap);
tls_ctx *tls_ctx_client(const tls_opts *o, char *err, size_t cap);
/* Free ctx once every tls_conn made from it is freed. NULL does nothing. */
void tls_ctx_free(tls_ctx *ctx);

/*
 * Wrap the connected socket fd (the caller keeps owning it and closes it with weft_close after
 * tls_free). fd is made non-blocking. Returns NULL with errno ENOMEM.
 */
tls_conn *tls_conn_new(tls_ctx *ctx, int fd);
/*
 * Run the handshake (server or client side, as the ctx), until the deadline. Returns 0;
 * -EPROTO when TLS refused (tls_error says why: "certificate verify failed", "peer did not
 * return a certificate", "unsupported protocol", ...); -ECONNRESET when the peer went away;
 * -ETIMEDOUT; -ECANCELED; other -errno from the socket.
 */
int tls_handshake(tls_conn *t, int64_t deadline);
/* What the last failure was, in words ("" when none). Valid until the next call on t. */
const char *tls_error(const tls_conn *t);

/* After the handshake: the username the listener assigns (the client certificate's CN under
 * use_identity_as_username, else NULL); the peer certificate's CN copied into buf (0, or
 * -ENOENT without a certificate or CN, -ENOSPC when cap is too small); the protocol version
 * ("TLSv1.3"). */
const char *tls_username(const tls_conn *t);
int tls_peer_cn(tls_conn *t, char *buf, size_t cap);
const char *tls_version(tls_conn *t);

/*
 * Read up to n bytes of plaintext, waiting until the deadline for some. Returns the count
 * (>0), 0 when the peer closed (close_notify, or the socket's end of file), or -errno as
 * above (-ETIMEDOUT when nothing came in time).
 */
ssize_t tls_read(tls_conn *t, void *buf, size_t n, int64_t deadline);
/*
 * Wait until tls_read would return at once (plaintext buffered, the peer closed, an error), as
 * weft_fd_wait(fd, EPOLLIN) for a plain socket: the broker's idle connections wait here with
 * no buffer of their own. Returns 0, -ETIMEDOUT or -ECANCELED.
 */
int tls_wait_readable(tls_conn *t, int64_t deadline);
/*
 * Write n bytes (writev: the iovecs in order), finishing partial writes unless the deadline
 * passes: returns n, or the bytes written when the deadline passed (-ETIMEDOUT if none), or
 * -errno (-EPIPE/-ECONNRESET when the peer went away). As with OpenSSL underneath, after a
 * short count the next write must start with the bytes not yet written (the broker's writer
 * task does just that).
 */
ssize_t tls_write(tls_conn *t, const void *buf, size_t n, int64_t deadline);
ssize_t tls_writev(tls_conn *t, const struct iovec *iov, int n, int64_t deadline);

/*
 * Clean shutdown: send close_notify and wait until the deadline for the peer's (so that the
 * peer knows every byte arrived). Returns 0, or -ETIMEDOUT/-errno if the peer did not answer;
 * either way the caller then frees t and closes the fd.
 */
int tls_shutdown(tls_conn *t, int64_t deadline);
/* Release t (not its fd). NULL does nothing. */
void tls_free(tls_conn *t);

#endif
