/* Tests of weft-mqtt's WebSocket adapter (ws.c): the upgrade handshake and its refusals, frame
 * decoding split at every byte, fragmentation with interleaved control frames, ping/pong,
 * close, every framing error, a no-crash run over random input (the body of the libFuzzer
 * target below), and MQTT.js talking through ws.c to a real mosquitto.
 *
 * Built with -DWS_FUZZ this file is instead the libFuzzer target (make mqtt-ws-fuzz). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ws.h"

#define HS "GET /mqtt HTTP/1.1\r\nHost: 127.0.0.1:1883\r\nUpgrade: websocket\r\n" \
	   "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"    \
	   "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: mqtt\r\n\r\n"

/* Feed `in` whole, then again in pieces of 1 and 7 bytes: the three runs must agree on the
 * output, the result and the replies; sizes stay within their bounds. */
static int differential(const uint8_t *in, size_t n)
{
	uint8_t *ref = malloc(n + 1), *out = malloc(n + 1), rep[WS_REPLY_MAX];
	size_t refn = 0, m;
	ws w;
	ws_init(&w, NULL);
	int r0 = ws_feed(&w, in, n, ref, &refn);
	if (refn > n || ws_reply(&w, rep) > WS_REPLY_MAX)
		abort();
	ws_free(&w);
	static const size_t steps[] = { 1, 7 };
	for (int s = 0; s < 2; s++) {
		ws_init(&w, NULL);
		size_t o = 0;
		int r = 0;
		for (size_t i = 0; i < n && r == 0; i += steps[s]) {
			size_t k = n - i < steps[s] ? n - i : steps[s];
			r = ws_feed(&w, in + i, k, out + o, &m);
			if (m > k)
				abort();
			o += m;
			ws_reply(&w, rep);
		}
		/* the result may only differ where one run stopped before the other saw the rest */
		if (r != r0 || o != refn || memcmp(out, ref, o))
			abort();
		ws_free(&w);
	}
	free(ref);
	free(out);
	return r0;
}

#ifdef WS_FUZZ
/* Half the inputs get a valid upgrade in front, so the frame decoder is reached. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size && (data[0] & 1)) {
		size_t n = sizeof HS - 1 + size - 1;
		uint8_t *b = malloc(n);
		memcpy(b, HS, sizeof HS - 1);
		memcpy(b + sizeof HS - 1, data + 1, size - 1);
		differential(b, n);
		free(b);
	} else {
		differential(data, size);
	}
	return 0;
}
#else

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include "test.h"

/* A client frame: opcode (with 0x80 for FIN), masked with a fixed key. */
static size_t frame(uint8_t *out, int b0, const void *payload, size_t n)
{
	static const uint8_t key[4] = { 0x37, 0xfa, 0x21, 0x3d };
	size_t h = 0;
	out[h++] = (uint8_t)b0;
	if (n < 126) {
		out[h++] = (uint8_t)(0x80 | n);
	} else if (n < 65536) {
		out[h++] = 0x80 | 126;
		out[h++] = (uint8_t)(n >> 8);
		out[h++] = (uint8_t)n;
	} else {
		out[h++] = 0x80 | 127;
		for (int i = 0; i < 8; i++)
			out[h++] = (uint8_t)((uint64_t)n >> (56 - 8 * i));
	}
	memcpy(out + h, key, 4);
	h += 4;
	for (size_t i = 0; i < n; i++)
		out[h + i] = ((const uint8_t *)payload)[i] ^ key[i & 3];
	return h + n;
}

static ws open_ws(void)
{
	ws w;
	uint8_t out[sizeof HS], rep[WS_REPLY_MAX];
	size_t m;
	ws_init(&w, NULL);
	CHECK_EQ(ws_feed(&w, (const uint8_t *)HS, sizeof HS - 1, out, &m), WS_OK);
	CHECK_EQ(m, 0);
	CHECK(ws_reply(&w, rep) > 0);
	CHECK_EQ(w.state, WS_OPEN);
	return w;
}

