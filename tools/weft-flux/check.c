/*
 * check.c - names, types and the shape of the graph.
 *
 * 1. Declarations: every node, condition and guard name is declared once (they share one
 *    name space), field names within a record are unique.
 * 2. Guards: each use names a declared guard, in a mode its kind allows (G/read and G/write
 *    only for readwrite guards, which need one of them), with one key argument per key
 *    parameter, each an input field of the node of exactly the key's type. A guard's value
 *    type is a pointer (the run-time keeps values as pointers).
 * 3. Global guard order: declaration order, changed by `precedence A < B` (A is taken before
 *    B): a topological sort that keeps declaration order among unrelated guards. A cycle is
 *    reported at the precedence that closes it, and that precedence is left out. Each node's
 *    uses are sorted by this order.
 * 4. The graph. Every placement of a node in the flow fixes its successors: in
 *    `source S -> A -> B`, S's successor is A, A's is B and B has none; in a rule of an
 *    abstract node N, `N = A -> B`, A's successor is B and B's successors are N's own (B
 *    is "linked" to N). A node placed twice must get the same successors both times;
 *    otherwise the flow would be ambiguous, and that is an error. A chain or sequence that
 *    comes back to a node it has passed is a cycle: `cycle: S -> A -> B -> A`, at the name
 *    that closes it. Links between abstract nodes are followed to their end, with a cycle
 *    check (an abstract node that expands into itself). Each edge checks types: the sender's
 *    output fields and the receiver's input fields (guards aside) must have the same C types
 *    in the same order, which also lets the run-time copy a record as bytes. Last, a search
 *    of the whole graph finds any cycle no one statement shows (through abstract nodes'
 *    rules): a flow has none, so that every event ends.
 * 5. Conditions: in `N : [c1, *, c2] = ...` test i applies to N's input field i; the
 *    condition takes one parameter, of that field's type.
 * 6. Error handlers: `handle error N -> H` needs H's inputs to be N's inputs followed by
 *    `int err`.
 *
 * Every problem is reported and the check goes on with the next declaration or use, so
 * that one run reports them all; but one mistake gives one error. To that end a declaration
 * marked bad (it did not parse whole) still resolves by name, but the checks that need its
 * shape (types along an edge, a handler's signature, guard keys) skip it; a name declared
 * twice is reported and the later declaration dropped; an undeclared name is reported once,
 * at its first use, with the declared name it resembles; an edge to a name that did not
 * resolve is not placed; and the checks of the whole graph (edge types after the links,
 * cycles) run only when what they rest on had no error.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flux.h"

static const char **undeclared; /* names reported undeclared, each once */
static int nundeclared;
static int graph_errors;        /* placements in conflict, loops of links: no whole graph */

int node_find(const struct program *p, const char *name)
{
	for (int i = 0; i < p->nnodes; i++)
		if (!strcmp(p->nodes[i].name, name))
			return i;
	return -1;
}

static int cond_find(const struct program *p, const char *name)
{
	for (int i = 0; i < p->nconds; i++)
		if (!strcmp(p->conds[i].name, name))
			return i;
	return -1;
}

static int guard_find(const struct program *p, const char *name)
{
	for (int i = 0; i < p->nguards; i++)
		if (!strcmp(p->guards[i].name, name))
			return i;
	return -1;
}

/* False if name was reported undeclared already. */
static bool first_report(const char *name)
{
	for (int i = 0; i < nundeclared; i++)
		if (!strcmp(undeclared[i], name))
			return false;
	*APPEND(undeclared, nundeclared) = name;
	return true;
}

/* "; did you mean 'X'?" with X among the names of v[0..n): nodes, conditions or guards. */
static const char *hint(const char *word, const void *v, int n, size_t size, size_t name_at)
{
	const char **names = xmalloc(sizeof *names * (size_t)(n + 1));
	for (int i = 0; i < n; i++)
		names[i] = *(char *const *)((const char *)v + (size_t)i * size + name_at);
	return flux_hint(word, names, n);
}
#define HINT(word, v, n) hint(word, v, n, sizeof *(v), offsetof(__typeof__(*(v)), name))

