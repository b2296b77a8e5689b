# cython: language_level=3, freethreading_compatible=True
# cython: auto_pickle=False
"""Bulkhead and AdaptiveLimiter, compiled: the counters of ``_bulkhead_py`` (the spec) on C atomics.

One word holds ``in_flight`` (low 32 bits) and ``waiting`` (high bits), so that admission ("nobody
waits and in_flight < floor(limit)") and the fast release ("nobody waits") are each one CAS. The
limit is a double stored as its 64-bit pattern, changed by CAS (AIMD) or by a store under the
gradient's lock. Waiting, the handoff queue and the call paths are the shared Python of
``_bulkhead``; the ``_q_*`` methods are the atomic steps it calls under its queue lock.
"""

cimport cython
from cpython.contextvars cimport get_value
from libc.stdint cimport INT64_MIN, int64_t
from libc.string cimport memcpy

import inspect as _inspect

from . import _bulkhead as _b
from ._bulkhead import BulkheadMetrics
from ._deadline import current_var as _deadline_var
from ._durations import read_clock as _read_clock
from ._errors import not_copyable as _not_copyable
from ._keywords import check_keywords as _check_keywords, keyword_names as _keyword_names
from ._limit_gradient import Gradient as _Gradient

cdef extern from "_fb_atomic.h" nogil:
    int64_t fb_load_acq(int64_t *p)
    int64_t fb_load_rlx(int64_t *p)
    void fb_store_rel(int64_t *p, int64_t v)
    int64_t fb_add(int64_t *p, int64_t v)
    int fb_cas(int64_t *p, int64_t *expected, int64_t desired)
    void fb_max(int64_t *p, int64_t v)
    int64_t fb_monotonic_ns()
    int fb_cas_strong(int64_t *p, int64_t *expected, int64_t desired)

cdef extern from "_fb_process.h" nogil:
    int64_t fb_owner_self()
    bint fb_owner_gone(int64_t owner)

cdef enum:
    FIXED = 0
    AIMD = 1
    GRADIENT = 2

cdef int64_t MASK = 0xFFFFFFFF
cdef int64_t ONE_WAITER = 1LL << 32
cdef int64_t NO_CUT = INT64_MIN

assert (FIXED, AIMD, GRADIENT) == (_b.FIXED, _b.AIMD, _b.GRADIENT)
assert NO_CUT == _b.NO_CUT

cdef object _release_slow = _b.release_slow
cdef object _acquire = _b.acquire
cdef object _acquire_async = _b.acquire_async
cdef object _NOTHING_HELD = "release() without a matching acquisition: nothing is held"


cdef inline double _dbl(int64_t bits) noexcept nogil:
    cdef double d
    memcpy(&d, &bits, 8)
    return d


cdef inline int64_t _bits(double d) noexcept nogil:
    cdef int64_t v
    memcpy(&v, &d, 8)
    return v


cdef inline int64_t _cap(fb_bulkhead_t *b) noexcept nogil:
    return <int64_t>_dbl(fb_load_acq(&b.limit))


# -- a Bulkhead in a SharedRegion ----------------------------------------------------------------
# Its block: the counters below, then one owner word per slot (0: free, else the process holding
# it: its pid and start time, see _fb_process.h). A slot is taken by one CAS of a free owner word
# to this process's owner (the scan starts at a rotating cursor), and given back by one CAS of an
# owner word holding it to 0, so every slot names its holder. When a try_acquire() finds every
# slot taken, it frees the slots whose process no longer exists (kill(pid, 0) fails with ESRCH,
# or the pid now belongs to a process with another start time), at most once per RECLAIM_NS per
# bulkhead (the CAS winner on the last reclaim time does it), then scans again. A shared bulkhead
# never waits: a waiter in one process could not be woken by a release in another.
cdef enum:
    SB_IN_FLIGHT = 0
    SB_ADMITTED = 1
    SB_REJECTED = 2
    SB_TIMED_OUT = 3
    SB_CANCELLED = 4
    SB_WAITED = 5
    SB_PEAK = 6
    SB_RECLAIM = 7
    SB_CURSOR = 8
    SB_OWNERS = 16    # the owner words start on the third cache line