TEST(accept_key)
{
	char a[29];
	ws_accept_key("dGhlIHNhbXBsZSBub25jZQ==", 24, a); /* RFC 6455, 1.3 */
	CHECK(!strcmp(a, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="));
}

TEST(handshake)
{
	ws w;
	ws_init(&w, NULL);
	uint8_t out[1024], rep[WS_REPLY_MAX];
	size_t m, total = 0;
	/* byte by byte, then a frame in the same read as the blank line */
	const char *hs = HS;
	size_t n = strlen(hs);
	for (size_t i = 0; i + 1 < n; i++) {
		CHECK_EQ(ws_feed(&w, (const uint8_t *)hs + i, 1, out, &m), WS_OK);
		CHECK_EQ(m, 0);
		CHECK_EQ(ws_reply(&w, rep), 0);
	}
	uint8_t last[64];
	last[0] = '\n';
	size_t fl = frame(last + 1, 0x82, "\x10\x00", 2);
	CHECK_EQ(ws_feed(&w, last, fl + 1, out, &m), WS_OK);
	CHECK_EQ(m, 2);
	CHECK(!memcmp(out, "\x10\x00", 2));
	total = ws_reply(&w, rep);
	rep[total] = 0;
	CHECK(strstr((char *)rep, "HTTP/1.1 101 Switching Protocols\r\n") == (char *)rep);
	CHECK(strstr((char *)rep, "\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"));
	CHECK(strstr((char *)rep, "\r\nSec-WebSocket-Protocol: mqtt\r\n"));
	CHECK(strstr((char *)rep, "\r\nUpgrade: websocket\r\n"));
	CHECK(!memcmp(rep + total - 4, "\r\n\r\n", 4));
	CHECK(!strcmp(w.protocol, "mqtt"));
	ws_free(&w);
}

static int try_hs(const char *req, char *rep_out)
{
	ws w;
	ws_init(&w, NULL);
	size_t n = strlen(req), m;
	uint8_t *out = malloc(n + 1), rep[WS_REPLY_MAX];
	int r = ws_feed(&w, (const uint8_t *)req, n, out, &m);
	size_t rn = ws_reply(&w, rep);
	memcpy(rep_out, rep, rn);
	rep_out[rn] = 0;
	/* once refused, everything after is refused the same way */
	if (r < 0)
		CHECK_EQ(ws_feed(&w, (const uint8_t *)"x", 1, out, &m), r);
	free(out);
	ws_free(&w);
	return r;
}

TEST(handshake_refusals)
{
	static const struct {
		const char *req;
		int want;
	} cases[] = {
		{ "POST /mqtt HTTP/1.1\r\nHost: h\r\n\r\n", WS_E_BAD_REQUEST },
		{ "GET /mqtt HTTP/1.0\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
		  "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
		  WS_E_BAD_REQUEST },
		{ "GET /mqtt HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
		  "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
		  WS_E_BAD_REQUEST }, /* no Host */
		{ "GET /mqtt HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\n"
		  "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
		  WS_E_BAD_REQUEST }, /* no Upgrade */
		{ "GET /mqtt HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: keep-alive\r\n"
		  "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
		  WS_E_BAD_REQUEST }, /* Connection without upgrade */
		{ "GET /mqtt HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
		  "Sec-WebSocket-Version: 13\r\n\r\n", WS_E_BAD_REQUEST }, /* no key */
		{ "GET /mqtt HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
		  "Sec-WebSocket-Key: c2hvcnQ=\r\nSec-WebSocket-Version: 13\r\n\r\n",
		  WS_E_BAD_REQUEST }, /* key not 16 bytes */
		{ "GET /mqtt HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
		  "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
		  "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
		  WS_E_BAD_REQUEST }, /* two keys */
		{ "GET /mqtt HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
		  "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 8\r\n\r\n",
		  WS_E_VERSION },
		{ "GET /mqtt HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
		  "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
		  "Sec-WebSocket-Protocol: chat, superchat\r\n\r\n", WS_E_BAD_REQUEST },
		{ "GET /mqtt HTTP/1.1\r\nHost: h\r\n bad folding\r\n\r\n", WS_E_BAD_REQUEST },
		{ "GET /mqtt HTTP/1.1\r\nHost h\r\n\r\n", WS_E_BAD_REQUEST },
		{ "\r\n\r\n", WS_E_BAD_REQUEST },
	};
	char rep[WS_REPLY_MAX + 1];
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		int r = try_hs(cases[i].req, rep);
		if (r != cases[i].want)
			fprintf(stderr, "case %zu: %d\n", i, r);
		CHECK_EQ(r, cases[i].want);
		char want[64];
		snprintf(want, sizeof want, "HTTP/1.1 %d ", -cases[i].want);
		CHECK(strstr(rep, want) == rep);
	}
	CHECK(strstr(rep, "Connection: close\r\n"));
	/* 426 names the version we speak */
	try_hs(cases[8].req, rep);
	CHECK(strstr(rep, "\r\nSec-WebSocket-Version: 13\r\n"));
	/* an old client offering mqttv3.1; a client offering nothing; case and lists */
	CHECK_EQ(try_hs("GET / HTTP/1.1\r\nhost: h\r\nupgrade: WebSocket\r\nconnection: keep-alive, "
			"UPGRADE\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
			"sec-websocket-version: 13\r\nSec-WebSocket-Protocol: mqttv3.1\r\n\r\n", rep),
		 WS_OK);
	CHECK(strstr(rep, "Sec-WebSocket-Protocol: mqttv3.1\r\n"));
	CHECK_EQ(try_hs("GET / HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
			"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
			"Sec-WebSocket-Protocol: chat\r\nSec-WebSocket-Protocol: x, mqtt\r\n\r\n", rep),
		 WS_OK);
	CHECK(strstr(rep, "Sec-WebSocket-Protocol: mqtt\r\n"));
	CHECK_EQ(try_hs("GET / HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
			"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
			rep),
		 WS_OK);
	CHECK(!strstr(rep, "Sec-WebSocket-Protocol"));
	/* a request that never ends */
	char *big = malloc(20000);
	strcpy(big, "GET / HTTP/1.1\r\nHost: h\r\n");
	while (strlen(big) < 19000)
		strcat(big, "X-Filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n");
	CHECK_EQ(try_hs(big, rep), WS_E_REQUEST_TOO_LARGE);
	CHECK(strstr(rep, "HTTP/1.1 431 ") == rep);
	free(big);
}

/* A stream after the upgrade: fragmented MQTT bytes with control frames between, in every
 * split of the input into two reads and in reads of every size. */
TEST(frames_split_everywhere)
{
	uint8_t in[70000], want[70000];
	size_t n = 0, wn = 0;
	uint8_t big[66000];
	for (size_t i = 0; i < sizeof big; i++)
		big[i] = (uint8_t)(i * 7 + 3);
	n += frame(in + n, 0x02, "\x30\x05\x00\x01", 4);          /* binary, not final */
	memcpy(want + wn, "\x30\x05\x00\x01", 4), wn += 4;
	n += frame(in + n, 0x89, "hi", 2);                        /* ping inside the message */
	n += frame(in + n, 0x00, "t", 1);                         /* continuation */
	memcpy(want + wn, "t", 1), wn += 1;
	n += frame(in + n, 0x8A, "", 0);                          /* unsolicited pong */
	n += frame(in + n, 0x80, "ab\xc0", 3);                    /* final continuation */
	memcpy(want + wn, "ab\xc0", 3), wn += 3;
	n += frame(in + n, 0x82, "", 0);                          /* empty binary frame */
	n += frame(in + n, 0x82, big, 300);                       /* 16-bit length */
	memcpy(want + wn, big, 300), wn += 300;
	size_t small_n = n, small_wn = wn;
	n += frame(in + n, 0x82, big, sizeof big);                /* 64-bit length */
	memcpy(want + wn, big, sizeof big), wn += sizeof big;
	n += frame(in + n, 0x89, "last", 4);
	uint8_t out[70000], rep[WS_REPLY_MAX];
	size_t m;
	/* two reads, split at every point of the small prefix */
	for (size_t cut = 0; cut <= small_n; cut++) {
		ws w = open_ws();
		size_t o = 0;
		CHECK_EQ(ws_feed(&w, in, cut, out, &m), WS_OK);
		o += m;
		CHECK_EQ(ws_feed(&w, in + cut, small_n - cut, out + o, &m), WS_OK);
		o += m;
		CHECK_EQ(o, small_wn);
		CHECK(!memcmp(out, want, o));
		size_t rn = ws_reply(&w, rep);
		CHECK(rn == 4 || rn == 6); /* the pong for "hi" (alone, or after the unsolicited one) */
		CHECK(!memcmp(rep + rn - 4, "\x8a\x02hi", 4));
		ws_free(&w);
	}
	/* reads of every size up to 40 bytes, then large ones; decoding in place */
	for (size_t step = 1; step <= 64; step = step < 40 ? step + 1 : step * 4) {
		ws w = open_ws();
		uint8_t *buf = malloc(n);
		memcpy(buf, in, n);
		size_t o = 0;
		for (size_t i = 0; i < n; i += step) {
			size_t k = n - i < step ? n - i : step;
			CHECK_EQ(ws_feed(&w, buf + i, k, buf + i, &m), WS_OK);
			memmove(out + o, buf + i, m);
			o += m;
		}
		CHECK_EQ(o, wn);
		CHECK(!memcmp(out, want, wn));
		size_t rn = ws_reply(&w, rep);
		CHECK(!memcmp(rep + rn - 6, "\x8a\x04last", 6)); /* only the latest pong is due */
		free(buf);
		ws_free(&w);
	}
	/* and in place, all in one read */
	ws w = open_ws();
	CHECK_EQ(ws_feed(&w, in, n, in, &m), WS_OK);
	CHECK_EQ(m, wn);
	CHECK(!memcmp(in, want, wn));
	ws_free(&w);
}

TEST(closing)
{
	uint8_t in[256], out[256], rep[WS_REPLY_MAX];
	size_t m, n;
	/* data, then a close with code and reason: the data is delivered, the code echoed */
	ws w = open_ws();
	n = frame(in, 0x82, "\xe0\x00", 2);
	n += frame(in + n, 0x88, "\x03\xe9going away \xc3\xa9", 15);
	n += frame(in + n, 0x82, "ignored", 7);
	CHECK_EQ(ws_feed(&w, in, n, out, &m), WS_PEER_CLOSED);
	CHECK_EQ(m, 2);
	CHECK_EQ(ws_reply(&w, rep), 4);
	CHECK(!memcmp(rep, "\x88\x02\x03\xe9", 4));
	CHECK_EQ(ws_feed(&w, in, n, out, &m), WS_PEER_CLOSED);
	CHECK_EQ(m, 0);
	CHECK_EQ(ws_reply(&w, rep), 0);
	/* an empty close is answered with 1000 */
	w = open_ws();
	n = frame(in, 0x88, "", 0);
	CHECK_EQ(ws_feed(&w, in, n, out, &m), WS_PEER_CLOSED);
	CHECK_EQ(ws_reply(&w, rep), 4);
	CHECK(!memcmp(rep, "\x88\x02\x03\xe8", 4));
	/* what the broker sends */
	uint8_t h[10];
	CHECK_EQ(ws_frame_header(h, 5), 2);
	CHECK(!memcmp(h, "\x82\x05", 2));
	CHECK_EQ(ws_frame_header(h, 126), 4);
	CHECK(!memcmp(h, "\x82\x7e\x00\x7e", 4));
	CHECK_EQ(ws_frame_header(h, 70000), 10);
	CHECK(!memcmp(h, "\x82\x7f\x00\x00\x00\x00\x00\x01\x11\x70", 10));
	CHECK_EQ(ws_close_frame(h, 1002), 4);
	CHECK(!memcmp(h, "\x88\x02\x03\xea", 4));
}

static int one(const uint8_t *f, size_t n, const ws_limits *lim, uint8_t *rep, size_t *rn)
{
	ws w;
	uint8_t out[300000];
	size_t m;
	ws_init(&w, lim);
	CHECK_EQ(ws_feed(&w, (const uint8_t *)HS, sizeof HS - 1, out, &m), WS_OK);
	ws_reply(&w, rep);
	int r = ws_feed(&w, f, n, out, &m);
	*rn = ws_reply(&w, rep);
	ws_free(&w);
	return r;
}

TEST(framing_errors)
{
	uint8_t f[300], rep[WS_REPLY_MAX];
	size_t n, rn;
	static uint8_t p126[126];
#define EXPECT(code)                                                      \
	do {                                                              \
		CHECK_EQ(one(f, n, NULL, rep, &rn), code);                \
		CHECK_EQ(rn, 4);                                          \
		CHECK_EQ(rep[0], 0x88);                                   \
		CHECK_EQ((rep[2] << 8 | rep[3]), -(code));                \
	} while (0)
	n = frame(f, 0x82, "x", 1), f[1] &= 0x7F; /* unmasked (mask key read as payload) */
	EXPECT(WS_E_PROTOCOL);
	n = frame(f, 0xC2, "x", 1); /* RSV1 */
	EXPECT(WS_E_PROTOCOL);
	n = frame(f, 0x92, "x", 1); /* RSV3 */
	EXPECT(WS_E_PROTOCOL);
	n = frame(f, 0x83, "x", 1); /* reserved data opcode */
	EXPECT(WS_E_PROTOCOL);
	n = frame(f, 0x8B, "x", 1); /* reserved control opcode */
	EXPECT(WS_E_PROTOCOL);
	n = frame(f, 0x81, "text", 4);
	EXPECT(WS_E_UNSUPPORTED);
	n = frame(f, 0x09, "x", 1); /* fragmented ping */
	EXPECT(WS_E_PROTOCOL);
	n = frame(f, 0x89, p126, 126); /* control frame over 125 */
	EXPECT(WS_E_PROTOCOL);
	n = frame(f, 0x80, "x", 1); /* continuation with no message */
	EXPECT(WS_E_PROTOCOL);
	n = frame(f, 0x02, "x", 1);
	n += frame(f + n, 0x82, "y", 1); /* a new message inside one */
	EXPECT(WS_E_PROTOCOL);
	n = frame(f, 0x02, "x", 1);
	n += frame(f + n, 0x81, "y", 1); /* text inside a binary message */
	EXPECT(WS_E_UNSUPPORTED);
	/* lengths not in their shortest form, or with the top bit set */
	uint8_t nm16[] = { 0x82, 0xFE, 0x00, 0x05, 1, 2, 3, 4 };
	memcpy(f, nm16, n = sizeof nm16);
	EXPECT(WS_E_PROTOCOL);
	uint8_t nm64[] = { 0x82, 0xFF, 0, 0, 0, 0, 0, 0, 0x01, 0x00, 1, 2, 3, 4 };
	memcpy(f, nm64, n = sizeof nm64);
	EXPECT(WS_E_PROTOCOL);
	uint8_t top[] = { 0x82, 0xFF, 0x80, 0, 0, 0, 0, 1, 0, 0, 1, 2, 3, 4 };
	memcpy(f, top, n = sizeof top);
	EXPECT(WS_E_PROTOCOL);
	/* close frames: one byte, a reserved code, a reason that is not UTF-8 */
	n = frame(f, 0x88, "\x03", 1);
	EXPECT(WS_E_PROTOCOL);
	static const char *badcodes[] = { "\x03\xe7", "\x03\xec", "\x03\xed", "\x03\xee", "\x03\xf7",
					  "\x0b\xb7", "\x13\x88", "\x00\x00", "\xff\xff" };
	for (int i = 0; i < 9; i++) {
		n = frame(f, 0x88, badcodes[i], 2);
		EXPECT(WS_E_PROTOCOL);
	}
	static const char *badutf[] = { "\x03\xe8\xc3", "\x03\xe8\xed\xa0\x80", "\x03\xe8\xc0\xaf",
					"\x03\xe8\xf4\x90\x80\x80", "\x03\xe8\x80", "\x03\xe8\xff" };
	for (int i = 0; i < 6; i++) {
		n = frame(f, 0x88, badutf[i], strlen(badutf[i]));
		EXPECT(WS_E_INVALID_DATA);
	}
	n = frame(f, 0x88, "\x0f\xa0ok", 4); /* 4000: a private code is fine */
	CHECK_EQ(one(f, n, NULL, rep, &rn), WS_PEER_CLOSED);
	/* limits */
	ws_limits lim = { .max_frame = 100 };
	n = frame(f, 0x82, p126, 101);
	CHECK_EQ(one(f, n, &lim, rep, &rn), WS_E_TOO_BIG);
	CHECK(!memcmp(rep, "\x88\x02\x03\xf1", 4));
	n = frame(f, 0x82, p126, 100);
	CHECK_EQ(one(f, n, &lim, rep, &rn), WS_OK);
	ws_limits lm = { .max_message = 150 };
	n = frame(f, 0x02, p126, 100);
	n += frame(f + n, 0x80, p126, 51);
	CHECK_EQ(one(f, n, &lm, rep, &rn), WS_E_TOO_BIG);
	n = frame(f, 0x02, p126, 100);
	n += frame(f + n, 0x80, p126, 50);
	n += frame(f + n, 0x82, p126, 100); /* a new message starts counting again */
	CHECK_EQ(one(f, n, &lm, rep, &rn), WS_OK);
	/* a 2^62-byte frame is refused from its header, before any payload */
	uint8_t huge[] = { 0x82, 0xFF, 0x40, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4 };
	CHECK_EQ(one(huge, sizeof huge, NULL, rep, &rn), WS_E_TOO_BIG);
#undef EXPECT
}

/* Random and mutated input never crashes, and decoding does not depend on how it is split
 * (the libFuzzer target runs the same check). */
TEST(random_input)
{
	uint64_t s = 88172645463325252ull;
	uint8_t buf[2048], seed[512];
	size_t sn = sizeof HS - 1;
	memcpy(seed, HS, sn);
	sn += frame(seed + sn, 0x02, "\x10\x0c\x00\x04MQTT", 8);
	sn += frame(seed + sn, 0x89, "p", 1);
	sn += frame(seed + sn, 0x80, "\x05\x02\x00\x3c\x00\x00", 6);
	sn += frame(seed + sn, 0x88, "\x03\xe8", 2);
	int runs = SLOW ? 3000 : 30000, results[2000] = { 0 };
	for (int i = 0; i < runs; i++) {
		size_t n;
		if (i & 1) { /* the valid stream with a few bytes changed, cut short or not */
			memcpy(buf, seed, sn);
			n = sn;
			for (int k = 0; k < 1 + i % 4; k++) {
				s ^= s << 13, s ^= s >> 7, s ^= s << 17;
				buf[sizeof HS - 1 + s % (sn - sizeof HS + 1)] ^= (uint8_t)(1u << (s >> 32) % 8);
			}
			if (i % 3 == 0)
				n = sizeof HS - 1 + (s >> 20) % (sn - sizeof HS + 2);
		} else {   /* the upgrade, then noise */
			memcpy(buf, HS, sizeof HS - 1);
			n = sizeof HS - 1 + (s >> 40) % 600;
			for (size_t k = sizeof HS - 1; k < n; k++) {
				s ^= s << 13, s ^= s >> 7, s ^= s << 17;
				buf[k] = (uint8_t)s;
			}
		}
		int r = differential(buf, n);
		results[r == WS_PEER_CLOSED ? 1999 : -r]++;
	}
	printf("results over %d inputs: ok %d, peer closed %d, 1002 %d, 1003 %d, 1007 %d, 1009 %d\n",
	       runs, results[0], results[1999], results[1002], results[1003], results[1007],
	       results[1009]);
	CHECK(results[0] > 0 && results[1002] > 0 && results[1999] > 0);
}

/* ---- MQTT.js through ws.c to a real mosquitto ----------------------------------------------- */

static int listen_port(int *port)
{
	int s = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof a;
	int one = 1;
	setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	CHECK(s >= 0 && bind(s, (struct sockaddr *)&a, sizeof a) == 0 && listen(s, 16) == 0);
	CHECK(getsockname(s, (struct sockaddr *)&a, &len) == 0);
	*port = ntohs(a.sin_port);
	return s;
}

static int dial(int port)
{
	return test_dial(port, 0, 30);
}

static bool write_all(int fd, const void *p, size_t n)
{
	while (n) {
		ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
		if (w <= 0)
			return false;
		p = (const char *)p + w;
		n -= (size_t)w;
	}
	return true;
}

static int broker_port;
static atomic_int bytes_up, frames_down;

/* A real mosquitto on a free port (broker_port), accepting connections when this returns. */
static pid_t start_mosquitto(void)
{
	close(listen_port(&broker_port));
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		char port[16];
		snprintf(port, sizeof port, "%d", broker_port);
		execlp("sh", "sh", "-c", "PATH=$PATH:/usr/sbin exec mosquitto -p \"$0\" >/dev/null 2>&1",
		       port, (char *)NULL);
		_exit(127);
	}
	int s = -1;
	for (int i = 0; i < 500 && (s = dial(broker_port)) < 0; i++)
		usleep(10000);
	CHECK(s >= 0);
	close(s);
	return pid;
}

