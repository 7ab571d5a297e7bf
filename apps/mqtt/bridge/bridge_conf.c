/*
 * bridge_conf.c - the bridges' configuration: mosquitto's "connection" blocks (connection,
 * address, topic, remote_username, bridge_cafile, restart_timeout, ...; the options are in
 * docs/weft-mqtt-bridges.md), handed over line by line by config.c (bridge_option), and checked
 * whole at the end of the file (bridge_conf_end), where the defaults that depend on other
 * options are filled (remote_clientid as mosquitto's hostname.name, local_clientid, the
 * notification topic). Errors name the file and line, as config.c's do.
 */
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bridge_conf.h"
#include "codec.h"
#include "conf.h"

bridge *bridges[MAX_BRIDGES];
int nbridges;

static char *dup_or_die(const char *s)
{
	char *d = strdup(s);
	if (!d)
		abort();
	return d;
}

/* Options of mosquitto's bridges that weft-mqtt does not implement: refused by name. */
static const char *const unsupported[] = {
	"round_robin", "idle_timeout", "threshold", "bridge_bind_address", "bridge_alpn",
	"bridge_identity", "bridge_psk", "local_username", "local_password",
	"bridge_require_ocsp", "bridge_reload_type",
	"bridge_receive_maximum", "bridge_session_expiry_interval", NULL,
};

static int err(const char *file, int line, const char *fmt, const char *a)
{
	fprintf(stderr, "%s:%d: ", file, line);
	fprintf(stderr, fmt, a);
	fputc('\n', stderr);
	return -1;
}

static int parse_str(const char *file, int line, const char *o, const char *v, int nw, char **out)
{
	if (!v || nw != 2 || strlen(v) > 65535)
		return err(file, line, "%s needs one value", o);
	free(*out);
	*out = dup_or_die(v);
	return 0;
}

/* host[:port] (an IPv6 address needs its port, as mosquitto: the last ':' splits). */
static int parse_address(const char *file, int line, bridge *b, const char *v)
{
	if (b->naddr == MAX_ADDRS) {
		fprintf(stderr, "%s:%d: at most %d addresses per bridge\n", file, line, MAX_ADDRS);
		return -1;
	}
	char h[256];
	if (strlen(v) >= sizeof h)
		return err(file, line, "bad bridge address '%s'", v);
	strcpy(h, v);
	long port = 1883;
	char *colon = strrchr(h, ':');
	if (colon && (colon == h || strchr(h, ':') == colon)) { /* one ':' only: host:port */
		*colon = 0;
		if (conf_number(file, line, "the address's port", colon + 1, 1, 65535, &port) < 0)
			return -1;
	}
	if (!h[0])
		return err(file, line, "bad bridge address '%s'", v);
	b->host[b->naddr] = dup_or_die(h);
	b->port[b->naddr++] = (int)port;
	return 0;
}

static bool valid_name(const char *t) /* a topic name: no wildcards, UTF-8 */
{
	return mq_topic_name_check((const uint8_t *)t, strlen(t)) == 0;
}

static char *concat(const char *a, const char *b)
{
	size_t na = a ? strlen(a) : 0, nb = b ? strlen(b) : 0;
	char *r = malloc(na + nb + 1);
	if (!r)
		abort();
	memcpy(r, a ? a : "", na);
	memcpy(r + na, b ? b : "", nb);
	r[na + nb] = 0;
	return r;
}

/* topic PATTERN [out|in|both [QOS [LOCAL_PREFIX [REMOTE_PREFIX]]]], "" for an empty word. */
static int parse_topic(const char *file, int line, bridge *b, char **w, int nw)
{
	if (nw < 2 || nw > 6)
		return err(file, line, "%s",
			   "topic needs: pattern [out|in|both [qos [local-prefix [remote-prefix]]]]");
	const char *pat = strcmp(w[1], "\"\"") ? w[1] : NULL;
	int dir = DIR_OUT;
	long qos = 0;
	if (nw > 2) {
		if (!strcmp(w[2], "out"))
			dir = DIR_OUT;
		else if (!strcmp(w[2], "in"))
			dir = DIR_IN;
		else if (!strcmp(w[2], "both"))
			dir = DIR_BOTH;
		else
			return err(file, line, "topic direction '%s' is not out, in or both", w[2]);
	}
	if (nw > 3 && conf_number(file, line, "the topic's qos", w[3], 0, 2, &qos) < 0)
		return -1;
	const char *lp = nw > 4 && strcmp(w[4], "\"\"") ? w[4] : NULL;
	const char *rp = nw > 5 && strcmp(w[5], "\"\"") ? w[5] : NULL;
	if (pat && mq_topic_filter_check((const uint8_t *)pat, strlen(pat)) < 0)
		return err(file, line, "bad topic pattern '%s'", pat);
	if (lp && !valid_name(lp))
		return err(file, line, "bad local prefix '%s' (a topic without wildcards)", lp);
	if (rp && !valid_name(rp))
		return err(file, line, "bad remote prefix '%s' (a topic without wildcards)", rp);
	if (!pat && (!lp || !rp))
		return err(file, line, "%s",
			   "an empty topic pattern needs both a local and a remote prefix");
	btopic *v = realloc(b->topics, (size_t)(b->ntopics + 1) * sizeof *v);
	if (!v)
		abort();
	b->topics = v;
	btopic *t = &v[b->ntopics++];
	*t = (btopic){ dir, (int)qos, lp ? dup_or_die(lp) : NULL, rp ? dup_or_die(rp) : NULL,
		       concat(lp, pat), concat(rp, pat), 0, 0 };
	t->nlocal = strlen(t->local);
	t->nremote = strlen(t->remote);
	if (t->nlocal > 65535 || t->nremote > 65535)
		return err(file, line, "%s", "topic too long");
	return 0;
}

