# cython: language_level=3
"""The C-level API of fastbreaker's breaker core, for other Cython extensions.

    from fastbreaker._breaker_c cimport (fb_breaker_t, fb_breaker_handle, fb_breaker_acquire,
                                         fb_breaker_release, FB_SUCCESS, FB_FAILURE)

Get the handle once with the GIL (the Python breaker object stays the owner of the memory: keep
a reference to it), then call the entry points from any thread, without the GIL. The struct is
opaque here so that its layout can change without breaking code compiled against this file.
Entry points do not run Python state-change callbacks.
"""

from libc.stdint cimport int64_t

cdef extern from "_fb_breaker.h" nogil:
    ctypedef struct fb_breaker_t:
        pass
    enum:
        FB_SUCCESS
        FB_SLOW
        FB_FAILURE
        FB_NEUTRAL
        FB_REJECTED
        FB_NEED_CLOCK

# The breaker's C state; raises TypeError if `breaker` is not a compiled CircuitBreaker.
cdef fb_breaker_t *fb_breaker_handle(object breaker) except NULL

# Admit a call: a permit (>= 0), FB_REJECTED, or FB_NEED_CLOCK when the breaker has a Python
# clock and `now` < 0. `now` is monotonic ns, or -1 to read CLOCK_MONOTONIC only when needed.
cdef int64_t fb_breaker_acquire(fb_breaker_t *b, int64_t now) noexcept nogil

# Report the outcome (FB_SUCCESS, FB_SLOW, FB_FAILURE, FB_NEUTRAL) of the call admitted with
# `permit`. Returns 0, or FB_NEED_CLOCK (nothing recorded) when the time is needed and unknown.
cdef int fb_breaker_release(fb_breaker_t *b, int64_t permit, int outcome, int64_t now) noexcept nogil

# The stored state: 0 CLOSED, 1 OPEN, 2 HALF_OPEN, 3 ISOLATED.
cdef int fb_breaker_state(fb_breaker_t *b) noexcept nogil
