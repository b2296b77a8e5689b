"""The pure-Python reference twin of the circuit breaker core: this file is the specification.

The compiled core (``_breaker_c.pyx``) implements the same state machine with C atomics; it must
be observably identical (a hypothesis test drives both with the same operations). Here one lock
guards the state; callbacks always run after it is released.

Generations: every transition bumps ``_gen``. A permit is the generation it was admitted in; its
outcome changes state only while that generation is still current, otherwise it is counted as
stale. Each generation has exactly one state, so the permit alone tells a probe (HALF_OPEN
generation) from a normal call (CLOSED generation).

The time window (``window_seconds``): ``window_buckets`` buckets of ``bucket_ns`` each. An
outcome recorded at time ``now`` belongs to epoch ``now // bucket_ns`` and to the bucket
``epoch % buckets``. A bucket holds its epoch's tag (the epoch modulo 2**22) and three
saturating counters (recorded, failed, slow), one 64-bit word in the compiled core. A writer
that finds an older tag resets the bucket to its own epoch (the compiled core: one CAS, after
raising ``_last``, the latest epoch any reset was made for); one that finds a newer epoch there
(its bucket rolled out of the window while it was on its way) drops its outcome as stale. There
is no running total: only a failure or a slow call, the outcomes that can trip, sums the buckets
whose tags are the epochs of the window, so a success costs one update of one bucket and an
outcome after a long quiet period costs O(buckets).

The call paths (``_breaker_calls_py``), the metrics (``_breaker_metrics_py``), shared memory
and the map's group (``_breaker_shared_py``) live beside this module.
"""

from __future__ import annotations

import bisect
import math
import os
import threading
import time
from contextlib import AbstractContextManager
from time import monotonic_ns as _monotonic_ns
from typing import (
    Any,
    Callable,
    Optional,
    final,
)

from . import _calls
from ._breaker_calls_py import CallPaths
from ._breaker_metrics_py import snapshot
from ._breaker_shared_py import (
    BreakerLayout,
    Group,
    SharedState,
    apply_fleet,
    recycle,
    shared_group_init as shared_group_init,  # for _region (a core's API)
    shared_group_size as shared_group_size,
)
from ._durations import read_clock
from ._errors import (
    SharedStateTimeout,
    State,
    is_uninitialised,
    label_name,
    not_copyable,
    uninitialised,
)
from ._keywords import checks_keywords
from ._metrics import Metrics
from ._options import (
    BUCKET_MAX,
    DRY_RUN_PERMIT,
    OUT_FAILURE,
    OUT_NEUTRAL,
    OUT_SLOW,
    OUT_SUCCESS,
    OUT_TIMEOUT,
    BreakerOptions,
    Duration,
    signature_of,
)

__all__ = ["CircuitBreaker", "Config", "Group", "Metrics"]


CLOSED, OPEN, HALF_OPEN, ISOLATED = State.CLOSED, State.OPEN, State.HALF_OPEN, State.ISOLATED
_MAX_LEVEL = 40  # backoff doublings beyond this are capped anyway
_TAG_MASK = (1 << 22) - 1  # a bucket's tag: its epoch modulo 2**22
_listener_lock = threading.Lock()
_STATES = (CLOSED, OPEN, HALF_OPEN, ISOLATED)  # by int value


def shared_size(options: BreakerOptions) -> int:
    """The bytes of a shared breaker's state block in a SharedRegion."""
    from ._region import SharedRecord

    return SharedRecord.footprint(BreakerLayout(options).size)


def shared_init(view: memoryview, options: BreakerOptions) -> None:
    """Write a new shared breaker's state (CLOSED, generation 0, empty windows, zero counters)
    into ``view`` (zero-filled, ``shared_size(options)`` bytes; under the region's lock)."""
    from ._region import SharedRecord

    layout = BreakerLayout(options)
    fresh = CircuitBreaker.__new__(CircuitBreaker)
    fresh._setup(Config(options), options.name)
    SharedRecord(view, layout.size).store(layout.pack(fresh))


_stall_fd = -1


def _test_stall_in_claim(fd: int) -> None:
    """Test hook: while ``fd >= 0``, the next state transition of a shared breaker (with the
    record lock held, its fields changed but not stored) writes b"x" to ``fd`` and blocks
    forever, so that a test can kill the process there. ``-1`` disables it."""
    global _stall_fd
    _stall_fd = int(fd)


