/*
 * bridge.c - bridges: weft-mqtt joins another broker (mosquitto, EMQX, HiveMQ...) as a client of
 * it, configured with mosquitto's "connection" blocks (docs/weft-mqtt-bridges.md).
 *
 * Each bridge is one task that loops: connect to the next address (TCP through weft, TLS as a
 * client through tls.c), send CONNECT (3.1.1, with the 0x80 "bridge" bit in the protocol level
 * under try_private, or 5.0), read the CONNACK, then hand the socket to conn.c as a conn with
 * c->bridge set, attached to a local session named local_clientid. From then on the bridge is
 * a connection like any other, run by conn_run() in this same task:
 *
 *   out   the local session subscribes the out/both filters (local prefix + pattern) with
 *         no-local and retain-as-published: a local publish reaches it through topic.c like
 *         any subscriber, queued, windowed and redelivered by session.c, and encode_pub asks
 *         bridge_out_topic for the remote topic (local prefix off, remote prefix on);
 *   in    the remote is sent a SUBSCRIBE per in/both filter (remote prefix + pattern); its
 *         PUBLISHes go through conn.c's on_publish as a client's would, the topic mapped back
 *         by bridge_in_topic, with no ACL and no $SYS check (a bridge is trusted).
 *
 * Loops. A message that came in is published locally with the bridge's session as its
 * publisher, so the bridge's own no-local subscriptions never send it back out (a "both"
 * pattern is safe locally). At the remote, a 5.0 bridge subscribes with no-local; a 3.1.1 one
 * relies on try_private, which tells mosquitto (and weft-mqtt, conn.c's peer_bridge) not to
 * echo our messages back.
 *
 * Reconnecting. When the connection ends (the remote went away, refused, stopped answering
 * pings) the task publishes the "0" notification locally, waits restart_timeout and tries the
 * next address. With a cap ("restart_timeout 5 30") the wait is mosquitto's decorrelated
 * jitter: each failed attempt waits a random time between the base and three times the last
 * wait, capped; a CONNACK accepted sets it back to the base. The local session outlives the
 * connection unless local_cleansession: QoS 1/2 messages published while the remote is away
 * are queued there (max_queued_messages) and go out on reconnect, inflight ones resent.
 *
 * Stopping. main.c kicks every connection (conns_shutdown): a bridge's last words are the
 * "0" notification and a DISCONNECT (bridge_goodbye), so the remote does not publish the will
 * for a clean stop. bridges_stop() then cancels the tasks (in a back-off sleep, or connecting)
 * and joins them.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bridge.h"
#include "tls.h"

#define CONNECT_TIMEOUT_NS 10000000000LL /* TCP, TLS and the CONNACK, each */
#define MAX_BRIDGES 64
#define MAX_ADDRS 8

enum { DIR_OUT = 1, DIR_IN = 2, DIR_BOTH = 3 };

typedef struct btopic {
	int dir, qos;
	char *lprefix, *rprefix; /* NULL: none */
	char *local, *remote;    /* the filters on each side: prefix + pattern */
	size_t nlocal, nremote;  /* their lengths, matched against every message */
} btopic;

typedef struct bridge {
	char *name;
	int line;                /* of its connection line, for errors found at the end */
	char *host[MAX_ADDRS];
	int port[MAX_ADDRS];
	int naddr;
	btopic *topics;
	int ntopics;
	char *remote_user, *remote_pass, *remote_id, *local_id, *notif_topic;
	int clean, local_clean;  /* local_clean -1: as clean */
	int keepalive, version, try_private, notifications, notif_local_only;
	int restart_base, restart_cap; /* seconds; cap 0: constant */
	char *cafile, *capath, *certfile, *keyfile;
	int insecure, tls_version, outgoing_retain, attempt_unsubscribe;
	long max_packet;
	/* running */
	tls_ctx *tls[MAX_ADDRS]; /* per address: each checks its own host name */
	weft_task *task;
	int cur;                 /* the address tried next */
	int wait_s;              /* the back-off's current wait */
	uint32_t seed;
	int64_t ping_at;         /* a PINGREQ unanswered since (only the bridge's task) */
	atomic_int retain_ok;    /* the remote takes retained messages (a 5.0 CONNACK may say no) */
	atomic_int connected;
	_Atomic uint64_t msgs_in, msgs_out, connects, failures;
} bridge;

