/*
 * auth.c - password files and the CONNECT decision.
 *
 * Table. A password file becomes an immutable hash table of users (chained, power-of-two
 * buckets, FNV-1a of the name). Each entry keeps the decoded salt and hash; a "$7$" entry is
 * verified with PKCS5_PBKDF2_HMAC(SHA-512, iterations, salt) as mosquitto_passwd made it, a
 * "$6$" entry with SHA-512(password || salt), a plain entry by comparing SHA-512 digests of both
 * sides. Digests are compared with CRYPTO_memcmp, so the time does not say how much matched;
 * an unknown user is hashed against a dummy $7$ entry so that it costs what a known one costs.
 *
 * Reload. The current table is a pointer guarded by a weft_mutex that is held only to read or
 * swap the pointer and take a reference, never while hashing: auth_check takes a reference,
 * verifies without the lock, drops it; auth_reload builds the new table first (a bad file
 * leaves the old one in place), swaps, and drops the old table's own reference. Whoever drops
 * the last reference frees it, so a check in progress finishes on the table it began with.
 *
 * The pace of checks is pace.c's: it needs no OpenSSL, so the build without it has it too.
 */
#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <weft.h>

#include "auth.h"
#include "textfile.h"

#define HASH_LEN 64                 /* SHA-512 */
#define SALT_MAX 64
#define ITER_MAX 10000000           /* beyond this one CONNECT would take seconds */
#define DUMMY_ITER 101              /* mosquitto_passwd's cost */

enum { KIND_PBKDF2, KIND_SHA512, KIND_PLAIN };

typedef struct user_ent {
	struct user_ent *next;
	uint32_t hash;
	uint8_t kind;
	uint8_t salt_len;
	int iterations;
	uint8_t salt[SALT_MAX];
	uint8_t digest[HASH_LEN];   /* for KIND_PLAIN: SHA-512 of the password */
	size_t name_len;
	char name[];
} user_ent;

struct auth_table {
	atomic_int refs;
	long count;
	uint32_t mask;
	user_ent **buckets;
};

static uint32_t fnv(const char *s, size_t n)
{
	uint32_t h = 2166136261u;
	for (size_t i = 0; i < n; i++)
		h = (h ^ (uint8_t)s[i]) * 16777619u;
	return h;
}

/* ---- parsing ------------------------------------------------------------------------------ */

/* Standard base64 (with padding) into out; returns the length, or -1 if malformed or > cap. */
static int b64_decode(const char *s, size_t n, uint8_t *out, size_t cap)
{
	if (n == 0 || n % 4 || n / 4 * 3 > cap + 2)
		return -1;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
			  c == '+' || c == '/' || (c == '=' && i >= n - 2);
		if (!ok || (s[n - 2] == '=' && s[n - 1] != '='))
			return -1;
	}
	uint8_t tmp[SALT_MAX + HASH_LEN + 4];
	if (n / 4 * 3 > sizeof tmp)
		return -1;
	int len = EVP_DecodeBlock(tmp, (const unsigned char *)s, (int)n);
	if (len < 0)
		return -1;
	len -= (s[n - 1] == '=') + (s[n - 2] == '=');
	if ((size_t)len > cap)
		return -1;
	memcpy(out, tmp, (size_t)len);
	return len;
}

static void sha512(const void *a, size_t an, const void *b, size_t bn, uint8_t out[HASH_LEN])
{
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	if (!ctx || !EVP_DigestInit_ex(ctx, EVP_sha512(), NULL) || !EVP_DigestUpdate(ctx, a, an) ||
	    !EVP_DigestUpdate(ctx, b, bn) || !EVP_DigestFinal_ex(ctx, out, NULL))
		abort(); /* only when memory is out */
	EVP_MD_CTX_free(ctx);
}

