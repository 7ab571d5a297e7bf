/*
 * ws.c - RFC 6455, server side, as a stream adapter for MQTT (see ws.h for the interface).
 *
 * Upgrade. Bytes are collected until the blank line that ends the request (or max_request,
 * 431). The request line must be "GET <target> HTTP/1.1" (or a later 1.x); header names are
 * matched without case, values trimmed. We need Host, Upgrade containing the token websocket,
 * Connection containing the token upgrade, exactly one Sec-WebSocket-Key that decodes to 16
 * bytes, and Sec-WebSocket-Version 13 (else 426 naming 13). Of the subprotocols offered we take
 * "mqtt", else "mqttv3.1" (older clients); offering only others is a 400; offering none is
 * accepted without a Sec-WebSocket-Protocol answer. Bytes after the blank line are frames:
 * they came in this same feed, so they are decoded straight from the caller's input.
 *
 * Frames. A header is 2 to 14 bytes; its bytes are gathered in hdr[] when a read splits it. We
 * check, in the order a reader meets them: RSV bits clear (no extension was agreed), a known
 * opcode, the MASK bit set (clients must mask), control frames final and at most 125 bytes,
 * lengths in their shortest form with the top bit clear, continuation only inside a message and
 * a new message only outside one, then the size limits. A text frame is refused with 1003:
 * MQTT travels in binary frames only. Payload bytes are unmasked as they arrive, eight at a
 * time where they can be, straight into the output (data) or into ctl[] (control). A finished
 * ping leaves a pong to send (only the latest one, as 5.5.3 allows); a close frame's code is
 * checked (1000-1003, 1007-1014, 3000-4999) and its reason must be UTF-8, and it is answered
 * with a close frame carrying the same code.
 *
 * Every error moves the ws to WS_CLOSED with its answer pending; after that input is ignored.
 */
#define _GNU_SOURCE /* memmem */
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "ws.h"

#define GUID "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
#define HTTP_MAX 256                     /* our longest HTTP answer is 163 bytes */
_Static_assert(HTTP_MAX + 2 + 125 + 4 <= WS_REPLY_MAX, "answer, pong and close fit a reply");

void ws_init(ws *w, const ws_limits *lim)
{
	memset(w, 0, sizeof *w);
	w->lim.max_frame = 1ull << 28;
	w->lim.max_request = 8192;
	if (lim) {
		if (lim->max_frame)
			w->lim.max_frame = lim->max_frame;
		if (lim->max_request)
			w->lim.max_request = lim->max_request;
		w->lim.max_message = lim->max_message;
	}
	w->state = WS_HANDSHAKE;
}

/* The request buffer; the HTTP answer goes with it unless it is still to be fetched. */
static void free_request(ws *w)
{
	free(w->req);
	w->req = NULL;
}

void ws_free(ws *w)
{
	free_request(w);
	free(w->http);
	w->http = NULL;
	w->http_len = 0;
}

static char *http_buf(ws *w)
{
	if (!w->http) {
		w->http = malloc(HTTP_MAX);
		if (!w->http)
			abort();
	}
	return w->http;
}

/* ---- replies -------------------------------------------------------------------------------- */

size_t ws_frame_header(uint8_t h[10], uint64_t n)
{
	h[0] = 0x82;
	if (n < 126) {
		h[1] = (uint8_t)n;
		return 2;
	}
	if (n < 65536) {
		h[1] = 126;
		h[2] = (uint8_t)(n >> 8);
		h[3] = (uint8_t)n;
		return 4;
	}
	h[1] = 127;
	for (int i = 0; i < 8; i++)
		h[2 + i] = (uint8_t)(n >> (56 - 8 * i));
	return 10;
}

size_t ws_close_frame(uint8_t out[4], int code)
{
	out[0] = 0x88;
	out[1] = 2;
	out[2] = (uint8_t)(code >> 8);
	out[3] = (uint8_t)code;
	return 4;
}

size_t ws_reply(ws *w, uint8_t *out)
{
	size_t n = 0;
	if (w->http) {
		memcpy(out, w->http, w->http_len);
		n += w->http_len;
		free(w->http);
		w->http = NULL;
		w->http_len = 0;
	}
	if (w->pong_pending) {
		out[n++] = 0x8A;
		out[n++] = w->pong_len;
		memcpy(out + n, w->pong, w->pong_len);
		n += w->pong_len;
		w->pong_pending = false;
	}
	if (w->close_pending) {
		n += ws_close_frame(out + n, w->close_code);
		w->close_pending = false;
	}
	return n;
}