static struct node *need_node(struct program *p, const char *name, const struct loc *loc)
{
	int i = node_find(p, name);
	if (i >= 0)
		return &p->nodes[i];
	if (cond_find(p, name) >= 0 || guard_find(p, name) >= 0)
		flux_error(loc, "'%s' is not a node", name);
	else if (first_report(name))
		flux_error(loc, "undeclared node '%s'%s", name, HINT(name, p->nodes, p->nnodes));
	return NULL;
}

/* ---- 1. declarations ------------------------------------------------------------------- */

/* Generated code names its own things weft_... and WEFT_..., and refers to init and deinit. */
static void not_reserved(const char *name, const struct loc *loc)
{
	if (!strncmp(name, "weft_", 5) || !strncmp(name, "WEFT_", 5) || !strcmp(name, "init") ||
	    !strcmp(name, "deinit"))
		flux_error(loc, "'%s' is reserved (names starting with weft_ or WEFT_, init, deinit)",
			   name);
}

static void unique_fields(const struct params *ps, const char *what)
{
	for (int i = 0; i < ps->n; i++)
		if (!strncmp(ps->v[i].name, "weft_", 5))
			flux_error(&ps->v[i].loc, "'%s' is reserved (names starting with weft_)",
				   ps->v[i].name);
	for (int i = 0; i < ps->n; i++)
		for (int j = 0; j < i; j++)
			if (!strcmp(ps->v[i].name, ps->v[j].name)) {
				flux_error(&ps->v[i].loc, "duplicate %s '%s'", what, ps->v[i].name);
				break;
			}
}

/* Remove the elements of v[0..*n) whose flag in dup is set. */
static void drop(void *v, int *n, size_t size, const char *dup)
{
	int k = 0;
	for (int i = 0; i < *n; i++)
		if (!dup[i])
			memmove((char *)v + (size_t)k++ * size, (char *)v + (size_t)i * size, size);
	*n = k;
}

static void check_names(struct program *p)
{
	for (int i = 0; i < p->nnodes; i++) {
		struct node *nd = &p->nodes[i];
		unique_fields(&nd->in, "input");
		unique_fields(&nd->out, "output");
		if (nd->abstract && nd->detached)
			flux_error(&nd->loc, "node '%s' cannot be both abstract and detached",
				   nd->name);
		bool after = false;
		for (int k = 0; k < nd->in.n; k++)
			if (!nd->in.v[k].guard) {
				if (k > nd->nfields && !after) {
					flux_error(&nd->in.v[k].loc,
						   "guards come after the input fields");
					after = true;
				}
				nd->nfields++;
			}
	}
	for (int i = 0; i < p->nconds; i++) {
		struct condition *c = &p->conds[i];
		if (!c->bad && c->in.n != 1)
			flux_error(&c->loc, "condition '%s' must take exactly one parameter", c->name);
	}
	for (int i = 0; i < p->nguards; i++) {
		struct guard *g = &p->guards[i];
		unique_fields(&g->keys, "key");
		size_t len = g->bad ? 0 : strlen(g->value_type);
		if (len && g->value_type[len - 1] != '*')
			flux_error(&g->loc, "guard '%s' must hold a pointer type, not '%s'", g->name,
				   g->value_type);
		if (g->kind == G_POOL && g->keys.n)
			flux_error(&g->keys.v[0].loc, "a pool guard has no key");
	}
	/* One name space. A name declared twice: the later declaration is reported and dropped;
	 * what refers to the name is checked against the first, as if the later were not there. */
	int nn = p->nnodes, nc = p->nconds, total = nn + nc + p->nguards;
	struct entry {
		const char *name;
		struct loc loc;
	} *e = xmalloc(sizeof *e * (size_t)(total + 1));
	for (int i = 0; i < nn; i++)
		e[i] = (struct entry){ p->nodes[i].name, p->nodes[i].loc };
	for (int i = 0; i < nc; i++)
		e[nn + i] = (struct entry){ p->conds[i].name, p->conds[i].loc };
	for (int i = 0; i < p->nguards; i++)
		e[nn + nc + i] = (struct entry){ p->guards[i].name, p->guards[i].loc };
	char *dup = memset(xmalloc((size_t)total + 1), 0, (size_t)total + 1);
	for (int i = 0; i < total; i++) {
		not_reserved(e[i].name, &e[i].loc);
		for (int j = 0; j < i; j++)
			if (!dup[j] && !strcmp(e[j].name, e[i].name)) {
				flux_error(&e[i].loc, "redefinition of '%s' (first declared at %d:%d)",
					   e[i].name, e[j].loc.line, e[j].loc.col);
				dup[i] = 1;
				break;
			}
	}
	drop(p->nodes, &p->nnodes, sizeof *p->nodes, dup);
	drop(p->conds, &p->nconds, sizeof *p->conds, dup + nn);
	drop(p->guards, &p->nguards, sizeof *p->guards, dup + nn + nc);
}

