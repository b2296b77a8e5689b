"""The twin breaker's metrics: ``CircuitBreaker.metrics()`` (``snapshot``) and its latency
histogram. Part of the breaker: it reads the twin ``CircuitBreaker``'s slots under its lock."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from ._errors import State
from ._metrics import Latency, Metrics

if TYPE_CHECKING:
    from ._breaker_py import CircuitBreaker

CLOSED, OPEN = State.CLOSED, State.OPEN


def now_or(b: CircuitBreaker, default: int) -> int:
    """The clock, or ``default`` when a user clock fails (``metrics()`` never raises)."""
    try:
        return b._now()
    except Exception:
        return default


def latency_of(b: CircuitBreaker) -> Optional[Latency]:
    if b._lat is None:
        return None
    with b._lock:
        lat = b._lat
        counts = tuple(lat[:-1])
        total = lat[-1]
    return Latency(b._config.options.latency_bounds, counts, total / 1e9, sum(counts))


def snapshot(b: CircuitBreaker) -> Metrics:
    """An immutable snapshot of the counters (with a time window or while OPEN, it reads
    the clock: a failing user clock leaves the current bucket and episode out)."""
    opts = b._config.options
    window = opts.window or opts.window_ns
    latency = latency_of(b)
    with b._lock:
        state, since = b._state, b._open_from
    now = now_or(b, -1) if state == OPEN or b._buckets is not None else 0
    with b._lock:
        closed = b._state == CLOSED
        if now < 0:
            now = b._last * opts.bucket_ns
            open_ns = b._open_ns
        else:
            open_ns = b._open_ns
            if b._state == OPEN and b._open_from == since:
                open_ns += max(0, now - since)
        rec, fail, slow = b._window_sums(now)
        return Metrics(
            state=b._state,
            permitted=b._permitted,
            rejected=b._rejected,
            successes=b._successes,
            failures=b._failures,
            slow_calls=b._slow_calls,
            ignored=b._ignored,
            stale=b._stale,
            opened=b._opened,
            consecutive_failures=b._consec if closed else 0,
            failure_rate=(fail / rec if rec else 0.0) if window else None,
            slow_call_rate=(slow / rec if rec else 0.0) if window else None,
            recorded=rec if window else 0,
            would_reject=b._would_reject,
            open_seconds_total=open_ns / 1e9,
            probe_successes=b._probe_ok_total,
            probe_failures=b._probe_failed,
            timeouts=b._timeouts,
            latency=latency,
        )
