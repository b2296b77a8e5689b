# cython: language_level=3, freethreading_compatible=True
"""The compiled circuit breaker core: the state machine of ``_breaker_py.py`` over C atomics.

``_breaker_py.py`` is the specification; comments here are about C concerns only.

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

# -- the state word ------------------------------------------------------------------------------
cdef enum:
    S_CLOSED = 0
    S_OPEN = 1
    S_HALF_OPEN = 2
    S_ISOLATED = 3
    ST_MASK = 3
    BUSY = 4
    INFL_SHIFT = 3
    OK_SHIFT = 19
    LVL_SHIFT = 35
    GEN_SHIFT = 41
    FIELD16 = 0xFFFF
    LVL_MASK = 63
    MAX_LEVEL = 40
    GEN_BITS = 22
    GEN_MASK = 0x3FFFFF
    CONSEC_SHIFT = 40
    AGG_BITS = 21
    AGG_MASK = 0x1FFFFF
    AGG_BIAS = 0x100000
    TAG_SHIFT = 42
    TAG_MASK = 0x3FFFFF
    CNT_BITS = 14
    CNT_MASK = 0x3FFF

cdef int64_t DRY_RUN_PERMIT = (<int64_t>1) << 62  # _options.DRY_RUN_PERMIT: no generation's
cdef int64_t CONSEC_MASK = ((<int64_t>1) << CONSEC_SHIFT) - 1
cdef int64_t AGG_ZERO = (<int64_t>AGG_BIAS) | ((<int64_t>AGG_BIAS) << AGG_BITS) | ((<int64_t>AGG_BIAS) << (2 * AGG_BITS))

# transition codes: 0 none, else 0x100 | old << 4 | new | gen << 9, `gen` being the generation the
# call ended in (the C API reports it; old == new marks a probe admitted without a transition)
cdef inline int trans_code(int old, int new, int64_t gen) noexcept nogil:
    return 0x100 | (old << 4) | new | <int>((gen & GEN_MASK) << 9)

cdef inline int64_t make_word(int state, int64_t gen, int64_t inflight, int64_t ok, int64_t level) noexcept nogil:
    return (state | (inflight << INFL_SHIFT) | (ok << OK_SHIFT) | (level << LVL_SHIFT)
            | ((gen & GEN_MASK) << GEN_SHIFT))

cdef inline int64_t w_gen(int64_t w) noexcept nogil:
    return (w >> GEN_SHIFT) & GEN_MASK

# The word holds the generation's low 22 bits; gen_hi holds the rest. A permit is the full
# generation (the number of transitions so far, as in the twin), so an outcome that comes back
# after 2**22 transitions is still recognised as stale. gen_hi is written only by the claimer of
# a transition, before the release store that publishes the word, and read after an acquire load
# of the word: a reader never pairs a new word with an old gen_hi. (It can pair an old word with
# a newer gen_hi; that permit matches no generation, and rightly, since a transition happened.)
cdef inline int64_t full_gen(core_t *b, int64_t w) noexcept nogil:
    return (fb_load_rlx(&b.s.gen_hi) << GEN_BITS) | w_gen(w)

cdef inline int64_t w_inflight(int64_t w) noexcept nogil:
    return (w >> INFL_SHIFT) & FIELD16

cdef inline int64_t w_ok(int64_t w) noexcept nogil:
    return (w >> OK_SHIFT) & FIELD16

cdef inline int64_t w_level(int64_t w) noexcept nogil:
    return (w >> LVL_SHIFT) & LVL_MASK

# Options that Config.reconfigure() may rewrite in place are read with atomic loads.
cdef inline int64_t opt(int64_t *field) noexcept nogil:
    return fb_load_rlx(field)

cdef inline int64_t open_period(config_t *c, int64_t level) noexcept nogil:
    cdef int64_t p, reset_ns = opt(&c.reset_ns), max_ns = opt(&c.max_reset_ns)
    if max_ns == 0:
        return reset_ns
    if level > MAX_LEVEL:
        level = MAX_LEVEL
    if reset_ns > (max_ns >> level):
        return max_ns
    p = reset_ns << level
    return p if p < max_ns else max_ns

cdef inline int64_t resolve_now(core_t *b, int64_t now) noexcept nogil:
    if now >= 0:
        return now
    if cfg_of(b).use_c_clock:
        return fb_monotonic_ns()
    return -1

# -- claims of a shared breaker (SharedRegion) ------------------------------------------------------
# A process can be killed while it holds the busy bit. So a shared breaker's claimer records the
# busy word it claimed, its owner word (pid and start time, _fb_process.h) and the time right
# after its claiming CAS (fb_claim_t, after the state block), and a process that finds the word
# busy may take the claim over: when the recorded owner no longer exists (or its pid was given to
# a process that started at another time) and the claim is CLAIM_DEAD_NS old, or when no owner
# was ever recorded (the claimer died between its CAS and the record) and it is CLAIM_UNKNOWN_NS
# old. The first process to see a claim without its record starts that clock by writing one.
# Taking over rolls the transition back: one CAS puts back the word from before the claim. What
# the dead claimer wrote before publishing is harmless there: a trip or probe time (the state it
# would have left keeps its own), a window cleared early, gen_hi one ahead (its permits go
# stale), and an episode counted in `opened`. A live owner is never taken over, however long it
# holds on; but a claim held CLAIM_STALL_NS or more by a live owner seen stopped (SIGSTOP, a
# debugger), or CLAIM_STUCK_NS by any live owner, is stalled, and nobody waits for it: an admission goes
# on with the state published before the claim (CLOSED admits; outcomes of that generation are
# stale once the claimer publishes), a manual transition gives up (SharedStateTimeout) and a
# fleet apply waits for the next sync.
cdef int64_t CLAIM_DEAD_NS = 10_000_000        # 10 ms
cdef int64_t CLAIM_UNKNOWN_NS = 1_000_000_000  # 1 s
cdef int64_t CLAIM_STALL_NS = 100_000_000      # 100 ms, a stopped owner (docs/shared-memory.md)
cdef int64_t CLAIM_STUCK_NS = 2_000_000_000    # 2 s, any live owner (where its state is unknown)

cdef enum:
    CLAIM_HELD = 0         # held, for less than the bounds
    CLAIM_ROLLED_BACK = 1  # taken over from a dead owner
    CLAIM_STALLED = 2      # held by a live owner for CLAIM_STALL_NS or more
    MANUAL_STALLED = -1    # manual(): the claim of another process is stalled

cdef int64_t fb_owner = 0          # this process (refreshed after a fork)
cdef int64_t fb_claim_shift = 0    # tests: added to the claim clock (an injected clock)
cdef int fb_stall_fd = -1          # tests: stall inside the next claimed transition

cdef inline bint is_shared(core_t *b) noexcept nogil:
    return b.s != &b.own

cdef inline claim_t *claim_of(core_t *b) noexcept nogil:
    return <claim_t *>(b.s + 1)

cdef inline int64_t claim_now() noexcept nogil:
    return fb_monotonic_ns() + fb_claim_shift

# The claiming CAS of every transition: busy bit on, and for a shared breaker the record.
cdef inline bint claim_cas(core_t *b, int64_t *w) noexcept nogil:
    cdef claim_t *rec
    if not fb_cas(&b.s.word, w, w[0] | BUSY):
        return False
    if is_shared(b):
        rec = claim_of(b)
        fb_store_rlx(&rec.pid, fb_owner)
        fb_store_rlx(&rec.ns, claim_now())
        fb_store_rel(&rec.word, w[0] | BUSY)
    return True

cdef int take_over(core_t *b, int64_t w) noexcept nogil:
    """For a reader of a shared breaker that found `w` busy: CLAIM_ROLLED_BACK if it rolled
    the claim back, CLAIM_STALLED if a live owner holds it too long, else CLAIM_HELD."""
    cdef claim_t *rec = claim_of(b)
    cdef int64_t now = claim_now(), age, owner
    if fb_load_acq(&rec.word) != w:
        fb_store_rlx(&rec.pid, 0)
        fb_store_rlx(&rec.ns, now)
        fb_store_rel(&rec.word, w)
        return CLAIM_HELD
    age = now - fb_load_rlx(&rec.ns)
    owner = fb_load_rlx(&rec.pid)
    if age < CLAIM_DEAD_NS or (owner == 0 and age < CLAIM_UNKNOWN_NS):
        return CLAIM_STALLED if age >= CLAIM_STALL_NS else CLAIM_HELD
    if owner != 0 and not fb_owner_gone(owner):
        # a live owner's claim is stalled past CLAIM_STALL_NS when it is seen stopped, past
        # CLAIM_STUCK_NS in any case: one that runs (descheduled on a busy machine) is waited for
        if age >= CLAIM_STUCK_NS or (age >= CLAIM_STALL_NS and fb_owner_stopped(owner)):
            return CLAIM_STALLED
        return CLAIM_HELD
    if fb_cas_strong(&b.s.word, &w, w & ~(<int64_t>BUSY)):
        return CLAIM_ROLLED_BACK
    return CLAIM_HELD

def _test_striped(CircuitBreaker breaker):
    """Test hook: whether ``breaker`` counts in stripes (free-threaded builds, _fb_stripe.h)."""
    return fb_stripes_installed(&breaker.st)


def _test_stall_in_claim(int fd):
    """Tests: the next transition of a shared breaker writes one byte to ``fd``, then never
    returns (a test kills the process there); -1 turns it off."""
    global fb_stall_fd
    fb_stall_fd = fd

def _test_claim_clock_shift(int64_t ns):
    """Tests: move this process's claim clock forward by ``ns`` (claims look that much older)."""
    global fb_claim_shift
    fb_claim_shift = ns

