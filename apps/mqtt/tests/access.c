/* Tests of access.c in process: after a reload of acl_file, a session's binding is replaced by
 * whichever task uses it first (a compare-and-swap, the old one freed through epoch.c), so
 * every check made once the reload has returned follows the new rules, in every task, while
 * other tasks race to rebind the same session. Run under ASan and TSan as well: no binding is
 * used after it is freed, none leaks, no race. */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <weft.h>

#include "access.h"
#include "acl.h"
#include "conf.h"
#include "epoch.h"
#include "msg.h"
#include "pool.h"
#include "records.h"
#include "stats.h"
#include "test.h"

void pool_fini(void);
void stats_fini(void);

static char file_x[200], file_y[200]; /* conf.acl_file takes 255 */

static void write_file(char *path, const char *name, const char *text)
{
	snprintf(path, sizeof file_x, "%s/%s", test_tmpdir(), name);
	FILE *f = fopen(path, "w");
	CHECK(f);
	fputs(text, f);
	fclose(f);
}

/* The reloads' count, odd while one is under way; even k: file_x in force when k % 4 == 0,
 * file_y when k % 4 == 2. */
static atomic_long phase;
static atomic_int stop_readers;
static atomic_long checked;
static session *s;
static msg *mx, *my;

static bool x_in_force(long p)
{
	return p % 4 == 0;
}

/* Checks s's read access from a task that never reloads: a check between two looks at `phase`
 * that see the same even value was made with no reload under way, after the last one returned,
 * and must follow that file. */
static void reader(void *arg)
{
	(void)arg;
	epoch_reader rd = { 0 };
	epoch_register(&rd);
	while (!atomic_load(&stop_readers)) {
		long p1 = atomic_load(&phase);
		epoch_enter(&rd);
		bool rx = access_read(s, mx), ry = access_read(s, my);
		epoch_leave(&rd);
		long p2 = atomic_load(&phase);
		if (p1 == p2 && p1 % 2 == 0) {
			if (rx != x_in_force(p1) || ry == x_in_force(p1))
				fprintf(stderr, "phase %ld: x %d y %d\n", p1, rx, ry);
			CHECK_EQ(rx, x_in_force(p1));
			CHECK_EQ(ry, !x_in_force(p1));
			atomic_fetch_add(&checked, 1);
		}
		weft_yield();
	}
	epoch_unregister(&rd);
}

static int rebind_main(void *arg)
{
	(void)arg;
	conf_defaults(&conf);
	pool_init();
	stats_init();
	write_file(file_x, "x.acl", "user u\ntopic read x/#\npattern read own/%c\n");
	write_file(file_y, "y.acl", "user u\ntopic read y/#\npattern read own/%c\n");
	snprintf(conf.acl_file, sizeof conf.acl_file, "%s", file_x);
	CHECK_EQ(access_load(true), 0);
	CHECK(access_acl_on);
	s = calloc(1, sizeof *s);
	CHECK(s);
	s->client_id = strdup("dev1");
	s->id_len = 4;
	access_bind(s, "u", 1);
	mx = msg_new("x/1", 3, NULL, "p", 1, 0, 0, 0);
	my = msg_new("y/1", 3, NULL, "p", 1, 0, 0, 0);
	msg *own = msg_new("own/dev1", 8, NULL, "p", 1, 0, 0, 0);
	epoch_reader rd = { 0 };
	epoch_register(&rd);
	weft_task *r[3];
	for (int i = 0; i < 3; i++)
		r[i] = weft_spawn(reader, NULL);
	int reloads = SLOW ? 100 : 1000;
	for (int k = 1; k <= reloads; k++) {
		atomic_fetch_add(&phase, 1); /* odd: under way */
		snprintf(conf.acl_file, sizeof conf.acl_file, "%s", k % 2 ? file_y : file_x);
		CHECK_EQ(access_load(false), 0);
		atomic_fetch_add(&phase, 1);
		long p = atomic_load(&phase);
		/* this task too, which did not bind s: the new rules, at once */
		epoch_enter(&rd);
		CHECK_EQ(access_read(s, mx), x_in_force(p));
		CHECK_EQ(access_read(s, my), !x_in_force(p));
		CHECK(access_read(s, own)); /* the same client id, substituted again */
		epoch_leave(&rd);
		for (int i = 0; i < 3; i++)
			weft_yield();
		if (k % 64 == 0)
			epoch_collect(0);
	}
	atomic_store(&stop_readers, 1);
	for (int i = 0; i < 3; i++)
		weft_join(r[i]);
	epoch_unregister(&rd);
	fprintf(stderr, "%ld checks by the readers\n", atomic_load(&checked));
	CHECK(atomic_load(&checked) > 0);
	access_unbind(s);
	epoch_collect(1);
	acl_clear();
	msg_unref(mx);
	msg_unref(my);
	msg_unref(own);
	free(s->client_id);
	free(s);
	stats_fini();
	pool_fini();
	return 0;
}

TEST(reload_rebinds_where_the_binding_is_used)
{
	RUN(rebind_main);
}
