/* Striped counters: a breaker's permitted, rejected and successes counts, which every CLOSED
 * call (allow() + record_success()) and every rejection adds to.
 *
 * On a GIL build they are the words of fb_state_t, added to atomically. On a free-threaded build
 * (FB_STRIPED, see _fb_breaker.h) those words are a single cache line that every core's call
 * writes: with two cores calling one breaker, the line moves between them on every call. So a
 * local breaker watches which thread counts; once the counting thread has changed FB_TURNS
 * times, one CAS installs an array of stripes (one cache line each, a power of two at least the
 * number of CPUs, at most FB_MAX_STRIPES), and from then on each call adds to the stripe of the
 * CPU it runs on. A breaker used by one thread never gets stripes; a breaker in a SharedRegion
 * never does either (its counts are the region's, read by other processes).
 *
 * A count is the word plus every stripe: nothing is lost while the stripes are installed (an
 * add that read the pointer as NULL goes to the word), and at quiescence the sum is exact. A
 * sum taken while threads are adding is some interleaving's value per counter, as before.
 *
 * FB_RACY_FOR_TESTS makes a stripe add a plain load + store, the stress tests' negative control.
 */
#ifndef FB_STRIPE_H
#define FB_STRIPE_H

#include <stdint.h>
#include <string.h>
#include "_fb_atomic.h"
#include "_fb_breaker.h"

enum { FB_CNT_PERMITTED = 0, FB_CNT_REJECTED = 1, FB_CNT_SUCCESSES = 2 };

#ifdef FB_STRIPED
#define FB_TURNS 64
#define FB_MAX_STRIPES 64

#if defined(_WIN32)
#include <windows.h>
#include <malloc.h>
static inline int64_t fb_thread_tag(void) { return (int64_t)GetCurrentThreadId(); }
static inline int fb_cpu(void) { return (int)GetCurrentProcessorNumber(); }
static inline void *fb_stripe_alloc(size_t size) { return _aligned_malloc(size, 64); }
static inline void fb_stripe_free(void *p) { _aligned_free(p); }
static int fb_cpus(void) { SYSTEM_INFO si; GetSystemInfo(&si); return (int)si.dwNumberOfProcessors; }
#else
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>
#if defined(__linux__)
#include <sched.h>
#endif
static inline int64_t fb_thread_tag(void) { return (int64_t)(uintptr_t)pthread_self(); }
static inline int fb_cpu(void) {
#if defined(__linux__)
    int cpu = sched_getcpu();  /* glibc reads it from the rseq area: no system call */
    if (cpu >= 0) return cpu;
#endif
    /* no CPU number: the thread's, hashed (threads then share stripes less well) */
    return (int)(((uint64_t)fb_thread_tag() * 0x9E3779B97F4A7C15ULL) >> 40);
}
static inline void *fb_stripe_alloc(size_t size) {
    void *p = NULL;
    return posix_memalign(&p, 64, size) == 0 ? p : NULL;
}
static inline void fb_stripe_free(void *p) { free(p); }
static int fb_cpus(void) { long n = sysconf(_SC_NPROCESSORS_CONF); return n > 0 ? (int)n : 1; }
#endif

static int64_t fb_stripe_mask = -1;  /* stripes - 1, set by fb_stripes_init() at module import */

static void fb_stripes_init(void) {
    int64_t n = 1, cpus = fb_cpus();
    while (n < cpus && n < FB_MAX_STRIPES) n <<= 1;
    fb_stripe_mask = n - 1;
}

static inline fb_stripe_t *fb_stripes(fb_breaker_t *b) {
    return (fb_stripe_t *)fb_load_ptr((void **)&b->stripes);
}

static void fb_stripes_install(fb_breaker_t *b) {
    size_t size = (size_t)(fb_stripe_mask + 1) * sizeof(fb_stripe_t);
    void *p = fb_stripe_alloc(size);
    void *expected = NULL;
    if (p == NULL) return;  /* no memory: the breaker keeps counting in its words */
    memset(p, 0, size);
    if (!fb_cas_strong((int64_t *)&b->stripes, (int64_t *)&expected, (int64_t)(uintptr_t)p))
        fb_stripe_free(p);  /* another thread installed them first */
}

static inline void fb_stripe_add(int64_t *p) {
#ifdef FB_RACY_FOR_TESTS
    int64_t v = fb_load_rlx(p);
    for (volatile int i = 0; i < 50; i++) { }
    fb_store_rlx(p, v + 1);
#else
    fb_add(p, 1);
#endif
}

#if defined(__GNUC__) || defined(__clang__)
#define FB_INLINE static inline __attribute__((always_inline))
#else
#define FB_INLINE static __forceinline
#endif

/* Add one to counter `which` (FB_CNT_*), whose word is `word`. Admissions and rejections (one
 * of them starts every call) watch the turns; a success needs not. */
FB_INLINE void fb_count(fb_breaker_t *b, int64_t *word, int which) {
    fb_stripe_t *st = fb_stripes(b);
    int64_t me;
    if (st != NULL) {
        fb_stripe_add(&((int64_t *)&st[fb_cpu() & fb_stripe_mask])[which]);
        return;
    }
    fb_add(word, 1);
    if (which == FB_CNT_SUCCESSES)
        return;
    me = fb_thread_tag();
    if (fb_load_rlx(&b->last_thread) != me) {
        fb_store_rlx(&b->last_thread, me);
        if (b->s == &b->own && fb_stripe_mask > 0 && fb_add(&b->turns, 1) == FB_TURNS)
            fb_stripes_install(b);
    }
}

/* Counter `which`: its word plus its stripes. */
static inline int64_t fb_counted(fb_breaker_t *b, int64_t *word, int which) {
    fb_stripe_t *st = fb_stripes(b);
    int64_t sum = fb_load_rlx(word), i;
    if (st != NULL)
        for (i = 0; i <= fb_stripe_mask; i++) sum += fb_load_rlx(&((int64_t *)&st[i])[which]);
    return sum;
}

/* Zero the stripes of every counter (the caller zeroes the words). */
static inline void fb_stripes_zero(fb_breaker_t *b) {
    fb_stripe_t *st = fb_stripes(b);
    int64_t i;
    if (st != NULL)
        for (i = 0; i <= fb_stripe_mask; i++) {
            fb_store_rlx(&st[i].permitted, 0);
            fb_store_rlx(&st[i].rejected, 0);
            fb_store_rlx(&st[i].successes, 0);
        }
}

static inline void fb_stripes_release(fb_breaker_t *b) {
    fb_stripe_t *st = fb_stripes(b);
    if (st != NULL) {
        b->stripes = NULL;
        fb_stripe_free(st);
    }
}

static inline int fb_stripes_installed(fb_breaker_t *b) { return fb_stripes(b) != NULL; }

#else  /* a GIL build: the words alone */

static inline void fb_stripes_init(void) { }
static inline void fb_count(fb_breaker_t *b, int64_t *word, int which) {
    (void)b; (void)which;
    fb_add(word, 1);
}
static inline int64_t fb_counted(fb_breaker_t *b, int64_t *word, int which) {
    (void)b; (void)which;
    return fb_load_rlx(word);
}
static inline void fb_stripes_zero(fb_breaker_t *b) { (void)b; }
static inline void fb_stripes_release(fb_breaker_t *b) { (void)b; }
static inline int fb_stripes_installed(fb_breaker_t *b) { (void)b; return 0; }

#endif
#endif