cdef int64_t RECLAIM_NS = 100_000_000  # 100 ms
cdef int64_t fb_owner = 0  # this process (refreshed after a fork)

def _refresh_pid():
    global fb_owner
    fb_owner = fb_owner_self()

_refresh_pid()
import os as _os
_os.register_at_fork(after_in_child=_refresh_pid)

cdef inline int _shared_take(int64_t *blk, int64_t cap) noexcept nogil:
    cdef int64_t start = (fb_add(&blk[SB_CURSOR], 1) - 1) % cap, i, j, cur, n
    cdef int64_t *owners = blk + <int>SB_OWNERS
    for i in range(cap):
        j = start + i
        if j >= cap:
            j -= cap
        cur = 0
        if fb_load_rlx(&owners[j]) == 0 and fb_cas_strong(&owners[j], &cur, fb_owner):
            n = fb_add(&blk[SB_IN_FLIGHT], 1)
            fb_add(&blk[SB_ADMITTED], 1)
            fb_max(&blk[SB_PEAK], n)
            return 1
    return 0

cdef int64_t _shared_reclaim(int64_t *blk, int64_t cap, int64_t now) noexcept nogil:
    """Free the slots of processes that are gone (at most once per RECLAIM_NS); how many."""
    cdef int64_t last = fb_load_rlx(&blk[SB_RECLAIM]), j, owner, freed = 0
    cdef int64_t *owners = blk + <int>SB_OWNERS
    if now < 0 or (last != 0 and now - last < RECLAIM_NS):
        return 0
    if not fb_cas_strong(&blk[SB_RECLAIM], &last, now if now != 0 else 1):
        return 0
    for j in range(cap):
        owner = fb_load_rlx(&owners[j])
        if owner != 0 and owner != fb_owner and fb_owner_gone(owner):
            if fb_cas_strong(&owners[j], &owner, 0):
                fb_add(&blk[SB_IN_FLIGHT], -1)
                freed += 1
    return freed

cdef int _shared_try_acquire(fb_bulkhead_t *b, int64_t now) noexcept nogil:
    cdef int64_t cap = _cap(b)
    if _shared_take(b.shared, cap):
        return 1
    if now < 0 and b.use_c_clock:
        now = fb_monotonic_ns()
    if _shared_reclaim(b.shared, cap, now) and _shared_take(b.shared, cap):
        return 1
    fb_add(&b.shared[SB_REJECTED], 1)
    return 0

cdef int _shared_release(fb_bulkhead_t *b) noexcept nogil:
    """1: freed one slot this process holds; -1: it holds none."""
    cdef int64_t cap = _cap(b), j, cur
    cdef int64_t *owners = b.shared + <int>SB_OWNERS
    for j in range(cap):
        cur = fb_owner
        if fb_load_rlx(&owners[j]) == cur and fb_cas_strong(&owners[j], &cur, 0):
            fb_add(&b.shared[SB_IN_FLIGHT], -1)
            return 1
    return -1

def shared_size(int64_t max_concurrent):
    """The bytes of a shared bulkhead's block (SharedRegion)."""
    return (<int64_t>SB_OWNERS + max_concurrent) * sizeof(int64_t)

def shared_init(view, int64_t max_concurrent):
    """A new shared bulkhead: zeroed memory is every slot free."""

cdef inline int _admit(fb_bulkhead_t *b) noexcept nogil:
    # Admission: nobody waits (a newcomer never barges past a waiter) and a slot is free.
    if b.shared != NULL:
        return _shared_take(b.shared, _cap(b)) or _shared_try_acquire_quiet(b)
    cdef int64_t w = fb_load_acq(&b.word)
    cdef int64_t cap = _cap(b)
    while (w >> 32) == 0 and (w & MASK) < cap:
        if fb_cas(&b.word, &w, w + 1):
            fb_add(&b.admitted, 1)
            fb_max(&b.peak, (w & MASK) + 1)
            return 1
    return 0