def _refresh_pid():
    global fb_owner
    fb_owner = fb_owner_self()

_refresh_pid()
_os.register_at_fork(after_in_child=_refresh_pid)

# The one place where the state changes (the twin's CircuitBreaker._enter). The caller has
# claimed word `w` (BUSY set by its CAS); this writes what the new state needs (the group's count
# of non-CLOSED breakers, the trip or probe time, the cleared window) and then publishes the new
# word with a release store, so a reader that sees the new state sees all of it. `inflight` is 1
# when the caller is the first probe of a HALF_OPEN; `reserved` when the caller already counted
# this breaker in its group (an automatic trip reserves its place before claiming). Stores the
# transition code in `trans` (see trans_code) and returns the new full generation.
cdef int64_t transition(core_t *b, int64_t w, int new, int64_t now, int64_t inflight,
                        int64_t level, bint reserved, int *trans) noexcept nogil:
    cdef int old = w & ST_MASK
    cdef int64_t gen = (w_gen(w) + 1) & GEN_MASK, hi = fb_load_rlx(&b.s.gen_hi), since
    cdef extra_t *x
    if (old == S_CLOSED) != (new == S_CLOSED) and not reserved:
        group_open_add(b, 1 if old == S_CLOSED else -1)
    if old == S_OPEN:
        x = x_of(b)  # made by the trip that began the episode
        if x != NULL:
            since = fb_load_rlx(&x.open_from)
            if now > since:
                fb_add(&x.open_ns, now - since)
    if new == S_OPEN:
        fb_store_rlx(&b.s.since_ns, now)
        x = x_need(b)
        if x != NULL:
            fb_store_rlx(&x.open_from, now)
            fb_add(&x.opened, 1)
    elif new == S_HALF_OPEN:
        fb_store_rlx(&b.s.since_ns, now)
    elif new == S_CLOSED:
        clear_window(b, gen)
    if fb_stall_fd >= 0 and is_shared(b):
        fb_stall(fb_stall_fd)
    if gen == 0:
        hi += 1
        fb_store_rlx(&b.s.gen_hi, hi)
    fb_store_rel(&b.s.word, make_word(new, gen, inflight, 0, level))
    trans[0] = trans_code(old, new, gen)
    return (hi << GEN_BITS) | gen


# Claim the word for a manual transition into `out`; waits only while another claim is in
# progress, and, on a shared breaker, gives the CPU away while it waits and gives up (False) when
# a live process holds its claim for CLAIM_STALL_NS (call it without the GIL).
cdef inline bint claim(core_t *b, int64_t *out) noexcept nogil:
    cdef int64_t w = fb_load_acq(&b.s.word), pause = 1000
    cdef int spins = 0
    while True:
        if w & BUSY:
            if is_shared(b):
                if take_over(b, w) == CLAIM_STALLED:
                    return False
                spins += 1
                if spins > 100:
                    fb_pause(pause)
                    pause = pause * 2 if pause < 1_000_000 else 1_000_000
            w = fb_load_acq(&b.s.word)
            continue
        if claim_cas(b, &w):
            out[0] = w
            return True

cdef inline void clear_window(core_t *b, int64_t new_gen) noexcept nogil:
    cdef window_t *win = cw_of(b)
    cdef int64_t *tw = tw_of(b)
    cdef int64_t i, nwords
    fb_store_rlx(&b.s.consec, (new_gen & GEN_MASK) << CONSEC_SHIFT)
    if tw != NULL:
        for i in range(cfg_of(b).buckets + 1):
            fb_store_rlx(&tw[i], 0)
    if win == NULL:
        return
    nwords = (cfg_of(b).window + 31) >> 5
    for i in range(nwords):
        fb_store_rlx(&win.slots[i], 0)
    fb_store_rlx(&win.head, 0)
    fb_store_rlx(&win.agg, AGG_ZERO)

cdef inline void group_open_add(core_t *b, int64_t delta) noexcept nogil:
    if cfg_of(b).group != NULL:
        fb_add(&cfg_of(b).group.open, delta)

cdef inline int64_t min_level(int64_t level) noexcept nogil:
    return level if level < MAX_LEVEL else MAX_LEVEL

cdef enum:
    FB_REJECTED_ = -1
    FB_NEED_CLOCK_ = -2
    NEED_TRIP = -3

# -- admission -------------------------------------------------------------------------------
cdef inline int64_t acquire(core_t *b, int64_t now, int *trans) noexcept nogil:
    cdef int64_t w = fb_load_acq(&b.s.word)
    if (w & (ST_MASK | BUSY)) == S_CLOSED:
        fb_count(b, &b.s.permitted, FB_CNT_PERMITTED)
        return full_gen(b, w)
    return acquire_slow(b, now, trans)

cdef int64_t acquire_slow(core_t *b, int64_t now, int *trans) noexcept nogil:
    cdef int64_t w, since, gen, inflight
    cdef extra_t *x
    cdef int st, held
    cdef config_t *c = cfg_of(b)
    w = fb_load_acq(&b.s.word)
    while True:
        st = w & ST_MASK
        if w & BUSY:
            if not is_shared(b):
                break
            held = take_over(b, w)
            if held == CLAIM_ROLLED_BACK:
                w = fb_load_acq(&b.s.word)
                continue
            if held == CLAIM_STALLED and st == S_CLOSED:
                # the claimer is stopped: go on with the state it claimed from
                fb_count(b, &b.s.permitted, FB_CNT_PERMITTED)
                return full_gen(b, w)
            break
        if st == S_ISOLATED:
            break
        gen = w_gen(w)
        if st == S_CLOSED:
            fb_count(b, &b.s.permitted, FB_CNT_PERMITTED)
            return full_gen(b, w)
        now = resolve_now(b, now)
        if now < 0:
            return FB_NEED_CLOCK_
        since = fb_load_rlx(&b.s.since_ns)
        if st == S_OPEN:
            if now - since < open_period(c, w_level(w)):
                break
            if not claim_cas(b, &w):
                continue
            gen = transition(b, w, S_HALF_OPEN, now, 1, w_level(w), False, trans)
            fb_count(b, &b.s.permitted, FB_CNT_PERMITTED)
            return gen  # this caller is the first probe of the generation it published
        # HALF_OPEN
        inflight = w_inflight(w)
        if inflight and now - since >= opt(&c.probe_timeout_ns):
            # every outstanding probe counts as failed: re-open with backoff
            if not claim_cas(b, &w):
                continue
            transition(b, w, S_OPEN, now, 0, min_level(w_level(w) + 1), False, trans)
            break
        if inflight >= opt(&c.half_open_max):
            break
        fb_max(&b.s.since_ns, now)
        if fb_cas(&b.s.word, &w, w + ((<int64_t>1) << INFL_SHIFT)):
            fb_count(b, &b.s.permitted, FB_CNT_PERMITTED)
            trans[0] = trans_code(S_HALF_OPEN, S_HALF_OPEN, gen)
            return full_gen(b, w)
    if c.dry_run:
        x = x_need(b)
        if x != NULL:
            fb_add(&x.would_reject, 1)
        fb_count(b, &b.s.permitted, FB_CNT_PERMITTED)
        return DRY_RUN_PERMIT
    x = x_need(b)
    if x != NULL:
        fb_count(b, &x.rejected, FB_CNT_REJECTED)
    return FB_REJECTED_

