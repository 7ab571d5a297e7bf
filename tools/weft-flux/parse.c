/*
 * parse.c - recursive descent over the statements of a .flux file, one function per form:
 *
 *   include other.flux;           include <stdio.h>;   include "types.h";
 *   node [detached|abstract] N (T a, guard G(a) as g, ...) => (T b, ...);
 *   condition C (T a) => bool;
 *   exclusive|readwrite|pool|free G (T key, ...) => T *;
 *   precedence G1 < G2 < ...;
 *   source S [-> A -> B ...];     initial I [-> A ...];
 *   N [: [C1, *, ...]] = A -> B -> ...;     N [: [...]] = A & B & ...;
 *   handle error N -> H;
 *
 * A parameter is C type text followed by its name; the type is kept normalised (tokens joined
 * by one space) so that check.c compares types as text. Included .flux files are read once,
 * relative to the including file.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flux.h"

struct parser {
	struct program *p;
	struct lexer lx;
};

#define CUR (ps->lx.cur)

static bool is(struct parser *ps, const char *text)
{
	return (CUR.kind == T_PUNCT || CUR.kind == T_IDENT) && !strcmp(CUR.text, text);
}

static bool accept(struct parser *ps, const char *text)
{
	if (!is(ps, text))
		return false;
	lex_next(&ps->lx);
	return true;
}

static const char *describe(const struct token *t)
{
	if (t->kind == T_EOF)
		return "end of file";
	return xprintf("'%s'", t->text);
}

static void expect(struct parser *ps, const char *text)
{
	if (!accept(ps, text))
		flux_fail(&CUR.loc, "expected '%s' before %s", text, describe(&CUR));
}

static char *ident(struct parser *ps, const char *what, struct loc *loc)
{
	if (CUR.kind != T_IDENT)
		flux_fail(&CUR.loc, "expected %s before %s", what, describe(&CUR));
	if (loc)
		*loc = CUR.loc;
	char *s = CUR.text;
	lex_next(&ps->lx);
	return s;
}

/* Append token text to a type, with C's spacing conventions kept simple. */
static char *type_append(char *type, const char *tok)
{
	if (!type)
		return xstrdup(tok);
	return xprintf("%s %s", type, tok);
}

/* C type text: identifiers, '*', and array brackets with numbers, until `stop` tokens. */
static bool type_token(struct parser *ps)
{
	return CUR.kind == T_IDENT || CUR.kind == T_NUMBER || is(ps, "*") || is(ps, "[") ||
	       is(ps, "]");
}

static void parse_guard_use(struct parser *ps, struct param *pm)
{
	pm->guard = ident(ps, "guard name", &pm->guard_loc);
	if (accept(ps, "/")) {
		struct loc l = CUR.loc;
		char *m = ident(ps, "'read' or 'write'", NULL);
		if (!strcmp(m, "read"))
			pm->mode = M_READ;
		else if (!strcmp(m, "write"))
			pm->mode = M_WRITE;
		else
			flux_fail(&l, "expected 'read' or 'write' after '/', not '%s'", m);
	}
	expect(ps, "(");
	if (!is(ps, ")"))
		do {
			struct loc l;
			char *a = ident(ps, "a field name as guard key", &l);
			*APPEND(pm->args, pm->nargs) = a;
			pm->nargs--;
			*APPEND(pm->arg_locs, pm->nargs) = l;
		} while (accept(ps, ","));
	expect(ps, ")");
	expect(ps, "as");
	pm->name = ident(ps, "the guard's atom name after 'as'", NULL);
}

/* ( [param {, param}] ) where param is `type name` or `guard G(args) as name`. */
static void parse_params(struct parser *ps, struct params *out, bool guards_ok)
{
	expect(ps, "(");
	if (accept(ps, ")"))
		return;
	do {
		struct param *pm = APPEND(out->v, out->n);
		pm->loc = CUR.loc;
		pm->guard_index = -1;
		if (is(ps, "guard")) {
			if (!guards_ok)
				flux_fail(&CUR.loc, "guards are allowed only among a node's inputs");
			lex_next(&ps->lx);
			parse_guard_use(ps, pm);
			continue;
		}
		char *type = NULL, *last = NULL;
		struct loc last_loc = CUR.loc;
		while (type_token(ps)) {
			if (last)
				type = type_append(type, last);
			last = CUR.kind == T_IDENT ? CUR.text : NULL;
			last_loc = CUR.loc;
			if (!last)
				type = type_append(type, CUR.text);
			lex_next(&ps->lx);
		}
		if (!last)
			flux_fail(&last_loc, "expected a parameter name (after its C type) before %s",
				  describe(&CUR));
		if (!type)
			flux_fail(&pm->loc, "parameter '%s' has no type", last);
		pm->type = type;
		pm->name = last;
		pm->loc = last_loc;
	} while (accept(ps, ","));
	expect(ps, ")");
}

