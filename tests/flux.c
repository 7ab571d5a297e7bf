/*
 * Tests of weft-flux, the .flux compiler, run in-process (its passes are linked into this
 * binary; each compile runs in a forked child, so that a crash is caught as a failure):
 *   - golden outputs: tests/flux/features.flux (every language feature) must compile to
 *     exactly tests/flux/features_flow.[ch].golden;
 *   - bad input: each tests/flux/bad/NAME.flux starts with one `// expect: LINE:COL: message`
 *     line per error it has, and must fail with exit 1, each `FILE:LINE:COL: error: message`
 *     on stderr and no other error (one mistake, one error), writing no file; where
 *     tests/flux/bad/NAME.err exists, stderr must be exactly that (source lines and carets
 *     included), with the file called NAME.flux;
 *   - past 20 errors the compiler stops, and says so;
 *   - docs/flows.md's example of what a node declaration generates is what it generates;
 *   - robustness: every prefix of features.flux, and garbage, compiles or fails cleanly.
 * Set FLUX_UPDATE_GOLDEN=1 to rewrite the golden files (then review the diff).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "flux.h"
#include "test.h"

static char dir[1024]; /* tests/flux */

static void find_dir(void)
{
	char a[1024];
	snprintf(a, sizeof a, "%s", test_argv0);
	snprintf(dir, sizeof dir, "%s/../../tests/flux", dirname(a));
	if (access(dir, R_OK))
		snprintf(dir, sizeof dir, "tests/flux");
	CHECK(access(dir, R_OK) == 0);
}

/* Run the compiler with args in a child; its stderr goes to err. Returns the exit status,
 * or -signal if it crashed. */
static int compile(char **args, int nargs, char *err, size_t cap)
{
	int fds[2];
	CHECK(pipe(fds) == 0);
	fflush(stdout);
	fflush(stderr);
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		dup2(fds[1], 2);
		close(fds[0]);
		char *argv[16] = { "weft-flux" };
		for (int i = 0; i < nargs && i < 14; i++)
			argv[i + 1] = args[i];
		int r = flux_main(nargs + 1, argv);
		fflush(stderr);
		_exit(r);
	}
	close(fds[1]);
	size_t n = 0;
	ssize_t r;
	char rest[4096];
	/* read to the end, keeping what fits: a child left writing to a full pipe would die of
	 * SIGPIPE */
	while ((r = n < cap - 1 ? read(fds[0], err + n, cap - 1 - n)
				: read(fds[0], rest, sizeof rest)) > 0)
		if (n < cap - 1)
			n += (size_t)r;
	err[n] = 0;
	close(fds[0]);
	int st;
	CHECK(waitpid(pid, &st, 0) == pid);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
}

static char *slurp(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	static char buf[1 << 18];
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = 0;
	return strdup(buf);
}

static void same_as_golden(const char *out, const char *golden)
{
	char *a = slurp(out), *b = slurp(golden);
	CHECK(a);
	if (getenv("FLUX_UPDATE_GOLDEN")) {
		FILE *f = fopen(golden, "w");
		CHECK(f);
		fputs(a, f);
		fclose(f);
		return;
	}
	CHECK(b);
	if (strcmp(a, b)) {
		fprintf(stderr, "%s differs from %s\n", out, golden);
		char cmd[3000];
		snprintf(cmd, sizeof cmd, "diff -u '%s' '%s' >&2", golden, out);
		if (system(cmd)) {
		}
		CHECK(0);
	}
	free(a);
	free(b);
}