/* The part after "user:". Returns NULL, or a message saying what is wrong. */
static const char *parse_secret(user_ent *e, const char *s, size_t n, const auth_opts *o)
{
	if (n == 0)
		return "empty password";
	if (s[0] != '$') {
		if (!o || !o->allow_plain)
			return "plain-text password (hash it with mosquitto_passwd -U, or allow plain "
			       "text)";
		e->kind = KIND_PLAIN;
		sha512(s, n, "", 0, e->digest);
		return NULL;
	}
	/* $7$iter$salt$hash or $6$salt$hash */
	const char *end = s + n, *p = s + 3;
	if (n < 3 || (s[1] != '7' && s[1] != '6') || s[2] != '$')
		return "unknown hash type (mosquitto_passwd writes $7$ or $6$)";
	if (s[1] == '7') {
		long it = 0;
		const char *q = p;
		for (; q < end && *q >= '0' && *q <= '9'; q++)
			if (it <= ITER_MAX)
				it = it * 10 + (*q - '0');
		if (q == p || q == end || *q != '$')
			return "bad iteration count";
		if (it < 1 || it > ITER_MAX)
			return "iteration count out of range (1 to 10000000)";
		e->kind = KIND_PBKDF2;
		e->iterations = (int)it;
		p = q + 1;
	} else {
		e->kind = KIND_SHA512;
	}
	const char *dollar = memchr(p, '$', (size_t)(end - p));
	if (!dollar)
		return "missing hash";
	int sl = b64_decode(p, (size_t)(dollar - p), e->salt, SALT_MAX);
	if (sl < 1)
		return "bad salt (not base64)";
	e->salt_len = (uint8_t)sl;
	int hl = b64_decode(dollar + 1, (size_t)(end - dollar - 1), e->digest, HASH_LEN);
	if (hl != HASH_LEN)
		return "bad hash (not 64 bytes of base64)";
	return NULL;
}

static void table_put(auth_table *t, user_ent *e)
{
	user_ent **b = &t->buckets[e->hash & t->mask];
	e->next = *b;
	*b = e;
	t->count++;
}

static user_ent *table_get(const auth_table *t, const char *name, size_t n)
{
	uint32_t h = fnv(name, n);
	for (user_ent *e = t->buckets[h & t->mask]; e; e = e->next)
		if (e->hash == h && e->name_len == n && !memcmp(e->name, name, n))
			return e;
	return NULL;
}

static auth_table *table_new(uint32_t nb)
{
	auth_table *t = calloc(1, sizeof *t);
	if (!t)
		abort();
	t->mask = nb - 1;
	t->buckets = calloc(nb, sizeof *t->buckets);
	if (!t->buckets)
		abort();
	atomic_init(&t->refs, 1);
	return t;
}

void auth_table_free(auth_table *t)
{
	if (!t)
		return;
	for (uint32_t i = 0; i <= t->mask; i++)
		for (user_ent *e = t->buckets[i], *n; e; e = n) {
			n = e->next;
			OPENSSL_cleanse(e, sizeof *e);
			free(e);
		}
	free(t->buckets);
	free(t);
}

/* Rebuild with more buckets once the chains get long (loads only: nobody reads it yet). */
static void table_grow(auth_table *t)
{
	uint32_t nb = (t->mask + 1) * 4;
	user_ent **nbk = calloc(nb, sizeof *nbk);
	if (!nbk)
		abort();
	for (uint32_t i = 0; i <= t->mask; i++)
		for (user_ent *e = t->buckets[i], *n; e; e = n) {
			n = e->next;
			e->next = nbk[e->hash & (nb - 1)];
			nbk[e->hash & (nb - 1)] = e;
		}
	free(t->buckets);
	t->buckets = nbk;
	t->mask = nb - 1;
}