/* restart_timeout BASE [CAP] (or BASE,CAP) */
static int parse_restart(const char *file, int line, bridge *b, char **w, int nw)
{
	char v[64];
	if (nw < 2 || nw > 3 || strlen(w[1]) >= sizeof v)
		return err(file, line, "%s", "restart_timeout needs: base [cap] (seconds)");
	strcpy(v, w[1]);
	char *cap = nw == 3 ? w[2] : NULL, *comma = strchr(v, ',');
	if (comma && !cap)
		*comma = 0, cap = comma + 1;
	long base, c = 0;
	if (conf_number(file, line, "restart_timeout", v, 1, 86400, &base) < 0 ||
	    (cap && conf_number(file, line, "restart_timeout's cap", cap, base, 86400, &c) < 0))
		return -1;
	b->restart_base = (int)base;
	b->restart_cap = (int)c;
	return 0;
}

static int bridge_new(const char *file, int line, char **w, int nw)
{
	if (nw != 2)
		return err(file, line, "%s", "connection needs a name");
	if (nbridges == MAX_BRIDGES) {
		fprintf(stderr, "%s:%d: at most %d bridges\n", file, line, MAX_BRIDGES);
		return -1;
	}
	for (int i = 0; i < nbridges; i++)
		if (!strcmp(bridges[i]->name, w[1]))
			return err(file, line, "a second connection named '%s'", w[1]);
	bridge *b = calloc(1, sizeof *b);
	if (!b)
		abort();
	b->name = dup_or_die(w[1]);
	b->line = line;
	b->clean = 0;
	b->local_clean = -1;
	b->keepalive = 60;
	b->version = 4;
	b->try_private = 1;
	b->notifications = 1;
	b->restart_base = 5;
	b->restart_cap = 30;
	b->outgoing_retain = 1;
	b->attempt_unsubscribe = 1;
	bridges[nbridges++] = b;
	return 0;
}

