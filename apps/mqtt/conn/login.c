/*
 * login.c - a CONNECT's credentials: who the client is (password file, certificate, or
 * anonymous), when its password is checked (the pace, pace.c), and what waiting for that may
 * hold.
 *
 * A CONNECT waiting for its password's turn keeps its read buffer (loop.c) for up to
 * AUTH_MAX_WAIT, so those waits together may hold at most WAITING_BYTES; past that a CONNECT
 * is told "try later" unchecked, as one past the pace's horizon is. Rejected: copying the
 * credentials out and freeing the buffer during the wait, which bounds each waiter but not
 * how many addresses send them.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <weft.h>

#include "access.h"
#include "auth.h"
#include "codec.h"
#include "conf.h"
#include "conn.h"
#include "conn_public.h"
#include "epoch.h"
#include "records.h"
#include "stats.h"

#define WAITING_BYTES (64l << 20)
static atomic_long waiting_bytes;

/* Book r's password check a turn (pace.c) and wait for it, unless it is too far ahead or the
 * waits already hold WAITING_BYTES: 0 once its turn came, -1 when refused or kicked. held is
 * the memory the wait keeps. */
static int await_turn(conn *c, const auth_req *r, int version, long held)
{
	int64_t at;
	int why = auth_turn(r, &at) < 0 ? ST_REFUSED_PACE : 0;
	if (!why && r->now < at && atomic_fetch_add(&waiting_bytes, held) + held > WAITING_BYTES) {
		atomic_fetch_sub(&waiting_bytes, held);
		auth_turn_cancel(r);
		why = ST_REFUSED_WAITING;
	}
	if (why) {
		if (conf.verbose && why == ST_REFUSED_PACE)
			fprintf(stderr, "weft-mqtt: CONNECT refused unchecked (password checks of "
					"its address, or of its name there, booked %d s ahead)\n",
				(int)(AUTH_MAX_WAIT / 1000000000));
		else if (conf.verbose)
			fprintf(stderr, "weft-mqtt: CONNECT refused unchecked (the CONNECTs waiting "
					"for their turn hold %ld MiB)\n", WAITING_BYTES >> 20);
		stats_add(why, 1);
		conn_refuse(c, version, MQ_RC_CONNECTION_RATE_EXCEEDED, MQ_V3_UNAVAILABLE);
		return -1;
	}
	if (r->now >= at)
		return 0;
	/* outside the batch's read section (a CONNECT comes first: nothing read under it is
	 * held yet), or epoch.c could free nothing retired meanwhile, for as long as anyone
	 * waits */
	epoch_leave(&c->reader);
	int end = conn_nap_until(c, at);
	epoch_enter(&c->reader);
	atomic_fetch_sub(&waiting_bytes, held);
	return end ? -1 : 0;
}

int conn_login(conn *c, const mq_packet *pk, long held)
{
	int v = pk->connect.version;
	bool anon_ok = conf.allow_anonymous == 1 || (conf.allow_anonymous < 0 && c->loopback);
	mq_bytes u0 = pk->connect.username;
	const mq_bytes *u = &u0, *pw = &pk->connect.password;
	bool has_user = pk->connect.has_username;
	if (c->tls_user) {
		/* use_identity_as_username: the verified certificate is the credential, its CN the
		 * username (the CONNECT's is ignored, as mosquitto does) */
		u0.p = (const uint8_t *)c->tls_user;
		u0.len = (uint32_t)strlen(c->tls_user);
		has_user = true;
	} else if (conf.password_file[0]) {
		/* No peer (reset before its CONNECT is handled): nobody to answer and no address
		 * to pace by, so its password is not checked. Checking it unpaced made a reset
		 * after each CONNECT a way round the pace, with the will telling the answer. */
		struct sockaddr_storage ss;
		socklen_t sl = sizeof ss;
		if (getpeername(c->fd, (struct sockaddr *)&ss, &sl) != 0)
			return -1;
		auth_req r = {
			.user = has_user ? (const char *)u->p : NULL,
			.user_len = has_user ? u->len : 0,
			.password = pk->connect.has_password ? pw->p : NULL,
			.password_len = pk->connect.has_password ? pw->len : 0,
			.from = (struct sockaddr *)&ss,
			.anonymous_ok = anon_ok,
			.now = weft_now(),
		};
		if (await_turn(c, &r, v, held) < 0)
			return -1;
		r.now = weft_now();
		stats_add(ST_PASSWORD_CHECKS, 1);
		auth_result a = auth_check(&r);
		if (a != AUTH_OK) {
			if (conf.verbose)
				fprintf(stderr, "weft-mqtt: CONNECT refused (%s)\n",
					a == AUTH_BAD_CREDENTIALS ? "bad username or password"
								  : "anonymous");
			conn_refuse(c, v, auth_connack_code(a, 5),
			       a == AUTH_BAD_CREDENTIALS ? MQ_V3_BAD_USER_OR_PASSWORD
							 : MQ_V3_NOT_AUTHORIZED);
			return -1;
		}
	} else if (!anon_ok) {
		/* without a password file a username proves nothing: every client is anonymous */
		conn_refuse(c, v, MQ_RC_NOT_AUTHORIZED, MQ_V3_NOT_AUTHORIZED);
		return -1;
	}
	/* a username checked against the password file or a certificate is the identity that
	 * owns sessions (session.c); without either, anyone may claim any name, so every client
	 * is the same anonymous owner, and the name serves the ACL only */
	c->user_proven = has_user && (c->tls_user || conf.password_file[0]);
	if (has_user && (access_acl_on || c->user_proven)) {
		c->user = malloc(u->len + 1u);
		if (!c->user)
			abort();
		memcpy(c->user, u->p, u->len);
		c->user[u->len] = 0;
		c->user_len = (uint16_t)u->len;
	}
	return 0;
}