auth_table *auth_table_load(const char *path, const auth_opts *o, char *err, size_t errcap)
{
	FILE *f = textfile_open(path, err, errcap);
	if (!f)
		return NULL;
	auth_table *t = table_new(64);
	char *line = NULL;
	size_t cap = 0;
	ssize_t len;
	long lineno = 0;
	const char *why = NULL;
	while ((len = getline(&line, &cap, f)) >= 0) {
		lineno++;
		while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
			line[--len] = 0;
		size_t sp = strspn(line, " \t");
		if ((size_t)len == sp || line[sp] == '#')
			continue;
		if (memchr(line, 0, (size_t)len)) {
			why = "NUL byte in line";
			break;
		}
		char *colon = memchr(line, ':', (size_t)len);
		if (!colon) {
			why = "expected user:password-hash";
			break;
		}
		size_t nl = (size_t)(colon - line);
		if (nl == 0) {
			why = "empty user name";
			break;
		}
		if (nl > 65535) {
			why = "user name longer than 65535 bytes";
			break;
		}
		if (table_get(t, line, nl)) {
			why = "user listed twice";
			break;
		}
		user_ent *e = calloc(1, sizeof *e + nl + 1);
		if (!e)
			abort();
		memcpy(e->name, line, nl);
		e->name_len = nl;
		e->hash = fnv(line, nl);
		why = parse_secret(e, colon + 1, (size_t)len - nl - 1, o);
		if (why) {
			free(e);
			break;
		}
		table_put(t, e);
		if ((uint32_t)t->count > (t->mask + 1) * 2)
			table_grow(t);
	}
	if (!why && ferror(f))
		why = strerror(errno);
	if (line)
		OPENSSL_cleanse(line, cap);
	free(line);
	fclose(f);
	if (why) {
		snprintf(err, errcap, "%s:%ld: error: %s", path, lineno, why);
		auth_table_free(t);
		return NULL;
	}
	return t;
}

long auth_table_count(const auth_table *t)
{
	return t ? t->count : -1;
}

/* ---- verifying ---------------------------------------------------------------------------- */

static int verify_ent(const user_ent *e, const void *pw, size_t n)
{
	uint8_t d[HASH_LEN];
	switch (e->kind) {
	case KIND_PBKDF2:
		if (!PKCS5_PBKDF2_HMAC(pw, (int)n, e->salt, e->salt_len, e->iterations,
				       EVP_sha512(), HASH_LEN, d))
			abort();
		break;
	case KIND_SHA512:
		sha512(pw, n, e->salt, e->salt_len, d);
		break;
	default:
		sha512(pw, n, "", 0, d);
		break;
	}
	int ok = CRYPTO_memcmp(d, e->digest, HASH_LEN) == 0;
	OPENSSL_cleanse(d, sizeof d);
	return ok;
}

int auth_table_verify(const auth_table *t, const char *user, size_t ulen, const void *pw,
		      size_t pwlen)
{
	static const user_ent dummy = { .kind = KIND_PBKDF2, .iterations = DUMMY_ITER,
					.salt_len = 12 };
	if (pwlen > INT32_MAX)
		return 0;
	const user_ent *e = t && user ? table_get(t, user, ulen) : NULL;
	if (!e || !pw) {
		verify_ent(&dummy, pw ? pw : "", pw ? pwlen : 0);
		return 0;
	}
	return verify_ent(e, pw, pwlen);
}

/* ---- the current table -------------------------------------------------------------------- */

static weft_mutex cur_lock = WEFT_MUTEX_INIT;
static auth_table *cur;

static auth_table *acquire(void)
{
	auth_table *t;
	WEFT_WITH_LOCK(&cur_lock) {
		t = cur;
		if (t)
			atomic_fetch_add_explicit(&t->refs, 1, memory_order_relaxed);
	}
	return t;
}

static void release(auth_table *t)
{
	if (t && atomic_fetch_sub_explicit(&t->refs, 1, memory_order_acq_rel) == 1)
		auth_table_free(t);
}

static void swap_in(auth_table *t)
{
	auth_table *old;
	WEFT_WITH_LOCK(&cur_lock) {
		old = cur;
		cur = t;
	}
	release(old);
}

int auth_reload(const char *path, const auth_opts *o, char *err, size_t errcap)
{
	auth_table *t = auth_table_load(path, o, err, errcap);
	if (!t)
		return -1;
	swap_in(t);
	return 0;
}

void auth_clear(void)
{
	swap_in(NULL);
}

long auth_count(void)
{
	auth_table *t = acquire();
	long n = auth_table_count(t);
	release(t);
	return n;
}

auth_result auth_check(const auth_req *r)
{
	auth_table *t = acquire();
	auth_result res;
	if (!t || !r->user)
		res = r->anonymous_ok ? AUTH_OK : AUTH_NOT_AUTHORIZED;
	else
		res = auth_table_verify(t, r->user, r->user_len, r->password, r->password_len)
			      ? AUTH_OK
			      : AUTH_BAD_CREDENTIALS;
	release(t);
	if (res == AUTH_OK && r->from)
		auth_turn_refund(r);
	return res;
}
