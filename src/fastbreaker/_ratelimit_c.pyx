# cython: language_level=3, freethreading_compatible=True
# cython: auto_pickle=False
"""RateLimiter and RateLimiterMap, compiled: the GCRA of ``_ratelimit_py`` (the spec) on C atomics.

Each rate's theoretical arrival time is one int64 word changed only by compare-and-swap, in
``noexcept nogil`` functions that other Cython code can call without the GIL (``.pxd``). The
``def`` methods read the clock once and pass ``now`` in; waiting, ``with``, ``call`` and the
map's rare steps (creating a key, eviction) are the shared Python of ``_ratelimit``.
"""

cimport cython
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.stdint cimport int64_t

import inspect as _inspect

from . import _ratelimit as _rl
from ._region_map import TAGS_AT as _TAGS_AT
from ._durations import check_clock as _check_clock, read_clock as _read
from ._errors import not_copyable as _not_copyable
from ._keywords import check_keywords as _check_keywords, keyword_names as _keyword_names
from ._ratelimit import RateLimiterMapMetrics as _MapMetrics, RateLimiterMetrics as _Metrics

cdef extern from "_fb_atomic.h" nogil:
    int64_t fb_load_acq(int64_t *p)
    int64_t fb_load_rlx(int64_t *p)
    void fb_store_rel(int64_t *p, int64_t v)
    void fb_store_rlx(int64_t *p, int64_t v)
    int64_t fb_add(int64_t *p, int64_t v)
    int fb_cas(int64_t *p, int64_t *expected, int64_t desired)
    int64_t fb_monotonic_ns()

assert FB_RATE_MAX == _rl.MAX_RATES
cdef Py_ssize_t TAGS_AT = _TAGS_AT


cdef int _charge(fb_rate_t *r, int64_t w, int64_t now) noexcept nogil:
    # All or nothing without a lock. Pass 1 refuses without writing when any rate refuses, so a
    # refusal (the common case under overload) writes nothing. Pass 2 charges the words in order,
    # one CAS each, re-checking each against its current value; if a rate refuses there (a
    # concurrent request took the room since pass 1), the charges already made are given back
    # by an atomic add: nothing of a refused request stays charged.
    cdef fb_rate_cfg_t *c = r.cfg
    cdef int i, j
    cdef int64_t cur, base, new
    for i in range(c.n):
        cur = fb_load_acq(&r.tat[i])
        base = cur if cur > now else now
        if base + w * c.t[i] - now > c.tau[i]:
            return 0
    for i in range(c.n):
        cur = fb_load_rlx(&r.tat[i])
        while True:
            base = cur if cur > now else now
            new = base + w * c.t[i]
            if new - now > c.tau[i]:
                for j in range(i):
                    fb_add(&r.tat[j], -w * c.t[j])
                return 0
            if fb_cas(&r.tat[i], &cur, new):
                break
    return 1


cdef int fb_rate_try_acquire(fb_rate_t *r, int64_t weight, int64_t now) noexcept nogil:
    if weight < 1 or weight > r.cfg.max_weight:
        return FB_RATE_BAD_WEIGHT
    if now < 0:
        if not r.cfg.use_c_clock:
            return FB_RATE_NEED_CLOCK
        now = fb_monotonic_ns()
    # The units words hold the units beyond one per request (units = requests + extra), so the
    # common weight-1 request costs one atomic add, not two.
    if _charge(r, weight, now):
        fb_add(&r.cnt[0], 1)
        if weight != 1:
            fb_add(&r.cnt[2], weight - 1)
        return 1
    fb_add(&r.cnt[1], 1)
    if weight != 1:
        fb_add(&r.cnt[3], weight - 1)
    return 0


