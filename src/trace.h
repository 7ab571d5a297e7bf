/*
 * trace.h - the execution trace (trace.c), WEFT_TRACE=out.json. Internal to weft.
 *
 * Each thread records events into a ring of its own, without locks; weft_run writes all the
 * rings as one Chrome trace-event file when it ends. When tracing is off every hook costs one
 * load of trace_on and a branch that is never taken. trace_flush (weft_trace_flush, and the
 * signals of finish.c) writes the file so far while weft runs.
 */
#ifndef WEFT_TRACE_H
#define WEFT_TRACE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct weft_task weft_task;

extern atomic_bool trace_on __attribute__((visibility("hidden"))); /* one load, no GOT */

void trace_start(void);            /* weft_run begins: reads WEFT_TRACE */
void trace_stop(void);             /* weft_run ends: writes the file */
int trace_flush(void);             /* writes the file so far, and records on: 0 or -errno */
void trace_thread_name(const char *fmt, int n); /* names the caller's track */

/* The hooks: the inline part tests trace_on, the out-of-line part records. */
enum { TRACE_YIELD, TRACE_PARK, TRACE_EXIT }; /* how a task left its worker */
void trace_switch_(const weft_task *from, const weft_task *to, int left);
void trace_wake_(const weft_task *t, bool by_timer);
void trace_spawn_(const weft_task *t);
void trace_steal_(int victim, unsigned n);
void trace_idle_(bool begin);
void trace_call_(const void *fn, bool begin);

#define TRACE_HOOK(name, params, args)                                                  \
	static inline void trace_##name params                                         \
	{                                                                               \
		if (__builtin_expect(atomic_load_explicit(&trace_on, memory_order_relaxed), 0)) \
			trace_##name##_ args;                                           \
	}
/* A worker switches tasks (NULL: its idle loop); `left` says how `from` left. */
TRACE_HOOK(switch, (const weft_task *from, const weft_task *to, int left), (from, to, left))
/* t was made runnable by the caller, or by its deadline. */
TRACE_HOOK(wake, (const weft_task *t, bool by_timer), (t, by_timer))
TRACE_HOOK(spawn, (const weft_task *t), (t))
TRACE_HOOK(steal, (int victim, unsigned n), (victim, n))
TRACE_HOOK(idle, (bool begin), (begin))
/* A blocking-pool thread begins or ends a call of fn. */
TRACE_HOOK(call, (const void *fn, bool begin), (fn, begin))
#undef TRACE_HOOK

#endif