static bridge *bridges[MAX_BRIDGES];
static int nbridges;

/* ---- configuration -------------------------------------------------------------------------- */

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

/* ---- topic filters -------------------------------------------------------------------------- */

/* Swap prefix `from` for prefix `to` on topic t: a malloc'd NUL-terminated topic, or NULL
 * when the result would be too long. */
static char *remap(const char *t, size_t n, const char *from, const char *to, uint16_t *len)
{
	size_t nf = from && n >= strlen(from) && !memcmp(t, from, strlen(from)) ? strlen(from) : 0;
	size_t nt = to ? strlen(to) : 0, total = nt + n - nf;
	if (total > 65535 || total == 0)
		return NULL;
	char *r = malloc(total + 1);
	if (!r)
		abort();
	memcpy(r, to ? to : "", nt);
	memcpy(r + nt, t + nf, n - nf);
	r[total] = 0;
	*len = (uint16_t)total;
	return r;
}

static void bridge_in_topic(conn *c, const uint8_t **topic, uint16_t *tlen, char **mapped)
{
	bridge *b = c->bridge;
	atomic_fetch_add_explicit(&b->msgs_in, 1, memory_order_relaxed);
	for (int i = 0; i < b->ntopics; i++) {
		btopic *t = &b->topics[i];
		if (!(t->dir & DIR_IN) ||
		    !mq_topic_match(t->remote, t->nremote, (const char *)*topic, *tlen))
			continue;
		if (t->lprefix || t->rprefix) {
			uint16_t n;
			char *r = remap((const char *)*topic, *tlen, t->rprefix, t->lprefix, &n);
			if (r) {
				*mapped = r;
				*topic = (const uint8_t *)r;
				*tlen = n;
			}
		}
		return;
	}
}

static bool bridge_in_topic_ok(conn *c, const uint8_t **topic, uint16_t *tlen, char **mapped)
{
	bridge_in_topic(c, topic, tlen, mapped);
	return true;
}

static int bridge_out_topic(conn *c, const msg *m, const char **topic, uint16_t *tlen, char **mapped,
		     int *retain)
{
	bridge *b = c->bridge;
	if (!b->outgoing_retain || !atomic_load_explicit(&b->retain_ok, memory_order_relaxed))
		*retain = 0;
	atomic_fetch_add_explicit(&b->msgs_out, 1, memory_order_relaxed);
	for (int i = 0; i < b->ntopics; i++) {
		btopic *t = &b->topics[i];
		if (!(t->dir & DIR_OUT) ||
		    !mq_topic_match(t->local, t->nlocal, m->topic, m->topic_len))
			continue;
		if (t->lprefix || t->rprefix) {
			uint16_t n;
			char *r = remap(m->topic, m->topic_len, t->lprefix, t->rprefix, &n);
			if (!r)
				return -1;
			*mapped = r;
			*topic = r;
			*tlen = n;
		}
		return 0;
	}
	return 0;
}

/* ---- packets a server sends ----------------------------------------------------------------- */

static int bridge_packet(conn *c, const mq_packet *pk)
{
	switch (pk->type) {
	case MQ_PUBLISH:
	case MQ_PUBACK:
	case MQ_PUBREC:
	case MQ_PUBREL:
	case MQ_PUBCOMP:
	case MQ_DISCONNECT:
		return CONN_PASS;
	case MQ_SUBACK: {
		/* a refused filter (0x80 and up) is logged: the bridge goes on without it */
		for (uint32_t i = 0; i < pk->sub.list.len; i++)
			if (pk->sub.list.p[i] >= 0x80)
				fprintf(stderr, "weft-mqtt: bridge %s: the remote refused a subscription "
						"(reason 0x%02x)\n",
					c->bridge->name, pk->sub.list.p[i]);
		return 0;
	}
	case MQ_UNSUBACK:
	case MQ_PINGRESP:
		return 0;
	default:
		return -MQ_RC_PROTOCOL_ERROR;
	}
}

