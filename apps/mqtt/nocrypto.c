/*
 * nocrypto.c - stands in for auth.c where weft-mqtt is built without OpenSSL (the aarch64
 * cross build has no libcrypto), and for ws.c, which needs SHA-1: there is no password
 * checking and no WebSocket upgrade, so a configured password_file or websockets listener
 * stops the broker at start instead of being ignored.
 */
#include <stdio.h>
#include <string.h>

#include "auth.h"
#include "ws.h"

int auth_reload(const char *path, const auth_opts *o, char *err, size_t errcap)
{
	(void)o;
	snprintf(err, errcap, "%s: password_file needs a weft-mqtt built with OpenSSL", path);
	return -1;
}

long auth_count(void)
{
	return -1;
}

auth_result auth_check(const auth_req *r)
{
	(void)r;
	return AUTH_NOT_AUTHORIZED;
}

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