# -- outcomes --------------------------------------------------------------------------------
cdef int release(core_t *b, int64_t permit, int outcome, int64_t now, int *trans) noexcept nogil:
    """0, FB_NEED_CLOCK_ (nothing recorded) or NEED_TRIP (recorded; call trip_auto with a time)."""
    cdef int64_t w, gen, ok
    cdef int st
    cdef config_t *c = cfg_of(b)
    cdef extra_t *x
    cdef bint timeout = outcome == FB_TIMEOUT
    if timeout:
        outcome = FB_FAILURE
    w = fb_load_acq(&b.s.word)
    while True:
        st = w & ST_MASK
        gen = w_gen(w)
        if permit != full_gen(b, w) or (w & BUSY) or st == S_OPEN or st == S_ISOLATED:
            add_stale(b)
            return 0
        if st == S_CLOSED:
            return release_closed(b, permit, outcome, timeout, now, trans)
        # HALF_OPEN: a probe reports
        if w_inflight(w) == 0:
            add_stale(b)
            return 0
        if outcome == FB_NEUTRAL:
            if fb_cas(&b.s.word, &w, w - ((<int64_t>1) << INFL_SHIFT)):
                add_ignored(b)
                return 0
            continue
        if outcome == FB_FAILURE or outcome == FB_SLOW:
            now = resolve_now(b, now)
            if now < 0:
                return FB_NEED_CLOCK_
            if not claim_cas(b, &w):
                continue
            x = x_need(b)
            if outcome == FB_FAILURE:
                fb_add(&b.s.failures, 1)
                if timeout and x != NULL:
                    fb_add(&x.timeouts, 1)
            else:
                fb_count(b, &b.s.successes, FB_CNT_SUCCESSES)
                add_slow(b)
            if x != NULL:
                fb_add(&x.probe_failed, 1)
            transition(b, w, S_OPEN, now, 0, min_level(w_level(w) + 1), False, trans)
            return 0
        ok = w_ok(w) + 1
        if ok >= opt(&c.success_threshold):
            if not claim_cas(b, &w):
                continue
            fb_count(b, &b.s.successes, FB_CNT_SUCCESSES)
            x = x_need(b)
            if x != NULL:
                fb_add(&x.probe_ok, 1)
            transition(b, w, S_CLOSED, 0, 0, 0, False, trans)
            return 0
        if fb_cas(&b.s.word, &w, w - ((<int64_t>1) << INFL_SHIFT) + ((<int64_t>1) << OK_SHIFT)):
            fb_count(b, &b.s.successes, FB_CNT_SUCCESSES)
            x = x_need(b)
            if x != NULL:
                fb_add(&x.probe_ok, 1)
            return 0

cdef inline int release_closed(core_t *b, int64_t permit, int outcome, bint timeout, int64_t now,
                               int *trans) noexcept nogil:
    cdef config_t *c = cfg_of(b)
    cdef bint failed, slow, trip = False
    cdef int64_t *tw = tw_of(b)
    cdef bint windowed = b.win != NULL  # either window
    cdef int64_t cur, count, tag, gen = permit & GEN_MASK
    cdef extra_t *x
    if outcome == FB_NEUTRAL:
        add_ignored(b)
        return 0
    failed = outcome == FB_FAILURE
    slow = outcome == FB_SLOW
    if tw != NULL:
        # the bucket decides first whether the outcome counts at all
        now = resolve_now(b, now)
        if now < 0:
            return FB_NEED_CLOCK_
        if not twindow_record(tw, c, now, failed, slow):
            add_stale(b)
            return 0
    if failed:
        fb_add(&b.s.failures, 1)
        if timeout:
            x = x_need(b)
            if x != NULL:
                fb_add(&x.timeouts, 1)
    else:
        fb_count(b, &b.s.successes, FB_CNT_SUCCESSES)
        if slow:
            add_slow(b)
    # consecutive failures, tagged with the generation (an older tag counts as zero)
    cur = fb_load_rlx(&b.s.consec)
    tag = gen << CONSEC_SHIFT
    if failed or (slow and not windowed):
        while True:
            if (cur >> CONSEC_SHIFT) == gen:
                count = (cur & CONSEC_MASK) + 1
            elif ((gen - (cur >> CONSEC_SHIFT)) & GEN_MASK) < (GEN_MASK >> 1):
                count = 1
            else:
                count = 0  # a newer generation owns the counter: this outcome is late
                break
            if fb_cas_strong(&b.s.consec, &cur, tag | count):
                break
        if not windowed and count >= opt(&c.failure_threshold):
            trip = True
    elif (cur >> CONSEC_SHIFT) == gen and (cur & CONSEC_MASK) != 0:
        fb_cas_strong(&b.s.consec, &cur, tag)
    if b.win != NULL and tw == NULL:
        trip = window_record(b, 2 if failed else (3 if slow else 1))
    elif tw != NULL and (failed or slow):
        trip = twindow_trips(tw, c, now)
    if trip:
        return trip_auto(b, permit, now, trans)
    return 0

cdef inline bint window_record(core_t *b, int64_t code) noexcept nogil:
    cdef window_t *win = cw_of(b)
    cdef config_t *c = cfg_of(b)
    cdef int64_t pos = (fb_add(&win.head, 1) - 1) % c.window
    cdef int64_t *slot = &win.slots[pos >> 5]
    cdef int shift = (pos & 31) * 2
    cdef int64_t cur = fb_load_rlx(slot), old, delta, agg, rec, fail, slow
    while True:
        old = (<uint64_t>cur >> shift) & 3
        if fb_cas_strong(slot, &cur, <int64_t>((<uint64_t>cur & ~((<uint64_t>3) << shift)) | (<uint64_t>code << shift))):
            break
    delta = ((old == 0)
             + (((code == 2) - (old == 2)) << AGG_BITS)
             + ((<int64_t>((code == 3) - (old == 3))) << (2 * AGG_BITS)))
    agg = fb_add(&win.agg, delta)
    rec = (agg & AGG_MASK) - AGG_BIAS
    fail = ((agg >> AGG_BITS) & AGG_MASK) - AGG_BIAS
    slow = ((agg >> (2 * AGG_BITS)) & AGG_MASK) - AGG_BIAS
    # a writer delayed across a whole close cycle can leave the counts off by one: clamp
    if rec > c.window:
        rec = c.window
    if rec < opt(&c.min_calls) or rec <= 0:
        return False
    if fail > rec:
        fail = rec
    if slow > rec:
        slow = rec
    if <double>fail / <double>rec >= c.failure_rate:
        return True
    return c.slow_ns != 0 and <double>slow / <double>rec >= c.slow_rate

# -- the time window (see _breaker_py's module docstring and _fb_breaker.h) ----------------------
cdef inline int64_t bucket_tag(int64_t word) noexcept nogil:
    return <int64_t>(<uint64_t>word >> TAG_SHIFT)

cdef inline bint twindow_record(int64_t *tw, config_t *c, int64_t now, bint failed, bint slow) noexcept nogil:
    """Count one outcome in the bucket of `now` (True), or False if that bucket rolled out."""
    cdef int64_t epoch = now // c.bucket_ns
    cdef int64_t tag = epoch & TAG_MASK
    cdef int64_t *slot = &tw[1 + epoch % c.buckets]
    cdef int64_t add = 1 + ((<int64_t>failed) << CNT_BITS) + ((<int64_t>slow) << (2 * CNT_BITS))
    cdef int64_t cur = fb_load_rlx(slot), last
    while True:
        if bucket_tag(cur) == tag:
            if (cur & CNT_MASK) == CNT_MASK:
                return True  # saturated: the bucket keeps its first CNT_MASK outcomes
            if fb_cas(slot, &cur, cur + add):
                return True  # the common case: one CAS
            continue
        # A stale tag: reset the bucket to this epoch, unless it holds a later one. The latest
        # reset epoch is raised before the reset, so a bucket never holds an epoch above it.
        last = fb_load_acq(&tw[0])
        if last > epoch and ((bucket_tag(cur) - tag) & TAG_MASK) < (TAG_MASK >> 1):
            return False
        if last < epoch:
            fb_max(&tw[0], epoch)
        if fb_cas(slot, &cur, <int64_t>((<uint64_t>tag << TAG_SHIFT) | <uint64_t>add)):
            return True

