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

Shared-memory mode (``SharedRegion``, ``CircuitBreaker._shared``): the breaker's whole mutable
state lives in a ``SharedRecord`` of the region, and ``self._lock`` is a ``_SharedState``: entering
it takes the region's record lock (threads and processes) and loads every state field from the
record into the attributes; leaving it packs them back (a double-buffered store, skipped when
nothing changed) and releases. The code between is the same as for a local breaker, so every read
or write of mutable state happens inside ``with self._lock:``. When another process holds the
record lock past its bound (``_region.LOCK_TIMEOUT``, stopped), the block runs on the record last
stored, and stores nothing: ``_stalled_now()`` is then true, and the state machine admits only
in CLOSED, makes no transition (``_enter`` raises ``SharedStateTimeout``) and drops outcomes.
The config (options, listeners, classification, clock) stays per process. The record (``_BreakerLayout``, little-endian)::

    27 int64        state, gen, inflight, probe_ok, level, since_ns, consec, head, rec, fail,
                    slow, last, permitted, rejected, successes, failures, slow_calls, ignored,
                    stale, opened, fleet_gen, would_reject, open_ns, open_from, probe_ok_total,
                    probe_failed, timeouts
    window bytes    the count window's ring (window > 0 only)
    4 uint32 each   the time window's buckets: tag, recorded, failed, slow (window_seconds only)
    int64 each      the latency histogram: a count per bound, the overflow count, the sum in ns
                    (slow_call_duration or record_latency only)