/* ---- keep-alive ----------------------------------------------------------------------------- */

static int64_t bridge_ping_deadline(conn *c, int64_t last)
{
	bridge *b = c->bridge;
	int64_t ka = (int64_t)c->keep_alive * 1000000000;
	return (b->ping_at > last ? b->ping_at : last) + ka;
}

static int bridge_ping(conn *c, int64_t last)
{
	bridge *b = c->bridge;
	if (b->ping_at > last)
		return -1; /* a whole interval without an answer */
	uint8_t p[2];
	session_send(c->s, p, mq_enc_simple(p, MQ_PINGREQ), NULL);
	b->ping_at = weft_now();
	return 0;
}

/* ---- encoding what only a client sends ------------------------------------------------------ */

static uint8_t *enc_connect(bridge *b, size_t *len)
{
	uint8_t pb_buf[32];
	mq_pb pb = { pb_buf, 0, sizeof pb_buf, 0 };
	if (b->version == 5) {
		if (!b->clean) /* the remote keeps our session (subscriptions, queued messages) */
			mq_pb_u32(&pb, MQ_P_SESSION_EXPIRY, UINT32_MAX);
		if (conf.max_inflight_messages < 65535)
			mq_pb_u16(&pb, MQ_P_RECEIVE_MAX, (uint16_t)conf.max_inflight_messages);
		if (conf.message_size_limit)
			mq_pb_u32(&pb, MQ_P_MAX_PACKET_SIZE,
				  (uint32_t)conf.message_size_limit + 65536 + 1024);
	}
	/* the remote's notification of our end: "0", retained, QoS 1 */
	bool will = b->notifications && !b->notif_local_only;
	mq_connect_enc e = {
		.version = b->version,
		.level = b->version == 4 && b->try_private ? 0x84 : 0,
		.client_id = b->remote_id,
		.clean = b->clean,
		.keep_alive = (uint16_t)b->keepalive,
		.props = &pb,
		.will_topic = will ? b->notif_topic : NULL,
		.will_payload = "0",
		.will_len = 1,
		.will_qos = 1,
		.will_retain = 1,
		.username = b->remote_user,
		.password = b->remote_pass,
	};
	uint8_t *p = malloc(mq_enc_connect(NULL, &e));
	if (!p)
		abort();
	*len = mq_enc_connect(p, &e);
	return p;
}

/* A SUBSCRIBE of one filter, or with opts -1 an UNSUBSCRIBE. */
static uint8_t *enc_subscribe(bridge *b, uint16_t pid, const char *filter, int opts, size_t *len)
{
	uint8_t *p = malloc(strlen(filter) + 16);
	if (!p)
		abort();
	*len = opts >= 0 ? mq_enc_subscribe(p, b->version, pid, filter, (uint8_t)opts, NULL)
			 : mq_enc_unsubscribe(p, b->version, pid, filter);
	return p;
}

/* A retained notification (payload "1" or "0"), as a QoS 0 PUBLISH for the remote. */
static size_t enc_notification(bridge *b, uint8_t *out, size_t cap, char state)
{
	mq_pub_enc e = { b->version, 0, 0, 1, 0, b->notif_topic, (uint16_t)strlen(b->notif_topic),
			 NULL, 0, &state, 1, NULL, 0 };
	size_t n = mq_enc_publish_len(&e);
	if (n > cap)
		return 0;
	return mq_enc_publish(out, &e);
}

static size_t bridge_goodbye(conn *c, uint8_t *out, size_t cap)
{
	bridge *b = c->bridge;
	size_t n = 0;
	if (b->notifications && !b->notif_local_only)
		n = enc_notification(b, out, cap, '0');
	if (n + 8 <= cap)
		n += mq_enc_disconnect(out + n, b->version, 0, NULL);
	return n;
}

/* A bridge's connection as conn.c's read loop sees it (conn_role): the remote is a server, so
 * no max_publish_rate and no ACL on what it sends (its topics are mapped instead), its
 * SUBACK/UNSUBACK/PINGRESP handled here, keep-alive by pinging it, and a goodbye at shutdown. */