/* One WebSocket client: ws.c on its side, plain MQTT to the broker on the other. */
static void *relay(void *arg)
{
	int c = (int)(intptr_t)arg, b = -1;
	ws w;
	ws_init(&w, NULL);
	uint8_t buf[65536], rep[WS_REPLY_MAX];
	struct pollfd p[2] = { { .fd = c, .events = POLLIN }, { .fd = -1, .events = POLLIN } };
	for (;;) {
		if (poll(p, 2, 5000) <= 0)
			break;
		if (p[0].revents) {
			ssize_t n = recv(c, buf, sizeof buf, 0);
			if (n <= 0)
				break;
			size_t m;
			int r = ws_feed(&w, buf, (size_t)n, buf, &m); /* in place */
			size_t rn = ws_reply(&w, rep);
			if (rn && !write_all(c, rep, rn))
				break;
			if (w.state == WS_OPEN && b < 0) {
				b = dial(broker_port);
				if (b < 0)
					break;
				p[1].fd = b;
			}
			if (m && (b < 0 || !write_all(b, buf, m)))
				break;
			atomic_fetch_add(&bytes_up, (int)m);
			if (r != WS_OK)
				break;
		}
		if (p[1].revents) {
			ssize_t n = recv(b, buf, sizeof buf, 0);
			if (n <= 0) {
				uint8_t cl[4];
				write_all(c, cl, ws_close_frame(cl, 1000));
				break;
			}
			uint8_t h[10];
			size_t hn = ws_frame_header(h, (uint64_t)n);
			if (!write_all(c, h, hn) || !write_all(c, buf, (size_t)n))
				break;
			atomic_fetch_add(&frames_down, 1);
		}
	}
	ws_free(&w);
	close(c);
	if (b >= 0)
		close(b);
	return NULL;
}

