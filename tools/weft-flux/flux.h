/*
 * flux.h - weft-flux, the .flux compiler: the tokens, the syntax tree, and the passes.
 *
 * The compiler is four passes over one program: lex.c turns a file into tokens, parse.c
 * builds the tree (following `include other.flux;` into further files), check.c resolves
 * names, checks types and works out the graph (every node's successors), gen.c writes
 * x_flow.h and x_flow.c. Errors go through diag.c, which prints each with its source line
 * and counts them; every pass goes on after an error (the parser from the next statement,
 * check.c from the next declaration or use), so that one run reports every independent error.
 * A declaration that did not parse whole is kept, marked `bad`, so that its name resolves and
 * the checks that need its whole shape skip it instead of reporting what is only a consequence.
 * Code is generated only when no error was reported. Nothing is freed by the passes: driver.c
 * frees the compile's memory at once (arena.c).
 */
#ifndef FLUX_H
#define FLUX_H

#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

struct loc {
	const char *file;
	int line, col;
	int len;              /* bytes of the token there, for the ~~~ under it; 0 if unknown */
};

enum tok_kind { T_EOF, T_IDENT, T_NUMBER, T_STRING, T_PUNCT };

struct token {
	enum tok_kind kind;
	char *text;   /* identifier, number, string (without quotes) or punctuation */
	struct loc loc;
	const char *start; /* where it begins in the source */
	bool bol;          /* first on its line: where the parser looks for a statement */
	int errors_before; /* the lexer's count of errors before it read this token */
};

struct lexer {
	const char *file, *src, *p;
	int line;
	const char *line_start;
	struct token cur;
	int errors;        /* errors the lexer reported (the parser's cue not to add its own) */
	int stray_line;    /* the line of the last stray character */
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
	bool bad;             /* did not parse whole: its shape is not known */
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
	bool bad;
	struct params in;
};

struct guard {
	struct loc loc;
	char *name;
	bool bad;
	enum guard_kind kind;
	struct params keys;
	char *value_type;
	int rank;             /* position in the global order */
};

struct precedence {
	struct loc loc;
	bool bad;
	char **names;
	struct loc *locs;
	int n;
};

struct rule {             /* N : [tests] = A -> B;   or  N = A & B; */
	struct loc loc;
	bool bad;
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
	bool bad;
	bool initial;
	char **chain;         /* chain[0] is the source or initial node */
	struct loc *locs;
	int n;
};

struct handler {
	struct loc loc;
	bool bad;
	char *node, *handler;
	struct loc node_loc, handler_loc;
};

struct program {
	const char *name;       /* flow name: the file name without .flux */
	const char *main_file;  /* its base name, for the generated files' comments */
	const char *main_path;  /* as given, for locations */
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

/* ---- diagnostics (diag.c) ----------------------------------------------------------------- */

/* Start a compile: no errors yet, no sources; past the error limit, longjmp to stop. */
void diag_begin(jmp_buf *stop);
/* The text of a file, so that an error in it can quote its line. */
void diag_source(const char *file, const char *src);
int diag_errors(void);
/* Report an error at loc (`file:line:col: error: ...`, the line, a caret) and go on. */
__attribute__((format(printf, 2, 3))) void flux_error(const struct loc *loc, const char *fmt,
						      ...);
void flux_verror(const struct loc *loc, const char *fmt, va_list ap);
/* The candidate closest to word, if it is close enough to be a misspelling of it; else NULL. */
const char *flux_suggest(const char *word, const char *const *cands, int n);
/* "; did you mean 'x'?" for flux_suggest's answer, or "". */
const char *flux_hint(const char *word, const char *const *cands, int n);

/* ---- memory (arena.c) ----------------------------------------------------------------------- */

void *xmalloc(size_t n);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
char *xprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Free every allocation above: the end of a compile. */
void arena_free(void);

/* Append one element to a growing array: APPEND(arr, n) returns a pointer to the new slot. */
#define APPEND(arr, n)                                                        \
	((arr) = xrealloc((arr), sizeof *(arr) * (size_t)((n) + 1)),           \
	 memset(&(arr)[(n)], 0, sizeof *(arr)), &(arr)[(n)++])

/* ---- the command line (driver.c) ---------------------------------------------------------- */

/* Parse the arguments and run one compile: 0, 1 after errors, 2 for a usage error. */
int flux_main(int argc, char **argv);
#endif
