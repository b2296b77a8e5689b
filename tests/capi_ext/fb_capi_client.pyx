# cython: language_level=3, freethreading_compatible=True
# cython: boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""A test-only downstream extension: it cimports fastbreaker's C API like third-party code would.

Built at test time (``capi_ext.build_client``) against the installed package, and a second time
against a racy copy of the core (the negative control), for which the two ``cimport`` lines below
are rewritten to the copy's module names. It is never shipped.

Besides thin wrappers for the API tests it holds the nogil hammers of the stress tests: each runs
in the calling thread with the GIL released, so Python threads calling them run in parallel.
"""

from libc.stdint cimport int64_t, uint64_t

from fastbreaker._breaker_c cimport (
    FB_FAILURE, FB_NEED_CLOCK, FB_NEUTRAL, FB_REJECTED, FB_SLOW, FB_SUCCESS, fb_breaker_acquire,
    fb_breaker_acquire_closed, fb_breaker_acquire_ex, fb_breaker_handle, fb_breaker_release, fb_breaker_release_ex,
    fb_breaker_state, fb_breaker_t, fb_info_changed, fb_info_gen, fb_info_new, fb_info_old,
    fb_info_probe)
from fastbreaker._budget_c cimport (RetryBudget, fb_budget_deposit, fb_budget_handle, fb_budget_t,
                                    fb_budget_try_take)

cdef extern from "_fb_atomic.h" nogil:
    int64_t fb_load_acq(int64_t *p)
    int64_t fb_load_rlx(int64_t *p)
    int64_t fb_monotonic_ns()

# Test-only peek at the private layout (the public .pxd keeps fb_breaker_t opaque): the stress
# test reads the state word and the trip time the way the core's own readers do.
cdef extern from "_fb_breaker.h" nogil:
    ctypedef struct raw_state_t "fb_state_t":
        int64_t word
        int64_t since_ns
    ctypedef struct raw_breaker_t "fb_breaker_t":
        raw_state_t *s

# The state word's layout, copied from _breaker_c.pyx (test-only knowledge of the internals).
cdef enum:
    ST_MASK = 3
    BUSY = 4
    S_OPEN = 1
    GEN_SHIFT = 41
    GEN_MASK = 0x3FFFFF

CONSTANTS = dict(
    FB_SUCCESS=FB_SUCCESS, FB_SLOW=FB_SLOW, FB_FAILURE=FB_FAILURE, FB_NEUTRAL=FB_NEUTRAL,
    FB_REJECTED=FB_REJECTED, FB_NEED_CLOCK=FB_NEED_CLOCK, GEN_MASK=GEN_MASK,
)


cdef tuple decode(int info):
    return (bool(fb_info_probe(info)), bool(fb_info_changed(info)), fb_info_old(info),
            fb_info_new(info), fb_info_gen(info))


# -- thin wrappers for test_capi.py --------------------------------------------------------------
def handle(breaker):
    """fb_breaker_handle(); raises TypeError for anything but a compiled breaker."""
    return <Py_ssize_t>fb_breaker_handle(breaker)


def acquire(breaker, int64_t now=-1):
    cdef fb_breaker_t *b = fb_breaker_handle(breaker)
    cdef int64_t permit
    with nogil:
        permit = fb_breaker_acquire(b, now)
    return permit


def acquire_closed(breaker):
    cdef fb_breaker_t *b = fb_breaker_handle(breaker)
    cdef int64_t permit
    with nogil:
        permit = fb_breaker_acquire_closed(b)
    return permit


def release(breaker, int64_t permit, int outcome, int64_t now=-1):
    cdef fb_breaker_t *b = fb_breaker_handle(breaker)
    cdef int r
    with nogil:
        r = fb_breaker_release(b, permit, outcome, now)
    return r


def acquire_ex(breaker, int64_t now=-1):
    """(permit, (probe, changed, old, new, gen))"""
    cdef fb_breaker_t *b = fb_breaker_handle(breaker)
    cdef int64_t permit
    cdef int info = -1
    with nogil:
        permit = fb_breaker_acquire_ex(b, now, &info)
    return permit, decode(info)


def release_ex(breaker, int64_t permit, int outcome, int64_t now=-1):
    """(result, (probe, changed, old, new, gen))"""
    cdef fb_breaker_t *b = fb_breaker_handle(breaker)
    cdef int r
    cdef int info = -1
    with nogil:
        r = fb_breaker_release_ex(b, permit, outcome, now, &info)
    return r, decode(info)


def state(breaker):
    cdef fb_breaker_t *b = fb_breaker_handle(breaker)
    return fb_breaker_state(b)


def raw_state(breaker):
    """(state, busy, generation, since_ns): the word read with acquire, then the trip time."""
    cdef raw_breaker_t *raw = <raw_breaker_t *>fb_breaker_handle(breaker)
    cdef int64_t w = fb_load_acq(&raw.s.word)
    cdef int64_t since = fb_load_rlx(&raw.s.since_ns)
    return w & ST_MASK, bool(w & BUSY), (w >> GEN_SHIFT) & GEN_MASK, since


def budget_deposit(budget, Py_ssize_t n=1):
    cdef fb_budget_t *b = fb_budget_handle(budget)  # the opaque path
    cdef Py_ssize_t i
    with nogil:
        for i in range(n):
            fb_budget_deposit(b)


def budget_take(budget, int64_t now=-1):
    cdef fb_budget_t *b = fb_budget_handle(budget)
    cdef int r
    with nogil:
        r = fb_budget_try_take(b, now)
    return r


def budget_units(RetryBudget budget):
    """(tokens, last_ns) in raw units, read without refilling."""
    return fb_load_acq(&budget.state.tk[0]), fb_load_acq(&budget.state.tk[1])


# -- cost of the entry points, measured in a C loop ------------------------------------------------
def bench(breaker, RetryBudget budget, int64_t n):
    """ns per call, from a nogil C loop of n iterations: acquire+release in CLOSED, acquire alone,
    acquire_ex+release_ex, budget deposit, budget take (now given: no clock read)."""
    cdef fb_breaker_t *b = fb_breaker_handle(breaker)
    cdef fb_budget_t *bb = &budget.state
    cdef int64_t i, p, t0, t1, t2, t3, t4, t5, sink = 0
    cdef int info
    with nogil:
        t0 = fb_monotonic_ns()
        for i in range(n):
            p = fb_breaker_acquire(b, -1)
            fb_breaker_release(b, p, FB_SUCCESS, -1)
        t1 = fb_monotonic_ns()
        for i in range(n):
            sink += fb_breaker_acquire(b, -1)
        t2 = fb_monotonic_ns()
        for i in range(n):
            p = fb_breaker_acquire_ex(b, -1, &info)
            fb_breaker_release_ex(b, p, FB_SUCCESS, -1, &info)
        t3 = fb_monotonic_ns()
        for i in range(n):
            fb_budget_deposit(bb)
        t4 = fb_monotonic_ns()
        for i in range(n):
            sink += fb_budget_try_take(bb, 0)
        t5 = fb_monotonic_ns()
    return {
        "acquire+release": (t1 - t0) / <double>n,
        "acquire": (t2 - t1) / <double>n,
        "acquire_ex+release_ex": (t3 - t2) / <double>n,
        "budget_deposit": (t4 - t3) / <double>n,
        "budget_try_take": (t5 - t4) / <double>n,
        "sink": sink,
    }


# -- the stress hammers ----------------------------------------------------------------------------
cdef inline uint64_t rnd(uint64_t *s) noexcept nogil:
    # xorshift64*: a private generator per thread
    cdef uint64_t x = s[0]
    x ^= x >> 12
    x ^= x << 25
    x ^= x >> 27
    s[0] = x
    return x * <uint64_t>2685821657736338717


def hammer_breaker(breaker, uint64_t seed, int64_t end_ns, int fail_pct, int leak_pct,
                   int64_t[::1] claims, int64_t[::1] probes, int64_t[::1] samples):
    """Acquire and release through the C API until ``end_ns`` (CLOCK_MONOTONIC) or a log fills.

    Logs, for the checks done afterwards in Python:
      claims:  (gen, old, new, now) of every state change this thread made;
      probes:  the permit (its generation) of every half-open probe this thread was admitted;
      samples: (gen, since_ns) read (acquire, then relaxed, as the core's readers do) when a
               rejected call found the breaker OPEN.
    Probe outcomes are success or failure only (never neutral); ``leak_pct`` percent of probes
    are never reported back (the probe timeout must reclaim them).
    """
    cdef fb_breaker_t *b = fb_breaker_handle(breaker)
    cdef raw_breaker_t *raw = <raw_breaker_t *>b
    cdef uint64_t rs = seed * <uint64_t>0x9E3779B97F4A7C15 + 1
    cdef Py_ssize_t cap_claims = claims.shape[0] // 4, cap_probes = probes.shape[0]
    cdef Py_ssize_t cap_samples = samples.shape[0] // 2
    cdef Py_ssize_t n_claims = 0, n_probes = 0, n_samples = 0
    cdef int64_t ops = 0, admitted = 0, rejected = 0, released = 0, leaked = 0, odd = 0
    cdef int64_t now, permit, w, since
    cdef int info, r, outcome, spin, k
    cdef uint64_t x
    cdef bint full = False
    with nogil:
        while True:
            now = fb_monotonic_ns()
            if now >= end_ns:
                break
            if n_claims + 2 > cap_claims or n_probes + 1 > cap_probes or n_samples + 1 > cap_samples:
                full = True
                break
            ops += 1
            permit = fb_breaker_acquire_ex(b, now, &info)
            if fb_info_changed(info):
                claims[4 * n_claims] = fb_info_gen(info)
                claims[4 * n_claims + 1] = fb_info_old(info)
                claims[4 * n_claims + 2] = fb_info_new(info)
                claims[4 * n_claims + 3] = now
                n_claims += 1
            if permit < 0:
                if permit != FB_REJECTED:
                    odd += 1
                rejected += 1
                if (rnd(&rs) & 1023) == 0:
                    w = fb_load_acq(&raw.s.word)
                    since = fb_load_rlx(&raw.s.since_ns)
                    if (w & (ST_MASK | BUSY)) == S_OPEN:
                        samples[2 * n_samples] = (w >> GEN_SHIFT) & GEN_MASK
                        samples[2 * n_samples + 1] = since
                        n_samples += 1
                continue
            admitted += 1
            x = rnd(&rs)
            if fb_info_probe(info):
                probes[n_probes] = permit
                n_probes += 1
                if <int>(x % 100) < leak_pct:
                    leaked += 1
                    continue
                outcome = FB_FAILURE if <int>((x >> 8) % 100) < 50 else FB_SUCCESS
            else:
                k = <int>((x >> 8) % 100)
                if k < fail_pct:
                    outcome = FB_FAILURE
                elif k < fail_pct + 5:
                    outcome = FB_SLOW
                elif k < fail_pct + 10:
                    outcome = FB_NEUTRAL
                else:
                    outcome = FB_SUCCESS
            # a little "work" so that calls overlap
            spin = <int>((x >> 24) & 63)
            while spin > 0:
                spin -= 1
                fb_load_rlx(&raw.s.word)
            now = fb_monotonic_ns()
            r = fb_breaker_release_ex(b, permit, outcome, now, &info)
            released += 1
            if r != 0:
                odd += 1
            if fb_info_changed(info):
                claims[4 * n_claims] = fb_info_gen(info)
                claims[4 * n_claims + 1] = fb_info_old(info)
                claims[4 * n_claims + 2] = fb_info_new(info)
                claims[4 * n_claims + 3] = now
                n_claims += 1
    return dict(ops=ops, admitted=admitted, rejected=rejected, released=released, leaked=leaked,
                odd=odd, full=full, n_claims=n_claims, n_probes=n_probes, n_samples=n_samples)


def hammer_counts(breaker, int64_t n):
    """``n`` CLOSED admissions, each reported a success, through the C API (GIL released).
    Returns how many were admitted."""
    cdef fb_breaker_t *b = fb_breaker_handle(breaker)
    cdef int64_t i, permit, admitted = 0
    with nogil:
        for i in range(n):
            permit = fb_breaker_acquire_closed(b)
            if permit >= 0:
                admitted += 1
                fb_breaker_release(b, permit, FB_SUCCESS, -1)
    return admitted


def hammer_budget(RetryBudget budget, int64_t iters, int64_t now0, int64_t step):
    """``iters`` rounds of take, take, deposit at times now0, now0 + step, ... (GIL released).
    Returns (tokens taken, take calls, deposits)."""
    cdef fb_budget_t *b = &budget.state
    cdef int64_t i, taken = 0, now
    with nogil:
        for i in range(iters):
            now = now0 + i * step
            taken += fb_budget_try_take(b, now)
            taken += fb_budget_try_take(b, now)
            fb_budget_deposit(b)
    return taken, 2 * iters, iters


def plain_increments(int64_t[::1] counter, int64_t n):
    """A deliberate data race (plain, non-atomic read-modify-write from every calling thread):
    the ThreadSanitizer run (.ci/tsan.sh) checks that TSan reports it, i.e. that it is live."""
    cdef int64_t i
    with nogil:
        for i in range(n):
            counter[0] += 1


def hammer_window(breaker, int64_t first_ns, int64_t width_ns, int64_t epochs, int64_t per_epoch):
    """Record ``per_epoch`` successes at each of ``epochs`` consecutive bucket times from
    ``first_ns`` (the time window's buckets: every thread hits the same bucket, and the first
    writer of each epoch resets it). Returns the number of outcomes reported."""
    cdef fb_breaker_t *b = fb_breaker_handle(breaker)
    cdef int64_t e, j, now, permit, released = 0
    with nogil:
        for e in range(epochs):
            now = first_ns + e * width_ns
            for j in range(per_epoch):
                permit = fb_breaker_acquire(b, now)
                if permit >= 0 and fb_breaker_release(b, permit, FB_SUCCESS, now) == 0:
                    released += 1
    return released