static void *acceptor(void *arg)
{
	int l = (int)(intptr_t)arg;
	for (;;) {
		int c = accept(l, NULL, NULL);
		if (c < 0)
			return NULL;
		pthread_t t;
		pthread_create(&t, NULL, relay, (void *)(intptr_t)c);
		pthread_detach(t);
	}
}

/* MQTT.js where npm can install it (tests/mqtt/install.sh); where it cannot, the test skips. */
static void install_mqttjs(void)
{
	if (system("command -v node >/dev/null") == 0 &&
	    system("sh '" WEFT_SRC_DIR "/tests/mqtt/install.sh'") != 0)
		fprintf(stderr, "MQTT.js could not be installed\n");
}

/*
 * MQTT.js (3.1.1 and 5.0) connects over ws:// to a relay built on ws.c, which passes the MQTT
 * bytes to a real mosquitto: it subscribes, publishes small and 200 kB messages (so packets
 * cross frame and read boundaries) that come back to it, and a mosquitto_sub on plain TCP
 * gets them too.
 */
TEST(mqttjs_through_ws)
{
	char mqttjs[600];
	snprintf(mqttjs, sizeof mqttjs, "%s/tests/mqtt/node_modules/mqtt/package.json", WEFT_SRC_DIR);
	test_skip_emulated();
	install_mqttjs();
	if (system("command -v node >/dev/null && PATH=$PATH:/usr/sbin command -v mosquitto "
		   ">/dev/null && command -v mosquitto_sub >/dev/null") != 0 ||
	    access(mqttjs, R_OK) != 0)
		test_skip("needs node, mosquitto, mosquitto_sub and MQTT.js (%s)", mqttjs);
	signal(SIGPIPE, SIG_IGN);
	pid_t broker = start_mosquitto();
	const char *dir = test_tmpdir();
	char cmd[4096], out[4096];
	int wsport;
	int ls = listen_port(&wsport);
	pthread_t acc;
	pthread_create(&acc, NULL, acceptor, (void *)(intptr_t)ls);
	/* the TCP subscriber, on mosquitto directly */
	snprintf(cmd, sizeof cmd, "mosquitto_sub -p %d -t 'ws/#' -C 6 -W 20 -F '%%t %%l' > %s/sub &",
		 broker_port, dir);
	CHECK_EQ(system(cmd), 0);
	usleep(300000);
	snprintf(cmd, sizeof cmd, "%s/client.cjs", dir);
	FILE *f = fopen(cmd, "w");
	CHECK(f);
	fprintf(f,
		"const mqtt = require(%s);\n"
		"async function run(version) {\n"
		"  const c = await mqtt.connectAsync('ws://127.0.0.1:%d/mqtt',\n"
		"    { protocolVersion: version, clientId: 'ws-' + version, reconnectPeriod: 0 });\n"
		"  const got = [];\n"
		"  c.on('message', (t, p) => got.push(t + ' ' + p.length));\n"
		"  await c.subscribeAsync('ws/#', { qos: 1 });\n"
		"  await c.publishAsync('ws/v' + version + '/small', 'hello', { qos: 1 });\n"
		"  await c.publishAsync('ws/v' + version + '/big', Buffer.alloc(200000, 7), { qos: 1 });\n"
		"  await c.publishAsync('ws/v' + version + '/q0', 'x');\n"
		"  for (let i = 0; i < 100 && got.length < 3; i++) await new Promise(r => setTimeout(r, 50));\n"
		"  await c.endAsync();\n"
		"  console.log(got.sort().join(','));\n"
		"}\n"
		"(async () => { await run(4); await run(5); })().catch(e => { console.error(e); process.exit(1); });\n",
		"'" WEFT_SRC_DIR "/tests/mqtt/node_modules/mqtt'", wsport);
	fclose(f);
	snprintf(cmd, sizeof cmd, "cd %s && timeout 30 node client.cjs > %s/js 2>&1", dir, dir);
	int rc = system(cmd);
	snprintf(cmd, sizeof cmd, "cat %s/js; for i in $(seq 100); do [ $(wc -l < %s/sub) -ge 6 ] && "
		 "break; sleep 0.1; done; cat %s/sub", dir, dir, dir);
	FILE *p = popen(cmd, "r");
	size_t n = fread(out, 1, sizeof out - 1, p);
	out[n] = 0;
	pclose(p);
	printf("%s", out);
	kill(broker, SIGTERM);
	waitpid(broker, NULL, 0);
	snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
	system(cmd);
	CHECK_EQ(rc, 0);
	/* MQTT.js got its own messages back, for both versions */
	CHECK(strstr(out, "ws/v4/big 200000,ws/v4/q0 1,ws/v4/small 5\n"));
	CHECK(strstr(out, "ws/v5/big 200000,ws/v5/q0 1,ws/v5/small 5\n"));
	/* and the plain TCP subscriber saw all six */
	CHECK(strstr(out, "ws/v4/small 5\n") && strstr(out, "ws/v4/big 200000\n") &&
	      strstr(out, "ws/v5/small 5\n") && strstr(out, "ws/v5/big 200000\n") &&
	      strstr(out, "ws/v4/q0 1\n") && strstr(out, "ws/v5/q0 1\n"));
	printf("%d MQTT bytes up through ws.c, %d frames down\n", atomic_load(&bytes_up),
	       atomic_load(&frames_down));
	CHECK(atomic_load(&bytes_up) > 400000);
}
/* ---- MQTT.js in headless Chromium through ws.c ---------------------------------------------- */

