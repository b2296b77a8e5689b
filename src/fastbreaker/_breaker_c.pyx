# cython: language_level=3, freethreading_compatible=True
"""The compiled circuit breaker core: the state machine of ``_breaker_py.py`` over C atomics.

``_breaker_py.py`` is the specification; comments here are about C concerns only. The module is
one C file written in four parts: this one (the objects: Group, Config, CircuitBreaker) and the
``include`` files beside it, ``_breaker_state_c.pxi`` (the state machine),
``_breaker_calls_c.pxi`` (the call paths) and ``_breaker_shared_c.pxi`` (shared memory).

The whole state lives in one 64-bit word (state, busy bit, probes in flight, probe successes,
backoff level, generation), changed only by compare-and-swap. A transition is claimed by setting
the busy bit with one CAS; the claimer writes what the new state needs (trip time, cleared
window) and then publishes the new word with a release store. Readers load the word (acquire)
before anything else, so a reader that sees OPEN sees its trip time. While the busy bit is set,
admissions are rejected and outcomes of the ending generation are stale: nobody waits on it.
"""

cimport cython
from cpython.mem cimport PyMem_Calloc, PyMem_Free, PyMem_Realloc
from cpython.ref cimport Py_DECREF, Py_INCREF, PyObject
from libc.stdint cimport int64_t, uint64_t, uintptr_t
from libc.math cimport INFINITY
from libc.string cimport memset

from ._errors import CircuitOpenError, SharedStateTimeout, State, label_name
from ._metrics import Latency, Metrics
from fractions import Fraction

from . import _calls
import contextvars as _contextvars
import os as _os
import sys as _sys
import inspect as _inspect
from ._options import BreakerOptions, class_signature
from ._keywords import check_keywords as _check_keywords, keyword_names as _keyword_names

cdef extern from "Python.h":
    object PyObject_Vectorcall(object fn, PyObject **args, size_t nargsf, PyObject *kwnames)
    object PyObject_VectorcallDict(object fn, PyObject **args, size_t nargsf, PyObject *kwargs)
    PyObject **PySequence_Fast_ITEMS(object seq)
    void PyErr_SetObject(PyObject *type, PyObject *value)
    int PyContextVar_Get(object var, PyObject *default_value, PyObject **value) except -1
    object PyContextVar_Set(object var, object value)
    ctypedef struct fb_tstate_t "PyThreadState":
        PyObject *context
    fb_tstate_t *fb_tstate_get "PyThreadState_Get"()
    void *fb_raw_calloc "PyMem_RawCalloc"(size_t n, size_t size) nogil
    void fb_raw_free "PyMem_RawFree"(void *p) nogil

cdef extern from "_fb_atomic.h" nogil:
    int64_t fb_load_acq(int64_t *p)
    int64_t fb_load_rlx(int64_t *p)
    void fb_store_rel(int64_t *p, int64_t v)
    void fb_store_rlx(int64_t *p, int64_t v)
    int64_t fb_add(int64_t *p, int64_t v)
    bint fb_cas(int64_t *p, int64_t *expected, int64_t desired)
    bint fb_cas_strong(int64_t *p, int64_t *expected, int64_t desired)
    void fb_max(int64_t *p, int64_t v)
    int64_t fb_monotonic_ns()
    void *fb_load_ptr(void **p)
    void fb_store_ptr(void **p, void *v)

cdef extern from "_fb_process.h" nogil:
    int64_t fb_owner_self()
    bint fb_owner_gone(int64_t owner)
    bint fb_owner_stopped(int64_t owner)
    void fb_pause(int64_t ns)
    void fb_stall(int fd)

cdef extern from "_fb_breaker.h" nogil:
    ctypedef struct group_t "fb_group_t":
        int64_t open, size, suppressed, num, den
    ctypedef struct config_t "fb_config_t":
        int64_t failure_threshold, min_calls, window, half_open_max, success_threshold
        int64_t reset_ns, max_reset_ns, probe_timeout_ns, slow_ns
        double failure_rate, slow_rate
        int64_t bucket_ns, buckets
        int use_c_clock
        int dry_run
        int timed
        int shared
        int64_t nlat
        group_t *group
        void *owner
    ctypedef struct window_t "fb_window_t":
        int64_t agg, head
        int64_t slots[1]
    ctypedef struct extra_t "fb_extra_t":
        int64_t opened, would_reject, open_ns, probe_ok, probe_failed, timeouts
        int64_t rejected, slow_calls, ignored, stale
        int64_t open_from, fleet_gen
        int64_t lat[1]
    ctypedef struct state_t "fb_state_t":
        int64_t word, gen_hi, since_ns, consec
        int64_t permitted, successes, failures
    ctypedef struct claim_t "fb_claim_t":
        int64_t word, pid, ns
    ctypedef struct core_t "fb_breaker_t":
        state_t *s
        window_t *win
        config_t *cfg
        extra_t *x
        state_t own