"""

from __future__ import annotations

import bisect
import itertools
import math
import os
import struct
import threading
import time
import weakref
from contextlib import AbstractContextManager
from fractions import Fraction
from time import monotonic_ns as _monotonic_ns
from typing import (
    Any,
    Awaitable,
    Callable,
    Coroutine,
    Optional,
    ParamSpec,
    Protocol,
    TypeVar,
    final,
)

from . import _calls
from ._durations import read_clock
from ._errors import (
    CircuitOpenError,
    SharedStateTimeout,
    State,
    is_uninitialised,
    label_name,
    not_copyable,
    uninitialised,
)
from ._keywords import checks_keywords
from ._metrics import Latency, Metrics
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

T = TypeVar("T")
P = ParamSpec("P")
F = TypeVar("F", bound=Callable[..., Any])

CLOSED, OPEN, HALF_OPEN, ISOLATED = State.CLOSED, State.OPEN, State.HALF_OPEN, State.ISOLATED
_MAX_LEVEL = 40  # backoff doublings beyond this are capped anyway
_TAG_MASK = (1 << 22) - 1  # a bucket's tag: its epoch modulo 2**22
_listener_lock = threading.Lock()
_STATES = (CLOSED, OPEN, HALF_OPEN, ISOLATED)  # by int value


# -- shared-memory mode (SharedRegion) -----------------------------------------------------------
class _Layout(Protocol):
    """How one kind of twin object packs its mutable state into a fixed-size record."""

    @property
    def size(self) -> int: ...

    def load(self, owner: Any, data: bytes) -> None: ...

    def pack(self, owner: Any) -> bytes: ...


class _SharedState:
    """The ``_lock`` of a twin object whose state lives in a ``SharedRegion``.

    ``with obj._lock:`` takes the region's ``RecordLock`` (a thread lock plus an ``fcntl``
    record lock that the kernel drops when its process dies), then loads the object's state
    fields from its ``SharedRecord``; leaving packs them back (``SharedRecord.store`` writes the
    copy not in use, then flips the selector, so a process killed halfway leaves the previous
    state whole) unless nothing changed, then releases. Used by the breaker, the retry budget
    and the bulkhead twins; not re-entrant, like the ``threading.Lock`` it replaces. It holds
    its object weakly, so that dropping the object frees its view of the region.

    The record lock's wait is bounded (``_region.LOCK_TIMEOUT``): past it, ``SharedStateTimeout``
    (a block that raises it stores nothing). With ``fallback`` (the breaker), the block runs
    instead on the state last published, with only this process's threads locked out, and
    ``stalled`` set: what it changes is not stored (see CircuitBreaker._stalled_now).
    """

    __slots__ = ("_owner", "_lock", "_record", "_layout", "_loaded", "_fallback", "stalled")

    def __init__(
        self,
        owner: Any,
        view: memoryview,
        lock: AbstractContextManager[Any],
        layout: _Layout,
        fallback: bool = False,
    ) -> None:
        from ._region import SharedRecord

        self._owner = weakref.ref(owner)
        self._lock = lock
        self._record = SharedRecord(view, layout.size)
        self._layout = layout
        self._loaded = b""
        self._fallback = fallback
        self.stalled = False

    def __enter__(self) -> None:
        lock: Any = self._lock
        if self._fallback:
            # the RecordLock: False when another process holds it past the bound (stopped):
            # this thread then holds only the lock of this process's threads
            self.stalled = not lock.enter_or_stall()
        else:
            lock.__enter__()
        try:
            data = self._record.load()  # when stalled, the copy the selector names: whole
            try:
                self._layout.load(self._owner(), data)
            except (ValueError, IndexError, struct.error) as exc:
                raise self._corrupted(exc) from exc
        except BaseException:
            self._release()
            raise
        self._loaded = data

    def _corrupted(self, exc: Exception) -> RuntimeError:
        """The error for a record that no whole write can have left (memory written by
        something else): it names the region and the object."""
        from ._region import region_of

        owner = self._owner()
        label = getattr(owner, "_label", None) or getattr(owner, "_name", None)
        what = type(owner).__name__.lstrip("_") + (f" {label!r}" if label is not None else "")
        region = region_of(self._lock)
        return RuntimeError(
            f"the state of the shared {what} in the shared region {region!r} is corrupted "
            f"({exc}): something other than fastbreaker wrote to the segment. Recreate the "
            f"region: SharedRegion.unlink_name({region!r}) once no process uses it"
        )

    def __exit__(self, et: Any, *exc: object) -> None:
        try:
            if self.stalled or (et is not None and issubclass(et, SharedStateTimeout)):
                return  # nothing is stored: the record keeps the state last published
            data = self._layout.pack(self._owner())
            if data != self._loaded:
                self._record.store(data)
        finally:
            self._loaded = b""
            self._release()

    def _release(self) -> None:
        if self.stalled:
            self.stalled = False
            self._lock.leave_stalled()  # type: ignore[attr-defined]
        else:
            self._lock.__exit__(None, None, None)


def is_shared(obj: object) -> bool:
    """Whether a twin object's state lives in a SharedRegion."""
    return type(getattr(obj, "_lock", None)) is _SharedState


# A shared breaker's scalar fields, in their order in its record (after the state).
_FIELDS = (
    "_gen",
    "_inflight",
    "_probe_ok",
    "_level",
    "_since_ns",
    "_consec",
    "_head",
    "_rec",
    "_fail",
    "_slow",
    "_last",
    "_permitted",
    "_rejected",
    "_successes",
    "_failures",
    "_slow_calls",
    "_ignored",
    "_stale",
    "_opened",
    "_fleet_gen",
    "_would_reject",
    "_open_ns",
    "_open_from",
    "_probe_ok_total",
    "_probe_failed",
    "_timeouts",
)
_SCALARS = struct.Struct(f"<{1 + len(_FIELDS)}q")
# the fields that a whole record never holds below 0 (the times may be, with a user's clock)
_COUNTS = frozenset(_FIELDS) - {"_since_ns", "_last", "_open_from", "_fleet_gen", "_inflight"}


