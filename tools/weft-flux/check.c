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
 *    reported at the precedence that closes it. Each node's uses are sorted by this order.
 * 4. The graph. Every placement of a node in the flow fixes its successors: in
 *    `source S -> A -> B`, S's successor is A, A's is B and B has none; in a rule of an
 *    abstract node N, `N = A -> B`, A's successor is B and B's successors are N's own (B
 *    is "linked" to N). A node placed twice must get the same successors both times;
 *    otherwise the flow would be ambiguous, and that is an error. Links between abstract
 *    nodes are followed to their end, with a cycle check (an abstract node that expands
 *    into itself). Each edge checks types: the sender's output fields and the receiver's
 *    input fields (guards aside) must have the same C types in the same order, which also
 *    lets the run-time copy a record as bytes.
 * 5. Conditions: in `N : [c1, *, c2] = ...` test i applies to N's input field i; the
 *    condition takes one parameter, of that field's type.
 * 6. Error handlers: `handle error N -> H` needs H's inputs to be N's inputs followed by
 *    `int err`.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flux.h"

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

static struct node *need_node(struct program *p, const char *name, const struct loc *loc)
{
	int i = node_find(p, name);
	if (i < 0) {
		if (cond_find(p, name) >= 0 || guard_find(p, name) >= 0)
			flux_fail(loc, "'%s' is not a node", name);
		flux_fail(loc, "undeclared node '%s'", name);
	}
	return &p->nodes[i];
}

/* ---- 1. declarations ------------------------------------------------------------------- */

/* Generated code names its own things weft_... and WEFT_..., and refers to init and deinit. */
static void not_reserved(const char *name, const struct loc *loc)
{
	if (!strncmp(name, "weft_", 5) || !strncmp(name, "WEFT_", 5) || !strcmp(name, "init") ||
	    !strcmp(name, "deinit"))
		flux_fail(loc, "'%s' is reserved (names starting with weft_ or WEFT_, init, deinit)",
			  name);
}

static void unique_name(const char *name, const struct loc *loc, const char **seen_names,
			const struct loc *seen_locs, int n)
{
	not_reserved(name, loc);
	for (int i = 0; i < n; i++)
		if (!strcmp(seen_names[i], name))
			flux_fail(loc, "redefinition of '%s' (first declared at %d:%d)", name,
				  seen_locs[i].line, seen_locs[i].col);
}

static void unique_fields(const struct params *ps, const char *what)
{
	for (int i = 0; i < ps->n; i++)
		if (!strncmp(ps->v[i].name, "weft_", 5))
			flux_fail(&ps->v[i].loc, "'%s' is reserved (names starting with weft_)",
				  ps->v[i].name);
	for (int i = 0; i < ps->n; i++)
		for (int j = 0; j < i; j++)
			if (!strcmp(ps->v[i].name, ps->v[j].name))
				flux_fail(&ps->v[i].loc, "duplicate %s '%s'", what, ps->v[i].name);
}

static void check_names(struct program *p)
{
	int total = p->nnodes + p->nconds + p->nguards, n = 0;
	const char **names = xmalloc(sizeof *names * (size_t)(total + 1));
	struct loc *locs = xmalloc(sizeof *locs * (size_t)(total + 1));
	for (int i = 0; i < p->nnodes; i++) {
		struct node *nd = &p->nodes[i];
		unique_name(nd->name, &nd->loc, names, locs, n);
		names[n] = nd->name;
		locs[n++] = nd->loc;
		unique_fields(&nd->in, "input");
		unique_fields(&nd->out, "output");
		if (nd->abstract && nd->detached)
			flux_fail(&nd->loc, "node '%s' cannot be both abstract and detached", nd->name);
		for (int k = 0; k < nd->in.n; k++)
			if (!nd->in.v[k].guard) {
				if (k > nd->nfields)
					flux_fail(&nd->in.v[k].loc, "guards come after the input fields");
				nd->nfields++;
			}
	}
	for (int i = 0; i < p->nconds; i++) {
		struct condition *c = &p->conds[i];
		unique_name(c->name, &c->loc, names, locs, n);
		names[n] = c->name;
		locs[n++] = c->loc;
		if (c->in.n != 1)
			flux_fail(&c->loc, "condition '%s' must take exactly one parameter", c->name);
	}
	for (int i = 0; i < p->nguards; i++) {
		struct guard *g = &p->guards[i];
		unique_name(g->name, &g->loc, names, locs, n);
		names[n] = g->name;
		locs[n++] = g->loc;
		unique_fields(&g->keys, "key");
		size_t len = strlen(g->value_type);
		if (g->value_type[len - 1] != '*')
			flux_fail(&g->loc, "guard '%s' must hold a pointer type, not '%s'", g->name,
				  g->value_type);
		if (g->kind == G_POOL && g->keys.n)
			flux_fail(&g->keys.v[0].loc, "a pool guard has no key");
	}
}

