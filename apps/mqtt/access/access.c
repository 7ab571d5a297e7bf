/*
 * access.c - password_file and acl_file as the broker uses them. auth.c (password hashes),
 * pace.c (the pace of password checks) and acl.c (mosquitto's rules) do the deciding; this file
 * loads them at start and on SIGHUP and keeps each session's view of the ACL rules.
 *
 * Who may receive a message is decided on the publish path, for every receiver, by whichever
 * task publishes. So the binding (acl.c's acl_client: the client's own rules and its patterns
 * with %u and %c filled in) hangs off the session, where the router finds it, as an atomic
 * pointer: a reader loads it and checks without any lock. A connection replaces it when it
 * connects; the old binding goes to epoch.c, which frees it once every read section that could
 * have loaded it has ended (every route runs in one). With no acl_file the pointer stays NULL
 * and the check is one load and a branch.
 *
 * After a reload (SIGHUP), every use of a binding - a delivery routed, queued or drained from a
 * retained backlog, the client's PUBLISH or SUBSCRIBE - compares its generation with the rules'
 * (acl_stale: one load of a word that changes only on reload) and, when it is older, the task
 * that found it binds the same client (username, client id: the binding keeps them) to the new
 * rules and swaps it in with a compare-and-swap; a task that loses the race frees its own and
 * uses the winner's. So whatever is decided once the reload has swapped the rules in is decided
 * by them, for a client that never sends a packet too, and the publish path pays one load and a
 * compare per receiver. Rejected: rebinding at the connection's next packet (a client that only
 * receives would keep the old rules for as long as it stayed silent); rebinding
 * every session when the reload happens (a walk of the session table, which needs each
 * session's username, known to its connection only, and races a CONNECT binding against the
 * old rules, so the check above would still be needed).
 *
 * An offline session keeps the client its binding names: what reaches it meanwhile is checked
 * against that client's rules as they are now, and its client binds afresh when it comes back.
 */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include <weft.h>

#include "access.h"
#include "acl.h"
#include "auth.h"
#include "conf.h"
#include "epoch.h"
#include "msg.h"
#include "records.h"

bool access_acl_on;

int access_load(bool start)
{
	char err[512];
	int rc = 0;
	if (conf.password_file[0]) {
		auth_opts o = { .allow_plain = conf.allow_plain_passwords == 1 };
		if (start)
			auth_set_limits(&(auth_limits){
				.burst = conf.pw_rate > 0 ? conf.pw_burst : 0,
				.interval_ns = conf.pw_rate > 0 ? (int64_t)(1e9 / conf.pw_rate) : 0 });
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
		epoch_retire(old, unbind_cb);
}

/* a, loaded from s, is stale: put the same client's binding to the rules now in force in its
 * place, unless another task did first (then use that one). NULL only if s was unbound. */
static acl_client *rebind(session *s, acl_client *a)
{
	while (a && acl_stale(a)) {
		acl_client *n = acl_rebind(a);
		if (atomic_compare_exchange_strong_explicit(&s->acl, &a, n, memory_order_acq_rel,
							    memory_order_acquire)) {
			epoch_retire(a, unbind_cb);
			return n;
		}
		acl_unbind(n); /* a is now what the winner put there */
	}
	return a;
}

acl_client *access_binding(session *s)
{
	acl_client *a = atomic_load_explicit(&s->acl, memory_order_acquire);
	return a && acl_stale(a) ? rebind(s, a) : a;
}

bool access_will_allowed(session *s, const msg *m)
{
	if (!access_acl_on)
		return true;
	/* a session restored from the store has no binding until its client is back: bind its
	 * owner, whose will it is */
	WEFT_WITH_LOCK(&s->lock)
		if (!atomic_load_explicit(&s->acl, memory_order_acquire))
			access_bind(s, s->owner, s->owner_len);
	epoch_reader r; /* the binding is freed through epoch.c: read it inside a section */
	epoch_register(&r);
	epoch_enter(&r);
	acl_client *a = access_binding(s);
	bool ok = a && acl_check(a, m->topic, m->topic_len, ACL_WRITE);
	epoch_leave(&r);
	epoch_unregister(&r);
	return ok;
}

bool access_read_slow(session *s, acl_client *a, const msg *m)
{
	if (acl_stale(a))
		a = rebind(s, a);
	return a && acl_check(a, m->topic, m->topic_len, ACL_READ); /* unbound meanwhile: no */
}

void access_unbind(session *s)
{
	acl_unbind(atomic_exchange_explicit(&s->acl, NULL, memory_order_relaxed));
}