/* ---- 2. guard uses ----------------------------------------------------------------------- */

static const struct param *field(const struct node *n, const char *name)
{
	for (int i = 0; i < n->in.n; i++)
		if (!n->in.v[i].guard && !strcmp(n->in.v[i].name, name))
			return &n->in.v[i];
	return NULL;
}

static void check_use(struct program *p, struct node *n, struct param *u)
{
	int gi = guard_find(p, u->guard);
	if (gi < 0) {
		if (first_report(u->guard))
			flux_error(&u->guard_loc, "undeclared guard '%s'%s", u->guard,
				   HINT(u->guard, p->guards, p->nguards));
		return;
	}
	struct guard *g = &p->guards[gi];
	u->guard_index = gi;
	if (g->kind == G_READWRITE && u->mode == M_DEFAULT)
		flux_error(&u->guard_loc, "readwrite guard '%s' is taken as %s/read or %s/write",
			   g->name, g->name, g->name);
	if (g->kind != G_READWRITE && u->mode != M_DEFAULT)
		flux_error(&u->guard_loc, "only readwrite guards take /read or /write; '%s' is "
					  "not one", g->name);
	if (g->bad) {
		/* its keys are not known */
	} else if (u->nargs != g->keys.n) {
		flux_error(&u->guard_loc, "guard '%s' takes %d key argument%s, not %d", g->name,
			   g->keys.n, g->keys.n == 1 ? "" : "s", u->nargs);
	} else {
		for (int a = 0; a < u->nargs; a++) {
			const struct param *f = field(n, u->args[a]);
			if (!f)
				flux_error(&u->arg_locs[a], "'%s' is not an input field of '%s'",
					   u->args[a], n->name);
			else if (strcmp(f->type, g->keys.v[a].type))
				flux_error(&u->arg_locs[a], "guard '%s' key %d has type '%s', but "
							    "'%s' is '%s'", g->name, a + 1,
					   g->keys.v[a].type, f->name, f->type);
		}
	}
	for (int j = 0; j < n->in.n; j++)
		if (&n->in.v[j] != u && !strcmp(n->in.v[j].name, u->name)) {
			flux_error(&u->loc, "'%s' names both a field and a guard atom", u->name);
			break;
		}
	*APPEND(n->uses, n->nuses) = (int)(u - n->in.v);
}

static void check_uses(struct program *p)
{
	for (int i = 0; i < p->nnodes; i++) {
		struct node *n = &p->nodes[i];
		if (n->bad) /* a key argument may name a field that did not parse */
			continue;
		for (int k = 0; k < n->in.n; k++) {
			struct param *u = &n->in.v[k];
			if (!u->guard)
				continue;
			if (n->abstract) {
				flux_error(&u->loc, "abstract node '%s' cannot take guards", n->name);
				break;
			}
			check_use(p, n, u);
		}
		if (n->nuses > 8)
			flux_error(&n->loc, "node '%s' takes %d guards; at most 8", n->name, n->nuses);
	}
}

/* ---- 3. global guard order ----------------------------------------------------------------- */