/* End the stream with result r: an HTTP answer during the upgrade, else a close frame. */
static int fail(ws *w, int r)
{
	if (w->state == WS_HANDSHAKE) {
		const char *msg = r == WS_E_VERSION ? "426 Upgrade Required\r\nSec-WebSocket-Version: 13"
				  : r == WS_E_REQUEST_TOO_LARGE ? "431 Request Header Fields Too Large"
								: "400 Bad Request";
		int len = snprintf(http_buf(w), HTTP_MAX,
				   "HTTP/1.1 %s\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", msg);
		w->http_len = (uint16_t)(len < HTTP_MAX ? len : HTTP_MAX - 1);
		free_request(w);
	} else {
		w->close_pending = true;
		w->close_code = (uint16_t)-r;
		w->pong_pending = false;
	}
	w->state = WS_CLOSED;
	w->result = r;
	return r;
}

/* ---- the upgrade ---------------------------------------------------------------------------- */

void ws_accept_key(const char *key, size_t len, char out[29])
{
	unsigned char md[EVP_MAX_MD_SIZE];
	unsigned int mdlen = 0;
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	if (!ctx || !EVP_DigestInit_ex(ctx, EVP_sha1(), NULL) || !EVP_DigestUpdate(ctx, key, len) ||
	    !EVP_DigestUpdate(ctx, GUID, strlen(GUID)) || !EVP_DigestFinal_ex(ctx, md, &mdlen))
		abort(); /* only when memory is out */
	EVP_MD_CTX_free(ctx);
	EVP_EncodeBlock((unsigned char *)out, md, (int)mdlen);
}

typedef struct span {
	const char *p;
	size_t n;
} span;

static bool span_ieq(span s, const char *lit)
{
	return s.n == strlen(lit) && !strncasecmp(s.p, lit, s.n);
}

static span trim(const char *p, const char *e)
{
	while (p < e && (*p == ' ' || *p == '\t'))
		p++;
	while (e > p && (e[-1] == ' ' || e[-1] == '\t'))
		e--;
	return (span){ p, (size_t)(e - p) };
}

/* Whether a comma-separated list holds tok (case-insensitively if nocase). */
static bool list_has(span v, const char *tok, bool nocase)
{
	const char *p = v.p, *e = v.p + v.n;
	while (p < e) {
		const char *c = memchr(p, ',', (size_t)(e - p));
		span t = trim(p, c ? c : e);
		size_t tl = strlen(tok);
		if (t.n == tl && (nocase ? !strncasecmp(t.p, tok, tl) : !memcmp(t.p, tok, tl)))
			return true;
		p = c ? c + 1 : e;
	}
	return false;
}

static bool key_ok(span k)
{
	if (k.n != 24 || k.p[22] != '=' || k.p[23] != '=')
		return false;
	for (size_t i = 0; i < 22; i++) {
		char c = k.p[i];
		if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
		      c == '+' || c == '/'))
			return false;
	}
	return true;
}

/* The request in req[0..len) ends with its blank line. Returns 0 or a WS_E_* code. */
static int upgrade(ws *w, const char *req, size_t len)
{
	const char *p = req, *end = req + len;
	const char *eol = memmem(p, (size_t)(end - p), "\r\n", 2);
	/* request line: GET SP target SP HTTP/1.x */
	if (!eol || eol - p < 14 || memcmp(p, "GET ", 4))
		return WS_E_BAD_REQUEST;
	const char *sp = memchr(p + 4, ' ', (size_t)(eol - p - 4));
	if (!sp || sp == p + 4 || eol - sp != 9 || memcmp(sp + 1, "HTTP/1.", 7) || sp[8] < '1' ||
	    sp[8] > '9')
		return WS_E_BAD_REQUEST;
	span host = { 0 }, upg = { 0 }, conn = { 0 }, key = { 0 }, ver = { 0 };
	int nkey = 0;
	bool offered = false, mqtt = false, mqtt31 = false;
	for (p = eol + 2; p < end; p = eol + 2) {
		eol = memmem(p, (size_t)(end - p), "\r\n", 2);
		if (!eol)
			return WS_E_BAD_REQUEST;
		if (eol == p)
			break; /* the blank line */
		const char *colon = memchr(p, ':', (size_t)(eol - p));
		if (!colon || colon == p || *p == ' ' || *p == '\t' || colon[-1] == ' ')
			return WS_E_BAD_REQUEST;
		span name = { p, (size_t)(colon - p) }, val = trim(colon + 1, eol);
		for (size_t i = 0; i < val.n; i++)
			if ((unsigned char)val.p[i] < 0x20 && val.p[i] != '\t')
				return WS_E_BAD_REQUEST;
		if (span_ieq(name, "Host"))
			host = val;
		else if (span_ieq(name, "Upgrade"))
			upg = val;
		else if (span_ieq(name, "Connection"))
			conn = val;
		else if (span_ieq(name, "Sec-WebSocket-Key"))
			key = val, nkey++;
		else if (span_ieq(name, "Sec-WebSocket-Version"))
			ver = val;
		else if (span_ieq(name, "Sec-WebSocket-Protocol")) {
			offered = true;
			mqtt |= list_has(val, "mqtt", false);
			mqtt31 |= list_has(val, "mqttv3.1", false);
		}
	}
	if (!host.p || !upg.p || !list_has(upg, "websocket", true) || !conn.p ||
	    !list_has(conn, "upgrade", true) || nkey != 1 || !key_ok(key))
		return WS_E_BAD_REQUEST;
	if (!ver.p || ver.n != 2 || memcmp(ver.p, "13", 2))
		return WS_E_VERSION;
	if (offered && !mqtt && !mqtt31)
		return WS_E_BAD_REQUEST;
	w->protocol = !offered ? NULL : mqtt ? "mqtt" : "mqttv3.1";
	char accept[29];
	ws_accept_key(key.p, key.n, accept);
	int n = snprintf(http_buf(w), HTTP_MAX,
			 "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
			 "Connection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n%s%s%s\r\n",
			 accept, w->protocol ? "Sec-WebSocket-Protocol: " : "",
			 w->protocol ? w->protocol : "", w->protocol ? "\r\n" : "");
	w->http_len = (uint16_t)(n < HTTP_MAX ? n : HTTP_MAX - 1);
	return 0;
}

