/*
 * sanitizer.h - telling ASan, TSan and valgrind that weft switches stacks. Without this,
 * ASan reports false stack-buffer overflows and TSan loses track of which stack runs.
 * Everything here compiles to nothing in a plain build.
 */
#ifndef WEFT_SANITIZER_H
#define WEFT_SANITIZER_H

#include <stddef.h>

#ifndef __has_feature
#define __has_feature(x) 0
#endif

#if defined(__SANITIZE_ADDRESS__) || __has_feature(address_sanitizer)
#define WEFT_ASAN 1
void __sanitizer_start_switch_fiber(void **fake_stack_save, const void *bottom, size_t size);
void __sanitizer_finish_switch_fiber(void *fake_stack_save, const void **bottom_old,
				     size_t *size_old);
void __asan_unpoison_memory_region(void const volatile *addr, size_t size);
#define san_unpoison(p, n) __asan_unpoison_memory_region((p), (n))
#else
#define san_unpoison(p, n) ((void)(p), (void)(n))
#endif

#if defined(__SANITIZE_THREAD__) || __has_feature(thread_sanitizer)
#define WEFT_TSAN 1
void *__tsan_get_current_fiber(void);
void *__tsan_create_fiber(unsigned flags);
void __tsan_destroy_fiber(void *fiber);
void __tsan_switch_to_fiber(void *fiber, unsigned flags);
void __tsan_ignore_thread_begin(void);
void __tsan_ignore_thread_end(void);
/* Around code that reads other threads' data without synchronizing on purpose (the dump). */
#define san_racy_begin() __tsan_ignore_thread_begin()
#define san_racy_end() __tsan_ignore_thread_end()
#else
#define san_racy_begin() ((void)0)
#define san_racy_end() ((void)0)
#endif

#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>) && !defined(WEFT_NO_VALGRIND)
#include <valgrind/valgrind.h>
#define WEFT_VALGRIND 1
#endif
#endif
#endif