cdef inline int _shared_try_acquire_quiet(fb_bulkhead_t *b) noexcept nogil:
    # _admit's second chance: reclaim, then take (a refusal is counted by the caller's path)
    cdef int64_t now = fb_monotonic_ns() if b.use_c_clock else -1
    return _shared_reclaim(b.shared, _cap(b), now) and _shared_take(b.shared, _cap(b))

cdef inline int _release_fast(fb_bulkhead_t *b) noexcept nogil:
    # 1: freed; 0: someone waits, the slot must be handed on (slow path); -1: nothing held.
    if b.shared != NULL:
        return _shared_release(b)
    cdef int64_t w = fb_load_acq(&b.word)
    while True:
        if (w & MASK) == 0:
            return -1
        if (w >> 32) != 0:
            return 0
        if fb_cas(&b.word, &w, w - 1):
            return 1


cdef int _release_slow_gil(fb_bulkhead_t *b) noexcept with gil:
    try:
        _release_slow(<object>b.owner)
        return 0
    except RuntimeError:
        return -1


cdef int fb_bulkhead_try_acquire(fb_bulkhead_t *b) noexcept nogil:
    if b.shared != NULL:
        return _shared_try_acquire(b, -1)
    if _admit(b):
        return 1
    fb_add(&b.rejected, 1)
    return 0


cdef int fb_bulkhead_release(fb_bulkhead_t *b) noexcept nogil:
    cdef int r = _release_fast(b)
    if r == 0:
        return _release_slow_gil(b)
    return 0 if r == 1 else -1


cdef int fb_limiter_try_acquire(fb_bulkhead_t *b) noexcept nogil:
    return fb_bulkhead_try_acquire(b)


cdef void _aimd(fb_bulkhead_t *b, int64_t rtt, int dropped, int64_t now, int64_t in_flight) noexcept nogil:
    # The spec is _bulkhead.aimd. A decrease is claimed by moving last_cut forward with a CAS:
    # of the samples that started after the last cut, exactly one cuts (once per round trip);
    # the limit itself is then changed by a CAS loop, as is growth, so no update is lost.
    cdef int64_t start, cut, cur
    cdef double lim, new
    if dropped or (rtt >= 0 and rtt > b.threshold_ns):
        start = now - (rtt if rtt > 0 else 0)
        cut = fb_load_acq(&b.last_cut)
        while start >= cut:
            if fb_cas(&b.last_cut, &cut, now):
                cur = fb_load_acq(&b.limit)
                while True:
                    new = _dbl(cur) * b.backoff
                    if new < b.min_limit:
                        new = b.min_limit
                    if fb_cas(&b.limit, &cur, _bits(new)):
                        return
        return
    cur = fb_load_acq(&b.limit)
    while True:
        lim = _dbl(cur)
        if 10 * in_flight < 9 * <int64_t>lim:
            return
        new = lim + 1.0 / lim
        if new > b.max_limit:
            new = b.max_limit
        if new == lim or fb_cas(&b.limit, &cur, _bits(new)):
            return


cdef int _gradient_gil(fb_bulkhead_t *b, int64_t rtt, int dropped, int64_t now, int64_t in_flight) noexcept with gil:
    cdef AdaptiveLimiter lim = <AdaptiveLimiter>b.owner
    try:
        lim._gradient.sample(lim, None if rtt < 0 else rtt, bool(dropped), now, in_flight)
    except BaseException:
        return -1
    return 0


cdef int fb_limiter_release(fb_bulkhead_t *b, int64_t rtt_ns, int dropped, int64_t now) noexcept nogil:
    cdef int64_t in_flight = fb_load_acq(&b.word) & MASK
    if in_flight == 0:
        return -1
    if rtt_ns >= 0 or dropped:
        if now < 0 and b.use_c_clock:
            now = fb_monotonic_ns()
        if now >= 0:
            if b.algorithm == AIMD:
                _aimd(b, rtt_ns, dropped, now, in_flight)
            elif b.algorithm == GRADIENT:
                _gradient_gil(b, rtt_ns, dropped, now, in_flight)
    return fb_bulkhead_release(b)


