/*
 * lex.c - tokens of a .flux file: identifiers, numbers, "strings" and <strings> (for
 * include), and punctuation (`=>` and `->` are one token each). Comments are C's, both kinds.
 * Keywords are not reserved: the parser recognises them by position, so a field may be
 * called `error` or `free`. Every token carries its line and column (columns count bytes,
 * from 1), which is what error messages quote.
 */
#include <ctype.h>
#include <string.h>

#include "flux.h"

void lex_init(struct lexer *lx, const char *file, const char *src)
{
	lx->file = file;
	lx->src = lx->p = lx->line_start = src;
	lx->line = 1;
	lex_next(lx);
}

static struct loc here(const struct lexer *lx)
{
	return (struct loc){ lx->file, lx->line, (int)(lx->p - lx->line_start) + 1 };
}

static void newline(struct lexer *lx)
{
	lx->line++;
	lx->line_start = lx->p + 1;
}

static void skip_space(struct lexer *lx)
{
	for (;;) {
		char c = *lx->p;
		if (c == '\n') {
			newline(lx);
			lx->p++;
		} else if (c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v') {
			lx->p++;
		} else if (c == '/' && lx->p[1] == '/') {
			while (*lx->p && *lx->p != '\n')
				lx->p++;
		} else if (c == '/' && lx->p[1] == '*') {
			struct loc start = here(lx);
			lx->p += 2;
			while (*lx->p && !(lx->p[0] == '*' && lx->p[1] == '/')) {
				if (*lx->p == '\n')
					newline(lx);
				lx->p++;
			}
			if (!*lx->p)
				flux_fail(&start, "unterminated comment");
			lx->p += 2;
		} else {
			return;
		}
	}
}

static char *span(const char *a, const char *b)
{
	char *s = xmalloc((size_t)(b - a) + 1);
	memcpy(s, a, (size_t)(b - a));
	s[b - a] = 0;
	return s;
}

void lex_next(struct lexer *lx)
{
	skip_space(lx);
	struct token *t = &lx->cur;
	t->loc = here(lx);
	t->start = lx->p;
	const char *s = lx->p;
	unsigned char c = (unsigned char)*s;
	if (!c) {
		t->kind = T_EOF;
		t->text = "end of file";
		return;
	}
	if (isalpha(c) || c == '_') {
		while (isalnum((unsigned char)*lx->p) || *lx->p == '_')
			lx->p++;
		t->kind = T_IDENT;
		t->text = span(s, lx->p);
		return;
	}
	if (isdigit(c)) {
		while (isalnum((unsigned char)*lx->p) || *lx->p == '_')
			lx->p++;
		t->kind = T_NUMBER;
		t->text = span(s, lx->p);
		return;
	}
	if (c == '"') {
		lx->p++;
		while (*lx->p && *lx->p != '"' && *lx->p != '\n')
			lx->p++;
		if (*lx->p != '"')
			flux_fail(&t->loc, "unterminated string");
		t->kind = T_STRING;
		t->text = span(s + 1, lx->p);
		lx->p++;
		return;
	}
	if ((s[0] == '=' || s[0] == '-') && s[1] == '>') {
		lx->p += 2;
		t->kind = T_PUNCT;
		t->text = span(s, lx->p);
		return;
	}
	if (strchr("(),;=&:[]*</", c)) {
		lx->p++;
		t->kind = T_PUNCT;
		t->text = span(s, lx->p);
		return;
	}
	if (isprint(c))
		flux_fail(&t->loc, "unexpected character '%c'", c);
	flux_fail(&t->loc, "unexpected byte 0x%02x", c);
}

char *lex_raw(struct lexer *lx)
{
	const char *a = lx->cur.start, *b = a;
	while (*b && *b != ';' && *b != '\n')
		b++;
	lx->p = b;
	while (b > a && isspace((unsigned char)b[-1]))
		b--;
	char *s = span(a, b);
	lex_next(lx);
	return s;
}