static const conn_role bridge_role = {
	.publish_rate = false,
	.on_packet = bridge_packet,
	.in_topic = bridge_in_topic_ok,
	.keepalive_deadline = bridge_ping_deadline,
	.keepalive_expired = bridge_ping,
	.goodbye = bridge_goodbye,
};

/* ... and as route/ sees it (peer_ops): a connection like a client's whose outgoing topics are
 * mapped to the remote's terms. */
static const peer_ops bridge_peer = {
	.write = conn_write,
	.frame = conn_frame,
	.kick = conn_kick,
	.out_topic = bridge_out_topic,
};

/* ---- the bridge's task ---------------------------------------------------------------------- */

static void notify_local(bridge *b, char state)
{
	if (!b->notifications)
		return;
	msg *m = msg_new(b->notif_topic, (uint16_t)strlen(b->notif_topic), NULL, &state, 1, 1, 1,
			 0);
	topic_retain(m);
	persist_retained(m, NULL);
	topic_publish(m, NULL, NULL);
	msg_unref(m);
}

static ssize_t sock_read(int fd, tls_conn *t, void *p, size_t n, int64_t dl)
{
	return t ? tls_read(t, p, n, dl) : weft_read(fd, p, n, dl);
}

static ssize_t sock_write(int fd, tls_conn *t, const void *p, size_t n, int64_t dl)
{
	return t ? tls_write(t, p, n, dl) : weft_write(fd, p, n, dl);
}

static int read_full(int fd, tls_conn *t, uint8_t *p, size_t n, int64_t dl)
{
	for (size_t got = 0; got < n;) {
		ssize_t r = sock_read(fd, t, p + got, n - got, dl);
		if (r <= 0)
			return r < 0 ? (int)r : -ECONNRESET;
		got += (size_t)r;
	}
	return 0;
}

/* Read exactly one packet (the CONNACK), byte by byte through its header so that nothing
 * after it is taken from the socket: conn.c reads the rest. Returns its length or -errno. */
static long read_packet(int fd, tls_conn *t, uint8_t *buf, size_t cap, int64_t dl)
{
	size_t n = 0;
	int hdr;
	long total;
	do {
		if (n == 5 || read_full(fd, t, buf + n, 1, dl) < 0)
			return -ECONNRESET;
		n++;
	} while (n < 2 || (total = mq_frame(buf, n, &hdr)) == 0);
	if (total < 0 || (size_t)total > cap)
		return -EPROTO;
	if (read_full(fd, t, buf + n, (size_t)total - n, dl) < 0)
		return -ECONNRESET;
	return total;
}

static const char *connack_reason(int v, int rc)
{
	if (v == 5)
		return rc == MQ_RC_BAD_USER_OR_PASSWORD ? "bad username or password"
		     : rc == MQ_RC_NOT_AUTHORIZED       ? "not authorized"
		     : rc == MQ_RC_CLIENT_ID_INVALID    ? "client id refused"
							: "refused";
	static const char *const v3[] = { "accepted", "unacceptable protocol version",
					  "client id refused", "server unavailable",
					  "bad username or password", "not authorized" };
	return rc >= 0 && rc <= 5 ? v3[rc] : "refused";
}

/* The packet ids of our SUBSCRIBEs: from the top down, skipping those inflight, so they do
 * not meet the session's PUBLISH ids (which count up from 1). */
static uint16_t free_pid(session *s, uint16_t from)
{
	for (uint16_t p = from;; p--) {
		bool used = false;
		WEFT_WITH_LOCK(&s->lock)
			for (dlv *d = s->inflight; d && !used; d = d->next)
				used = d->pid == p;
		if (!used)
			return p;
	}
}

/* Does an in/both topic subscribe filter f at the remote? (Then it is not unsubscribed.) */
static bool comes_in(const bridge *b, const char *f)
{
	for (int i = 0; i < b->ntopics; i++)
		if ((b->topics[i].dir & DIR_IN) && !strcmp(b->topics[i].remote, f))
			return true;
	return false;
}

/* Everything after the CONNACK: the local session, subscriptions both sides, resending what
 * was inflight, notifications; then run the connection until it ends. */