cdef inline int _release(_Slots self) except -1:
    cdef int r = _release_fast(&self.st)
    if r == 1:
        return 0
    if r == -1:
        raise RuntimeError(_NOTHING_HELD)
    _release_slow(self)
    return 0


cdef class _Slots:
    """What Bulkhead and AdaptiveLimiter share: the counters, the fast paths, the queue steps."""

    cdef int _setup(self, double wait_s, int64_t max_waiting, object name, object clock) except -1:
        if self._ready:
            raise RuntimeError(f"{type(self).__name__}.__init__ called twice: create a new one")
        self._queue = _b.WaitQueue()
        self._name = name
        self._max_wait = wait_s
        self._max_waiting = max_waiting
        self._clock = clock
        self.st.use_c_clock = clock is None
        self.st.last_cut = NO_CUT
        self.st.owner = <void *>self
        return 0

    def __copy__(self):
        raise _not_copyable(self)

    def __deepcopy__(self, memo):
        raise _not_copyable(self)

    def __reduce_ex__(self, protocol):
        raise _not_copyable(self)

    def _cap(self):
        return _cap(&self.st)

    def _now(self):
        return fb_monotonic_ns() if self._clock is None else _read_clock(self._clock)

    @cython.binding(False)
    def try_acquire(self):
        """Take a slot if one is free and nobody waits for one; never waits."""
        if self.st.shared != NULL:
            return <bint>_shared_try_acquire(&self.st, -1 if self._clock is None else self._now())
        return <bint>fb_bulkhead_try_acquire(&self.st)

    def _try_admit(self):
        return <bint>_admit(&self.st)

    def _release_slot(self):
        _release(self)

    # -- the queue's steps, called by _bulkhead under the queue lock -----------------------

    def _q_enter(self):
        cdef int64_t w = fb_load_acq(&self.st.word)
        cdef int64_t cap
        while True:
            cap = _cap(&self.st)
            if (w >> 32) == 0 and (w & MASK) < cap:
                if fb_cas(&self.st.word, &w, w + 1):
                    fb_add(&self.st.admitted, 1)
                    fb_max(&self.st.peak, (w & MASK) + 1)
                    return _b.ADMITTED
            elif (w >> 32) >= self._max_waiting:
                fb_add(&self.st.rejected, 1)
                return _b.FULL
            elif fb_cas(&self.st.word, &w, w + ONE_WAITER):
                return _b.QUEUED

    def _q_transfer(self):
        cdef int64_t w = fb_load_acq(&self.st.word)
        while (w >> 32) > 0 and (w & MASK) < _cap(&self.st):
            if fb_cas(&self.st.word, &w, w - ONE_WAITER + 1):
                fb_max(&self.st.peak, (w & MASK) + 1)
                return True
        return False

    def _q_unreserve(self):
        fb_add(&self.st.word, -1)

    def _q_leave(self):
        fb_add(&self.st.word, -ONE_WAITER)

    def _q_free(self):
        cdef int64_t w = fb_load_acq(&self.st.word)
        while (w & MASK) > 0:
            if fb_cas(&self.st.word, &w, w - 1):
                return True
        return False

    def _q_count(self, int kind):
        if self.st.shared != NULL:  # never waits: only refusals reach here
            fb_add(&self.st.shared[SB_REJECTED], 1)
            return
        if kind == _b.WOKEN:
            fb_add(&self.st.admitted, 1)
            fb_add(&self.st.waited, 1)
        elif kind == _b.CANCELLED:
            fb_add(&self.st.cancelled, 1)
        else:
            fb_add(&self.st.rejected, 1)
            if kind != _b.REFUSED:
                fb_add(&self.st.timed_out, 1)

    # -- public -----------------------------------------------------------------------------

    @property
    def in_flight(self):
        """Slots held now (including one being handed to a waiter)."""
        if self.st.shared != NULL:
            return fb_load_acq(&self.st.shared[SB_IN_FLIGHT])
        return fb_load_acq(&self.st.word) & MASK

    @property
    def waiting(self):
        """Callers waiting for a slot now."""
        if self.st.shared != NULL:
            return 0
        return fb_load_acq(&self.st.word) >> 32

    @property
    def max_concurrent(self):
        """The number of slots (for an AdaptiveLimiter, ``floor(limit)`` now)."""
        return _cap(&self.st)

    @property
    def name(self):
        """The name given at construction (shown in errors), or None."""
        return self._name

    def metrics(self):
        """A snapshot of the counters."""
        cdef int64_t w = fb_load_acq(&self.st.word)
        cdef int64_t *blk = self.st.shared
        if blk != NULL:
            return BulkheadMetrics(
                fb_load_acq(&blk[SB_ADMITTED]), fb_load_acq(&blk[SB_REJECTED]),
                fb_load_acq(&blk[SB_TIMED_OUT]), fb_load_acq(&blk[SB_CANCELLED]),
                fb_load_acq(&blk[SB_WAITED]), fb_load_acq(&blk[SB_IN_FLIGHT]), 0,
                fb_load_acq(&blk[SB_PEAK]),
            )
        return BulkheadMetrics(
            fb_load_acq(&self.st.admitted), fb_load_acq(&self.st.rejected),
            fb_load_acq(&self.st.timed_out), fb_load_acq(&self.st.cancelled),
            fb_load_acq(&self.st.waited), w & MASK, w >> 32, fb_load_acq(&self.st.peak),
        )

    def call_async(self, fn, /, *args, **kwargs):
        """Await ``fn(*args, **kwargs)`` holding a slot (waiting up to ``max_wait`` for one)."""
        return _b.call_async(self, fn, args, kwargs)

    def __call__(self, fn):
        """``@bulkhead``: guard a sync or async function."""
        return _b.decorate(self, fn)


