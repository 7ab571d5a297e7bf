/* echo: a TCP echo server, one task per connection.  Usage: echo [port]  (default 7007) */
#include <stdio.h>
#include <stdlib.h>

#include <weft.h>

static void serve(void *arg)
{
	int fd = (int)(intptr_t)arg;
	char buf[4096];
	ssize_t n;
	while ((n = weft_read(fd, buf, sizeof buf, WEFT_FOREVER)) > 0)
		if (weft_write(fd, buf, (size_t)n, WEFT_FOREVER) != n)
			break;
	weft_close(fd);
}

static int server(void *arg)
{
	int lfd = weft_tcp_listen("127.0.0.1", *(int *)arg, 1024);
	if (lfd < 0) {
		fprintf(stderr, "echo: listen: error %d\n", lfd);
		return 1;
	}
	weft_spawn_opts conn = { .name = "conn", .detached = 1 };
	for (;;) {
		int fd = weft_accept(lfd, NULL, NULL, 0, WEFT_FOREVER);
		if (fd >= 0)
			weft_spawn_opt(serve, (void *)(intptr_t)fd, &conn);
		else /* out of fds: let the connections finish */
			weft_sleep_until(weft_now() + 10000000);
	}
}

int main(int argc, char **argv)
{
	int port = argc > 1 ? atoi(argv[1]) : 7007;
	return weft_run(server, &port);
}
