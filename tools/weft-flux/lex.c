/*
 * lex.c - tokens of a .flux file: identifiers, numbers, "strings" and <strings> (for
 * include), and punctuation (`=>` and `->` are one token each). Comments are C's, both kinds.
 * Keywords are not reserved: the parser recognises them by position, so a field may be
 * called `error` or `free`. Every token carries its line, column (columns count bytes, from
 * 1) and length, which is what error messages quote, and whether it is the first on its line
 * (the parser's clue to where a statement begins, when it recovers from an error).
 *
 * The lexer reports its errors and goes on: a stray character is reported (the first of a
 * line only) and skipped, an unterminated string ends at the end of its line, an unterminated
 * comment at the end of the file. It counts them in lx->errors, so that the parser does not
 * add an error of its own about the same statement.
 */
#include <ctype.h>
#include <stdarg.h>
#include <string.h>

#include "flux.h"

void lex_init(struct lexer *lx, const char *file, const char *src)
{
	lx->file = file;
	lx->src = lx->p = lx->line_start = src;
	lx->line = 1;
	lx->errors = 0;
	lx->stray_line = 0;
	lex_next(lx);
}

static struct loc here(const struct lexer *lx)
{
	return (struct loc){ lx->file, lx->line, (int)(lx->p - lx->line_start) + 1, 0 };
}

static void lex_error(struct lexer *lx, const struct loc *loc, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void lex_error(struct lexer *lx, const struct loc *loc, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	flux_verror(loc, fmt, ap);
	va_end(ap);
	lx->errors++;
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
			start.len = 2;
			lx->p += 2;
			while (*lx->p && !(lx->p[0] == '*' && lx->p[1] == '/')) {
				if (*lx->p == '\n')
					newline(lx);
				lx->p++;
			}
			if (!*lx->p) {
				lex_error(lx, &start, "unterminated comment");
				return;
			}
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

static bool stray(unsigned char c)
{
	return c && !isalnum(c) && !isspace(c) && !strchr("_\"(),;=&:[]*</-", c);
}

static void lex_token(struct lexer *lx);

void lex_next(struct lexer *lx)
{
	int before = lx->errors;
	lex_token(lx);
	struct token *t = &lx->cur;
	t->errors_before = before;
	t->loc.len = t->kind == T_EOF ? 0 : (int)(lx->p - t->start);
	t->bol = true;
	for (const char *q = lx->line_start; q < t->start && t->bol; q++)
		t->bol = isspace((unsigned char)*q);
}

static void lex_token(struct lexer *lx)
{
	struct token *t = &lx->cur;
again:
	skip_space(lx);
	t->loc = here(lx);
	t->start = lx->p;
	const char *s = lx->p;
	unsigned char c = (unsigned char)*s;
	if (!c) {
		t->kind = T_EOF;
		t->text = "end of file";
		return;
	}
	if (stray(c) || (c == '-' && s[1] != '>')) {
		t->loc.len = 1;
		if (lx->stray_line == lx->line) /* text that is not .flux: once a line is enough */
			lx->errors++;
		else if (isprint(c))
			lex_error(lx, &t->loc, "unexpected character '%c'", c);
		else
			lex_error(lx, &t->loc, "unexpected byte 0x%02x", c);
		lx->stray_line = lx->line;
		do /* the rest of a run of them is the same mistake */
			lx->p++;
		while (stray((unsigned char)*lx->p));
		goto again;
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
		t->kind = T_STRING;
		t->text = span(s + 1, lx->p);
		if (*lx->p != '"') {
			t->loc.len = (int)(lx->p - s);
			lex_error(lx, &t->loc, "unterminated string");
			return;
		}
		lx->p++;
		return;
	}
	if ((s[0] == '=' || s[0] == '-') && s[1] == '>') {
		lx->p += 2;
		t->kind = T_PUNCT;
		t->text = span(s, lx->p);
		return;
	}
	lx->p++; /* one of (),;=&:[]*</ */
	t->kind = T_PUNCT;
	t->text = span(s, lx->p);
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
