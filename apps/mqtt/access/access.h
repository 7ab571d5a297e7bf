/*
 * access.h - password_file and acl_file as the broker asks them (access.c): loading and
 * reloading, a session's binding to the ACL rules, and the read check on the publish path.
 */
#ifndef WEFT_MQTT_ACCESS_H
#define WEFT_MQTT_ACCESS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "msg.h"
#include "records.h"

/* Load (start) or reload (SIGHUP) the configured password and ACL files. At start an error is
 * printed and -1 returned; on reload it is printed and the old rules stay. */
int access_load(bool start);
/* Whether an acl_file is configured (checks are skipped entirely when not). */
extern bool access_acl_on;
/* Bind s to the current ACL rules for this username (NULL: anonymous) and its client id. */
void access_bind(session *s, const char *user, size_t user_len);
/* s's binding to the rules in force (made again here if a reload came since it was made), or
 * NULL when no acl_file is configured. Valid within the caller's read section (epoch.c). */
struct acl_client *access_binding(session *s);
/* May s's client receive m, by the rules in force? Lock-free: one load when no acl_file is
 * configured; with one, a load and a compare more (a reload?) before the check. In a read
 * section. */
bool access_read_slow(session *s, struct acl_client *a, const msg *m);
static inline bool access_read(session *s, const msg *m)
{
	struct acl_client *a = atomic_load_explicit(&s->acl, memory_order_acquire);
	return !a || access_read_slow(s, a, m);
}
/* Whether s's client may write its will's topic under the rules in force now (a reload or a
 * restart since its CONNECT may have changed them); a restored session unbound so far is bound
 * to its owner first. Takes s's lock: call it without. */
bool access_will_allowed(session *s, const msg *m);
/* Free s's binding (the session is being freed: nobody reads it any more). */
void access_unbind(session *s);

#endif