class _BreakerLayout:
    """A shared breaker's record (see the module docstring); its size follows the options."""

    __slots__ = ("size", "_window", "_buckets", "_lat", "_seen")

    def __init__(self, options: BreakerOptions) -> None:
        # the time window's buckets as this object last loaded or stored them: when the record
        # holds the same bytes, its lists already match (rebuilding 1000 buckets costs ~0.1 ms)
        self._seen: Optional[bytes] = None
        self._window = options.window
        nb = options.window_buckets if options.window_ns else 0
        self._buckets = struct.Struct(f"<{4 * nb}I") if nb else None
        nl = len(options.latency_bounds_ns) + 2 if options.timed else 0
        self._lat = struct.Struct(f"<{nl}q") if nl else None
        self.size = (
            _SCALARS.size
            + self._window
            + (self._buckets.size if self._buckets is not None else 0)
            + (self._lat.size if self._lat is not None else 0)
        )

    def load(self, b: "CircuitBreaker", data: bytes) -> None:
        state, *values = _SCALARS.unpack_from(data)
        if not 0 <= state < len(_STATES):
            raise ValueError(f"state {state} is not one of 0-{len(_STATES) - 1}")
        for field, value in zip(_FIELDS, values):
            if value < 0 and field in _COUNTS:
                raise ValueError(f"{field[1:]} is {value}, below 0")
            setattr(b, field, value)
        if self._window and max(b._rec, b._fail, b._slow) > self._window:
            raise ValueError(f"the window counts more outcomes than its {self._window} slots")
        b._state = _STATES[state]
        at = _SCALARS.size
        if self._window:
            b._ring = bytearray(memoryview(data)[at : at + self._window])
            at += self._window
        if self._buckets is not None:
            end = at + self._buckets.size
            raw = data[at:end]
            if raw != self._seen:
                flat = iter(self._buckets.unpack(raw))
                b._buckets = [list(t) for t in zip(flat, flat, flat, flat)]
                self._seen = raw
            at = end
        if self._lat is not None:
            lat = b._lat
            assert lat is not None
            lat[:] = self._lat.unpack_from(data, at)

    def pack(self, b: "CircuitBreaker") -> bytes:
        self._seen = None  # until packed: a failure below leaves the lists unstored
        parts: list[bytes | bytearray] = [
            _SCALARS.pack(int(b._state), *[getattr(b, field) for field in _FIELDS])
        ]
        if self._window:
            assert b._ring is not None
            parts.append(b._ring)
        if self._buckets is not None:
            assert b._buckets is not None
            raw = self._buckets.pack(*itertools.chain.from_iterable(b._buckets))
            parts.append(raw)
        if self._lat is not None:
            assert b._lat is not None
            parts.append(self._lat.pack(*b._lat))
        if self._buckets is not None:
            self._seen = raw
        return b"".join(parts)


def shared_size(options: BreakerOptions) -> int:
    """The bytes of a shared breaker's state block in a SharedRegion."""
    from ._region import SharedRecord

    return SharedRecord.footprint(_BreakerLayout(options).size)


def shared_init(view: memoryview, options: BreakerOptions) -> None:
    """Write a new shared breaker's state (CLOSED, generation 0, empty windows, zero counters)
    into ``view`` (zero-filled, ``shared_size(options)`` bytes; under the region's lock)."""
    from ._region import SharedRecord

    layout = _BreakerLayout(options)
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


