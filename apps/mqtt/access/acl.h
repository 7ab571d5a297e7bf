/*
 * acl.h - which topics a client may read and write: acl_file in mosquitto's syntax, decided
 * as mosquitto 2.0 decides it.
 *
 *     # rules before the first `user` line apply to anonymous clients only
 *     topic read public/#
 *     user alice
 *     topic readwrite alice/#          (read, write, readwrite, deny; no word: readwrite)
 *     topic deny alice/secret
 *     pattern write sensor/%u/data     (patterns apply to every client wherever they stand;
 *     pattern read clients/%c/#         %u is the username, %c the client id)
 *
 * A client's question "may I read/write topic T" is answered from two lists, in this order:
 * its own list (the `user` section for its username; the leading anonymous section when it has
 * no username), then the patterns. In each list a matching deny rule refuses at once, a
 * matching rule that grants the access allows at once, and rules that match without granting
 * it are passed over. Nothing granted means refused. Patterns refuse everything to a client
 * whose username or client id contains '+' or '#'; patterns with %u do not apply to clients
 * without a username. A rule matches as an MQTT subscription would ('#' and '+' wildcards; a
 * topic starting with '$' only matches a rule starting with '$'). With no acl_file everything
 * is allowed.
 *
 * Each connection binds to the current rules once (acl_bind: its list, its patterns with %u
 * and %c already substituted), so a check walks short arrays and allocates nothing. A reload
 * (SIGHUP) swaps in new rules; whoever uses a binding notices through acl_stale and replaces it
 * with acl_rebind (the same client, the rules now in force).
 *
 * The broker's calls (see docs/weft-mqtt-security.md; access.c):
 *   at start and on SIGHUP      acl_reload(conf.acl_file, err, sizeof err)
 *   after CONNACK 0             c->acl = acl_bind(username, client_id)
 *   before each check below     if (acl_stale(c->acl)) c->acl = acl_rebind(c->acl)
 *   PUBLISH in                  acl_check(c->acl, topic, ACL_WRITE): drop if refused
 *                               (QoS 1/2: PUBACK/PUBREC 0x87 for 5.0)
 *   SUBSCRIBE                   acl_check_subscribe(c->acl, filter): refused -> SUBACK 0x87
 *                               (5.0) / 0x80 (3.1.1)
 *   each delivery (and retained messages sent on subscribe)
 *                               acl_check(receiver's acl, topic, ACL_READ): skip if refused
 *   end of connection           acl_unbind(c->acl)
 */
#ifndef WEFT_MQTT_ACL_H
#define WEFT_MQTT_ACL_H

#include <stdbool.h>
#include <stddef.h>

enum { ACL_READ = 1, ACL_WRITE = 2 };

typedef struct acl_table acl_table;
typedef struct acl_client acl_client;

/* Parse an acl_file. NULL on any error with "file:line: error: ..." in err. */
acl_table *acl_table_load(const char *path, char *err, size_t errcap);
void acl_table_free(acl_table *t);
long acl_table_rules(const acl_table *t);

/* Make the file the current rules: 0, or -1 with err filled and the old rules kept. */
int acl_reload(const char *path, char *err, size_t errcap);
/* No acl_file: everything allowed. */
void acl_clear(void);

/* A client's view of the current rules; user may be NULL (anonymous). Never NULL. */
acl_client *acl_bind(const char *user, size_t user_len, const char *client_id, size_t id_len);
/* The same against a given table (tests; t NULL allows everything). */
acl_client *acl_bind_table(acl_table *t, const char *user, size_t user_len,
			   const char *client_id, size_t id_len);
void acl_unbind(acl_client *c);
/* True when the current rules changed since c was bound. */
bool acl_stale(const acl_client *c);
/* The client c binds (its username and client id) bound to the current rules. Never NULL. */
acl_client *acl_rebind(const acl_client *c);

/* May c read (receive) or write (publish) this topic name? */
bool acl_check(const acl_client *c, const char *topic, size_t len, int access);
/*
 * May c subscribe to this filter? Refused when the rules leave nothing under it readable: a
 * deny rule covers the whole filter before any rule granting read overlaps it, or no such
 * rule overlaps it at all. Allowed otherwise; each message is still checked with acl_check
 * (ACL_READ) before delivery, so a filter reaching into denied topics gets only the readable
 * ones. (mosquitto 2.0 grants every subscription and relies on the delivery check alone.)
 */
bool acl_check_subscribe(const acl_client *c, const char *filter, size_t len);

/* One question against the current rules, binding and unbinding around it: for a decision
 * outside a connection (a will published after its client left, an admin tool). */
bool acl_allowed(const char *user, size_t user_len, const char *client_id, size_t id_len,
		 const char *topic, size_t len, int access);


#endif