TEST(golden_features)
{
	find_dir();
	char tmp[] = "/tmp/weft-flux-XXXXXX";
	CHECK(mkdtemp(tmp));
	char src[1200], err[4096];
	snprintf(src, sizeof src, "%s/features.flux", dir);
	char *args[] = { "-o", tmp, src };
	int r = compile(args, 3, err, sizeof err);
	fputs(err, stderr);
	CHECK_EQ(r, 0);
	char out[1200], golden[1200];
	const char *ext[] = { "h", "c" };
	for (int i = 0; i < 2; i++) {
		snprintf(out, sizeof out, "%s/features_flow.%s", tmp, ext[i]);
		snprintf(golden, sizeof golden, "%s/features_flow.%s.golden", dir, ext[i]);
		same_as_golden(out, golden);
	}
	/* and it is C: compile it where a compiler runs (not under qemu) */
	const char *runner = getenv("RUNNER");
	if ((!runner || !*runner) && system("command -v cc >/dev/null 2>&1") == 0) {
		char cmd[4000];
		snprintf(cmd, sizeof cmd, "cc -std=gnu11 -Wall -Wextra -Werror -fsyntax-only -I%s/../../include "
			 "-I%s %s/features_flow.c", dir, dir, tmp);
		CHECK_EQ(system(cmd), 0);
	} else {
		fprintf(stderr, "no compiler here: generated C not compiled\n");
	}
	for (int i = 0; i < 2; i++) {
		snprintf(out, sizeof out, "%s/features_flow.%s", tmp, ext[i]);
		unlink(out);
	}
	rmdir(tmp);
}

/* -n names the flow and its files; the default is the file's name, made an identifier. */
TEST(flow_name_option)
{
	find_dir();
	char tmp[] = "/tmp/weft-flux-XXXXXX";
	CHECK(mkdtemp(tmp));
	char src[1200], err[4096], path[1300];
	snprintf(src, sizeof src, "%s/rt_splay.flux", dir);
	char *args[] = { "-o", tmp, "-n", "my-flow", src };
	CHECK_EQ(compile(args, 5, err, sizeof err), 0);
	snprintf(path, sizeof path, "%s/my_flow_flow.c", tmp);
	char *c = slurp(path);
	CHECK(c && strstr(c, "weft_flow my_flow_flow = {"));
	free(c);
	unlink(path);
	snprintf(path, sizeof path, "%s/my_flow_flow.h", tmp);
	CHECK(access(path, R_OK) == 0);
	unlink(path);
	char *bad[] = { "-x" };
	CHECK_EQ(compile(bad, 1, err, sizeof err), 2); /* usage */
	rmdir(tmp);
}

/* The lines of err that report an error in file. */
static int errors_in(const char *err, const char *file)
{
	int n = 0;
	size_t len = strlen(file);
	for (const char *l = err; *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : l + strlen(l)) {
		const char *nl = strchr(l, '\n');
		const char *e = strstr(l, ": error: ");
		n += !strncmp(l, file, len) && l[len] == ':' && e && (!nl || e < nl);
	}
	return n;
}

/* s with every `from` replaced by `to` (malloc'd). */
static char *replace_all(const char *s, const char *from, const char *to)
{
	size_t lf = strlen(from), lt = strlen(to), n = 0;
	char *out = malloc(strlen(s) * (lt > lf ? lt / lf + 2 : 1) + 1);
	CHECK(out);
	for (const char *q; (q = strstr(s, from)); s = q + lf) {
		memcpy(out + n, s, (size_t)(q - s));
		n += (size_t)(q - s);
		memcpy(out + n, to, lt);
		n += lt;
	}
	strcpy(out + n, s);
	return out;
}

/* No file in dir (the output directory of a failed compile). */
static void empty_dir(const char *path)
{
	DIR *d = opendir(path);
	CHECK(d);
	int files = 0;
	for (struct dirent *e; (e = readdir(d));)
		files += e->d_name[0] != '.';
	closedir(d);
	CHECK_EQ(files, 0);
}

