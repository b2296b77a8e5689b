"""RetryBudget, the pure-Python reference twin: this module is the spec that ``_budget_c`` follows.

A token bucket that bounds how many retries a client may send:

* the bucket starts full at ``capacity`` tokens;
* every success deposits ``ratio`` tokens (capped at ``capacity``) and never reads the clock;
* a retry takes one whole token and is refused below one;
* ``min_per_sec`` tokens per second accrue lazily, computed when a retry asks (or ``tokens`` is
  read) from the time elapsed since the last refill, so that a quiet service can still retry a
  little. No timer, no thread.

Tokens are fixed-point integers (``UNIT`` units per token) so that both implementations do the
same integer arithmetic and give identical results; every intermediate value stays inside int64.

Shared-memory mode (``SharedRegion.retry_budget``, ``RetryBudget._shared``): the tokens and the
last refill time live in a ``SharedRecord`` of the region (two little-endian int64: tokens in
units, last_ns), and ``self._lock`` is the breaker twin's ``SharedState``, which loads them on
entry and stores them on exit under the region's record lock; the deposit, capacity, rate and
clock come from the constructor's arguments in each process.
"""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, final

from ._durations import check_clock, read_clock
from ._errors import SharedStateTimeout, is_uninitialised, not_copyable, uninitialised
from ._keywords import checks_keywords
from ._options import TOKEN_UNIT as UNIT, budget_units

__all__ = ["RetryBudget"]

_US_PER_SEC = 1_000_000


_RECORD = struct.Struct("<2q")  # tokens (units), last refill (ns)


class _BudgetLayout:
    """A shared budget's record: tokens and the last refill time."""

    __slots__ = ()
    size = _RECORD.size

    def load(self, b: "RetryBudget", data: bytes) -> None:
        b._tokens, b._last_ns = _RECORD.unpack(data)

    def pack(self, b: "RetryBudget") -> bytes:
        return _RECORD.pack(b._tokens, b._last_ns)


def shared_size() -> int:
    """The bytes of a shared budget's state block in a SharedRegion."""
    from ._region import SharedRecord

    return SharedRecord.footprint(_RECORD.size)


def shared_init(view: memoryview, capacity_units: int, clock: Callable[[], int] | None) -> None:
    """Write a new shared budget's state into ``view`` (zero-filled, ``shared_size()`` bytes):
    full, last refilled now (``clock``, or the monotonic clock when None)."""
    from ._region import SharedRecord

    now = time.monotonic_ns() if clock is None else read_clock(clock)
    SharedRecord(view, _RECORD.size).store(_RECORD.pack(capacity_units, now))


def _initialised(obj: object) -> bool:
    return not is_uninitialised(obj._lock)  # type: ignore[attr-defined]


