/*
 * monitor.h - the monitor thread (monitor.c), as the workers (sched.c) see it. Internal to weft.
 */
#ifndef WEFT_MONITOR_H
#define WEFT_MONITOR_H

#include <stdbool.h>
#include <stdint.h>

/* Per weft_run, before the workers' records are made: spares' cap, standby, parking. */
void monitor_init(int n);
/* The monitor thread's start routine (weft_run starts it). */
void *monitor_thread(void *arg);
/* A worker left its idle sleep: wake the monitor if it sleeps for want of work. */
void monitor_resume(void);
/* For the dump: the worker running t, or -1. *ns: how long it has run there at least (as the
 * monitor saw its worker's switches, to a period of the monitor's), -1 when the monitor has
 * not looked since it began; *in_kernel: its thread is blocked in the kernel (an uncovered
 * system call) rather than running or runnable. Reads /proc with raw system calls only. */
struct weft_task;
int monitor_running(const struct weft_task *t, int64_t now, int64_t *ns, bool *in_kernel);
#endif
