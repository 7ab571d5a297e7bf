/*
 * conn.c - a connection's life: accepted (conn_serve) or opened by a bridge (conn_open_bridge),
 * registered in the list of every connection (for shutdown, $SYS and metrics), run by the read
 * loop (loop.c) in a task of its own, and torn down (conn_end): last words to a 5.0 client,
 * what its session's output still holds written once durable, the session detached (which
 * publishes or schedules the will unless the client said goodbye properly), the socket closed.
 *
 * The files of conn/: this one; loop.c, the read loop; one handle_*.c per packet (connect,
 * publish, the acknowledgements, subscribe, unsubscribe, ping, disconnect, as mosquitto's
 * handle_*.c), login.c (who a CONNECT's client is), acks.c (acknowledgements held until
 * durable), output.c (what a connection writes itself), kick.c (ending a connection from
 * another task), tls.c and ws.c (the transports; nocrypto.c stands in without OpenSSL).
 *
 * Roles. A client's connection and a bridge's differ where the read loop asks c->role
 * (conn_role, conn_public.h): the client's table is here, a bridge's in bridge/bridge.c. route/
 * reaches a connection only through c->peer (peer_ops): the client's table is here too.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <weft.h>

#include "acl.h"
#include "auth.h"
#include "codec.h"
#include "conf.h"
#include "conn.h"
#include "conn_public.h"
#include "epoch.h"
#include "peer.h"
#include "persist.h"
#include "pool.h"
#include "records.h"
#include "session.h"
#include "tls.h"
#include "ws.h"

/* The largest first packet: five strings of 64 KiB (client id, will topic and payload,
 * username, password) and the properties of any client library leave a CONNECT far from
 * this; without a cap before CONNECT, any stranger could make a connection hold 256 MB. */
#define MAX_CONNECT (512u << 10)

/* The largest packet a connected client may send: the message size limit and room for a
 * PUBLISH's topic and properties, or what the protocol allows. */
uint32_t conn_in_packet_limit(void)
{
	return conf.message_size_limit ? (uint32_t)conf.message_size_limit + 65536 + 1024
				       : 268435460;
}

static weft_mutex list_lock = WEFT_MUTEX_INIT;
static conn *all;
static long nconns;

long conns_count(void)
{
	long n = 0;
	WEFT_WITH_LOCK(&list_lock)
		n = nconns;
	return n;
}

void conns_shutdown(void)
{
	WEFT_WITH_LOCK(&list_lock)
		for (conn *c = all; c; c = c->next)
			conn_kick(c, MQ_RC_SERVER_SHUTTING_DOWN);
	for (int i = 0; i < 300 && conns_count(); i++)
		weft_sleep_until(weft_now() + 10000000);
}

/* A client's keep-alive: one and a half times its interval without a packet ends it
 * [MQTT-3.1.2-24]. */
static int64_t client_keepalive_deadline(conn *c, int64_t last)
{
	return last + (int64_t)c->keep_alive * 1500000000LL;
}

static int client_keepalive_expired(conn *c, int64_t last)
{
	(void)c, (void)last;
	return -1;
}

const conn_role conn_client_role = {
	.publish_rate = true,
	.on_packet = NULL,
	.in_topic = conn_client_in_topic,
	.keepalive_deadline = client_keepalive_deadline,
	.keepalive_expired = client_keepalive_expired,
	.goodbye = NULL,
};

const peer_ops conn_client_peer = {
	.write = conn_write,
	.frame = conn_frame,
	.kick = conn_kick,
	.out_topic = NULL,
};

