/*
 * flux.h - weft-flux, the .flux compiler: the tokens, the syntax tree, and the passes.
 *
 * The compiler is four passes over one program: lex.c turns a file into tokens, parse.c
 * builds the tree (following `include other.flux;` into further files), check.c resolves
 * names, checks types and works out the graph (every node's successors), gen.c writes
 * x_flow.h and x_flow.c. The first error stops the compiler: it is printed as
 * `file:line:col: error: message` and flux_fail jumps back to flux_main, which returns 1.
 * Nothing is freed: the process is short-lived.
 */
#ifndef FLUX_H
#define FLUX_H

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

struct loc {
	const char *file;
	int line, col;
};

enum tok_kind { T_EOF, T_IDENT, T_NUMBER, T_STRING, T_PUNCT };

struct token {
	enum tok_kind kind;
	char *text;   /* identifier, number, string (without quotes) or punctuation */
	struct loc loc;
	const char *start; /* where it begins in the source */
};

struct lexer {
	const char *file, *src, *p;
	int line;
	const char *line_start;
	struct token cur;
};

void lex_init(struct lexer *lx, const char *file, const char *src);
void lex_next(struct lexer *lx);       /* advance lx->cur */
/* The raw text from the current token up to (not including) the next ';' on its line,
 * trimmed; lx->cur becomes that ';' (or whatever ends the line). */
char *lex_raw(struct lexer *lx);

/* ---- the tree ---------------------------------------------------------------------------- */

enum guard_kind { G_EXCLUSIVE = 1, G_READWRITE, G_POOL, G_FREE };
enum guard_mode { M_DEFAULT, M_READ, M_WRITE };

struct param {            /* `int a` or `guard G(a) as g` */
	struct loc loc;
	char *type;           /* normalised C type text; NULL for a guard use */
	char *name;           /* field name, or the atom name after `as` */
	/* guard uses */
	char *guard;
	struct loc guard_loc;
	enum guard_mode mode;
	char **args;
	struct loc *arg_locs;
	int nargs;
	int guard_index;      /* resolved by check.c */
};

struct params {
	struct param *v;
	int n;
};

struct node {
	struct loc loc;
	char *name;
	bool detached, abstract, source, initial;
	struct params in, out;
	int nfields;          /* inputs that are not guards */
	/* graph, worked out by check.c */
	int link;             /* 0 unset, 1 list, 2 same successors as the abstract node `alias` */
	struct loc link_loc;
	int *next, nnext;
	int alias;
	int resolving;        /* cycle check of aliases */
	int handler;          /* -1 or the node handling this node's errors */
	int *uses, nuses;     /* indices in `in` of guard uses, sorted by the global guard order */
	struct rule **rules;  /* an abstract node's rules, in order */
	int nrules;
};

struct condition {
	struct loc loc;
	char *name;
	struct params in;
};

struct guard {
	struct loc loc;
	char *name;
	enum guard_kind kind;
	struct params keys;
	char *value_type;
	int rank;             /* position in the global order */
};

struct precedence {
	struct loc loc;
	char **names;
	struct loc *locs;
	int n;
};

struct rule {             /* N : [tests] = A -> B;   or  N = A & B; */
	struct loc loc;
	char *target;
	char **tests;         /* condition names, "*" for any */
	struct loc *test_locs;
	int ntests;
	bool fan;
	char **elems;
	struct loc *elem_locs;
	int nelems;
	int *elem_idx;        /* resolved */
};

struct start {            /* source S -> A -> B;   initial I; */
	struct loc loc;
	bool initial;
	char **chain;         /* chain[0] is the source or initial node */
	struct loc *locs;
	int n;
};

struct handler {
	struct loc loc;
	char *node, *handler;
	struct loc node_loc, handler_loc;
};

struct program {
	const char *name;       /* flow name: the file name without .flux */
	const char *main_file;
	char **cincludes;       /* include <x.h> / include "x.h" */
	int ncincludes;
	char **files;           /* .flux files read, for include-once */
	int nfiles;
	struct node *nodes;
	int nnodes;
	struct condition *conds;
	int nconds;
	struct guard *guards;
	int nguards;
	struct precedence *precs;
	int nprecs;
	struct rule *rules;
	int nrules;
	struct start *starts;
	int nstarts;
	struct handler *handlers;
	int nhandlers;
	int *guard_order;       /* guards by rank */
};

/* ---- passes ------------------------------------------------------------------------------ */

int parse_file(struct program *p, const char *path, const struct loc *from);
void check_program(struct program *p);
int gen_program(const struct program *p, const char *dir);

int node_find(const struct program *p, const char *name);

/* Report an error at loc and stop the compiler. */
__attribute__((noreturn, format(printf, 2, 3))) void flux_fail(const struct loc *loc,
							       const char *fmt, ...);
void *xmalloc(size_t n);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
char *xprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Append one element to a growing array: APPEND(arr, n) returns a pointer to the new slot. */
#define APPEND(arr, n)                                                        \
	((arr) = xrealloc((arr), sizeof *(arr) * (size_t)((n) + 1)),           \
	 memset(&(arr)[(n)], 0, sizeof *(arr)), &(arr)[(n)++])

int flux_main(int argc, char **argv);
#endif
