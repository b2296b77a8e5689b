"""Helpers for testing code that uses fastbreaker: a fake clock and a no-sleep retry mode."""

from __future__ import annotations

import contextlib
import datetime
import threading
from collections.abc import Iterator

from . import _retry

__all__ = ["FakeClock", "instant_retries"]


class FakeClock:
    """A manual monotonic clock: call it for the time in integer nanoseconds.

    Pass it as ``clock=`` to a breaker, map or budget, then move time with ``advance()``.
    Thread-safe; time never goes backwards.
    """

    __slots__ = ("_ns", "_lock")

    def __init__(self, start_ns: int = 0) -> None:
        if not isinstance(start_ns, int) or start_ns < 0:
            raise ValueError(f"start_ns must be an int >= 0, got {start_ns!r}")
        self._ns = start_ns
        self._lock = threading.Lock()

    def __call__(self) -> int:
        return self._ns

    def advance(self, seconds: float | datetime.timedelta) -> int:
        """Move the clock forward by ``seconds`` (>= 0) and return the new time in ns."""
        if isinstance(seconds, datetime.timedelta):
            seconds = seconds.total_seconds()
        if not seconds >= 0:
            raise ValueError(f"seconds must be >= 0, got {seconds!r}")
        with self._lock:
            self._ns += round(seconds * 1e9)
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
    _retry._instant.append(record)
    try:
        yield record
    finally:
        # Remove this block's own list (by identity: another block's list may be equal to it).
        for i, active in enumerate(_retry._instant):
            if active is record:
                del _retry._instant[i]
                break
