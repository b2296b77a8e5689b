"""Validation helpers shared by every constructor: durations in seconds, counts, rates."""

from __future__ import annotations

import datetime
import functools
import math
from typing import Union

Seconds = Union[float, int, datetime.timedelta]

__all__ = [
    "MAX_CLOCK_NS",
    "Seconds",
    "check_clock",
    "check_count",
    "check_rate",
    "read_clock",
    "seconds_to_ns",
    "to_seconds",
]

#: Clock readings are int nanoseconds in [0, MAX_CLOCK_NS]: the compiled cores keep times in
#: signed 64-bit words, and both cores refuse anything else, before they count anything.
MAX_CLOCK_NS = 2**63 - 1


def to_seconds(value: object, name: str) -> float:
    """Return ``value`` (a number or ``timedelta``) as float seconds, or raise ``TypeError``."""
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds or a timedelta, got {value!r}")
    try:
        return float(value)
    except OverflowError:  # an int beyond the float range
        raise ValueError(
            f"{name} must be a finite number of seconds, at most {2**62 / 1e9:.0f}, got {value!r}"
        ) from None


def seconds_to_ns(value: object, name: str, *, positive: bool = False) -> int:
    """Validate a duration (>= 0, or > 0 with ``positive``) and return it in integer ns."""
    s = to_seconds(value, name)
    if math.isnan(s) or math.isinf(s) or (s <= 0 if positive else s < 0):
        rng = "> 0" if positive else ">= 0"
        raise ValueError(f"{name} must be a finite number of seconds {rng}, got {value!r}")
    ns = _ns(s) if s <= 2**62 / 1e9 else 2**62 + 1
    if ns > 2**62:
        raise ValueError(f"{name} must be at most {2**62 / 1e9:.0f} seconds, got {value!r}")
    return ns


# Objects made with the same duration share its int: above 2**30 ns (about a second) an int is
# 32 bytes, and each breaker's options hold several (issue 26: bytes per standalone breaker).
@functools.lru_cache(maxsize=256)
def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


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


def check_clock(clock: object) -> None:
    """Validate a ``clock=`` option: None (the monotonic clock) or a zero-argument callable."""
    if clock is not None and not callable(clock):
        raise TypeError(
            f"clock must be None or a zero-argument callable returning int ns, got {clock!r}"
        )


def read_clock(clock: object) -> int:
    """Call a user ``clock`` and return its reading, or raise an error that names the clock.

    A reading is an int of monotonic nanoseconds in ``[0, 2**63 - 1]`` (``bool`` is refused).
    Both cores call this before they record anything that needs the time, so a bad reading
    never leaves an outcome counted and its transition lost.
    """
    value = clock()  # type: ignore[operator]
    if type(value) is not int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(
                f"clock must return an int of nanoseconds in [0, 2**63 - 1], "
                f"got {value!r} from {clock!r}"
            )
        value = int(value)
    if not 0 <= value <= MAX_CLOCK_NS:
        raise ValueError(
            f"clock must return an int of nanoseconds in [0, 2**63 - 1], got {value!r} from {clock!r}"
        )
    return value