# permitted, rejected and successes, striped on free-threaded builds (see _fb_stripe.h): add with
# fb_count, read with fb_counted.
cdef extern from "_fb_stripe.h" nogil:
    enum:
        FB_CNT_PERMITTED
        FB_CNT_REJECTED
        FB_CNT_SUCCESSES
    void fb_stripes_init()
    void fb_count(core_t *b, int64_t *word, int which)
    int64_t fb_counted(core_t *b, int64_t *word, int which)
    void fb_stripes_zero(core_t *b)
    void fb_stripes_release(core_t *b)
    bint fb_stripes_installed(core_t *b)

fb_stripes_init()

# The config pointer is swapped (BreakerMap) while other threads read it: atomic accesses.
cdef inline config_t *cfg_of(core_t *b) noexcept nogil:
    return <config_t *>fb_load_ptr(<void **>&b.cfg)

# The rarely needed part (fb_extra_t in _fb_breaker.h): x_of reads it (NULL reads as zeros),
# x_need installs it on first need with one CAS. The allocation is raw, so it needs no GIL (the
# C API); if it fails, the event that needed it goes uncounted in these counters, and nothing
# else changes.
cdef inline extra_t *x_of(core_t *b) noexcept nogil:
    return <extra_t *>fb_load_ptr(<void **>&b.x)

cdef extra_t *x_need(core_t *b) noexcept nogil:
    cdef extra_t *x = x_of(b)
    cdef int64_t expected = 0
    if x != NULL:
        return x
    x = <extra_t *>fb_raw_calloc(1, sizeof(extra_t) + cfg_of(b).nlat * sizeof(int64_t))
    if x == NULL:
        return NULL
    if fb_cas_strong(<int64_t *>&b.x, &expected, <int64_t>x):
        return x
    fb_raw_free(x)  # another thread installed one first
    return <extra_t *>expected

# Rejections, slow calls, neutral outcomes and stale permits are counted in fb_extra_t (a
# healthy CLOSED breaker has none): on first need it is installed, as above.
cdef inline void add_stale(core_t *b) noexcept nogil:
    cdef extra_t *x = x_need(b)
    if x != NULL:
        fb_add(&x.stale, 1)

cdef inline void add_ignored(core_t *b) noexcept nogil:
    cdef extra_t *x = x_need(b)
    if x != NULL:
        fb_add(&x.ignored, 1)

cdef inline void add_slow(core_t *b) noexcept nogil:
    cdef extra_t *x = x_need(b)
    if x != NULL:
        fb_add(&x.slow_calls, 1)

# Outcomes that were neutral or stale (0 until fb_extra_t is installed), and the rejections
# (with their stripes, which count even before it is).
cdef inline int64_t neutral_or_stale(core_t *b) noexcept nogil:
    cdef extra_t *x = x_of(b)
    return 0 if x == NULL else fb_load_acq(&x.ignored) + fb_load_acq(&x.stale)

cdef inline int64_t rejected_of(core_t *b) noexcept nogil:
    cdef extra_t *x = x_of(b)
    cdef int64_t none = 0
    return fb_counted(b, &none if x == NULL else &x.rejected, FB_CNT_REJECTED)

# The window pointer (see _fb_breaker.h): the count window, or the time window's array tagged
# with its low bit; the two are exclusive options, and both are set before the breaker is
# published and never change.
cdef inline window_t *cw_of(core_t *b) noexcept nogil:
    cdef uintptr_t p = <uintptr_t>b.win
    return NULL if p & 1 else <window_t *>p

cdef inline int64_t *tw_of(core_t *b) noexcept nogil:
    cdef uintptr_t p = <uintptr_t>b.win
    return <int64_t *>(p - 1) if p & 1 else NULL


# the state machine, then claims and region blocks (shared memory)
include "_breaker_state_c.pxi"
include "_breaker_shared_c.pxi"


# -- Python objects --------------------------------------------------------------------------------
@cython.final
cdef class Group:
    """Shared by the breakers of one BreakerMap: how many are not CLOSED, and the trip bound."""

    cdef group_t own
    cdef group_t *g      # &own, or the words of a shared map's group in a SharedRegion
    cdef object _view    # the region block of a shared group: keeps the region mapped

    def __cinit__(self, double max_open_ratio):
        frac = Fraction(repr(float(max_open_ratio))).limit_denominator(1_000_000)
        self.g = &self.own
        self.g.num = frac.numerator
        self.g.den = frac.denominator

    @classmethod
    def _shared(cls, double max_open_ratio, view, lock=None):
        """A group whose counts are the words ``view`` of a SharedRegion (a shared map's):
        ``shared_group_init`` laid them out (``lock`` is for the twin)."""
        cdef Group self = Group(max_open_ratio)
        cdef char *base = view_address(view, sizeof(group_t))
        if (<group_t *>base).num != self.own.num or (<group_t *>base).den != self.own.den:
            raise ValueError("the shared group was made with another max_open_ratio")
        self._view = view
        self.g = <group_t *>base
        return self

    def bound(self):
        """``max(1, floor(max_open_ratio * size))``, computed exactly."""
        return max_open(self.g)

    def add_size(self, int64_t delta):
        fb_add(&self.g.size, delta)

    def add_open(self, int64_t delta):
        fb_add(&self.g.open, delta)

    def try_reserve(self):
        """Count one more non-CLOSED breaker if the bound allows it, else count a suppression."""
        cdef int64_t cur = fb_load_rlx(&self.g.open)
        while True:
            if cur + 1 > max_open(self.g):
                fb_add(&self.g.suppressed, 1)
                return False
            if fb_cas_strong(&self.g.open, &cur, cur + 1):
                return True

    @property
    def open(self):
        return fb_load_rlx(&self.g.open)

    @property
    def size(self):
        return fb_load_rlx(&self.g.size)

    @property
    def suppressed(self):
        return fb_load_rlx(&self.g.suppressed)


