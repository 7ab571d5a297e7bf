/*
 * idle.c - the idle-connections mode (-I N): the broker's RSS per connection. The connections
 * are spread over as many processes as the descriptor limit asks, opened one process after the
 * other, held until the parent has read the RSS.
 */
#define _GNU_SOURCE
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "loadgen.h"

/* One process's share of the idle connections: connect, say so on `ready`, hold them until
 * `hold` is closed. */
static void idle_child(int share, int ready, int hold)
{
	char c = 1;
	opt.npub = 0;
	opt.nsub = share;
	connect_all();
	wait_ready();
	if (count_where(subs, opt.nsub, 2) == 0 && write(ready, &c, 1) < 0)
		_exit(1);
	while (read(hold, &c, 1) > 0)
		;
	stop_workers();
	_exit(0);
}

/* Idle connections are spread over as many processes as the descriptor limit asks (it cannot
 * be raised without CAP_SYS_RESOURCE). */
int run_idle(void)
{
	struct rlimit rl;
	getrlimit(RLIMIT_NOFILE, &rl);
	int per = (int)((rl.rlim_cur - 64) / 3), nproc = (opt.idle + per - 1) / per;
	int hold[2];
	if (pipe(hold))
		die("pipe failed");
	long rss0 = opt.broker_pid ? broker_rss_kb() : -1;
	int64_t t0 = now_ns();
	pid_t kids[64];
	int up = 0;
	if (nproc > 64)
		die("too many idle connections for the descriptor limit");
	/* One process after the other: two connecting at once overflow the accept queue. */
	for (int i = 0, left = opt.idle; i < nproc; i++) {
		int share = left / (nproc - i), ready[2];
		char c;
		left -= share;
		if (pipe(ready))
			die("pipe failed");
		if ((kids[i] = fork()) == 0) {
			close(ready[0]), close(hold[1]);
			size_t len = strlen(opt.prefix);
			snprintf(opt.prefix + len, sizeof opt.prefix - len, "i%d", i);
			idle_child(share, ready[1], hold[0]);
		}
		close(ready[1]);
		if (read(ready[0], &c, 1) == 1)
			up++;
		close(ready[0]);
	}
	close(hold[0]);
	double conn_s = (double)(now_ns() - t0) / 1e9;
	usleep(500000); /* let the broker settle its buffers */
	long rss1 = opt.broker_pid ? broker_rss_kb() : -1;
	if (opt.duration > 0.5)
		usleep((useconds_t)((opt.duration - 0.5) * 1e6));
	close(hold[1]);
	int failed = 0, st;
	for (int i = 0; i < nproc; i++)
		if (waitpid(kids[i], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st))
			failed++;
	if (up < nproc)
		fprintf(stderr, "mqtt-loadgen: %d of %d processes could not connect all theirs\n",
			nproc - up, nproc);
	printf("connections=%d processes=%d failed=%d connect_s=%.3f rss_before_kb=%ld "
	       "rss_after_kb=%ld rss_per_conn_bytes=%.0f\n", opt.idle, nproc, failed, conn_s, rss0,
	       rss1, (double)(rss1 - rss0) * 1024 / opt.idle);
	fflush(stdout);
	fprintf(stderr, "    %d idle connections in %.2f s; broker RSS %ld -> %ld KiB (%.0f bytes each)\n",
		opt.idle, conn_s, rss0, rss1, (double)(rss1 - rss0) * 1024 / opt.idle);
	return failed || up < nproc ? 1 : 0;
}