/* ---- 2. guard uses ----------------------------------------------------------------------- */

static const struct param *field(const struct node *n, const char *name)
{
	for (int i = 0; i < n->in.n; i++)
		if (!n->in.v[i].guard && !strcmp(n->in.v[i].name, name))
			return &n->in.v[i];
	return NULL;
}

static void check_uses(struct program *p)
{
	for (int i = 0; i < p->nnodes; i++) {
		struct node *n = &p->nodes[i];
		for (int k = 0; k < n->in.n; k++) {
			struct param *u = &n->in.v[k];
			if (!u->guard)
				continue;
			if (n->abstract)
				flux_fail(&u->loc, "abstract node '%s' cannot take guards", n->name);
			int gi = guard_find(p, u->guard);
			if (gi < 0)
				flux_fail(&u->guard_loc, "undeclared guard '%s'", u->guard);
			struct guard *g = &p->guards[gi];
			u->guard_index = gi;
			if (g->kind == G_READWRITE && u->mode == M_DEFAULT)
				flux_fail(&u->guard_loc, "readwrite guard '%s' is taken as %s/read or "
							 "%s/write", g->name, g->name, g->name);
			if (g->kind != G_READWRITE && u->mode != M_DEFAULT)
				flux_fail(&u->guard_loc, "only readwrite guards take /read or /write; "
							 "'%s' is not one", g->name);
			if (u->nargs != g->keys.n)
				flux_fail(&u->guard_loc, "guard '%s' takes %d key argument%s, not %d",
					  g->name, g->keys.n, g->keys.n == 1 ? "" : "s", u->nargs);
			for (int a = 0; a < u->nargs; a++) {
				const struct param *f = field(n, u->args[a]);
				if (!f)
					flux_fail(&u->arg_locs[a], "'%s' is not an input field of '%s'",
						  u->args[a], n->name);
				if (strcmp(f->type, g->keys.v[a].type))
					flux_fail(&u->arg_locs[a], "guard '%s' key %d has type '%s', but "
								   "'%s' is '%s'", g->name, a + 1,
						  g->keys.v[a].type, f->name, f->type);
			}
			for (int j = 0; j < n->in.n; j++)
				if (j != k && !strcmp(n->in.v[j].name, u->name))
					flux_fail(&u->loc, "'%s' names both a field and a guard atom",
						  u->name);
			*APPEND(n->uses, n->nuses) = k;
		}
		if (n->nuses > 8)
			flux_fail(&n->loc, "node '%s' takes %d guards; at most 8", n->name, n->nuses);
	}
}

/* ---- 3. global guard order ----------------------------------------------------------------- */

