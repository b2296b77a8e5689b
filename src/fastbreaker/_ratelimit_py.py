"""RateLimiter and RateLimiterMap, the pure-Python reference twin: the spec ``_ratelimit_c`` follows.

GCRA over one theoretical-arrival-time word per rate (see ``_ratelimit``): a request of weight
``w`` at ``now`` is admitted iff every rate has ``max(TAT, now) + w*T - now <= tau``; then every
rate's ``TAT = max(TAT, now) + w*T``. All or nothing: a refused request charges no rate. Here a
lock makes the check and the charges of all rates one step; the compiled core does the same with
one compare-and-swap per word (and gives back earlier words when a later one refuses).
"""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Awaitable, Callable, Hashable
from contextlib import AbstractContextManager
from typing import Any, TypeVar, final

from . import _ratelimit as _rl
from ._durations import check_clock, read_clock
from ._errors import not_copyable
from ._keywords import checks_keywords
from ._ratelimit import Rate, RateLimiterMapMetrics, RateLimiterMetrics, RateSpec

__all__ = [
    "RateLimiter",
    "RateLimiterMap",
    "map_block_size",
    "map_slot_read",
    "map_slot_reset",
    "shared_init",
    "shared_size",
]

_F = TypeVar("_F", bound=Callable[..., Any])
_R = TypeVar("_R")


def _admit(tat: list[int], t: list[int], tau: list[int], w: int, now: int) -> bool:
    n = len(t)
    for i in range(n):
        if max(tat[i], now) + w * t[i] - now > tau[i]:
            return False
    for i in range(n):
        tat[i] = max(tat[i], now) + w * t[i]
    return True


def _wait_ns(tat: list[int], t: list[int], tau: list[int], w: int, now: int) -> int:
    return max(0, *(max(tat[i], now) + w * t[i] - tau[i] - now for i in range(len(t))))


def _refund(tat: list[int], t: list[int], w: int, now: int) -> None:
    # Never below now: a refund cannot leave more capacity than a fresh limiter has.
    for i in range(len(t)):
        if tat[i] > now:
            tat[i] = max(tat[i] - w * t[i], now)


def _refund_step(tat: list[int], t: list[int], w: int, now: int) -> int:
    _refund(tat, t, w, now)
    return 0


class _RateLayout:
    """A shared limiter's record in a SharedRegion: its TAT words (little-endian int64)."""

    __slots__ = ("size", "_struct")

    def __init__(self, n: int) -> None:
        self._struct = struct.Struct(f"<{n}q")
        self.size = self._struct.size

    def load(self, lim: RateLimiter, data: bytes) -> None:
        lim._tat = list(self._struct.unpack(data))

    def pack(self, lim: RateLimiter) -> bytes:
        return self._struct.pack(*lim._tat)


def shared_size(n: int) -> int:
    """The bytes of a shared limiter of ``n`` rates in a SharedRegion."""
    from ._region import SharedRecord

    return SharedRecord.footprint(8 * n)


def shared_init(view: memoryview, n: int) -> None:
    """A new shared limiter: every TAT 0 (fresh). The region's memory is zeroed already."""


def map_block_size(n: int) -> int:
    """The bytes of one key of a shared RateLimiterMap of ``n`` rates: its last-used time and
    TAT words, as a ``SharedRecord``."""
    from ._region import SharedRecord

    return SharedRecord.footprint(8 * (n + 1))


def map_slot_read(view: memoryview, n: int) -> tuple[int, ...]:
    """A shared map key's last-used time, then its TATs (exact under its slot's lock)."""
    from ._region import SharedRecord

    return struct.unpack(f"<{n + 1}q", SharedRecord(view, 8 * (n + 1)).load())


def map_slot_reset(view: memoryview, n: int, now: int) -> None:
    """A fresh key (every TAT 0), last used at ``now``; under its slot's lock."""
    from ._region import SharedRecord

    SharedRecord(view, 8 * (n + 1)).store(struct.pack(f"<{n + 1}q", now, *[0] * n))


def map_slot_write(view: memoryview, last: int, tat: list[int]) -> None:
    from ._region import SharedRecord

    SharedRecord(view, 8 * (len(tat) + 1)).store(struct.pack(f"<{len(tat) + 1}q", last, *tat))


class _Slot:
    """A shared map's key as cached by this process: its slot and the tag it had."""

    __slots__ = ("slot", "tag")

    def __init__(self, slot: int, tag: int) -> None:
        self.slot = slot
        self.tag = tag


