"""Bulkhead and AdaptiveLimiter, the pure-Python reference twin: the spec ``_bulkhead_c`` follows.

The counters (``in_flight``, ``waiting``, the limit and the metrics) are plain ints and a float
under one lock; the compiled core keeps them in atomic words. Waiting, the FIFO handoff and the
call paths are shared by both cores and live in ``_bulkhead``; the AIMD step is
``_bulkhead.aimd`` and the gradient algorithm ``_limit_gradient``.

Shared-memory mode (``SharedRegion.bulkhead``, ``Bulkhead._shared``): the slots and counters live
in a ``SharedRecord`` of the region, and ``self._lock`` is the breaker twin's ``SharedState``
(it loads them on entry and stores them on exit under the region's record lock). The record::

    7 int64 (little-endian)     admitted, rejected, timed_out, cancelled, waited, peak,
                                last_reclaim_ns (the last scan for dead owners; INT64_MIN: never)
    max_concurrent int64        the owner of each slot (0: free), in native byte order: the pid
                                and start time of the process holding it (``_process``)

A slot records the process that holds it: ``try_acquire()`` writes this process's owner word in
a free slot; when none is free it frees the slots of processes that no longer exist, or whose
pid now belongs to a process that started at another time (at most once every 100 ms per
bulkhead, on the bulkhead's clock), and tries again. ``release()`` frees a slot held by
this process. A shared bulkhead never waits (``max_wait=0``, ``max_waiting=0``): nobody in another
process could wake a waiter.
"""

from __future__ import annotations

import os
import struct
import threading
import time
from array import array
from collections.abc import Callable
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, Awaitable, Optional, TypeVar, final

from . import _bulkhead as _b
from ._bulkhead import BulkheadMetrics
from ._deadline import current_var
from ._durations import Seconds, read_clock
from ._errors import SharedStateTimeout, is_uninitialised, not_copyable, uninitialised
from ._keywords import checks_keywords
from ._limit_gradient import Gradient
from ._process import owner_gone, owner_self

__all__ = ["AdaptiveLimiter", "Bulkhead", "BulkheadMetrics"]

T = TypeVar("T")


def _initialised(obj: object) -> bool:
    return not is_uninitialised(obj._ready)  # type: ignore[attr-defined]


# -- shared-memory mode (SharedRegion) ---------------------------------------------------------
# A shared bulkhead's counters, in their order in its record (the owner pids follow).
_FIELDS = ("_admitted", "_rejected", "_timed_out", "_cancelled", "_waited", "_peak", "_reclaim_ns")
_COUNTERS = struct.Struct("<7q")
_NEVER = -(2**63)  # last_reclaim_ns before the first scan
RECLAIM_INTERVAL_NS = 100_000_000
"""A shared bulkhead scans its slots for dead owners at most this often (100 ms)."""

_owner = owner_self()


def _refresh_pid() -> None:
    global _owner
    _owner = owner_self()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_refresh_pid)


def _owner_array(n: int) -> "array[int]":
    owners = array("q", bytes(8 * n))
    assert owners.itemsize == 8
    return owners


_owed_lock = threading.Lock()


def _settle_owed(b: "_Slots", owners: "array[int]") -> None:
    """Give back the slots whose release found the lock stalled (under the lock)."""
    with _owed_lock:
        owed, b._owed = b._owed, 0
    for _ in range(owed):
        try:
            owners[owners.index(_owner)] = 0
        except ValueError:
            break


class _BulkheadLayout:
    """A shared bulkhead's record (see the module docstring)."""

    __slots__ = ("size", "_n")

    def __init__(self, max_concurrent: int) -> None:
        self._n = max_concurrent
        self.size = _COUNTERS.size + 8 * max_concurrent

    def load(self, b: "_Slots", data: bytes) -> None:
        for field, value in zip(_FIELDS, _COUNTERS.unpack_from(data)):
            setattr(b, field, value)
        owners = array("q")
        owners.frombytes(memoryview(data)[_COUNTERS.size :])
        if b._owed:
            _settle_owed(b, owners)
        b._owners = owners
        b._in_flight = self._n - owners.count(0)
        b._waiting = 0

    def pack(self, b: "_Slots") -> bytes:
        owners = b._owners
        assert owners is not None
        return _COUNTERS.pack(*[getattr(b, field) for field in _FIELDS]) + owners.tobytes()