/* `precedence ... prev < g` would close a cycle: say which, from g round to g. */
static void precedence_cycle(const struct program *p, const char *edge, const char *before,
			     int prev, int g, const struct loc *loc)
{
	int ng = p->nguards;
	const char *path = p->guards[g].name;
	for (int x = g; x != prev;) /* before[] is the closure of edge[]: follow it to prev */
		for (int y = 0; y < ng; y++)
			if (edge[x * ng + y] && (y == prev || before[y * ng + prev])) {
				path = xprintf("%s < %s", path, p->guards[y].name);
				x = y;
				break;
			}
	flux_error(loc, "precedence cycle: '%s' would come before itself (%s < %s)",
		   p->guards[g].name, path, p->guards[g].name);
}

static void order_guards(struct program *p)
{
	int ng = p->nguards;
	size_t nb = (size_t)ng * (size_t)ng + 1;
	char *edge = memset(xmalloc(nb), 0, nb);   /* edge[a*ng+b]: a precedence says a < b */
	char *before = memset(xmalloc(nb), 0, nb); /* before[a*ng+b]: a before b, transitively */
	for (int i = 0; i < p->nprecs; i++) {
		struct precedence *pr = &p->precs[i];
		if (pr->bad)
			continue;
		int prev = -1;
		for (int k = 0; k < pr->n; k++) {
			int g = guard_find(p, pr->names[k]);
			if (g < 0) {
				if (first_report(pr->names[k]))
					flux_error(&pr->locs[k], "undeclared guard '%s'%s",
						   pr->names[k], HINT(pr->names[k], p->guards, ng));
				prev = -1;
				continue;
			}
			if (prev == g) {
				flux_error(&pr->locs[k], "precedence of '%s' over itself", pr->names[k]);
				continue;
			}
			if (prev >= 0 && before[g * ng + prev]) {
				precedence_cycle(p, edge, before, prev, g, &pr->locs[k]);
			} else if (prev >= 0 && !before[prev * ng + g]) {
				edge[prev * ng + g] = 1;
				for (int a = 0; a < ng; a++)
					if (a == prev || before[a * ng + prev])
						for (int b = 0; b < ng; b++)
							if (b == g || before[g * ng + b])
								before[a * ng + b] = 1;
			}
			prev = g;
		}
	}
	p->guard_order = xmalloc(sizeof(int) * (size_t)(ng + 1));
	char *placed = memset(xmalloc((size_t)ng + 1), 0, (size_t)ng + 1);
	for (int r = 0; r < ng; r++) {
		for (int g = 0; g < ng; g++) { /* first in declaration order with nothing before */
			if (placed[g])
				continue;
			bool free_ = true;
			for (int a = 0; a < ng && free_; a++)
				if (!placed[a] && before[a * ng + g])
					free_ = false;
			if (free_) {
				placed[g] = 1;
				p->guard_order[r] = g;
				p->guards[g].rank = r;
				break;
			}
		}
	}
	for (int i = 0; i < p->nnodes; i++) { /* sort each node's uses by rank (stable) */
		struct node *n = &p->nodes[i];
		for (int a = 1; a < n->nuses; a++)
			for (int b = a; b > 0; b--) {
				int x = n->in.v[n->uses[b - 1]].guard_index;
				int y = n->in.v[n->uses[b]].guard_index;
				if (p->guards[x].rank <= p->guards[y].rank)
					break;
				int t = n->uses[b - 1];
				n->uses[b - 1] = n->uses[b];
				n->uses[b] = t;
			}
	}
}

/* ---- 4. the graph ------------------------------------------------------------------------ */

/* The i-th non-guard input field of n. */
static const struct param *in_field(const struct node *n, int i)
{
	for (int k = 0; k < n->in.n; k++)
		if (!n->in.v[k].guard && i-- == 0)
			return &n->in.v[k];
	return NULL;
}

/* Can a record of `from`'s output (or input, when use_in) feed `to`? */
static void check_edge(const struct node *from, bool use_in, const struct node *to,
		       const struct loc *loc)
{
	int nf = use_in ? from->nfields : from->out.n;
	if (to->source) {
		flux_error(loc, "source '%s' cannot be the successor of '%s'", to->name, from->name);
		return;
	}
	if (from->bad || to->bad)
		return;
	if (nf != to->nfields) {
		flux_error(loc, "type mismatch: '%s' %s %d field%s but '%s' takes %d", from->name,
			   use_in ? "takes" : "gives", nf, nf == 1 ? "" : "s", to->name,
			   to->nfields);
		return;
	}
	for (int i = 0; i < nf; i++) {
		const struct param *a = use_in ? in_field(from, i) : &from->out.v[i];
		const struct param *b = in_field(to, i);
		if (strcmp(a->type, b->type)) {
			flux_error(loc, "type mismatch: field %d of '%s' is '%s' (%s) but '%s' wants "
					"'%s' (%s)", i + 1, from->name, a->type, a->name, to->name,
				   b->type, b->name);
			return;
		}
	}
}