# inspect.signature() and help() (Cython gives a class no signature), and the keywords taken.
_BULKHEAD_SIGNATURE = _inspect.signature(_b.bulkhead_parameters)
_BULKHEAD_KEYWORDS = _keyword_names(_BULKHEAD_SIGNATURE)
_REQUIRED = object()
_LIMITER_SIGNATURE = _inspect.signature(_b.limiter_parameters)
_LIMITER_KEYWORDS = _keyword_names(_LIMITER_SIGNATURE)


@cython.final
cdef class Bulkhead(_Slots):
    """At most ``max_concurrent`` calls at once; others wait up to ``max_wait`` seconds, in
    order of arrival, at most ``max_waiting`` of them (default ``max_concurrent``), or fail with
    ``BulkheadFullError``. ``clock`` (int ns, such as ``testing.FakeClock``) times ``.waited``.
    """

    __signature__ = _BULKHEAD_SIGNATURE

    def __init__(self, max_concurrent=_REQUIRED, *, max_wait=0.0, max_waiting=None, name=None,
                 clock=None, **unknown):
        # A mistyped keyword names this class (Cython's own error would not), even when it is
        # the required one: Bulkhead(max_concurent=4).
        if unknown:
            _check_keywords("Bulkhead", unknown, _BULKHEAD_KEYWORDS)
        if max_concurrent is _REQUIRED:
            raise TypeError("Bulkhead() missing 1 required positional argument: 'max_concurrent'")
        cap, wait_s, waiting, name = _b.check_bulkhead(
            max_concurrent, max_wait, max_waiting, name, clock
        )
        self._setup(wait_s, waiting, name, clock)
        self.st.limit = _bits(<double>cap)
        self.st.algorithm = FIXED
        self._ready = True

    @classmethod
    def _shared(cls, max_concurrent, name, clock, view, lock=None):
        """A bulkhead whose slots are the block ``view`` of a SharedRegion (see the block's
        comment); it never waits. ``lock`` is for the twin, which needs one."""
        cdef Bulkhead self = cls(max_concurrent, max_wait=0.0, max_waiting=0, name=name,
                                 clock=clock)
        cdef int64_t[::1] words = view.cast("q")
        if words.shape[0] < <Py_ssize_t>SB_OWNERS + max_concurrent:
            raise ValueError("the block is too small for max_concurrent")
        self._view = view
        self.st.shared = &words[0]
        return self

    @cython.binding(False)
    def release(self):
        """Give back a slot taken by ``try_acquire()``; RuntimeError if none is held."""
        _release(self)

    def __enter__(self):
        if get_value(_deadline_var) is not None or not _admit(&self.st):
            _acquire(self)
        return self

    def __exit__(self, exc_type, exc, tb):
        _release(self)

    async def __aenter__(self):
        if get_value(_deadline_var) is not None or not _admit(&self.st):
            await _acquire_async(self)
        return self

    async def __aexit__(self, exc_type, exc, tb):
        _release(self)

    @cython.binding(False)
    def call(self, fn, /, *args, **kwargs):
        """Run ``fn(*args, **kwargs)`` holding a slot (waiting up to ``max_wait`` for one)."""
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {fn!r}")
        if get_value(_deadline_var) is not None or not _admit(&self.st):
            _acquire(self)
        try:
            return fn(*args, **kwargs)
        finally:
            _release(self)

    def _start_or_release(self):
        return 0

    def _done(self, start, exc):
        _release(self)

    def __repr__(self):
        if not self._ready:
            return "<Bulkhead (not initialised)>"
        return (
            f"Bulkhead(max_concurrent={_cap(&self.st)}, max_wait={self._max_wait!r}, "
            f"max_waiting={self._max_waiting}, name={self._name!r}, in_flight={self.in_flight}, "
            f"waiting={self.waiting})"
        )


