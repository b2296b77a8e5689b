"""Rate limits (GCRA), the code both cores share: ``Rate`` and its parser, validation, metrics
types, the waiting paths (``acquire``, ``acquire_async``, ``with``, ``call``, decorator) and the
rare steps of ``RateLimiterMap`` (creating a key, eviction).

GCRA keeps one word per rate: the theoretical arrival time (TAT), in integer nanoseconds of the
limiter's clock. With the emission interval ``T = per / limit`` (rounded *up* to whole ns, so a
limiter never admits more than its rate) and the tolerance ``tau = burst * T``, a request of
weight ``w`` at ``now`` is admitted by a rate iff ``max(TAT, now) + w*T - now <= tau``, and then
``TAT = max(TAT, now) + w*T``. A rate whose TAT is at or before ``now`` is idle: it is
indistinguishable from a fresh one. The cores (``_ratelimit_c``, ``_ratelimit_py``) hold the words
and implement ``try_acquire`` / ``retry_after`` / ``refund``; everything here runs over those.

Waiting starts no thread, timer or task: the caller sleeps the exact ``retry_after`` and tries
again. Async waiters of one limiter (or one key) queue in arrival order and only the head sleeps:
a waiter is woken once, when the one ahead of it leaves, so N waiters cost O(N) wake-ups.
"""

from __future__ import annotations

import asyncio
import collections
import datetime
import functools
import heapq
import inspect
import math
import re
import threading
import time
from collections.abc import Awaitable, Callable
from fractions import Fraction
from typing import Any, NamedTuple, TypeVar, Union

from ._deadline import current_deadline
from ._durations import seconds_to_ns
from ._errors import RateLimitedError
from ._keywords import checks_keywords

__all__ = [
    "MAX_RATES",
    "Rate",
    "RateLimiterMapMetrics",
    "RateLimiterMetrics",
    "RateSpec",
]

#: The most rates one limiter combines (the compiled core keeps them inline).
MAX_RATES = 8
_MAX_TAU_NS = 2**62
_F = TypeVar("_F", bound=Callable[..., Any])


class RateLimiterMetrics(NamedTuple):
    """Counts of a ``RateLimiter`` since it was made: requests ``admitted`` and ``rejected``
    (every refused ``try_acquire``, including a waiting ``acquire``'s tries), the units of each
    (``admitted_units``, ``rejected_units``), and ``waits``: calls of ``acquire`` or
    ``acquire_async`` that had to wait."""

    admitted: int
    rejected: int
    admitted_units: int
    rejected_units: int
    waits: int


class RateLimiterMapMetrics(NamedTuple):
    """A ``RateLimiterMap``'s ``keys`` now, keys ``evicted`` so far, and requests ``admitted``
    and ``rejected`` so far."""

    keys: int
    evicted: int
    admitted: int
    rejected: int


def _positive(value: object, name: str) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a finite number > 0, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return Fraction(value)


@checks_keywords
class Rate:
    """``limit`` units per ``per`` seconds (a float or ``timedelta``), with at most ``burst``
    units (default ``limit``) admitted at once from idle. The emission interval is
    ``T = per / limit``, kept in whole nanoseconds rounded up."""

    __slots__ = ("limit", "per", "burst", "interval_ns", "tolerance_ns")

    limit: float
    per: float
    burst: float
    interval_ns: int
    tolerance_ns: int

    def __init__(
        self, limit: float, per: float | datetime.timedelta, *, burst: float | None = None
    ) -> None:
        lim = _positive(limit, "limit")
        per_ns = seconds_to_ns(per, "per", positive=True)
        b = lim if burst is None else _positive(burst, "burst")
        interval = math.ceil(Fraction(per_ns) / lim)
        tau = math.floor(b * interval)
        if tau > _MAX_TAU_NS:
            raise ValueError(
                f"burst * per / limit must be at most {_MAX_TAU_NS / 1e9:.0f} seconds, "
                f"got limit={limit!r}, per={per!r}, burst={burst!r}"
            )
        if tau < interval:
            raise ValueError(f"burst must be >= 1 (one unit at once), got {burst!r}")
        setattr_ = object.__setattr__
        setattr_(self, "limit", limit)
        setattr_(self, "per", per_ns / 1e9)
        setattr_(self, "burst", limit if burst is None else burst)
        setattr_(self, "interval_ns", interval)
        setattr_(self, "tolerance_ns", tau)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Rate is immutable")

    @classmethod
    def parse(cls, text: str) -> Rate:
        """A rate from text: ``"10/s"``, ``"600/min"``, ``"10000/h"``, ``"100000/day"``,
        ``"5/2s"`` (units: ms, s, sec, second, m, min, minute, h, hour, d, day; plurals too).
        ``ValueError`` naming the text for anything else."""
        if not isinstance(text, str):
            raise TypeError(f"a rate must be a Rate or a string such as '10/s', got {text!r}")
        m = _RATE_RE.fullmatch(text.strip().lower())
        if m is None or int(m["limit"]) == 0 or m["count"] == "0":
            raise ValueError(
                f"cannot parse rate {text!r}: expected LIMIT/[N]UNIT with LIMIT and N positive "
                f"integers and UNIT one of ms, s, min, h, day (e.g. '10/s', '600/min', '5/2s')"
            )
        count = int(m["count"]) if m["count"] else 1
        return cls(int(m["limit"]), count * _UNITS[m["unit"]])

    def __repr__(self) -> str:
        extra = "" if self.burst == self.limit else f", burst={self.burst!r}"
        return f"Rate({self.limit!r}, {self.per!r}{extra})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Rate):
            return NotImplemented
        return (self.interval_ns, self.tolerance_ns) == (other.interval_ns, other.tolerance_ns)

    def __hash__(self) -> int:
        return hash((self.interval_ns, self.tolerance_ns))

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self.limit, self.per, self.burst))


