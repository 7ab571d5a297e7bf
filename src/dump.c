/*
 * dump.c - a line for every live task, as Go's goroutine dump: weft_dump(fd), SIGQUIT, and
 * the deadlock report.
 *
 *   task 12 (conn): chan recv on 0x55d0c0a1c2a0 for 153 ms, spawned at ./server+0x1a2b
 *
 * It walks the stack slots (stack.c), reading task records that other workers may be
 * changing, without stopping them: a line may be a moment out of date, never unsafe to read,
 * since slots stay mapped until weft_run ends. What a record points to is another matter: a
 * parked task's channel may be freed as soon as the task is woken, so its name is read only
 * through chan_name_of, which knows which channels are still there. The record's own fields
 * are read racily on purpose (TSan is told so); the strings among them are bounded. Output
 * goes through snprintf into a local buffer and raw write(2), so it also works from the
 * SIGQUIT handler (best effort, as any dump of a running program).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chan.h"
#include "monitor.h"
#include "sanitizer.h"
#include "sched.h"
#include "stack.h"
#include "sys.h"
#include "task.h"
#include "weft.h"

struct dump {
	int fd, max, seen;
	bool in_signal; /* in the SIGQUIT handler: wait for no lock */
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
	int st = task_state(t), n, wid;
	int64_t ns;
	bool in_kernel;
	if (st == TASK_PARKED) {
		long long ms = d->now && t->parked_at ? (d->now - t->parked_at) / 1000000 : 0;
		/* The task may be woken, and what it waited on freed, while we look: read the
		 * name of a channel only through chan_name_of, which knows if it is still there. */
		const char *r = atomic_load_explicit(&t->wait.reason, memory_order_relaxed);
		const void *obj = atomic_load_explicit(&t->wait.object, memory_order_relaxed);
		char cname[32];
		n = snprintf(line, sizeof line, "  task %llu (%.31s): %s", (unsigned long long)t->id,
			     t->name, r ? r : "parked");
		if (r && strncmp(r, "chan ", 5) == 0 &&
		    chan_name_of(obj, cname, sizeof cname, !d->in_signal))
			n += snprintf(line + n, sizeof line - (size_t)n, " on %s (%p)", cname, obj);
		else if (r && strncmp(r, "fd ", 3) == 0) /* poll.c: the object is the fd */
			n += snprintf(line + n, sizeof line - (size_t)n, " on fd %d",
				      (int)(intptr_t)obj);
		else if (obj)
			n += snprintf(line + n, sizeof line - (size_t)n, " on %p", obj);
		n += snprintf(line + n, sizeof line - (size_t)n, " for %lld ms, spawned at %s\n", ms,
			      at);
	} else if (st == TASK_RUNNING && (wid = monitor_running(t, d->now, &ns, &in_kernel)) >= 0) {
		/* as Go's "[syscall, 2 minutes]": a task that holds its worker, and for how long */
		n = snprintf(line, sizeof line, "  task %llu (%.31s): %s", (unsigned long long)t->id,
			     t->name, in_kernel ? "in a system call" : "running");
		if (ns >= 0)
			n += snprintf(line + n, sizeof line - (size_t)n, " for %lld ms",
				      (long long)(ns / 1000000));
		n += snprintf(line + n, sizeof line - (size_t)n, " on worker %d, spawned at %s\n",
			      wid, at);
	} else {
		n = snprintf(line, sizeof line, "  task %llu (%.31s): %s, spawned at %s\n",
			     (unsigned long long)t->id, t->name, state_name(st), at);
	}
	if (n > (int)sizeof line - 1)
		n = (int)sizeof line - 1;
	if (sys_write(d->fd, line, (size_t)n) < 0) {
	}
}

int dump_tasks(int fd, int max, bool in_signal)
{
	/* the time now, not the coarse clock: that one stands still while the monitor sleeps
	 * (clock_gettime is safe in a signal handler) */
	struct dump d = { .fd = fd, .max = max, .in_signal = in_signal, .now = weft_now() };
	san_racy_begin();
	stack_each_live(dump_one, &d);
	san_racy_end();
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
	return dump_tasks(fd, 1 << 30, false);
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
	dump_tasks(2, 1 << 30, true);
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
