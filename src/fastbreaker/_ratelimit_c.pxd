# cython: language_level=3
"""The C-level API of fastbreaker's RateLimiter (GCRA), for other Cython extensions.

    from fastbreaker._ratelimit_c cimport fb_rate_t, fb_rate_handle, fb_rate_try_acquire

    cdef fb_rate_t *r = fb_rate_handle(limiter)    # keep a reference: the object owns the state
    with nogil:
        if fb_rate_try_acquire(r, 1, -1) == 1: ...  # try_acquire(1)

Use the state only through these entry points: its fields may change between releases. `now` is
monotonic ns, or -1 to read CLOCK_MONOTONIC. A limiter built with a Python `clock=` cannot read
that clock without the GIL: pass `now` from it (else FB_RATE_NEED_CLOCK).
"""

cimport cython
from libc.stdint cimport int64_t

cdef enum:
    FB_RATE_MAX = 8              # rates per limiter
    FB_RATE_BAD_WEIGHT = -1      # weight < 1, or above the smallest burst: never admitted
    FB_RATE_NEED_CLOCK = -2      # a Python clock, and now < 0

ctypedef struct fb_rate_cfg_t:
    int n                        # rates
    int use_c_clock
    int64_t max_weight           # the smallest burst, in units
    int64_t t[FB_RATE_MAX]       # emission intervals T, ns (rounded up)
    int64_t tau[FB_RATE_MAX]     # tolerances burst * T, ns

ctypedef struct fb_rate_t:
    fb_rate_cfg_t *cfg
    int64_t *tat                 # cfg.n theoretical arrival times, ns of the limiter's clock
    int64_t *cnt                 # admitted, rejected, units beyond 1 per admitted and per
                                 # rejected request, waits

# The limiter's C state; raises TypeError if `limiter` is not a compiled RateLimiter.
cdef fb_rate_t *fb_rate_handle(object limiter) except NULL

# try_acquire(weight): 1 admitted (every rate charged), 0 refused (no rate charged),
# FB_RATE_BAD_WEIGHT or FB_RATE_NEED_CLOCK (nothing counted).
cdef int fb_rate_try_acquire(fb_rate_t *r, int64_t weight, int64_t now) noexcept nogil

# retry_after(weight) in ns (0 when admitted now); -1 for a bad weight or a missing clock.
cdef int64_t fb_rate_retry_after_ns(fb_rate_t *r, int64_t weight, int64_t now) noexcept nogil


@cython.final
cdef class RateLimiter:
    cdef fb_rate_cfg_t cfg
    cdef fb_rate_t state
    cdef int64_t words[FB_RATE_MAX]
    cdef int64_t counts[5]
    cdef object _clock
    cdef object _rates
    cdef object _name
    cdef public object _queues
    cdef object _view          # a shared limiter's words: keeps the region mapped
    cdef bint _ready
    cdef object __weakref__
