/*
 * arena.c - the compiler's memory. Every allocation of one compile hangs on one list, freed
 * at once when the compile ends (arena_free, called by driver.c): the passes never free
 * anything themselves, so the syntax tree, the checked graph and every string in between can
 * point at each other freely. A compile is short and its input small; freeing piece by piece
 * would buy nothing but the chance of a use after free. Out of memory ends the program with
 * status 2.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flux.h"

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

/* Free everything allocated since the last call. */
void arena_free(void)
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