class _Config:
    """What every key of a map (or one limiter) shares: the rates and the clock."""

    __slots__ = ("rates", "t", "tau", "max_weight", "max_interval", "clock", "name")

    def __init__(
        self, rates: tuple[RateSpec, ...], name: str | None, clock: Callable[[], int] | None
    ) -> None:
        self.rates, self.t, self.tau = _rl.rates_config(rates)
        _rl.check_name(name)
        check_clock(clock)
        self.max_weight = min(tau // t for t, tau in zip(self.t, self.tau))
        self.max_interval = max(self.t)
        self.clock: Callable[[], int] = time.monotonic_ns if clock is None else clock
        self.name = name

    def weight(self, w: object) -> int:
        if type(w) is not int or not 1 <= w <= self.max_weight:
            raise _rl.bad_weight(self, w)
        return w


@final
@checks_keywords
class RateLimiter:
    """A GCRA rate limiter over one or more ``rates`` (``Rate`` objects or strings such as
    ``"10/s"``), all of which must admit a request (all or nothing). ``name`` labels it in
    errors; ``clock`` (a zero-argument callable returning int ns, such as
    ``fastbreaker.testing.FakeClock``) replaces the monotonic clock."""

    __slots__ = ("_cfg", "_tat", "_lock", "_counts", "_queues", "__weakref__")

    def __init_subclass__(cls, **kwargs: object) -> None:
        raise TypeError("RateLimiter cannot be subclassed")

    def __init__(
        self, *rates: RateSpec, name: str | None = None, clock: Callable[[], int] | None = None
    ) -> None:
        self._cfg = _Config(rates, name, clock)
        self._tat = [0] * len(self._cfg.t)
        self._lock: AbstractContextManager[Any] = threading.Lock()
        self._counts = [0, 0, 0, 0, 0]  # admitted, rejected, admitted units, rejected units, waits
        self._queues: dict[Any, Any] = {}

    @classmethod
    def _shared(
        cls,
        rates: tuple[RateSpec, ...],
        name: str | None,
        clock: Callable[[], int] | None,
        view: memoryview,
        lock: AbstractContextManager[Any],
    ) -> RateLimiter:
        """A limiter whose TAT words live in ``view`` (a SharedRegion's record), guarded by the
        region's ``lock``; its counts stay in this process."""
        from ._breaker_shared_py import SharedState

        self = cls(*rates, name=name, clock=clock)
        self._lock = SharedState(self, view, lock, _RateLayout(len(self._cfg.t)))
        return self

    def __copy__(self) -> object:
        raise not_copyable(self)

    def __deepcopy__(self, memo: object) -> object:
        raise not_copyable(self)

    def __reduce_ex__(self, protocol: object) -> tuple[object, ...]:
        raise not_copyable(self)

    @property
    def rates(self) -> tuple[Rate, ...]:
        """The limiter's rates."""
        return self._cfg.rates

    @property
    def name(self) -> str | None:
        """The limiter's name (None if not given)."""
        return self._cfg.name

    @property
    def _max_interval(self) -> int:
        return self._cfg.max_interval

    def _now(self) -> int:
        return read_clock(self._cfg.clock)

    def try_acquire(self, weight: int = 1) -> bool:
        """Admit ``weight`` units now and charge every rate (True), or charge nothing (False)."""
        cfg = self._cfg
        w = cfg.weight(weight)
        now = read_clock(cfg.clock)
        c = self._counts
        with self._lock:
            if _admit(self._tat, cfg.t, cfg.tau, w, now):
                c[0] += 1
                c[2] += w
                return True
            c[1] += 1
            c[3] += w
            return False

    def _retry_after_ns(self, weight: int = 1) -> int:
        cfg = self._cfg
        w = cfg.weight(weight)
        now = read_clock(cfg.clock)
        with self._lock:
            return _wait_ns(self._tat, cfg.t, cfg.tau, w, now)

    def retry_after(self, weight: int = 1) -> float:
        """Seconds until ``try_acquire(weight)`` would succeed; 0.0 if it would now."""
        return self._retry_after_ns(weight) / 1e9

    def refund(self, weight: int) -> None:
        """Give ``weight`` units back to every rate (a cost known only after the call); never
        leaves a rate with more capacity than a fresh limiter."""
        cfg = self._cfg
        w = cfg.weight(weight)
        now = read_clock(cfg.clock)
        with self._lock:
            _refund(self._tat, cfg.t, w, now)

    def _count_wait(self) -> None:
        with self._lock:
            self._counts[4] += 1

    def metrics(self) -> RateLimiterMetrics:
        """Requests and units admitted and rejected, and the number of waits, so far."""
        with self._lock:
            return RateLimiterMetrics(*self._counts)

    def acquire(self, weight: int = 1, *, timeout: float | None = None) -> None:
        """Sleep until ``weight`` units are admitted. ``RateLimitedError`` at once if the wait
        would outlast ``timeout`` (seconds) or the current deadline."""
        _rl.acquire(self, _rl._NOKEY, self._cfg.weight(weight), timeout)

    async def acquire_async(self, weight: int = 1, *, timeout: float | None = None) -> None:
        """As ``acquire(weight, timeout=timeout)``, awaiting; waiters are served in arrival
        order."""
        await _rl.acquire_async(self, _rl._NOKEY, self._cfg.weight(weight), timeout)

    def __enter__(self) -> RateLimiter:
        _rl.enter(self)
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    async def __aenter__(self) -> RateLimiter:
        _rl.enter(self)
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    def call(self, fn: Callable[..., _R], /, *args: Any, **kwargs: Any) -> _R:
        """``fn(*args, **kwargs)`` if one unit is admitted now, else ``RateLimitedError``."""
        return _rl.call(self, _rl._NOKEY, fn, args, kwargs)  # type: ignore[no-any-return]

    async def call_async(
        self, fn: Callable[..., Awaitable[_R]], /, *args: Any, **kwargs: Any
    ) -> _R:
        """``await fn(*args, **kwargs)`` if one unit is admitted now, else ``RateLimitedError``."""
        return await _rl.call_async(self, _rl._NOKEY, fn, args, kwargs)  # type: ignore[no-any-return]

    def __call__(self, fn: _F) -> _F:
        """``@limiter`` on a function ``fn`` (sync or async): every call charges one unit or
        raises ``RateLimitedError``."""
        return _rl.decorate(self, fn)

    def __repr__(self) -> str:
        rates = ", ".join(repr(r) for r in self._cfg.rates)
        return f"RateLimiter({rates}, name={self._cfg.name!r})"


@final
@checks_keywords
class RateLimiterMap:
    """One GCRA limiter per key over the same ``rates``, at most ``max_keys`` of them: a full
    map evicts idle keys (every rate's TAT in the past: nothing is lost) first, then the least
    recently used (whose debt is forgotten). ``name`` and ``clock`` as for ``RateLimiter``."""

    __slots__ = (
        "_cfg",
        "_d",
        "_max_keys",
        "_lock",
        "_evicted",
        "_counts",
        "_queues",
        "_shared",
        "__weakref__",
    )

    def __init_subclass__(cls, **kwargs: object) -> None:
        raise TypeError("RateLimiterMap cannot be subclassed")

    def __init__(
        self,
        *rates: RateSpec,
        max_keys: int = 10_000,
        name: str | None = None,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self._cfg = _Config(rates, name, clock)
        self._max_keys = _rl.check_max_keys(max_keys)
        self._d: dict[Hashable, list[int]] = {}
        self._lock = threading.RLock()
        self._evicted = 0
        self._counts = [0, 0]
        self._queues: dict[Any, Any] = {}
        self._shared: Any = None  # a shared map's SharedKeys (_region_ratelimit), else None

    def _attach(self, keys: Any) -> None:
        """A map in a SharedRegion: its keys and their words live in ``keys``' table."""
        self._shared = keys
        self._d = {}

    def __copy__(self) -> object:
        raise not_copyable(self)

    def __deepcopy__(self, memo: object) -> object:
        raise not_copyable(self)

    def __reduce_ex__(self, protocol: object) -> tuple[object, ...]:
        raise not_copyable(self)

    @property
    def rates(self) -> tuple[Rate, ...]:
        """The rates every key gets."""
        return self._cfg.rates

    @property
    def name(self) -> str | None:
        """The map's name (None if not given)."""
        return self._cfg.name

    @property
    def max_keys(self) -> int:
        """The most keys the map holds."""
        return self._max_keys

    @property
    def _max_interval(self) -> int:
        return self._cfg.max_interval

    def _now(self) -> int:
        return read_clock(self._cfg.clock)

    def _idle(self, e: list[int], now: int) -> bool:
        return all(x <= now for x in e[:-1])

    def _last_used(self, e: list[int]) -> int:
        return e[-1]

    def _entry(self, key: Hashable, now: int) -> list[int]:
        e = self._d.get(key)
        if e is None:
            if len(self._d) >= self._max_keys:
                _rl.evict(self, now)
            e = self._d[key] = [0] * (len(self._cfg.t) + 1)
        e[-1] = now
        return e

    def try_acquire(self, key: Hashable, weight: int = 1) -> bool:
        """Admit ``weight`` units for ``key`` now (True) or charge nothing (False)."""
        cfg = self._cfg
        w = cfg.weight(weight)
        now = read_clock(cfg.clock)
        with self._lock:
            if self._shared is not None:
                ok = self._shared_step(key, now, lambda tat: _admit(tat, cfg.t, cfg.tau, w, now))
            else:
                ok = _admit(self._entry(key, now), cfg.t, cfg.tau, w, now)
            self._counts[0 if ok else 1] += 1
            return ok

    def _shared_step(self, key: Any, now: int, step: Callable[[list[int]], _R]) -> _R:
        """``step(tat)`` on a shared key's TATs under its slot's lock, the key inserted if
        absent; its last-used time set to ``now``."""
        keys = self._shared
        d: dict[Any, Any] = self._d
        while True:
            e = d.get(key)
            if e is None or keys.tag(e.slot) != e.tag:
                e = _Slot(*keys.bind(key, now))
                keys.remember(d, key, e)
            with keys.lock_for(e.slot):
                if keys.tag(e.slot) != e.tag:
                    continue  # evicted since: bind again
                tat = list(keys.words(e.slot)[1:])
                out = step(tat)
                map_slot_write(keys.slot_view(e.slot), now, tat)
                return out

    def _shared_read(self, key: Any, step: Callable[[list[int]], int]) -> int:
        """``step(tat)`` on a shared key's TATs under its slot's lock; 0 for an absent key."""
        keys = self._shared
        d: dict[Any, Any] = self._d
        while True:
            e = d.get(key)
            if e is None or keys.tag(e.slot) != e.tag:
                found = keys.find(key)
                if found is None:
                    return 0
                e = _Slot(*found)
                keys.remember(d, key, e)
            with keys.lock_for(e.slot):
                if keys.tag(e.slot) != e.tag:
                    continue
                words = keys.words(e.slot)
                tat = list(words[1:])
                out = step(tat)
                if tat != list(words[1:]):
                    map_slot_write(keys.slot_view(e.slot), words[0], tat)
                return out

    def _retry_after_ns(self, key: Hashable, weight: int = 1) -> int:
        cfg = self._cfg
        w = cfg.weight(weight)
        now = read_clock(cfg.clock)
        with self._lock:
            if self._shared is not None:
                return self._shared_read(key, lambda tat: _wait_ns(tat, cfg.t, cfg.tau, w, now))
            e = self._d.get(key)
            return 0 if e is None else _wait_ns(e, cfg.t, cfg.tau, w, now)

    def retry_after(self, key: Hashable, weight: int = 1) -> float:
        """Seconds until ``try_acquire(key, weight)`` would succeed; 0.0 if now."""
        return self._retry_after_ns(key, weight) / 1e9

    def refund(self, key: Hashable, weight: int) -> None:
        """Give ``weight`` units back to ``key``'s rates (no-op for an unknown key)."""
        cfg = self._cfg
        w = cfg.weight(weight)
        now = read_clock(cfg.clock)
        with self._lock:
            if self._shared is not None:
                self._shared_read(key, lambda tat: _refund_step(tat, cfg.t, w, now))
                return
            e = self._d.get(key)
            if e is not None:
                _refund(e, cfg.t, w, now)

    def _count_wait(self) -> None:
        return None

    def acquire(self, key: Hashable, weight: int = 1, *, timeout: float | None = None) -> None:
        """Sleep until ``key`` admits ``weight`` units; ``RateLimitedError`` at once if the wait
        would outlast ``timeout`` (seconds) or the current deadline."""
        _rl.acquire(self, key, self._cfg.weight(weight), timeout)

    async def acquire_async(
        self, key: Hashable, weight: int = 1, *, timeout: float | None = None
    ) -> None:
        """As ``acquire(key, weight, timeout=timeout)``, awaiting; waiters of one key are
        served in arrival order."""
        await _rl.acquire_async(self, key, self._cfg.weight(weight), timeout)

    def call(self, key: Hashable, fn: Callable[..., _R], /, *args: Any, **kwargs: Any) -> _R:
        """``fn(*args, **kwargs)`` if ``key`` admits one unit now, else ``RateLimitedError``."""
        return _rl.call(self, key, fn, args, kwargs)  # type: ignore[no-any-return]

    async def call_async(
        self, key: Hashable, fn: Callable[..., Awaitable[_R]], /, *args: Any, **kwargs: Any
    ) -> _R:
        """``await fn(*args, **kwargs)`` if ``key`` admits one unit now, else
        ``RateLimitedError``."""
        return await _rl.call_async(self, key, fn, args, kwargs)  # type: ignore[no-any-return]

    def __len__(self) -> int:
        return len(self._d) if self._shared is None else len(self._shared)

    def __contains__(self, key: object) -> bool:
        if self._shared is None:
            return key in self._d
        return bool(self._shared.contains(key))

    def metrics(self) -> RateLimiterMapMetrics:
        """Keys held now, keys evicted, and requests admitted and rejected so far."""
        with self._lock:
            if self._shared is not None:
                keys = self._shared
                return RateLimiterMapMetrics(len(keys), keys.evicted, *self._counts)
            return RateLimiterMapMetrics(len(self._d), self._evicted, *self._counts)

    def __repr__(self) -> str:
        rates = ", ".join(repr(r) for r in self._cfg.rates)
        return f"RateLimiterMap({rates}, max_keys={self._max_keys}, keys={len(self)})"
