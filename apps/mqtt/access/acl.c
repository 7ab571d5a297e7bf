/*
 * acl.c - acl_file rules: parsing, binding a client to them, and deciding.
 *
 * Parsing follows mosquitto 2.0's reader: a `topic` or `pattern` line is the keyword, then an
 * access word, then the rest of the line (trimmed) as the filter; with a single word after the
 * keyword that word is the filter and the access is readwrite. `user` takes the rest of the line
 * as the name and starts that user's section (a name seen again adds to the same section);
 * `topic` lines before any `user` line form the anonymous section. Unlike mosquitto, which
 * skips lines it does not understand, every malformed line fails the load with file:line.
 *
 * Each section becomes an array with its deny rules moved to the front, which is all that
 * mosquitto's "deny rules are handled first" means: within a list, any matching deny refuses,
 * else any matching rule with the access allows.
 *
 * Binding. acl_bind takes a reference on the current table and builds the client's two arrays
 * of (filter, access): its own section's rules (pointing into the table) and every pattern,
 * with %u and %c replaced wherever they appear in the filter (as mosquitto 2.0.11 does;
 * its manual asks for them to fill a whole level) and patterns with %u skipped for anonymous
 * clients. A check is then two linear scans with no allocation and no lock.
 *
 * Reload swaps the table pointer under a lock and bumps a generation number; bound clients keep
 * the old table alive through their reference until they rebind, so nothing is freed under a
 * reader. A binding keeps whom it binds (username, client id), so that whoever finds it stale
 * (acl_stale: one load) can make its successor (acl_rebind) without asking the connection.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <weft.h>

#include "acl.h"
#include "codec.h"
#include "textfile.h"

typedef struct rule {
	char *f;
	size_t len;
	uint8_t access;           /* ACL_READ | ACL_WRITE; 0 denies */
	bool has_u, has_c;        /* patterns: substitutions to make */
} rule;

typedef struct rlist {
	rule *v;
	int n, cap;
} rlist;

typedef struct uent {
	struct uent *next;
	size_t len;
	rlist rules;
	char name[];
} uent;

struct acl_table {
	atomic_int refs;
	long nrules;
	rlist anon, patterns;
	uent **buckets;
	uint32_t mask, nusers; /* the user table doubles past two users a bucket */
};

/* What a client checks against: its section's rules then the patterns. */
typedef struct crule {
	const char *f;
	size_t len;
	uint8_t access;
} crule;

struct acl_client {
	acl_table *t;              /* NULL: everything allowed */
	crule *v;                  /* nmine own rules, then npat patterns */
	int nmine, npat;
	bool has_patterns, dangerous;
	uint64_t gen;
	char *own;                 /* the substituted pattern strings, one block */
	char *who;                 /* whom it binds, for acl_rebind: the username (ul bytes,
				    * absent when anonymous) then the client id (il bytes) */
	size_t ul, il;
	bool anon;
};

/* ---- parsing -------------------------------------------------------------------------------- */

static void rl_add(rlist *l, rule r)
{
	if (l->n == l->cap) {
		l->cap = l->cap ? l->cap * 2 : 8;
		l->v = realloc(l->v, (size_t)l->cap * sizeof *l->v);
		if (!l->v)
			abort();
	}
	l->v[l->n++] = r;
}

/* Deny rules first, each group in file order. */
static void rl_deny_first(rlist *l)
{
	rule *v = malloc((size_t)(l->n ? l->n : 1) * sizeof *v);
	if (!v)
		abort();
	int k = 0;
	for (int pass = 0; pass < 2; pass++)
		for (int i = 0; i < l->n; i++)
			if ((l->v[i].access == 0) == (pass == 0))
				v[k++] = l->v[i];
	if (l->n)
		memcpy(l->v, v, (size_t)l->n * sizeof *v);
	free(v);
}

static void rl_free(rlist *l)
{
	for (int i = 0; i < l->n; i++)
		free(l->v[i].f);
	free(l->v);
}

static uint32_t fnv(const char *s, size_t n)
{
	uint32_t h = 2166136261u;
	for (size_t i = 0; i < n; i++)
		h = (h ^ (uint8_t)s[i]) * 16777619u;
	return h;
}

static uent *user_find(const acl_table *t, const char *name, size_t n)
{
	for (uent *u = t->buckets[fnv(name, n) & t->mask]; u; u = u->next)
		if (u->len == n && !memcmp(u->name, name, n))
			return u;
	return NULL;
}