cdef inline void twindow_sums(int64_t *tw, config_t *c, int64_t now, int64_t *sums) noexcept nogil:
    """sums[0..2] = recorded, failed, slow over the buckets of the window ending at `now`."""
    cdef int64_t epoch = now // c.bucket_ns, n = c.buckets, i, w, expected
    sums[0] = sums[1] = sums[2] = 0
    for i in range(n):
        w = fb_load_rlx(&tw[1 + i])
        expected = (epoch - (((epoch - i) % n) + n) % n) & TAG_MASK
        if bucket_tag(w) == expected:
            sums[0] += w & CNT_MASK
            sums[1] += (w >> CNT_BITS) & CNT_MASK
            sums[2] += (w >> (2 * CNT_BITS)) & CNT_MASK

cdef inline bint twindow_trips(int64_t *tw, config_t *c, int64_t now) noexcept nogil:
    cdef int64_t sums[3]
    twindow_sums(tw, c, now, sums)
    if sums[0] <= 0 or sums[0] < opt(&c.min_calls):
        return False
    if <double>sums[1] / <double>sums[0] >= c.failure_rate:
        return True
    return c.slow_ns != 0 and <double>sums[2] / <double>sums[0] >= c.slow_rate

cdef int trip_auto(core_t *b, int64_t permit, int64_t now, int *trans) noexcept nogil:
    """CLOSED(permit) -> OPEN after an outcome crossed the threshold; NEED_TRIP without a time."""
    cdef int64_t w, cur, gen
    cdef group_t *g = cfg_of(b).group
    now = resolve_now(b, now)
    if now < 0:
        return NEED_TRIP
    w = fb_load_acq(&b.s.word)
    if w != make_word(S_CLOSED, permit, 0, 0, 0) or full_gen(b, w) != permit:
        return 0
    if g != NULL:
        # reserve a place among the non-CLOSED breakers, or suppress the trip
        cur = fb_load_rlx(&g.open)
        while True:
            if cur + 1 > max_open(g):
                fb_add(&g.suppressed, 1)
                return 0
            if fb_cas_strong(&g.open, &cur, cur + 1):
                break
    if not claim_cas(b, &w):
        if g != NULL:
            fb_add(&g.open, -1)
        return 0
    if cfg_of(b).group != g:
        # the breaker left (or joined) a map between the reservation and the claim
        if g != NULL:
            fb_add(&g.open, -1)
        group_open_add(b, 1)
    transition(b, w, S_OPEN, now, 0, 0, True, trans)
    return 0

cdef inline int64_t max_open(group_t *g) noexcept nogil:
    cdef int64_t bound = fb_load_rlx(&g.size) * g.num // g.den
    return bound if bound > 1 else 1

# Raw outcomes belong to the current generation when it can take them.
cdef inline int64_t raw_permit(core_t *b) noexcept nogil:
    cdef int64_t w = fb_load_acq(&b.s.word)
    cdef int st = w & ST_MASK
    if st == S_CLOSED or (st == S_HALF_OPEN and w_inflight(w)):
        return full_gen(b, w)
    return -1

# -- manual transitions --------------------------------------------------------------------------
cdef int manual(core_t *b, int target, int64_t now) noexcept nogil:
    """trip (S_OPEN), isolate (S_ISOLATED) or reset (S_CLOSED); returns the transition code,
    or MANUAL_STALLED."""
    cdef int64_t w
    cdef int trans = 0
    if not claim(b, &w):
        return MANUAL_STALLED
    if target == S_OPEN and (w & ST_MASK) == S_ISOLATED:
        fb_store_rel(&b.s.word, w)  # release the claim unchanged
        return 0
    transition(b, w, target, now, 0, 0 if target == S_CLOSED else w_level(w), False, &trans)
    return trans

# -- the C API (see _breaker_c.pxd) -----------------------------------------------------------------
cdef fb_breaker_t *fb_breaker_handle(object breaker) except NULL:
    if type(breaker) is not CircuitBreaker:
        raise TypeError(f"expected a compiled fastbreaker.CircuitBreaker, got {breaker!r}")
    live(<CircuitBreaker>breaker)
    return <fb_breaker_t *>&(<CircuitBreaker>breaker).st

cdef int64_t fb_breaker_acquire(fb_breaker_t *b, int64_t now) noexcept nogil:
    cdef int trans = 0
    return acquire(<core_t *>b, now, &trans)

cdef int64_t fb_breaker_acquire_closed(fb_breaker_t *b) noexcept nogil:
    cdef core_t *c = <core_t *>b
    # the state pointer read once: after the acquire load and the atomic add, the compiler
    # would read c.s again for each use (BreakerMap.allow's path, 3 instructions)
    cdef state_t *s = c.s
    cdef int64_t w = fb_load_acq(&s.word)
    if (w & (ST_MASK | BUSY)) == S_CLOSED:
        fb_count(c, &s.permitted, FB_CNT_PERMITTED)
        return (fb_load_rlx(&s.gen_hi) << GEN_BITS) | w_gen(w)
    return FB_REJECTED_

cdef int fb_breaker_release(fb_breaker_t *b, int64_t permit, int outcome, int64_t now) noexcept nogil:
    cdef int trans = 0
    if now < 0 and not cfg_of(<core_t *>b).use_c_clock:
        return FB_NEED_CLOCK_  # a breaker with a Python clock needs the caller's time
    if outcome < FB_SUCCESS or outcome > FB_TIMEOUT:
        outcome = FB_FAILURE
    return release(<core_t *>b, permit, outcome, now, &trans)

cdef int64_t fb_breaker_acquire_ex(fb_breaker_t *b, int64_t now, int *info) noexcept nogil:
    info[0] = 0
    return acquire(<core_t *>b, now, info)

cdef int fb_breaker_release_ex(fb_breaker_t *b, int64_t permit, int outcome, int64_t now,
                               int *info) noexcept nogil:
    info[0] = 0
    if now < 0 and not cfg_of(<core_t *>b).use_c_clock:
        return FB_NEED_CLOCK_
    if outcome < FB_SUCCESS or outcome > FB_TIMEOUT:
        outcome = FB_FAILURE
    return release(<core_t *>b, permit, outcome, now, info)

cdef object fb_breaker_call(object breaker, object fn, tuple args, dict kwargs):
    if type(breaker) is not CircuitBreaker:
        raise TypeError(f"breaker must be a compiled CircuitBreaker, got {breaker!r}")
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {fn!r}")
    live(<CircuitBreaker>breaker)
    cdef int64_t permit = admit(<CircuitBreaker>breaker)
    if permit < 0:
        raise open_error(<CircuitBreaker>breaker)
    return guarded_run(<CircuitBreaker>breaker, permit, fn, PySequence_Fast_ITEMS(args),
                       len(args), NULL, kwargs)

cdef object fb_breaker_record(object breaker, int outcome):
    if type(breaker) is not CircuitBreaker:
        raise TypeError(f"breaker must be a compiled CircuitBreaker, got {breaker!r}")
    live(<CircuitBreaker>breaker)
    finish(<CircuitBreaker>breaker, raw_permit(&(<CircuitBreaker>breaker).st), outcome, True)

cdef int64_t *fb_breaker_spare(fb_breaker_t *b) noexcept nogil:
    return &(<core_t *>b).own.word

cdef int fb_breaker_state(fb_breaker_t *b) noexcept nogil:
    return fb_load_acq(&(<core_t *>b).s.word) & ST_MASK


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


