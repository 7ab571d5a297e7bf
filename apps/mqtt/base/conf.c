/*
 * conf.c - the configuration's values: the one broker_conf every layer reads, its defaults,
 * and the parsing of one option's number or boolean, which config.c's files and the bridges'
 * options (bridge.c) share.
 *
 * The parser of files and command lines (config.c) sits on top of the broker, since it hands
 * bridge options to bridge/; the values it fills sit here, at the bottom, so that every layer
 * can read them without depending on the parser. They are written once, before the workers
 * start, and only read after (conf_args, conf_load at start; nothing reloads them).
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <weft.h>

#include "conf.h"

broker_conf conf;

void conf_defaults(broker_conf *c)
{
	memset(c, 0, sizeof *c);
	c->max_connections = -1;
	c->max_inflight_messages = 20;
	c->max_queued_messages = 1000;
	c->message_size_limit = 0;
	c->max_keepalive = 0;
	c->allow_anonymous = -1;
	c->sys_interval = 10;
	c->qos0_queue_bytes = 1 << 20;
	/* retained backlogs (retained.c counts an entry as its slots and its whole message, in
	 * its pool allocation, a power of 2): 64 MiB takes a `#` subscriber over 100,000
	 * retained messages of up to about 400 bytes, or 15,000 of 4,000; four times that for
	 * all clients together leaves room for several such at once and keeps what clients that
	 * read nothing pin a fraction of a small host */
	c->backlog_bytes = 64l << 20;
	c->backlog_bytes_total = 256l << 20;
	c->pw_rate = 0.5; /* password_pace: auth.h's defaults */
	c->pw_burst = 5;
	/* widens the window between a connection letting go of its session and the session's
	 * end, for the test of a takeover that meets it (apps/mqtt/tests/broker.c) */
	const char *d = getenv("WEFT_MQTT_DETACH_DELAY_MS");
	c->detach_delay_ms = d ? atoi(d) : 0;
}

int conf_number(const char *file, int line, const char *opt, const char *v, long lo, long hi,
		long *out)
{
	char *end;
	errno = 0;
	long n = v ? strtol(v, &end, 10) : 0;
	if (!v || errno || *end || n < lo || n > hi) {
		fprintf(stderr, "%s:%d: %s needs a number from %ld to %ld\n", file, line, opt, lo, hi);
		return -1;
	}
	*out = n;
	return 0;
}

int conf_bool(const char *file, int line, const char *opt, const char *v, int *out)
{
	if (v && !strcmp(v, "true"))
		*out = 1;
	else if (v && !strcmp(v, "false"))
		*out = 0;
	else {
		fprintf(stderr, "%s:%d: %s needs true or false\n", file, line, opt);
		return -1;
	}
	return 0;
}
