/*
 * config.c - command-line options and mosquitto-syntax configuration files.
 *
 * A configuration file is lines of "option value..." with '#' comments, as mosquitto.conf.
 * weft-mqtt reads the options it implements and rejects any other with the file and line, so
 * a typo never silently changes nothing.
 */
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <weft.h>

#include "bridge.h"
#include "broker.h"
#include "conf.h"
#include "textfile.h"

static int path(const char *file, int line, const char *opt, const char *v, char *out, size_t cap)
{
	if (!v || strlen(v) >= cap) {
		fprintf(stderr, "%s:%d: %s needs a path\n", file, line, opt);
		return -1;
	}
	strcpy(out, v);
	return 0;
}

static int host(const char *file, int line, const char *v, char *out)
{
	if (!v || strlen(v) >= 64) {
		fprintf(stderr, "%s:%d: bad address\n", file, line);
		return -1;
	}
	strcpy(out, v);
	return 0;
}

/* A TLS option of the listener above it (as mosquitto, per listener). */
static int tls_option(broker_conf *c, const char *file, int line, const char *o, const char *v)
{
	if (!c->nlisteners) {
		fprintf(stderr, "%s:%d: %s needs a listener line before it\n", file, line, o);
		return -1;
	}
	listener_conf *l = &c->listeners[c->nlisteners - 1];
	if (!strcmp(o, "require_certificate"))
		return conf_bool(file, line, o, v, &l->require_certificate);
	if (!strcmp(o, "use_identity_as_username"))
		return conf_bool(file, line, o, v, &l->use_identity_as_username);
	char *out = !strcmp(o, "certfile") ? l->certfile : !strcmp(o, "keyfile") ? l->keyfile
		  : !strcmp(o, "cafile")   ? l->cafile
					   : l->ciphers;
	return path(file, line, o, v, out, sizeof l->certfile);
}

/* RATE[/BURST] (max_connection_rate, max_publish_rate, password_pace): RATE a second (a
 * decimal, so 0.5 is one every 2 s, down to 0.0001: one every 10,000 s), BURST at once
 * (default: RATE rounded up); 0 turns the limit off. The limiters compute BURST intervals in
 * int64_t nanoseconds: the pair is refused where that would pass 2^62. */
static int rate_option(const char *file, int line, const char *o, const char *what, const char *v,
		       double *rate, int *burst_out)
{
	char *end = NULL;
	errno = 0;
	double r = v ? strtod(v, &end) : -1;
	long burst = 0;
	bool ok = v && end != v && !errno && r >= 0 && r <= 1e6;
	if (ok && *end == '/') {
		char *e2;
		burst = strtol(end + 1, &e2, 10);
		ok = e2 != end + 1 && !*e2 && burst >= 1 && burst <= 1000000;
	} else if (ok) {
		ok = !*end;
	}
	if (ok && r > 0 && !burst)
		burst = (long)r + ((double)(long)r < r);
	if (!ok || (r > 0 && (r < 0.0001 || (double)burst * 1e9 / r > 0x1p62))) {
		fprintf(stderr, "%s:%d: %s needs RATE[/BURST]: %s a second "
				"(0: off, or 0.0001 to 1000000, e.g. 10 or 0.5) and at most BURST at "
				"once (1 to 1000000; BURST / RATE under 4.6e9 s)\n",
			file, line, o, what);
		return -1;
	}
	*rate = r;
	*burst_out = r > 0 ? (int)burst : 0;
	return 0;
}

