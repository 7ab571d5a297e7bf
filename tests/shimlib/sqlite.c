/*
 * sqlite inside tasks, under the shim: sqlite in its default threading mode (serialized: each
 * connection has a recursive pthread mutex) with a busy timeout, whose handler usleeps with the
 * connection's mutex held. 200 tasks query, a connection each, while another task holds the
 * database locked for 300 ms. Before the shim counted pthread locks, the usleep parked the
 * task and it resumed on another thread: the program hung, every worker in pthread_mutex_lock
 * under sqlite3_exec. Built with sqlite where sqlite3.h is installed (tests/shimlib/build.mk),
 * skipped elsewhere.
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "test.h"

#ifdef WEFT_TEST_SQLITE
#include <sqlite3.h>

enum { SQL_READERS = 200 };
static char sql_path[512];
static atomic_int sql_locked, sql_ok;

static sqlite3 *sql_open(void)
{
	sqlite3 *db;
	CHECK_EQ(sqlite3_open(sql_path, &db), SQLITE_OK);
	CHECK_EQ(sqlite3_busy_timeout(db, 30000), SQLITE_OK);
	return db;
}

static void sql_holder(void *arg)
{
	(void)arg;
	sqlite3 *db = sql_open();
	CHECK_EQ(sqlite3_exec(db, "BEGIN EXCLUSIVE; INSERT INTO t VALUES (2)", NULL, NULL, NULL),
		 SQLITE_OK);
	atomic_store(&sql_locked, 1);
	CHECK_EQ(usleep(300000), 0); /* no pthread lock held here: parks */
	CHECK_EQ(sqlite3_exec(db, "COMMIT", NULL, NULL, NULL), SQLITE_OK);
	CHECK_EQ(sqlite3_close(db), SQLITE_OK);
}

static int sql_count(void *arg, int n, char **v, char **names)
{
	(void)names;
	CHECK(n == 1 && v[0]);
	*(int *)arg = atoi(v[0]);
	return 0;
}

static void sql_reader(void *arg)
{
	(void)arg;
	sqlite3 *db = sql_open();
	while (!atomic_load(&sql_locked))
		CHECK_EQ(usleep(1000), 0);
	int rows = 0;
	char *err = NULL;
	int r = sqlite3_exec(db, "SELECT count(*) FROM t", sql_count, &rows, &err);
	if (r != SQLITE_OK)
		fprintf(stderr, "sqlite3_exec: %d %s\n", r, err ? err : "");
	CHECK_EQ(r, SQLITE_OK);
	CHECK_EQ(rows, 2); /* after the holder's commit */
	CHECK_EQ(sqlite3_close(db), SQLITE_OK);
	atomic_fetch_add(&sql_ok, 1);
}

static int sqlite_main(void *arg)
{
	(void)arg;
	snprintf(sql_path, sizeof sql_path, "%s/t.db", test_tmpdir());
	sqlite3 *db = sql_open();
	CHECK_EQ(sqlite3_exec(db, "CREATE TABLE t (x); INSERT INTO t VALUES (1)", NULL, NULL, NULL),
		 SQLITE_OK);
	CHECK_EQ(sqlite3_close(db), SQLITE_OK);
	int64_t t0 = weft_now();
	weft_task *h = weft_spawn(sql_holder, NULL), *t[SQL_READERS];
	CHECK(h);
	for (int i = 0; i < SQL_READERS; i++)
		CHECK((t[i] = weft_spawn(sql_reader, NULL)));
	for (int i = 0; i < SQL_READERS; i++)
		CHECK_EQ(weft_join(t[i]), 0);
	CHECK_EQ(weft_join(h), 0);
	CHECK_EQ(atomic_load(&sql_ok), SQL_READERS);
	fprintf(stderr, "%d sqlite readers behind a 300 ms lock: %.1f ms\n", SQL_READERS,
		(weft_now() - t0) / 1e6);
	return 0;
}
#endif

TEST(child_sqlite)
{
#ifdef WEFT_TEST_SQLITE
	alarm(120); /* the hang fails the test rather than waits for the runner's limit */
	CHECK_EQ(sqlite3_threadsafe(), 1); /* serialized, the default */
	RUN(sqlite_main);
#endif
}

TEST(sqlite_with_its_default_mutexes_and_a_busy_timeout_runs_in_tasks)
{
#ifndef WEFT_TEST_SQLITE
	test_skip("built without sqlite3.h (libsqlite3-dev)");
#endif
	test_run_shimmed("child_sqlite");
}