# An awaitable that is complete when made: `await fb_ready(x)` is x, with no coroutine and no
# StopIteration (the am_send slot returns the result directly; __next__ is there for iterators
# driven by hand).
cdef extern from *:
    """
    typedef struct { PyObject_HEAD PyObject *result; } fb_ready_t;
    static PyObject *fb_ready_type = NULL;
    static PyObject *fb_ready_self(PyObject *self) { Py_INCREF(self); return self; }
    static PySendResult fb_ready_send(PyObject *self, PyObject *arg, PyObject **result) {
        PyObject *r = ((fb_ready_t *)self)->result;
        (void)arg;
        Py_INCREF(r);
        *result = r;
        return PYGEN_RETURN;
    }
    static PyObject *fb_ready_next(PyObject *self) {
        PyObject *e = PyObject_CallOneArg(PyExc_StopIteration, ((fb_ready_t *)self)->result);
        if (e != NULL) {
            PyErr_SetObject(PyExc_StopIteration, e);
            Py_DECREF(e);
        }
        return NULL;
    }
    static void fb_ready_dealloc(PyObject *self) {
        PyTypeObject *tp = Py_TYPE(self);
        Py_XDECREF(((fb_ready_t *)self)->result);
        tp->tp_free(self);
        Py_DECREF(tp);
    }
    static PyType_Slot fb_ready_slots[] = {
        {Py_am_await, (void *)fb_ready_self},
        {Py_am_send, (void *)fb_ready_send},
        {Py_tp_iter, (void *)fb_ready_self},
        {Py_tp_iternext, (void *)fb_ready_next},
        {Py_tp_dealloc, (void *)fb_ready_dealloc},
        {0, NULL},
    };
    static PyType_Spec fb_ready_spec = {
        "fastbreaker._breaker_c.Ready", sizeof(fb_ready_t), 0, Py_TPFLAGS_DEFAULT, fb_ready_slots,
    };
    static int fb_ready_init(void) {
        fb_ready_type = PyType_FromSpec(&fb_ready_spec);
        return fb_ready_type == NULL ? -1 : 0;
    }
    static PyObject *fb_ready(PyObject *result) {
        fb_ready_t *r = PyObject_New(fb_ready_t, (PyTypeObject *)fb_ready_type);
        if (r == NULL) return NULL;  /* (PyObject_New took the heap type's reference) */
        Py_INCREF(result);
        r->result = result;
        return (PyObject *)r;
    }
    """
    int fb_ready_init() except -1
    object fb_ready(object result)

fb_ready_init()


# `await breaker.call_async(fn, ...)`: a compiled awaitable in place of _calls.call_async's
# coroutine, with the same steps at the same moments. Nothing happens until it is first
# driven; then it admits the call (CircuitOpenError if rejected), calls fn and drives what fn
# returned, passing on every value sent or exception thrown, and records the outcome exactly
# once: when fn's awaitable returns, raises, is closed (GeneratorExit: neutral) or is dropped
# while suspended (closed by the finalizer, as a suspended coroutine is). It is a Coroutine
# (collections.abc): send, throw, close, __await__, so asyncio.create_task() takes it. When a
# coroutine awaits it, CPython drives it through its am_send slot (gc_am_send) where the
# interpreter uses that slot (3.10, 3.11): no StopIteration is made for its result.
# It answers every driver as a coroutine does (the twin's call_async is one): driven from inside
# its own call (``executing``: while fn or its awaitable runs) it raises ValueError("coroutine
# already executing") and changes nothing; once finished or closed, send and throw raise
# RuntimeError("cannot reuse already awaited coroutine"); StopIteration thrown in before the
# start becomes RuntimeError (PEP 479) where a coroutine's frame converts it (before 3.12; from
# 3.12 on, a throw into an unstarted coroutine raises without running its frame, unconverted).
cdef bint _UNSTARTED_THROW_RUNS_FRAME = _sys.version_info < (3, 12)

cdef extern from "Python.h":
    int PyIter_Send(PyObject *iter, PyObject *arg, PyObject **presult)
    bint PyCoro_CheckExact(object o)

cdef extern from *:
    """
    static void fb_set_am_send(PyObject *type, void *fn) {
        PyTypeObject *tp = (PyTypeObject *)type;
        if (tp->tp_as_async != NULL) tp->tp_as_async->am_send = (sendfunc)fn;
    }
    """
    void fb_set_am_send(object type, void *fn)

cdef enum:
    GC_NEW = 0
    GC_RUNNING = 1
    GC_DONE = 2


@cython.final
cdef class GuardedCall:
    """What the compiled ``breaker.call_async(fn, ...)`` returns: await it (internal)."""

    cdef CircuitBreaker breaker
    cdef object fn, args, kwargs, inner
    cdef int64_t permit, start
    cdef int state
    cdef bint executing

    def __await__(self):
        return self

    def __iter__(self):
        return self

    def __next__(self):
        cdef int returned = 0
        result = gc_advance(self, None, &returned)
        if returned:
            raise StopIteration(result)
        return result

    def send(self, value):
        """Send ``value`` into the awaited call (as ``coroutine.send``)."""
        cdef int returned = 0
        result = gc_advance(self, value, &returned)
        if returned:
            raise StopIteration(result)
        return result

    def throw(self, typ, val=None, tb=None):
        """Raise an exception into the awaited call (as ``coroutine.throw``)."""
        cdef int returned = 0
        result = gc_throw(self, typ, val, tb, &returned)
        if returned:
            raise StopIteration(result)
        return result

    def close(self):
        """Close the awaited call; a call in flight is recorded as neutral (GeneratorExit)."""
        gc_close(self)

    def __del__(self):
        if self.state == GC_RUNNING and not self.executing:
            gc_close(self)


cdef int gc_not_executing(GuardedCall g) except -1:
    if g.executing:
        raise ValueError("coroutine already executing")
    return 0


cdef object gc_start(GuardedCall g):
    """Admit the call and call fn: its awaitable becomes g.inner (_calls.call_async's steps)."""
    cdef CircuitBreaker b = g.breaker
    cdef int64_t permit, start = 0
    fn, args, kwargs = g.fn, g.args, g.kwargs
    g.state = GC_DONE  # until admitted: an error on the way leaves nothing to release
    g.fn = g.args = g.kwargs = None
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {fn!r}")
    permit = acquire_or_reject(b)
    if permit < 0:
        raise open_error(b)
    if cfg_of(&b.st).timed:
        start = _calls.start_or_release(b, permit)
    g.executing = 1
    try:
        aw = fn(*args, **kwargs)
        inner = aw if PyCoro_CheckExact(aw) else _calls.awaiting(aw)
    except BaseException as exc:
        g.executing = 0
        _calls.finish_raised(b, permit, start, exc)
        raise
    g.executing = 0
    g.permit = permit
    g.start = start
    g.inner = inner
    g.state = GC_RUNNING


cdef object gc_returned(GuardedCall g, result):
    """fn's awaitable returned ``result``: record the success."""
    cdef CircuitBreaker b = g.breaker
    g.state = GC_DONE
    g.inner = None
    if cfg_of(&b.st).timed:
        _calls.finish_returned(b, g.permit, g.start)
    else:
        finish(b, g.permit, FB_SUCCESS)
    return result


cdef object gc_raised(GuardedCall g, exc):
    """fn's awaitable raised ``exc``: record its outcome (the caller re-raises it)."""
    cdef CircuitBreaker b = g.breaker
    g.state = GC_DONE
    g.inner = None
    if cfg_of(&b.st).timed:
        _calls.finish_raised(b, g.permit, g.start, exc)
    else:
        finish(b, g.permit, (<Config>cfg_of(&b.st).owner).options.classify(exc))


cdef object gc_advance(GuardedCall g, value, int *returned):
    """One step: what fn's awaitable yields, or (``returned`` set) what it returned."""
    cdef PyObject *out = NULL
    cdef int r
    if g.executing:
        raise ValueError("coroutine already executing")
    if g.state == GC_NEW:
        if value is not None:
            raise TypeError("can't send non-None value to a just-started coroutine")
        gc_start(g)
    elif g.state == GC_DONE:
        raise RuntimeError("cannot reuse already awaited coroutine")
    inner = g.inner
    g.executing = 1
    r = PyIter_Send(<PyObject *>inner, <PyObject *>value, &out)
    g.executing = 0
    try:
        if r == -1:
            raise_current()
    except BaseException as exc:
        gc_raised(g, exc)
        raise
    result = <object>out
    Py_DECREF(result)  # <object> took its own reference
    if r == 1:  # PYGEN_NEXT: fn's awaitable is suspended
        return result
    returned[0] = 1
    return gc_returned(g, result)