def _rebuild(limit: float, per: float, burst: float) -> Rate:
    return Rate(limit, per, burst=burst)


_UNITS = {
    "ms": 0.001,
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), 3600),
    **dict.fromkeys(("d", "day", "days"), 86400),
}
_RATE_RE = re.compile(
    r"(?P<limit>\d{1,18})\s*/\s*(?P<count>\d{1,9})?\s*(?P<unit>"
    + "|".join(sorted(_UNITS, key=len, reverse=True))
    + r")"
)

RateSpec = Union[Rate, str]


# The constructors' parameters, which inspect.signature() shows for the compiled classes (Cython
# gives a class no signature); tests/test_signatures.py keeps them equal to the twins' __init__.
def limiter_parameters(
    *rates: RateSpec, name: str | None = None, clock: Callable[[], int] | None = None
) -> None:
    """``RateLimiter``'s parameters (see above)."""


def map_parameters(
    *rates: RateSpec,
    max_keys: int = 10_000,
    name: str | None = None,
    clock: Callable[[], int] | None = None,
) -> None:
    """``RateLimiterMap``'s parameters (see above)."""


def rates_config(rates: tuple[RateSpec, ...]) -> tuple[tuple[Rate, ...], list[int], list[int]]:
    """Validate a limiter's rates: ``(rates, intervals_ns, tolerances_ns)``."""
    if not 1 <= len(rates) <= MAX_RATES:
        raise ValueError(f"rates: give 1 to {MAX_RATES} Rate objects or strings, got {len(rates)}")
    out = tuple(Rate.parse(r) if isinstance(r, str) else r for r in rates)
    for r in out:
        if not isinstance(r, Rate):
            raise TypeError(f"rates must be Rate objects or strings such as '10/s', got {r!r}")
    return out, [r.interval_ns for r in out], [r.tolerance_ns for r in out]


def check_name(name: object) -> None:
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name must be a str or None, got {name!r}")


def check_weight(weight: object, rates: tuple[Rate, ...], name: str = "weight") -> int:
    """``weight`` as an int in [1, the smallest burst]: a heavier request can never pass."""
    if isinstance(weight, bool) or not isinstance(weight, int):
        raise TypeError(f"{name} must be an int >= 1, got {weight!r}")
    if weight < 1:
        raise ValueError(f"{name} must be an int >= 1, got {weight!r}")
    for r in rates:
        if weight * r.interval_ns > r.tolerance_ns:
            raise ValueError(
                f"{name} {weight!r} exceeds the burst of {r!r} ({r.burst!r}): it can never be "
                f"admitted; weights must be in [1, {r.tolerance_ns // r.interval_ns}]"
            )
    return weight


def bad_weight(limiter: Any, weight: object) -> Exception:
    """The error for a weight the core refused (it never admits, or it is not an int >= 1)."""
    try:
        check_weight(weight, limiter.rates)
    except (TypeError, ValueError) as exc:
        return exc
    return ValueError(f"weight must be an int >= 1, got {weight!r}")  # pragma: no cover


def check_max_keys(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"max_keys must be an int in [1, 2**31], got {value!r}")
    if not 1 <= value <= 2**31:
        raise ValueError(f"max_keys must be an int in [1, 2**31], got {value!r}")
    return value


# -- waiting -------------------------------------------------------------------------------------
def _budget_ns(timeout: object) -> float:
    """The most ns a wait may take: ``timeout`` and the current deadline, whichever is less."""
    budget = math.inf if timeout is None else seconds_to_ns(timeout, "timeout")
    d = current_deadline()
    if d is not None:
        budget = min(budget, max(0, d.remaining_ns()))
    return budget