/* One "option args" line; words[] NUL-terminated. */
static int option(broker_conf *c, const char *file, int line, char **w, int nw)
{
	const char *o = w[0], *v = nw > 1 ? w[1] : NULL;
	long n;
	int br = bridge_option(file, line, w, nw); /* connection blocks: bridge.c */
	if (br <= 0)
		return br;
	if (!strcmp(o, "listener")) {
		if (c->nlisteners == MAX_LISTENERS) {
			fprintf(stderr, "%s:%d: at most %d listeners\n", file, line, MAX_LISTENERS);
			return -1;
		}
		if (conf_number(file, line, o, v, 0, 65535, &n) < 0)
			return -1;
		listener_conf *l = &c->listeners[c->nlisteners++];
		l->port = (int)n;
		l->protocol = PROTO_MQTT;
		strcpy(l->host, "");
		if (nw > 2 && host(file, line, w[2], l->host) < 0)
			return -1;
		return 0;
	}
	if (!strcmp(o, "protocol")) { /* of the listener above it */
		if (!c->nlisteners) {
			fprintf(stderr, "%s:%d: protocol needs a listener line before it\n", file, line);
			return -1;
		}
		if (v && !strcmp(v, "mqtt"))
			c->listeners[c->nlisteners - 1].protocol = PROTO_MQTT;
		else if (v && !strcmp(v, "websockets"))
			c->listeners[c->nlisteners - 1].protocol = PROTO_WEBSOCKETS;
		else {
			fprintf(stderr, "%s:%d: protocol needs mqtt or websockets\n", file, line);
			return -1;
		}
		return 0;
	}
	if (!strcmp(o, "certfile") || !strcmp(o, "keyfile") || !strcmp(o, "cafile") ||
	    !strcmp(o, "ciphers") || !strcmp(o, "require_certificate") ||
	    !strcmp(o, "use_identity_as_username"))
		return tls_option(c, file, line, o, v);
	if (!strcmp(o, "port")) {
		if (conf_number(file, line, o, v, 0, 65535, &n) < 0)
			return -1;
		if (!c->nlisteners) {
			c->nlisteners = 1;
			strcpy(c->listeners[0].host, "");
		}
		c->listeners[0].port = (int)n;
		return 0;
	}
	if (!strcmp(o, "bind_address")) {
		if (!c->nlisteners) {
			c->nlisteners = 1;
			c->listeners[0].port = 1883;
		}
		return host(file, line, v, c->listeners[0].host);
	}
	if (!strcmp(o, "max_connections")) {
		if (conf_number(file, line, o, v, -1, INT_MAX, &n) < 0)
			return -1;
		c->max_connections = n;
		return 0;
	}
	if (!strcmp(o, "max_inflight_messages")) {
		if (conf_number(file, line, o, v, 0, 65535, &n) < 0)
			return -1;
		c->max_inflight_messages = n ? (int)n : 65535; /* 0: no limit, as mosquitto */
		return 0;
	}
	if (!strcmp(o, "max_queued_messages")) {
		if (conf_number(file, line, o, v, 0, INT_MAX, &n) < 0)
			return -1;
		c->max_queued_messages = n ? (int)n : INT_MAX;
		return 0;
	}
	if (!strcmp(o, "max_queued_bytes")) {
		if (conf_number(file, line, o, v, 0, LONG_MAX, &n) < 0)
			return -1;
		c->max_queued_bytes = n;
		return 0;
	}
	if (!strcmp(o, "retained_backlog_bytes") || !strcmp(o, "retained_backlog_bytes_total")) {
		if (conf_number(file, line, o, v, 0, LONG_MAX, &n) < 0)
			return -1;
		if (!strcmp(o, "retained_backlog_bytes"))
			c->backlog_bytes = n;
		else
			c->backlog_bytes_total = n;
		return 0;
	}
	if (!strcmp(o, "max_connection_rate"))
		return rate_option(file, line, o, "connections", v, &c->conn_rate, &c->conn_burst);
	if (!strcmp(o, "password_pace"))
		return rate_option(file, line, o, "password checks per address and name", v,
				   &c->pw_rate, &c->pw_burst);
	if (!strcmp(o, "max_publish_rate"))
		return rate_option(file, line, o, "PUBLISH packets", v, &c->pub_rate, &c->pub_burst);
	if (!strcmp(o, "message_size_limit")) {
		if (conf_number(file, line, o, v, 0, 268435455, &n) < 0)
			return -1;
		c->message_size_limit = n;
		return 0;
	}
	if (!strcmp(o, "max_keepalive")) {
		if (conf_number(file, line, o, v, 0, 65535, &n) < 0)
			return -1;
		c->max_keepalive = (int)n;
		return 0;
	}
	if (!strcmp(o, "metrics_listener")) { /* metrics_listener PORT [BIND_ADDRESS] */
		if (conf_number(file, line, o, v, 1, 65535, &n) < 0)
			return -1;
		c->metrics_port = (int)n;
		strcpy(c->metrics_host, "127.0.0.1");
		if (nw > 2 && host(file, line, w[2], c->metrics_host) < 0)
			return -1;
		return 0;
	}
	if (!strcmp(o, "sys_interval")) {
		if (conf_number(file, line, o, v, 0, 86400, &n) < 0)
			return -1;
		c->sys_interval = (int)n;
		return 0;
	}
	if (!strcmp(o, "allow_anonymous"))
		return conf_bool(file, line, o, v, &c->allow_anonymous);
	if (!strcmp(o, "persistence"))
		return conf_bool(file, line, o, v, &c->persistence);
	if (!strcmp(o, "password_file"))
		return path(file, line, o, v, c->password_file, sizeof c->password_file);
	if (!strcmp(o, "allow_plain_passwords"))
		return conf_bool(file, line, o, v, &c->allow_plain_passwords);
	if (!strcmp(o, "acl_file"))
		return path(file, line, o, v, c->acl_file, sizeof c->acl_file);
	if (!strcmp(o, "persistence_location"))
		return path(file, line, o, v, c->persistence_location, sizeof c->persistence_location);
	fprintf(stderr, "%s:%d: unknown option '%s'\n", file, line, o);
	return -1;
}