/* Outputs of `from` become the outputs of abstract node `to` (end of a rule). */
static void check_out_edge(const struct node *from, const struct node *to,
			   const struct loc *loc)
{
	if (from->bad || to->bad)
		return;
	if (from->out.n != to->out.n) {
		flux_error(loc, "type mismatch: '%s' gives %d field%s but abstract '%s' gives %d",
			   from->name, from->out.n, from->out.n == 1 ? "" : "s", to->name,
			   to->out.n);
		return;
	}
	for (int i = 0; i < from->out.n; i++)
		if (strcmp(from->out.v[i].type, to->out.v[i].type)) {
			flux_error(loc, "type mismatch: output %d of '%s' is '%s' but abstract '%s' "
					"gives '%s'", i + 1, from->name, from->out.v[i].type,
				   to->name, to->out.v[i].type);
			return;
		}
}

/* Place node n with successor list (link 1) or as an alias of abstract node a (link 2). */
static void place(struct program *p, int n, int link, int *next, int nnext, int alias,
		  const struct loc *loc)
{
	struct node *nd = &p->nodes[n];
	if (nd->link) {
		bool same = nd->link == link &&
			    (link == 2 ? nd->alias == alias
				       : nd->nnext == nnext &&
						 (!nnext || /* no successors: both lists NULL */
						  !memcmp(nd->next, next, sizeof(int) * (size_t)nnext)));
		if (!same) {
			flux_error(loc, "node '%s' is placed twice in the flow with different "
					"successors (first at %d:%d)", nd->name, nd->link_loc.line,
				   nd->link_loc.col);
			graph_errors++;
		}
		return;
	}
	nd->link = link;
	nd->link_loc = *loc;
	nd->next = next;
	nd->nnext = nnext;
	nd->alias = alias;
}

static int *one(int x)
{
	int *v = xmalloc(sizeof(int));
	*v = x;
	return v;
}

/* "A -> B -> C" for names[0..n). */
static const char *route(char *const *names, int n)
{
	const char *s = names[0];
	for (int k = 1; k < n; k++)
		s = xprintf("%s -> %s", s, names[k]);
	return s;
}

/* Place the sequence idx[0..n) (a chain after `source`, or a rule's right side): each node's
 * successor is the next; the last has none in a chain (abstract < 0) and the successors of
 * abstract node `abstract` in a rule. A name that did not resolve (-1) leaves the nodes beside
 * it unplaced; coming back to a node the sequence has passed is a cycle, and ends it. */
static void place_sequence(struct program *p, char *const *names, const int *idx,
			   const struct loc *locs, int n, int abstract)
{
	for (int k = 0; k < n; k++) {
		if (idx[k] < 0)
			continue;
		struct node *e = &p->nodes[idx[k]];
		if (k + 1 == n) {
			if (abstract < 0) {
				place(p, idx[k], 1, NULL, 0, -1, &locs[k]);
			} else {
				check_out_edge(e, &p->nodes[abstract], &locs[k]);
				place(p, idx[k], 2, NULL, 0, abstract, &locs[k]);
			}
			continue;
		}
		int m = idx[k + 1];
		if (m < 0)
			continue;
		for (int j = 0; j <= k; j++)
			if (idx[j] == m) {
				flux_error(&locs[k + 1], "cycle: %s", route(names, k + 2));
				return;
			}
		check_edge(e, false, &p->nodes[m], &locs[k + 1]);
		place(p, idx[k], 1, one(m), 1, -1, &locs[k]);
	}
}