@cython.final
cdef class AdaptiveLimiter(_Slots):
    """A bulkhead whose limit adapts to the observed round trips (AIMD or gradient).

    See ``_bulkhead.aimd`` and ``_limit_gradient`` for the algorithms. The call paths time each
    call with ``clock`` and report ``dropped=True`` for exceptions matching ``drop_on`` and for
    ``DeadlineExceeded``.
    """

    __signature__ = _LIMITER_SIGNATURE

    def __init__(self, initial_limit=20, *, min_limit=4, max_limit=400, algorithm="aimd",
                 rtt_threshold=0.25, backoff=0.9, max_wait=0.0, max_waiting=None,
                 drop_on=(TimeoutError,), name=None, clock=None, **unknown):
        if unknown:  # a mistyped keyword names this class (Cython's own error would not)
            _check_keywords("AdaptiveLimiter", unknown, _LIMITER_KEYWORDS)
        cfg = _b.check_limiter(
            initial_limit, min_limit, max_limit, algorithm, rtt_threshold, backoff, max_wait,
            max_waiting, drop_on, name, clock,
        )
        self._setup(cfg.max_wait, cfg.max_waiting, cfg.name, clock)
        self._cfg = cfg
        self.st.limit = _bits(cfg.initial)
        self.st.min_limit = cfg.min_limit
        self.st.max_limit = cfg.max_limit
        self.st.backoff = cfg.backoff
        self.st.threshold_ns = cfg.threshold_ns
        self.st.algorithm = cfg.algorithm
        self._drop_on = cfg.drop_on
        self._gradient = _Gradient(cfg) if cfg.algorithm == GRADIENT else None
        self._ready = True

    @property
    def limit(self):
        """The current limit; ``floor(limit)`` calls may run at once."""
        return _dbl(fb_load_acq(&self.st.limit))

    def _get_limit(self):
        return _dbl(fb_load_acq(&self.st.limit))

    def _set_limit(self, double value):
        fb_store_rel(&self.st.limit, _bits(value))

    def release(self, rtt=None, *, dropped=False):
        """Give back a slot, with the call's round trip (seconds) as a sample for the limit.

        ``dropped=True`` reports a drop (a timeout, an overload answer). With neither, the slot is
        freed and the limit is unchanged. RuntimeError (and nothing changes) if none is held.
        """
        ns = None if rtt is None else _b.rtt_ns(rtt)
        if ns is None and not dropped:
            _release(self)
            return
        self._release_sample(ns, bool(dropped), self._now())

    def _release_sample(self, rtt, bint dropped, int64_t now):
        cdef int64_t in_flight = fb_load_acq(&self.st.word) & MASK
        cdef int64_t ns = -1 if rtt is None else <int64_t>rtt
        if in_flight == 0:
            raise RuntimeError(_NOTHING_HELD)
        if self.st.algorithm == AIMD:
            _aimd(&self.st, ns, dropped, now, in_flight)
        else:
            self._gradient.sample(self, rtt, dropped, now, in_flight)
        _release(self)

    def _start_or_release(self):
        try:
            return self._now()
        except BaseException:
            _release(self)
            raise

    def _done(self, start, exc):
        drop = _b.is_drop(self, exc)
        if drop is None:
            _release(self)
            return
        try:
            now = self._now()
        except BaseException:
            _release(self)
            raise
        self._release_sample(max(0, now - start), drop, now)

    def __enter__(self):
        if get_value(_deadline_var) is not None or not _admit(&self.st):
            _acquire(self)
        _b.push_start(self, self._start_or_release())
        return self

    def __exit__(self, exc_type, exc, tb):
        start = _b.pop_start(self)
        if start is None:
            _release(self)
        else:
            self._done(start, exc)

    async def __aenter__(self):
        if get_value(_deadline_var) is not None or not _admit(&self.st):
            await _acquire_async(self)
        _b.push_start(self, self._start_or_release())
        return self

    async def __aexit__(self, exc_type, exc, tb):
        self.__exit__(exc_type, exc, tb)

    def call(self, fn, /, *args, **kwargs):
        """Run ``fn(*args, **kwargs)`` holding a slot (waiting up to ``max_wait`` for one)."""
        return _b.call(self, fn, args, kwargs)

    def __repr__(self):
        if not self._ready:
            return "<AdaptiveLimiter (not initialised)>"
        alg = "aimd" if self._gradient is None else "gradient"
        return (
            f"AdaptiveLimiter(limit={self.limit!r}, algorithm={alg!r}, name={self._name!r}, "
            f"in_flight={self.in_flight}, waiting={self.waiting})"
        )