/* Take request bytes; returns how many of in were used (the rest are frames), or a WS_E_*. */
static long take_request(ws *w, const uint8_t *in, size_t n)
{
	size_t room = w->lim.max_request - w->req_len;
	size_t take = n < room ? n : room;
	if (!w->req) {
		w->req = malloc(w->lim.max_request);
		if (!w->req)
			abort();
	}
	size_t old = w->req_len;
	memcpy(w->req + old, in, take);
	w->req_len += (uint32_t)take;
	size_t from = old > 3 ? old - 3 : 0;
	const char *e = memmem(w->req + from, w->req_len - from, "\r\n\r\n", 4);
	if (!e)
		return take < n || w->req_len == w->lim.max_request ? WS_E_REQUEST_TOO_LARGE : (long)n;
	size_t hend = (size_t)(e - w->req) + 4;
	int r = upgrade(w, w->req, hend);
	free_request(w);
	if (r)
		return r;
	w->state = WS_OPEN;
	return (long)(hend - old);
}

/* ---- frames --------------------------------------------------------------------------------- */

static bool utf8_ok(const uint8_t *s, size_t n)
{
	size_t i = 0;
	while (i < n) {
		uint8_t c = s[i];
		if (c < 0x80) {
			i++;
			continue;
		}
		int k;
		uint32_t cp, min;
		if ((c & 0xE0) == 0xC0)
			k = 1, cp = c & 0x1F, min = 0x80;
		else if ((c & 0xF0) == 0xE0)
			k = 2, cp = c & 0x0F, min = 0x800;
		else if ((c & 0xF8) == 0xF0)
			k = 3, cp = c & 0x07, min = 0x10000;
		else
			return false;
		if (i + (size_t)k >= n)
			return false;
		for (int j = 1; j <= k; j++) {
			if ((s[i + (size_t)j] & 0xC0) != 0x80)
				return false;
			cp = (cp << 6) | (s[i + (size_t)j] & 0x3F);
		}
		if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
			return false;
		i += (size_t)k + 1;
	}
	return true;
}

static bool close_code_ok(unsigned c)
{
	return (c >= 1000 && c <= 1003) || (c >= 1007 && c <= 1014) || (c >= 3000 && c <= 4999);
}

