# cython: language_level=3, freethreading_compatible=True
# cython: auto_pickle=False
"""RetryBudget, compiled: the token bucket of ``_budget_py`` (the spec) on C atomics.

The state is a plain C struct (see ``_budget_c.pxd``) changed only by ``noexcept nogil``
functions, so other Cython code can deposit and take tokens without the GIL. The ``def`` methods
are thin wrappers that read a Python clock, when one is given, and pass ``now`` in.
"""

cimport cython
from libc.stdint cimport int64_t

from ._durations import check_clock as _check_clock, read_clock as _now
import inspect as _inspect

from ._errors import not_copyable as _not_copyable
from ._keywords import check_keywords as _check_keywords, keyword_names as _keyword_names
from ._options import TOKEN_UNIT as _PY_UNIT, budget_parameters as _parameters, budget_units as _config

# inspect.signature() and help() (Cython gives a class no signature), and the keywords it takes.
_SIGNATURE = _inspect.signature(_parameters)
_KEYWORDS = _keyword_names(_SIGNATURE)

cdef extern from "_fb_atomic.h" nogil:
    int64_t fb_load_acq(int64_t *p)
    int64_t fb_load_rlx(int64_t *p)
    int fb_cas(int64_t *p, int64_t *expected, int64_t desired)
    int64_t fb_monotonic_ns()

cdef enum:
    UNIT = 1000000
    US_PER_SEC = 1000000

assert UNIT == _PY_UNIT


cdef inline int64_t _accrued(int64_t elapsed_us, int64_t rate, int64_t capacity) noexcept nogil:
    # Same split as _budget_py._accrued; the bounds checked in _config keep every product below
    # 2**63 (secs * rate <= capacity <= 10**18, rest_us * rate < 10**6 * 10**12).
    cdef int64_t secs = elapsed_us // US_PER_SEC
    cdef int64_t rest_us = elapsed_us % US_PER_SEC
    cdef int64_t credit
    if secs > capacity // rate:
        return capacity
    credit = secs * rate + rest_us * rate // US_PER_SEC
    return capacity if credit > capacity else credit


cdef inline void _add_capped(fb_budget_t *b, int64_t amount) noexcept nogil:
    # CAS loop rather than fetch-add: a plain add could overshoot capacity, and a taker could
    # spend the overshoot before it is clamped. When the bucket is full (the common case for a
    # healthy service) this is a single load and no write, so successes share the cache line.
    cdef int64_t cur = fb_load_rlx(&b.tk[0])
    cdef int64_t new
    while True:
        new = cur + amount
        if new > b.capacity:
            new = b.capacity
        if new <= cur:
            return
        if fb_cas(&b.tk[0], &cur, new):
            return


cdef inline void _refill(fb_budget_t *b, int64_t now) noexcept nogil:
    # Lazy accrual. The caller that moves last_ns forward by CAS owns the interval it skipped and
    # credits exactly that; a loser sees the new last_ns and credits only what is left, if any.
    # So concurrent callers never credit the same time twice. Whole microseconds only: the rest
    # stays before last_ns and is credited later.
    cdef int64_t last, elapsed_us
    if b.rate == 0:
        return
    if now < 0:
        if not b.use_c_clock:
            return
        now = fb_monotonic_ns()
    last = fb_load_acq(&b.tk[1])
    while True:
        if now - last < 1000:
            return
        elapsed_us = (now - last) // 1000
        if fb_cas(&b.tk[1], &last, last + elapsed_us * 1000):
            break
    _add_capped(b, _accrued(elapsed_us, b.rate, b.capacity))


cdef void fb_budget_deposit(fb_budget_t *b) noexcept nogil:
    _add_capped(b, b.deposit)


cdef int fb_budget_try_take(fb_budget_t *b, int64_t now) noexcept nogil:
    _refill(b, now)
    cdef int64_t cur = fb_load_rlx(&b.tk[0])
    while cur >= UNIT:
        if fb_cas(&b.tk[0], &cur, cur - UNIT):
            return 1
    return 0


cdef inline int64_t _read_clock(object clock) except -1:
    return fb_monotonic_ns() if clock is None else _now(clock)


