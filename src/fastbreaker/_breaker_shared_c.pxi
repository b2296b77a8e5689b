# A breaker in shared memory (SharedRegion), included by _breaker_c.pyx: the claims that let
# another process take over a transition whose claimer died, and the region blocks a shared
# breaker and a shared group live in. The twin's counterpart is _breaker_shared_py.py.

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