cdef int64_t fb_rate_retry_after_ns(fb_rate_t *r, int64_t weight, int64_t now) noexcept nogil:
    cdef fb_rate_cfg_t *c = r.cfg
    cdef int i
    cdef int64_t cur, x, worst = 0
    if weight < 1 or weight > c.max_weight:
        return -1
    if now < 0:
        if not c.use_c_clock:
            return -1
        now = fb_monotonic_ns()
    for i in range(c.n):
        cur = fb_load_acq(&r.tat[i])
        x = (cur if cur > now else now) + weight * c.t[i] - c.tau[i] - now
        if x > worst:
            worst = x
    return worst


cdef void _refund(fb_rate_t *r, int64_t w, int64_t now) noexcept nogil:
    # Never below now: a refund cannot leave more capacity than a fresh limiter has.
    cdef fb_rate_cfg_t *c = r.cfg
    cdef int i
    cdef int64_t cur, new
    for i in range(c.n):
        cur = fb_load_rlx(&r.tat[i])
        while cur > now:
            new = cur - w * c.t[i]
            if new < now:
                new = now
            if fb_cas(&r.tat[i], &cur, new):
                break


cdef bint _is_idle(fb_rate_t *r, int64_t now) noexcept nogil:
    cdef int i
    for i in range(r.cfg.n):
        if fb_load_acq(&r.tat[i]) > now:
            return False
    return True


