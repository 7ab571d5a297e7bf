/*
 * finish.c - the trace and the statistics of a program that a signal ends.
 *
 * WEFT_TRACE's file and WEFT_STATS's table are written when weft_run returns, and a server is
 * usually stopped with SIGTERM (or Ctrl-C, SIGINT), which ends it inside weft_run. So while weft
 * runs with either set, and the program left the signal's default action in place, weft
 * catches the first SIGTERM or SIGINT, writes both, and then ends the program with the same
 * signal, default action restored, so that its parent sees what it would have seen.
 *
 * Writing a file is not async-signal-safe (stdio, malloc), so the handler only posts a
 * semaphore (sem_post is safe) that a thread of finish.c waits on; that thread does the
 * writing, as an ordinary thread. Rejected: writing from the handler (it may interrupt malloc
 * or the trace's own lock); sigwait in a thread of ours (it needs the signals blocked in every
 * thread, and the program's threads are not weft's to change); the monitor thread (it sleeps
 * for long stretches on its own futex, and has enough to do).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "sched.h"
#include "trace.h"

static const int sigs[] = { SIGTERM, SIGINT };
#define NSIGS (int)(sizeof sigs / sizeof sigs[0])

static struct {
	sem_t sem;
	atomic_int sig;            /* the signal caught; 0: finish_uninstall woke the thread */
	pthread_t thread;
	bool running;
	bool mine[NSIGS];          /* installed by us: restore at uninstall */
	struct sigaction old[NSIGS];
} F;

static void on_signal(int sig)
{
	int zero = 0;
	if (atomic_compare_exchange_strong(&F.sig, &zero, sig))
		sem_post(&F.sem);
}

static void *finisher(void *arg)
{
	(void)arg;
	sigset_t set;
	sigemptyset(&set);
	for (int i = 0; i < NSIGS; i++)
		sigaddset(&set, sigs[i]);
	pthread_sigmask(SIG_UNBLOCK, &set, NULL);
	while (sem_wait(&F.sem) != 0 && errno == EINTR)
		;
	int sig = atomic_load(&F.sig);
	if (sig <= 0)
		return NULL; /* weft_run is ending: it writes both itself */
	trace_flush();
	sched_print_stats();
	signal(sig, SIG_DFL);
	raise(sig);
	return NULL;
}

static bool wanted(void)
{
	const char *t = getenv("WEFT_TRACE"), *s = getenv("WEFT_STATS");
	return (t && *t) || (s && *s && strcmp(s, "0") != 0);
}

int finish_install(void)
{
	if (!wanted() || sem_init(&F.sem, 0, 0) != 0)
		return 0;
	atomic_store(&F.sig, 0);
	if (pthread_create(&F.thread, NULL, finisher, NULL) != 0) {
		sem_destroy(&F.sem);
		return 0;
	}
	F.running = true;
	for (int i = 0; i < NSIGS; i++) {
		struct sigaction cur, sa = { .sa_handler = on_signal };
		F.mine[i] = sigaction(sigs[i], NULL, &cur) == 0 && cur.sa_handler == SIG_DFL &&
			    sigaction(sigs[i], &sa, &F.old[i]) == 0;
	}
	return 1;
}

void finish_uninstall(void)
{
	if (!F.running)
		return;
	for (int i = 0; i < NSIGS; i++)
		if (F.mine[i])
			sigaction(sigs[i], &F.old[i], NULL);
	int zero = 0;
	if (atomic_compare_exchange_strong(&F.sig, &zero, -1))
		sem_post(&F.sem);
	/* a signal that came first is being written out, and ends the program */
	pthread_join(F.thread, NULL);
	sem_destroy(&F.sem);
	F.running = false;
}