/* Compile tests/flux/bad/NAME.flux and check its errors against its `// expect:` lines. */
static void bad(const char *name)
{
	find_dir();
	static char err[1 << 16];
	char src[1200], want[1500];
	snprintf(src, sizeof src, "%s/bad/%s.flux", dir, name);
	char *text = slurp(src);
	CHECK(text && !strncmp(text, "// expect: ", 11));
	char tmp[] = "/tmp/weft-flux-XXXXXX";
	CHECK(mkdtemp(tmp));
	char *args[] = { "-o", tmp, src };
	int r = compile(args, 3, err, sizeof err);
	bool ok = r == 1;
	int expected = 0;
	for (char *line = text; !strncmp(line, "// expect: ", 11); expected++) {
		char *nl = strchr(line, '\n');
		CHECK(nl);
		*nl = 0;
		char *colon = strchr(line + 11, ':'); /* LINE:COL: message */
		CHECK(colon);
		colon = strchr(colon + 1, ':');
		CHECK(colon);
		*colon = 0;
		snprintf(want, sizeof want, "%s:%s: error:%s", src, line + 11, colon + 1);
		if (!strstr(err, want)) {
			fprintf(stderr, "wanted: %s\n", want);
			ok = false;
		}
		line = nl + 1;
	}
	int got = errors_in(err, src);
	if (got != expected) { /* a cascade, or an error not expected */
		fprintf(stderr, "%d errors, %d expected\n", got, expected);
		ok = false;
	}
	if (!ok) {
		fprintf(stderr, "exit %d, stderr:\n%s\n", r, err);
		CHECK(0);
	}
	/* the whole of it, where bad/NAME.err has it */
	char golden[1300], base[300];
	snprintf(golden, sizeof golden, "%s/bad/%s.err", dir, name);
	snprintf(base, sizeof base, "%s.flux", name);
	if (access(golden, R_OK) == 0) {
		char *all = replace_all(err, src, base), *g = slurp(golden);
		CHECK(g);
		if (getenv("FLUX_UPDATE_GOLDEN")) {
			FILE *f = fopen(golden, "w");
			CHECK(f);
			fputs(all, f);
			fclose(f);
		} else if (strcmp(all, g)) {
			fprintf(stderr, "stderr differs from %s:\n%s\n", golden, all);
			CHECK(0);
		}
		free(all);
		free(g);
	}
	empty_dir(tmp); /* nothing written on failure */
	rmdir(tmp);
	free(text);
}