static void run(bridge *b, int fd, tls_conn *t, const mq_packet *ack)
{
	/* what a 5.0 remote says of itself: its keep-alive wins, its QoS and retain limits hold */
	const mq_props *pr = &ack->props;
	bool v5 = b->version == 5;
	int ka = v5 && MQ_HAS(pr, MQ_P_SERVER_KEEP_ALIVE) ? pr->server_keep_alive : b->keepalive;
	int max_qos = v5 && MQ_HAS(pr, MQ_P_MAX_QOS) ? pr->max_qos : 2;
	bool no_retain = v5 && MQ_HAS(pr, MQ_P_RETAIN_AVAILABLE) && !pr->retain_available;
	atomic_store(&b->retain_ok, !no_retain);
	conn *c = conn_open_bridge(fd, t, b, b->version, (uint16_t)ka, &bridge_peer,
				   &bridge_role);
	if (!c) {
		tls_free(t);
		weft_close(fd);
		return;
	}
	bool present;
	int why;
	session *s = session_attach(c, b->local_id, (uint16_t)strlen(b->local_id), b->local_clean,
				    &present, &why);
	if (!s) { /* a local client holds local_clientid and would not let go, or owns it */
		fprintf(stderr, "weft-mqtt: bridge %s: the local session %s is %s\n", b->name,
			b->local_id,
			why == MQ_RC_NOT_AUTHORIZED ? "a user's (bridges are anonymous)" : "busy");
		conn_run(c); /* ends it */
		return;
	}
	c->s = s;
	uint16_t window = (uint16_t)conf.max_inflight_messages;
	if (b->version == 5 && ack->props.receive_max && ack->props.receive_max < window)
		window = ack->props.receive_max;
	uint32_t maxp = (uint32_t)b->max_packet;
	if (b->version == 5 && ack->props.max_packet_size &&
	    (!maxp || ack->props.max_packet_size < maxp))
		maxp = ack->props.max_packet_size;
	WEFT_WITH_LOCK(&s->lock) {
		s->version = (uint8_t)b->version;
		s->expiry_interval = b->local_clean ? 0 : UINT32_MAX;
		s->window = window ? window : 1;
		s->max_packet = maxp;
		if (!present)
			s->nrel = 0;
		persist_session(s, true, c);
	}
	b->ping_at = 0;
	/* in: subscribe at the remote (no-local and retain-as-published for 5.0); out only:
	 * unsubscribe there, as mosquitto, so that a session the remote kept from a configuration
	 * where the topic came in does not go on sending it */
	uint16_t pid = 65535;
	for (int i = 0; i < b->ntopics; i++) {
		btopic *tp = &b->topics[i];
		int opts = tp->qos | (b->version == 5 ? SUB_NL | SUB_RAP : 0);
		if (!(tp->dir & DIR_IN) && (!b->attempt_unsubscribe || comes_in(b, tp->remote)))
			continue;
		pid = free_pid(s, pid);
		size_t n;
		uint8_t *p = enc_subscribe(b, pid--, tp->remote, tp->dir & DIR_IN ? opts : -1, &n);
		session_send(s, p, n, NULL);
		free(p);
	}
	/* out: the local session subscribes, never to its own messages */
	for (int i = 0; i < b->ntopics; i++) {
		btopic *tp = &b->topics[i];
		if (!(tp->dir & DIR_OUT))
			continue;
		uint16_t n = (uint16_t)strlen(tp->local);
		uint8_t opts = (uint8_t)((tp->qos < max_qos ? tp->qos : max_qos) | SUB_NL | SUB_RAP);
		topic_subscribe(s, tp->local, n, opts, 0);
		subrec_add(s, (const uint8_t *)tp->local, n);
		persist_sub(s, tp->local, n, opts, 0, c);
	}
	if (persist_on && c->ticket)
		persist_wait(c);
	session_resume(s, NULL);
	for (int i = 0; i < b->ntopics; i++) /* retained messages go out, as mosquitto's do */
		if (b->topics[i].dir & DIR_OUT)
			topic_send_retained(s, b->topics[i].local,
					    (uint16_t)strlen(b->topics[i].local),
					    b->topics[i].qos < max_qos ? b->topics[i].qos : max_qos, 0,
					    0, NULL); /* charged, not refused: the operator's */
	if (b->notifications && !b->notif_local_only) {
		size_t cap = strlen(b->notif_topic) + 32;
		uint8_t *p = malloc(cap);
		if (!p)
			abort();
		size_t n = enc_notification(b, p, cap, '1');
		if (n)
			session_send(s, p, n, NULL);
		free(p);
	}
	notify_local(b, '1');
	atomic_store(&b->connected, 1);
	atomic_fetch_add(&b->connects, 1);
	if (atomic_load(&broker_stopping)) /* conns_shutdown may have walked past us */
		conn_kick(c, MQ_RC_SERVER_SHUTTING_DOWN);
	conn_run(c);
	atomic_store(&b->connected, 0);
	notify_local(b, '0');
}

