/*
 * hello-http: a minimal HTTP/1.1 keep-alive server answering "Hello, World!" to every request
 * (the TechEmpower plaintext shape), one task per connection.  Usage: hello-http [port]
 * Pipelined requests are answered in one write per 16.
 */
#define _GNU_SOURCE
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <weft.h>

static const char reply[] = "HTTP/1.1 200 OK\r\nServer: weft\r\nContent-Type: text/plain\r\n"
			    "Content-Length: 13\r\n\r\nHello, World!";

/* Write out[0..len) whole; false once the connection is gone. */
static bool flush(int fd, const char *out, size_t len)
{
	return !len || weft_write(fd, out, len, WEFT_FOREVER) == (ssize_t)len;
}

static void serve(void *arg)
{
	int fd = (int)(intptr_t)arg;
	/* 4 KB in, as Go's net/http reads: a fresh task faults in each page of stack it touches,
	 * the larger part of what a new connection costs */
	char in[4096], out[16 * (sizeof reply - 1)];
	size_t have = 0, len = 0;
	ssize_t n;
	while ((n = weft_read(fd, in + have, sizeof in - have, WEFT_FOREVER)) > 0) {
		have += (size_t)n;
		size_t done = 0;
		char *end;
		/* one reply per complete request head, written 16 at a time */
		while ((end = memmem(in + done, have - done, "\r\n\r\n", 4))) {
			if (len == sizeof out) {
				if (!flush(fd, out, len))
					goto out;
				len = 0;
			}
			memcpy(out + len, reply, sizeof reply - 1);
			len += sizeof reply - 1;
			done = (size_t)(end - in) + 4;
		}
		memmove(in, in + done, have - done);
		have -= done;
		if (have == sizeof in || !flush(fd, out, len))
			break;
		len = 0;
	}
out:
	weft_close(fd);
}

static int server(void *arg)
{
	int lfd = weft_tcp_listen("127.0.0.1", *(int *)arg, 4096);
	if (lfd < 0) {
		fprintf(stderr, "hello-http: listen: error %d\n", lfd);
		return 1;
	}
	weft_spawn_opts conn = { .name = "http", .detached = 1 };
	for (;;) {
		int fd = weft_accept(lfd, NULL, NULL, 0, WEFT_FOREVER);
		if (fd >= 0)
			weft_spawn_opt(serve, (void *)(intptr_t)fd, &conn);
		else
			weft_sleep_until(weft_now() + 10000000);
	}
}

int main(int argc, char **argv)
{
	int port = argc > 1 ? atoi(argv[1]) : 8080;
	return weft_run(server, &port);
}
