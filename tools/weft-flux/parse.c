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
 *
 * Errors do not stop the parse. A statement that cannot be read on is given up (a longjmp
 * back to parse_statement) and the parse resumes after its ';', or where a statement visibly
 * begins: a declaration keyword, or a rule's `N =`, first on its line (keywords are not
 * reserved, so the layout tells). What the statement declared, if it got as far as the name,
 * is kept and marked bad (flux.h). A misspelt keyword (edit distance, diag.c) is reported
 * with the keyword it resembles and read as that keyword; a missing ';' before a statement
 * that visibly begins is reported and the statement taken as ended. Either way what follows
 * is read as usual, so that the names declared there are known.
 */
#define _GNU_SOURCE
#include <ctype.h>
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
	jmp_buf recover;  /* parse_statement's: a syntax error gives up on the statement */
	const char *stmt; /* where the statement being parsed begins */
	int lex_errors;   /* the lexer's count of errors before it began */
	bool reported;    /* an error in it was reported */
	bool *bad;        /* the `bad` of the declaration it makes, once it has a name */
};

#define CUR (ps->lx.cur)

static const char *const keywords[] = { "node",	  "condition", "exclusive", "readwrite",
					"pool",	  "free",      "precedence", "source",
					"initial", "handle",    "include" };
#define NKEYWORDS ((int)(sizeof keywords / sizeof *keywords))

static int keyword(const char *w)
{
	for (int k = 0; k < NKEYWORDS; k++)
		if (!strcmp(w, keywords[k]))
			return k;
	return -1;
}

/* ---- errors ------------------------------------------------------------------------------
 * One mistake, one error: once the lexer has reported something in a statement (a stray
 * character, skipped; an unterminated string), what else goes wrong in the statement is most
 * likely a consequence, and is not reported; nor is a syntax error after another error in
 * the statement (a misspelt word read as the word it resembles: the guess was likely wrong;
 * a parameter without a type: likely a part missing). */

static void report(struct parser *ps, bool syntax, const struct loc *loc, const char *fmt,
		   va_list ap)
{
	if (ps->lx.errors != ps->lex_errors || (syntax && ps->reported))
		return;
	flux_verror(loc, fmt, ap);
	ps->reported = true;
}

#define REPORT(ps, syntax, loc, fmt)              \
	do {                                      \
		va_list ap;                       \
		va_start(ap, fmt);                \
		report(ps, syntax, loc, fmt, ap); \
		va_end(ap);                       \
	} while (0)

/* A misspelt word, read on as the word it resembles: the declaration stays whole. */
__attribute__((format(printf, 3, 4))) static void guess(struct parser *ps, const struct loc *loc,
							 const char *fmt, ...)
{
	REPORT(ps, false, loc, fmt);
}

/* Wrong, but the statement can be read on; its declaration is marked bad. */
__attribute__((format(printf, 3, 4))) static void wrong(struct parser *ps, const struct loc *loc,
							 const char *fmt, ...)
{
	REPORT(ps, false, loc, fmt);
	if (ps->bad)
		*ps->bad = true;
}

/* The statement cannot be read on: parse_statement skips to the next one. */
__attribute__((noreturn, format(printf, 3, 4))) static void syntax(struct parser *ps,
								    const struct loc *loc,
								    const char *fmt, ...)
{
	REPORT(ps, true, loc, fmt);
	longjmp(ps->recover, 1);
}

/* ---- tokens ------------------------------------------------------------------------------ */

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
		syntax(ps, &CUR.loc, "expected '%s' before %s", text, describe(&CUR));
}

/* The keyword `word`, or a misspelling of it, reported and read as it. */
static void expect_word(struct parser *ps, const char *word)
{
	if (accept(ps, word))
		return;
	if (CUR.kind == T_IDENT && flux_suggest(CUR.text, &word, 1)) {
		guess(ps, &CUR.loc, "expected '%s' before '%s'; did you mean '%s'?", word, CUR.text,
		      word);
		lex_next(&ps->lx);
		return;
	}
	syntax(ps, &CUR.loc, "expected '%s' before %s", word, describe(&CUR));
}

static bool at_statement(struct parser *ps);

/* A name; not a keyword that begins the next line's statement (`source S ->` with the rest
 * of the chain missing), which is left to begin it. */
static char *ident(struct parser *ps, const char *what, struct loc *loc)
{
	if (CUR.kind != T_IDENT || (CUR.bol && at_statement(ps)))
		syntax(ps, &CUR.loc, "expected %s before %s", what, describe(&CUR));
	if (loc)
		*loc = CUR.loc;
	char *s = CUR.text;
	lex_next(&ps->lx);
	return s;
}