def shared_size(max_concurrent: int) -> int:
    """The bytes of a shared bulkhead's state block in a SharedRegion."""
    from ._region import SharedRecord

    return SharedRecord.footprint(_BulkheadLayout(max_concurrent).size)


def shared_init(view: memoryview, max_concurrent: int) -> None:
    """Write a new shared bulkhead's state into ``view`` (zero-filled, ``shared_size()``
    bytes): every slot free, zero counters, never scanned for dead owners."""
    from ._region import SharedRecord

    layout = _BulkheadLayout(max_concurrent)
    data = _COUNTERS.pack(0, 0, 0, 0, 0, 0, _NEVER) + _owner_array(max_concurrent).tobytes()
    SharedRecord(view, layout.size).store(data)


class _Slots:
    """What Bulkhead and AdaptiveLimiter share: the counters, the fast paths, waiting, calls."""

    __slots__ = (
        "_lock",
        "_queue",
        "_in_flight",
        "_waiting",
        "_admitted",
        "_rejected",
        "_timed_out",
        "_cancelled",
        "_waited",
        "_peak",
        "_name",
        "_max_wait",
        "_max_waiting",
        "_clock",
        "_ready",
        "_owners",
        "_reclaim_ns",
        "_owed",
        "__weakref__",
    )

    def _setup(self, wait_s: float, max_waiting: int, name: Optional[str], clock: Any) -> None:
        if _initialised(self):
            raise RuntimeError(f"{type(self).__name__}.__init__ called twice: create a new one")
        # Reentrant: the GC may run inside a counter step that allocates (metrics() builds its
        # snapshot under it), and the finalizer of an abandoned task there releases its slot
        # (see _settle_lock); the steps that change counts allocate nothing the GC tracks.
        self._lock: AbstractContextManager[Any] = threading.RLock()
        self._queue = _b.WaitQueue()
        self._in_flight = self._waiting = 0
        self._admitted = self._rejected = self._timed_out = self._cancelled = 0
        self._waited = self._peak = 0
        self._name = name
        self._max_wait = wait_s
        self._max_waiting = max_waiting
        self._clock: Callable[[], int] = time.monotonic_ns if clock is None else clock
        # shared mode (a SharedRegion's bulkhead): the owner pid of each slot; None when local
        self._owners: Optional[array[int]] = None
        self._reclaim_ns = _NEVER
        self._owed = 0  # shared mode: releases not yet made (the lock was stalled)
        self._ready = True

    def __new__(cls, *args: object, **kwargs: object) -> Any:
        # Until __init__ runs, every slot holds a placeholder that fails clearly when touched.
        self = object.__new__(cls)
        slots = tuple(n for n in _Slots.__slots__ + cls.__slots__ if n != "__weakref__")
        uninitialised(
            self,
            slots,
            f"this {cls.__name__} was never initialised (made with __new__ without __init__)",
        )
        return self

    def __copy__(self) -> object:
        raise not_copyable(self)

    def __deepcopy__(self, memo: object) -> object:
        raise not_copyable(self)

    def __reduce_ex__(self, protocol: object) -> str | tuple[Any, ...]:
        raise not_copyable(self)

    def _cap(self) -> int:
        raise NotImplementedError

    def _now(self) -> int:
        return read_clock(self._clock)

    # -- the fast paths ---------------------------------------------------------------------

    def _try_admit(self) -> bool:
        if self._owners is not None:
            try:
                with self._lock:
                    return self._take_slot()
            except SharedStateTimeout:
                return False  # another process holds the lock, stopped: refused (uncounted)
        with self._lock:
            if self._waiting == 0 and self._in_flight < self._cap():
                self._in_flight += 1
                self._admitted += 1
                if self._in_flight > self._peak:
                    self._peak = self._in_flight
                return True
            return False

    def try_acquire(self) -> bool:
        """Take a slot if one is free and nobody waits for one; never waits."""
        if self._try_admit():
            return True
        now = self._now() if self._owners is not None else 0
        try:
            with self._lock:
                if self._owners is not None and (
                    self._take_slot() or (self._reclaim(now) and self._take_slot())
                ):
                    return True
                self._rejected += 1
        except SharedStateTimeout:
            pass  # another process holds the lock, stopped: refused (uncounted)
        return False

    def _take_slot(self) -> bool:
        """Shared mode, under the lock: write this process's pid in a free slot."""
        owners = self._owners
        assert owners is not None
        try:
            i = owners.index(0)
        except ValueError:
            return False
        owners[i] = _owner
        self._in_flight += 1
        self._admitted += 1
        if self._in_flight > self._peak:
            self._peak = self._in_flight
        return True

    def _reclaim(self, now: int) -> bool:
        """Shared mode, under the lock: free the slots of processes that no longer exist, at
        most once every RECLAIM_INTERVAL_NS (on this bulkhead's clock). Whether any was freed."""
        if now - self._reclaim_ns < RECLAIM_INTERVAL_NS:
            return False  # scanned less than 100 ms ago (by any process)
        self._reclaim_ns = now
        owners = self._owners
        assert owners is not None
        dead = {o for o in set(owners) if o and o != _owner and owner_gone(o)}
        if not dead:
            return False
        for i, o in enumerate(owners):
            if o in dead:
                owners[i] = 0
                self._in_flight -= 1
        return True

    def _release_slot(self) -> None:
        try:
            self._release_locked()
        except SharedStateTimeout:
            self._owe_release()

    def _owe_release(self) -> None:
        """Shared mode: another process holds the lock, stopped. The slot is given back by the
        next holder of the lock in this process (``_BulkheadLayout.load``), never lost."""
        with _owed_lock:
            self._owed += 1

    def _release_locked(self) -> None:
        with self._lock:
            if self._owners is not None:
                owners = self._owners
                try:
                    i = owners.index(_owner)
                except ValueError:
                    raise RuntimeError(
                        "release() without a matching acquisition: nothing is held"
                    ) from None
                owners[i] = 0
                self._in_flight -= 1
                return
            if self._in_flight == 0:
                raise RuntimeError("release() without a matching acquisition: nothing is held")
            if self._waiting == 0:
                self._in_flight -= 1
                return
        _b.release_slow(self)

    # -- the queue's steps (each called under the queue lock, see _bulkhead) -----------------

    def _q_enter(self) -> int:
        with self._lock:
            if self._waiting == 0 and self._in_flight < self._cap():
                self._in_flight += 1
                self._admitted += 1
                if self._in_flight > self._peak:
                    self._peak = self._in_flight
                return _b.ADMITTED
            if self._waiting >= self._max_waiting:
                self._rejected += 1
                return _b.FULL
            self._waiting += 1
            return _b.QUEUED

    def _q_transfer(self) -> bool:
        with self._lock:
            if self._waiting > 0 and self._in_flight < self._cap():
                self._in_flight += 1
                self._waiting -= 1
                if self._in_flight > self._peak:
                    self._peak = self._in_flight
                return True
            return False

    def _q_unreserve(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def _q_leave(self) -> None:
        with self._lock:
            self._waiting -= 1

    def _q_free(self) -> bool:
        with self._lock:
            if self._in_flight == 0:
                return False
            self._in_flight -= 1
            return True

    def _q_count(self, kind: int) -> None:
        with self._lock:
            if kind == _b.WOKEN:
                self._admitted += 1
                self._waited += 1
            elif kind == _b.CANCELLED:
                self._cancelled += 1
            else:
                self._rejected += 1
                if kind != _b.REFUSED:
                    self._timed_out += 1

    # -- public -------------------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Slots held now (including one being handed to a waiter)."""
        with self._lock:
            return self._in_flight

    @property
    def waiting(self) -> int:
        """Callers waiting for a slot now."""
        with self._lock:
            return self._waiting

    @property
    def max_concurrent(self) -> int:
        """The number of slots (for an AdaptiveLimiter, ``floor(limit)`` now)."""
        return self._cap()

    @property
    def name(self) -> Optional[str]:
        """The name given at construction (shown in errors), or None."""
        return self._name

    def metrics(self) -> BulkheadMetrics:
        """A snapshot of the counters."""
        with self._lock:
            return BulkheadMetrics(
                self._admitted,
                self._rejected,
                self._timed_out,
                self._cancelled,
                self._waited,
                self._in_flight,
                self._waiting,
                self._peak,
            )

    def __enter__(self) -> Any:
        if current_var.get() is not None or not self._try_admit():
            _b.acquire(self)
        self._enter_started()
        return self

    async def __aenter__(self) -> Any:
        if current_var.get() is not None or not self._try_admit():
            await _b.acquire_async(self)
        self._enter_started()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._exit(exc)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._exit(exc)

    def call(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` holding a slot (waiting up to ``max_wait`` for one)."""
        return _b.call(self, fn, args, kwargs)

    async def call_async(self, fn: Callable[..., Awaitable[T]], /, *args: Any, **kwargs: Any) -> T:
        """Await ``fn(*args, **kwargs)`` holding a slot (waiting up to ``max_wait`` for one)."""
        return await _b.call_async(self, fn, args, kwargs)

    def __call__(self, fn: Any) -> Any:
        """``@bulkhead``: guard ``fn``, a sync or async function."""
        return _b.decorate(self, fn)

    def _enter_started(self) -> None:
        pass

    def _exit(self, exc: BaseException | None) -> None:
        raise NotImplementedError

    def _start_or_release(self) -> int:
        return 0

    def _done(self, start: int, exc: BaseException | None) -> None:
        raise NotImplementedError


@final
@checks_keywords
class Bulkhead(_Slots):
    """At most ``max_concurrent`` calls at once; others wait up to ``max_wait`` seconds, in
    order of arrival, at most ``max_waiting`` of them (default ``max_concurrent``), or fail with
    ``BulkheadFullError``. ``clock`` (int ns, such as ``testing.FakeClock``) times ``.waited``.
    ``name`` labels errors and metrics.
    """

    __slots__ = ("_max",)

    def __init_subclass__(cls, **kwargs: object) -> None:
        raise TypeError("Bulkhead cannot be subclassed")

    def __init__(
        self,
        max_concurrent: int,
        *,
        max_wait: Seconds = 0.0,
        max_waiting: Optional[int] = None,
        name: Optional[str] = None,
        clock: Optional[Callable[[], int]] = None,
    ) -> None:
        cap, wait_s, waiting, name = _b.check_bulkhead(
            max_concurrent, max_wait, max_waiting, name, clock
        )
        self._setup(wait_s, waiting, name, clock)
        self._max = cap

    @classmethod
    def _shared(
        cls,
        max_concurrent: int,
        name: Optional[str],
        clock: Optional[Callable[[], int]],
        view: memoryview,
        lock: AbstractContextManager[Any],
    ) -> "Bulkhead":
        """A bulkhead whose slots live in ``view`` (a SharedRegion's state block, made by
        ``shared_init`` with the same ``max_concurrent``), guarded by the region's ``lock``.
        It never waits (``max_wait=0``, ``max_waiting=0``)."""
        from ._breaker_shared_py import SharedState

        cap, wait_s, waiting, name = _b.check_bulkhead(max_concurrent, 0.0, 0, name, clock)
        self: Bulkhead = cls.__new__(cls)
        self._setup(wait_s, waiting, name, clock)
        self._max = cap
        self._owners = _owner_array(cap)
        self._lock = SharedState(self, view, lock, _BulkheadLayout(cap))
        return self

    def _cap(self) -> int:
        return self._max

    def release(self) -> None:
        """Give back a slot taken by ``try_acquire()``; RuntimeError if none is held."""
        self._release_slot()

    def _exit(self, exc: BaseException | None) -> None:
        self._release_slot()

    def _done(self, start: int, exc: BaseException | None) -> None:
        self._release_slot()

    def __repr__(self) -> str:
        if not _initialised(self):
            return "<Bulkhead (not initialised)>"
        with self._lock:
            in_flight, waiting = self._in_flight, self._waiting
        return (
            f"Bulkhead(max_concurrent={self._max}, max_wait={self._max_wait!r}, "
            f"max_waiting={self._max_waiting}, name={self._name!r}, in_flight={in_flight}, "
            f"waiting={waiting})"
        )


@final
@checks_keywords
class AdaptiveLimiter(_Slots):
    """A bulkhead whose limit adapts to the observed round trips (AIMD or gradient).

    See ``_bulkhead.aimd`` and ``_limit_gradient`` for the algorithms. The call paths time each
    call with ``clock`` and report ``dropped=True`` for exceptions matching ``drop_on`` and for
    ``DeadlineExceeded``.

    Args:
        initial_limit: the limit to start from; ``floor(limit)`` calls run at once.
        min_limit: the lowest the limit goes.
        max_limit: the highest the limit goes.
        algorithm: ``"aimd"`` (cut on a drop or a slow round trip, grow by ``1/limit``) or
            ``"gradient"`` (follow ``baseline / rtt``; no threshold).
        rtt_threshold: AIMD only: a round trip slower than this (seconds) cuts the limit.
        backoff: AIMD only: the factor of a cut, in (0, 1).
        max_wait: seconds a caller waits for a slot (0: refuse at once).
        max_waiting: the most callers waiting at once (default ``initial_limit``).
        drop_on: exception types that count as drops (default ``TimeoutError``).
        name: labels errors and metrics.
        clock: monotonic int nanoseconds (tests: ``fastbreaker.testing.FakeClock``).
    """

    __slots__ = ("_limit", "_last_cut", "_cfg", "_gradient", "_drop_on")

    def __init_subclass__(cls, **kwargs: object) -> None:
        raise TypeError("AdaptiveLimiter cannot be subclassed")

    def __init__(
        self,
        initial_limit: float = 20,
        *,
        min_limit: float = 4,
        max_limit: float = 400,
        algorithm: str = "aimd",
        rtt_threshold: Seconds = 0.25,
        backoff: float = 0.9,
        max_wait: Seconds = 0.0,
        max_waiting: Optional[int] = None,
        drop_on: type[BaseException] | tuple[type[BaseException], ...] = (TimeoutError,),
        name: Optional[str] = None,
        clock: Optional[Callable[[], int]] = None,
    ) -> None:
        cfg = _b.check_limiter(
            initial_limit,
            min_limit,
            max_limit,
            algorithm,
            rtt_threshold,
            backoff,
            max_wait,
            max_waiting,
            drop_on,
            name,
            clock,
        )
        self._setup(cfg.max_wait, cfg.max_waiting, cfg.name, clock)
        self._cfg = cfg
        self._limit = cfg.initial
        self._last_cut = _b.NO_CUT
        self._drop_on = cfg.drop_on
        self._gradient = Gradient(cfg) if cfg.algorithm == _b.GRADIENT else None

    def _cap(self) -> int:
        return int(self._limit)

    @property
    def limit(self) -> float:
        """The current limit; ``floor(limit)`` calls may run at once."""
        return self._limit

    def _get_limit(self) -> float:
        return self._limit

    def _set_limit(self, value: float) -> None:
        with self._lock:
            self._limit = value

    def release(self, rtt: Optional[Seconds] = None, *, dropped: bool = False) -> None:
        """Give back a slot, with the call's round trip ``rtt`` (seconds) as a sample for the
        limit.

        ``dropped=True`` reports a drop (a timeout, an overload answer). With neither, the slot is
        freed and the limit is unchanged. RuntimeError (and nothing changes) if none is held.
        """
        ns = None if rtt is None else _b.rtt_ns(rtt)
        if ns is None and not dropped:
            self._release_slot()
            return
        self._release_sample(ns, bool(dropped), self._now())

    def _release_sample(self, rtt: Optional[int], dropped: bool, now: int) -> None:
        with self._lock:
            in_flight = self._in_flight
            if in_flight == 0:
                raise RuntimeError("release() without a matching acquisition: nothing is held")
            if self._gradient is None:
                self._limit, self._last_cut = _b.aimd(
                    self._limit, self._last_cut, rtt, dropped, now, in_flight, self._cfg
                )
        if self._gradient is not None:
            self._gradient.sample(self, rtt, dropped, now, in_flight)
        self._release_slot()

    def _enter_started(self) -> None:
        try:
            start = self._now()
        except BaseException:
            self._release_slot()
            raise
        _b.push_start(self, start)

    def _exit(self, exc: BaseException | None) -> None:
        start = _b.pop_start(self)
        if start is None:
            self._release_slot()  # exited in another context: no sample
        else:
            self._done(start, exc)

    def _start_or_release(self) -> int:
        try:
            return self._now()
        except BaseException:
            self._release_slot()
            raise

    def _done(self, start: int, exc: BaseException | None) -> None:
        drop = _b.is_drop(self, exc)
        if drop is None:
            self._release_slot()
            return
        try:
            now = self._now()
        except BaseException:
            self._release_slot()
            raise
        self._release_sample(max(0, now - start), drop, now)

    def __repr__(self) -> str:
        if not _initialised(self):
            return "<AdaptiveLimiter (not initialised)>"
        alg = "aimd" if self._gradient is None else "gradient"
        with self._lock:
            in_flight, waiting = self._in_flight, self._waiting
        return (
            f"AdaptiveLimiter(limit={self._limit!r}, algorithm={alg!r}, name={self._name!r}, "
            f"in_flight={in_flight}, waiting={waiting})"
        )