static void parse_node(struct parser *ps)
{
	struct node *n = APPEND(ps->p->nodes, ps->p->nnodes);
	n->handler = -1;
	for (;;) {
		if (accept(ps, "detached"))
			n->detached = true;
		else if (accept(ps, "abstract"))
			n->abstract = true;
		else
			break;
	}
	n->name = ident(ps, "node name", &n->loc);
	parse_params(ps, &n->in, true);
	expect(ps, "=>");
	parse_params(ps, &n->out, false);
	expect(ps, ";");
}

static void parse_condition(struct parser *ps)
{
	struct condition *c = APPEND(ps->p->conds, ps->p->nconds);
	c->name = ident(ps, "condition name", &c->loc);
	parse_params(ps, &c->in, false);
	expect(ps, "=>");
	struct loc l = CUR.loc;
	char *t = ident(ps, "'bool'", NULL);
	if (strcmp(t, "bool"))
		flux_fail(&l, "a condition returns bool, not '%s'", t);
	expect(ps, ";");
}

static void parse_guard(struct parser *ps, enum guard_kind kind)
{
	struct guard *g = APPEND(ps->p->guards, ps->p->nguards);
	g->kind = kind;
	g->name = ident(ps, "guard name", &g->loc);
	parse_params(ps, &g->keys, false);
	expect(ps, "=>");
	char *type = NULL;
	struct loc l = CUR.loc;
	while (type_token(ps)) {
		type = type_append(type, CUR.text);
		lex_next(&ps->lx);
	}
	if (!type)
		flux_fail(&l, "expected the guard's value type before %s", describe(&CUR));
	g->value_type = type;
	expect(ps, ";");
}

static void parse_precedence(struct parser *ps)
{
	struct precedence *pr = APPEND(ps->p->precs, ps->p->nprecs);
	do {
		struct loc l;
		char *name = ident(ps, "guard name", &l);
		*APPEND(pr->names, pr->n) = name;
		pr->n--;
		*APPEND(pr->locs, pr->n) = l;
	} while (accept(ps, "<"));
	if (pr->n < 2)
		flux_fail(&CUR.loc, "expected '<' before %s", describe(&CUR));
	expect(ps, ";");
}

static void parse_start(struct parser *ps, bool initial, struct loc loc)
{
	struct start *s = APPEND(ps->p->starts, ps->p->nstarts);
	s->loc = loc;
	s->initial = initial;
	do {
		struct loc l;
		char *name = ident(ps, "node name", &l);
		*APPEND(s->chain, s->n) = name;
		s->n--;
		*APPEND(s->locs, s->n) = l;
	} while (accept(ps, "->"));
	expect(ps, ";");
}

static void parse_handler(struct parser *ps, struct loc loc)
{
	struct handler *h = APPEND(ps->p->handlers, ps->p->nhandlers);
	h->loc = loc;
	expect(ps, "error");
	h->node = ident(ps, "node name", &h->node_loc);
	expect(ps, "->");
	h->handler = ident(ps, "handler node name", &h->handler_loc);
	expect(ps, ";");
}

/* N [: [tests]] = expr; with N already read. */
static void parse_rule(struct parser *ps, char *target, struct loc loc)
{
	struct rule *r = APPEND(ps->p->rules, ps->p->nrules);
	r->target = target;
	r->loc = loc;
	if (accept(ps, ":")) {
		expect(ps, "[");
		do {
			struct loc l = CUR.loc;
			char *t;
			if (accept(ps, "*"))
				t = "*";
			else
				t = ident(ps, "a condition or '*'", NULL);
			*APPEND(r->tests, r->ntests) = t;
			r->ntests--;
			*APPEND(r->test_locs, r->ntests) = l;
		} while (accept(ps, ","));
		expect(ps, "]");
	}
	expect(ps, "=");
	do {
		struct loc l;
		char *e = ident(ps, "node name", &l);
		*APPEND(r->elems, r->nelems) = e;
		r->nelems--;
		*APPEND(r->elem_locs, r->nelems) = l;
		if (r->nelems == 1)
			r->fan = is(ps, "&");
		else if ((r->fan && is(ps, "->")) || (!r->fan && is(ps, "&")))
			flux_fail(&CUR.loc, "cannot mix '->' and '&' in one rule: name the parts "
					    "with abstract nodes");
	} while (accept(ps, r->fan ? "&" : "->"));
	expect(ps, ";");
}

