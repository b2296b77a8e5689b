/* Test-only: the atomics header compiles on this compiler and its functions mean what the core
 * assumes (fb_add returns the new value, fb_xchg the old one, a failed CAS reports the current
 * value, fb_max never lowers). Built and run by tests/test_capi.py with every C compiler found
 * (GCC, Clang, and MSVC on Windows CI); prints "ok" and exits 0.
 * Like Python.h, which always comes first in an extension, ask for POSIX (clock_gettime). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>

#include "_fb_atomic.h"
#include "_fb_breaker.h"

#define CHECK(cond)                                                             \
    do {                                                                        \
        if (!(cond)) {                                                          \
            printf("FAIL line %d: %s\n", __LINE__, #cond);                      \
            return 1;                                                           \
        }                                                                       \
    } while (0)

int main(void) {
    int64_t x = 5, e;
    int64_t t0, t1;
    void *ptr = NULL;
    CHECK(fb_load_acq(&x) == 5 && fb_load_rlx(&x) == 5);
    fb_store_rel(&x, 7);
    CHECK(fb_load_acq(&x) == 7);
    fb_store_rlx(&x, 8);
    CHECK(fb_load_rlx(&x) == 8);
    CHECK(fb_add(&x, 2) == 10 && x == 10);
    CHECK(fb_add(&x, -12) == -2 && x == -2);
    CHECK(fb_xchg(&x, 3) == -2 && x == 3);
    e = 4;
    CHECK(!fb_cas_strong(&x, &e, 9) && e == 3 && x == 3);
    CHECK(fb_cas_strong(&x, &e, 9) && x == 9);
    e = 1;
    CHECK(!fb_cas(&x, &e, 11) && e == 9 && x == 9);
    CHECK(fb_cas(&x, &e, 11) && x == 11);
    fb_max(&x, 5);
    CHECK(x == 11);
    fb_max(&x, 20);
    CHECK(x == 20);
    x = INT64_MAX - 1;
    CHECK(fb_add(&x, 1) == INT64_MAX);
    e = INT64_MAX;
    CHECK(fb_cas_strong(&x, &e, INT64_MIN) && x == INT64_MIN);
    CHECK(fb_load_ptr(&ptr) == NULL);
    fb_store_ptr(&ptr, &x);
    CHECK(fb_load_ptr(&ptr) == (void *)&x);
    t0 = fb_monotonic_ns();
    t1 = fb_monotonic_ns();
    CHECK(t0 > 0 && t1 >= t0);
    CHECK(FB_SUCCESS == 0 && FB_SLOW == 1 && FB_FAILURE == 2 && FB_NEUTRAL == 3);
    CHECK(FB_REJECTED == -1 && FB_NEED_CLOCK == -2);
    printf("ok\n");
    return 0;
}