def _stall() -> None:
    os.write(_stall_fd, b"x")
    while True:
        time.sleep(3600)


class Config:
    """Options plus what a BreakerMap shares with its breakers (group and state-change hook).

    ``listeners`` are the breaker's own callbacks: a breaker whose config is ``shared`` (by a
    BreakerMap) gets a private copy when its first callback is registered.
    """

    __slots__ = ("options", "group", "hook", "listeners", "shared", "retired", "region_view")

    def __init__(
        self,
        options: BreakerOptions,
        group: Optional[Group] = None,
        hook: Optional[Callable[[Any, State, State], None]] = None,
    ) -> None:
        self.options = options
        self.group = group
        self.hook = hook
        # Only ever appended to, never replaced (see the compiled core).
        self.listeners: list[Callable[..., Any]] = []
        self.shared = False
        # Configs this one replaced on some breaker. The twin needs no safe reclamation (Python
        # references keep a config alive while it is read); it keeps the same list as the
        # compiled core so that both hold the same objects.
        self.retired: list[Config] = []
        # A shared breaker's block in a SharedRegion (as in the compiled core): keeps the
        # region's mapping alive while a breaker or a copy of its config uses it.
        self.region_view: Optional[memoryview] = None

    def copy(self, *, keep_group: bool = True) -> "Config":
        """A private copy (same options, hook and listeners; the group only if ``keep_group``)."""
        other = Config(self.options, self.group if keep_group else None, self.hook)
        other.listeners = list(self.listeners)
        other.region_view = self.region_view
        return other

    def reconfigure(self, options: BreakerOptions) -> None:
        """Adopt new option values in place (compat: ``breaker.fail_max = n``).

        Only the thresholds and durations may change (``BreakerOptions.check_reconfigure``):
        the window size, the rates, the exception classification and the clock stay.
        """
        if self.shared:
            raise ValueError("a config shared by a BreakerMap cannot be reconfigured")
        if self.region_view is not None:
            raise ValueError(
                "a breaker in a SharedRegion cannot be reconfigured: its options are the "
                "region's, the same in every process"
            )
        self.options.check_reconfigure(options)
        self.options.update_from(options)


_NOT_INITIALISED = "this CircuitBreaker was never initialised (made with __new__ without __init__)"
# The slots every public path reads first (the lock, the config, the state, the label).
_GUARDED = ("_config", "_lock", "_state", "_label")