class Group:
    """Shared by the breakers of one BreakerMap: how many are not CLOSED, and the trip bound."""

    __slots__ = ("open", "size", "suppressed", "_num", "_den", "_lock")

    def __init__(self, max_open_ratio: float) -> None:
        frac = Fraction(repr(float(max_open_ratio))).limit_denominator(1_000_000)
        self._num, self._den = frac.numerator, frac.denominator
        self.open = 0
        self.size = 0
        self.suppressed = 0
        self._lock = threading.Lock()

    @classmethod
    def _shared(cls, max_open_ratio: float, view: memoryview, lock: Any = None) -> "Group":
        """A group whose counts are the words ``view`` of a SharedRegion (a shared map's),
        laid out by ``shared_group_init``, changed under ``lock``."""
        return _SharedGroup(max_open_ratio, view, lock)

    def bound(self) -> int:
        """``max(1, floor(max_open_ratio * size))``, computed exactly."""
        return max(1, self.size * self._num // self._den)

    def try_reserve(self) -> bool:
        """Count one more non-CLOSED breaker if the bound allows it, else count a suppression."""
        with self._lock:
            if self.open + 1 > self.bound():
                self.suppressed += 1
                return False
            self.open += 1
            return True

    def add_open(self, delta: int) -> None:
        with self._lock:
            self.open += delta

    def add_size(self, delta: int) -> None:
        with self._lock:
            self.size += delta


class _SharedGroup(Group):
    """A shared map's Group: its counts are five int64 words of a SharedRegion (open, size,
    suppressed, and max_open_ratio as num/den), changed under the region's record lock."""

    __slots__ = ("_view", "_rlock")

    def __init__(self, max_open_ratio: float, view: memoryview, lock: Any) -> None:
        frac = Fraction(repr(float(max_open_ratio))).limit_denominator(1_000_000)
        self._view = view
        self._rlock = lock
        if _GROUP.unpack_from(view)[3:] != (frac.numerator, frac.denominator):
            raise ValueError("the shared group was made with another max_open_ratio")
        self._num, self._den = frac.numerator, frac.denominator

    def _words(self) -> tuple[int, ...]:
        return tuple(_GROUP.unpack_from(self._view))

    @property
    def open(self) -> int:  # type: ignore[override]
        return self._words()[0]

    @property
    def size(self) -> int:  # type: ignore[override]
        return self._words()[1]

    @property
    def suppressed(self) -> int:  # type: ignore[override]
        return self._words()[2]

    def _add(self, index: int, delta: int) -> None:
        at = 8 * index
        with self._rlock:
            struct.pack_into(
                "<q", self._view, at, struct.unpack_from("<q", self._view, at)[0] + delta
            )

    def bound(self) -> int:
        return max(1, self.size * self._num // self._den)

    def try_reserve(self) -> bool:
        with self._rlock:
            open_, size, suppressed = self._words()[:3]
            if open_ + 1 > max(1, size * self._num // self._den):
                struct.pack_into("<q", self._view, 16, suppressed + 1)
                return False
            struct.pack_into("<q", self._view, 0, open_ + 1)
            return True

    def add_open(self, delta: int) -> None:
        self._add(0, delta)

    def add_size(self, delta: int) -> None:
        self._add(1, delta)


_GROUP = struct.Struct("<5q")


def shared_group_size() -> int:
    """The bytes of a shared map's group (SharedRegion)."""
    return _GROUP.size


def shared_group_init(view: memoryview, max_open_ratio: float) -> None:
    frac = Fraction(repr(float(max_open_ratio))).limit_denominator(1_000_000)
    _GROUP.pack_into(view, 0, 0, 0, 0, frac.numerator, frac.denominator)


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
class CircuitBreaker:
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
        self._lock = _SharedState(self, view, lock, _BreakerLayout(config.options), True)
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
        """A shared map's eviction: if the breaker is CLOSED (and, unless allowed, carries no
        information and has no call in flight), reset its state to a fresh CLOSED breaker of the
        next generation (so permits still out are stale) and return its metrics from before;
        else None. Refused too when a call reached it between the snapshot and the reset.
        ``force``: reset it whatever its state (a slot left half-written by a killed writer)."""
        if not is_shared(self):
            raise TypeError("only a breaker in a SharedRegion is recycled")
        m = self.metrics()
        done = m.successes + m.failures + m.ignored + m.stale
        idle = m.consecutive_failures == 0 and not m.failure_rate and not m.slow_call_rate
        if not force and (m.state != CLOSED or (not in_flight_ok and m.permitted > done)):
            return None
        if not force and not info_ok and not idle:
            return None
        with self._lock:
            if self._stalled_now():
                return None
            seen = (
                self._state,
                self._permitted,
                self._rejected,
                self._successes + self._failures + self._ignored + self._stale,
            )
            if seen != (m.state, m.permitted, m.rejected, done):
                return None
            lock, gen = self._lock, self._gen
            self._setup(self._config, self._label)
            self._lock, self._gen = lock, gen + 1
        return m

    def _stalled_now(self) -> bool:
        """Under ``with self._lock``: whether another process holds the shared state past the
        bound, so that this block runs on the state last published and stores nothing (it
        makes no transition, admits no probe and drops outcomes)."""
        lock = self._lock
        return type(lock) is _SharedState and lock.stalled

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
        if _stall_fd >= 0 and type(self._lock) is _SharedState:
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

    # -- call paths ----------------------------------------------------------------------------
    def _admit(self) -> int:
        """Admit a call and announce the transition it made: the permit, or -1."""
        permit, trans = self._acquire()
        if trans is not None:
            try:
                self._fire(trans)
            except BaseException:
                # a callback raised a BaseException (KeyboardInterrupt): the caller never gets
                # the permit, so give it back, or the probe slot stays taken
                if permit >= 0:
                    self._finish(permit, OUT_NEUTRAL)
                raise
        return permit

    def _permit_or_raise(self) -> int:
        permit = self._admit()
        if permit < 0:
            raise self._open_error()
        return permit

    def _open_error(self) -> CircuitOpenError:
        with self._lock:
            state = self._state
        return CircuitOpenError(self.name, state, self.retry_after)

    def _finish(self, permit: int, outcome: int) -> None:
        self._fire(self._release(permit, outcome))

    def call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Call ``fn(*args, **kwargs)`` through the breaker; raise CircuitOpenError if rejected."""
        return _calls.call(self, fn, args, kwargs)

    def call_async(
        self, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs
    ) -> Coroutine[Any, Any, T]:
        """Await ``fn(*args, **kwargs)`` through the breaker."""
        return _calls.call_async(self, fn, args, kwargs)

    def __call__(self, fn: F) -> F:
        """``@breaker``: guard ``fn``, a sync or async function, generator or async generator
        (its signature is kept)."""
        return _calls.decorate(self, fn)  # type: ignore[no-any-return]

    def __enter__(self) -> "CircuitBreaker":
        _calls.enter(self)
        return self

    def __exit__(self, et: Any, exc: Any, tb: Any) -> None:
        _calls.exit(self, exc)

    async def __aenter__(self) -> "CircuitBreaker":
        _calls.enter(self)
        return self

    async def __aexit__(self, et: Any, exc: Any, tb: Any) -> None:
        _calls.exit(self, exc)

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

    def _now_or(self, default: int) -> int:
        """The clock, or ``default`` when a user clock fails (``metrics()`` never raises)."""
        try:
            return self._now()
        except Exception:
            return default

    def _observe(self, elapsed_ns: int) -> None:
        """Add a timed call's duration to the latency histogram (no-op when not timing)."""
        if self._lat is None:
            return
        i = bisect.bisect_left(self._config.options.latency_bounds_ns, elapsed_ns)
        with self._lock:
            lat = self._lat
            lat[i] += 1
            lat[-1] += elapsed_ns

    def _latency(self) -> Optional[Latency]:
        if self._lat is None:
            return None
        with self._lock:
            lat = self._lat
            counts = tuple(lat[:-1])
            total = lat[-1]
        return Latency(self._config.options.latency_bounds, counts, total / 1e9, sum(counts))

    def metrics(self) -> Metrics:
        """An immutable snapshot of the counters (with a time window or while OPEN, it reads
        the clock: a failing user clock leaves the current bucket and episode out)."""
        opts = self._config.options
        window = opts.window or opts.window_ns
        latency = self._latency()
        with self._lock:
            state, since = self._state, self._open_from
        now = self._now_or(-1) if state == OPEN or self._buckets is not None else 0
        with self._lock:
            closed = self._state == CLOSED
            if now < 0:
                now = self._last * opts.bucket_ns
                open_ns = self._open_ns
            else:
                open_ns = self._open_ns
                if self._state == OPEN and self._open_from == since:
                    open_ns += max(0, now - since)
            rec, fail, slow = self._window_sums(now)
            return Metrics(
                state=self._state,
                permitted=self._permitted,
                rejected=self._rejected,
                successes=self._successes,
                failures=self._failures,
                slow_calls=self._slow_calls,
                ignored=self._ignored,
                stale=self._stale,
                opened=self._opened,
                consecutive_failures=self._consec if closed else 0,
                failure_rate=(fail / rec if rec else 0.0) if window else None,
                slow_call_rate=(slow / rec if rec else 0.0) if window else None,
                recorded=rec if window else 0,
                would_reject=self._would_reject,
                open_seconds_total=open_ns / 1e9,
                probe_successes=self._probe_ok_total,
                probe_failures=self._probe_failed,
                timeouts=self._timeouts,
                latency=latency,
            )

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
        """The one entry point through which a fleet's state enters the breaker, fenced.

        Returns ``(applied, local_gen, state, successes, failures, rejected)`` as they are after
        the call: the breaker's local generation (the number of its transitions, the same
        number a permit carries), its state as an int (0 CLOSED, 1 OPEN, 2 HALF_OPEN,
        3 ISOLATED) and its cumulative counters (as in ``metrics()``), from which a coordinator
        computes outcome deltas.

        The fleet state ``state`` (0 CLOSED, 1 OPEN, 2 HALF_OPEN) of fleet generation
        ``fleet_gen`` is applied only if all of these hold, and otherwise nothing changes:

        * ``fleet_gen`` is greater than the last applied fleet generation (0 at first, so
          ``fleet_gen=0`` only reads): old news and duplicates are ignored, and the breaker's
          fleet generation only ever moves forward, until ``reset()`` sets it back to 0;
        * ``local_gen`` is negative or equals the current local generation: when the
          coordinator read the breaker at ``local_gen`` and a local transition happened since,
          the apply is stale, like the outcome of a call admitted before a transition, and
          never undoes the newer local transition;
        * the breaker is not ISOLATED (only ``reset()`` ends that).

        An applied fleet generation is recorded, then the state becomes:

        * CLOSED: like ``reset()`` when the breaker is not CLOSED (empty window, no backoff);
          nothing changes when it is;
        * OPEN: open until ``seconds`` from now on the breaker's own clock (``retry_after``
          becomes ``seconds``): a transition from CLOSED or HALF_OPEN (counted in ``opened``,
          announced to callbacks); when already OPEN only the end of the open period moves (no
          transition, no event); the backoff level is kept;
        * HALF_OPEN: a transition (announced unless already HALF_OPEN) to a HALF_OPEN
          generation in which at most ``probes`` (0 to ``half_open_max_calls``) probes are
          admitted: the other permits count as in flight for the whole generation.

        ``state`` outside 0..2, ``seconds`` not in [0, 1e8) or ``probes`` outside
        0..``half_open_max_calls`` raise ValueError.
        """
        opts = self._config.options
        if state not in (0, 1, 2):
            raise ValueError(f"state must be 0 (CLOSED), 1 (OPEN) or 2 (HALF_OPEN), got {state!r}")
        if not 0.0 <= seconds < 1e8:
            raise ValueError(f"seconds must be in [0, 1e8), got {seconds!r}")
        if not 0 <= probes <= opts.half_open_max_calls:
            raise ValueError(
                f"probes must be in 0..{opts.half_open_max_calls} (half_open_max_calls), "
                f"got {probes!r}"
            )
        with self._lock:
            newer = fleet_gen > self._fleet_gen
        now = self._now() if newer else 0
        trans = None
        applied = False
        with self._lock:
            if (
                fleet_gen > self._fleet_gen
                and (local_gen < 0 or local_gen == self._gen)
                and self._state != ISOLATED
                and not self._stalled_now()  # the next sync applies it
            ):
                applied = True
                self._fleet_gen = fleet_gen
                if state == 0:
                    if self._state != CLOSED:
                        self._level = 0
                        trans = self._enter(CLOSED, now)
                elif state == 1:
                    # the open period ends `seconds` from now: shift its start; the episode
                    # (open_seconds_total) still begins now, or when the breaker tripped
                    if self._state != OPEN:
                        trans = self._enter(OPEN, now)
                    self._since_ns = now + int(seconds * 1e9) - self._open_period_ns(self._level)
                else:
                    trans = self._enter(HALF_OPEN, now)
                    self._inflight = opts.half_open_max_calls - probes
            result = (
                applied,
                self._gen,
                int(self._state),
                self._successes,
                self._failures,
                self._rejected,
            )
        self._fire(trans)
        return result
