/*
 * ws.h - MQTT over WebSockets, the server side of RFC 6455 as a byte-stream adapter.
 *
 * A connection on a `protocol websockets` listener puts a ws in front of its MQTT reader:
 * every chunk read from the socket goes through ws_feed, which answers the HTTP upgrade
 * (Sec-WebSocket-Key -> Sec-WebSocket-Accept, subprotocol "mqtt"), then unmasks the client's
 * binary frames and hands back their payload as one continuous stream of MQTT bytes (an MQTT
 * packet may be split over frames, and one frame may carry several packets). Pings, close
 * frames and handshake answers produce reply bytes, fetched with ws_reply and written to the
 * socket before anything else. What the broker sends goes out as binary frames: ws_frame_header
 * before each write.
 *
 * ws_feed never keeps the caller's input: a partial frame header (at most 14 bytes), a control
 * frame's payload (at most 125) and the upgrade request (at most max_request) are kept inside
 * the ws. Its output is never longer than its input, so `out` may be the input buffer itself
 * (decoding in place).
 *
 * Bad input is never a crash: ws_feed returns a negative code, which is minus the HTTP status
 * (during the upgrade) or minus the WebSocket close code (after it); the matching HTTP answer or
 * close frame is then waiting in ws_reply, and the caller writes it and disconnects.
 *
 * The broker's calls (see docs/weft-mqtt-security.md):
 *   accept on a websockets listener   ws_init(&c->ws, &limits)
 *   each read of n bytes into buf     r = ws_feed(&c->ws, buf, n, buf, &m); write ws_reply(...);
 *                                     feed buf[0..m) to the MQTT decoder as if read from TCP;
 *                                     r == WS_PEER_CLOSED or r < 0: disconnect after that
 *   each write of n MQTT bytes        prefix ws_frame_header(h, n) (writev), unmasked
 *   server-side disconnect            after the last MQTT bytes, ws_close_frame(b, 1000)
 *   end of connection                 ws_free(&c->ws)
 */
#ifndef WEFT_MQTT_WS_H
#define WEFT_MQTT_WS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ws_feed results */
enum {
	WS_OK = 0,
	WS_PEER_CLOSED = 1,               /* the client sent a close frame; ours is in ws_reply */
	/* during the upgrade: minus the HTTP status sent back */
	WS_E_BAD_REQUEST = -400,          /* not a valid WebSocket upgrade for MQTT */
	WS_E_VERSION = -426,              /* Sec-WebSocket-Version is not 13 */
	WS_E_REQUEST_TOO_LARGE = -431,    /* the request is longer than max_request */
	/* after it: minus the close code sent back */
	WS_E_PROTOCOL = -1002,            /* framing broken (bits, opcodes, lengths, masking) */
	WS_E_UNSUPPORTED = -1003,         /* a text frame: MQTT travels in binary frames */
	WS_E_INVALID_DATA = -1007,        /* a close reason that is not UTF-8 */
	WS_E_TOO_BIG = -1009,             /* a frame or message over the limits */
};

enum { WS_HANDSHAKE, WS_OPEN, WS_CLOSED };

#define WS_REPLY_MAX 512                  /* ws_reply never returns more than this */

typedef struct ws_limits {
	uint64_t max_frame;               /* payload bytes of one frame; default 256 MiB */
	uint64_t max_message;             /* of one fragmented message; 0: no limit (default) */
	uint32_t max_request;             /* bytes of the upgrade request; default 8192 */
} ws_limits;

typedef struct ws {
	uint8_t state;
	int result;                       /* once closed: what ws_feed keeps returning */
	ws_limits lim;
	/* the upgrade request, until it is complete */
	char *req;
	uint32_t req_len;
	/* the frame being read */
	bool in_frame;                    /* header read, payload bytes left */
	bool fin;
	uint8_t opcode;
	uint8_t hdr[14], hlen;
	uint8_t mask[4];
	uint64_t left, pos;
	bool in_message;                  /* a fragmented binary message is going on */
	uint64_t msg_len;
	uint8_t ctl[125], ctl_len;        /* a control frame's payload */
	/* replies not yet fetched */
	char *http;                       /* the HTTP answer (heap, only until it is fetched) */
	uint16_t http_len;
	bool pong_pending;
	uint8_t pong[125], pong_len;
	bool close_pending;
	uint16_t close_code;
	const char *protocol;             /* the subprotocol chosen, or NULL */
} ws;

void ws_init(ws *w, const ws_limits *lim);   /* lim NULL: the defaults */
void ws_free(ws *w);

/*
 * Feed n bytes read from the client. MQTT bytes are written to out (at most n of them; out may
 * equal in) and their number to *out_len. Returns WS_OK, WS_PEER_CLOSED or a WS_E_* code; in
 * the last two cases ws_reply holds what to send before closing the socket.
 */
int ws_feed(ws *w, const uint8_t *in, size_t n, uint8_t *out, size_t *out_len);

/* Bytes to send to the client now (handshake answer, pong, close), into out[WS_REPLY_MAX];
 * returns how many (0: nothing) and forgets them. */
size_t ws_reply(ws *w, uint8_t *out);

/* The header of an unmasked final binary frame of n payload bytes: 2, 4 or 10 bytes. */
size_t ws_frame_header(uint8_t h[10], uint64_t n);
/* A close frame with status code `code` (4 bytes). */
size_t ws_close_frame(uint8_t out[4], int code);

/* Sec-WebSocket-Accept for a Sec-WebSocket-Key (28 characters + NUL into out). */
void ws_accept_key(const char *key, size_t len, char out[29]);

#endif
