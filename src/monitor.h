/*
 * monitor.h - the monitor thread (monitor.c), as the workers (sched.c) see it. Internal to weft.
 */
#ifndef WEFT_MONITOR_H
#define WEFT_MONITOR_H

/* Per weft_run, before the workers' records are made: spares' cap, standby, parking. */
void monitor_init(int n);
/* The monitor thread's start routine (weft_run starts it). */
void *monitor_thread(void *arg);
/* A worker left its idle sleep: wake the monitor if it sleeps for want of work. */
void monitor_resume(void);
#endif