@cython.final
@cython.no_gc_clear
cdef class Config:
    """Options plus what a BreakerMap shares with its breakers (group and state-change hook).

    Traversed by the cycle GC (its listeners, hook and options may refer back to the owner of a
    breaker) but never cleared by it: breakers in a garbage cycle may still run while the cycle
    is being broken, and they read ``c`` and ``c.group`` from C. The cycle is broken in the
    listener list, the hook or the options instead.
    """

    cdef config_t c
    cdef public object options
    cdef public object group
    cdef public object hook
    # () until the first callback / the first retired config, then a list (two empty lists
    # were 112 of the bytes of each standalone breaker); both are replaced only under
    # _listener_lock, from the immortal () to a list, and never again
    cdef public object listeners
    cdef public object retired  # configs this one replaced on some breaker (see _set_config)
    cdef public object region_view  # a shared breaker's block: keeps the region mapped

    def __init__(self, options, group=None, hook=None):
        if self.c.owner != NULL:
            raise RuntimeError("Config.__init__ called twice")
        if not isinstance(options, BreakerOptions):
            raise TypeError(f"options must be a BreakerOptions, got {options!r}")
        if group is not None and not isinstance(group, Group):
            raise TypeError(f"group must be a compiled Group or None, got {group!r}")
        self.options = options
        self.retired = ()
        self.group = group
        self.hook = hook
        # Only ever appended to once a list (see above): a thread firing callbacks can read it
        # while another registers one (lists are internally locked on free-threaded builds).
        self.listeners = ()
        self.c.failure_threshold = options.failure_threshold
        self.c.min_calls = options.min_calls
        self.c.window = options.window
        self.c.half_open_max = options.half_open_max_calls
        self.c.success_threshold = options.success_threshold
        self.c.reset_ns = options.reset_ns
        self.c.max_reset_ns = options.max_reset_ns
        self.c.probe_timeout_ns = options.probe_timeout_ns
        self.c.slow_ns = options.slow_ns
        self.c.failure_rate = options.failure_rate
        self.c.slow_rate = options.slow_rate
        self.c.bucket_ns = options.bucket_ns
        self.c.buckets = options.window_buckets
        self.c.dry_run = options.dry_run
        self.c.timed = options.timed
        self.c.nlat = len(options.latency_bounds_ns) + 2 if options.timed else 0
        self.c.use_c_clock = options.clock is None
        self.c.group = (<Group>group).g if group is not None else NULL
        self.c.owner = <void *>self

    @property
    def shared(self):
        """Whether this is the config a BreakerMap's breakers share (a word of ``c``)."""
        return bool(self.c.shared)

    @shared.setter
    def shared(self, bint value):
        self.c.shared = value

    def copy(self, *, keep_group=True):
        """A private copy (same options, hook and listeners; the group only if ``keep_group``)."""
        cdef Config other = Config(self.options, self.group if keep_group else None, self.hook)
        other.listeners = list(self.listeners) if self.listeners else ()
        other.region_view = self.region_view
        return other

    def reconfigure(self, options):
        """Adopt new option values in place (compat: ``breaker.fail_max = n``).

        Only the thresholds and durations may change: the window size, the rates, the
        exception classification and the clock stay. The C fields are rewritten with atomic
        stores and read with atomic loads, so a call in flight sees each field either before or
        after (never a torn value), and no config is replaced: nothing is retired, nothing grows.
        """
        if self.shared:
            raise ValueError("a config shared by a BreakerMap cannot be reconfigured")
        if self.region_view is not None:
            raise ValueError(
                "a breaker in a SharedRegion cannot be reconfigured: its options are the "
                "region's, the same in every process"
            )
        self.options.check_reconfigure(options)
        fb_store_rlx(&self.c.failure_threshold, options.failure_threshold)
        fb_store_rlx(&self.c.min_calls, options.min_calls)
        fb_store_rlx(&self.c.half_open_max, options.half_open_max_calls)
        fb_store_rlx(&self.c.success_threshold, options.success_threshold)
        fb_store_rlx(&self.c.reset_ns, options.reset_ns)
        fb_store_rlx(&self.c.max_reset_ns, options.max_reset_ns)
        fb_store_rlx(&self.c.probe_timeout_ns, options.probe_timeout_ns)
        self.options.update_from(options)



# GuardedCall, the `with` stacks, the decorator and call()
include "_breaker_calls_c.pxi"


_CLOSED, _OPEN, _HALF_OPEN, _ISOLATED = State.CLOSED, State.OPEN, State.HALF_OPEN, State.ISOLATED
_STATES = (_CLOSED, _OPEN, _HALF_OPEN, _ISOLATED)


# inspect.signature() and help() (Cython gives a class no signature), and the keywords taken.
_SIGNATURE = class_signature(_inspect.signature(BreakerOptions.__init__))
_KEYWORDS = _keyword_names(_SIGNATURE)


