"""Immutable metric snapshots, shared by both cores."""

from __future__ import annotations

import dataclasses
from typing import Optional

from ._errors import State

__all__ = ["Metrics"]


@dataclasses.dataclass(frozen=True)
class Metrics:
    """A point-in-time snapshot of one breaker's counters.

    Counters are cumulative since the breaker was created (``reset()`` does not clear them).
    At quiescence ``permitted == successes + failures + ignored + stale`` (plus permits that
    were never reported back). A slow success counts in ``successes`` and ``slow_calls``.
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
