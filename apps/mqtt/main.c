/*
 * main.c - weft-mqtt: options, listeners, the broker's housekeeping tasks, clean shutdown.
 *
 * weft has no signal API, so SIGINT and SIGTERM are blocked in every thread (the mask is set
 * before weft_run starts the workers, which inherit it) and read from a signalfd by a task,
 * through weft_read like any other descriptor. On a signal the broker stops accepting, sends
 * every 5.0 client a DISCONNECT "server shutting down", waits for the connections to end,
 * then frees everything (so a leak checker sees a clean exit). SIGHUP, read the same way,
 * reloads the password and ACL files (access.c) and the broker goes on.
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <weft.h>

#include "access.h"
#include "bridge.h"
#include "broker.h"
#include "conf.h"
#include "conn_public.h"
#include "epoch.h"
#include "persist.h"
#include "pool.h"
#include "ratelimit.h"
#include "session.h"
#include "stats.h"
#include "tls.h"
#include "topic.h"

static int lfds[MAX_LISTENERS];
static int lproto[MAX_LISTENERS];
static tls_ctx *ltls[MAX_LISTENERS];
static int sigfd = -1;
static rl_table *conn_rate; /* max_connection_rate, or NULL */

static void acceptor(void *arg)
{
	int i = (int)(intptr_t)arg, lfd = lfds[i];
	while (!atomic_load(&broker_stopping)) {
		struct sockaddr_storage ss;
		socklen_t sl = sizeof ss;
		int fd = weft_accept(lfd, (struct sockaddr *)&ss, &sl, 0, WEFT_FOREVER);
		if (fd < 0) {
			if (fd == -EBADF || fd == -ECANCELED || atomic_load(&broker_stopping))
				return;
			weft_sleep_until(weft_now() + 10000000); /* out of fds: let some close */
			continue;
		}
		/* Limits that refuse a connection do it here, before a task or a byte of buffer is
		 * spent on it: the client sees the connection closed, with no CONNACK. */
		if (conf.max_connections >= 0 && conns_count() >= conf.max_connections) {
			stats_add(ST_REFUSED_MAX_CONN, 1);
			weft_close(fd);
			continue;
		}
		if (conn_rate && !rl_take(conn_rate, (struct sockaddr *)&ss, weft_now())) {
			stats_add(ST_REFUSED_RATE, 1);
			if (conf.verbose)
				fprintf(stderr, "weft-mqtt: connection refused (max_connection_rate)\n");
			weft_close(fd);
			continue;
		}
		int one = 1;
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
		conn_serve(fd, lproto[i], ltls[i]);
	}
}

static void reaper(void *arg)
{
	(void)arg;
	while (!atomic_load(&broker_stopping)) {
		if (weft_sleep_until(weft_now() + 200000000) < 0)
			return;
		sessions_reap(weft_now());
		epoch_collect(0);
		pool_trim(weft_now());
	}
}