static void order_guards(struct program *p)
{
	int ng = p->nguards;
	size_t nb = (size_t)ng * (size_t)ng + 1;
	char *before = memset(xmalloc(nb), 0, nb); /* before[a*ng+b]: a before b */
	for (int i = 0; i < p->nprecs; i++) {
		struct precedence *pr = &p->precs[i];
		int prev = -1;
		for (int k = 0; k < pr->n; k++) {
			int g = guard_find(p, pr->names[k]);
			if (g < 0)
				flux_fail(&pr->locs[k], "undeclared guard '%s'", pr->names[k]);
			if (prev == g)
				flux_fail(&pr->locs[k], "precedence of '%s' over itself", pr->names[k]);
			if (prev >= 0) {
				before[prev * ng + g] = 1;
				/* transitive closure, so that a cycle shows at once */
				for (int a = 0; a < ng; a++)
					for (int b = 0; b < ng; b++)
						for (int c = 0; c < ng; c++)
							if (before[a * ng + b] && before[b * ng + c])
								before[a * ng + c] = 1;
				for (int a = 0; a < ng; a++)
					if (before[a * ng + a])
						flux_fail(&pr->locs[k], "precedence cycle: '%s' would "
									"come before itself",
							  p->guards[a].name);
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
static void check_edge(const struct program *p, const struct node *from, bool use_in,
		       const struct node *to, const struct loc *loc)
{
	(void)p;
	int nf = use_in ? from->nfields : from->out.n;
	if (to->source)
		flux_fail(loc, "source '%s' cannot be the successor of '%s'", to->name, from->name);
	if (nf != to->nfields)
		flux_fail(loc, "type mismatch: '%s' %s %d field%s but '%s' takes %d", from->name,
			  use_in ? "takes" : "gives", nf, nf == 1 ? "" : "s", to->name,
			  to->nfields);
	for (int i = 0; i < nf; i++) {
		const struct param *a = use_in ? in_field(from, i) : &from->out.v[i];
		const struct param *b = in_field(to, i);
		if (strcmp(a->type, b->type))
			flux_fail(loc, "type mismatch: field %d of '%s' is '%s' (%s) but '%s' wants "
				       "'%s' (%s)", i + 1, from->name, a->type, a->name, to->name,
				  b->type, b->name);
	}
}

/* Outputs of `from` become the outputs of abstract node `to` (end of a rule). */
static void check_out_edge(const struct node *from, const struct node *to,
			   const struct loc *loc)
{
	if (from->out.n != to->out.n)
		flux_fail(loc, "type mismatch: '%s' gives %d field%s but abstract '%s' gives %d",
			  from->name, from->out.n, from->out.n == 1 ? "" : "s", to->name,
			  to->out.n);
	for (int i = 0; i < from->out.n; i++)
		if (strcmp(from->out.v[i].type, to->out.v[i].type))
			flux_fail(loc, "type mismatch: output %d of '%s' is '%s' but abstract '%s' "
				       "gives '%s'", i + 1, from->name, from->out.v[i].type,
				  to->name, to->out.v[i].type);
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
						 !memcmp(nd->next, next, sizeof(int) * (size_t)nnext));
		if (!same)
			flux_fail(loc, "node '%s' is placed twice in the flow with different "
				       "successors (first at %d:%d)", nd->name, nd->link_loc.line,
				  nd->link_loc.col);
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

static void check_starts(struct program *p)
{
	for (int i = 0; i < p->nstarts; i++) {
		struct start *s = &p->starts[i];
		struct node *first = need_node(p, s->chain[0], &s->locs[0]);
		const char *kind = s->initial ? "initial" : "source";
		if (first->abstract)
			flux_fail(&s->locs[0], "%s '%s' cannot be abstract", kind, first->name);
		if (first->source || first->initial)
			flux_fail(&s->locs[0], "'%s' is already a source or initial node", first->name);
		if (first->nfields)
			flux_fail(&s->locs[0], "%s '%s' must have no input fields", kind, first->name);
		if (s->initial)
			first->initial = true;
		else
			first->source = true;
	}
	for (int i = 0; i < p->nstarts; i++) {
		struct start *s = &p->starts[i];
		for (int k = 0; k < s->n; k++) {
			int n = node_find(p, s->chain[k]);
			if (n < 0)
				need_node(p, s->chain[k], &s->locs[k]);
			if (k + 1 < s->n) {
				int m = node_find(p, s->chain[k + 1]);
				if (m < 0)
					need_node(p, s->chain[k + 1], &s->locs[k + 1]);
				check_edge(p, &p->nodes[n], false, &p->nodes[m], &s->locs[k + 1]);
				place(p, n, 1, one(m), 1, -1, &s->locs[k]);
			} else {
				place(p, n, 1, NULL, 0, -1, &s->locs[k]);
			}
		}
	}
}

static void check_rule_tests(struct program *p, struct rule *r, struct node *t)
{
	if (r->ntests > t->nfields)
		flux_fail(&r->test_locs[t->nfields], "'%s' has %d input field%s: too many tests",
			  t->name, t->nfields, t->nfields == 1 ? "" : "s");
	for (int i = 0; i < r->ntests; i++) {
		if (!strcmp(r->tests[i], "*"))
			continue;
		int c = cond_find(p, r->tests[i]);
		if (c < 0)
			flux_fail(&r->test_locs[i], "undeclared condition '%s'", r->tests[i]);
		const struct param *f = in_field(t, i);
		if (strcmp(p->conds[c].in.v[0].type, f->type))
			flux_fail(&r->test_locs[i], "condition '%s' takes '%s' but field %d of '%s' "
						    "(%s) is '%s'", r->tests[i],
				  p->conds[c].in.v[0].type, i + 1, t->name, f->name, f->type);
	}
}

static void check_rules(struct program *p)
{
	for (int i = 0; i < p->nrules; i++) {
		struct rule *r = &p->rules[i];
		struct node *t = need_node(p, r->target, &r->loc);
		int ti = (int)(t - p->nodes);
		if (!t->abstract)
			flux_fail(&r->loc, "'%s' is not abstract: only abstract nodes have rules "
					   "(declare it 'node abstract %s')", t->name, t->name);
		check_rule_tests(p, r, t);
		*APPEND(t->rules, t->nrules) = r;
		r->elem_idx = xmalloc(sizeof(int) * (size_t)r->nelems);
		for (int k = 0; k < r->nelems; k++) {
			struct node *e = need_node(p, r->elems[k], &r->elem_locs[k]);
			r->elem_idx[k] = (int)(e - p->nodes);
			if (e == t)
				flux_fail(&r->elem_locs[k], "abstract node '%s' expands into itself",
					  t->name);
		}
		for (int k = 0; k < r->nelems; k++) {
			struct node *e = &p->nodes[r->elem_idx[k]];
			bool first = r->fan || k == 0, last = r->fan || k == r->nelems - 1;
			if (first)
				check_edge(p, t, true, e, &r->elem_locs[k]);
			if (last) {
				check_out_edge(e, t, &r->elem_locs[k]);
				place(p, r->elem_idx[k], 2, NULL, 0, ti, &r->elem_locs[k]);
			} else {
				struct node *nx = &p->nodes[r->elem_idx[k + 1]];
				check_edge(p, e, false, nx, &r->elem_locs[k + 1]);
				place(p, r->elem_idx[k], 1, one(r->elem_idx[k + 1]), 1, -1,
				      &r->elem_locs[k]);
			}
		}
	}
	for (int i = 0; i < p->nnodes; i++) {
		struct node *n = &p->nodes[i];
		if (n->abstract && !n->nrules)
			flux_fail(&n->loc, "abstract node '%s' has no rules", n->name);
	}
}

/* Follow aliases: the successors node n finally has. */
static void resolve(struct program *p, int n)
{
	struct node *nd = &p->nodes[n];
	if (nd->link != 2)
		return;
	if (nd->resolving)
		flux_fail(&nd->link_loc, "abstract node '%s' expands into itself", nd->name);
	nd->resolving = 1;
	resolve(p, nd->alias);
	struct node *a = &p->nodes[nd->alias];
	nd->next = a->next;
	nd->nnext = a->nnext;
	nd->link = 1;
	nd->resolving = 0;
}

/* A concrete node's outputs against each successor, once all are known. */
static void check_successors(struct program *p)
{
	for (int i = 0; i < p->nnodes; i++)
		resolve(p, i);
	for (int i = 0; i < p->nnodes; i++) {
		struct node *n = &p->nodes[i];
		if (n->abstract)
			continue;
		for (int k = 0; k < n->nnext; k++)
			check_edge(p, n, false, &p->nodes[n->next[k]], &n->link_loc);
	}
}

/* ---- 6. handlers ------------------------------------------------------------------------- */

static void check_handlers(struct program *p)
{
	for (int i = 0; i < p->nhandlers; i++) {
		struct handler *h = &p->handlers[i];
		struct node *n = need_node(p, h->node, &h->node_loc);
		struct node *e = need_node(p, h->handler, &h->handler_loc);
		if (n->abstract)
			flux_fail(&h->node_loc, "abstract node '%s' has no function, so no errors",
				  n->name);
		if (e->abstract || e->source)
			flux_fail(&h->handler_loc, "handler '%s' must be a plain node", e->name);
		if (n->handler >= 0)
			flux_fail(&h->loc, "node '%s' already has an error handler", n->name);
		if (e->nfields != n->nfields + 1)
			flux_fail(&h->handler_loc, "handler '%s' must take the inputs of '%s' followed "
						   "by 'int err'", e->name, n->name);
		for (int k = 0; k < n->nfields; k++)
			if (strcmp(in_field(n, k)->type, in_field(e, k)->type))
				flux_fail(&h->handler_loc, "type mismatch: input %d of handler '%s' is "
							   "'%s' but '%s' takes '%s'", k + 1,
					  e->name, in_field(e, k)->type, n->name,
					  in_field(n, k)->type);
		const struct param *last = in_field(e, n->nfields);
		if (strcmp(last->type, "int") || strcmp(last->name, "err"))
			flux_fail(&last->loc, "the last input of handler '%s' must be 'int err'",
				  e->name);
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
		if (!strcmp((*v)[i].name, name))
			flux_fail(loc, "the C name '%s' (%s) is also %s, declared at %d:%d", name, what,
				  (*v)[i].what, (*v)[i].loc.line, (*v)[i].loc.col);
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
	struct loc l = { p->main_file, 1, 1 };
	add_cname(&v, &n, xprintf("%s_flow", p->name), "the flow object", &l);
}

void check_program(struct program *p)
{
	check_names(p);
	check_c_names(p);
	check_uses(p);
	order_guards(p);
	check_starts(p);
	check_rules(p);
	check_successors(p);
	check_handlers(p);
}