static void parse_include(struct parser *ps, struct loc loc)
{
	if (CUR.kind == T_EOF || is(ps, ";"))
		flux_fail(&CUR.loc, "expected a file name after 'include'");
	char *what = lex_raw(&ps->lx);
	expect(ps, ";");
	size_t n = strlen(what);
	if (what[0] == '<' || what[0] == '"') {
		char close = what[0] == '<' ? '>' : '"';
		if (n < 3 || what[n - 1] != close)
			flux_fail(&loc, "a C header is included as <x.h> or \"x.h\"");
		*APPEND(ps->p->cincludes, ps->p->ncincludes) = what;
		return;
	}
	if (n < 6 || strcmp(what + n - 5, ".flux"))
		flux_fail(&loc, "include expects a .flux file, or a C header as <x.h> or \"x.h\"");
	char *path = what;
	if (what[0] != '/') {
		char *d = xstrdup(ps->lx.file);
		path = xprintf("%s/%s", dirname(d), what);
	}
	parse_file(ps->p, path, &loc);
}

static void parse_statement(struct parser *ps)
{
	struct loc loc = CUR.loc;
	if (CUR.kind != T_IDENT)
		flux_fail(&loc, "expected a declaration before %s", describe(&CUR));
	char *w = CUR.text;
	lex_next(&ps->lx);
	if (!strcmp(w, "node"))
		parse_node(ps);
	else if (!strcmp(w, "condition"))
		parse_condition(ps);
	else if (!strcmp(w, "exclusive"))
		parse_guard(ps, G_EXCLUSIVE);
	else if (!strcmp(w, "readwrite"))
		parse_guard(ps, G_READWRITE);
	else if (!strcmp(w, "pool"))
		parse_guard(ps, G_POOL);
	else if (!strcmp(w, "free") && CUR.kind == T_IDENT)
		parse_guard(ps, G_FREE);
	else if (!strcmp(w, "precedence"))
		parse_precedence(ps);
	else if (!strcmp(w, "source"))
		parse_start(ps, false, loc);
	else if (!strcmp(w, "initial"))
		parse_start(ps, true, loc);
	else if (!strcmp(w, "handle"))
		parse_handler(ps, loc);
	else if (!strcmp(w, "include"))
		parse_include(ps, loc);
	else if (is(ps, ":") || is(ps, "="))
		parse_rule(ps, w, loc);
	else
		flux_fail(&loc, "unknown declaration '%s'", w);
}

static char *read_all(const char *path, const struct loc *from)
{
	FILE *f = fopen(path, "rb");
	if (!f) {
		if (from)
			flux_fail(from, "cannot open %s: %s", path, strerror(errno));
		fprintf(stderr, "weft-flux: cannot open %s: %s\n", path, strerror(errno));
		return NULL;
	}
	size_t cap = 4096, n = 0;
	char *s = xmalloc(cap);
	size_t r;
	while ((r = fread(s + n, 1, cap - n - 1, f)) > 0) {
		n += r;
		if (cap - n - 1 == 0)
			s = xrealloc(s, cap *= 2);
	}
	int err = ferror(f) ? errno : 0;
	fclose(f);
	if (err) {
		struct loc l = { path, 1, 1 };
		flux_fail(from ? from : &l, "cannot read %s: %s", path, strerror(err));
	}
	s[n] = 0;
	if (strlen(s) != n) {
		struct loc l = { path, 1, 1 };
		flux_fail(&l, "the file contains a NUL byte");
	}
	return s;
}

int parse_file(struct program *p, const char *path, const struct loc *from)
{
	char real[PATH_MAX];
	const char *key = realpath(path, real) ? real : path;
	for (int i = 0; i < p->nfiles; i++)
		if (!strcmp(p->files[i], key))
			return 0; /* included once */
	*APPEND(p->files, p->nfiles) = xstrdup(key);
	char *src = read_all(path, from);
	if (!src)
		return -1;
	struct parser ps = { .p = p };
	lex_init(&ps.lx, xstrdup(path), src);
	while (ps.lx.cur.kind != T_EOF)
		parse_statement(&ps);
	return 0;
}