@cython.final
cdef class RetryBudget:
    """A token bucket that limits retries to a share of successes plus a small steady reserve.

    ``ratio`` tokens are deposited per success (``record_success()``), ``allow_retry()`` takes one
    token or refuses, ``min_per_sec`` tokens per second accrue lazily, and the bucket holds at most
    ``capacity`` tokens (it starts full). ``clock`` (a zero-argument callable returning int
    nanoseconds, such as ``fastbreaker.testing.FakeClock``) replaces the monotonic clock.
    """

    # The state is set once, by the first __init__, before any other thread can see the object; a
    # second __init__ is refused (it would race with the budget's users).
    __signature__ = _SIGNATURE

    def __init__(self, ratio=0.1, capacity=100.0, min_per_sec=1.0, *, clock=None, **unknown):
        if unknown:  # a mistyped keyword names this class (Cython's own error would not)
            _check_keywords("RetryBudget", unknown, _KEYWORDS)
        if self._ready:
            raise RuntimeError("RetryBudget.__init__ called twice: create a new budget")
        deposit, cap, rate = _config(ratio, capacity, min_per_sec)
        _check_clock(clock)
        self._clock = clock
        self.state.deposit = deposit
        self.state.capacity = cap
        self.state.rate = rate
        self.state.use_c_clock = clock is None
        self.state.tokens = cap
        self.state.last_ns = _read_clock(clock)
        self.state.tk = &self.state.tokens
        self._ready = True

    @classmethod
    def _shared(cls, ratio, capacity, min_per_sec, clock, view, lock=None):
        """A budget whose tokens and refill time are two words of a SharedRegion (laid out
        by ``shared_init``); ``lock`` is for the twin, which needs one."""
        cdef RetryBudget self = cls(ratio, capacity, min_per_sec, clock=clock)
        cdef int64_t[::1] words = view.cast("q")
        self._view = view
        self.state.tk = &words[0]
        return self

    def __copy__(self):
        raise _not_copyable(self)

    def __deepcopy__(self, memo):
        raise _not_copyable(self)

    def __reduce_ex__(self, protocol):
        raise _not_copyable(self)

    @cython.binding(False)
    def record_success(self):
        """Deposit ``ratio`` tokens, up to ``capacity``. Never reads the clock."""
        if not self._ready:
            _not_ready()
        fb_budget_deposit(&self.state)

    @cython.binding(False)
    def allow_retry(self):
        """Take one token if at least one is available (after the lazy refill); else ``False``."""
        cdef int64_t now = -1
        if not self._ready:
            _not_ready()
        if self._clock is not None:
            now = _now(self._clock)
        return <bint>fb_budget_try_take(&self.state, now)

    @property
    def tokens(self):
        """The tokens available now, including what has accrued since the last refill."""
        if not self._ready:
            _not_ready()
        _refill(&self.state, _read_clock(self._clock))
        return <double>fb_load_acq(&self.state.tk[0]) / UNIT

    @property
    def ratio(self):
        """Tokens deposited per success."""
        if not self._ready:
            _not_ready()
        return <double>self.state.deposit / UNIT

    @property
    def capacity(self):
        """The most tokens the bucket holds."""
        if not self._ready:
            _not_ready()
        return <double>self.state.capacity / UNIT

    @property
    def min_per_sec(self):
        """Tokens that accrue per second without any success."""
        if not self._ready:
            _not_ready()
        return <double>self.state.rate / UNIT

    # -- fleet coordination (fastbreaker.contrib.redis) -------------------------------------------
    def _fleet(self, int64_t delta):
        """The fleet's entry point: the twin documents it (``_budget_py``)."""
        cdef int64_t cur, new
        if not self._ready:
            _not_ready()
        if delta < -(1 << 62) or delta > (1 << 62):
            raise ValueError(f"delta must be within +-2**62 token units, got {delta!r}")
        _refill(&self.state, _read_clock(self._clock))
        cur = fb_load_rlx(&self.state.tk[0])
        while True:
            new = cur + delta
            if new > self.state.capacity:
                new = self.state.capacity
            if new < 0:
                new = 0
            if new == cur or fb_cas(&self.state.tk[0], &cur, new):
                return new

    def __repr__(self):
        if not self._ready:
            return "<RetryBudget (not initialised)>"
        return (
            f"RetryBudget(ratio={self.ratio!r}, capacity={self.capacity!r}, "
            f"min_per_sec={self.min_per_sec!r}, "
            f"tokens={<double>fb_load_acq(&self.state.tk[0]) / UNIT!r})"
        )


def shared_size():
    """The bytes of a shared budget's words (SharedRegion)."""
    return 2 * sizeof(int64_t)


def shared_init(view, int64_t capacity_units, clock):
    """A new shared budget's words: full, refilled now."""
    cdef int64_t[::1] words = view.cast("q")
    words[0] = capacity_units
    words[1] = _read_clock(clock)


def _hammer(RetryBudget budget not None, Py_ssize_t deposits, Py_ssize_t takes, int64_t now, int64_t step):
    """Test-only: ``deposits`` deposits interleaved with ``takes`` takes at times ``now``,
    ``now + step``, ... through the nogil entry points, with the GIL released so that threads
    really run in parallel. Returns the number of tokens taken."""
    cdef Py_ssize_t i
    cdef Py_ssize_t taken = 0
    cdef fb_budget_t *b = &budget.state
    with nogil:
        for i in range(deposits if deposits > takes else takes):
            if i < deposits:
                fb_budget_deposit(b)
            if i < takes:
                taken += fb_budget_try_take(b, now + i * step)
    return taken


cdef fb_budget_t *fb_budget_handle(object budget) except NULL:
    if type(budget) is not RetryBudget:
        raise TypeError(f"expected a compiled fastbreaker.RetryBudget, got {budget!r}")
    if not (<RetryBudget>budget)._ready:
        _not_ready()
    return &(<RetryBudget>budget).state


cdef int _not_ready() except -1:
    raise RuntimeError("this RetryBudget was never initialised (made with __new__ without __init__)")
