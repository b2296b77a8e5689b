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
        FB_TIMEOUT
        FB_REJECTED
        FB_NEED_CLOCK

# The breaker's C state; raises TypeError if `breaker` is not a compiled CircuitBreaker.
cdef fb_breaker_t *fb_breaker_handle(object breaker) except NULL

# Admit a call: a permit (>= 0), FB_REJECTED, or FB_NEED_CLOCK when the breaker has a Python
# clock and `now` < 0. `now` is monotonic ns, or -1 to read CLOCK_MONOTONIC only when needed.
cdef int64_t fb_breaker_acquire(fb_breaker_t *b, int64_t now) noexcept nogil

# Admit a call only if the breaker is CLOSED (no clock read, no transition): a permit, or
# FB_REJECTED when it is not CLOSED (then use fb_breaker_acquire, or the Python API to get
# state-change callbacks).
cdef int64_t fb_breaker_acquire_closed(fb_breaker_t *b) noexcept nogil

# Report the outcome (FB_SUCCESS, FB_SLOW, FB_FAILURE, FB_NEUTRAL, or FB_TIMEOUT: a failure that
# also counts in `timeouts`) of the call admitted with `permit`. Returns 0, or FB_NEED_CLOCK
# (nothing recorded) when the time is needed and unknown.
cdef int fb_breaker_release(fb_breaker_t *b, int64_t permit, int outcome, int64_t now) noexcept nogil

# With the GIL: call fn(*args, **kwargs) (kwargs may be None) through `breaker`, a compiled
# CircuitBreaker, as breaker.call(fn, *args, **kwargs) does: CircuitOpenError when rejected,
# callbacks fired, the outcome classified and recorded. Spares a Python method call.
cdef object fb_breaker_call(object breaker, object fn, tuple args, dict kwargs)

# With the GIL: breaker.record_success() (FB_SUCCESS) or breaker.record_failure() (FB_FAILURE)
# on a compiled CircuitBreaker, callbacks fired. Spares a Python method call.
cdef object fb_breaker_record(object breaker, int outcome)

# BreakerMap's use: the two spare words of a breaker in a SharedRegion (its table slot and tag).
cdef int64_t *fb_breaker_spare(fb_breaker_t *b) noexcept nogil

# The stored state: 0 CLOSED, 1 OPEN, 2 HALF_OPEN, 3 ISOLATED.
cdef int fb_breaker_state(fb_breaker_t *b) noexcept nogil

# The same two calls, also telling what happened in `*info` (0: a CLOSED permit, no change):
#   fb_info_probe(info)    acquire admitted a half-open probe
#   fb_info_changed(info)  this call changed the state, from fb_info_old(info) to fb_info_new(info)
#   fb_info_gen(info)      the generation the call ended in (a permit admitted there equals it)
# Python state-change callbacks do not run: report changes yourself if you need them.
cdef int64_t fb_breaker_acquire_ex(fb_breaker_t *b, int64_t now, int *info) noexcept nogil
cdef int fb_breaker_release_ex(fb_breaker_t *b, int64_t permit, int outcome, int64_t now,
                               int *info) noexcept nogil

cdef inline int fb_info_old(int info) noexcept nogil:
    return (info >> 4) & 0xF

cdef inline int fb_info_new(int info) noexcept nogil:
    return info & 0xF

cdef inline bint fb_info_changed(int info) noexcept nogil:
    return (info & 0x100) != 0 and fb_info_old(info) != fb_info_new(info)

cdef inline bint fb_info_probe(int info) noexcept nogil:
    return (info & 0x10F) == 0x102

cdef inline int64_t fb_info_gen(int info) noexcept nogil:
    return (info >> 9) & 0x3FFFFF
