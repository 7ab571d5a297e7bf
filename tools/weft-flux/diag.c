/*
 * diag.c - the compiler's errors, printed as C compilers print theirs:
 *
 *   flow.flux:4:1: error: unknown declaration 'sorce'; did you mean 'source'?
 *   sorce S -> A;
 *   ^~~~~
 *
 * the message, then the source line (as it is, tabs kept, so that the caret lines up under
 * the same tabs) and a caret at the column, with ~ under the rest of the token. A location in
 * a file that was not registered with diag_source (one that could not be read) is printed
 * without a line.
 *
 * Reporting an error does not stop the compile: the passes go on and the compile fails at
 * the end if any error was reported. It stops early only after MAX_ERRORS errors, by a
 * longjmp to the jmp_buf given to diag_begin. The counts are per compile (diag_begin resets
 * them); the memory is the compile's arena.
 */
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "flux.h"

/* As many as a screen shows: past that they are rarely independent of the first ones. */
#define MAX_ERRORS 20

static jmp_buf *stop;
static int errors;
static struct source {
	const char *file, *src;
} *sources;
static int nsources;

void diag_begin(jmp_buf *on_stop)
{
	stop = on_stop;
	errors = 0;
	sources = NULL;
	nsources = 0;
}

void diag_source(const char *file, const char *src)
{
	*APPEND(sources, nsources) = (struct source){ file, src };
}

int diag_errors(void)
{
	return errors;
}

static const char *line_of(const struct loc *loc)
{
	for (int i = 0; i < nsources; i++) {
		if (strcmp(sources[i].file, loc->file))
			continue;
		const char *s = sources[i].src;
		for (int l = 1; l < loc->line && s; l++) {
			s = strchr(s, '\n');
			s = s ? s + 1 : NULL;
		}
		return s;
	}
	return NULL;
}

/* The line, then spaces up to the column (a tab where the line has one, nothing for the
 * continuation bytes of UTF-8: columns count bytes) and ^~~~ under the token. */
static void quote(const struct loc *loc)
{
	const char *s = line_of(loc);
	if (!s || loc->line < 1 || loc->col < 1)
		return;
	int n = 0;
	while (s[n] && s[n] != '\n')
		n++;
	int shown = n > 0 && s[n - 1] == '\r' ? n - 1 : n;
	fprintf(stderr, "%.*s\n", shown, s);
	for (int i = 0; i < loc->col - 1 && i < shown; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c == '\t')
			fputc('\t', stderr);
		else if ((c & 0xc0) != 0x80)
			fputc(' ', stderr);
	}
	fputc('^', stderr);
	for (int i = loc->col; i < loc->col - 1 + loc->len && i < shown; i++)
		fputc('~', stderr);
	fputc('\n', stderr);
}

void flux_verror(const struct loc *loc, const char *fmt, va_list ap)
{
	fflush(stdout);
	fprintf(stderr, "%s:%d:%d: error: ", loc->file, loc->line, loc->col);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	quote(loc);
	if (++errors >= MAX_ERRORS) {
		fprintf(stderr, "weft-flux: too many errors (%d), stopping\n", errors);
		longjmp(*stop, 1);
	}
}

void flux_error(const struct loc *loc, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	flux_verror(loc, fmt, ap);
	va_end(ap);
}

/* Optimal string alignment distance, ignoring case: insertions, deletions, substitutions and
 * swaps of two neighbours (the commonest slips: "soruce") cost one each. */
static int distance(const char *a, const char *b)
{
	int la = (int)strlen(a), lb = (int)strlen(b);
	int *prev2 = xmalloc(sizeof(int) * (size_t)(lb + 1));
	int *prev = xmalloc(sizeof(int) * (size_t)(lb + 1));
	int *cur = xmalloc(sizeof(int) * (size_t)(lb + 1));
	for (int j = 0; j <= lb; j++)
		prev[j] = j;
	for (int i = 1; i <= la; i++) {
		cur[0] = i;
		for (int j = 1; j <= lb; j++) {
			int ca = tolower((unsigned char)a[i - 1]), cb = tolower((unsigned char)b[j - 1]);
			int d = prev[j - 1] + (ca != cb);
			if (prev[j] + 1 < d)
				d = prev[j] + 1;
			if (cur[j - 1] + 1 < d)
				d = cur[j - 1] + 1;
			if (i > 1 && j > 1 && ca == tolower((unsigned char)b[j - 2]) &&
			    tolower((unsigned char)a[i - 2]) == cb && prev2[j - 2] + 1 < d)
				d = prev2[j - 2] + 1;
			cur[j] = d;
		}
		int *t = prev2;
		prev2 = prev;
		prev = cur;
		cur = t;
	}
	return prev[lb];
}

/* A third of the word's letters may be wrong: one in "sorce", two in "detahced"; a word of one
 * or two letters is too short to tell a slip from another name (A for B). */
const char *flux_suggest(const char *word, const char *const *cands, int n)
{
	int best = (int)strlen(word) / 3 + 1, found = -1;
	for (int i = 0; i < n; i++) {
		if (!strcmp(cands[i], word))
			continue;
		int d = distance(word, cands[i]);
		if (d < best) {
			best = d;
			found = i;
		}
	}
	return found < 0 ? NULL : cands[found];
}

const char *flux_hint(const char *word, const char *const *cands, int n)
{
	const char *s = flux_suggest(word, cands, n);
	return s ? xprintf("; did you mean '%s'?", s) : "";
}