/* One attempt: returns 1 when the remote accepted us (the connection has ended since). */
static int attempt(bridge *b)
{
	const char *host = b->host[b->cur];
	int port = b->port[b->cur];
	int64_t dl = weft_now() + CONNECT_TIMEOUT_NS;
	int fd = weft_tcp_connect(host, port, dl);
	if (fd < 0) {
		if (conf.verbose)
			fprintf(stderr, "weft-mqtt: bridge %s: %s:%d: %s\n", b->name, host, port,
				strerror(-fd));
		return 0;
	}
	tls_conn *t = NULL;
	if (b->tls[b->cur]) {
		int h = -ENOMEM;
		if (!(t = tls_conn_new(b->tls[b->cur], fd)) || (h = tls_handshake(t, dl)) < 0) {
			fprintf(stderr, "weft-mqtt: bridge %s: %s:%d: TLS: %s\n", b->name, host, port,
				h == -EPROTO ? tls_error(t) : strerror(-h));
			tls_free(t);
			weft_close(fd);
			return 0;
		}
	}
	size_t n;
	uint8_t *p = enc_connect(b, &n);
	ssize_t w = sock_write(fd, t, p, n, dl);
	free(p);
	uint8_t buf[4096]; /* a CONNACK: a few bytes, or a 5.0 one's properties */
	long len = w == (ssize_t)n ? read_packet(fd, t, buf, sizeof buf, dl) : -ECONNRESET;
	mq_packet ack;
	int r = len > 0 ? mq_decode(buf, (size_t)len, b->version, &ack) : (int)len;
	if (r == 0 && ack.type != MQ_CONNACK)
		r = -EPROTO;
	if (r == 0 && ack.reason) {
		fprintf(stderr, "weft-mqtt: bridge %s: %s:%d refused the connection: %s\n", b->name,
			host, port, connack_reason(b->version, ack.reason));
		r = -EACCES;
	} else if (r < 0 && conf.verbose) {
		fprintf(stderr, "weft-mqtt: bridge %s: %s:%d: no CONNACK\n", b->name, host, port);
	}
	if (r < 0) {
		if (t)
			tls_shutdown(t, weft_now() + 100000000);
		tls_free(t);
		weft_close(fd);
		return 0;
	}
	if (conf.verbose)
		fprintf(stderr, "weft-mqtt: bridge %s: connected to %s:%d\n", b->name, host, port);
	run(b, fd, t, &ack);
	return 1;
}

/* The next wait, in seconds: constant, or mosquitto's decorrelated jitter up to the cap. */
static int backoff(bridge *b, bool was_up)
{
	if (!b->restart_cap || was_up)
		return b->wait_s = b->restart_base;
	b->seed = b->seed * 1103515245u + 12345u;
	int hi = b->wait_s * 3;
	int w = b->restart_base;
	if (hi > b->restart_base)
		w += (int)((b->seed >> 8) % (uint32_t)(hi - b->restart_base));
	return b->wait_s = w < b->restart_cap ? w : b->restart_cap;
}