/* A look past the current token, on its line. */
static const char *skip_blanks(const char *q)
{
	while (*q == ' ' || *q == '\t')
		q++;
	return q;
}

/* Does a statement visibly begin here: a declaration keyword first on its line and followed
 * by a name (or an include's file), or a rule's `N :` or `N =` first on its line, or the end
 * of the file? Keywords are not reserved, so the layout is what tells a statement from a
 * node called `source` in the middle of one. */
static bool at_statement(struct parser *ps)
{
	if (CUR.kind == T_EOF)
		return true;
	if (CUR.kind != T_IDENT || !CUR.bol)
		return false;
	const char *q = skip_blanks(ps->lx.p); /* just after the identifier */
	if (keyword(CUR.text) >= 0)
		return isalpha((unsigned char)*q) || *q == '_' || *q == '<' || *q == '"';
	return *q == ':' || (*q == '=' && q[1] != '>');
}

/* The ';' that ends a statement. Where it is missing but the next statement begins (a
 * keyword, or at_statement), the statement is taken as ended: its declaration is whole. */
static void end_statement(struct parser *ps)
{
	if (accept(ps, ";"))
		return;
	if (at_statement(ps) || (CUR.kind == T_IDENT && keyword(CUR.text) >= 0)) {
		guess(ps, &CUR.loc, "expected ';' before %s", describe(&CUR));
		return;
	}
	syntax(ps, &CUR.loc, "expected ';' before %s", describe(&CUR));
}

/* After a syntax error: on to where a statement visibly begins, or past a ';' followed by
 * what may begin one (first on its line, or a keyword): a ';' followed by more of the line,
 * as in `(int ; fd) => ();`, is a stray one inside the statement. */
static void synchronise(struct parser *ps)
{
	if (CUR.start == ps->stmt) /* the error was the statement's first token */
		lex_next(&ps->lx);
	while (!at_statement(ps)) {
		bool end = is(ps, ";");
		lex_next(&ps->lx);
		if (end && (CUR.bol || CUR.kind == T_EOF ||
			    (CUR.kind == T_IDENT && keyword(CUR.text) >= 0)))
			return;
	}
}

/* ---- declarations ------------------------------------------------------------------------ */

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