def _refuse(name: str | None, wait_ns: int, weight: int) -> RateLimitedError:
    return RateLimitedError(name, wait_ns / 1e9, weight)


def acquire(target: Any, key: Any, weight: int, timeout: object) -> None:
    """Sleep until ``target`` (a limiter, or a map with ``key``) admits ``weight``; raise
    ``RateLimitedError`` at once when the wait would outlast ``timeout`` or the deadline."""
    args = (weight,) if key is _NOKEY else (key, weight)
    if target.try_acquire(*args):
        return
    budget = _budget_ns(timeout)
    start = target._now()
    waited = False
    while True:
        wait_ns = target._retry_after_ns(*args)
        if wait_ns > budget - (target._now() - start):
            raise _refuse(target.name, wait_ns, weight)
        if not waited:
            waited = True
            target._count_wait()
        time.sleep(wait_ns / 1e9)
        if target.try_acquire(*args):
            return


_NOKEY: Any = object()


async def acquire_async(target: Any, key: Any, weight: int, timeout: object) -> None:
    """Await admission in arrival order (see the module docstring)."""
    args = (weight,) if key is _NOKEY else (key, weight)
    queues: dict[Any, collections.deque[list[Any]]] = target._queues
    q = queues.get(key)
    if not q and target.try_acquire(*args):
        return
    budget = _budget_ns(timeout)
    ahead = sum(e[1] for e in q) if q else 0
    wait_ns = target._retry_after_ns(*args) + ahead * target._max_interval
    if wait_ns > budget:
        raise _refuse(target.name, wait_ns, weight)
    loop = asyncio.get_running_loop()
    start = target._now()
    if q is None:
        q = queues[key] = collections.deque()
    entry: list[Any] = [loop.create_future(), weight]
    q.append(entry)
    target._count_wait()
    try:
        while True:
            left = budget - (target._now() - start)
            if q[0] is not entry:
                await asyncio.wait_for(entry[0], None if math.isinf(left) else left / 1e9)
                continue
            if target.try_acquire(*args):
                return
            wait_ns = target._retry_after_ns(*args)
            if wait_ns > left:
                raise _refuse(target.name, wait_ns, weight)
            await asyncio.sleep(wait_ns / 1e9)
    except asyncio.TimeoutError:
        raise _refuse(target.name, target._retry_after_ns(*args), weight) from None
    finally:
        _leave(queues, key, q, entry)


def _leave(queues: dict[Any, Any], key: Any, q: collections.deque[list[Any]], entry: Any) -> None:
    was_head = q and q[0] is entry
    q.remove(entry)
    if not q:
        if queues.get(key) is q:
            del queues[key]
    elif was_head and not q[0][0].done():
        q[0][0].set_result(None)  # the next waiter's one wake-up


def enter(target: Any) -> None:
    """``with limiter:`` and the decorator: charge 1 now or raise RateLimitedError."""
    if not target.try_acquire(1):
        raise _refuse(target.name, target._retry_after_ns(1), 1)


def call(target: Any, key: Any, fn: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    a = (1,) if key is _NOKEY else (key, 1)
    if not target.try_acquire(*a):
        raise _refuse(target.name, target._retry_after_ns(*a), 1)
    return fn(*args, **kwargs)


async def call_async(
    target: Any, key: Any, fn: Callable[..., Awaitable[Any]], args: Any, kwargs: Any
) -> Any:
    a = (1,) if key is _NOKEY else (key, 1)
    if not target.try_acquire(*a):
        raise _refuse(target.name, target._retry_after_ns(*a), 1)
    return await fn(*args, **kwargs)


def decorate(target: Any, fn: _F) -> _F:
    """``@limiter``: each call of ``fn`` (sync or async) charges 1 or raises RateLimitedError."""
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            enter(target)
            return await fn(*args, **kwargs)

        return async_wrapper  # type: ignore[return-value]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        enter(target)
        return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


# -- the map's rare steps ------------------------------------------------------------------------
def evict(m: Any, now: int) -> None:
    """Make room in a full map (its lock held): drop every idle key (every TAT <= ``now``: no
    information lost), then, if that freed less than 1/16 of ``max_keys``, the least recently
    used until it has. Batches keep eviction O(1) amortised per new key."""
    d = m._d
    want = max(1, m._max_keys // 16)
    idle = [k for k, e in d.items() if m._idle(e, now)]
    for k in idle:
        del d[k]
    freed = len(idle)
    if freed < want and d:
        for k in heapq.nsmallest(want - freed, d, key=lambda k: m._last_used(d[k])):
            del d[k]
            freed += 1
    m._evicted += freed


def new_lock() -> threading.RLock:
    return threading.RLock()
