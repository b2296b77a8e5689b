# cython: language_level=3, freethreading_compatible=True
# cython: boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""A test-only downstream extension over the Bulkhead/AdaptiveLimiter C API (built at test time,
once against the installed package and once against a racy copy of the core; never shipped).

``hammer`` runs in the calling thread with the GIL released: try_acquire / release pairs through
the nogil entry points, with an independent occupancy count (one atomic add per admission and per
release) that must never exceed the limit: if two threads both won the last slot, it does.
"""

from libc.stdint cimport int64_t

from fastbreaker._bulkhead_c cimport (fb_bulkhead_handle, fb_bulkhead_release, fb_bulkhead_t,
    fb_bulkhead_try_acquire, fb_limiter_handle, fb_limiter_release, fb_limiter_try_acquire)

cdef extern from "_fb_atomic.h" nogil:
    int64_t fb_add(int64_t *p, int64_t v)
    int64_t fb_load_acq(int64_t *p)

cdef int64_t occupancy = 0


def handle_ok(obj, bint limiter):
    """Raises TypeError for the wrong object (the handles check the type)."""
    if limiter:
        fb_limiter_handle(obj)
    else:
        fb_bulkhead_handle(obj)
    return True


def release_nothing(obj):
    """fb_bulkhead_release with nothing held: -1."""
    cdef fb_bulkhead_t *b = fb_bulkhead_handle(obj)
    with nogil:
        r = fb_bulkhead_release(b)
    return r


def hammer(obj, Py_ssize_t rounds, int64_t cap, bint limiter, int64_t rtt_ns, int64_t now):
    """Returns (admitted, violations, release errors, highest occupancy seen)."""
    cdef fb_bulkhead_t *b = fb_limiter_handle(obj) if limiter else fb_bulkhead_handle(obj)
    cdef Py_ssize_t i, got = 0, bad = 0, errors = 0
    cdef int64_t occ, high = 0
    with nogil:
        for i in range(rounds):
            if (fb_limiter_try_acquire(b) if limiter else fb_bulkhead_try_acquire(b)):
                got += 1
                occ = fb_add(&occupancy, 1)
                if occ > cap:
                    bad += 1
                if occ > high:
                    high = occ
                fb_add(&occupancy, -1)
                if limiter:
                    if fb_limiter_release(b, rtt_ns + (i & 7) * rtt_ns, (i & 1023) == 0, now + i) != 0:
                        errors += 1
                elif fb_bulkhead_release(b) != 0:
                    errors += 1
    return got, bad, errors, high