static void check_starts(struct program *p)
{
	for (int i = 0; i < p->nstarts; i++) {
		struct start *s = &p->starts[i];
		struct node *first = s->n ? need_node(p, s->chain[0], &s->locs[0]) : NULL;
		if (!first)
			continue;
		const char *kind = s->initial ? "initial" : "source";
		if (first->abstract) {
			flux_error(&s->locs[0], "%s '%s' cannot be abstract", kind, first->name);
			continue;
		}
		if (first->source || first->initial) {
			flux_error(&s->locs[0], "'%s' is already a source or initial node",
				   first->name);
			continue;
		}
		if (first->nfields && !first->bad)
			flux_error(&s->locs[0], "%s '%s' must have no input fields", kind,
				   first->name);
		if (s->initial)
			first->initial = true;
		else
			first->source = true;
	}
	for (int i = 0; i < p->nstarts; i++) {
		struct start *s = &p->starts[i];
		int *idx = xmalloc(sizeof(int) * (size_t)(s->n + 1));
		for (int k = 0; k < s->n; k++) {
			idx[k] = node_find(p, s->chain[k]);
			if (idx[k] < 0 && k > 0) /* the first was looked up above */
				need_node(p, s->chain[k], &s->locs[k]);
		}
		if (!s->bad)
			place_sequence(p, s->chain, idx, s->locs, s->n, -1);
	}
}

static void check_rule_tests(struct program *p, struct rule *r, const struct node *t)
{
	bool shape = t && !t->bad;
	if (shape && r->ntests > t->nfields)
		flux_error(&r->test_locs[t->nfields], "'%s' has %d input field%s: too many tests",
			   t->name, t->nfields, t->nfields == 1 ? "" : "s");
	for (int i = 0; i < r->ntests; i++) {
		if (!strcmp(r->tests[i], "*"))
			continue;
		int c = cond_find(p, r->tests[i]);
		if (c < 0) {
			if (first_report(r->tests[i]))
				flux_error(&r->test_locs[i], "undeclared condition '%s'%s", r->tests[i],
					   HINT(r->tests[i], p->conds, p->nconds));
			continue;
		}
		if (!shape || i >= t->nfields || p->conds[c].bad || p->conds[c].in.n != 1)
			continue;
		const struct param *f = in_field(t, i);
		if (strcmp(p->conds[c].in.v[0].type, f->type))
			flux_error(&r->test_locs[i], "condition '%s' takes '%s' but field %d of '%s' "
						     "(%s) is '%s'", r->tests[i],
				   p->conds[c].in.v[0].type, i + 1, t->name, f->name, f->type);
	}
}

static void check_rules(struct program *p)
{
	for (int i = 0; i < p->nrules; i++) {
		struct rule *r = &p->rules[i];
		struct node *t = need_node(p, r->target, &r->loc);
		if (t && !t->abstract) {
			flux_error(&r->loc, "'%s' is not abstract: only abstract nodes have rules "
					    "(declare it 'node abstract %s')", t->name, t->name);
			t = NULL;
		}
		if (t)
			*APPEND(t->rules, t->nrules) = r;
		check_rule_tests(p, r, t);
		r->elem_idx = xmalloc(sizeof(int) * (size_t)(r->nelems + 1));
		for (int k = 0; k < r->nelems; k++) {
			struct node *e = need_node(p, r->elems[k], &r->elem_locs[k]);
			r->elem_idx[k] = e ? (int)(e - p->nodes) : -1;
			if (e && e == t) {
				flux_error(&r->elem_locs[k], "abstract node '%s' expands into itself",
					   t->name);
				r->elem_idx[k] = -1;
				graph_errors++;
			}
		}
		if (!t || r->bad)
			continue;
		int ti = (int)(t - p->nodes);
		for (int k = 0; k < (r->fan ? r->nelems : 1); k++) {
			if (r->elem_idx[k] < 0)
				continue;
			struct node *e = &p->nodes[r->elem_idx[k]];
			check_edge(t, true, e, &r->elem_locs[k]);
			if (r->fan) {
				check_out_edge(e, t, &r->elem_locs[k]);
				place(p, r->elem_idx[k], 2, NULL, 0, ti, &r->elem_locs[k]);
			}
		}
		if (!r->fan)
			place_sequence(p, r->elems, r->elem_idx, r->elem_locs, r->nelems, ti);
	}
	for (int i = 0; i < p->nnodes; i++) {
		struct node *n = &p->nodes[i];
		if (n->abstract && !n->nrules && !n->bad)
			flux_error(&n->loc, "abstract node '%s' has no rules", n->name);
	}
}

