/* affinity.h - pinning workers to CPUs (affinity.c explains when and why). */
#ifndef WEFT_AFFINITY_H
#define WEFT_AFFINITY_H

/* Read the calling thread's CPU set (weft_run's caller); returns how many CPUs it has, 0 if
 * it cannot be read. */
int affinity_init(void);
/* How many workers: $WEFT_WORKERS, or one per CPU of that set (as nproc(1) and Go count them;
 * `cpus` is affinity_init's answer), 1 to 1024. */
int affinity_workers(int cpus);
/* Decide, for this many workers, whether to pin (only as many workers as CPUs, not WEFT_PIN=0). */
void affinity_plan(int workers);
/* Called by worker `id` as it starts: its own CPU, or the whole set for a spare worker. */
void affinity_worker(int id);
/* weft_run is ending: the caller gets its set back; nothing is pinned any more. */
void affinity_restore(void);

#endif