@cython.final
@cython.no_gc_clear
cdef class CircuitBreaker:
    """A circuit breaker whose hot path is lock-free C (see the README for every option)."""

    cdef core_t st
    cdef readonly object _label
    cdef object __weakref__

    # help() and inspect.signature(): the option list, from the one place it is written.
    __signature__ = _SIGNATURE

    # The object owns one reference to the Config its C state points at (st.cfg.owner). The
    # cycle GC sees it through the traverse function installed below the class, not through a
    # Python field: the pointer must be swapped atomically, which a Python field is not. The
    # breaker is never cleared by the GC (no_gc_clear): a cycle through it is broken in its
    # config's listeners, hook or options, so a breaker stays usable until it is freed.

    def __cinit__(self, *args, **kwargs):
        # Until __init__ (or _from_config) has run, the busy bit sends every path to a check
        # that raises; a CLOSED fast path would otherwise admit a call into a NULL config.
        self.st.s = &self.st.own
        self.st.s.word = BUSY

    def __init__(self, *args, **options):
        """Every option is documented, validated and spelled out once: ``BreakerOptions``."""
        if options and not _KEYWORDS.issuperset(options):  # name this class, not BreakerOptions
            _check_keywords("CircuitBreaker", options, _KEYWORDS)
        if cfg_of(&self.st) != NULL:
            raise RuntimeError("CircuitBreaker.__init__ called twice: create a new breaker")
        validated = BreakerOptions(*args, **options)
        setup(self, Config(validated), validated.name)

    @classmethod
    def _shared(cls, Config config not None, label, view, lock=None):
        """A breaker whose state is the block ``view`` of a SharedRegion (``shared_init``
        laid it out); ``lock`` is for the twin, which needs one."""
        return attach_shared(config, label, view)

    def _recycle(self, bint info_ok, bint in_flight_ok, bint force=False):
        """A shared map's eviction: under a claim, if the breaker is CLOSED (and, unless
        allowed, carries no information and has no call in flight), reset its block to a fresh
        CLOSED breaker of the next generation (so permits still out are stale) and return its
        metrics from before; else None. ``force``: whatever its state (a slot left
        half-written by a killed writer)."""
        cdef core_t *b = &self.st
        cdef int64_t w, gen, hi
        cdef config_t *c = live(self)
        cdef extra_t *x = x_of(b)
        if not is_shared(b):
            raise TypeError("only a breaker in a SharedRegion is recycled")
        w = fb_load_acq(&b.s.word)
        if w & BUSY or (not force and (w & ST_MASK) != S_CLOSED) or not claim_cas(b, &w):
            return None
        try:
            m = self.metrics()
        except BaseException:
            fb_store_rel(&b.s.word, w)
            raise
        done = m.successes + m.failures + m.ignored + m.stale
        idle = m.consecutive_failures == 0 and not m.failure_rate and not m.slow_call_rate
        if not force and ((not in_flight_ok and m.permitted > done) or (not info_ok and not idle)):
            fb_store_rel(&b.s.word, w)
            return None
        gen = (w_gen(w) + 1) & GEN_MASK
        hi = fb_load_rlx(&b.s.gen_hi)
        fb_store_rlx(&b.s.since_ns, 0)
        fb_store_rlx(&b.s.permitted, 0)
        fb_store_rlx(&b.s.successes, 0)
        fb_stripes_zero(b)
        fb_store_rlx(&b.s.failures, 0)
        if x != NULL:
            memset(x, 0, sizeof(extra_t) + c.nlat * sizeof(int64_t))
        clear_window(b, gen)
        if gen == 0:
            fb_store_rlx(&b.s.gen_hi, hi + 1)
        fb_store_rel(&b.s.word, make_word(S_CLOSED, gen, 0, 0, 0))
        return m

    def _bind(self, int64_t slot, int64_t tag):
        """A shared map's breaker: the slot of the map's table it was bound to, and that
        slot's tag then (kept in the spare inline words, which a shared breaker does not use)."""
        self.st.own.word = slot
        self.st.own.gen_hi = tag

    def _bound(self):
        """``(slot, tag)`` given to ``_bind``."""
        return self.st.own.word, self.st.own.gen_hi

    @classmethod
    def _from_config(cls, Config config not None, label):
        """A breaker sharing ``config`` (BreakerMap); ``name`` is ``str(label)``."""
        cdef CircuitBreaker self = CircuitBreaker.__new__(CircuitBreaker)
        setup(self, config, label)
        return self

    def __dealloc__(self):
        cdef config_t *c = cfg_of(&self.st)
        cdef extra_t *x = self.st.x
        if self.st.s == &self.st.own:  # a shared breaker's blocks belong to its region
            if self.st.win != NULL:
                PyMem_Free(<void *>(<uintptr_t>self.st.win & ~(<uintptr_t>1)))
            if x != NULL:
                fb_raw_free(x)
        fb_stripes_release(&self.st)
        self.st.win = NULL
        self.st.x = NULL
        if c != NULL:
            fb_store_ptr(<void **>&self.st.cfg, NULL)
            Py_DECREF(<object>c.owner)

    def __copy__(self):
        raise _not_copyable(self)

    def __deepcopy__(self, memo):
        raise _not_copyable(self)

    def __reduce_ex__(self, protocol):
        raise _not_copyable(self)

    @property
    def _config(self):
        return <object>live(self).owner

    def _set_config(self, Config config not None):
        """Swap in another Config (BreakerMap: private listeners, detaching an evicted breaker).

        Safe reclamation: a thread may have loaded the old config pointer just before the swap
        and still be reading it, so the old config cannot be freed now. The new config keeps a
        reference to it (``retired``), which lives exactly as long as any breaker can reach the
        new one, hence as long as the breaker that was reading the old one. That chain stays
        bounded, because a config only ever retires one kind of predecessor: a map's detached
        config retires the map's shared config (once, not once per dropped breaker), a private
        copy retires the config it was copied from; options change in place
        (``Config.reconfigure``), never by a swap.
        """
        cdef config_t *old = live(self)
        cdef object old_owner = <object>old.owner
        if config is old_owner:
            return
        if (config.c.window != old.window or config.c.bucket_ns != old.bucket_ns
                or config.c.buckets != old.buckets or config.c.timed != old.timed
                or config.options.latency_bounds != (<Config>old.owner).options.latency_bounds):
            raise ValueError("a breaker's window size and latency histogram cannot change")
        if config.options is None:
            raise ValueError("config was never initialised")
        if not config.retired:
            config.retired = [old_owner]  # (its callers hold _listener_lock)
        elif not any(r is old_owner for r in config.retired):
            config.retired.append(old_owner)
        Py_INCREF(config)
        fb_store_ptr(<void **>&self.st.cfg, &config.c)
        Py_DECREF(old_owner)  # the reference the breaker held; `retired` holds another

    def _swap_config_if_closed(self, Config config not None, bint in_flight_ok=True):
        """Swap in ``config`` only while CLOSED (and, unless ``in_flight_ok``, with no more
        permits than outcomes), with no transition in between (a BreakerMap dropping a
        breaker). The swap happens under a claim of the state word, so a trip either sees the
        old config throughout or the new one. Returns whether it swapped."""
        live(self)
        cdef int64_t w = fb_load_acq(&self.st.s.word)
        while True:
            if (w & (ST_MASK | BUSY)) != S_CLOSED:
                return False
            if claim_cas(&self.st, &w):
                break
        # While claimed, admissions are rejected, so the permit count cannot grow under the
        # check. (An admission that read the word just before the claim may still add its
        # permit after it: only without the GIL, which this Python method holds otherwise.)
        if not in_flight_ok and fb_counted(&self.st, &self.st.s.permitted, FB_CNT_PERMITTED) > (
                fb_counted(&self.st, &self.st.s.successes, FB_CNT_SUCCESSES)
                + fb_load_acq(&self.st.s.failures)
                + neutral_or_stale(&self.st)):
            fb_store_rel(&self.st.s.word, w)
            return False
        try:
            self._set_config(config)
        finally:
            fb_store_rel(&self.st.s.word, w)
        return True

    def _now(self):
        return now_of(self)

    def _observe(self, int64_t elapsed_ns):
        """Add a timed call's duration to the latency histogram (no-op when not timing)."""
        cdef int64_t *lat = lat_of(&self.st)
        cdef Py_ssize_t i
        if lat == NULL:
            return
        bounds = (<Config>live(self).owner).options.latency_bounds_ns
        i = _bisect_left(bounds, elapsed_ns)
        fb_add(&lat[i], 1)
        fb_add(&lat[len(bounds) + 1], elapsed_ns)

    # -- raw API ---------------------------------------------------------------------------
    @cython.binding(False)
    def allow(self):
        """Admit one call (True) or reject it (False); the caller reports its outcome."""
        cdef int64_t w = fb_load_acq(&self.st.s.word)
        if (w & (ST_MASK | BUSY)) == S_CLOSED:
            fb_count(&self.st, &self.st.s.permitted, FB_CNT_PERMITTED)
            return True
        return acquire_or_reject(self) >= 0

    @cython.binding(False)
    def record_success(self, elapsed=None):
        """Report a success; ``elapsed`` seconds (or timedelta) make it slow when over the limit."""
        cdef int outcome = FB_SUCCESS if elapsed is None else _calls.success_outcome(self, elapsed)
        finish(self, raw_permit(&self.st), outcome, True)

    @cython.binding(False)
    def record_failure(self):
        """Report a failure of a call admitted by ``allow()``."""
        finish(self, raw_permit(&self.st), FB_FAILURE, True)

    # -- permit API used by _calls ------------------------------------------------------------
    def _permit_or_raise(self):
        cdef int64_t permit = acquire_or_reject(self)
        if permit < 0:
            raise open_error(self)
        return permit

    def _finish(self, int64_t permit, int outcome):
        finish(self, permit, outcome)

    def _open_error(self):
        return open_error(self)

    # -- call paths ----------------------------------------------------------------------------
    # call(fn, /, *args, **kwargs) is a C function installed below (install_call).

    def call_async(self, fn, /, *args, **kwargs):
        """Await ``fn(*args, **kwargs)`` through the breaker."""
        cdef GuardedCall g = GuardedCall.__new__(GuardedCall)
        g.breaker = self
        g.fn = fn
        g.args = args
        g.kwargs = kwargs
        return g

    def __call__(self, fn):
        """``@breaker``: guard a sync or async function, generator or async generator (its
        signature is kept)."""
        live(self)
        if not callable(fn):
            return _calls.decorate(self, fn)
        how = _calls_kind(fn)
        if how == "sync":
            return guard(self, fn)
        if how == "async":
            return guard_async(self, fn)
        return _calls.decorate(self, fn)

    # The permit of each `with` block lives on this context's WithStack (see push_block).
    def __enter__(self):
        cdef int64_t permit = acquire_or_reject(self)
        cdef int64_t start = 0
        if permit < 0:
            raise open_error(self)
        if cfg_of(&self.st).timed:
            start = _calls.start_or_release(self, permit)
        try:
            push_block(self, permit, start)
        except BaseException:
            finish(self, permit, FB_NEUTRAL)
            raise
        return self

    def __exit__(self, et, exc, tb):
        cdef int64_t permit = 0, start = 0
        if not pop_block(self, &permit, &start):
            take_foreign(self, &permit, &start)
        if exc is not None:
            if cfg_of(&self.st).timed:
                _calls.finish_raised(self, permit, start, exc)
            else:
                finish(self, permit, (<Config>cfg_of(&self.st).owner).options.classify(exc))
        elif cfg_of(&self.st).timed:
            _calls.finish_returned(self, permit, start)
        else:
            finish(self, permit, FB_SUCCESS)

    # `async with`: the block is entered and left as a `with` block is, when the method is
    # called (the await follows at once, in the same task); what the method returns is an
    # awaitable already complete (fb_ready), so that no coroutine is made for it.
    def __aenter__(self):
        return fb_ready(self.__enter__())

    def __aexit__(self, et, exc, tb):
        self.__exit__(et, exc, tb)
        return fb_ready(None)

    # -- manual control --------------------------------------------------------------------------
    def trip(self):
        """Force OPEN now (a fresh open period; lazy recovery follows). No effect when ISOLATED."""
        manual_step(self, S_OPEN, now_of(self))  # now_of: live() first

    def isolate(self):
        """Reject every call until ``reset()``."""
        manual_step(self, S_ISOLATED, episode_end(self))

    def reset(self):
        """Back to CLOSED with an empty window, no consecutive failures and no backoff."""
        manual_step(self, S_CLOSED, episode_end(self))  # raises if stalled: nothing changed
        cdef extra_t *x = x_of(&self.st)
        if x != NULL:
            fb_store_rlx(&x.fleet_gen, 0)  # a fleet fence pushed far ahead must not outlive it

    # -- inspection --------------------------------------------------------------------------------
    @property
    def state(self):
        """The stored state (reading it never makes a transition)."""
        live(self)
        return _STATES[fb_load_acq(&self.st.s.word) & ST_MASK]

    @property
    def name(self):
        live(self)
        return label_of(self)

    @property
    def retry_after(self):
        """Seconds until a probe may pass: OPEN, the rest of the open period; ISOLATED, inf."""
        live(self)
        return retry_after_of(self, fb_load_acq(&self.st.s.word))

    def metrics(self):
        """An immutable snapshot of the counters (with a time window or while OPEN, it reads
        the clock: a failing user clock leaves the current bucket and episode out)."""
        cdef config_t *c = live(self)
        cdef int64_t w = fb_load_acq(&self.st.s.word)
        cdef extra_t *x = x_of(&self.st)
        cdef extra_t zero
        cdef int64_t *tw = tw_of(&self.st)
        cdef int64_t cur = fb_load_rlx(&self.st.s.consec), agg, rec = 0, fail = 0, slow = 0
        cdef int64_t now = 0, open_ns, since
        cdef int64_t sums[3]
        cdef bint closed = (w & ST_MASK) == S_CLOSED
        cdef window_t *win = cw_of(&self.st)
        cdef bint windowed = self.st.win != NULL  # either window
        if x == NULL:
            memset(&zero, 0, sizeof(extra_t))  # never tripped, timed out or ran dry: all zero
            x = &zero
        since = fb_load_rlx(&x.open_from)
        latency = latency_of(self)
        if (w & ST_MASK) == S_OPEN or tw != NULL:
            try:
                now = now_of(self)
            except Exception:
                now = -1
        open_ns = fb_load_rlx(&x.open_ns)
        if now < 0:
            now = fb_load_rlx(&tw[0]) * c.bucket_ns if tw != NULL else 0
        elif (fb_load_acq(&self.st.s.word) & ST_MASK) == S_OPEN and fb_load_rlx(&x.open_from) == since:
            open_ns += now - since if now > since else 0
        if win != NULL:
            agg = fb_load_rlx(&win.agg)
            rec = (agg & AGG_MASK) - AGG_BIAS
            fail = ((agg >> AGG_BITS) & AGG_MASK) - AGG_BIAS
            slow = ((agg >> (2 * AGG_BITS)) & AGG_MASK) - AGG_BIAS
        elif tw != NULL:
            twindow_sums(tw, c, now, sums)
            rec, fail, slow = sums[0], sums[1], sums[2]
        return Metrics(
            state=_STATES[w & ST_MASK],
            permitted=fb_counted(&self.st, &self.st.s.permitted, FB_CNT_PERMITTED),
            rejected=fb_counted(&self.st, &x.rejected, FB_CNT_REJECTED),
            successes=fb_counted(&self.st, &self.st.s.successes, FB_CNT_SUCCESSES),
            failures=fb_load_rlx(&self.st.s.failures),
            slow_calls=fb_load_rlx(&x.slow_calls),
            ignored=fb_load_rlx(&x.ignored),
            stale=fb_load_rlx(&x.stale),
            opened=fb_load_rlx(&x.opened),
            consecutive_failures=(cur & CONSEC_MASK) if closed and (cur >> CONSEC_SHIFT) == w_gen(w) else 0,
            failure_rate=((<double>fail / rec) if rec > 0 else 0.0) if windowed else None,
            slow_call_rate=((<double>slow / rec) if rec > 0 else 0.0) if windowed else None,
            recorded=rec if windowed else 0,
            would_reject=fb_load_rlx(&x.would_reject),
            open_seconds_total=open_ns / 1e9,
            probe_successes=fb_load_rlx(&x.probe_ok),
            probe_failures=fb_load_rlx(&x.probe_failed),
            timeouts=fb_load_rlx(&x.timeouts),
            latency=latency,
        )

    def on_state_change(self, callback):
        """Register ``callback(breaker, old_state, new_state)``; returns it (decorator-friendly)."""
        cdef Config config
        if not callable(callback):
            raise TypeError(f"callback must be callable, got {callback!r}")
        live(self)
        with _listener_lock:
            config = <Config>cfg_of(&self.st).owner
            if config.shared:
                config = config.copy()
                self._set_config(config)
            if config.listeners:
                config.listeners.append(callback)
            else:
                config.listeners = [callback]
        return callback

    def __repr__(self):
        if cfg_of(&self.st) == NULL:
            return "<CircuitBreaker (not initialised)>"
        return f"<CircuitBreaker name={self.name!r} state={self.state.name}>"

    # -- fleet coordination (fastbreaker.contrib.redis) -------------------------------------------
    # The last fleet generation applied (st.x.fleet_gen) is written only under a claim of the
    # state word.

    def _fleet(self, int64_t fleet_gen, int64_t local_gen, int state, double seconds, int probes):
        """The fenced entry point of a fleet's state: the twin documents it (``_breaker_py``)."""
        cdef config_t *c = live(self)
        cdef int64_t now = 0, w, gen, since, hmax = opt(&c.half_open_max)
        cdef int trans = 0
        cdef bint applied = False, claimed
        cdef extra_t *x = x_of(&self.st)
        cdef int64_t last = fb_load_rlx(&x.fleet_gen) if x != NULL else 0
        if state < S_CLOSED or state > S_HALF_OPEN:
            raise ValueError(f"state must be 0 (CLOSED), 1 (OPEN) or 2 (HALF_OPEN), got {state!r}")
        if not (0.0 <= seconds < 1e8):
            raise ValueError(f"seconds must be in [0, 1e8), got {seconds!r}")
        if probes < 0 or probes > hmax:
            raise ValueError(
                f"probes must be in 0..{hmax} (half_open_max_calls), got {probes!r}")
        if fleet_gen > last:
            now = now_of(self)  # before the claim: a Python clock must not run under it
            x = x_need(&self.st)
            if x == NULL:
                raise MemoryError()
        if fleet_gen > last:
            # Fenced under a claim of the word: no transition can happen between the checks
            # and the apply (a reader only, fleet_gen 0, never claims).
            with nogil:
                claimed = claim(&self.st, &w)
            if not claimed:
                pass  # another process's claim is stalled: the next sync applies it
            elif (fleet_gen > fb_load_rlx(&x.fleet_gen)
                  and (local_gen < 0 or local_gen == full_gen(&self.st, w))
                  and (w & ST_MASK) != S_ISOLATED):
                applied = True
                fb_store_rlx(&x.fleet_gen, fleet_gen)
                if state == S_CLOSED and (w & ST_MASK) != S_CLOSED:
                    transition(&self.st, w, S_CLOSED, now, 0, 0, False, &trans)
                elif state == S_OPEN:
                    # the open period ends `seconds` from now: shift its start; the episode
                    # (open_seconds_total) still begins now, or when the breaker tripped
                    since = now + <int64_t>(seconds * 1e9) - open_period(c, w_level(w))
                    if (w & ST_MASK) == S_OPEN:
                        fb_store_rlx(&self.st.s.since_ns, since)
                        fb_store_rel(&self.st.s.word, w)
                    else:
                        # trip now, then shift the period's start: until the store, a reader
                        # sees a full open period from now (it rejects, as it will after)
                        transition(&self.st, w, S_OPEN, now, 0, w_level(w), False, &trans)
                        fb_store_rlx(&self.st.s.since_ns, since)
                elif state == S_HALF_OPEN:
                    transition(&self.st, w, S_HALF_OPEN, now, hmax - probes, w_level(w), False,
                               &trans)
                else:
                    fb_store_rel(&self.st.s.word, w)
            else:
                fb_store_rel(&self.st.s.word, w)  # release the claim unchanged
        w = fb_load_acq(&self.st.s.word)
        result = (applied, full_gen(&self.st, w), w & ST_MASK,
                  fb_counted(&self.st, &self.st.s.successes, FB_CNT_SUCCESSES),
                  fb_load_rlx(&self.st.s.failures),
                  rejected_of(&self.st))
        if trans:
            fire(self, trans)
        return result


