# cython: language_level=3, freethreading_compatible=True
# cython: boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""A test-only downstream extension over the RateLimiter C API (built at test time, once against
the installed package and once against a racy copy of the core; never shipped).

``hammer`` runs in the calling thread with the GIL released: ``fb_rate_try_acquire`` at the time
of a shared fake clock word, which the thread called with ``advance`` moves forward by ``step``
each round. ``words`` reads the TAT words (test-only knowledge of ``fb_rate_t``).
"""

from libc.stdint cimport int64_t

from fastbreaker._ratelimit_c cimport (FB_RATE_BAD_WEIGHT, FB_RATE_NEED_CLOCK, fb_rate_handle,
    fb_rate_retry_after_ns, fb_rate_t, fb_rate_try_acquire)

cdef extern from "_fb_atomic.h" nogil:
    int64_t fb_add(int64_t *p, int64_t v)
    int64_t fb_load_acq(int64_t *p)
    void fb_store_rel(int64_t *p, int64_t v)
    int64_t fb_monotonic_ns()

cdef int64_t fake_now = 0

CONSTANTS = dict(FB_RATE_BAD_WEIGHT=FB_RATE_BAD_WEIGHT, FB_RATE_NEED_CLOCK=FB_RATE_NEED_CLOCK)


def set_clock(int64_t now):
    fb_store_rel(&fake_now, now)


def get_clock():
    return fb_load_acq(&fake_now)


def try_acquire(limiter, int64_t weight, int64_t now=-1):
    cdef fb_rate_t *r = fb_rate_handle(limiter)
    cdef int got
    with nogil:
        got = fb_rate_try_acquire(r, weight, now)
    return got


def retry_after_ns(limiter, int64_t weight, int64_t now=-1):
    cdef fb_rate_t *r = fb_rate_handle(limiter)
    cdef int64_t ns
    with nogil:
        ns = fb_rate_retry_after_ns(r, weight, now)
    return ns


def words(limiter):
    cdef fb_rate_t *r = fb_rate_handle(limiter)
    return [fb_load_acq(&r.tat[i]) for i in range(r.cfg.n)]


def hammer(limiter, int64_t weight, bint advance, int64_t step, double seconds):
    """Returns (requests, admitted) after `seconds` of try_acquire at the shared fake clock."""
    cdef fb_rate_t *r = fb_rate_handle(limiter)
    cdef int64_t end = fb_monotonic_ns() + <int64_t>(seconds * 1e9)
    cdef int64_t now, tries = 0, got = 0
    with nogil:
        while True:
            if (tries & 255) == 0 and fb_monotonic_ns() > end:
                break
            tries += 1
            if advance:
                now = fb_add(&fake_now, step)
            else:
                now = fb_load_acq(&fake_now)
            if fb_rate_try_acquire(r, weight, now) == 1:
                got += 1
    return tries, got