/* Follow aliases: the successors node n finally has. */
static void resolve(struct program *p, int n)
{
	struct node *nd = &p->nodes[n];
	if (nd->link != 2)
		return;
	if (nd->resolving) {
		/* nd's alias leads back to nd; an event goes the other way: reverse it */
		const char *path = nd->name;
		for (int x = nd->alias; x != n; x = p->nodes[x].alias)
			path = xprintf("%s -> %s", p->nodes[x].name, path);
		flux_error(&nd->link_loc, "abstract node '%s' expands into itself (%s -> %s)",
			   nd->name, nd->name, path);
		graph_errors++;
		return;
	}
	nd->resolving = 1;
	resolve(p, nd->alias);
	struct node *a = &p->nodes[nd->alias];
	nd->next = a->next;
	nd->nnext = a->nnext;
	nd->link = 1;
	nd->resolving = 0;
}

/* Where an event for node v goes: a concrete node's successors; for an abstract node, the
 * first node of each sequence and every node of each fan-out of its rules. A node on the
 * stack reached again closes a cycle, reported from the first node of the search. */
static void find_cycles_from(struct program *p, int v, char *state, char **stack, int depth)
{
	struct node *nd = &p->nodes[v];
	state[v] = 1;
	stack[depth] = nd->name;
	int n = nd->abstract ? nd->nrules : 1;
	for (int r = 0; r < n; r++) {
		const struct rule *rl = nd->abstract ? nd->rules[r] : NULL;
		if (rl && rl->bad)
			continue;
		int nw = rl ? (rl->fan ? rl->nelems : 1) : nd->nnext;
		for (int k = 0; k < nw; k++) {
			int w = rl ? rl->elem_idx[k] : nd->next[k];
			if (w < 0 || state[w] == 2)
				continue;
			if (state[w] == 1) {
				stack[depth + 1] = p->nodes[w].name;
				flux_error(rl ? &rl->elem_locs[k] : &nd->link_loc, "cycle: %s",
					   route(stack, depth + 2));
			} else {
				find_cycles_from(p, w, state, stack, depth + 1);
			}
		}
	}
	state[v] = 2;
}

static void find_cycles(struct program *p)
{
	char *state = memset(xmalloc((size_t)p->nnodes + 1), 0, (size_t)p->nnodes + 1);
	char **stack = xmalloc(sizeof(char *) * (size_t)(p->nnodes + 2));
	for (int i = 0; i < p->nstarts; i++) { /* from the sources first: the route users see */
		int v = p->starts[i].n ? node_find(p, p->starts[i].chain[0]) : -1;
		if (v >= 0 && !state[v])
			find_cycles_from(p, v, state, stack, 0);
	}
	for (int v = 0; v < p->nnodes; v++)
		if (!state[v])
			find_cycles_from(p, v, state, stack, 0);
}

/* Once all links are known: a concrete node's outputs against each successor, and cycles. */
static void check_successors(struct program *p)
{
	for (int i = 0; i < p->nnodes; i++)
		resolve(p, i);
	/* Every edge here was checked piecewise (a rule's last node against the abstract node,
	 * the abstract node against its successors): this only confirms it, and would repeat
	 * an error already reported. */
	if (!diag_errors())
		for (int i = 0; i < p->nnodes; i++) {
			struct node *n = &p->nodes[i];
			if (n->abstract)
				continue;
			for (int k = 0; k < n->nnext; k++)
				check_edge(n, false, &p->nodes[n->next[k]], &n->link_loc);
		}
	if (!graph_errors)
		find_cycles(p);
}

/* ---- 6. handlers ------------------------------------------------------------------------- */