cdef object _setup(fb_rate_cfg_t *c, tuple rates, name, clock):
    """Validate and fill the shared configuration; returns the tuple of Rate objects."""
    out, t, tau = _rl.rates_config(rates)
    _rl.check_name(name)
    _check_clock(clock)
    c.n = len(out)
    c.use_c_clock = clock is None
    for i in range(c.n):
        c.t[i] = t[i]
        c.tau[i] = tau[i]
    c.max_weight = min([tau[i] // t[i] for i in range(c.n)])
    return out


cdef inline int64_t _clock_ns(object clock) except -1:
    return fb_monotonic_ns() if clock is None else _read(clock)


cdef inline int64_t _weight(object weight, fb_rate_cfg_t *c, object owner) except -1:
    cdef int overflow = 0
    cdef long long w
    if type(weight) is int:
        w = PyLong_AsLongLongAndOverflow(weight, &overflow)
        if overflow == 0 and 1 <= w <= c.max_weight:
            return w
    raise _rl.bad_weight(owner, weight)


# inspect.signature() and help() (Cython gives a class no signature), and the keywords taken.
_LIMITER_SIGNATURE = _inspect.signature(_rl.limiter_parameters)
_LIMITER_KEYWORDS = _keyword_names(_LIMITER_SIGNATURE)
_MAP_SIGNATURE = _inspect.signature(_rl.map_parameters)
_MAP_KEYWORDS = _keyword_names(_MAP_SIGNATURE)


@cython.final
cdef class RateLimiter:
    """A GCRA rate limiter over one or more ``rates`` (``Rate`` objects or strings such as
    ``"10/s"``), all of which must admit a request (all or nothing). ``name`` labels it in
    errors; ``clock`` (a zero-argument callable returning int ns, such as
    ``fastbreaker.testing.FakeClock``) replaces the monotonic clock."""

    __signature__ = _LIMITER_SIGNATURE

    def __init__(self, *rates, name=None, clock=None, **unknown):
        if unknown:  # a mistyped keyword names this class (Cython's own error would not)
            _check_keywords("RateLimiter", unknown, _LIMITER_KEYWORDS)
        if self._ready:
            raise RuntimeError("RateLimiter.__init__ called twice: create a new limiter")
        self._rates = _setup(&self.cfg, rates, name, clock)
        self._name = name
        self._clock = clock
        self._queues = {}
        self.state.cfg = &self.cfg
        self.state.tat = &self.words[0]
        self.state.cnt = &self.counts[0]
        self._ready = True

    @classmethod
    def _shared(cls, rates, name, clock, view, lock=None):
        """A limiter whose TAT words are words of a SharedRegion (``lock`` is for the twin);
        its counts stay in this process."""
        cdef RateLimiter self = cls(*rates, name=name, clock=clock)
        cdef int64_t[::1] words = view.cast("q")
        self._view = view
        self.state.tat = &words[0]
        return self

    def __copy__(self):
        raise _not_copyable(self)

    def __deepcopy__(self, memo):
        raise _not_copyable(self)

    def __reduce_ex__(self, protocol):
        raise _not_copyable(self)

    @property
    def rates(self):
        """The limiter's rates."""
        _check(self._ready)
        return self._rates

    @property
    def name(self):
        """The limiter's name (None if not given)."""
        return self._name

    @property
    def _max_interval(self):
        return max([self.cfg.t[i] for i in range(self.cfg.n)])

    def _now(self):
        return _clock_ns(self._clock)

    @cython.binding(False)
    def try_acquire(self, weight=1):
        """Admit ``weight`` units now and charge every rate (True), or charge nothing (False)."""
        # No _check: an uninitialised limiter has max_weight 0, so _weight raises its error.
        cdef int64_t w = _weight(weight, &self.cfg, self)
        cdef int64_t now = fb_monotonic_ns() if self._clock is None else _read(self._clock)
        return fb_rate_try_acquire(&self.state, w, now) == 1

    def _retry_after_ns(self, weight=1):
        _check(self._ready)
        cdef int64_t w = _weight(weight, &self.cfg, self)
        return fb_rate_retry_after_ns(&self.state, w, _clock_ns(self._clock))

    def retry_after(self, weight=1):
        """Seconds until ``try_acquire(weight)`` would succeed; 0.0 if it would now."""
        return self._retry_after_ns(weight) / 1e9

    def refund(self, weight):
        """Give ``weight`` units back to every rate (a cost known only after the call); never
        leaves a rate with more capacity than a fresh limiter."""
        _check(self._ready)
        cdef int64_t w = _weight(weight, &self.cfg, self)
        _refund(&self.state, w, _clock_ns(self._clock))

    def _count_wait(self):
        fb_add(&self.counts[4], 1)

    def metrics(self):
        """Requests and units admitted and rejected, and the number of waits, so far."""
        _check(self._ready)
        cdef int64_t admitted = fb_load_acq(&self.counts[0])
        cdef int64_t rejected = fb_load_acq(&self.counts[1])
        return _Metrics(admitted, rejected, admitted + fb_load_acq(&self.counts[2]),
                        rejected + fb_load_acq(&self.counts[3]), fb_load_acq(&self.counts[4]))

    def acquire(self, weight=1, *, timeout=None):
        """Sleep until ``weight`` units are admitted. ``RateLimitedError`` at once if the wait
        would outlast ``timeout`` (seconds) or the current deadline."""
        _check(self._ready)
        _rl.acquire(self, _rl._NOKEY, _weight(weight, &self.cfg, self), timeout)

    def acquire_async(self, weight=1, *, timeout=None):
        """As ``acquire(weight, timeout=timeout)``, awaiting; waiters are served in arrival
        order."""
        _check(self._ready)
        return _rl.acquire_async(self, _rl._NOKEY, _weight(weight, &self.cfg, self), timeout)

    def __enter__(self):
        _check(self._ready)
        _rl.enter(self)
        return self

    def __exit__(self, *exc):
        return None

    async def __aenter__(self):
        _check(self._ready)
        _rl.enter(self)
        return self

    async def __aexit__(self, *exc):
        return None

    def call(self, fn, /, *args, **kwargs):
        """``fn(*args, **kwargs)`` if one unit is admitted now, else ``RateLimitedError``."""
        _check(self._ready)
        return _rl.call(self, _rl._NOKEY, fn, args, kwargs)

    def call_async(self, fn, /, *args, **kwargs):
        """``await fn(*args, **kwargs)`` if one unit is admitted now, else ``RateLimitedError``."""
        _check(self._ready)
        return _rl.call_async(self, _rl._NOKEY, fn, args, kwargs)

    def __call__(self, fn):
        """``@limiter`` on a function ``fn`` (sync or async): every call charges one unit or
        raises ``RateLimitedError``."""
        _check(self._ready)
        return _rl.decorate(self, fn)

    def __repr__(self):
        if not self._ready:
            return "<RateLimiter (not initialised)>"
        rates = ", ".join([repr(r) for r in self._rates])
        return f"RateLimiter({rates}, name={self._name!r})"


@cython.final
cdef class _Key:
    """One key's words in a compiled RateLimiterMap (no Python fields: not tracked by the GC)."""
    cdef fb_rate_t r
    cdef int64_t last
    cdef int64_t inline_words[2]

    def __dealloc__(self):
        if self.r.tat != NULL and self.r.tat != &self.inline_words[0]:
            PyMem_Free(self.r.tat)


cdef _Key _new_key(RateLimiterMap m):
    cdef _Key k = _Key.__new__(_Key)
    cdef int i
    k.r.cfg = &m.cfg
    k.r.cnt = &m.counts[0]
    if m.cfg.n <= 2:
        k.r.tat = &k.inline_words[0]
    else:
        k.r.tat = <int64_t *>PyMem_Malloc(m.cfg.n * sizeof(int64_t))
        if k.r.tat == NULL:
            raise MemoryError()
    for i in range(m.cfg.n):
        k.r.tat[i] = 0
    return k


@cython.final
cdef class _SlotKey:
    """A shared map's key as this process caches it: its slot's words in the region (last-used,
    then the TATs) and the slot's tag when it was bound (another tag: the key was evicted)."""
    cdef fb_rate_t r
    cdef int64_t *tagp
    cdef int64_t tag
    cdef readonly Py_ssize_t slot


cdef _SlotKey _slot_key(RateLimiterMap m, Py_ssize_t slot, int64_t tag):
    cdef _SlotKey k = _SlotKey.__new__(_SlotKey)
    k.r.cfg = &m.cfg
    k.r.cnt = &m.counts[0]
    k.r.tat = <int64_t *>(m.base + m.blocks_at + slot * m.block) + 1
    k.tagp = <int64_t *>(m.base + TAGS_AT) + slot
    k.tag = tag
    k.slot = slot
    return k


@cython.final
cdef class RateLimiterMap:
    """One GCRA limiter per key over the same ``rates``, at most ``max_keys`` of them: a full
    map evicts idle keys (every rate's TAT in the past: nothing is lost) first, then the least
    recently used (whose debt is forgotten). ``name`` and ``clock`` as for ``RateLimiter``."""

    cdef fb_rate_cfg_t cfg
    cdef int64_t counts[5]
    cdef public dict _d
    cdef public Py_ssize_t _max_keys
    cdef public int64_t _evicted
    cdef object _clock
    cdef object _rates
    cdef object _name
    cdef object _lock
    cdef public object _queues
    cdef bint _ready
    cdef object __weakref__
    cdef public object _shared       # a shared map's SharedKeys (_region_ratelimit), else None
    cdef object _view                # its table's block in the region (keeps it mapped)
    cdef char *base
    cdef Py_ssize_t blocks_at, block

    __signature__ = _MAP_SIGNATURE

    def __cinit__(self, *args, **kwargs):
        self._d = {}

    def __init__(self, *rates, max_keys=10_000, name=None, clock=None, **unknown):
        if unknown:  # a mistyped keyword names this class (Cython's own error would not)
            _check_keywords("RateLimiterMap", unknown, _MAP_KEYWORDS)
        if self._ready:
            raise RuntimeError("RateLimiterMap.__init__ called twice: create a new map")
        self._rates = _setup(&self.cfg, rates, name, clock)
        self._max_keys = _rl.check_max_keys(max_keys)
        self._name = name
        self._clock = clock
        self._lock = _rl.new_lock()
        self._queues = {}
        self._ready = True

    def _attach(self, keys):
        """A map in a SharedRegion: its keys and their words live in ``keys``' table."""
        cdef unsigned char[::1] mv = keys.table.view
        _check(self._ready)
        self._view = keys.table.view
        self.base = <char *>&mv[0]
        self.blocks_at = keys.table.blocks_at
        self.block = keys.table.block
        self._shared = keys
        self._d = {}

    def __copy__(self):
        raise _not_copyable(self)

    def __deepcopy__(self, memo):
        raise _not_copyable(self)

    def __reduce_ex__(self, protocol):
        raise _not_copyable(self)

    @property
    def rates(self):
        """The rates every key gets."""
        _check(self._ready)
        return self._rates

    @property
    def name(self):
        """The map's name (None if not given)."""
        return self._name

    @property
    def max_keys(self):
        """The most keys the map holds."""
        return self._max_keys

    @property
    def _max_interval(self):
        return max([self.cfg.t[i] for i in range(self.cfg.n)])

    def _now(self):
        return _clock_ns(self._clock)

    def _idle(self, _Key e, int64_t now):
        return _is_idle(&e.r, now)

    def _last_used(self, _Key e):
        return e.last

    cdef _Key _create(self, key, int64_t now):
        # The rare path: under the map's lock, so a key never gets two entries and the map never
        # holds more than max_keys.
        _check(self._ready)
        with self._lock:
            k = self._d.get(key)
            if k is None:
                if len(self._d) >= self._max_keys:
                    _rl.evict(self, now)
                k = _new_key(self)
                self._d[key] = k
            return k

    cdef _SlotKey _bind(self, key, int64_t now, bint insert):
        # A shared map's key, cached or (un)cached again after an eviction: under the map's lock.
        # insert: a new key takes a slot (evicting one if the table is full); else None if absent.
        cdef _SlotKey k
        _check(self._ready)
        with self._lock:
            k = self._d.get(key)
            if k is not None and fb_load_acq(k.tagp) == k.tag:
                return k  # another thread bound it while we waited for the lock
            found = self._shared.bind(key, now) if insert else self._shared.find(key)
            if found is None:
                return None
            k = _slot_key(self, found[0], found[1])
            self._shared.remember(self._d, key, k)
            return k

    cdef int _shared_try(self, key, int64_t w, int64_t now) except -1:
        cdef object found = self._d.get(key)
        cdef _SlotKey k
        if found is None:
            k = self._bind(key, now, True)
        else:
            k = <_SlotKey>found  # a shared map's dict holds only _SlotKey values
            if fb_load_acq(k.tagp) != k.tag:
                k = self._bind(key, now, True)  # its slot was given to another key
        fb_store_rlx(k.r.tat - 1, now)  # the slot's last-used word
        return fb_rate_try_acquire(&k.r, w, now)

    cdef fb_rate_t *_existing(self, key) except? NULL:
        # The key's words, or NULL for an absent key (a shared map looks in its table).
        cdef _SlotKey k
        if self._shared is None:
            found = self._d.get(key)
            return NULL if found is None else &(<_Key>found).r
        k = self._d.get(key)
        if k is None or fb_load_acq(k.tagp) != k.tag:
            k = self._bind(key, 0, False)
        return NULL if k is None else &k.r

    @cython.binding(False)
    def try_acquire(self, key, weight=1):
        """Admit ``weight`` units for ``key`` now (True) or charge nothing (False)."""
        cdef int64_t w = _weight(weight, &self.cfg, self)
        cdef int64_t now = fb_monotonic_ns() if self._clock is None else _read(self._clock)
        if self._shared is not None:
            return self._shared_try(key, w, now) == 1
        cdef object found = self._d.get(key)
        cdef _Key k
        if found is None:
            k = self._create(key, now)
        else:
            k = <_Key>found  # the dict holds only _Key values
        k.last = now
        return fb_rate_try_acquire(&k.r, w, now) == 1

    def _retry_after_ns(self, key, weight=1):
        cdef int64_t w = _weight(weight, &self.cfg, self)
        cdef fb_rate_t *r = self._existing(key)
        if r == NULL:
            return 0
        return fb_rate_retry_after_ns(r, w, _clock_ns(self._clock))

    def retry_after(self, key, weight=1):
        """Seconds until ``try_acquire(key, weight)`` would succeed; 0.0 if now."""
        return self._retry_after_ns(key, weight) / 1e9

    def refund(self, key, weight):
        """Give ``weight`` units back to ``key``'s rates (no-op for an unknown key)."""
        cdef int64_t w = _weight(weight, &self.cfg, self)
        cdef fb_rate_t *r = self._existing(key)
        if r != NULL:
            _refund(r, w, _clock_ns(self._clock))

    def _count_wait(self):
        return None

    def acquire(self, key, weight=1, *, timeout=None):
        """Sleep until ``key`` admits ``weight`` units; ``RateLimitedError`` at once if the wait
        would outlast ``timeout`` (seconds) or the current deadline."""
        _check(self._ready)
        _rl.acquire(self, key, _weight(weight, &self.cfg, self), timeout)

    def acquire_async(self, key, weight=1, *, timeout=None):
        """As ``acquire(key, weight, timeout=timeout)``, awaiting; waiters of one key are
        served in arrival order."""
        _check(self._ready)
        return _rl.acquire_async(self, key, _weight(weight, &self.cfg, self), timeout)

    def call(self, key, fn, /, *args, **kwargs):
        """``fn(*args, **kwargs)`` if ``key`` admits one unit now, else ``RateLimitedError``."""
        return _rl.call(self, key, fn, args, kwargs)

    def call_async(self, key, fn, /, *args, **kwargs):
        """``await fn(*args, **kwargs)`` if ``key`` admits one unit now, else
        ``RateLimitedError``."""
        return _rl.call_async(self, key, fn, args, kwargs)

    def __len__(self):
        return len(self._d) if self._shared is None else len(self._shared)

    def __contains__(self, key):
        return key in self._d if self._shared is None else self._shared.contains(key)

    def metrics(self):
        """Keys held now, keys evicted, and requests admitted and rejected so far."""
        _check(self._ready)
        if self._shared is not None:
            keys, evicted = len(self._shared), self._shared.evicted
        else:
            keys, evicted = len(self._d), self._evicted
        return _MapMetrics(keys, evicted, fb_load_acq(&self.counts[0]),
                           fb_load_acq(&self.counts[1]))

    def __repr__(self):
        if not self._ready:
            return "<RateLimiterMap (not initialised)>"
        rates = ", ".join([repr(r) for r in self._rates])
        return f"RateLimiterMap({rates}, max_keys={self._max_keys}, keys={len(self)})"


def shared_size(n):
    """The bytes of a shared limiter of ``n`` rates (SharedRegion): its TAT words."""
    return n * sizeof(int64_t)


def shared_init(view, n):
    """A new shared limiter: every TAT 0 (fresh). The region's memory is zeroed already."""


def map_block_size(n):
    """The bytes of one key of a shared RateLimiterMap of ``n`` rates: its last-used time and
    TAT words."""
    return (n + 1) * sizeof(int64_t)


def map_slot_read(view, n):
    """A shared map key's last-used time, then its TATs (each word read atomically)."""
    cdef int64_t[::1] words = view.cast("q")
    cdef Py_ssize_t i, count = n + 1
    return tuple([fb_load_acq(&words[i]) for i in range(count)])


def map_slot_reset(view, n, now):
    """A fresh key (every TAT 0), last used at ``now``."""
    cdef int64_t[::1] words = view.cast("q")
    cdef int i
    fb_store_rel(&words[0], now)
    for i in range(1, n + 1):
        fb_store_rel(&words[i], 0)


cdef fb_rate_t *fb_rate_handle(object limiter) except NULL:
    if type(limiter) is not RateLimiter:
        raise TypeError(f"expected a compiled fastbreaker.RateLimiter, got {limiter!r}")
    _check((<RateLimiter>limiter)._ready)
    return &(<RateLimiter>limiter).state


cdef inline int _check(bint ready) except -1:
    if not ready:
        raise RuntimeError("this rate limiter was never initialised (made with __new__ "
                           "without __init__)")
    return 0