static int broker(void *arg)
{
	(void)arg;
	broker_start = weft_now();
	if (access_load(true) < 0)
		return 1;
	pool_init();
	stats_init();
	topic_init();
	if (restore_open() < 0)
		return 1;
	for (int i = 0; i < conf.nlisteners; i++) {
		listener_conf *l = &conf.listeners[i];
		lproto[i] = l->protocol;
#ifdef MQTT_NO_CRYPTO
		if (l->protocol == PROTO_WEBSOCKETS) {
			fprintf(stderr, "weft-mqtt: protocol websockets needs a weft-mqtt built with "
					"OpenSSL\n");
			return 1;
		}
#endif
		if (l->certfile[0]) {
			tls_opts to = {
				.certfile = l->certfile, .keyfile = l->keyfile, .cafile = l->cafile,
				.ciphers = l->ciphers, .require_certificate = l->require_certificate == 1,
				.use_identity_as_username = l->use_identity_as_username == 1,
			};
			char err[512];
			ltls[i] = tls_ctx_server(&to, err, sizeof err);
			if (!ltls[i]) {
				fprintf(stderr, "weft-mqtt: listener %d: %s\n", l->port, err);
				return 1;
			}
		}
		lfds[i] = weft_tcp_listen(l->host[0] ? l->host : NULL, l->port, 4096);
		if (lfds[i] < 0) {
			fprintf(stderr, "weft-mqtt: cannot listen on %s:%d: %s\n",
				l->host[0] ? l->host : "*", l->port, strerror(-lfds[i]));
			return 1;
		}
		if (conf.verbose)
			fprintf(stderr, "weft-mqtt: listening on %s:%d%s%s\n",
				l->host[0] ? l->host : "*", l->port,
				l->protocol == PROTO_WEBSOCKETS ? " (websockets)" : "",
				ltls[i] ? " (TLS)" : "");
	}
	if (conf.conn_rate > 0 &&
	    !(conn_rate = rl_new(conf.conn_burst, (int64_t)(1e9 / conf.conn_rate))))
		abort();
	if (metrics_start() < 0 || bridges_start() < 0)
		return 1;
	weft_spawn_opts o = { .name = "mqtt-accept" };
	weft_task *acc[MAX_LISTENERS];
	for (int i = 0; i < conf.nlisteners; i++)
		acc[i] = weft_spawn_opt(acceptor, (void *)(intptr_t)i, &o);
	o.name = "mqtt-reaper";
	weft_task *rp = weft_spawn_opt(reaper, NULL, &o);
	weft_task *st = NULL;
	if (conf.sys_interval) {
		o.name = "mqtt-sys";
		st = weft_spawn_opt(stats_task, NULL, &o);
	}
	struct signalfd_siginfo si;
	ssize_t n;
	while ((n = weft_read(sigfd, &si, sizeof si, WEFT_FOREVER)) == sizeof si &&
	       si.ssi_signo == SIGHUP) {
		if (conf.verbose)
			fprintf(stderr, "weft-mqtt: SIGHUP, reloading the password and ACL files\n");
		access_load(false);
	}
	if (conf.verbose && n == sizeof si)
		fprintf(stderr, "weft-mqtt: signal %u, shutting down\n", si.ssi_signo);
	atomic_store(&broker_stopping, 1);
	for (int i = 0; i < conf.nlisteners; i++) {
		weft_cancel(acc[i]);
		weft_join(acc[i]);
		weft_close(lfds[i]);
	}
	metrics_stop();
	conns_shutdown();
	bridges_stop();
	weft_cancel(rp);
	weft_join(rp);
	if (st) {
		weft_cancel(st);
		weft_join(st);
	}
	persist_close(conns_count()); /* closes the store if every connection has ended */
	if (conns_count()) { /* a connection would not end: exit without freeing under it */
		fprintf(stderr, "weft-mqtt: %ld connections did not close\n", conns_count());
		return 0;
	}
	weft_sleep_until(weft_now() + 20000000); /* let detached writer tasks finish */
	sessions_free_all();
	for (int i = 0; i < conf.nlisteners; i++)
		tls_ctx_free(ltls[i]);
	epoch_collect(1);
	topic_free_all();
	epoch_collect(1);
	stats_fini();
	pool_fini();
	rl_free(conn_rate);
	return 0;
}

int main(int argc, char **argv)
{
	int r = conf_args(&conf, argc, argv);
	if (r)
		return r > 0 ? 0 : 2;
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGHUP);
	sigprocmask(SIG_BLOCK, &set, NULL);
	signal(SIGPIPE, SIG_IGN);
	/* a file size limit (ulimit -f) reached by the store must fail its writes as a full disk
	 * does (store.c recovers when it can write), not kill the broker */
	signal(SIGXFSZ, SIG_IGN);
	sigfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
	if (sigfd < 0) {
		perror("weft-mqtt: signalfd");
		return 1;
	}
	pool_malloc_setup();
	r = weft_run(broker, NULL);
	return r < 0 ? 1 : r;
}