/* [/read|/write] (args) as name, after `guard G`. */
static void parse_guard_use(struct parser *ps, struct param *pm)
{
	static const char *const modes[] = { "read", "write" };
	if (accept(ps, "/")) {
		struct loc l = CUR.loc;
		char *m = ident(ps, "'read' or 'write'", NULL);
		const char *c = strcmp(m, "read") && strcmp(m, "write") ? flux_suggest(m, modes, 2) : m;
		if (!c)
			wrong(ps, &l, "expected 'read' or 'write' after '/', not '%s'", m);
		else if (c != m)
			guess(ps, &l, "expected 'read' or 'write' after '/', not '%s'; did you mean '%s'?",
			      m, c);
		pm->mode = !c ? M_DEFAULT : !strcmp(c, "read") ? M_READ : M_WRITE;
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
	expect_word(ps, "as");
	pm->name = ident(ps, "the guard's atom name after 'as'", NULL);
}

/* ( [param {, param}] ) where param is `type name` or `guard G(args) as name`. A parameter is
 * added once read whole, so that a bad declaration holds only whole ones. */
static void parse_params(struct parser *ps, struct params *out, bool guards_ok)
{
	static const char *const guard_word[] = { "guard" };
	expect(ps, "(");
	if (accept(ps, ")"))
		return;
	do {
		struct param pm = { .loc = CUR.loc, .guard_index = -1 };
		bool guard = accept(ps, "guard");
		if (guard) {
			pm.guard = ident(ps, "guard name", &pm.guard_loc);
		} else {
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
				syntax(ps, &last_loc, "expected a parameter name (after its C type) "
						      "before %s", describe(&CUR));
			/* `gaurd G(x) as g`: a one-word type, and a '(' or '/' after the name */
			if (type && !strchr(type, ' ') && (is(ps, "(") || is(ps, "/")) &&
			    flux_suggest(type, guard_word, 1)) {
				guess(ps, &pm.loc, "unknown word '%s'; did you mean 'guard'?", type);
				pm.guard = last;
				pm.guard_loc = last_loc;
				guard = true;
			} else if (!type) {
				wrong(ps, &pm.loc, "parameter '%s' has no type", last);
				continue;
			} else {
				pm.type = type;
				pm.name = last;
				pm.loc = last_loc;
			}
		}
		if (guard) {
			parse_guard_use(ps, &pm);
			if (!guards_ok) {
				wrong(ps, &pm.loc, "guards are allowed only among a node's inputs");
				continue;
			}
		}
		*APPEND(out->v, out->n) = pm;
	} while (accept(ps, ","));
	expect(ps, ")");
}

static void parse_node(struct parser *ps)
{
	static const char *const modifiers[] = { "detached", "abstract" };
	bool detached = false, abstract = false;
	struct loc loc;
	char *name = NULL;
	for (;;) {
		if (accept(ps, "detached")) {
			detached = true;
		} else if (accept(ps, "abstract")) {
			abstract = true;
		} else {
			name = ident(ps, "node name", &loc);
			if (CUR.kind != T_IDENT || *skip_blanks(ps->lx.p) != '(')
				break;
			/* `node WORD NAME (`: WORD is meant as detached or abstract */
			const char *m = flux_suggest(name, modifiers, 2);
			guess(ps, &loc, "unknown node modifier '%s'%s", name,
			      m ? xprintf("; did you mean '%s'?", m) : "");
			if (m)
				*(m == modifiers[0] ? &detached : &abstract) = true;
		}
	}
	struct node *n = APPEND(ps->p->nodes, ps->p->nnodes);
	n->name = name;
	n->loc = loc;
	n->detached = detached;
	n->abstract = abstract;
	n->handler = -1;
	ps->bad = &n->bad;
	parse_params(ps, &n->in, true);
	expect(ps, "=>");
	parse_params(ps, &n->out, false);
	end_statement(ps);
}

static void parse_condition(struct parser *ps)
{
	static const char *const boolean[] = { "bool" };
	struct loc loc;
	char *name = ident(ps, "condition name", &loc);
	struct condition *c = APPEND(ps->p->conds, ps->p->nconds);
	c->name = name;
	c->loc = loc;
	ps->bad = &c->bad;
	parse_params(ps, &c->in, false);
	expect(ps, "=>");
	struct loc l = CUR.loc;
	char *t = ident(ps, "'bool'", NULL);
	if (strcmp(t, "bool")) /* what it returns is known all the same: not bad */
		guess(ps, &l, "a condition returns bool, not '%s'%s", t, flux_hint(t, boolean, 1));
	end_statement(ps);
}

static void parse_guard(struct parser *ps, enum guard_kind kind)
{
	struct loc loc;
	char *name = ident(ps, "guard name", &loc);
	struct guard *g = APPEND(ps->p->guards, ps->p->nguards);
	g->name = name;
	g->loc = loc;
	g->kind = kind;
	ps->bad = &g->bad;
	parse_params(ps, &g->keys, false);
	expect(ps, "=>");
	char *type = NULL;
	struct loc l = CUR.loc;
	while (type_token(ps)) {
		type = type_append(type, CUR.text);
		lex_next(&ps->lx);
	}
	if (!type)
		syntax(ps, &l, "expected the guard's value type before %s", describe(&CUR));
	g->value_type = type;
	end_statement(ps);
}

static void parse_precedence(struct parser *ps)
{
	struct precedence *pr = APPEND(ps->p->precs, ps->p->nprecs);
	ps->bad = &pr->bad;
	do {
		struct loc l;
		char *name = ident(ps, "guard name", &l);
		*APPEND(pr->names, pr->n) = name;
		pr->n--;
		*APPEND(pr->locs, pr->n) = l;
	} while (accept(ps, "<"));
	if (pr->n < 2)
		syntax(ps, &CUR.loc, "expected '<' before %s", describe(&CUR));
	end_statement(ps);
}

static void parse_start(struct parser *ps, bool initial, struct loc loc)
{
	struct start *s = APPEND(ps->p->starts, ps->p->nstarts);
	s->loc = loc;
	s->initial = initial;
	ps->bad = &s->bad;
	do {
		struct loc l;
		char *name = ident(ps, "node name", &l);
		*APPEND(s->chain, s->n) = name;
		s->n--;
		*APPEND(s->locs, s->n) = l;
	} while (accept(ps, "->"));
	end_statement(ps);
}

static void parse_handler(struct parser *ps, struct loc loc)
{
	struct handler *h = APPEND(ps->p->handlers, ps->p->nhandlers);
	h->loc = loc;
	ps->bad = &h->bad;
	expect_word(ps, "error");
	h->node = ident(ps, "node name", &h->node_loc);
	expect(ps, "->");
	h->handler = ident(ps, "handler node name", &h->handler_loc);
	end_statement(ps);
}

/* N [: [tests]] = expr; with N already read. */
static void parse_rule(struct parser *ps, char *target, struct loc loc)
{
	struct rule *r = APPEND(ps->p->rules, ps->p->nrules);
	r->target = target;
	r->loc = loc;
	ps->bad = &r->bad;
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
			syntax(ps, &CUR.loc, "cannot mix '->' and '&' in one rule: name the parts "
					     "with abstract nodes");
	} while (accept(ps, r->fan ? "&" : "->"));
	end_statement(ps);
}

