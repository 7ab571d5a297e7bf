/*
 * driver.c - the weft-flux command line, and one compile: it runs the passes in order (parse,
 * check, generate) and frees the compile's memory after them (arena.c).
 *
 *   weft-flux [-o DIR] [-n NAME] x.flux     writes DIR/x_flow.h and DIR/x_flow.c
 *
 * DIR defaults to the current directory; NAME (the flow's name, x by default: the file name
 * without .flux, other characters than letters and digits made '_') names the files and the
 * flow object NAME_flow. Errors go to stderr as `file:line:col: error: message`, each followed
 * by its source line and a caret (diag.c); after any error the exit status is 1 and no file
 * is written.
 *
 * main() itself is in weft-flux.c, alone: tests/flux.c links every other file of the compiler
 * and calls flux_main in a child process for each case, as the command line would run it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flux.h"

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
