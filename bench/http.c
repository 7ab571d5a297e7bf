/*
 * bench/http: wrk against examples/hello-http (one task per connection) and against nginx
 * (2 worker processes, the same response), in the same run, with 100 and 10,000 connections:
 * requests/s and p99 latency. Needs wrk and nginx (make bench-peers installs them); without
 * them it says so and measures nothing.
 */
#define _GNU_SOURCE
#include <libgen.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"

#define SECONDS "5"

static int have(const char *tool)
{
	char cmd[256];
	snprintf(cmd, sizeof cmd, "command -v %s >/dev/null 2>&1", tool);
	return system(cmd) == 0;
}

static pid_t start(char *const argv[])
{
	pid_t p = fork();
	if (p == 0) {
		execvp(argv[0], argv);
		_exit(127);
	}
	usleep(300000);
	return p;
}

static void stop(pid_t p)
{
	kill(p, SIGTERM);
	waitpid(p, NULL, 0);
}

/* Run wrk; returns requests/s and sets *p99_ms. */
static double wrk(int port, int conns, double *p99_ms)
{
	char cmd[256], line[256];
	snprintf(cmd, sizeof cmd, "wrk -t2 -c%d -d" SECONDS "s --latency http://127.0.0.1:%d/ 2>&1",
		 conns, port);
	FILE *f = popen(cmd, "r");
	double rps = 0, v;
	char unit[8];
	*p99_ms = 0;
	while (f && fgets(line, sizeof line, f)) {
		if (sscanf(line, " 99%% %lf%7s", &v, unit) == 2)
			*p99_ms = v * (unit[0] == 'u' ? 1e-3 : unit[0] == 's' ? 1e3 : 1);
		sscanf(line, "Requests/sec: %lf", &rps);
	}
	if (f)
		pclose(f);
	return rps;
}

static const char *nginx_conf(void)
{
	static char dir[] = "/tmp/weft-bench-nginx-XXXXXX";
	if (!mkdtemp(dir))
		return NULL;
	static char conf[256];
	snprintf(conf, sizeof conf, "%s/nginx.conf", dir);
	FILE *f = fopen(conf, "w");
	if (!f)
		return NULL;
	fprintf(f, "worker_processes 2;\npid %s/nginx.pid;\nerror_log %s/error.log;\n"
		   "worker_rlimit_nofile 30000;\nevents { worker_connections 20000; }\n"
		   "http { access_log off; keepalive_requests 100000000;\n"
		   "  server { listen 127.0.0.1:18181 reuseport;\n"
		   "    location / { default_type text/plain; return 200 \"Hello, World!\"; } } }\n",
		dir, dir);
	fclose(f);
	return conf;
}

static void row(const char *who, int conns, double rps, double p99)
{
	char name[64], p[64];
	snprintf(name, sizeof name, "%s, %d connections", who, conns);
	snprintf(p, sizeof p, "p99=%.2fms", p99);
	bench_emit("http", name, "req/s", rps, p);
}

int main(int argc, char **argv)
{
	(void)argc;
	if (!have("wrk") || !have("nginx")) {
		fprintf(stderr, "  http: wrk or nginx not installed (make bench-peers): skipped\n");
		return 0;
	}
	struct rlimit r;
	getrlimit(RLIMIT_NOFILE, &r);
	r.rlim_cur = r.rlim_max;
	setrlimit(RLIMIT_NOFILE, &r);
	char dir[1024], server[1100];
	snprintf(dir, sizeof dir, "%s", argv[0]);
	snprintf(server, sizeof server, "%s/../bin/hello-http", dirname(dir));
	const char *conf = nginx_conf();
	int conns[] = { 100, 10000 };
	for (int i = 0; i < 2; i++) {
		double wp99, np99;
		bench_progress(conns[i] == 100 ? "http: 100 connections" : "http: 10,000 connections");
		pid_t w = start((char *[]){ server, "18180", NULL });
		double wr = wrk(18180, conns[i], &wp99);
		stop(w);
		pid_t n = start((char *[]){ "nginx", "-c", (char *)conf, "-g", "daemon off;", NULL });
		double nr = wrk(18181, conns[i], &np99);
		stop(n);
		row("weft hello-http", conns[i], wr, wp99);
		row("nginx (2 workers)", conns[i], nr, np99);
		char p[64];
		snprintf(p, sizeof p, "%d conns target>=1", conns[i]);
		bench_emit("http", "weft / nginx requests/s", "x", nr > 0 ? wr / nr : 0, p);
		snprintf(p, sizeof p, "%d conns target<=2", conns[i]);
		bench_emit("http", "weft / nginx p99 latency", "x", np99 > 0 ? wp99 / np99 : 0, p);
	}
	if (conf) { /* nginx's scratch directory */
		char cmd[512];
		snprintf(cmd, sizeof cmd, "rm -rf \"$(dirname '%s')\"", conf);
		if (system(cmd) != 0)
			fprintf(stderr, "  http: could not remove %s\n", conf);
	}
	return 0;
}