# -- the Python-level steps shared by the methods above -------------------------------------------
cdef setup(CircuitBreaker self, Config config, label):
    cdef int64_t n = config.c.window
    if config.options is None:
        raise ValueError("config was never initialised")
    if n:
        self.st.win = <window_t *>PyMem_Calloc(1, sizeof(window_t) + ((n + 31) >> 5) * sizeof(int64_t))
        if self.st.win == NULL:
            raise MemoryError()
        self.st.win.agg = AGG_ZERO
    cdef extra_t *x
    cdef int64_t *tw
    if config.c.bucket_ns:
        tw = <int64_t *>PyMem_Calloc(config.c.buckets + 1, sizeof(int64_t))
        if tw == NULL:
            raise MemoryError()
        self.st.win = <window_t *>(<uintptr_t>tw | 1)
    if config.c.timed:
        x = <extra_t *>fb_raw_calloc(1, sizeof(extra_t) + config.c.nlat * sizeof(int64_t))
        if x == NULL:
            raise MemoryError()
        self.st.x = x
    Py_INCREF(config)
    fb_store_ptr(<void **>&self.st.cfg, &config.c)
    self._label = label
    fb_store_rel(&self.st.s.word, 0)  # CLOSED, generation 0: usable from here on


cdef int64_t episode_end(CircuitBreaker self) except? -1:
    """The time an OPEN episode ends at (reset/isolate), read only while OPEN; else 0."""
    live(self)
    if (fb_load_acq(&self.st.s.word) & ST_MASK) == S_OPEN:
        return now_of(self)
    return 0

