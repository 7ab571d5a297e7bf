/*
 * auth.h - who may connect to weft-mqtt: password files in mosquitto's format, the
 * allow_anonymous rule (auth.c), and a pace for password checks per source address and
 * username (pace.c).
 *
 * A password file holds one `user:hash` line per user, as mosquitto_passwd writes it:
 *
 *     alice:$7$101$<salt, base64>$<PBKDF2-HMAC-SHA512 of the password, base64>
 *     bob:$6$<salt, base64>$<SHA-512 of password+salt, base64>     (mosquitto before 2.0)
 *     carol:secret                              (plain text: only with auth_opts.allow_plain)
 *
 * Blank lines and lines starting with '#' are skipped. Any other malformed line fails the whole
 * load with "file:line: error: ..." and nothing of the file is used.
 *
 * The broker keeps one current table (auth_reload). A reload parses the file into a new table
 * and swaps it in under a short lock; a check that is running keeps the table it started with
 * (reference counted), so a SIGHUP never disturbs a client that is being authenticated.
 *
 * The broker's calls (see docs/weft-mqtt-security.md):
 *   at start and on SIGHUP   auth_reload(conf.password_file, &opts, err, sizeof err)
 *   in the CONNECT handler   auth_turn(&req, &at): -EBUSY answers "try later" at once;
 *                            else wait until at, then auth_check(&req) and, unless AUTH_OK,
 *                            a CONNACK with auth_connack_code(result, version); disconnect
 */
#ifndef WEFT_MQTT_AUTH_H
#define WEFT_MQTT_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

typedef struct auth_table auth_table;

typedef struct auth_opts {
	bool allow_plain;          /* accept clear-text "user:password" lines */
} auth_opts;

/* ---- one table ------------------------------------------------------------------------------ */

/* Parse a password file. NULL on any error, with "file:line: error: ..." in err. */
auth_table *auth_table_load(const char *path, const auth_opts *o, char *err, size_t errcap);
void auth_table_free(auth_table *t);
long auth_table_count(const auth_table *t);
/* 1 if user is in t and password is its password, else 0. The time taken does not depend on
 * where the password differs, nor on whether the user exists (an unknown user is checked
 * against a dummy hash of the default cost). */
int auth_table_verify(const auth_table *t, const char *user, size_t user_len,
		      const void *password, size_t password_len);

/* ---- the broker's current table --------------------------------------------------------------- */

/* Load path and make it the current table. 0, or -1 with err filled and the old table kept. */
int auth_reload(const char *path, const auth_opts *o, char *err, size_t errcap);
/* Drop the current table: no password file (every client counts as anonymous). */
void auth_clear(void);
/* Users in the current table, or -1 when there is none. */
long auth_count(void);

/* ---- deciding a CONNECT ----------------------------------------------------------------------- */

typedef enum auth_result {
	AUTH_OK = 0,
	AUTH_BAD_CREDENTIALS,      /* unknown user, wrong or missing password */
	AUTH_NOT_AUTHORIZED,       /* no username, and anonymous clients are not allowed */
} auth_result;

typedef struct auth_req {
	const char *user;          /* NULL: the CONNECT had no username */
	size_t user_len;
	const void *password;      /* NULL: no password */
	size_t password_len;
	const struct sockaddr *from;  /* the client's address; NULL: not paced */
	bool anonymous_ok;         /* allow_anonymous as it applies to this client */
	int64_t now;               /* monotonic ns (weft_now()) for the rate limiter */
} auth_req;

/*
 * Decide a CONNECT. With no current table, a username proves nothing: every client is
 * anonymous. With one, a client that gives a username must give its password; one without a
 * username is let in only if anonymous_ok. Call it at the turn auth_turn gave (below). A right password
 * gives back the turn it took. CPU-bound for the table's hash cost (about 55 us for
 * mosquitto_passwd's 101 rounds).
 */
auth_result auth_check(const auth_req *r);

/* The CONNACK return code (3.1.1) or reason code (5.0) for a refusal. */
static inline int auth_connack_code(auth_result r, int version)
{
	if (version >= 5)
		return r == AUTH_BAD_CREDENTIALS ? 0x86 : 0x87;
	return 0x05; /* 3.1.1: "not authorized" (0x04 means the data was malformed) */
}

/* ---- the pace of password checks (pace.c) -------------------------------------------------- */

/*
 * Password guessing is slowed down to a fixed number of checks, and a right password is never
 * answered "wrong": a CONNECT is made to wait for its turn to be checked, and told to try later
 * only while its address's schedule is full. Turns are counted per (source
 * address, username) pair - `burst` at once, then one per `interval_ns` - and per source
 * address whatever the name (4 x burst, then four per interval), each a cell of ratelimit.c
 * (IPv4 address, or IPv6 /64). Every CONNECT books a turn in both; a right password gives them
 * back (its pair's whole debt), so a client that knows its password pays for nobody's guesses.
 * Waiting happens before the check, for right and wrong passwords alike: a guesser cannot
 * learn its answer sooner by opening many connections. Turns are booked at most AUTH_MAX_WAIT
 * ahead; an attempt that would wait longer is not checked but answered at once "try later"
 * (5.0: 0x9F connection rate exceeded; 3.1.1: 0x03 server unavailable). So a pair gets at most
 * burst + AUTH_MAX_WAIT / interval checks in any AUTH_MAX_WAIT, however many connections it
 * opens; and while someone floods its name from its address, or floods many names from its
 * address, a client is told to try later (pace.c says why that is the choice).
 */
#define AUTH_MAX_WAIT 10000000000LL /* ns: 10 s */

typedef struct auth_limits {
	int burst;                 /* default 5 */
	int64_t interval_ns;       /* default 2 s; burst 0 turns pacing off */
} auth_limits;

void auth_set_limits(const auth_limits *l);
/* Book r's turn: 0 with *at set to when (r->now's clock) its password may be checked - r->now
 * within the burst, at most r->now + AUTH_MAX_WAIT - or -EBUSY, nothing booked, when the
 * schedule of r's pair or address is full: do not check it, answer "try later". */
int auth_turn(const auth_req *r, int64_t *at);
/* Give back the turns of a right password (auth_check calls it). */
void auth_turn_refund(const auth_req *r);
/* Give back the one turn r booked, its check not made after all. */
void auth_turn_cancel(const auth_req *r);
/* Forget every address (tests). */
void auth_limit_reset(void);

#endif
