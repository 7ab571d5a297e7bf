/*
 * main.c - the weft-flux command line:
 *
 *   weft-flux [-o DIR] [-n NAME] x.flux     writes DIR/x_flow.h and DIR/x_flow.c
 *
 * DIR defaults to the current directory; NAME (the flow's name, x by default: the file name
 * without .flux, other characters than letters and digits made '_') names the files and the
 * flow object NAME_flow. Errors go to stderr as `file:line:col: error: message`, each followed
 * by its source line and a caret (diag.c); after any error the exit status is 1 and no file
 * is written.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flux.h"

/* Every allocation of one compile hangs on one list, freed when the compile ends: the passes
 * never free anything themselves. */
struct block {
	struct block *prev, *next;
	max_align_t align[];
};

static struct block arena = { &arena, &arena };

static void *link_block(struct block *b)
{
	if (!b) {
		fprintf(stderr, "weft-flux: out of memory\n");
		exit(2);
	}
	b->next = arena.next;
	b->prev = &arena;
	arena.next->prev = b;
	arena.next = b;
	return b->align;
}

static void arena_free(void)
{
	while (arena.next != &arena) {
		struct block *b = arena.next;
		arena.next = b->next;
		free(b);
	}
	arena.prev = &arena;
}

void *xmalloc(size_t n)
{
	return link_block(malloc(sizeof(struct block) + n));
}

void *xrealloc(void *p, size_t n)
{
	if (!p)
		return xmalloc(n);
	struct block *b = (struct block *)((char *)p - offsetof(struct block, align));
	b->prev->next = b->next;
	b->next->prev = b->prev;
	return link_block(realloc(b, sizeof(struct block) + n));
}

char *xstrdup(const char *s)
{
	size_t n = strlen(s) + 1;
	return memcpy(xmalloc(n), s, n);
}

char *xprintf(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	char *s = xmalloc((size_t)n + 1);
	va_start(ap, fmt);
	vsnprintf(s, (size_t)n + 1, fmt, ap);
	va_end(ap);
	return s;
}

static char *flow_name(const char *path)
{
	const char *base = strrchr(path, '/');
	base = base ? base + 1 : path;
	char *s = xstrdup(base);
	size_t n = strlen(s);
	if (n > 5 && !strcmp(s + n - 5, ".flux"))
		s[n - 5] = 0;
	for (char *c = s; *c; c++)
		if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9')))
			*c = '_';
	if (!*s || (*s >= '0' && *s <= '9'))
		s = xprintf("_%s", s);
	return s;
}

static int compile(const char *file, const char *dir, const char *name)
{
	static struct program p;
	static jmp_buf stop;
	memset(&p, 0, sizeof p);
	const char *base = strrchr(file, '/');
	p.main_file = base ? base + 1 : file;
	p.main_path = file;
	p.name = name ? flow_name(name) : flow_name(file);
	diag_begin(&stop);
	if (setjmp(stop))
		return 1;
	if (parse_file(&p, file, NULL))
		return 1;
	/* check.c runs after syntax errors too: it skips what depends on a declaration that did
	 * not parse whole (marked bad), and reports what does not */
	check_program(&p);
	if (diag_errors())
		return 1;
	return gen_program(&p, dir) ? 1 : 0;
}

static int usage(void)
{
	fprintf(stderr, "usage: weft-flux [-o DIR] [-n NAME] file.flux\n");
	return 2;
}

int flux_main(int argc, char **argv)
{
	const char *dir = ".", *name = NULL, *file = NULL;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "-o") && i + 1 < argc)
			dir = argv[++i];
		else if (!strcmp(argv[i], "-n") && i + 1 < argc)
			name = argv[++i];
		else if (argv[i][0] == '-' || file)
			return usage();
		else
			file = argv[i];
	}
	if (!file)
		return usage();
	int r = compile(file, dir, name);
	arena_free();
	return r;
}
