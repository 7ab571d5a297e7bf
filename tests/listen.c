/* Tests of weft_tcp_listen's addresses: "all addresses" takes IPv6 and IPv4 clients alike. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "test.h"

/* A connection from `addr` (a numeric IPv4 or IPv6 address) to port: 0, or -errno. */
static int dial(const char *addr, int port)
{
	struct sockaddr_storage ss = { 0 };
	struct sockaddr_in *v4 = (struct sockaddr_in *)&ss;
	struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&ss;
	socklen_t len;
	if (inet_pton(AF_INET, addr, &v4->sin_addr) == 1) {
		v4->sin_family = AF_INET;
		v4->sin_port = htons((uint16_t)port);
		len = sizeof *v4;
	} else {
		CHECK_EQ(inet_pton(AF_INET6, addr, &v6->sin6_addr), 1);
		v6->sin6_family = AF_INET6;
		v6->sin6_port = htons((uint16_t)port);
		len = sizeof *v6;
	}
	int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	int r = weft_connect(fd, (struct sockaddr *)&ss, len, weft_now() + 2000 * MS);
	weft_close(fd);
	return r;
}

static int local_port(int fd)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof ss;
	CHECK_EQ(getsockname(fd, (struct sockaddr *)&ss, &len), 0);
	return ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
					: ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

/* Whether this host has IPv6's loopback (a container may have IPv6 off). */
static bool have_ipv6(void)
{
	int fd = socket(AF_INET6, SOCK_STREAM, 0);
	struct sockaddr_in6 a = { .sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT };
	bool ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
	if (fd >= 0)
		close(fd);
	return ok;
}

static int every_address(void *arg)
{
	(void)arg;
	int lfd = weft_tcp_listen(NULL, 0, 16);
	CHECK(lfd >= 0);
	int port = local_port(lfd);
	CHECK_EQ(dial("127.0.0.1", port), 0);
	bool v6 = have_ipv6(); /* without it: 0.0.0.0 only */
	if (v6)
		CHECK_EQ(dial("::1", port), 0);
	weft_close(lfd);
	/* "" is the same; a numeric address is that address only */
	lfd = weft_tcp_listen("127.0.0.1", 0, 16);
	CHECK(lfd >= 0);
	port = local_port(lfd);
	if (v6)
		CHECK(dial("::1", port) < 0);
	weft_close(lfd);
	return 0;
}

TEST(listening_on_every_address_takes_ipv6_and_ipv4)
{
	RUN(every_address);
}