cdef object gc_throw(GuardedCall g, typ, val, tb, int *returned):
    gc_not_executing(g)
    if g.state == GC_DONE:
        raise RuntimeError("cannot reuse already awaited coroutine")
    if g.state == GC_NEW:
        # not started: as a coroutine, it raises the exception it is given (and is finished)
        g.state = GC_DONE
        g.fn = g.args = g.kwargs = None
        try:
            return _calls.throw_into(None, typ, val, tb)
        except StopIteration as stop:
            if _UNSTARTED_THROW_RUNS_FRAME:
                raise RuntimeError("coroutine raised StopIteration") from stop
            raise
    inner = g.inner
    g.executing = 1
    try:
        result = _calls.throw_into(inner, typ, val, tb)
    except StopIteration as stop:
        g.executing = 0
        returned[0] = 1
        return gc_returned(g, stop.value)
    except BaseException as exc:
        g.executing = 0
        gc_raised(g, exc)
        raise
    g.executing = 0
    return result


cdef object gc_close(GuardedCall g):
    gc_not_executing(g)
    if g.state != GC_RUNNING:
        g.state = GC_DONE
        g.fn = g.args = g.kwargs = None
        return
    inner = g.inner
    g.executing = 1
    try:
        inner.close()
    except BaseException as exc:
        g.executing = 0
        gc_raised(g, exc)
        raise
    g.executing = 0
    gc_raised(g, GeneratorExit())


cdef int raise_current() except -1:
    """PyIter_Send returned an error: let Cython raise the exception it set."""
    return -1


cdef int gc_am_send(PyObject *self, PyObject *arg, PyObject **presult) except -1:
    """The am_send slot: 1 (PYGEN_NEXT) with the value yielded, 0 (PYGEN_RETURN) with the
    result, or -1 (PYGEN_ERROR) with the exception set."""
    cdef int returned = 0
    result = gc_advance(<GuardedCall>self, <object>arg, &returned)
    Py_INCREF(result)
    presult[0] = <PyObject *>result
    return 0 if returned else 1


fb_set_am_send(GuardedCall, <void *>gc_am_send)
import collections.abc as _abc
_abc.Coroutine.register(GuardedCall)


# `with breaker:` bookkeeping (the compiled counterpart of _calls' Block stacks; same
# observable rules). Each context (thread or asyncio task) that enters a block gets one
# WithStack, found through a ContextVar and owned by the context that made it: a child task
# inherits its parent's value but, being another Context object, makes its own stack on first
# use, so a stack is only ever pushed and popped by the one thread running its context (a
# context cannot be entered twice at once). Entering a block pushes (breaker, permit, start)
# onto it; a normal exit pops the top entry. Nothing is allocated per block.
#
# An exit in a foreign context (a generator closed by another thread or task) cannot find its
# entry on its own stack: it takes, from every live stack, the most recently entered open entry
# of the same breaker. Each entry has a word, (version << 1) | taken: taking an entry, by its
# owner or by a foreign exit, is one CAS from open to taken on the version that was read, so
# every entry is taken exactly once. An owner skips entries taken by a foreign exit and drops
# them once they reach the top. A slot is reused only under a new version, so a foreign exit
# that read a slot before it was reused fails its CAS and looks again. The registry of stacks
# is a list guarded by a spin lock, taken only by foreign exits, by a stack that grows, and by
# a stack's creation and destruction. While a stack has open entries the registry holds a
# reference to it, so that a block entered in a context that has since ended (a thread that
# finished with a suspended generator) can still be taken by the exit that comes later.
ctypedef struct with_entry_t:
    int64_t word
    PyObject *breaker       # a strong reference while the entry is on its stack
    int64_t permit
    int64_t start
    int64_t order           # global entry order: "most recently entered" for foreign exits

ctypedef struct with_stack_t:
    with_entry_t *items
    int64_t n               # entries on the stack (written by the owner only)
    int64_t cap
    int64_t ver             # the owner's version counter for entry words
    int64_t open            # entries not yet taken (atomic)
    PyObject *obj           # the WithStack
    with_stack_t *prev
    with_stack_t *next

cdef int64_t _with_lock = 0
cdef int64_t _with_order = 0
cdef with_stack_t _with_head    # sentinel of the registry's circular list
_with_head.prev = &_with_head
_with_head.next = &_with_head

cdef inline void with_lock() noexcept nogil:
    cdef int64_t expected
    while True:
        expected = 0
        if fb_cas_strong(&_with_lock, &expected, 1):
            return

cdef inline void with_unlock() noexcept nogil:
    fb_store_rel(&_with_lock, 0)


@cython.final
@cython.no_gc
cdef class WithStack:
    """The open ``with`` blocks of one context (internal)."""

    cdef with_stack_t s
    cdef Py_ssize_t owner   # the owning Context's address (compared, never dereferenced)

    def __cinit__(self):
        self.s.items = <with_entry_t *>PyMem_Calloc(8, sizeof(with_entry_t))
        if self.s.items == NULL:
            raise MemoryError()
        self.s.cap = 8
        self.s.obj = <PyObject *>self
        with_lock()
        self.s.prev = &_with_head
        self.s.next = _with_head.next
        _with_head.next.prev = &self.s
        _with_head.next = &self.s
        with_unlock()

    def __dealloc__(self):
        cdef int64_t i
        if self.s.next != NULL:
            with_lock()
            self.s.prev.next = self.s.next
            self.s.next.prev = self.s.prev
            with_unlock()
        for i in range(self.s.n):
            Py_DECREF(<object>self.s.items[i].breaker)
        PyMem_Free(self.s.items)

    @property
    def open_blocks(self):
        """How many blocks entered in this context are open (for tests)."""
        cdef int64_t i, k = 0
        for i in range(self.s.n):
            if not (fb_load_acq(&self.s.items[i].word) & 1):
                k += 1
        return k


cdef object _with_var = _contextvars.ContextVar("fastbreaker_with_blocks", default=None)


cdef inline WithStack own_stack():
    """This context's stack, or None when it has none yet."""
    cdef PyObject *value
    PyContextVar_Get(_with_var, NULL, &value)
    cdef Py_ssize_t ctx = <Py_ssize_t>fb_tstate_get().context
    if value != <PyObject *>None and (<WithStack>value).owner == ctx:
        Py_DECREF(<object>value)
        return <WithStack>value
    Py_DECREF(<object>value)
    return None


cdef WithStack new_stack():
    cdef WithStack st = WithStack.__new__(WithStack)
    st.owner = <Py_ssize_t>fb_tstate_get().context  # set by PyContextVar_Get in own_stack
    PyContextVar_Set(_with_var, st)
    return st


cdef inline void drop_taken(WithStack st) noexcept:
    """Pop the entries on top that an exit has taken (the owner only)."""
    cdef int64_t n = st.s.n
    cdef with_entry_t *e
    while n > 0:
        e = &st.s.items[n - 1]
        if not (fb_load_acq(&e.word) & 1):
            break
        n -= 1
        fb_store_rel(&st.s.n, n)
        Py_DECREF(<object>e.breaker)


cdef int grow(WithStack st) except -1:
    cdef int64_t cap = st.s.cap * 2
    with_lock()  # a foreign exit may be reading the items
    items = <with_entry_t *>PyMem_Realloc(st.s.items, cap * sizeof(with_entry_t))
    if items != NULL:
        st.s.items = items
        st.s.cap = cap
    with_unlock()
    if items == NULL:
        raise MemoryError()
    return 0


cdef int push_block(CircuitBreaker b, int64_t permit, int64_t start) except -1:
    st = own_stack()
    if st is None:
        st = new_stack()
    else:
        drop_taken(st)
    cdef int64_t n = st.s.n
    if n == st.s.cap:
        grow(st)
    cdef with_entry_t *e = &st.s.items[n]
    Py_INCREF(b)
    e.breaker = <PyObject *>b
    e.permit = permit
    e.start = start
    e.order = fb_add(&_with_order, 1)
    if fb_add(&st.s.open, 1) == 1:
        Py_INCREF(st)  # the registry's reference while an entry is open
    st.s.ver += 1
    fb_store_rel(&e.word, st.s.ver << 1)
    fb_store_rel(&st.s.n, n + 1)
    return 0


