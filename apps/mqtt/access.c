/*
 * access.c - password_file and acl_file as the broker uses them. auth.c (password hashes, the
 * per-address limit on failures) and acl.c (mosquitto's rules) do the deciding; this file
 * loads them at start and on SIGHUP and keeps each session's view of the ACL rules.
 *
 * Who may receive a message is decided on the publish path, for every receiver, by whichever
 * task publishes. So the binding (acl.c's acl_client: the client's own rules and its patterns
 * with %u and %c filled in) hangs off the session, where the router finds it, as an atomic
 * pointer: a reader loads it and checks without any lock. A connection replaces it when it
 * connects and when a reload made it stale; the old binding goes to epoch.c, which frees it
 * once every read section that could have loaded it has ended (every route runs in one). With
 * no acl_file the pointer stays NULL and the check is one load and a branch.
 *
 * An offline session keeps the binding it had until its client comes back, which binds again.
 */
#include <stdio.h>

#include "acl.h"
#include "auth.h"
#include "broker.h"

bool access_acl_on;

int access_load(bool start)
{
	char err[512];
	int rc = 0;
	if (conf.password_file[0]) {
		auth_opts o = { .allow_plain = conf.allow_plain_passwords == 1 };
		if (auth_reload(conf.password_file, &o, err, sizeof err) < 0) {
			fprintf(stderr, "weft-mqtt: %s%s\n", err,
				start ? "" : " (the previous password file stays in force)");
			rc = -1;
		} else if (conf.verbose) {
			fprintf(stderr, "weft-mqtt: %s: %ld users\n", conf.password_file, auth_count());
		}
	}
	if (conf.acl_file[0]) {
		if (acl_reload(conf.acl_file, err, sizeof err) < 0) {
			fprintf(stderr, "weft-mqtt: %s%s\n", err,
				start ? "" : " (the previous ACL file stays in force)");
			rc = -1;
		} else if (start) { /* written before any connection task reads it, never again */
			access_acl_on = true;
		}
	}
	return rc;
}

static void unbind_cb(void *p)
{
	acl_unbind(p);
}

void access_bind(session *s, const char *user, size_t user_len)
{
	if (!access_acl_on)
		return;
	acl_client *a = acl_bind(user, user_len, s->client_id, s->id_len);
	acl_client *old = atomic_exchange_explicit(&s->acl, a, memory_order_acq_rel);
	if (old)
		ebr_retire(old, unbind_cb);
}

bool access_read_slow(acl_client *a, const msg *m)
{
	return acl_check(a, m->topic, m->topic_len, ACL_READ);
}

void access_unbind(session *s)
{
	acl_unbind(atomic_exchange_explicit(&s->acl, NULL, memory_order_relaxed));
}
