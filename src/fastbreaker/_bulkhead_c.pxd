# cython: language_level=3
"""The C-level API of fastbreaker's Bulkhead and AdaptiveLimiter, for other Cython extensions.

    from fastbreaker._bulkhead_c cimport (fb_bulkhead_t, fb_bulkhead_handle, fb_limiter_handle,
        fb_bulkhead_try_acquire, fb_bulkhead_release, fb_limiter_try_acquire, fb_limiter_release)

    cdef fb_bulkhead_t *b = fb_bulkhead_handle(bulkhead)   # keep a reference: the object owns it
    with nogil:
        if fb_bulkhead_try_acquire(b):                      # try_acquire()
            ...
            fb_bulkhead_release(b)                          # release()

Use the state only through these entry points: its fields may change between releases.
A release that finds callers waiting hands the slot to the oldest one; that takes the GIL (the
waiters are Python objects), as does a sample of a gradient limiter. Everything else is lock-free
and never takes the GIL. `now` is monotonic ns, or -1 to read CLOCK_MONOTONIC; a limiter built
with a Python `clock=` cannot read that clock without the GIL: pass `now` from it, else (`now` <
0) the release is not sampled.
"""

cimport cython
from libc.stdint cimport int64_t

ctypedef struct fb_bulkhead_t:
    int64_t word          # in_flight (low 32 bits) | waiting << 32: admission is one CAS on it
    int64_t limit         # the limit, a double's bits (fixed for a Bulkhead)
    int64_t last_cut      # AIMD: clock ns of the last decrease
    int64_t admitted
    int64_t rejected
    int64_t timed_out
    int64_t cancelled
    int64_t waited
    int64_t peak
    int64_t threshold_ns
    double min_limit
    double max_limit
    double backoff
    int algorithm         # 0 fixed (Bulkhead), 1 AIMD, 2 gradient
    int use_c_clock
    void *owner           # the object that holds this struct (borrowed)
    int64_t *shared       # a Bulkhead in a SharedRegion: its block there (see _bulkhead_c), or NULL

# The C state; TypeError if `obj` is not a compiled Bulkhead (resp. AdaptiveLimiter).
cdef fb_bulkhead_t *fb_bulkhead_handle(object obj) except NULL
cdef fb_bulkhead_t *fb_limiter_handle(object obj) except NULL

# try_acquire(): 1 if a slot was taken, else 0 (counted as rejected). Never waits.
cdef int fb_bulkhead_try_acquire(fb_bulkhead_t *b) noexcept nogil
# release(): 0, or -1 if no slot was held (nothing changes).
cdef int fb_bulkhead_release(fb_bulkhead_t *b) noexcept nogil

cdef int fb_limiter_try_acquire(fb_bulkhead_t *b) noexcept nogil
# release(rtt, dropped=...): rtt_ns < 0 means no rtt; with no rtt and not dropped, no sample.
cdef int fb_limiter_release(fb_bulkhead_t *b, int64_t rtt_ns, int dropped, int64_t now) noexcept nogil


cdef class _Slots:
    cdef fb_bulkhead_t st
    cdef readonly object _queue
    cdef readonly object _name
    cdef readonly double _max_wait
    cdef readonly int64_t _max_waiting
    cdef object _clock
    cdef bint _ready
    cdef object _view     # a shared bulkhead's block: keeps the region mapped
    cdef object __weakref__
    cdef int _setup(self, double wait_s, int64_t max_waiting, object name, object clock) except -1


@cython.final
cdef class Bulkhead(_Slots):
    pass


@cython.final
cdef class AdaptiveLimiter(_Slots):
    cdef readonly object _drop_on
    cdef readonly object _gradient
    cdef object _cfg