cdef bint pop_block(CircuitBreaker b, int64_t *permit, int64_t *start) except -1:
    """Take the entry of the exiting block of ``b``: False if it is not on this context's
    stack (a foreign exit)."""
    cdef with_entry_t *e
    cdef int64_t i, w
    st = own_stack()
    if st is None:
        return False
    i = st.s.n - 1
    while i >= 0:
        e = &st.s.items[i]
        w = fb_load_acq(&e.word)
        if e.breaker == <PyObject *>b and not (w & 1):
            permit[0] = e.permit
            start[0] = e.start
            if fb_cas_strong(&e.word, &w, w | 1):
                drop_taken(st)
                if fb_add(&st.s.open, -1) == 0:
                    Py_DECREF(st)  # this context holds it too: never the last reference
                return True
            continue  # taken meanwhile by a foreign exit: look again
        i -= 1
    return False


cdef int take_foreign(CircuitBreaker b, int64_t *permit, int64_t *start) except -1:
    """Take the most recently entered open entry of ``b`` on any stack."""
    cdef with_stack_t *s
    cdef with_entry_t *e
    cdef with_entry_t *best
    cdef with_stack_t *best_s
    cdef int64_t i, n, w, best_w, best_order, p = 0, t = 0
    cdef bint found
    cdef PyObject *release
    while True:
        best = NULL
        best_s = NULL
        best_w = 0
        best_order = -1
        with_lock()
        s = _with_head.next
        while s != &_with_head:
            n = fb_load_acq(&s.n)
            for i in range(n):
                e = &s.items[i]
                w = fb_load_acq(&e.word)
                if not (w & 1) and e.breaker == <PyObject *>b and e.order > best_order:
                    best, best_s, best_w, best_order = e, s, w, e.order
                    p, t = e.permit, e.start
            s = s.next
        found = best != NULL and fb_cas_strong(&best.word, &best_w, best_w | 1)
        release = NULL
        if found and fb_add(&best_s.open, -1) == 0:
            release = best_s.obj
        with_unlock()
        if release != NULL:
            Py_DECREF(<object>release)  # may free a stack whose context has ended
        if found:
            permit[0] = p
            start[0] = t
            return 0
        if best == NULL:
            raise RuntimeError("breaker exited a `with` block that it never entered")


def open_with_blocks(breaker):
    """How many ``with`` blocks of ``breaker`` are open in every context (for tests)."""
    cdef with_stack_t *s
    cdef int64_t i, k = 0
    with_lock()
    s = _with_head.next
    while s != &_with_head:
        for i in range(fb_load_acq(&s.n)):
            if not (fb_load_acq(&s.items[i].word) & 1) and s.items[i].breaker == <PyObject *>breaker:
                k += 1
        s = s.next
    with_unlock()
    return k


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

# -- a breaker in a SharedRegion ----------------------------------------------------------------
# The block (see _fb_breaker.h): fb_state_t, fb_claim_t, fb_extra_t with its histogram, then the
# count window (fb_window_t) or the time window's words.
cdef tuple block_layout(options):
    cdef Py_ssize_t x_at = sizeof(state_t) + sizeof(claim_t)
    cdef Py_ssize_t nlat = len(options.latency_bounds_ns) + 2 if options.timed else 0
    cdef Py_ssize_t win_at = x_at + sizeof(extra_t) + nlat * sizeof(int64_t)
    cdef Py_ssize_t win_size = 0
    if options.window:
        win_size = sizeof(window_t) + ((options.window + 31) >> 5) * sizeof(int64_t)
    elif options.bucket_ns:
        win_size = (options.window_buckets + 1) * sizeof(int64_t)
    return x_at, win_at, win_at + win_size

def shared_group_size():
    """The bytes of a shared map's group (SharedRegion)."""
    return sizeof(group_t)

def shared_group_init(view, double max_open_ratio):
    cdef Group model = Group(max_open_ratio)
    cdef group_t *g = <group_t *>view_address(view, sizeof(group_t))
    g.num = model.own.num
    g.den = model.own.den

def shared_size(options):
    """The bytes of a shared breaker's block (SharedRegion)."""
    return block_layout(options)[2]

cdef char *view_address(object view, Py_ssize_t need) except NULL:
    cdef const unsigned char[::1] mv = view
    if mv.shape[0] < need:
        raise ValueError(f"the block has {mv.shape[0]} bytes, {need} needed")
    return <char *>&mv[0]

def shared_init(view, options):
    """Lay out a new block on zeroed memory: CLOSED, generation 0, an empty window."""
    x_at, win_at, total = block_layout(options)
    cdef char *base = view_address(view, total)
    if options.window:
        (<window_t *>(base + <Py_ssize_t>win_at)).agg = AGG_ZERO

# The object lives in this process; its state words are the region's. Its config (options,
# listeners, classification) is this process's own, and keeps the region's mapping alive.
cdef CircuitBreaker attach_shared(Config config, label, view):
    cdef CircuitBreaker self = CircuitBreaker.__new__(CircuitBreaker)
    options = config.options
    x_at, win_at, total = block_layout(options)
    cdef char *base = view_address(view, total)
    config.region_view = view
    self.st.s = <state_t *>base
    self.st.x = <extra_t *>(base + <Py_ssize_t>x_at)
    if options.window:
        self.st.win = <window_t *>(base + <Py_ssize_t>win_at)
    elif options.bucket_ns:
        self.st.win = <window_t *>(<uintptr_t>(base + <Py_ssize_t>win_at) | 1)
    Py_INCREF(config)
    fb_store_ptr(<void **>&self.st.cfg, &config.c)
    self._label = label
    return self

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

_MANUAL_NAMES = {S_OPEN: "trip()", S_ISOLATED: "isolate()", S_CLOSED: "reset()"}

cdef object manual_step(CircuitBreaker self, int target, int64_t now):
    """trip(), isolate() and reset(): the transition without the GIL (a shared breaker may wait
    up to CLAIM_STALL_NS for another process's claim), then its callbacks."""
    cdef int trans
    with nogil:
        trans = manual(&self.st, target, now)
    if trans == MANUAL_STALLED:
        raise SharedStateTimeout(
            f"{_MANUAL_NAMES[target]} on the shared breaker {label_of(self)!r}: another process "
            f"has held a transition of it for {CLAIM_STALL_NS // 1_000_000} ms or more (it is "
            "stopped or stuck); nothing changed")
    if trans:
        fire(self, trans)


cdef object fire(CircuitBreaker self, int trans):
    cdef Config config
    cdef int old = (trans >> 4) & 0xF, new = trans & 0xF
    if old == new:
        return
    config = <Config>cfg_of(&self.st).owner
    _calls.fire(self, tuple(config.listeners), config.hook, _STATES[old], _STATES[new])

cdef inline int64_t now_of(CircuitBreaker self) except? -1:
    cdef config_t *c = live(self)
    if c.use_c_clock:
        return fb_monotonic_ns()
    return _read_clock((<Config>c.owner).options.clock)

cdef double retry_after_of(CircuitBreaker self, int64_t w) except? -1.0:
    cdef int64_t since = fb_load_rlx(&self.st.s.since_ns), left
    cdef int st = w & ST_MASK
    if st == S_ISOLATED:
        return INFINITY
    if st != S_OPEN:
        return 0.0
    left = since + open_period(cfg_of(&self.st), w_level(w)) - now_of(self)
    return (left if left > 0 else 0) / 1e9

cdef inline object label_of(CircuitBreaker self):
    label = self._label
    if label is None or type(label) is str:  # label_name's common cases, without a call
        return label
    return label_name(label)

cdef object open_error(CircuitBreaker self):
    live(self)
    cdef int64_t w = fb_load_acq(&self.st.s.word)
    return CircuitOpenError(label_of(self), _STATES[w & ST_MASK], retry_after_of(self, w))

# A permit, or FB_REJECTED (the caller raises open_error: see call()).
cdef inline int64_t admit(CircuitBreaker self) except? -9:
    cdef int trans = 0
    cdef int64_t permit = acquire(&self.st, -1, &trans)
    if permit == FB_NEED_CLOCK_ or trans:
        return acquire_or_reject_slow(self, permit, trans)
    return permit