int conf_load(broker_conf *c, const char *file)
{
	char why[512];
	FILE *f = textfile_open(file, why, sizeof why);
	if (!f) {
		fprintf(stderr, "weft-mqtt: %s\n", why);
		return -1;
	}
	char buf[1024];
	int line = 0, err = 0;
	while (!err && fgets(buf, sizeof buf, f)) {
		line++;
		if (!strchr(buf, '\n') && !feof(f)) {
			fprintf(stderr, "%s:%d: line too long\n", file, line);
			err = -1;
			break;
		}
		char *w[8];
		int nw = 0;
		for (char *t = strtok(buf, " \t\r\n"); t && nw < 8; t = strtok(NULL, " \t\r\n")) {
			if (t[0] == '#')
				break;
			w[nw++] = t;
		}
		if (nw)
			err = option(c, file, line, w, nw);
	}
	fclose(f);
	if (err || bridge_conf_end(file) < 0)
		return -1;
	for (int i = 0; i < c->nlisteners; i++) {
		listener_conf *l = &c->listeners[i];
		if (!l->certfile[0] && (l->keyfile[0] || l->cafile[0] || l->require_certificate ||
					l->use_identity_as_username || l->ciphers[0])) {
			fprintf(stderr, "%s: listener %d has TLS options but no certfile\n", file,
				l->port);
			return -1;
		}
		if (l->certfile[0] && !l->keyfile[0]) {
			fprintf(stderr, "%s: listener %d has a certfile but no keyfile\n", file, l->port);
			return -1;
		}
	}
	return 0;
}

static void usage(FILE *o)
{
	fprintf(o,
		"Usage: weft-mqtt [-c config-file] [-p port] [-v] [--help] [--version]\n"
		"\n"
		"An MQTT 3.1.1 and 5.0 broker on weft.\n"
		"\n"
		"  -c, --config-file FILE  read options from FILE (mosquitto syntax): listener,\n"
		"                          bind_address, port, max_connections, max_inflight_messages,\n"
		"                          max_queued_messages, max_queued_bytes, max_connection_rate,\n"
		"                          max_publish_rate, retained_backlog_bytes,\n"
		"                          retained_backlog_bytes_total,\n"
		"                          message_size_limit, max_keepalive,\n"
		"                          allow_anonymous, sys_interval, password_file,\n"
		"                          password_pace, allow_plain_passwords, acl_file,\n"
		"                          protocol websockets,\n"
		"                          certfile, keyfile, cafile, ciphers, require_certificate,\n"
		"                          use_identity_as_username, persistence,\n"
		"                          persistence_location, metrics_listener, and bridges:\n"
		"                          connection NAME, address, topic, ... (see\n"
		"                          docs/weft-mqtt-bridges.md)\n"
		"  -p, --port PORT         listen on PORT (default 1883) on 127.0.0.1, unless the\n"
		"                          configuration names listeners\n"
		"  -v, --verbose           log connections on stderr\n"
		"  -h, --help              this text\n"
		"      --version           print the version\n"
		"\n"
		"Anonymous clients are allowed from loopback addresses only, unless allow_anonymous\n"
		"says otherwise. SIGHUP reloads password_file and acl_file. SIGINT or SIGTERM\n"
		"stops the broker cleanly. See weft-mqtt(1).\n");
}

int conf_args(broker_conf *c, int argc, char **argv)
{
	conf_defaults(c);
	int port = -1;
	const char *file = NULL;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			usage(stdout);
			return 1;
		}
		if (!strcmp(a, "--version")) {
			printf("%s\n", WEFT_MQTT_VERSION);
			return 1;
		}
		if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
			c->verbose = 1;
			continue;
		}
		if ((!strcmp(a, "-c") || !strcmp(a, "--config-file")) && i + 1 < argc) {
			file = argv[++i];
			continue;
		}
		if ((!strcmp(a, "-p") || !strcmp(a, "--port")) && i + 1 < argc) {
			char *end;
			long n = strtol(argv[++i], &end, 10);
			if (*end || n < 0 || n > 65535) {
				fprintf(stderr, "weft-mqtt: bad port '%s'\n", argv[i]);
				return -1;
			}
			port = (int)n;
			continue;
		}
		fprintf(stderr, "weft-mqtt: unknown argument '%s'\n", a);
		usage(stderr);
		return -1;
	}
	if (file && conf_load(c, file) < 0)
		return -1;
	if (port >= 0) { /* -p: this port, on the configured address or loopback */
		if (!c->nlisteners) {
			c->nlisteners = 1;
			strcpy(c->listeners[0].host, "127.0.0.1");
		}
		c->listeners[0].port = port;
	}
	if (!c->nlisteners) {
		c->nlisteners = 1;
		c->listeners[0].port = 1883;
		strcpy(c->listeners[0].host, "127.0.0.1");
	}
	return 0;
}
