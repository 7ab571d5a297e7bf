/*
 * nocrypto.c - stands in for ws.c, which needs SHA-1, and for tls.c where weft-mqtt is built
 * without OpenSSL (the aarch64 cross build has no libcrypto): there is no WebSocket upgrade
 * and no TLS, so a configured websockets listener or certfile stops the broker at start
 * instead of being ignored. Its twin for password checking is access/auth_nocrypto.c.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "tls.h"
#include "ws.h"

/* WebSockets: main.c refuses a websockets listener in this build, so these never run. */
void ws_init(ws *w, const ws_limits *lim)
{
	(void)lim;
	memset(w, 0, sizeof *w);
	w->state = WS_CLOSED;
}

void ws_free(ws *w)
{
	(void)w;
}

int ws_feed(ws *w, const uint8_t *in, size_t n, uint8_t *out, size_t *out_len)
{
	(void)w, (void)in, (void)n, (void)out;
	*out_len = 0;
	return WS_E_BAD_REQUEST;
}

size_t ws_reply(ws *w, uint8_t *out)
{
	(void)w, (void)out;
	return 0;
}

size_t ws_frame_header(uint8_t h[10], uint64_t n)
{
	(void)h, (void)n;
	return 0;
}

size_t ws_close_frame(uint8_t out[4], int code)
{
	(void)out, (void)code;
	return 0;
}

/* TLS: tls_ctx_server fails, so no connection ever has a tls_conn. */
tls_ctx *tls_ctx_server(const tls_opts *o, char *err, size_t cap)
{
	(void)o;
	snprintf(err, cap, "TLS needs a weft-mqtt built with OpenSSL");
	return NULL;
}

tls_ctx *tls_ctx_client(const tls_opts *o, char *err, size_t cap)
{
	return tls_ctx_server(o, err, cap);
}

void tls_ctx_free(tls_ctx *ctx)
{
	(void)ctx;
}

tls_conn *tls_conn_new(tls_ctx *ctx, int fd)
{
	(void)ctx, (void)fd;
	return NULL;
}

int tls_handshake(tls_conn *t, int64_t deadline)
{
	(void)t, (void)deadline;
	return -EPROTO;
}

const char *tls_error(const tls_conn *t)
{
	(void)t;
	return "no TLS in this build";
}

const char *tls_username(const tls_conn *t)
{
	(void)t;
	return NULL;
}

ssize_t tls_read(tls_conn *t, void *buf, size_t n, int64_t deadline)
{
	(void)t, (void)buf, (void)n, (void)deadline;
	return -EPROTO;
}

int tls_wait_readable(tls_conn *t, int64_t deadline)
{
	(void)t, (void)deadline;
	return -EPROTO;
}

ssize_t tls_write(tls_conn *t, const void *buf, size_t n, int64_t deadline)
{
	(void)t, (void)buf, (void)n, (void)deadline;
	return -EPROTO;
}

int tls_shutdown(tls_conn *t, int64_t deadline)
{
	(void)t, (void)deadline;
	return 0;
}

void tls_free(tls_conn *t)
{
	(void)t;
}
