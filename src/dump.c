/*
 * dump.c - a line for every live task, as Go's goroutine dump: weft_dump(fd), SIGQUIT, and
 * the deadlock report.
 *
 *   task 12 (conn): chan recv on 0x55d0c0a1c2a0 for 153 ms, spawned at ./server+0x1a2b
 *
 * It walks the stack slots (stack.c), reading task records that other workers may be
 * changing: a line may be a moment out of date, never unsafe to read, since slots stay mapped
 * until weft_run ends. Output goes through snprintf into a local buffer and raw write(2), so
 * it also works from the SIGQUIT handler (best effort, as any dump of a running program).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched.h"
#include "stack.h"
#include "sys.h"
#include "task.h"
#include "weft.h"

struct dump {
	int fd, max, seen;
	int64_t now;
};

static const char *state_name(int s)
{
	switch (s) {
	case TASK_RUNNABLE:
		return "runnable";
	case TASK_RUNNING:
		return "running";
	case TASK_DONE:
		return "finished, not joined";
	default:
		return "parked";
	}
}

/* "prog+0x1a2b": where the spawn call was, for addr2line. */
static void where(void *pc, char *out, size_t cap)
{
	Dl_info di;
	if (pc && dladdr(pc, &di) && di.dli_fname)
		snprintf(out, cap, "%s+%#lx", di.dli_fname,
			 (unsigned long)((char *)pc - (char *)di.dli_fbase));
	else
		snprintf(out, cap, "%p", pc);
}

static void dump_one(struct stack *s, void *ctx)
{
	struct dump *d = ctx;
	weft_task *t = (weft_task *)s;
	if (d->seen++ >= d->max)
		return;
	char line[512], at[256];
	where(t->spawned_at, at, sizeof at);
	int st = task_state(t), n;
	if (st == TASK_PARKED) {
		long long ms = d->now && t->parked_at ? (d->now - t->parked_at) / 1000000 : 0;
		n = snprintf(line, sizeof line, "  task %llu (%s): %s", (unsigned long long)t->id,
			     t->name, t->wait.reason ? t->wait.reason : "parked");
		const char *r = t->wait.reason;
		if (r && strncmp(r, "chan ", 5) == 0 && *weft_chan_name(t->wait.object))
			n += snprintf(line + n, sizeof line - (size_t)n, " on %s (%p)",
				      weft_chan_name(t->wait.object), t->wait.object);
		else if (t->wait.object)
			n += snprintf(line + n, sizeof line - (size_t)n, " on %p", t->wait.object);
		n += snprintf(line + n, sizeof line - (size_t)n, " for %lld ms, spawned at %s\n", ms,
			      at);
	} else {
		n = snprintf(line, sizeof line, "  task %llu (%s): %s, spawned at %s\n",
			     (unsigned long long)t->id, t->name, state_name(st), at);
	}
	if (n > (int)sizeof line - 1)
		n = (int)sizeof line - 1;
	if (sys_write(d->fd, line, (size_t)n) < 0) {
	}
}

int dump_tasks(int fd, int max)
{
	struct dump d = { .fd = fd, .max = max,
			  .now = atomic_load_explicit(&sched_coarse_now, memory_order_relaxed) };
	stack_each_live(dump_one, &d);
	if (d.seen > max) {
		char more[64];
		int n = snprintf(more, sizeof more, "  ... and %d more\n", d.seen - max);
		if (sys_write(fd, more, (size_t)n) < 0) {
		}
	}
	return d.seen;
}

int weft_dump(int fd)
{
	if (fd < 0)
		return -EBADF;
	if (!weft_self())
		return -EINVAL; /* the slots are only there while weft runs */
	return dump_tasks(fd, 1 << 30);
}

/* SIGQUIT, when the program has not claimed it: the dump, then exit status 2, as Go does. */
static struct sigaction old_quit;
static bool quit_installed;

static void on_quit(int sig)
{
	(void)sig;
	static const char head[] = "weft: SIGQUIT: the live tasks\n";
	if (sys_write(2, head, sizeof head - 1) < 0) {
	}
	dump_tasks(2, 1 << 30);
	_exit(2);
}

void dump_install(void)
{
	struct sigaction cur;
	if (sigaction(SIGQUIT, NULL, &cur) == 0 && cur.sa_handler == SIG_DFL) {
		struct sigaction sa = { .sa_handler = on_quit };
		quit_installed = sigaction(SIGQUIT, &sa, &old_quit) == 0;
	}
}

void dump_uninstall(void)
{
	if (quit_installed)
		sigaction(SIGQUIT, &old_quit, NULL);
	quit_installed = false;
}