/* Twice the buckets, so that loading a file stays linear in its users. */
static void users_grow(acl_table *t)
{
	uint32_t mask = 2 * t->mask + 1;
	uent **nb = calloc((size_t)mask + 1, sizeof *nb);
	if (!nb)
		abort();
	for (uint32_t i = 0; i <= t->mask; i++)
		for (uent *u = t->buckets[i], *next; u; u = next) {
			next = u->next;
			uent **b = &nb[fnv(u->name, u->len) & mask];
			u->next = *b;
			*b = u;
		}
	free(t->buckets);
	t->buckets = nb;
	t->mask = mask;
}

static uent *user_get(acl_table *t, const char *name, size_t n)
{
	uent *u = user_find(t, name, n);
	if (u)
		return u;
	u = calloc(1, sizeof *u + n + 1);
	if (!u)
		abort();
	memcpy(u->name, name, n);
	u->len = n;
	uent **b = &t->buckets[fnv(name, n) & t->mask];
	u->next = *b;
	*b = u;
	if (++t->nusers > 2 * (t->mask + 1))
		users_grow(t);
	return u;
}

void acl_table_free(acl_table *t)
{
	if (!t)
		return;
	rl_free(&t->anon);
	rl_free(&t->patterns);
	for (uint32_t i = 0; i <= t->mask; i++)
		for (uent *u = t->buckets[i], *n; u; u = n) {
			n = u->next;
			rl_free(&u->rules);
			free(u);
		}
	free(t->buckets);
	free(t);
}

long acl_table_rules(const acl_table *t)
{
	return t ? t->nrules : 0;
}

/* A valid subscription filter: '+' and '#' fill their level, '#' only last. */
static const char *filter_check(const char *f, size_t n)
{
	if (n == 0)
		return "empty topic";
	if (n > 65535)
		return "topic longer than 65535 bytes";
	for (size_t i = 0; i < n; i++) {
		if (f[i] != '+' && f[i] != '#')
			continue;
		bool alone = (i == 0 || f[i - 1] == '/') && (i + 1 == n || f[i + 1] == '/');
		if (!alone || (f[i] == '#' && i + 1 != n))
			return "misplaced wildcard in topic (+ and # must fill a level; # comes last)";
	}
	return NULL;
}

static char *trim(char *s)
{
	s += strspn(s, " \t");
	size_t n = strlen(s);
	while (n && (s[n - 1] == ' ' || s[n - 1] == '\t'))
		s[--n] = 0;
	return s;
}

/* One non-comment line; NULL or what is wrong with it. *user is the current section. */
static const char *parse_line(acl_table *t, char *line, uent **user, bool *in_user)
{
	char *kw = line + strspn(line, " \t");
	char *rest = kw + strcspn(kw, " \t");
	if (*rest)
		*rest++ = 0;
	rest = trim(rest);
	if (!strcmp(kw, "user")) {
		if (!*rest)
			return "missing user name";
		*user = user_get(t, rest, strlen(rest));
		*in_user = true;
		return NULL;
	}
	bool pattern = !strcmp(kw, "pattern");
	if (!pattern && strcmp(kw, "topic"))
		return "unknown keyword (expected topic, pattern or user)";
	if (!*rest)
		return "missing topic";
	char *word = rest, *filter = rest + strcspn(rest, " \t");
	uint8_t access = ACL_READ | ACL_WRITE;
	if (*filter) {
		*filter++ = 0;
		filter = trim(filter);
		if (!strcmp(word, "read"))
			access = ACL_READ;
		else if (!strcmp(word, "write"))
			access = ACL_WRITE;
		else if (!strcmp(word, "readwrite"))
			access = ACL_READ | ACL_WRITE;
		else if (!strcmp(word, "deny"))
			access = 0;
		else
			return "unknown access (expected read, write, readwrite or deny)";
	} else {
		filter = word;
	}
	size_t n = strlen(filter);
	const char *bad = filter_check(filter, n);
	if (bad)
		return bad;
	rule r = { strdup(filter), n, access, false, false };
	if (!r.f)
		abort();
	if (pattern) {
		r.has_u = strstr(filter, "%u") != NULL;
		r.has_c = strstr(filter, "%c") != NULL;
		rl_add(&t->patterns, r);
	} else {
		rl_add(*in_user ? &(*user)->rules : &t->anon, r);
	}
	t->nrules++;
	return NULL;
}

