"""Validation helpers shared by every constructor: durations in seconds, counts, rates."""

from __future__ import annotations

import datetime
import math
from typing import Union

Seconds = Union[float, int, datetime.timedelta]

__all__ = ["Seconds", "seconds_to_ns", "check_count", "check_rate", "to_seconds"]


def to_seconds(value: object, name: str) -> float:
    """Return ``value`` (a number or ``timedelta``) as float seconds, or raise ``TypeError``."""
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds or a timedelta, got {value!r}")
    return float(value)


def seconds_to_ns(value: object, name: str, *, positive: bool = False) -> int:
    """Validate a duration (>= 0, or > 0 with ``positive``) and return it in integer ns."""
    s = to_seconds(value, name)
    if math.isnan(s) or math.isinf(s) or (s <= 0 if positive else s < 0):
        rng = "> 0" if positive else ">= 0"
        raise ValueError(f"{name} must be a finite number of seconds {rng}, got {value!r}")
    ns = round(s * 1e9)
    if ns > 2**62:
        raise ValueError(f"{name} must be at most {2**62 / 1e9:.0f} seconds, got {value!r}")
    return ns


def check_count(value: object, name: str, lo: int, hi: int) -> int:
    """Validate an integer in ``[lo, hi]``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int in [{lo}, {hi}], got {value!r}")
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {value!r}")
    return value


def check_rate(value: object, name: str) -> float:
    """Validate a rate in (0, 1]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number in (0, 1], got {value!r}")
    if not 0.0 < value <= 1.0:
        raise ValueError(f"{name} must be in (0, 1], got {value!r}")
    return float(value)
