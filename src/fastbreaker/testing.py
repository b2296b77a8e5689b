"""Helpers for testing code that uses fastbreaker: a fake clock, a no-sleep retry mode, and the
API bound to each core (to run one test suite on both)."""

from __future__ import annotations

import contextlib
import datetime
import importlib
import threading
import types
from collections.abc import Iterator

from . import _retry
from ._durations import MAX_CLOCK_NS, seconds_to_ns

__all__ = ["FakeClock", "implementations", "instant_retries"]


class FakeClock:
    """A manual monotonic clock: call it for the time in integer nanoseconds.

    Pass it as ``clock=`` to a breaker, map or budget, then move time with ``advance()``.
    Thread-safe; time never goes backwards. ``start_ns`` is the time it starts at, an int in
    ``[0, 2**63 - 1]``.
    """

    __slots__ = ("_ns", "_lock")

    def __init__(self, start_ns: int = 0) -> None:
        if isinstance(start_ns, bool) or not isinstance(start_ns, int):
            raise TypeError(f"start_ns must be an int in [0, 2**63 - 1], got {start_ns!r}")
        if not 0 <= start_ns <= MAX_CLOCK_NS:
            raise ValueError(f"start_ns must be an int in [0, 2**63 - 1], got {start_ns!r}")
        self._ns = start_ns
        self._lock = threading.Lock()

    def __call__(self) -> int:
        """The current time, in int nanoseconds."""
        return self._ns

    def advance(self, seconds: float | datetime.timedelta) -> int:
        """Move the clock forward by ``seconds`` (>= 0) and return the new time in ns."""
        ns = seconds_to_ns(seconds, "seconds")  # a finite number >= 0, or a timedelta
        with self._lock:
            if self._ns + ns > MAX_CLOCK_NS:
                raise ValueError(
                    f"seconds would move the clock past 2**63 - 1 ns (it is at {self._ns}), "
                    f"got {seconds!r}"
                )
            self._ns += ns
            return self._ns

    def __repr__(self) -> str:
        return f"FakeClock({self._ns})"


@contextlib.contextmanager
def instant_retries() -> Iterator[list[float]]:
    """While active, retries anywhere in the process do not really sleep.

    Delays are still computed, passed to ``on_retry`` and checked against deadlines; the block
    yields a list that receives each delay that was skipped::

        with fastbreaker.testing.instant_retries() as delays:
            fetch()
        assert len(delays) == 2
    """
    record: list[float] = []
    _retry.instant_blocks.append(record)
    try:
        yield record
    finally:
        # Remove this block's own list (by identity: another block's list may be equal to it).
        for i, active in enumerate(_retry.instant_blocks):
            if active is record:
                del _retry.instant_blocks[i]
                break


def implementations() -> dict[str, types.SimpleNamespace]:
    """The public API of fastbreaker bound to each core: ``{"c": ..., "python": ...}``.

    Each value has every name of ``fastbreaker.__all__``, with ``CircuitBreaker``, ``Metrics``,
    ``RetryBudget``, ``BreakerMap``, ``Bulkhead``, ``AdaptiveLimiter``, ``RateLimiter``, ``RateLimiterMap``, ``retry`` and ``SharedRegion``
    taken from that core,
    and ``impl`` naming it. Where ``import fastbreaker`` uses the twin
    (``FASTBREAKER_NO_EXTENSIONS`` set, or an interpreter other than CPython) there is only
    ``"python"``.
    """
    import fastbreaker

    from . import _breaker_py, _budget_py, _bulkhead_py, _map, _region, _select

    cores: dict[str, tuple[types.ModuleType, types.ModuleType, types.ModuleType]] = {}
    if _select.COMPILED:
        from . import _breaker_c, _budget_c, _bulkhead_c

        cores["c"] = (_breaker_c, _budget_c, _bulkhead_c)
    cores["python"] = (_breaker_py, _budget_py, _bulkhead_py)
    out = {}
    for name, (breaker_mod, budget_mod, bulkhead_mod) in cores.items():
        ns = types.SimpleNamespace(**{k: getattr(fastbreaker, k) for k in fastbreaker.__all__})
        ns.impl = name
        ns.CircuitBreaker = breaker_mod.CircuitBreaker
        ns.Metrics = breaker_mod.Metrics
        ns.RetryBudget = budget_mod.RetryBudget
        ns.BreakerMap = _map.map_class(breaker_mod)
        ns.Bulkhead = bulkhead_mod.Bulkhead
        ns.AdaptiveLimiter = bulkhead_mod.AdaptiveLimiter
        ns.retry = _retry.retry_on_core(name)
        ns.SharedRegion = _region.region_class(name)
        ratelimit = importlib.import_module(
            f"fastbreaker._ratelimit_{'c' if name == 'c' else 'py'}"
        )
        ns.RateLimiter = ratelimit.RateLimiter
        ns.RateLimiterMap = ratelimit.RateLimiterMap
        out[name] = ns
    return out
