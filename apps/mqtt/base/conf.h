/*
 * conf.h - the broker's configuration values (conf.c): the listeners and every option, their
 * defaults, and the parsing of one option's value. The parser of the file and the command line
 * is the program's (config.c, declared in broker.h); the values live here, in base/, because
 * every layer reads them.
 */
#ifndef WEFT_MQTT_CONF_H
#define WEFT_MQTT_CONF_H



#define MAX_LISTENERS 8

enum { PROTO_MQTT, PROTO_WEBSOCKETS };

typedef struct listener_conf {
	int port;
	char host[64];            /* "" : every address */
	int protocol;             /* PROTO_MQTT, or PROTO_WEBSOCKETS (MQTT in WebSocket frames) */
	/* TLS (tls.c): on when certfile is set */
	char certfile[256], keyfile[256], cafile[256], ciphers[256];
	int require_certificate, use_identity_as_username;
} listener_conf;

typedef struct broker_conf {
	listener_conf listeners[MAX_LISTENERS];
	int nlisteners;
	long max_connections;         /* -1: no limit */
	int max_inflight_messages;    /* outbound QoS 1/2 window per client (and receive maximum) */
	int max_queued_messages;      /* QoS 1/2 messages queued beyond the window per client */
	long max_queued_bytes;        /* and their payload bytes; 0: no limit */
	double conn_rate;             /* max_connection_rate: new connections a second per
				       * address (IPv6: /64); 0: no limit */
	int conn_burst;               /* ... of which this many at once */
	double pub_rate;              /* max_publish_rate: PUBLISHes a second per connection;
				       * 0: no limit */
	int pub_burst;                /* ... of which this many at once */
	double pw_rate;               /* password_pace: password checks a second per (address,
				       * username); 0: no pace (auth.h) */
	int pw_burst;                 /* ... of which this many at once */
	long message_size_limit;      /* payload bytes; 0: the protocol's limit */
	int max_keepalive;            /* seconds; 0: none */
	int allow_anonymous;          /* -1: only from loopback addresses (the default) */
	int sys_interval;             /* seconds between $SYS updates; 0: off */
	int verbose;
	long qos0_queue_bytes;        /* per client: QoS 0 beyond this many unsent bytes is dropped */
	long backlog_bytes;           /* retained_backlog_bytes: what one client's pending retained
				       * backlogs may cost (retained.c); 0: no limit */
	long backlog_bytes_total;     /* retained_backlog_bytes_total: and all clients' together */
	char password_file[256], acl_file[256], persistence_location[256];
	int persistence;
	int allow_plain_passwords;    /* accept clear-text user:password lines in password_file */
	int metrics_port;             /* metrics_listener: Prometheus /metrics over HTTP; 0: off */
	char metrics_host[64];        /* its bind address; "": 127.0.0.1 */
	int detach_delay_ms;          /* WEFT_MQTT_DETACH_DELAY_MS, for a test only: a session
				       * its connection let go of waits this long before it ends */
} broker_conf;

extern broker_conf conf;

void conf_defaults(broker_conf *c);
/* One option's value, for config.c and the bridges' options (bridge.c): 0 with *out set, or
 * -1 with "file:line: OPT needs ..." on stderr. */
int conf_number(const char *file, int line, const char *opt, const char *v, long lo, long hi,
		long *out);
int conf_bool(const char *file, int line, const char *opt, const char *v, int *out);

#endif