/* Tear down: last words to a 5.0 client, detach from the session, close. */
void conn_end(conn *c, int rc, bool will)
{
	int kick = atomic_load(&c->kick_rc);
	if (kick)
		rc = kick;
	session *s = c->s;
	if (s) {
		uint8_t *buf = NULL;
		size_t len = 0;
		int64_t need = 0;
		WEFT_WITH_LOCK(&s->lock) {
			/* From here on, deliveries queue in the session (taking_output, session.c):
			 * what is not written by the end of this would be lost to the client. */
			c->closing = true;
			/* A writer task blocked on a client that reads nothing would wait forever:
			 * after half a second, shut the socket under it. */
			int64_t dl = weft_now() + 500000000;
			while (s->writing)
				if (weft_cond_wait_until(&s->idle, &s->lock, dl) == -ETIMEDOUT &&
				    s->writing) {
					shutdown(c->fd, SHUT_RDWR);
					dl = WEFT_FOREVER;
				}
			/* a bridge stopped by the broker says goodbye to its remote as a client does */
			uint8_t dd[8], *d = dd;
			size_t n = 0;
			if (c->role->goodbye && kick == MQ_RC_SERVER_SHUTTING_DOWN) {
				d = malloc(65536 + 64);
				if (!d)
					abort();
				n = c->role->goodbye(c, d, 65536 + 64);
			} else if (c->version == 5 && rc && rc != 1) {
				n = mq_enc_disconnect(d, 5, rc, NULL);
			}
			if (n)
				memcpy(session_out_room(s, n), d, n);
			if (d != dd)
				free(d);
			buf = session_take_out(s, &len, &need);
		}
		/* QoS 2 state in it goes only once durable (session.c, out_after); else the client
		 * gets it all again on its return */
		if (len && persist_wait_ticket(need, weft_now() + 1000000000) == 0) {
			buf = conn_frame(c, buf, &len);
			conn_write(c, buf, len, weft_now() + 200000000);
		}
		pool_free(buf);
		conn_ws_close(c);
		if (c->tls)
			tls_shutdown(c->tls, weft_now() + 200000000);
		shutdown(c->fd, SHUT_RDWR);
		session_detach(c, will);
	} else {
		conn_ws_close(c);
		shutdown(c->fd, SHUT_RDWR);
	}
	WEFT_WITH_LOCK(&list_lock) {
		if (c->prev)
			c->prev->next = c->next;
		else
			all = c->next;
		if (c->next)
			c->next->prev = c->prev;
		nconns--;
	}
	tls_free(c->tls);
	weft_close(c->fd);
	epoch_unregister(&c->reader);
	for (uint16_t i = 0; c->in_alias && i < c->in_alias_max; i++)
		free(c->in_alias[i]);
	free(c->in_alias);
	for (uint16_t i = 0; i < c->out_alias_n; i++)
		free(c->out_alias[i].topic);
	free(c->out_alias);
	free(c->match.v);
	free(c->front.v);
	free(c->front_next.v);
	free(c->dirty.v);
	free(c->acks.v);
	free(c->user);
	if (c->ws) {
		ws_free(c->ws);
		free(c->ws);
	}
	free(c);
}

static bool is_loopback(int fd)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof ss;
	if (getpeername(fd, (struct sockaddr *)&ss, &len) < 0)
		return false;
	if (ss.ss_family == AF_INET)
		return (ntohl(((struct sockaddr_in *)&ss)->sin_addr.s_addr) >> 24) == 127;
	if (ss.ss_family == AF_INET6) {
		struct in6_addr *a = &((struct sockaddr_in6 *)&ss)->sin6_addr;
		if (IN6_IS_ADDR_LOOPBACK(a))
			return true;
		return IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127;
	}
	return ss.ss_family == AF_UNIX;
}

/* Set up c (fd and its TLS or WebSocket layer done) and add it to the list. */
static void conn_register(conn *c, int fd)
{
	c->fd = fd;
	c->loopback = is_loopback(fd);
	c->version = 4;
	uint32_t limit = conn_in_packet_limit();
	c->max_in_packet = limit < MAX_CONNECT ? limit : MAX_CONNECT;
	/* batch numbers unique across connections: a new conn at a freed one's address must not
	 * match the dirty marks that one left in sessions */
	static _Atomic uint64_t serial;
	c->batch = (atomic_fetch_add(&serial, 1) + 1) << 32;
	atomic_init(&c->kick_rc, 0);
	atomic_init(&c->napping, false);
	epoch_register(&c->reader);
	WEFT_WITH_LOCK(&list_lock) {
		c->next = all;
		if (all)
			all->prev = c;
		all = c;
		nconns++;
	}
}

conn *conn_open_bridge(int fd, tls_conn *t, struct bridge *b, int version, uint16_t keep_alive,
		       const peer_ops *peer, const conn_role *role)
{
	conn *c = calloc(1, sizeof *c);
	if (!c)
		return NULL;
	c->peer = peer;
	c->role = role;
	conn_register(c, fd);
	c->tls = t;
	c->bridge = b;
	c->version = (uint8_t)version;
	c->connected = true; /* the CONNACK was read by bridge.c */
	c->keep_alive = keep_alive;
	c->max_in_packet = conn_in_packet_limit();
	c->in_alias_max = 0; /* the CONNECT offered the remote no topic aliases */
	return c;
}

void conn_run(conn *c)
{
	if (!c->s) { /* no local session: end before reading what the remote sent */
		conn_end(c, 0, false);
		return;
	}
	conn_read_loop(c);
}

void conn_serve(int fd, int protocol, tls_ctx *tls)
{
	conn *c = calloc(1, sizeof *c);
	if (!c) {
		weft_close(fd);
		return;
	}
	c->peer = &conn_client_peer;
	c->role = &conn_client_role;
	if (tls && !(c->tls = tls_conn_new(tls, fd))) {
		free(c);
		weft_close(fd);
		return;
	}
	if (protocol == PROTO_WEBSOCKETS) {
		c->ws = malloc(sizeof *c->ws);
		if (!c->ws)
			abort();
		ws_limits lim = { 0 };
		if (conf.message_size_limit) /* no frame larger than the largest packet */
			lim.max_frame = (uint64_t)conf.message_size_limit + 65536 + 1024;
		ws_init(c->ws, conf.message_size_limit ? &lim : NULL);
	}
	conn_register(c, fd);
	weft_spawn_opts o = { .name = "mqtt-conn", .detached = 1 };
	if (!weft_spawn_opt(conn_read_loop, c, &o)) {
		conn_end(c, 0, false);
	}
}