def _hammer(_Slots obj not None, Py_ssize_t rounds, int64_t rtt_ns, int64_t now):
    """Test-only: ``rounds`` try_acquire/release pairs through the nogil entry points with the
    GIL released. Returns ``(admitted, max in_flight seen by this thread, errors)``."""
    cdef Py_ssize_t i, got = 0, errors = 0
    cdef int64_t seen = 0, cur
    cdef fb_bulkhead_t *b = &obj.st
    cdef bint limiter = b.algorithm != FIXED
    with nogil:
        for i in range(rounds):
            if fb_bulkhead_try_acquire(b):
                got += 1
                cur = fb_load_acq(&b.word) & MASK
                if cur > seen:
                    seen = cur
                if limiter:
                    if fb_limiter_release(b, rtt_ns, 0, now + i) != 0:
                        errors += 1
                elif fb_bulkhead_release(b) != 0:
                    errors += 1
    return got, seen, errors


cdef fb_bulkhead_t *fb_bulkhead_handle(object obj) except NULL:
    if type(obj) is not Bulkhead:
        raise TypeError(f"expected a compiled fastbreaker.Bulkhead, got {obj!r}")
    if not (<Bulkhead>obj)._ready:
        raise RuntimeError("this Bulkhead was never initialised")
    return &(<Bulkhead>obj).st


cdef fb_bulkhead_t *fb_limiter_handle(object obj) except NULL:
    if type(obj) is not AdaptiveLimiter:
        raise TypeError(f"expected a compiled fastbreaker.AdaptiveLimiter, got {obj!r}")
    if not (<AdaptiveLimiter>obj)._ready:
        raise RuntimeError("this AdaptiveLimiter was never initialised")
    return &(<AdaptiveLimiter>obj).st