# Run fn under `permit` and record its outcome. The arguments are a vector: `n` positional ones
# at `argv`, then those named by the tuple `kwnames` (vectorcall), or the dict `kwargs`.
cdef object guarded_run(CircuitBreaker self, int64_t permit, fn, PyObject **argv, size_t n,
                        PyObject *kwnames, dict kwargs):
    cdef int64_t start = 0
    cdef config_t *c
    cdef Config config
    # Hold the config for the whole call: a BreakerMap may swap it while fn runs.
    config = <Config>cfg_of(&self.st).owner
    c = &config.c
    if c.timed:
        start = _calls.start_or_release(self, permit)
    try:
        if kwargs:
            result = PyObject_VectorcallDict(fn, argv, n, <PyObject *>kwargs)
        else:
            result = PyObject_Vectorcall(fn, argv, n, kwnames)
    except BaseException as exc:
        if c.timed:
            _calls.finish_raised(self, permit, start, exc)
        else:
            finish(self, permit, config.options.classify(exc))
        raise
    if c.timed:
        _calls.finish_returned(self, permit, start)
    else:
        finish(self, permit, FB_SUCCESS)
    return result


@cython.final
cdef class GuardedFunction:
    """``@breaker`` on a coroutine function, compiled: a call returns the awaitable of
    ``breaker.call_async(fn, *args, **kwargs)``, so no coroutine frame of its own runs. It
    passes for the coroutine function it wraps: ``functools.update_wrapper`` metadata, the
    wrapped function's ``__code__`` (``inspect.iscoroutinefunction`` and
    ``asyncio.iscoroutinefunction`` hold, and ``inspect.signature`` is the wrapped one's), it
    binds as a method, and it pickles and copies by reference, as a function does."""

    cdef CircuitBreaker breaker
    cdef object fn
    cdef dict __dict__
    cdef object __weakref__

    def __call__(self, *args, **kwargs):
        cdef GuardedCall g = GuardedCall.__new__(GuardedCall)
        g.breaker = self.breaker
        g.fn = self.fn
        g.args = args
        g.kwargs = kwargs
        return g

    def __get__(self, obj, objtype):
        if obj is None:
            return self
        return _MethodType(self, obj)

    def __repr__(self):
        return f"<guarded coroutine function {getattr(self, '__qualname__', self.fn)!r}>"

    def __reduce__(self):
        return self.__qualname__


cdef object guard_async(CircuitBreaker breaker, fn):
    """The compiled wrapper behind ``@breaker`` on a coroutine function (GuardedFunction)."""
    cdef GuardedFunction g = GuardedFunction.__new__(GuardedFunction)
    g.breaker = breaker
    g.fn = fn
    target = _calls._call_target(fn)
    wrapper = <object>g
    wrapper.__code__ = getattr(target, "__code__", None)
    wrapper.__defaults__ = getattr(target, "__defaults__", None)
    wrapper.__kwdefaults__ = getattr(target, "__kwdefaults__", None)
    # what a callable object lacks (update_wrapper copies only what fn has), as for a function
    wrapper.__name__ = getattr(target, "__name__", "guarded")
    wrapper.__qualname__ = getattr(target, "__qualname__", wrapper.__name__)
    wrapper.__annotations__ = {}
    _update_wrapper(wrapper, fn)
    if _markcoroutinefunction is not None:
        _markcoroutinefunction(g)
    return g


cdef object guard(CircuitBreaker breaker, fn):
    """The compiled wrapper behind ``@breaker`` on a sync function."""
    def guarded(*args, **kwargs):
        cdef int64_t permit = admit(breaker)
        if permit < 0:
            raise open_error(breaker)
        return guarded_run(breaker, permit, fn, PySequence_Fast_ITEMS(args), len(args), NULL,
                           kwargs)
    return _update_wrapper(guarded, fn)


cdef int64_t acquire_or_reject(CircuitBreaker self) except? -9:
    live(self)
    return admit(self)

cdef int64_t acquire_or_reject_slow(CircuitBreaker self, int64_t permit, int trans) except? -9:
    if permit == FB_NEED_CLOCK_:
        permit = acquire(&self.st, now_of(self), &trans)
    if trans:
        try:
            fire(self, trans)
        except BaseException:
            # a callback raised a BaseException (KeyboardInterrupt): the caller never gets the
            # permit, so give it back, or the probe slot stays taken
            if permit >= 0:
                finish(self, permit, FB_NEUTRAL)
            raise
    return permit

cdef object finish(CircuitBreaker self, int64_t permit, int outcome, bint raw=False):
    cdef int trans = 0
    cdef int r
    cdef int64_t now = -1
    # A Python clock is read before anything is recorded when the outcome may need the time (it
    # can trip or re-open), so that a clock that raises or returns garbage loses nothing: a raw
    # record_*() records nothing and raises; a call path's permit is given back as neutral (a
    # probe slot must not stay taken), then the clock's error propagates.
    if not live(self).use_c_clock and outcome != FB_NEUTRAL and (
            outcome != FB_SUCCESS or self.st.win != NULL):
        try:
            now = now_of(self)
        except BaseException:
            if not raw:
                finish(self, permit, FB_NEUTRAL)
            raise
    r = release(&self.st, permit, outcome, now, &trans)
    if r == FB_NEED_CLOCK_:
        r = release(&self.st, permit, outcome, now_of(self), &trans)
    if r == NEED_TRIP:
        r = trip_auto(&self.st, permit, now_of(self), &trans)
    if trans:
        fire(self, trans)


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


# -- call(): a METH_FASTCALL C function -----------------------------------------------------------
# `breaker.call(fn, *args, **kwargs)` is the hot path. As a C function it forwards its argument
# vector to fn as is (no *args tuple, no **kwargs dict), and it raises CircuitOpenError without
# Cython's raise statement, which would add a traceback frame for the breaker's own code: the
# frame costs more than the whole admission, and the caller's frames are all a user needs.
cdef extern from *:
    """
    typedef PyObject *(*fb_fastcall_kw_t)(PyObject *, PyObject **, Py_ssize_t, PyObject *);
    static PyMethodDef fb_call_def = {"call", NULL, METH_FASTCALL | METH_KEYWORDS,
        "call($self, fn, /, *args, **kwargs)\\n--\\n\\n"
        "Call ``fn(*args, **kwargs)`` through the breaker; raise CircuitOpenError if rejected."};
    static int fb_install_fastcall(PyObject *type, fb_fastcall_kw_t impl) {
        PyTypeObject *t = (PyTypeObject *)type;
        PyObject *descr;
        int r;
        fb_call_def.ml_meth = (PyCFunction)(void (*)(void))impl;
        descr = PyDescr_NewMethod(t, &fb_call_def);
        if (descr == NULL) return -1;
        r = PyDict_SetItemString(t->tp_dict, fb_call_def.ml_name, descr);
        Py_DECREF(descr);
        PyType_Modified(t);
        return r;
    }
    """
    ctypedef PyObject *(*fb_fastcall_kw_t)(PyObject *, PyObject **, Py_ssize_t, PyObject *)
    int fb_install_fastcall(PyObject *t, fb_fastcall_kw_t impl) except -1

cdef PyObject *call_fastcall(PyObject *self, PyObject **args, Py_ssize_t nargs,
                             PyObject *kwnames) except NULL:
    if nargs < 1:
        raise TypeError("call() missing required argument 'fn' (pos 1)")
    fn = <object>args[0]
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {fn!r}")
    cdef CircuitBreaker b = <CircuitBreaker><object>self
    live(b)
    cdef int64_t permit = admit(b)
    if permit < 0:
        err = open_error(b)
        PyErr_SetObject(<PyObject *>CircuitOpenError, <PyObject *>err)
        return NULL
    result = guarded_run(b, permit, fn, args + 1, nargs - 1, kwnames, None)
    Py_INCREF(result)
    return <PyObject *>result

fb_install_fastcall(<PyObject *>CircuitBreaker, <fb_fastcall_kw_t>call_fastcall)
from functools import update_wrapper as _update_wrapper
from types import MethodType as _MethodType
_markcoroutinefunction = getattr(_inspect, "markcoroutinefunction", None)  # 3.12+
from bisect import bisect_left as _bisect_left
_calls_kind = _calls.kind