static void check_signature(const struct handler *h, const struct node *n, const struct node *e)
{
	if (e->nfields != n->nfields + 1) {
		flux_error(&h->handler_loc, "handler '%s' must take the inputs of '%s' followed by "
					    "'int err'", e->name, n->name);
		return;
	}
	for (int k = 0; k < n->nfields; k++)
		if (strcmp(in_field(n, k)->type, in_field(e, k)->type)) {
			flux_error(&h->handler_loc, "type mismatch: input %d of handler '%s' is '%s' "
						    "but '%s' takes '%s'", k + 1, e->name,
				   in_field(e, k)->type, n->name, in_field(n, k)->type);
			return;
		}
	const struct param *last = in_field(e, n->nfields);
	if (strcmp(last->type, "int") || strcmp(last->name, "err"))
		flux_error(&last->loc, "the last input of handler '%s' must be 'int err'", e->name);
}

static void check_handlers(struct program *p)
{
	for (int i = 0; i < p->nhandlers; i++) {
		struct handler *h = &p->handlers[i];
		if (h->bad)
			continue;
		struct node *n = need_node(p, h->node, &h->node_loc);
		struct node *e = need_node(p, h->handler, &h->handler_loc);
		if (!n || !e)
			continue;
		bool ok = true;
		if (n->abstract) {
			flux_error(&h->node_loc, "abstract node '%s' has no function, so no errors",
				   n->name);
			ok = false;
		}
		if (e->abstract || e->source) {
			flux_error(&h->handler_loc, "handler '%s' must be a plain node", e->name);
			ok = false;
		}
		if (n->handler >= 0) {
			flux_error(&h->loc, "node '%s' already has an error handler", n->name);
			ok = false;
		}
		if (!n->bad && !e->bad)
			check_signature(h, n, e);
		if (ok)
			n->handler = (int)(e - p->nodes);
	}
}

/* ---- 7. the C names the generated code declares --------------------------------------------- */

struct cname {
	const char *name, *what;
	struct loc loc;
};

static void add_cname(struct cname **v, int *n, const char *name, const char *what,
		      const struct loc *loc)
{
	for (int i = 0; i < *n; i++)
		if (!strcmp((*v)[i].name, name)) {
			flux_error(loc, "the C name '%s' (%s) is also %s, declared at %d:%d", name,
				   what, (*v)[i].what, (*v)[i].loc.line, (*v)[i].loc.col);
			return;
		}
	struct cname *c = APPEND(*v, *n);
	*c = (struct cname){ name, what, *loc };
}

/* Node N declares N, N_in, N_out, N_atoms; guard G declares G_key and G_set or G_add: two
 * declarations must not make the same C name (node A_in beside node A, say). */
static void check_c_names(const struct program *p)
{
	struct cname *v = NULL;
	int n = 0;
	for (int i = 0; i < p->nnodes; i++) {
		const struct node *nd = &p->nodes[i];
		const char *d = xprintf("generated for node '%s'", nd->name);
		add_cname(&v, &n, nd->name, "a node", &nd->loc);
		add_cname(&v, &n, xprintf("%s_in", nd->name), d, &nd->loc);
		add_cname(&v, &n, xprintf("%s_out", nd->name), d, &nd->loc);
		add_cname(&v, &n, xprintf("%s_atoms", nd->name), d, &nd->loc);
	}
	for (int i = 0; i < p->nconds; i++)
		add_cname(&v, &n, p->conds[i].name, "a condition", &p->conds[i].loc);
	for (int i = 0; i < p->nguards; i++) {
		const struct guard *g = &p->guards[i];
		const char *d = xprintf("generated for guard '%s'", g->name);
		add_cname(&v, &n, xprintf("%s_key", g->name), d, &g->loc);
		add_cname(&v, &n, xprintf(g->kind == G_POOL ? "%s_add" : "%s_set", g->name), d,
			  &g->loc);
	}
	struct loc l = { p->main_path, 1, 1, 0 };
	add_cname(&v, &n, xprintf("%s_flow", p->name), "the flow object", &l);
}

void check_program(struct program *p)
{
	undeclared = NULL;
	nundeclared = 0;
	graph_errors = 0;
	check_names(p);
	check_c_names(p);
	check_uses(p);
	order_guards(p);
	check_starts(p);
	check_rules(p);
	check_successors(p);
	check_handlers(p);
}