/* The header in hdr[0..hlen) is complete: check it and start the payload. */
static int start_frame(ws *w)
{
	uint8_t b0 = w->hdr[0], b1 = w->hdr[1];
	uint8_t op = b0 & 0x0F;
	bool fin = b0 & 0x80, control = op & 8;
	if (b0 & 0x70)
		return WS_E_PROTOCOL; /* RSV bits: no extension was agreed */
	if (op != 0 && op != 1 && op != 2 && op != 8 && op != 9 && op != 10)
		return WS_E_PROTOCOL;
	if (!(b1 & 0x80))
		return WS_E_PROTOCOL; /* client frames must be masked */
	uint64_t len = b1 & 0x7F;
	const uint8_t *m = w->hdr + 2;
	if (len == 126) {
		len = (uint64_t)w->hdr[2] << 8 | w->hdr[3];
		if (len < 126)
			return WS_E_PROTOCOL;
		m = w->hdr + 4;
	} else if (len == 127) {
		len = 0;
		for (int i = 0; i < 8; i++)
			len = len << 8 | w->hdr[2 + i];
		if (len >> 63 || len < 65536)
			return WS_E_PROTOCOL;
		m = w->hdr + 10;
	}
	if (control && (!fin || len > 125))
		return WS_E_PROTOCOL;
	if (op == 1)
		return WS_E_UNSUPPORTED;
	if (op == 0 && !w->in_message)
		return WS_E_PROTOCOL;
	if (op == 2 && w->in_message)
		return WS_E_PROTOCOL;
	if (len > w->lim.max_frame)
		return WS_E_TOO_BIG;
	if (!control) {
		if (op == 2)
			w->msg_len = 0;
		w->msg_len += len;
		if (w->lim.max_message && w->msg_len > w->lim.max_message)
			return WS_E_TOO_BIG;
		w->in_message = !fin;
	}
	memcpy(w->mask, m, 4);
	w->opcode = op;
	w->fin = fin;
	w->left = len;
	w->pos = 0;
	w->ctl_len = 0;
	w->in_frame = true;
	return 0;
}

/* A control frame's payload is all in ctl[]. */
static int end_control(ws *w)
{
	if (w->opcode == 9) {
		w->pong_pending = true;
		w->pong_len = w->ctl_len;
		memcpy(w->pong, w->ctl, w->ctl_len);
	} else if (w->opcode == 8) {
		unsigned code = 1000;
		if (w->ctl_len == 1)
			return WS_E_PROTOCOL;
		if (w->ctl_len >= 2) {
			code = (unsigned)w->ctl[0] << 8 | w->ctl[1];
			if (!close_code_ok(code))
				return WS_E_PROTOCOL;
			if (!utf8_ok(w->ctl + 2, w->ctl_len - 2u))
				return WS_E_INVALID_DATA;
		}
		w->close_pending = true;
		w->close_code = (uint16_t)code;
		w->state = WS_CLOSED;
		w->result = WS_PEER_CLOSED;
		return WS_PEER_CLOSED;
	}
	return 0; /* a pong: nothing to do */
}

/* Unmask n payload bytes from in to out, continuing the mask at w->pos. */
static void unmask(ws *w, const uint8_t *in, uint8_t *out, size_t n)
{
	size_t i = 0;
	unsigned k = (unsigned)(w->pos & 3);
	if (n >= 16) {
		uint8_t rot[8];
		for (int j = 0; j < 8; j++)
			rot[j] = w->mask[(k + (unsigned)j) & 3];
		uint64_t m;
		memcpy(&m, rot, 8);
		for (; i + 8 <= n; i += 8) {
			uint64_t v;
			memcpy(&v, in + i, 8);
			v ^= m;
			memcpy(out + i, &v, 8);
		}
	}
	for (; i < n; i++)
		out[i] = in[i] ^ w->mask[(k + i) & 3];
	w->pos += n;
}

static size_t header_need(const uint8_t *h, size_t have)
{
	if (have < 2)
		return 2;
	uint8_t l = h[1] & 0x7F;
	return 2 + (l == 126 ? 2 : l == 127 ? 8 : 0) + 4;
}

int ws_feed(ws *w, const uint8_t *in, size_t n, uint8_t *out, size_t *out_len)
{
	size_t i = 0, o = 0;
	*out_len = 0;
	if (w->state == WS_CLOSED)
		return w->result;
	if (w->state == WS_HANDSHAKE) {
		long used = take_request(w, in, n);
		if (used < 0)
			return fail(w, (int)used);
		i = (size_t)used;
	}
	while (i < n) {
		if (!w->in_frame) {
			size_t need = header_need(w->hdr, w->hlen);
			while (w->hlen < need && i < n) {
				w->hdr[w->hlen++] = in[i++];
				need = header_need(w->hdr, w->hlen);
			}
			if (w->hlen < need)
				break;
			w->hlen = 0;
			int r = start_frame(w);
			if (r) {
				*out_len = o;
				return fail(w, r);
			}
		}
		size_t take = w->left < n - i ? (size_t)w->left : n - i;
		if (w->opcode & 8) {
			unmask(w, in + i, w->ctl + w->ctl_len, take);
			w->ctl_len = (uint8_t)(w->ctl_len + take);
		} else {
			unmask(w, in + i, out + o, take);
			o += take;
		}
		i += take;
		w->left -= take;
		if (w->left == 0) {
			w->in_frame = false;
			if (w->opcode & 8) {
				int r = end_control(w);
				if (r) {
					*out_len = o;
					return r > 0 ? r : fail(w, r);
				}
			}
		}
	}
	*out_len = o;
	return WS_OK;
}
