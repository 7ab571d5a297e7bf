/*
 * pool.h - per-worker allocation (pool.c): small sizes from the calling worker's free lists,
 * and the process's memory as the metrics report it.
 */
#ifndef WEFT_MQTT_POOL_H
#define WEFT_MQTT_POOL_H

#include <stddef.h>
#include <stdint.h>

/* Memory of at least n bytes: small sizes come from the calling worker's free lists. The
 * capacity actually given is pool_size(p). Never fails (aborts when memory is out). */
void *pool_alloc(size_t n);
void pool_free(void *p);
size_t pool_size(const void *p);
void pool_init(void);
/* Release every cached block (at exit, so that leak checkers see a clean heap). */
void pool_fini(void);
/* malloc as the broker wants it (one arena): before weft_run starts the workers. */
void pool_malloc_setup(void);
/* Give back memory nothing uses (the reaper calls it): see pool.c. */
void pool_trim(int64_t now);
long pool_cached_bytes(void); /* held in the workers' free lists */
long mem_resident(void);      /* the process's RSS in bytes (0 if unknown) */

#endif