def _accrued(elapsed_us: int, rate: int, capacity: int) -> int:
    """Units that accrue in ``elapsed_us`` microseconds at ``rate`` units/s, capped at capacity.

    Split into whole seconds and the rest so that no product leaves int64 in C: whole seconds are
    only multiplied when the result is at most ``capacity``, and the rest is below one second.
    """
    secs, rest_us = divmod(elapsed_us, _US_PER_SEC)
    if secs > capacity // rate:
        return capacity
    return min(secs * rate + rest_us * rate // _US_PER_SEC, capacity)


@final
@checks_keywords
class RetryBudget:
    """A token bucket that limits retries to a share of successes plus a small steady reserve.

    ``ratio`` tokens are deposited per success (``record_success()``), ``allow_retry()`` takes one
    token or refuses, ``min_per_sec`` tokens per second accrue lazily, and the bucket holds at most
    ``capacity`` tokens (it starts full). ``clock`` (a zero-argument callable returning int
    nanoseconds, such as ``fastbreaker.testing.FakeClock``) replaces the monotonic clock.
    """

    __slots__ = (
        "_tokens",
        "_last_ns",
        "_deposit",
        "_capacity",
        "_rate",
        "_clock",
        "_lock",
        "__weakref__",
    )

    def __init_subclass__(cls, **kwargs: object) -> None:
        # The compiled class is final; the twin behaves the same.
        raise TypeError("RetryBudget cannot be subclassed")

    def __new__(cls, *args: object, **kwargs: object) -> "RetryBudget":
        # Until __init__ runs, every slot holds a placeholder that fails clearly when touched.
        self = object.__new__(cls)
        uninitialised(
            self,
            RetryBudget.__slots__[:-1],
            "this RetryBudget was never initialised (made with __new__ without __init__)",
        )
        return self

    def __copy__(self) -> object:
        raise not_copyable(self)

    def __deepcopy__(self, memo: object) -> object:
        raise not_copyable(self)

    def __reduce_ex__(self, protocol: object) -> tuple[object, ...]:
        raise not_copyable(self)

    def __init__(
        self,
        ratio: float = 0.1,
        capacity: float = 100.0,
        min_per_sec: float = 1.0,
        *,
        clock: Callable[[], int] | None = None,
    ) -> None:
        if _initialised(self):
            raise RuntimeError("RetryBudget.__init__ called twice: create a new budget")
        self._deposit, self._capacity, self._rate = budget_units(ratio, capacity, min_per_sec)
        check_clock(clock)
        self._clock: Callable[[], int] = time.monotonic_ns if clock is None else clock
        self._lock: AbstractContextManager[Any] = threading.Lock()
        self._tokens = self._capacity
        self._last_ns = read_clock(self._clock)

    @classmethod
    def _shared(
        cls,
        ratio: float,
        capacity: float,
        min_per_sec: float,
        clock: Callable[[], int] | None,
        view: memoryview,
        lock: AbstractContextManager[Any],
    ) -> "RetryBudget":
        """A budget whose tokens live in ``view`` (a SharedRegion's state block, made by
        ``shared_init``), guarded by the region's ``lock``; it never reads the clock here."""
        from ._breaker_shared_py import SharedState

        self = cls.__new__(cls)
        self._deposit, self._capacity, self._rate = budget_units(ratio, capacity, min_per_sec)
        check_clock(clock)
        self._clock = time.monotonic_ns if clock is None else clock
        self._tokens = self._capacity
        self._last_ns = 0
        self._lock = SharedState(self, view, lock, _BudgetLayout())
        return self

    def record_success(self) -> None:
        """Deposit ``ratio`` tokens, up to ``capacity``. Never reads the clock."""
        try:
            with self._lock:
                self._tokens = min(self._tokens + self._deposit, self._capacity)
        except SharedStateTimeout:
            pass  # shared: another process holds the lock, stopped; the deposit is dropped

    def allow_retry(self) -> bool:
        """Take one token if at least one is available (after the lazy refill); else ``False``."""
        now = read_clock(self._clock)
        try:
            with self._lock:
                self._refill(now)
                if self._tokens < UNIT:
                    return False
                self._tokens -= UNIT
                return True
        except SharedStateTimeout:
            return False  # shared: another process holds the lock, stopped; no retry

    @property
    def tokens(self) -> float:
        """The tokens available now, including what has accrued since the last refill."""
        now = read_clock(self._clock)
        with self._lock:
            self._refill(now)
            return float(self._tokens) / UNIT

    @property
    def ratio(self) -> float:
        """Tokens deposited per success."""
        return float(self._deposit) / UNIT

    @property
    def capacity(self) -> float:
        """The most tokens the bucket holds."""
        return float(self._capacity) / UNIT

    @property
    def min_per_sec(self) -> float:
        """Tokens that accrue per second without any success."""
        return float(self._rate) / UNIT

    def _refill(self, now: int) -> None:
        # Credit whole microseconds only and move the refill time by exactly what was credited,
        # so the sub-microsecond rest is credited later rather than lost. (The C core claims the
        # interval with a CAS on the refill time; here the lock does that.)
        if self._rate == 0:
            return
        elapsed_us = (now - self._last_ns) // 1000
        if elapsed_us <= 0:
            return
        self._last_ns += elapsed_us * 1000
        credit = _accrued(elapsed_us, self._rate, self._capacity)
        self._tokens = min(self._tokens + credit, self._capacity)

    # -- fleet coordination (fastbreaker.contrib.redis) -------------------------------------------
    def _fleet(self, delta: int) -> int:
        """The one entry point of a fleet's budget (``FleetCoordinator.add_budget``): refill as
        ``tokens`` does, then add ``delta`` token units (``TOKEN_UNIT`` per token; negative
        takes), clamped to ``[0, capacity]``, in one atomic step, and return the tokens in units.
        ``delta=0`` only reads. ``|delta|`` above 2**62 raises ValueError."""
        if not -(2**62) <= delta <= 2**62:
            raise ValueError(f"delta must be within +-2**62 token units, got {delta!r}")
        now = read_clock(self._clock)
        with self._lock:
            self._refill(now)
            self._tokens = max(0, min(self._tokens + delta, self._capacity))
            return self._tokens

    def __repr__(self) -> str:
        if not _initialised(self):
            return "<RetryBudget (not initialised)>"
        with self._lock:
            tokens = self._tokens
        return (
            f"RetryBudget(ratio={self.ratio!r}, capacity={self.capacity!r}, "
            f"min_per_sec={self.min_per_sec!r}, tokens={float(tokens) / UNIT!r})"
        )