static const char *page_js;     /* the MQTT.js browser bundle */
static size_t page_js_len;
static int page_wsport;
static char page_result[512];
static atomic_int page_done;

static void http_send(int c, const char *type, const void *body, size_t n)
{
	char h[256];
	int hn = snprintf(h, sizeof h, "HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
			  "Connection: close\r\n\r\n", type, n);
	write_all(c, h, (size_t)hn);
	write_all(c, body, n);
}

/* Serves the page, the bundle, and /result?... where the page reports what it received. */
static void *page_server(void *arg)
{
	int l = (int)(intptr_t)arg;
	for (;;) {
		int c = accept(l, NULL, NULL);
		if (c < 0)
			return NULL;
		char req[4096];
		ssize_t n = recv(c, req, sizeof req - 1, 0);
		req[n > 0 ? n : 0] = 0;
		if (!strncmp(req, "GET / ", 6)) {
			char html[2048];
			int hn = snprintf(html, sizeof html,
				"<!doctype html><html><body><script src=\"/mqtt.min.js\"></script><script>\n"
				"const got = [];\n"
				"const report = s => fetch('/result?' + encodeURIComponent(s));\n"
				"const c = mqtt.connect('ws://127.0.0.1:%d/mqtt',\n"
				"  { protocolVersion: 5, clientId: 'chromium', reconnectPeriod: 0 });\n"
				"c.on('error', e => report('ERROR ' + e));\n"
				"c.on('message', (t, p) => { got.push(t + ' ' + p.length);\n"
				"  if (got.length == 2) { report('DONE ' + got.sort().join(',')); c.end(); } });\n"
				"c.on('connect', () => c.subscribe('browser/#', { qos: 1 }, () => {\n"
				"  c.publish('browser/hello', 'from chromium', { qos: 1 });\n"
				"  c.publish('browser/big', new Uint8Array(100000), { qos: 1 }); }));\n"
				"</script></body></html>\n", page_wsport);
			http_send(c, "text/html", html, (size_t)hn);
		} else if (!strncmp(req, "GET /mqtt.min.js ", 17)) {
			http_send(c, "text/javascript", page_js, page_js_len);
		} else if (!strncmp(req, "GET /result?", 12)) {
			char *e = strchr(req + 12, ' ');
			if (e)
				*e = 0;
			snprintf(page_result, sizeof page_result, "%.500s", req + 12);
			http_send(c, "text/plain", "ok", 2);
			atomic_store(&page_done, 1);
		} else {
			write_all(c, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n", 45);
		}
		close(c);
	}
}

/*
 * A page served by the test runs MQTT.js in headless Chromium over ws:// through the ws.c
 * relay to a real mosquitto: it publishes (one 100 kB message) to itself and to a
 * mosquitto_sub on plain TCP, and reports what it got back to the test's HTTP server.
 */
TEST(chromium_mqttjs_through_ws)
{
	char bundle[600];
	snprintf(bundle, sizeof bundle, "%s/tests/mqtt/node_modules/mqtt/dist/mqtt.min.js",
		 WEFT_SRC_DIR);
	test_skip_emulated();
	install_mqttjs();
	if (system("command -v chromium >/dev/null && PATH=$PATH:/usr/sbin command -v mosquitto "
		   ">/dev/null && command -v mosquitto_sub >/dev/null") != 0 ||
	    access(bundle, R_OK) != 0)
		test_skip("needs chromium, mosquitto, mosquitto_sub and MQTT.js (%s)", bundle);
	FILE *bf = fopen(bundle, "r");
	CHECK(bf);
	static char js[1 << 21];
	page_js_len = fread(js, 1, sizeof js, bf);
	page_js = js;
	fclose(bf);
	signal(SIGPIPE, SIG_IGN);
	pid_t broker = start_mosquitto();
	const char *dir = test_tmpdir();
	char cmd[4096], out[4096];
	int ls = listen_port(&page_wsport), httpport;
	int hs = listen_port(&httpport);
	pthread_t acc, web;
	pthread_create(&acc, NULL, acceptor, (void *)(intptr_t)ls);
	pthread_create(&web, NULL, page_server, (void *)(intptr_t)hs);
	snprintf(cmd, sizeof cmd, "mosquitto_sub -p %d -t 'browser/#' -C 2 -W 60 -F '%%t %%l' > %s/sub &",
		 broker_port, dir);
	CHECK_EQ(system(cmd), 0);
	usleep(300000);
	pid_t browser = fork();
	CHECK(browser >= 0);
	if (browser == 0) {
		char url[64], profile[600];
		snprintf(url, sizeof url, "http://127.0.0.1:%d/", httpport);
		snprintf(profile, sizeof profile, "--user-data-dir=%s/profile", dir);
		int null = open("/dev/null", O_WRONLY);
		dup2(null, 1);
		dup2(null, 2);
		execlp("chromium", "chromium", "--headless", "--no-sandbox", "--disable-gpu",
		       "--no-first-run", "--disable-dev-shm-usage", profile, url, (char *)NULL);
		_exit(127);
	}
	for (int i = 0; i < 600 && !atomic_load(&page_done); i++)
		usleep(100000);
	kill(browser, SIGKILL);
	waitpid(browser, NULL, 0);
	snprintf(cmd, sizeof cmd, "for i in $(seq 100); do [ $(wc -l < %s/sub) -ge 2 ] && break; "
		 "sleep 0.1; done; cat %s/sub", dir, dir);
	FILE *p = popen(cmd, "r");
	size_t n = fread(out, 1, sizeof out - 1, p);
	out[n] = 0;
	pclose(p);
	kill(broker, SIGTERM);
	waitpid(broker, NULL, 0);
	snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
	system(cmd);
	printf("page reported: %s\nmosquitto_sub got:\n%s", page_result, out);
	CHECK(atomic_load(&page_done));
	CHECK(!strcmp(page_result, "DONE%20browser%2Fbig%20100000%2Cbrowser%2Fhello%2013"));
	CHECK(strstr(out, "browser/hello 13\n") && strstr(out, "browser/big 100000\n"));
}
#endif