acl_table *acl_table_load(const char *path, char *err, size_t errcap)
{
	FILE *f = textfile_open(path, err, errcap);
	if (!f)
		return NULL;
	acl_table *t = calloc(1, sizeof *t);
	if (!t)
		abort();
	atomic_init(&t->refs, 1);
	t->mask = 255;
	t->buckets = calloc(t->mask + 1, sizeof *t->buckets);
	if (!t->buckets)
		abort();
	char *line = NULL;
	size_t cap = 0;
	ssize_t len;
	long lineno = 0;
	const char *why = NULL;
	uent *user = NULL;
	bool in_user = false;
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
		if ((why = parse_line(t, line, &user, &in_user)))
			break;
	}
	if (!why && ferror(f))
		why = strerror(errno);
	free(line);
	fclose(f);
	if (why) {
		snprintf(err, errcap, "%s:%ld: error: %s", path, lineno, why);
		acl_table_free(t);
		return NULL;
	}
	rl_deny_first(&t->anon);
	rl_deny_first(&t->patterns);
	for (uint32_t i = 0; i <= t->mask; i++)
		for (uent *u = t->buckets[i]; u; u = u->next)
			rl_deny_first(&u->rules);
	return t;
}

/* ---- the current table ---------------------------------------------------------------------- */

static weft_mutex cur_lock = WEFT_MUTEX_INIT;
static acl_table *cur;
static _Atomic uint64_t cur_gen = 1;

static void release(acl_table *t)
{
	if (t && atomic_fetch_sub_explicit(&t->refs, 1, memory_order_acq_rel) == 1)
		acl_table_free(t);
}

static void swap_in(acl_table *t)
{
	acl_table *old;
	WEFT_WITH_LOCK(&cur_lock) {
		old = cur;
		cur = t;
		atomic_fetch_add_explicit(&cur_gen, 1, memory_order_release);
	}
	release(old);
}

int acl_reload(const char *path, char *err, size_t errcap)
{
	acl_table *t = acl_table_load(path, err, errcap);
	if (!t)
		return -1;
	swap_in(t);
	return 0;
}

void acl_clear(void)
{
	swap_in(NULL);
}

bool acl_stale(const acl_client *c)
{
	return atomic_load_explicit(&cur_gen, memory_order_acquire) != c->gen;
}

/* ---- binding -------------------------------------------------------------------------------- */

/* f with %u and %c replaced, into out (NULL: only measure). */
static size_t subst(const rule *r, const char *u, size_t ul, const char *id, size_t il, char *out)
{
	size_t n = 0;
	for (size_t i = 0; i < r->len; i++) {
		const char *s = r->f + i;
		size_t sl = 1;
		if (i + 1 < r->len && s[0] == '%' && s[1] == 'c') {
			s = id;
			sl = il;
			i++;
		} else if (i + 1 < r->len && s[0] == '%' && s[1] == 'u' && u) {
			s = u;
			sl = ul;
			i++;
		}
		if (out)
			memcpy(out + n, s, sl);
		n += sl;
	}
	return n;
}

static acl_client *bind_to(acl_table *t, uint64_t gen, const char *user, size_t ul,
			   const char *id, size_t il)
{
	acl_client *c = calloc(1, sizeof *c);
	if (!c)
		abort();
	c->t = t;
	c->gen = gen;
	c->anon = !user;
	c->ul = user ? ul : 0;
	c->il = il;
	c->who = malloc(c->ul + il + 1);
	if (!c->who)
		abort();
	if (c->ul)
		memcpy(c->who, user, ul);
	if (il)
		memcpy(c->who + c->ul, id, il);
	if (!t)
		return c;
	const rlist *mine = &t->anon;
	if (user) {
		uent *u = user_find(t, user, ul);
		mine = u ? &u->rules : NULL;
	}
	int nmine = mine ? mine->n : 0, npat = t->patterns.n;
	c->v = malloc((size_t)(nmine + npat + 1) * sizeof *c->v);
	if (!c->v)
		abort();
	for (int i = 0; i < nmine; i++)
		c->v[i] = (crule){ mine->v[i].f, mine->v[i].len, mine->v[i].access };
	c->nmine = nmine;
	c->has_patterns = npat > 0;
	c->dangerous = (user && memchr(user, '+', ul)) || (user && memchr(user, '#', ul)) ||
		       memchr(id, '+', il) || memchr(id, '#', il);
	size_t own = 0;
	for (int i = 0; i < npat; i++) {
		const rule *r = &t->patterns.v[i];
		if (r->has_u || r->has_c)
			own += subst(r, user, ul, id, il, NULL);
	}
	c->own = malloc(own + 1);
	if (!c->own)
		abort();
	own = 0;
	for (int i = 0; i < npat; i++) {
		const rule *r = &t->patterns.v[i];
		if (r->has_u && !user)
			continue; /* %u says nothing about a client without a name */
		crule *cr = &c->v[nmine + c->npat++];
		cr->access = r->access;
		if (r->has_u || r->has_c) {
			cr->f = c->own + own;
			cr->len = subst(r, user, ul, id, il, c->own + own);
			own += cr->len;
		} else {
			cr->f = r->f;
			cr->len = r->len;
		}
	}
	return c;
}

