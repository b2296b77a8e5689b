"""The twin breaker in shared memory (the counterpart of ``_breaker_shared_c.pxi``) and the
group a map's breakers share.

Shared-memory mode (``SharedRegion``, ``CircuitBreaker._shared``): the breaker's whole mutable
state lives in a ``SharedRecord`` of the region, and ``self._lock`` is a ``SharedState``: entering
it takes the region's record lock (threads and processes) and loads every state field from the
record into the attributes; leaving it packs them back (a double-buffered store, skipped when
nothing changed) and releases. The code between is the same as for a local breaker, so every read
or write of mutable state happens inside ``with self._lock:``. When another process holds the
record lock past its bound (``_region.LOCK_TIMEOUT``, stopped), the block runs on the record last
stored, and stores nothing: ``_stalled_now()`` is then true, and the state machine admits only
in CLOSED, makes no transition (``_enter`` raises ``SharedStateTimeout``) and drops outcomes.
The config (options, listeners, classification, clock) stays per process. The record (``BreakerLayout``, little-endian)::

    27 int64        state, gen, inflight, probe_ok, level, since_ns, consec, head, rec, fail,
                    slow, last, permitted, rejected, successes, failures, slow_calls, ignored,
                    stale, opened, fleet_gen, would_reject, open_ns, open_from, probe_ok_total,
                    probe_failed, timeouts
    window bytes    the count window's ring (window > 0 only)
    4 uint32 each   the time window's buckets: tag, recorded, failed, slow (window_seconds only)
    int64 each      the latency histogram: a count per bound, the overflow count, the sum in ns
                    (slow_call_duration or record_latency only)

``BreakerLayout`` reads and writes the twin ``CircuitBreaker``'s slots by name (``_FIELDS``), and
``apply_fleet``/``recycle`` are its ``_fleet``/``_recycle``: this module is part of the breaker.
"""

from __future__ import annotations

import itertools
import struct
import threading
import weakref
from contextlib import AbstractContextManager
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Optional, Protocol

from ._errors import SharedStateTimeout, State
from ._metrics import Metrics
from ._options import BreakerOptions

if TYPE_CHECKING:
    from ._breaker_py import CircuitBreaker

CLOSED, OPEN, HALF_OPEN, ISOLATED = State.CLOSED, State.OPEN, State.HALF_OPEN, State.ISOLATED
_STATES = (CLOSED, OPEN, HALF_OPEN, ISOLATED)  # by int value


class _Layout(Protocol):
    """How one kind of twin object packs its mutable state into a fixed-size record."""

    @property
    def size(self) -> int: ...

    def load(self, owner: Any, data: bytes) -> None: ...

    def pack(self, owner: Any) -> bytes: ...


class SharedState:
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
    return type(getattr(obj, "_lock", None)) is SharedState


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


class BreakerLayout:
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


def recycle(
    b: CircuitBreaker, info_ok: bool, in_flight_ok: bool, force: bool = False
) -> Optional[Metrics]:
    """A shared map's eviction: if the breaker is CLOSED (and, unless allowed, carries no
    information and has no call in flight), reset its state to a fresh CLOSED breaker of the
    next generation (so permits still out are stale) and return its metrics from before;
    else None. Refused too when a call reached it between the snapshot and the reset.
    ``force``: reset it whatever its state (a slot left half-written by a killed writer)."""
    if not is_shared(b):
        raise TypeError("only a breaker in a SharedRegion is recycled")
    m = b.metrics()
    done = m.successes + m.failures + m.ignored + m.stale
    idle = m.consecutive_failures == 0 and not m.failure_rate and not m.slow_call_rate
    if not force and (m.state != CLOSED or (not in_flight_ok and m.permitted > done)):
        return None
    if not force and not info_ok and not idle:
        return None
    with b._lock:
        if b._stalled_now():
            return None
        seen = (
            b._state,
            b._permitted,
            b._rejected,
            b._successes + b._failures + b._ignored + b._stale,
        )
        if seen != (m.state, m.permitted, m.rejected, done):
            return None
        lock, gen = b._lock, b._gen
        b._setup(b._config, b._label)
        b._lock, b._gen = lock, gen + 1
    return m


# -- fleet coordination (fastbreaker.contrib.redis) ---------------------------------------------
def apply_fleet(
    b: CircuitBreaker, fleet_gen: int, local_gen: int, state: int, seconds: float, probes: int
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
    opts = b._config.options
    if state not in (0, 1, 2):
        raise ValueError(f"state must be 0 (CLOSED), 1 (OPEN) or 2 (HALF_OPEN), got {state!r}")
    if not 0.0 <= seconds < 1e8:
        raise ValueError(f"seconds must be in [0, 1e8), got {seconds!r}")
    if not 0 <= probes <= opts.half_open_max_calls:
        raise ValueError(
            f"probes must be in 0..{opts.half_open_max_calls} (half_open_max_calls), got {probes!r}"
        )
    with b._lock:
        newer = fleet_gen > b._fleet_gen
    now = b._now() if newer else 0
    trans = None
    applied = False
    with b._lock:
        if (
            fleet_gen > b._fleet_gen
            and (local_gen < 0 or local_gen == b._gen)
            and b._state != ISOLATED
            and not b._stalled_now()  # the next sync applies it
        ):
            applied = True
            b._fleet_gen = fleet_gen
            if state == 0:
                if b._state != CLOSED:
                    b._level = 0
                    trans = b._enter(CLOSED, now)
            elif state == 1:
                # the open period ends `seconds` from now: shift its start; the episode
                # (open_seconds_total) still begins now, or when the breaker tripped
                if b._state != OPEN:
                    trans = b._enter(OPEN, now)
                b._since_ns = now + int(seconds * 1e9) - b._open_period_ns(b._level)
            else:
                trans = b._enter(HALF_OPEN, now)
                b._inflight = opts.half_open_max_calls - probes
        result = (
            applied,
            b._gen,
            int(b._state),
            b._successes,
            b._failures,
            b._rejected,
        )
    b._fire(trans)
    return result
