/* Tiny atomics and clock layer for fastbreaker's Cython core.
 *
 * Cython has no C atomics, so the .pyx files declare these static inline functions with
 * `cdef extern from "_fb_atomic.h" nogil`. GCC and Clang use the __atomic builtins, MSVC the
 * Interlocked family (each a full barrier) and, for plain loads and stores: on x64, volatile
 * accesses (atomic when aligned, ordered by the hardware; the compiler barrier keeps the order
 * we ask for); on ARM64, LDAR/STLR (the hardware reorders plain accesses there); on 32-bit x86,
 * where a 64-bit plain access is two accesses, Interlocked calls.
 *
 * FB_RACY_FOR_TESTS (test-only, never set by setup.py for the shipped package) replaces every
 * compare-and-swap with a plain load + compare + store, so the stress tests can show that they
 * detect a broken core.
 */
#ifndef FB_ATOMIC_H
#define FB_ATOMIC_H

#include <stdint.h>

#if defined(_MSC_VER) && !defined(__clang__)
#include <windows.h>
#include <intrin.h>

#if defined(_M_ARM64) || defined(_M_ARM64EC)
static inline int64_t fb_load_acq(int64_t *p) { return (int64_t)__ldar64((unsigned __int64 volatile *)p); }
static inline int64_t fb_load_rlx(int64_t *p) { return __iso_volatile_load64((__int64 volatile *)p); }
static inline void fb_store_rel(int64_t *p, int64_t v) { __stlr64((unsigned __int64 volatile *)p, (unsigned __int64)v); }
static inline void fb_store_rlx(int64_t *p, int64_t v) { __iso_volatile_store64((__int64 volatile *)p, v); }
#elif defined(_M_IX86)
static inline int64_t fb_load_acq(int64_t *p) { return InterlockedCompareExchange64((volatile LONG64 *)p, 0, 0); }
static inline int64_t fb_load_rlx(int64_t *p) { return InterlockedCompareExchange64((volatile LONG64 *)p, 0, 0); }
static inline void fb_store_rel(int64_t *p, int64_t v) { InterlockedExchange64((volatile LONG64 *)p, v); }
static inline void fb_store_rlx(int64_t *p, int64_t v) { InterlockedExchange64((volatile LONG64 *)p, v); }
#else
static inline int64_t fb_load_acq(int64_t *p) { int64_t v = *(volatile int64_t *)p; _ReadWriteBarrier(); return v; }
static inline int64_t fb_load_rlx(int64_t *p) { return *(volatile int64_t *)p; }
static inline void fb_store_rel(int64_t *p, int64_t v) { _ReadWriteBarrier(); *(volatile int64_t *)p = v; }
static inline void fb_store_rlx(int64_t *p, int64_t v) { *(volatile int64_t *)p = v; }
#endif
static inline int64_t fb_add(int64_t *p, int64_t v) { return InterlockedExchangeAdd64((volatile LONG64 *)p, v) + v; }
static inline int64_t fb_xchg(int64_t *p, int64_t v) { return InterlockedExchange64((volatile LONG64 *)p, v); }
static inline int fb_cas_strong(int64_t *p, int64_t *expected, int64_t desired) {
    int64_t old = InterlockedCompareExchange64((volatile LONG64 *)p, desired, *expected);
    if (old == *expected) return 1;
    *expected = old;
    return 0;
}

#else

static inline int64_t fb_load_acq(int64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static inline int64_t fb_load_rlx(int64_t *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
static inline void fb_store_rel(int64_t *p, int64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
static inline void fb_store_rlx(int64_t *p, int64_t v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
static inline int64_t fb_add(int64_t *p, int64_t v) { return __atomic_add_fetch(p, v, __ATOMIC_RELAXED); }
static inline int64_t fb_xchg(int64_t *p, int64_t v) { return __atomic_exchange_n(p, v, __ATOMIC_ACQ_REL); }
static inline int fb_cas_strong(int64_t *p, int64_t *expected, int64_t desired) {
    return __atomic_compare_exchange_n(p, expected, desired, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

#endif

#ifdef FB_RACY_FOR_TESTS
/* The negative control: a compare-and-swap that is not atomic. A window between the load and
 * the store lets two threads both "win"; the spin widens it so the stress test sees it. */
static inline int fb_cas(int64_t *p, int64_t *expected, int64_t desired) {
    int64_t cur = fb_load_acq(p);
    if (cur != *expected) { *expected = cur; return 0; }
    for (volatile int i = 0; i < 50; i++) { }
    fb_store_rel(p, desired);
    return 1;
}
#else
static inline int fb_cas(int64_t *p, int64_t *expected, int64_t desired) {
    return fb_cas_strong(p, expected, desired);
}
#endif

/* Pointer-sized atomics (a breaker's config pointer is swapped while others read it). */
#if defined(_MSC_VER) && !defined(__clang__)
#if defined(_WIN64)
static inline void *fb_load_ptr(void **p) { return (void *)fb_load_acq((int64_t *)p); }
static inline void fb_store_ptr(void **p, void *v) { fb_store_rel((int64_t *)p, (int64_t)v); }
#else
static inline void *fb_load_ptr(void **p) { void *v = *(void *volatile *)p; _ReadWriteBarrier(); return v; }
static inline void fb_store_ptr(void **p, void *v) { _ReadWriteBarrier(); *(void *volatile *)p = v; }
#endif
#else
static inline void *fb_load_ptr(void **p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static inline void fb_store_ptr(void **p, void *v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
#endif

/* Raise *p to at least v (never lowers it). */
static inline void fb_max(int64_t *p, int64_t v) {
    int64_t cur = fb_load_rlx(p);
    while (cur < v && !fb_cas_strong(p, &cur, v)) { }
}

/* CLOCK_MONOTONIC in nanoseconds. */
#if defined(_WIN32)
#include <windows.h>  /* also for Windows compilers other than MSVC (clang-cl, MinGW) */
static inline int64_t fb_monotonic_ns(void) {
    static LARGE_INTEGER freq;
    LARGE_INTEGER c;
    if (freq.QuadPart == 0) QueryPerformanceFrequency(&freq);
    QueryPerformanceCounter(&c);
    return (int64_t)((double)c.QuadPart * 1e9 / (double)freq.QuadPart);
}
#else
#include <time.h>
static inline int64_t fb_monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}
#endif

#endif /* FB_ATOMIC_H */
