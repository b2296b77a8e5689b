"""Immutable metric snapshots, shared by both cores."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from ._errors import State

__all__ = ["EXPORTED_COUNTERS", "Latency", "Metrics"]

#: The cumulative counters of ``Metrics`` that the exporters publish: (field, the metric's name
#: part, its description). ``contrib.prometheus`` and ``contrib.otel`` both read this table, so
#: the two export the same series.
EXPORTED_COUNTERS = (
    ("permitted", "permitted", "Calls admitted"),
    ("rejected", "rejected", "Calls rejected without being made"),
    ("successes", "successes", "Calls that succeeded (slow ones included)"),
    ("failures", "failures", "Calls that failed"),
    ("slow_calls", "slow_calls", "Successful calls slower than slow_call_duration"),
    ("ignored", "ignored", "Calls with a neutral outcome (ignored or cancelled)"),
    ("stale", "stale", "Outcomes that arrived after a later state change"),
    ("opened", "trips", "Transitions into OPEN"),
    ("would_reject", "would_reject", "Calls a dry_run breaker admitted instead of rejecting"),
    ("open_seconds_total", "open_seconds", "Seconds spent OPEN"),
    ("probe_successes", "probe_successes", "HALF_OPEN probes that succeeded"),
    ("probe_failures", "probe_failures", "HALF_OPEN probes that failed or were slow"),
    ("timeouts", "timeouts", "Failures whose exception is a TimeoutError"),
)


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

    ``state`` is the state when the snapshot was taken. ``permitted`` counts admitted calls,
    ``rejected`` refused ones, ``successes``, ``failures``, ``slow_calls``, ``ignored`` (neutral)
    and ``stale`` the outcomes, ``opened`` the trips. ``consecutive_failures`` is the current run
    of failures (consecutive mode); ``failure_rate`` and ``slow_call_rate`` the shares in the
    window (None in consecutive mode), ``recorded`` the outcomes it holds.

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


def non_closed_keys(breakers: Any) -> list[tuple[str, Any]]:
    """``(str(key), state)`` of each key of a ``BreakerMap`` that is not CLOSED, in ``str(key)``
    order (so that exporters bounding their per-key series pick the same keys every time), one
    per ``str(key)`` (1 and "1" would give duplicate series: the first one wins). A key whose
    ``__str__`` raises is labelled as its breaker is named (``label_name``: its ``repr``), so one
    such key cannot break a whole export."""
    from ._errors import State, label_name

    found: list[tuple[str, Any]] = []
    for key in breakers.open_keys():
        breaker = breakers.get(key)
        state = State(breaker.state) if breaker is not None else State.CLOSED
        if state != State.CLOSED:  # it may have closed since open_keys() looked
            found.append((label_name(key) or "None", state))
    found.sort()
    return [kv for i, kv in enumerate(found) if i == 0 or kv[0] != found[i - 1][0]]