#define BAD(name) \
	TEST(bad_##name) { bad(#name); }

BAD(syntax_missing_semicolon)
BAD(syntax_bad_char)
BAD(unterminated_comment)
BAD(undeclared_node)
BAD(undeclared_in_rule)
BAD(type_mismatch)
BAD(arity_mismatch)
BAD(precedence_cycle)
BAD(guard_key_type)
BAD(guard_key_count)
BAD(undeclared_guard)
BAD(readwrite_needs_mode)
BAD(mode_on_exclusive)
BAD(redefinition)
BAD(source_with_input)
BAD(rule_on_concrete)
BAD(condition_type)
BAD(undeclared_condition)
BAD(handler_signature)
BAD(placed_twice)
BAD(abstract_cycle)
BAD(guard_value_not_pointer)
BAD(include_missing)
BAD(include_unterminated)
BAD(reserved_name)
BAD(c_name_clash)
BAD(mixed_operators)
BAD(several_syntax)
BAD(several_semantic)
BAD(syntax_then_semantic)
BAD(misspelt_keywords)
BAD(lexer_errors)
BAD(cycle_in_chain)
BAD(cycle_in_rule)
BAD(cycle_through_rules)

/* Past 20 errors the compiler stops, says so, and writes nothing. */
TEST(error_limit)
{
	static char err[1 << 16];
	char in[] = "/tmp/weft-flux-XXXXXX", out[] = "/tmp/weft-flux-XXXXXX", src[100];
	CHECK(mkdtemp(in) && mkdtemp(out));
	snprintf(src, sizeof src, "%s/many.flux", in);
	FILE *f = fopen(src, "w");
	CHECK(f);
	for (int i = 0; i < 30; i++) /* each without its ';': 30 errors */
		fprintf(f, "node N%d () => ()\n", i);
	fclose(f);
	char *args[] = { "-o", out, src };
	CHECK_EQ(compile(args, 3, err, sizeof err), 1);
	CHECK_EQ(errors_in(err, src), 20);
	CHECK(strstr(err, "many.flux:20:1: error: expected ';' before 'node'\n"));
	CHECK(strstr(err, "\nweft-flux: too many errors (20), stopping\n"));
	empty_dir(out);
	unlink(src);
	rmdir(in);
	rmdir(out);
}

/* docs/flows.md shows what `node N (...)` generates: the node's line from its example, with
 * the guard it uses, must compile to a header that holds the C block after it verbatim. */
TEST(docs_node_example)
{
	find_dir();
	char path[1200];
	snprintf(path, sizeof path, "%s/../../docs/flows.md", dir);
	char *doc = slurp(path);
	CHECK(doc);
	char *decl = strstr(doc, "```\nnode N (");
	CHECK(decl);
	decl += 4;
	char *code = strstr(decl, "```c\n");
	CHECK(code);
	code += 5;
	char *end = strstr(code, "```");
	CHECK(end && strchr(decl, '\n'));
	*end = 0;
	*strchr(decl, '\n') = 0;
	char tmp[] = "/tmp/weft-flux-XXXXXX";
	CHECK(mkdtemp(tmp));
	char src[100], err[4096];
	snprintf(src, sizeof src, "%s/doc.flux", tmp);
	FILE *f = fopen(src, "w");
	CHECK(f);
	fprintf(f, "exclusive G (int k) => T *;\n%s\n", decl);
	fclose(f);
	char *args[] = { "-o", tmp, src };
	int r = compile(args, 3, err, sizeof err);
	fputs(err, stderr);
	CHECK_EQ(r, 0);
	snprintf(path, sizeof path, "%s/doc_flow.h", tmp);
	char *h = slurp(path);
	CHECK(h);
	if (!strstr(h, code)) {
		fprintf(stderr, "docs/flows.md shows:\n%s\nweft-flux generates:\n%s", code, h);
		CHECK(0);
	}
	free(h);
	free(doc);
	char cmd[200];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
	CHECK_EQ(system(cmd), 0);
}

/* Every prefix of a valid file, and random bytes, give exit 0 or a clean error: no crash. */
TEST(never_crashes)
{
	find_dir();
	char src[1200], err[4096];
	snprintf(src, sizeof src, "%s/features.flux", dir);
	char *text = slurp(src);
	CHECK(text);
	char tmp[] = "/tmp/weft-flux-XXXXXX";
	CHECK(mkdtemp(tmp));
	char path[1300];
	snprintf(path, sizeof path, "%s/cut.flux", tmp);
	size_t len = strlen(text);
	int step = getenv("RUNNER") && *getenv("RUNNER") ? 13 : (SLOW ? 5 : 1);
	unsigned seed = 1;
	for (size_t cut = 0; cut <= len + 200; cut += (size_t)step) {
		FILE *f = fopen(path, "w");
		CHECK(f);
		if (cut <= len) {
			fwrite(text, 1, cut, f);
		} else { /* garbage: random printable bytes and punctuation of the language */
			for (int i = 0; i < 300; i++) {
				seed = seed * 1103515245 + 12345;
				static const char alphabet[] = " \n()=>-;&:[]*</,abcGguard_node12\"#@";
				fputc(alphabet[(seed >> 16) % (sizeof alphabet - 1)], f);
			}
		}
		fclose(f);
		char *args[] = { "-o", tmp, path };
		int r = compile(args, 3, err, sizeof err);
		if (r != 0 && (r != 1 || !strstr(err, ": error: "))) {
			fprintf(stderr, "cut at %zu: exit %d: %s\n", cut, r, err);
			CHECK(0);
		}
	}
	char cmd[1400];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
	CHECK_EQ(system(cmd), 0);
	free(text);
}
