/*
 * mqtt-floor: the least a broker can do for bench/mqtt's traffic scenarios, to measure what
 * the kernel alone charges per message on this machine. Not a broker: MQTT 3.1.1 only, one
 * subscription per connection matched by exact topic, no sessions, no retained messages, no
 * keep-alive, no acknowledgements tracked. One thread in epoll (level-triggered), one read
 * per readiness, one send(2) per packet out (and no allocation on the way), which is the
 * design of mosquitto's loop with everything else taken out.
 *
 * bench/mqtt runs it beside the brokers: a broker cannot spend less CPU per message than
 * this design spends, unless it makes fewer system calls or fewer sleeps than one of each
 * per packet (which costs latency, or a spinning core).
 *
 * Usage: mqtt-floor PORT (listens on 127.0.0.1).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#define MAX_FD 65536
#define BUF 65536

struct conn {
	int fd;
	int n;                 /* bytes in buf */
	int sub_len;           /* the subscribed topic (-1: none) */
	int sub_qos;
	unsigned next_id;      /* packet identifier of the next QoS 1 PUBLISH out */
	char sub[256];
	unsigned char buf[BUF];
};

static struct conn *conns[MAX_FD];
static int subscribers[MAX_FD], nsubscribers;

static void send_all(int fd, const void *p, size_t n)
{
	while (n) { /* blocking socket: send(2) returns short only on a signal or an error */
		ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
		if (k <= 0)
			return;
		p = (const char *)p + k;
		n -= (size_t)k;
	}
}

/* PUBLISH body p (len bytes, fixed-header flags `flags`) from c: acknowledge it, then forward
 * it to each subscriber of its topic in one sendmsg(2). */
static void publish(struct conn *c, const unsigned char *p, int len, int flags)
{
	int topic_len = p[0] << 8 | p[1], qos = (flags >> 1) & 3, off = 2 + topic_len;
	if (qos) {
		unsigned char ack[4] = {0x40, 2, p[off], p[off + 1]};
		send_all(c->fd, ack, 4);
		off += 2;
	}
	for (int i = 0; i < nsubscribers; i++) {
		struct conn *s = conns[subscribers[i]];
		if (s->sub_len != topic_len || memcmp(s->sub, p + 2, (size_t)topic_len))
			continue;
		int q = qos < s->sub_qos ? qos : s->sub_qos;
		int rl = 2 + topic_len + (q ? 2 : 0) + len - off; /* remaining length out */
		unsigned char head[5], id[2] = {(unsigned char)(s->next_id >> 8), (unsigned char)s->next_id};
		size_t hn = 0;
		head[hn++] = (unsigned char)(0x30 | q << 1);
		do {
			head[hn] = rl & 127;
			rl >>= 7;
			head[hn++] |= rl ? 128 : 0;
		} while (rl);
		if (q)
			s->next_id = s->next_id % 65535 + 1;
		struct iovec v[4] = {{head, hn}, {(void *)p, 2 + (size_t)topic_len},
				     {id, q ? 2 : 0}, {(void *)(p + off), (size_t)(len - off)}};
		struct msghdr m = {.msg_iov = v, .msg_iovlen = 4};
		sendmsg(s->fd, &m, MSG_NOSIGNAL); /* a subscriber gone is hung up on at its read */
	}
}

static void subscribe(struct conn *c, const unsigned char *b)
{
	int len = b[2] << 8 | b[3];
	if (len >= (int)sizeof c->sub)
		len = sizeof c->sub - 1;
	memcpy(c->sub, b + 4, (size_t)len);
	if (c->sub_len < 0)
		subscribers[nsubscribers++] = c->fd;
	c->sub_len = len;
	c->sub_qos = b[4 + len] & 3;
	unsigned char ack[5] = {0x90, 3, b[0], b[1], (unsigned char)c->sub_qos};
	send_all(c->fd, ack, 5);
}

/* Handle the packet at p (avail bytes there): its length, 0 if incomplete, -1 to hang up. */
static int packet(struct conn *c, const unsigned char *p, int avail)
{
	int len = 0, shift = 0, i = 1;
	do {
		if (i >= avail || i > 4)
			return i > 4 ? -1 : 0;
		len |= (p[i] & 127) << shift;
		shift += 7;
	} while (p[i++] & 128);
	if (len > avail - i)
		return len > BUF - i ? -1 : 0;
	const unsigned char *b = p + i;
	static const unsigned char connack[4] = {0x20, 2, 0, 0}, pingresp[2] = {0xd0, 0};
	switch (p[0] >> 4) {
	case 1: send_all(c->fd, connack, 4); break;
	case 3: publish(c, b, len, p[0] & 15); break;
	case 8: subscribe(c, b); break;
	case 12: send_all(c->fd, pingresp, 2); break;
	case 14: return -1;
	default: break; /* PUBACK and the like: nothing is tracked */
	}
	return i + len;
}

static void hang_up(struct conn *c)
{
	for (int i = 0; c->sub_len >= 0 && i < nsubscribers; i++)
		if (subscribers[i] == c->fd)
			subscribers[i] = subscribers[--nsubscribers];
	conns[c->fd] = NULL;
	close(c->fd);
	free(c);
}

static void readable(struct conn *c)
{
	ssize_t r = read(c->fd, c->buf + c->n, sizeof c->buf - (size_t)c->n);
	if (r <= 0) {
		hang_up(c);
		return;
	}
	c->n += (int)r;
	int off = 0, used;
	while ((used = packet(c, c->buf + off, c->n - off)) > 0)
		off += used;
	if (used < 0) {
		hang_up(c);
		return;
	}
	memmove(c->buf, c->buf + off, (size_t)(c->n - off));
	c->n -= off;
}

static void accept_one(int lfd, int ep)
{
	int one = 1, fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
	if (fd < 0)
		return;
	struct conn *c = fd < MAX_FD ? calloc(1, sizeof *c) : NULL;
	struct epoll_event e = {.events = EPOLLIN, .data.fd = fd};
	if (!c || epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e)) {
		free(c);
		close(fd);
		return;
	}
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	*c = (struct conn){.fd = fd, .sub_len = -1, .next_id = 1};
	conns[fd] = c;
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: mqtt-floor PORT\n");
		return 2;
	}
	int one = 1, lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1])),
				.sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (bind(lfd, (struct sockaddr *)&a, sizeof a) || listen(lfd, 4096)) {
		perror("mqtt-floor: listen");
		return 1;
	}
	int ep = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event e = {.events = EPOLLIN, .data.fd = lfd};
	epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &e);
	for (;;) {
		struct epoll_event ev[256];
		int n = epoll_wait(ep, ev, 256, -1);
		for (int k = 0; k < n; k++) {
			int fd = ev[k].data.fd;
			if (fd == lfd)
				accept_one(lfd, ep);
			else if (conns[fd])
				readable(conns[fd]);
		}
	}
}