@final
@checks_keywords
@checks_keywords
class CircuitBreaker(CallPaths):
    """A circuit breaker: lock-free in the compiled core, this twin guards its state with a lock.

    ``allow()``/``record_*()`` are the raw API; ``call``, ``call_async``, the decorator and
    ``with``/``async with`` manage permits themselves (outcomes of calls admitted before the
    latest transition are stale). The documentation's "Semantics" page states every rule.
    Durations are float seconds or ``datetime.timedelta``.

    Args:
        failure_threshold: consecutive failures that trip a breaker in consecutive mode
            (``window=0``), an int >= 1.
        reset_timeout: the open period, in seconds, before a probe is let through.
        window: 0 for consecutive mode, else the size of a ring of the last ``window`` outcomes
            that trips on rates (exclusive with ``window_seconds``).
        min_calls: outcomes a window must hold before it can trip (at most ``window``).
        failure_rate: the failed share of a window that trips it, in (0, 1].
        slow_call_duration: a success that took at least this long is slow (None: no timing).
        slow_call_rate: the slow share of a window that trips it, in (0, 1].
        half_open_max_calls: probes admitted at once in HALF_OPEN.
        success_threshold: probe successes that close the breaker.
        max_reset_timeout: when set, the open period doubles on each re-trip up to this.
        probe_timeout: after this long without a probe admitted, outstanding probes count as
            failed (default ``reset_timeout``, at least 1 s).
        failure_on: exception types that are failures, or a predicate ``exc -> bool``.
        ignore: exception types that are neutral (neither success nor failure).
        name: the breaker's name, shown in errors and metrics labels.
        clock: a zero-argument callable returning monotonic int nanoseconds (tests:
            ``fastbreaker.testing.FakeClock``); default the C ``CLOCK_MONOTONIC``.
        window_seconds: a time window of this many seconds (exclusive with ``window``).
        window_buckets: the buckets of the time window (each ``window_seconds / buckets``).
        dry_run: count and transition as usual but never reject (``would_reject`` counts).
        record_latency: time the calls of the call paths into a latency histogram.
        latency_buckets: the histogram's upper bounds in seconds (None: Prometheus's defaults).
    """

    __slots__ = (
        "_config",
        "_label",
        "_lock",
        "_binding",
        "_state",
        "_gen",
        "_inflight",
        "_probe_ok",
        "_level",
        "_since_ns",
        "_consec",
        "_ring",
        "_head",
        "_rec",
        "_fail",
        "_slow",
        "_permitted",
        "_rejected",
        "_successes",
        "_failures",
        "_slow_calls",
        "_ignored",
        "_stale",
        "_opened",
        "_fleet_gen",
        "_buckets",
        "_last",
        "_would_reject",
        "_open_ns",
        "_open_from",
        "_probe_ok_total",
        "_probe_failed",
        "_timeouts",
        "_lat",
        "__weakref__",
    )

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # The compiled class is final; the twin behaves the same.
        raise TypeError("CircuitBreaker cannot be subclassed: wrap it or register callbacks")

    def __new__(cls, *args: Any, **kwargs: Any) -> "CircuitBreaker":
        # Until __init__ (or _from_config) runs, what every path touches first fails clearly.
        self = object.__new__(cls)
        uninitialised(self, _GUARDED, _NOT_INITIALISED)
        return self

    def __copy__(self) -> Any:
        raise not_copyable(self)

    def __deepcopy__(self, memo: Any) -> Any:
        raise not_copyable(self)

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise not_copyable(self)

    @signature_of(BreakerOptions.__init__)
    def __init__(self, *args: Any, **options: Any) -> None:
        """Every option is documented, validated and spelled out once: ``BreakerOptions``."""
        if not is_uninitialised(self._config):
            raise RuntimeError("CircuitBreaker.__init__ called twice: create a new breaker")
        validated = BreakerOptions(*args, **options)
        self._setup(Config(validated), validated.name)

    @classmethod
    def _from_config(cls, config: Config, label: object) -> "CircuitBreaker":
        """A breaker sharing ``config`` (BreakerMap); ``name`` is ``str(label)``."""
        if not isinstance(config, Config):
            raise TypeError(f"config must be a Config, got {config!r}")
        self = cls.__new__(cls)
        self._setup(config, label)
        return self

    @classmethod
    def _shared(
        cls,
        config: Config,
        label: str,
        view: memoryview,
        lock: AbstractContextManager[Any],
    ) -> "CircuitBreaker":
        """A breaker whose mutable state lives in ``view`` (a SharedRegion's state block, made
        by ``shared_init`` with the same options), guarded by the region's ``lock``."""
        if not isinstance(config, Config):
            raise TypeError(f"config must be a Config, got {config!r}")
        config.region_view = view
        self = cls.__new__(cls)
        self._setup(config, label)
        self._lock = SharedState(self, view, lock, BreakerLayout(config.options), True)
        return self

    def _setup(self, config: Config, label: object) -> None:
        self._config = config
        self._label = label
        self._lock: AbstractContextManager[Any] = threading.Lock()
        self._state = CLOSED
        self._gen = 0
        self._inflight = 0
        self._probe_ok = 0
        self._level = 0
        self._since_ns = 0
        self._consec = 0
        opts = config.options
        n = opts.window
        self._ring = bytearray(n) if n else None
        self._head = self._rec = self._fail = self._slow = 0
        # time window: per bucket [tag, recorded, failed, slow]
        self._buckets = (
            [[0, 0, 0, 0] for _ in range(opts.window_buckets)] if opts.window_ns else None
        )
        self._last = 0
        self._permitted = self._rejected = self._successes = self._failures = 0
        self._slow_calls = self._ignored = self._stale = self._opened = 0
        self._fleet_gen = 0
        self._would_reject = self._open_ns = self._probe_ok_total = self._probe_failed = 0
        self._open_from = 0  # OPEN: when the episode began (_since_ns minus a fleet's shift)
        self._timeouts = 0
        # latency histogram: a count per bound, the overflow count, then the sum in ns
        self._lat = [0] * (len(opts.latency_bounds_ns) + 2) if opts.timed else None

    def _recycle(self, info_ok: bool, in_flight_ok: bool, force: bool = False) -> Optional[Metrics]:
        """A shared map's eviction (see ``_breaker_shared_py.recycle``)."""
        return recycle(self, info_ok, in_flight_ok, force)

    def _stalled_now(self) -> bool:
        """Under ``with self._lock``: whether another process holds the shared state past the
        bound, so that this block runs on the state last published and stores nothing (it
        makes no transition, admits no probe and drops outcomes)."""
        lock = self._lock
        return type(lock) is SharedState and lock.stalled

    def _bind(self, slot: int, tag: int) -> None:
        """A shared map's breaker: the slot of the map's table it was bound to, and that slot's
        tag then (``_bound()`` reads them)."""
        self._binding = (slot, tag)

    def _bound(self) -> tuple[int, int]:
        return self._binding

    # -- time -------------------------------------------------------------------------------
    def _now(self) -> int:
        clock = self._config.options.clock
        return read_clock(clock) if clock is not None else _monotonic_ns()

    def _open_period_ns(self, level: int) -> int:
        opts = self._config.options
        if not opts.max_reset_ns:
            return opts.reset_ns
        return min(opts.max_reset_ns, opts.reset_ns << min(level, _MAX_LEVEL))

    # -- transitions (called with the lock held; return the transition to report) ----------
    def _enter(self, new: State, now: int = 0, reserved: bool = False) -> tuple[State, State]:
        """Make the transition; ``reserved``: the group already counts it (``_auto_trip``)."""
        if self._stalled_now():
            raise SharedStateTimeout(
                f"a transition of the shared breaker {self.name!r}: another process has held "
                "its lock past the bound (it is stopped or stuck); nothing changed"
            )
        old = self._state
        group = self._config.group
        if group is not None and not reserved and (old == CLOSED) != (new == CLOSED):
            group.add_open(1 if old == CLOSED else -1)
        if old == OPEN:
            self._open_ns += max(0, now - self._open_from)
        self._state = new
        self._gen += 1
        self._inflight = self._probe_ok = 0
        if new == OPEN:
            self._since_ns = self._open_from = now
            self._opened += 1
        elif new == HALF_OPEN:
            self._since_ns = now
        elif new == CLOSED:
            self._consec = 0
            self._clear_window()
        if _stall_fd >= 0 and type(self._lock) is SharedState:
            _stall()  # the test hook: killed here, the record still holds the state before
        return old, new

    def _clear_window(self) -> None:
        if self._ring is not None:
            self._ring = bytearray(len(self._ring))
        self._head = self._rec = self._fail = self._slow = 0
        if self._buckets is not None:
            for bucket in self._buckets:
                bucket[:] = (0, 0, 0, 0)
            self._last = 0

    # -- the time window (see the module docstring) --------------------------------------------
    def _bucket_add(self, now: int, failed: bool, slow: bool) -> bool:
        """Count one outcome in the bucket of ``now``; False if that bucket rolled out."""
        buckets = self._buckets
        assert buckets is not None
        epoch = now // self._config.options.bucket_ns
        tag = epoch & _TAG_MASK
        bucket = buckets[epoch % len(buckets)]
        if bucket[0] != tag:
            if self._last > epoch and (bucket[0] - tag) & _TAG_MASK < (_TAG_MASK >> 1):
                return False  # the bucket holds a later epoch: this outcome's rolled out
            self._last = max(self._last, epoch)
            bucket[:] = (tag, 0, 0, 0)
        if bucket[1] < BUCKET_MAX:  # saturated: the bucket keeps its first BUCKET_MAX outcomes
            bucket[1] += 1
            bucket[2] += failed
            bucket[3] += slow
        return True

    def _window_sums(self, now: int) -> tuple[int, int, int]:
        """(recorded, failed, slow) over the buckets of the window that ends at ``now``."""
        if self._buckets is None:
            return self._rec, self._fail, self._slow
        buckets = self._buckets
        n = len(buckets)
        epoch = now // self._config.options.bucket_ns
        rec = fail = slow = 0
        for i, bucket in enumerate(buckets):
            if bucket[0] == (epoch - (epoch - i) % n) & _TAG_MASK:
                rec += bucket[1]
                fail += bucket[2]
                slow += bucket[3]
        return rec, fail, slow

    def _reopen(self, now: int) -> tuple[State, State]:
        """HALF_OPEN -> OPEN: a probe failed or leaked; the open period backs off."""
        self._level = min(self._level + 1, _MAX_LEVEL)
        return self._enter(OPEN, now)

    # -- the state machine -------------------------------------------------------------------
    def _acquire(self) -> tuple[int, Optional[tuple[State, State]]]:
        """Admit a call: its permit (>= 0), or -1 when rejected; and the transition made."""
        trans = None
        with self._lock:
            state = self._state
            if state == CLOSED:
                self._permitted += 1
                return self._gen, None
            permit = -1
            if self._stalled_now():
                pass  # another process holds the state, stalled: no transition, no probe
            elif state == OPEN:
                now = self._now()
                if now - self._since_ns >= self._open_period_ns(self._level):
                    trans = self._enter(HALF_OPEN, now)
                    self._inflight = 1
                    permit = self._gen
            elif state == HALF_OPEN:
                opts = self._config.options
                now = self._now()
                if self._inflight and now - self._since_ns >= opts.probe_timeout_ns:
                    trans = self._reopen(now)  # every outstanding probe counts as failed
                elif self._inflight < opts.half_open_max_calls:
                    self._inflight += 1
                    self._since_ns = max(self._since_ns, now)
                    permit = self._gen
            if permit < 0 and self._config.options.dry_run:
                # admitted anyway: a permit of no generation, so its outcome is stale
                permit = DRY_RUN_PERMIT
                self._would_reject += 1
            if permit >= 0:
                self._permitted += 1
            else:
                self._rejected += 1
            return permit, trans

    def _release(
        self, permit: int, outcome: int, raw: bool = False
    ) -> Optional[tuple[State, State]]:
        """Record the outcome of the call admitted with ``permit`` (see module docstring)."""
        # The clock is read before anything is recorded when the outcome may need the time (it
        # can trip or re-open), so that a clock that raises or returns garbage loses nothing: a
        # raw record_*() records nothing and raises; a call path's permit is given back as
        # neutral (a probe slot must not stay taken), then the clock's error propagates.
        now = 0
        windowed = self._ring is not None or self._buckets is not None
        if outcome != OUT_NEUTRAL and (outcome != OUT_SUCCESS or windowed):
            try:
                now = self._now()
            except BaseException:
                if not raw:
                    self._fire(self._release(permit, OUT_NEUTRAL))
                raise
        try:
            with self._lock:
                if self._stalled_now():
                    return None  # dropped: another process holds the state, stalled
                return self._release_locked(permit, outcome, now)
        except SharedStateTimeout:
            return None  # the group's lock is stalled: dropped, nothing stored

    def _release_locked(self, permit: int, outcome: int, now: int) -> Optional[tuple[State, State]]:
        if permit != self._gen or self._state not in (CLOSED, HALF_OPEN):
            self._stale += 1
            return None
        if self._state == HALF_OPEN:
            if self._inflight == 0:
                self._stale += 1
                return None
            return self._release_probe(outcome, now)
        return self._release_closed(outcome, now)

    def _release_probe(self, outcome: int, now: int) -> Optional[tuple[State, State]]:
        opts = self._config.options
        if outcome == OUT_NEUTRAL:
            self._ignored += 1
            self._inflight -= 1
            return None
        if outcome == OUT_FAILURE or outcome == OUT_TIMEOUT:
            self._failures += 1
            self._timeouts += outcome == OUT_TIMEOUT
            self._probe_failed += 1
            return self._reopen(now)
        self._successes += 1
        if outcome == OUT_SLOW:
            self._slow_calls += 1
            self._probe_failed += 1
            return self._reopen(now)
        self._probe_ok_total += 1
        if self._probe_ok + 1 >= opts.success_threshold:
            self._level = 0
            return self._enter(CLOSED)
        self._probe_ok += 1
        self._inflight -= 1
        return None

    def _release_closed(self, outcome: int, now: int) -> Optional[tuple[State, State]]:
        opts = self._config.options
        if outcome == OUT_NEUTRAL:
            self._ignored += 1
            return None
        failed = outcome == OUT_FAILURE or outcome == OUT_TIMEOUT
        if self._buckets is not None and not self._bucket_add(now, failed, outcome == OUT_SLOW):
            self._stale += 1
            return None
        if failed:
            self._failures += 1
            self._timeouts += outcome == OUT_TIMEOUT
        else:
            self._successes += 1
            if outcome == OUT_SLOW:
                self._slow_calls += 1
        if self._buckets is not None:
            self._consec = self._consec + 1 if failed else 0
            if not failed and outcome != OUT_SLOW:
                return None  # a success never trips the time window
            rec, fail, slow = self._window_sums(now)
            if rec >= opts.min_calls and (
                fail / rec >= opts.failure_rate or (opts.slow_ns and slow / rec >= opts.slow_rate)
            ):
                return self._auto_trip(now)
            return None
        if self._ring is None:
            # consecutive mode: a slow call counts as a failure
            if failed or outcome == OUT_SLOW:
                self._consec += 1
                if self._consec >= opts.failure_threshold:
                    return self._auto_trip(now)
            else:
                self._consec = 0
            return None
        self._consec = self._consec + 1 if failed else 0
        ring = self._ring
        idx = self._head % len(ring)
        self._head += 1
        old = ring[idx]
        new = 1 | (2 if failed else 0) | (4 if outcome == OUT_SLOW else 0)
        ring[idx] = new
        if old & 1:
            self._fail -= (old >> 1) & 1
            self._slow -= (old >> 2) & 1
        else:
            self._rec += 1
        self._fail += failed
        self._slow += outcome == OUT_SLOW
        if self._rec >= opts.min_calls and (
            self._fail / self._rec >= opts.failure_rate
            or (opts.slow_ns and self._slow / self._rec >= opts.slow_rate)
        ):
            return self._auto_trip(now)
        return None

    def _auto_trip(self, now: int) -> Optional[tuple[State, State]]:
        group = self._config.group
        if group is not None and not group.try_reserve():
            return None  # suppressed: stays CLOSED, its failures stay recorded
        # The reservation is the count of this breaker: releasing it and letting _enter count
        # again would open a window in which another breaker takes the same place.
        return self._enter(OPEN, now, reserved=group is not None)

    def _fire(self, trans: Optional[tuple[State, State]]) -> None:
        if trans is not None and trans[0] != trans[1]:
            config = self._config
            _calls.fire(self, tuple(config.listeners), config.hook, trans[0], trans[1])

    # -- raw API -----------------------------------------------------------------------------
    def allow(self) -> bool:
        """Admit one call (True) or reject it (False); the caller reports its outcome."""
        return self._admit() >= 0

    def _raw_permit(self) -> int:
        # Raw outcomes belong to the current generation when it can take them: CLOSED, or
        # HALF_OPEN with a probe outstanding (the README, "Generations").
        with self._lock:
            if self._state == CLOSED or (self._state == HALF_OPEN and self._inflight):
                return self._gen
            return -1

    def record_success(self, elapsed: Optional[Duration] = None) -> None:
        """Report a success; ``elapsed`` seconds (or timedelta) make it slow when over the limit."""
        self._fire(
            self._release(self._raw_permit(), _calls.success_outcome(self, elapsed), raw=True)
        )

    def record_failure(self) -> None:
        """Report a failure of a call admitted by ``allow()``."""
        self._fire(self._release(self._raw_permit(), OUT_FAILURE, raw=True))

    # -- manual control ------------------------------------------------------------------------
    def trip(self) -> None:
        """Force OPEN now (a fresh open period; lazy recovery follows). No effect when ISOLATED."""
        now = self._now()
        with self._lock:
            trans = None if self._state == ISOLATED else self._enter(OPEN, now)
        self._fire(trans)

    def isolate(self) -> None:
        """Reject every call until ``reset()``."""
        with self._lock:
            was_open = self._state == OPEN
        now = self._now() if was_open else 0  # the end of an OPEN episode
        with self._lock:
            trans = self._enter(ISOLATED, now)
        self._fire(trans)

    def reset(self) -> None:
        """Back to CLOSED with an empty window, no consecutive failures and no backoff."""
        with self._lock:
            was_open = self._state == OPEN
        now = self._now() if was_open else 0
        with self._lock:
            self._level = 0
            self._fleet_gen = 0  # a fleet fence pushed far ahead must not outlive a reset
            trans = self._enter(CLOSED, now)
        self._fire(trans)

    # -- inspection ------------------------------------------------------------------------------
    @property
    def state(self) -> State:
        """The stored state (reading it never makes a transition)."""
        with self._lock:  # an uninitialised breaker's placeholder lock raises here
            state = self._state
        if type(state) is not State:  # made with __new__: the placeholder
            raise RuntimeError(_NOT_INITIALISED)
        return state

    @property
    def name(self) -> Optional[str]:
        """The breaker's name (a map's key as ``str``), or None."""
        label = self._label
        if is_uninitialised(label):
            raise RuntimeError(_NOT_INITIALISED)
        return label_name(label)

    @property
    def retry_after(self) -> float:
        """Seconds until a probe may pass: OPEN, the rest of the open period; ISOLATED, inf."""
        with self._lock:
            state, since, level = self._state, self._since_ns, self._level
        if state == ISOLATED:
            return math.inf
        if state != OPEN:
            return 0.0
        left = since + self._open_period_ns(level) - self._now()
        return max(0, left) / 1e9

    def _observe(self, elapsed_ns: int) -> None:
        """Add a timed call's duration to the latency histogram (no-op when not timing)."""
        if self._lat is None:
            return
        i = bisect.bisect_left(self._config.options.latency_bounds_ns, elapsed_ns)
        with self._lock:
            lat = self._lat
            lat[i] += 1
            lat[-1] += elapsed_ns

    def metrics(self) -> Metrics:
        """An immutable snapshot of the counters (with a time window or while OPEN, it reads
        the clock: a failing user clock leaves the current bucket and episode out)."""
        return snapshot(self)

    def on_state_change(self, callback: Callable[[Any, State, State], Any]) -> Callable[..., Any]:
        """Register ``callback(breaker, old_state, new_state)``; returns it (decorator-friendly)."""
        if not callable(callback):
            raise TypeError(f"callback must be callable, got {callback!r}")
        with _listener_lock:
            config = self._config
            if config.shared:
                config = config.copy()
                self._set_config(config)
            config.listeners.append(callback)
        return callback

    def _swap_config_if_closed(self, config: Config, in_flight_ok: bool = True) -> bool:
        """Swap in ``config`` only while CLOSED (and, unless ``in_flight_ok``, with no more
        permits than outcomes), with no transition or admission in between (a BreakerMap
        dropping a breaker). Returns whether it swapped."""
        with self._lock:
            if self._state != CLOSED:
                return False
            if not in_flight_ok and self._permitted > (
                self._successes + self._failures + self._ignored + self._stale
            ):
                return False
            self._set_config(config)
            return True

    def _set_config(self, config: Config) -> None:
        """Swap in another Config (BreakerMap: private listeners, detaching an evicted breaker)."""
        if not isinstance(config, Config):
            raise TypeError(f"config must be a Config, got {config!r}")
        new, old = config.options, self._config.options
        if (new.window, new.window_ns, new.window_buckets, new.timed, new.latency_bounds) != (
            old.window,
            old.window_ns,
            old.window_buckets,
            old.timed,
            old.latency_bounds,
        ):
            raise ValueError("a breaker's window size and latency histogram cannot change")
        if config is not self._config and not any(r is self._config for r in config.retired):
            config.retired.append(self._config)
        self._config = config

    def __repr__(self) -> str:
        if is_uninitialised(self._config):
            return "<CircuitBreaker (not initialised)>"
        return f"<CircuitBreaker name={self.name!r} state={self.state.name}>"

    # -- fleet coordination (fastbreaker.contrib.redis) -------------------------------------------
    def _fleet(
        self, fleet_gen: int, local_gen: int, state: int, seconds: float, probes: int
    ) -> tuple[bool, int, int, int, int, int]:
        """The one entry point through which a fleet's state enters the breaker, fenced (see
        ``_breaker_shared_py.apply_fleet``)."""
        return apply_fleet(self, fleet_gen, local_gen, state, seconds, probes)
