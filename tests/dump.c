/* Tests of the task dump: weft_dump and SIGQUIT. */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "test.h"

static weft_chan *c;

static void reader(void *arg)
{
	(void)arg;
	int v;
	CHECK_EQ(weft_chan_take(c, &v, sizeof v), -EPIPE);
}

static void napper(void *arg)
{
	(void)arg;
	weft_sleep_until(weft_now() + 10000000000LL);
}

static int dumps(void *arg)
{
	(void)arg;
	CHECK((c = weft_chan_new(0, sizeof(int))));
	weft_task *r = weft_spawn_opt(reader, NULL, &(weft_spawn_opts){ .name = "reader" });
	weft_task *n = weft_spawn_opt(napper, NULL, &(weft_spawn_opts){ .name = "napper" });
	while (weft_chan_waiting(c) < 1)
		weft_sleep_until(weft_now() + 1000000);
	weft_sleep_until(weft_now() + 3000000); /* let the napper park too */
	int p[2];
	CHECK(pipe(p) == 0);
	CHECK_EQ(weft_dump(p[1]), 3);
	close(p[1]);
	char out[4096];
	ssize_t k = read(p[0], out, sizeof out - 1);
	CHECK(k > 0);
	out[k] = 0;
	close(p[0]);
	char want[128];
	snprintf(want, sizeof want, "(reader): chan recv on %p for ", (void *)c);
	CHECK(strstr(out, want));
	CHECK(strstr(out, "(napper): sleep for "));
	CHECK(strstr(out, "(main): running"));
	CHECK(strstr(out, "spawned at "));
	CHECK_EQ(weft_dump(-1), -EBADF);
	weft_chan_close(c);
	weft_cancel(n);
	CHECK_EQ(weft_join(r), 0);
	CHECK_EQ(weft_join(n), 0);
	weft_chan_free(c);
	return 0;
}

TEST(dump_lists_tasks_and_what_they_wait_for)
{
	RUN(dumps);
	CHECK_EQ(weft_dump(1), -EINVAL); /* outside weft_run */
}

static int quits(void *arg)
{
	(void)arg;
	weft_spawn_opt(napper, NULL, &(weft_spawn_opts){ .name = "napper" });
	weft_sleep_until(weft_now() + 3000000);
	raise(SIGQUIT);
	return 0;
}

TEST(child_sigquit)
{
	weft_run(quits, NULL);
}

TEST(sigquit_prints_the_dump_and_exits_2)
{
	char cmd[512], err[4096];
	snprintf(cmd, sizeof cmd, "%s child_sigquit", test_argv0);
	CHECK_EQ(test_spawn(cmd, err, sizeof err), 2);
	CHECK(strstr(err, "weft: SIGQUIT: the live tasks"));
	CHECK(strstr(err, "(napper): sleep for "));
}
