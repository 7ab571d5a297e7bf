/*
 * waitstat.h - time parked, by what was waited for (waitstat.c). Internal to weft.
 */
#ifndef WEFT_WAITSTAT_H
#define WEFT_WAITSTAT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

extern atomic_bool waitstat_on __attribute__((visibility("hidden")));

void waitstat_start(int workers); /* weft_run begins: on with WEFT_STATS or WEFT_TRACE */
void waitstat_print(void);        /* the table on stderr, if counting (WEFT_STATS=1 does) */
void waitstat_stop(void);

/* Count one wait for `what` (a wait reason, a static string) that lasted ns. */
void waitstat_add(const char *what, int64_t ns);

#endif