static void parse_include(struct parser *ps, struct loc loc)
{
	if (CUR.kind == T_EOF || is(ps, ";"))
		syntax(ps, &CUR.loc, "expected a file name after 'include'");
	char *what = lex_raw(&ps->lx);
	end_statement(ps);
	size_t n = strlen(what);
	if (what[0] == '<' || what[0] == '"') {
		char close = what[0] == '<' ? '>' : '"';
		if (n < 3 || what[n - 1] != close)
			wrong(ps, &loc, "a C header is included as <x.h> or \"x.h\"");
		else
			*APPEND(ps->p->cincludes, ps->p->ncincludes) = what;
		return;
	}
	if (n < 6 || strcmp(what + n - 5, ".flux")) {
		wrong(ps, &loc, "include expects a .flux file, or a C header as <x.h> or \"x.h\"");
		return;
	}
	char *path = what;
	if (what[0] != '/') {
		char *d = xstrdup(ps->lx.file);
		path = xprintf("%s/%s", dirname(d), what);
	}
	parse_file(ps->p, path, &loc);
}

static void parse_statement(struct parser *ps)
{
	ps->stmt = CUR.start;
	ps->lex_errors = CUR.errors_before; /* an error in lexing its first token is its own */
	ps->reported = false;
	ps->bad = NULL;
	if (setjmp(ps->recover)) {
		if (ps->bad)
			*ps->bad = true;
		synchronise(ps);
		return;
	}
	struct loc loc = CUR.loc;
	if (CUR.kind != T_IDENT)
		syntax(ps, &loc, "expected a declaration before %s", describe(&CUR));
	char *w = CUR.text;
	lex_next(&ps->lx);
	int k = keyword(w);
	if (k >= 0 && !strcmp(w, "free") && CUR.kind != T_IDENT)
		k = -1; /* `free = A;` is a rule of a node called free */
	if (k < 0 && (is(ps, ":") || is(ps, "="))) {
		parse_rule(ps, w, loc);
	} else {
		if (k < 0) {
			const char *m = flux_suggest(w, keywords, NKEYWORDS);
			if (!m)
				syntax(ps, &loc, "unknown declaration '%s'", w);
			guess(ps, &loc, "unknown declaration '%s'; did you mean '%s'?", w, m);
			k = keyword(m);
		}
		const char *kw = keywords[k];
		if (!strcmp(kw, "node"))
			parse_node(ps);
		else if (!strcmp(kw, "condition"))
			parse_condition(ps);
		else if (!strcmp(kw, "exclusive"))
			parse_guard(ps, G_EXCLUSIVE);
		else if (!strcmp(kw, "readwrite"))
			parse_guard(ps, G_READWRITE);
		else if (!strcmp(kw, "pool"))
			parse_guard(ps, G_POOL);
		else if (!strcmp(kw, "free"))
			parse_guard(ps, G_FREE);
		else if (!strcmp(kw, "precedence"))
			parse_precedence(ps);
		else if (!strcmp(kw, "source"))
			parse_start(ps, false, loc);
		else if (!strcmp(kw, "initial"))
			parse_start(ps, true, loc);
		else if (!strcmp(kw, "handle"))
			parse_handler(ps, loc);
		else
			parse_include(ps, loc);
	}
	if (ps->bad && ps->lx.errors != ps->lex_errors)
		*ps->bad = true; /* a stray character skipped: its shape is not what was meant */
}

static char *read_all(const char *path, const struct loc *from)
{
	FILE *f = fopen(path, "rb");
	if (!f) {
		if (from)
			flux_error(from, "cannot open %s: %s", path, strerror(errno));
		else
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
	struct loc l = { path, 1, 1, 0 };
	if (err) {
		flux_error(from ? from : &l, "cannot read %s: %s", path, strerror(err));
		return NULL;
	}
	s[n] = 0;
	if (strlen(s) != n) {
		flux_error(&l, "the file contains a NUL byte");
		return NULL;
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
	const char *file = xstrdup(path);
	diag_source(file, src);
	lex_init(&ps.lx, file, src);
	while (ps.lx.cur.kind != T_EOF)
		parse_statement(&ps);
	return 0;
}
