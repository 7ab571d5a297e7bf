/*
 * brokerstat.c - the broker's CPU time and resident memory, read from /proc/PID (the -b
 * option): utime+stime from stat, VmRSS from status.
 */
#define _GNU_SOURCE
#include <math.h>
#include <unistd.h>

#include "loadgen.h"

double broker_cpu_s(void)
{
	char path[64], buf[1024];
	snprintf(path, sizeof path, "/proc/%d/stat", opt.broker_pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return NAN;
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = 0;
	char *p = strrchr(buf, ')'); /* the command name may hold spaces */
	unsigned long ut = 0, st = 0;
	if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
		return NAN;
	return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

long broker_rss_kb(void)
{
	char path[64], line[256];
	long kb = -1;
	snprintf(path, sizeof path, "/proc/%d/status", opt.broker_pid);
	FILE *f = fopen(path, "r");
	while (f && fgets(line, sizeof line, f))
		if (sscanf(line, "VmRSS: %ld", &kb) == 1)
			break;
	if (f)
		fclose(f);
	return kb;
}
