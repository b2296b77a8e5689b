# cython: language_level=3
"""The C-level API of fastbreaker's RetryBudget, for other Cython extensions.

    from fastbreaker._budget_c cimport (fb_budget_t, fb_budget_handle, fb_budget_deposit,
                                        fb_budget_try_take)

    cdef fb_budget_t *b = fb_budget_handle(budget)   # keep a reference: the object owns the state
    with nogil:
        fb_budget_deposit(b)                         # record_success()
        if fb_budget_try_take(b, -1): ...            # allow_retry()

Use the state only through these entry points: its fields may change between releases.
`now` is monotonic ns, or -1 to read CLOCK_MONOTONIC. A budget built with a Python `clock=`
cannot read that clock without the GIL: pass `now` from it, else (`now` < 0) no tokens accrue.
"""

cimport cython
from libc.stdint cimport int64_t

ctypedef struct fb_budget_t:
    int64_t *tk          # tk[0] the tokens, in fixed-point units (1 token = 1,000,000 units);
                         # tk[1] the refill time (accrual before it has been credited): the two
                         # fields below, or two words of a SharedRegion
    int64_t tokens
    int64_t last_ns
    int64_t deposit      # units per success (ratio)
    int64_t capacity     # units
    int64_t rate         # units per second (min_per_sec)
    int use_c_clock

# The budget's C state; raises TypeError if `budget` is not a compiled RetryBudget. Prefer this
# handle to `&budget.state`: code that only holds the pointer does not depend on the layout.
cdef fb_budget_t *fb_budget_handle(object budget) except NULL

# record_success(): deposit `ratio` tokens, capped at capacity. Never reads the clock.
cdef void fb_budget_deposit(fb_budget_t *b) noexcept nogil

# allow_retry(): 1 if a token was taken (after the lazy refill up to `now`), else 0.
cdef int fb_budget_try_take(fb_budget_t *b, int64_t now) noexcept nogil


@cython.final
cdef class RetryBudget:
    cdef fb_budget_t state
    cdef object _clock
    cdef bint _ready         # __init__ has run
    cdef object _view        # a shared budget's words: keeps the region mapped
    cdef object __weakref__