acl_client *acl_bind_table(acl_table *t, const char *user, size_t ul, const char *id, size_t il)
{
	if (t)
		atomic_fetch_add_explicit(&t->refs, 1, memory_order_relaxed);
	return bind_to(t, 0, user, ul, id, il);
}

acl_client *acl_bind(const char *user, size_t ul, const char *id, size_t il)
{
	acl_table *t;
	uint64_t gen;
	WEFT_WITH_LOCK(&cur_lock) {
		t = cur;
		gen = atomic_load_explicit(&cur_gen, memory_order_relaxed);
		if (t)
			atomic_fetch_add_explicit(&t->refs, 1, memory_order_relaxed);
	}
	return bind_to(t, gen, user, ul, id, il);
}

acl_client *acl_rebind(const acl_client *c)
{
	return acl_bind(c->anon ? NULL : c->who, c->ul, c->who + c->ul, c->il);
}

void acl_unbind(acl_client *c)
{
	if (!c)
		return;
	release(c->t);
	free(c->v);
	free(c->own);
	free(c->who);
	free(c);
}

/* ---- deciding ------------------------------------------------------------------------------- */

/* -1 refused, 1 allowed, 0 this list does not decide. */
static int decide(const crule *v, int n, const char *topic, size_t len, int access)
{
	for (int i = 0; i < n; i++)
		if (mq_topic_match(v[i].f, v[i].len, topic, len)) {
			if (!v[i].access)
				return -1;
			if (v[i].access & access)
				return 1;
		}
	return 0;
}

bool acl_check(const acl_client *c, const char *topic, size_t len, int access)
{
	if (!c->t)
		return true;
	int d = decide(c->v, c->nmine, topic, len, access);
	if (d)
		return d > 0;
	if (c->has_patterns && c->dangerous)
		return false;
	return decide(c->v + c->nmine, c->npat, topic, len, access) > 0;
}

static int decide_sub(const crule *v, int n, const char *f, size_t len)
{
	for (int i = 0; i < n; i++) {
		if (!v[i].access) {
			if (mq_filter_covers(v[i].f, v[i].len, f, len))
				return -1;
		} else if ((v[i].access & ACL_READ) && mq_filter_overlaps(v[i].f, v[i].len, f, len)) {
			return 1;
		}
	}
	return 0;
}

bool acl_check_subscribe(const acl_client *c, const char *filter, size_t len)
{
	if (!c->t)
		return true;
	if (len > 7 && !memcmp(filter, "$share/", 7)) { /* the group's filter is what is read */
		const char *g = memchr(filter + 7, '/', len - 7);
		if (!g)
			return false;
		len -= (size_t)(g + 1 - filter);
		filter = g + 1;
	}
	int d = decide_sub(c->v, c->nmine, filter, len);
	if (d)
		return d > 0;
	if (c->has_patterns && c->dangerous)
		return false;
	return decide_sub(c->v + c->nmine, c->npat, filter, len) > 0;
}

bool acl_allowed(const char *user, size_t ul, const char *id, size_t il, const char *topic,
		 size_t len, int access)
{
	acl_client *c = acl_bind(user, ul, id, il);
	bool ok = acl_check(c, topic, len, access);
	acl_unbind(c);
	return ok;
}