cdef inline int64_t *lat_of(core_t *b) noexcept nogil:
    cdef extra_t *x = x_of(b)
    return x.lat if x != NULL and cfg_of(b).nlat else NULL

cdef object latency_of(CircuitBreaker self):
    cdef int64_t *lat = lat_of(&self.st)
    cdef Py_ssize_t i, nb
    if lat == NULL:
        return None
    bounds = (<Config>cfg_of(&self.st).owner).options.latency_bounds
    nb = len(bounds)
    counts = tuple([fb_load_rlx(&lat[i]) for i in range(nb + 1)])
    return Latency(bounds, counts, fb_load_rlx(&lat[nb + 1]) / 1e9, sum(counts))

cdef inline config_t *live(CircuitBreaker self) except NULL:
    """The breaker's config, or RuntimeError for an object whose __init__ never ran."""
    cdef config_t *c = cfg_of(&self.st)
    if c == NULL:
        raise RuntimeError(
            "this CircuitBreaker was never initialised (made with __new__ without __init__)")
    return c



import threading
_listener_lock = threading.Lock()
from ._durations import read_clock as _read_clock
from ._errors import not_copyable as _not_copyable


# -- the cycle GC sees a breaker's config --------------------------------------------------------
cdef extern from *:
    """
    /* A breaker refers to its Config through st.cfg->owner, a pointer the C core swaps
       atomically, so Cython's generated traverse (which visits _label) cannot see it. This one
       visits it too. It reads the pointer only: no reference counting during a collection. */
    static Py_ssize_t fb_st_offset;
    static traverseproc fb_base_traverse;
    static int fb_breaker_traverse(PyObject *o, visitproc visit, void *arg) {
        fb_breaker_t *st = (fb_breaker_t *)((char *)o + fb_st_offset);
        fb_config_t *c = (fb_config_t *)fb_load_ptr((void **)&st->cfg);
        if (c != NULL && c->owner != NULL) {
            Py_VISIT((PyObject *)c->owner);
        }
        return fb_base_traverse ? fb_base_traverse(o, visit, arg) : 0;
    }
    static void fb_install_traverse(PyObject *type, Py_ssize_t offset) {
        PyTypeObject *t = (PyTypeObject *)type;
        fb_st_offset = offset;
        fb_base_traverse = t->tp_traverse;
        t->tp_traverse = fb_breaker_traverse;
    }
    """
    void fb_install_traverse(PyObject *t, Py_ssize_t offset)

cdef _install_traverse():
    cdef CircuitBreaker probe = CircuitBreaker.__new__(CircuitBreaker)
    fb_install_traverse(<PyObject *>CircuitBreaker,
                        <Py_ssize_t>(<char *>&probe.st - <char *><PyObject *>probe))

_install_traverse()

# call(): see _breaker_calls_c.pxi
fb_install_fastcall(<PyObject *>CircuitBreaker, <fb_fastcall_kw_t>call_fastcall)
from functools import update_wrapper as _update_wrapper
from types import MethodType as _MethodType
_markcoroutinefunction = getattr(_inspect, "markcoroutinefunction", None)  # 3.12+
from bisect import bisect_left as _bisect_left
_calls_kind = _calls.kind