static void bridge_task(void *arg)
{
	bridge *b = arg;
	b->wait_s = b->restart_base;
	while (!atomic_load(&broker_stopping) && !weft_cancelled()) {
		bool up = attempt(b);
		if (!up)
			atomic_fetch_add(&b->failures, 1);
		if (atomic_load(&broker_stopping))
			break;
		b->cur = (b->cur + 1) % b->naddr; /* try the others in turn */
		if (up && b->naddr > 1)
			b->cur = 0;
		int s = backoff(b, up);
		if (weft_sleep_until(weft_now() + (int64_t)s * 1000000000) < 0)
			break;
	}
}

int bridges_start(void)
{
	for (int i = 0; i < nbridges; i++) {
		bridge *b = bridges[i];
		for (int k = 0; (b->cafile || b->capath) && k < b->naddr; k++) {
			tls_opts o = {
				.certfile = b->certfile, .keyfile = b->keyfile, .cafile = b->cafile,
				.capath = b->capath, .tls_version = b->tls_version,
				.servername = b->insecure ? NULL : b->host[k],
			};
			char e[512];
			if (!(b->tls[k] = tls_ctx_client(&o, e, sizeof e))) {
				fprintf(stderr, "weft-mqtt: bridge %s: %s\n", b->name, e);
				return -1;
			}
		}
		b->seed = (uint32_t)weft_now() ^ (uint32_t)i * 2654435761u;
		weft_spawn_opts o = { .name = "mqtt-bridge" };
		if (!(b->task = weft_spawn_opt(bridge_task, b, &o))) {
			fprintf(stderr, "weft-mqtt: bridge %s: cannot start its task\n", b->name);
			return -1;
		}
	}
	return 0;
}

void bridges_stop(void)
{
	for (int i = 0; i < nbridges; i++) {
		bridge *b = bridges[i];
		if (b->task) {
			weft_cancel(b->task);
			weft_join(b->task);
		}
		for (int k = 0; k < b->naddr; k++)
			tls_ctx_free(b->tls[k]);
		for (int k = 0; k < b->ntopics; k++) {
			btopic *t = &b->topics[k];
			free(t->lprefix), free(t->rprefix), free(t->local), free(t->remote);
		}
		for (int k = 0; k < b->naddr; k++)
			free(b->host[k]);
		free(b->topics), free(b->name), free(b->remote_user), free(b->remote_pass);
		free(b->remote_id), free(b->local_id), free(b->notif_topic);
		free(b->cafile), free(b->capath), free(b->certfile), free(b->keyfile);
		free(b);
		bridges[i] = NULL;
	}
	nbridges = 0;
}

/* ---- metrics -------------------------------------------------------------------------------- */

char *bridge_metrics_text(void)
{
	if (!nbridges)
		return NULL;
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	if (!f)
		return NULL;
	static const struct {
		const char *name, *type, *help;
	} m[] = {
		{ "weft_mqtt_bridge_up", "gauge", "1 while the bridge is connected to its remote" },
		{ "weft_mqtt_bridge_messages_received_total", "counter",
		  "PUBLISH packets the bridge received from its remote" },
		{ "weft_mqtt_bridge_messages_sent_total", "counter",
		  "PUBLISH packets the bridge sent to its remote (resends included)" },
		{ "weft_mqtt_bridge_connects_total", "counter", "connections the remote accepted" },
		{ "weft_mqtt_bridge_connect_failures_total", "counter",
		  "attempts that did not reach an accepted CONNACK" },
	};
	for (int k = 0; k < 5; k++) {
		fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", m[k].name, m[k].help, m[k].name, m[k].type);
		for (int i = 0; i < nbridges; i++) {
			bridge *b = bridges[i];
			uint64_t v = k == 0 ? (uint64_t)atomic_load(&b->connected)
				   : k == 1 ? atomic_load(&b->msgs_in)
				   : k == 2 ? atomic_load(&b->msgs_out)
				   : k == 3 ? atomic_load(&b->connects)
					    : atomic_load(&b->failures);
			fprintf(f, "%s{bridge=\"", m[k].name);
			for (const char *c = b->name; *c; c++) /* the exposition format's escapes */
				fprintf(f, *c == '"' || *c == '\\' ? "\\%c" : "%c", *c);
			fprintf(f, "\"} %llu\n", (unsigned long long)v);
		}
	}
	fclose(f);
	return text;
}
