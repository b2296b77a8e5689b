# The breaker's state machine in C, included by _breaker_c.pyx (one module, one C file): the
# state word, transitions, admission, outcomes, the count and time windows, manual transitions,
# the C API of _breaker_c.pxd, and the Python-level steps that fire state changes.
# _breaker_py.py is the specification.

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
