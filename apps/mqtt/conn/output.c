/*
 * output.c - what a connection writes itself, outside its session's output: the socket's write
 * (through TLS on a TLS listener), the WebSocket framing of a session's output, the packets of
 * a connection with no session yet (a CONNACK refusing it, a PINGRESP before...), and the
 * WebSocket layer's own frames (the upgrade's answer, pongs, the close).
 *
 * Invariant: once a session writes to the socket (route/writer.c), nothing else may interleave
 * a frame with its write: the WebSocket layer's frames go out only while no writer runs. A
 * session's output is route/'s (session_send, writer.c); this file is the peer's end of it.
 */
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include <weft.h>

#include "codec.h"
#include "conn.h"
#include "conn_public.h"
#include "pool.h"
#include "records.h"
#include "session.h"
#include "tls.h"
#include "ws.h"

ssize_t conn_write(conn *c, const void *buf, size_t n, int64_t deadline)
{
	if (c->tls)
		return tls_write(c->tls, buf, n, deadline);
	return weft_write(c->fd, buf, n, deadline);
}

uint8_t *conn_frame(conn *c, uint8_t *buf, size_t *len)
{
	if (!c->ws)
		return buf;
	uint8_t h[10];
	size_t hl = ws_frame_header(h, *len);
	uint8_t *f = pool_alloc(*len + hl);
	memcpy(f, h, hl);
	memcpy(f + hl, buf, *len);
	pool_free(buf);
	*len += hl;
	return f;
}

/* A write outside the session's output (before CONNECT is accepted): framed for WebSockets. */
void conn_write_now(conn *c, const void *p, size_t n)
{
	if (c->ws) {
		uint8_t h[10];
		size_t hl = ws_frame_header(h, n);
		if (conn_write(c, h, hl, weft_now() + 1000000000) != (ssize_t)hl)
			return;
	}
	conn_write(c, p, n, weft_now() + 1000000000);
}

void conn_send(conn *c, const void *p, size_t n)
{
	if (c->s)
		session_send(c->s, p, n, c);
	else
		conn_write_now(c, p, n);
}

/* What the WebSocket layer must send itself (the upgrade's answer, a pong, a close frame).
 * Once a session writes to the socket it must not be interleaved with a frame being written:
 * it goes out only while no writer runs (waiting a little), and a pong that cannot is dropped
 * (the client pings again). */
void conn_ws_reply(conn *c)
{
	uint8_t r[WS_REPLY_MAX];
	size_t n = ws_reply(c->ws, r);
	if (!n)
		return;
	session *s = c->s;
	if (!s) {
		conn_write(c, r, n, weft_now() + 1000000000);
		return;
	}
	WEFT_WITH_LOCK(&s->lock) {
		int64_t dl = weft_now() + 100000000;
		while (s->writing && weft_cond_wait_until(&s->idle, &s->lock, dl) != -ETIMEDOUT)
			;
		if (!s->writing && s->conn == c)
			conn_write(c, r, n, 0);
	}
}

/* A CONNACK refusing the connection (before any session). */
void conn_refuse(conn *c, int version, int rc5, int rc3)
{
	uint8_t b[8];
	size_t n = mq_enc_connack(b, version == 5 ? 5 : 4, 0, version == 5 ? rc5 : rc3, NULL);
	conn_write_now(c, b, n);
}

/* A WebSocket client's last frame: the close the client asked for (or one for an error),
 * else a normal close. Only once the upgrade is done. */
void conn_ws_close(conn *c)
{
	if (!c->ws)
		return;
	uint8_t r[WS_REPLY_MAX];
	size_t n = ws_reply(c->ws, r);
	if (!n && c->ws->state == WS_OPEN)
		n = ws_close_frame(r, 1000);
	if (n)
		conn_write(c, r, n, weft_now() + 200000000);
}
