"""Immutable metric snapshots, shared by both cores."""

from __future__ import annotations

import dataclasses
from typing import Optional

from ._errors import State

__all__ = ["Latency", "Metrics"]


@dataclasses.dataclass(frozen=True)
class Latency:
    """The latency histogram of the calls a breaker timed (``metrics().latency``).

    ``counts[i]`` is the number of calls that took at most ``bounds[i]`` seconds and more than
    ``bounds[i - 1]`` (per bucket, not cumulative); ``counts[-1]``, one more than ``bounds``,
    holds the calls slower than the last bound (Prometheus's ``+Inf``). ``sum`` is their total
    duration in seconds and ``count`` their number (``sum(counts)``).
    """

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    sum: float
    count: int


@dataclasses.dataclass(frozen=True)
class Metrics:
    """A point-in-time snapshot of one breaker's counters.

    Counters are cumulative since the breaker was created (``reset()`` does not clear them).
    At quiescence ``permitted == successes + failures + ignored + stale`` (plus permits that
    were never reported back). A slow success counts in ``successes`` and ``slow_calls``.

    ``would_reject`` counts the calls a ``dry_run`` breaker admitted instead of rejecting (they
    are also in ``permitted``; their outcomes are ``stale``). ``open_seconds_total`` is the time
    spent OPEN, exact when read mid-episode (ISOLATED is not OPEN). ``probe_successes`` and
    ``probe_failures`` count HALF_OPEN probe outcomes (a slow probe is a failure: it re-opens);
    ``timeouts`` the failures whose exception is a ``TimeoutError`` (``DeadlineExceeded``
    included). ``latency`` is None unless the breaker times calls (``slow_call_duration`` or
    ``record_latency``).
    """

    state: State
    permitted: int
    rejected: int
    successes: int
    failures: int
    slow_calls: int
    ignored: int
    stale: int
    opened: int
    consecutive_failures: int
    failure_rate: Optional[float]
    slow_call_rate: Optional[float]
    recorded: int
    would_reject: int = 0
    open_seconds_total: float = 0.0
    probe_successes: int = 0
    probe_failures: int = 0
    timeouts: int = 0
    latency: Optional[Latency] = None