int bridge_option(const char *file, int line, char **w, int nw)
{
	const char *o = w[0], *v = nw > 1 ? w[1] : NULL;
	if (!strcmp(o, "connection"))
		return bridge_new(file, line, w, nw);
	for (int i = 0; unsupported[i]; i++)
		if (!strcmp(o, unsupported[i]))
			return err(file, line, "bridge option '%s' is not supported by weft-mqtt", o);
	static const char *const known[] = {
		"address", "addresses", "topic", "remote_username", "remote_password",
		"remote_clientid", "local_clientid", "cleansession", "local_cleansession",
		"keepalive_interval", "bridge_protocol_version", "try_private", "notifications",
		"notifications_local_only", "notification_topic", "restart_timeout", "start_type",
		"bridge_cafile", "bridge_capath", "bridge_certfile", "bridge_keyfile",
		"bridge_insecure", "bridge_tls_version", "bridge_max_packet_size",
		"bridge_outgoing_retain", "bridge_attempt_unsubscribe", NULL,
	};
	int k = 0;
	while (known[k] && strcmp(o, known[k]))
		k++;
	if (!known[k])
		return 1;
	if (!nbridges)
		return err(file, line, "%s needs a connection line before it", o);
	bridge *b = bridges[nbridges - 1];
	long n;
	int r;
	if (!strcmp(o, "address") || !strcmp(o, "addresses")) {
		if (nw < 2)
			return err(file, line, "%s needs host[:port]", o);
		for (int i = 1; i < nw; i++)
			if (parse_address(file, line, b, w[i]) < 0)
				return -1;
		return 0;
	}
	if (!strcmp(o, "topic"))
		return parse_topic(file, line, b, w, nw);
	if (!strcmp(o, "restart_timeout"))
		return parse_restart(file, line, b, w, nw);
	if (!strcmp(o, "remote_username"))
		return parse_str(file, line, o, v, nw, &b->remote_user);
	if (!strcmp(o, "remote_password"))
		return parse_str(file, line, o, v, nw, &b->remote_pass);
	if (!strcmp(o, "remote_clientid") || !strcmp(o, "local_clientid")) {
		if (v && nw == 2 && mq_utf8_check((const uint8_t *)v, strlen(v)) < 0)
			return err(file, line, "%s is not UTF-8", o);
		return parse_str(file, line, o, v, nw, o[0] == 'r' ? &b->remote_id : &b->local_id);
	}
	if (!strcmp(o, "notification_topic")) {
		if (!v || nw != 2 || !valid_name(v))
			return err(file, line, "%s needs a topic (no wildcards)", o);
		return parse_str(file, line, o, v, nw, &b->notif_topic);
	}
	if (!strcmp(o, "cleansession"))
		return conf_bool(file, line, o, v, &b->clean);
	if (!strcmp(o, "local_cleansession"))
		return conf_bool(file, line, o, v, &b->local_clean);
	if (!strcmp(o, "try_private"))
		return conf_bool(file, line, o, v, &b->try_private);
	if (!strcmp(o, "notifications"))
		return conf_bool(file, line, o, v, &b->notifications);
	if (!strcmp(o, "notifications_local_only"))
		return conf_bool(file, line, o, v, &b->notif_local_only);
	if (!strcmp(o, "bridge_insecure"))
		return conf_bool(file, line, o, v, &b->insecure);
	if (!strcmp(o, "bridge_outgoing_retain"))
		return conf_bool(file, line, o, v, &b->outgoing_retain);
	if (!strcmp(o, "bridge_attempt_unsubscribe"))
		return conf_bool(file, line, o, v, &b->attempt_unsubscribe);
	if (!strcmp(o, "keepalive_interval")) {
		/* 0 would mean "no keep-alive"; mosquitto wants at least 5 s */
		if ((r = conf_number(file, line, o, v, 5, 65535, &n)) == 0)
			b->keepalive = (int)n;
		return r;
	}
	if (!strcmp(o, "bridge_max_packet_size")) {
		if ((r = conf_number(file, line, o, v, 0, 268435460, &n)) == 0)
			b->max_packet = n;
		return r;
	}
	if (!strcmp(o, "bridge_protocol_version")) {
		if (v && !strcmp(v, "mqttv311"))
			b->version = 4;
		else if (v && !strcmp(v, "mqttv50"))
			b->version = 5;
		else
			return err(file, line, "%s",
				   "bridge_protocol_version needs mqttv311 or mqttv50 (mqttv31 is not "
				   "supported)");
		return 0;
	}
	if (!strcmp(o, "start_type")) {
		if (!v || strcmp(v, "automatic"))
			return err(file, line, "%s",
				   "start_type: only automatic is supported (not lazy or once)");
		return 0;
	}
	if (!strcmp(o, "bridge_tls_version")) {
		if (v && !strcmp(v, "tlsv1.2"))
			b->tls_version = 12;
		else if (v && !strcmp(v, "tlsv1.3"))
			b->tls_version = 13;
		else
			return err(file, line, "%s", "bridge_tls_version needs tlsv1.2 or tlsv1.3");
		return 0;
	}
	char **path = !strcmp(o, "bridge_cafile") ? &b->cafile : !strcmp(o, "bridge_capath") ? &b->capath
		    : !strcmp(o, "bridge_certfile")   ? &b->certfile
						      : &b->keyfile;
	return parse_str(file, line, o, v, nw, path);
}

int bridge_conf_end(const char *file)
{
	char host[256];
	if (gethostname(host, sizeof host) < 0)
		strcpy(host, "weft-mqtt");
	host[sizeof host - 1] = 0;
	for (int i = 0; i < nbridges; i++) {
		bridge *b = bridges[i];
		if (!b->naddr)
			return err(file, b->line, "connection %s has no address", b->name);
		if (!b->ntopics)
			return err(file, b->line, "connection %s has no topic", b->name);
		if (!!b->certfile != !!b->keyfile)
			return err(file, b->line,
				   "connection %s: bridge_certfile and bridge_keyfile go together",
				   b->name);
		if ((b->certfile || b->insecure || b->tls_version) && !b->cafile && !b->capath)
			return err(file, b->line,
				   "connection %s: TLS options need bridge_cafile or bridge_capath",
				   b->name);
		if (b->remote_pass && !b->remote_user)
			return err(file, b->line,
				   "connection %s: remote_password needs remote_username", b->name);
		if (!b->remote_id) { /* as mosquitto: hostname.name */
			b->remote_id = malloc(strlen(host) + strlen(b->name) + 2);
			if (!b->remote_id)
				abort();
			sprintf(b->remote_id, "%s.%s", host, b->name);
		}
		if (!b->local_id)
			b->local_id = concat("local.", b->remote_id);
		if (!strcmp(b->local_id, b->remote_id))
			return err(file, b->line,
				   "connection %s: local_clientid and remote_clientid are the same",
				   b->name);
		if (!b->notif_topic) {
			char *t = concat("$SYS/broker/connection/", b->remote_id);
			b->notif_topic = concat(t, "/state");
			free(t);
		}
		if (strlen(b->remote_id) > 65535 || strlen(b->local_id) > 65535 ||
		    strlen(b->notif_topic) > 65535)
			return err(file, b->line, "connection %s: a client id is too long", b->name);
		if (b->local_clean < 0)
			b->local_clean = b->clean;
	}
	return 0;
}
