"""A storage for the ``limits`` library in a ``SharedRegion``: one count for every process of a host.

Importing this module registers the URI scheme ``fastbreaker+shm://NAME`` with ``limits``, so
``limits.storage.storage_from_string("fastbreaker+shm://NAME?capacity=4096")`` (and so
flask-limiter's ``storage_uri`` or slowapi's) gives every worker the same counters, without Redis.
See docs/integrations/limits.md.
"""

from __future__ import annotations

import time
import urllib.parse
from math import floor
from typing import Callable, Optional

from limits.aio import storage as aio
from limits.storage import MovingWindowSupport, SlidingWindowCounterSupport, Storage
from limits.storage.base import TimestampedSlidingWindow

from .. import SharedRegion, SharedStateTimeout
from .._region import SharedRegion as AnyRegion
from .._region_limits import SharedCounters, check_table, encode, region_size

__all__ = ["SCHEME", "AsyncSharedRegionStorage", "SharedRegionStorage"]

SCHEME = "fastbreaker+shm"
DEFAULT_CAPACITY = 4096
DEFAULT_WINDOW = 128
_OPTIONS = ("capacity", "window")


def _parse(uri: str) -> tuple[str, dict[str, int]]:
    """The region's name and the table options of a ``fastbreaker+shm://NAME?...`` URI."""
    if not isinstance(uri, str):
        raise TypeError(f"uri must be a str 'fastbreaker+shm://NAME', got {uri!r}")
    parts = urllib.parse.urlsplit(uri)
    name = urllib.parse.unquote(parts.netloc)
    if parts.scheme != SCHEME or not name or parts.path not in ("", "/") or parts.fragment:
        raise ValueError(
            f"uri must be 'fastbreaker+shm://NAME' with optional '?capacity=N&window=N' "
            f"(NAME: the shared region's name), got {uri!r}"
        )
    options: dict[str, int] = {}
    for key, value in urllib.parse.parse_qsl(parts.query, keep_blank_values=True):
        if key not in _OPTIONS:
            raise ValueError(f"uri option {key!r} is not one of {', '.join(_OPTIONS)} ({uri!r})")
        try:
            options[key] = int(value)
        except ValueError:
            raise ValueError(f"uri option {key} must be an int, got {value!r} ({uri!r})") from None
    return name, options


class SharedRegionStorage(
    Storage, MovingWindowSupport, SlidingWindowCounterSupport, TimestampedSlidingWindow
):
    """A ``limits`` storage whose counters live in a ``SharedRegion``: fixed window, moving
    window and sliding window counter, one count for every process that names the region.

    Made by ``limits.storage.storage_from_string(uri, **options)`` (or directly) with ``uri``
    ``fastbreaker+shm://NAME?capacity=4096&window=128``. NAME is the region: attached if it
    exists, else created with the size the table needs. ``capacity`` (URI or keyword, default
    4096, in [8, 2**22]): the keys held; a new key takes a slot from an expired one first, else
    the one expiring soonest (its count is forgotten: size ``capacity`` above the keys live in
    one window). ``window`` (default 128, in [1, 65536]): the largest limit the moving window
    strategy can enforce (each key's slot keeps that many timestamps: 280 + 8 x window bytes).
    Every process must ask with the same ``capacity`` and ``window`` (else ``ValueError``).

    ``region``: an open ``SharedRegion`` named NAME to use instead (a region whose other
    objects the application shares, or one of a given core). ``clock``: the wall clock in
    seconds, ``time.time`` by default (``limits`` reports expiries as wall times); every
    process must read the same clock. ``wrap_exceptions``: raise ``limits.errors.StorageError``
    for a ``SharedStateTimeout`` (a process stopped while holding a bucket's lock).
    """

    STORAGE_SCHEME = [SCHEME]

    def __init__(
        self,
        uri: str,
        wrap_exceptions: bool = False,
        *,
        capacity: Optional[int] = None,
        window: Optional[int] = None,
        region: Optional[AnyRegion] = None,
        clock: Optional[Callable[[], float]] = None,
    ) -> None:
        name, options = _parse(uri)
        for key, value in (("capacity", capacity), ("window", window)):
            if value is not None:
                if key in options and options[key] != value:
                    raise ValueError(f"{key} is given twice: {value!r}, and {options[key]} in uri")
                options[key] = value
        cap, win = check_table(
            options.get("capacity", DEFAULT_CAPACITY), options.get("window", DEFAULT_WINDOW)
        )
        if clock is not None and not callable(clock):
            raise TypeError(f"clock must be a zero-argument callable or None, got {clock!r}")
        if region is None:
            try:
                region = SharedRegion(name, create=False)
            except FileNotFoundError:
                region = SharedRegion(name, size=region_size(cap, win))
        elif not isinstance(region, AnyRegion):
            raise TypeError(f"region must be a SharedRegion or None, got {region!r}")
        elif region.name != name:
            raise ValueError(f"region is {region.name!r}, and the uri names {name!r}")
        self._region = region
        self._table = SharedCounters(region, cap, win)
        self._clock: Callable[[], float] = clock or time.time
        super().__init__(uri, wrap_exceptions=wrap_exceptions)

    @property
    def base_exceptions(self) -> type[Exception] | tuple[type[Exception], ...]:
        """What ``wrap_exceptions`` turns into ``StorageError``: ``SharedStateTimeout``."""
        return SharedStateTimeout

    @property
    def region(self) -> AnyRegion:
        """The ``SharedRegion`` that holds the counters."""
        return self._region

    @property
    def capacity(self) -> int:
        """The most keys held at once (a multiple of 8)."""
        return self._table.slots

    @property
    def window(self) -> int:
        """The largest limit the moving window strategy can enforce."""
        return self._table.window

    def stats(self) -> tuple[int, int]:
        """``(keys held, keys evicted before they expired)``, over every process."""
        return self._table.stats()

    # -- fixed window --------------------------------------------------------------------------------
    def incr(self, key: str, expiry: float, amount: int = 1) -> int:
        """Add ``amount`` to the counter of ``key`` (a new counter expires ``expiry`` seconds
        from now); the count."""
        return self._table.incr(encode(b"c", key), expiry, amount, self._clock())

    def decr(self, key: str, amount: int = 1) -> int:
        """Take ``amount`` from the live counter of ``key``, not below 0; the count."""
        return self._table.decr(encode(b"c", key), amount, self._clock())

    def get(self, key: str) -> int:
        """The live count of ``key`` (0 once it expired)."""
        return self._table.get(encode(b"c", key), self._clock())[0]

    def get_expiry(self, key: str) -> float:
        """When the counter of ``key`` expires (wall time in seconds; now if it has none)."""
        return self._table.get(encode(b"c", key), self._clock())[1]

    def clear(self, key: str) -> None:
        """Forget the counter and the moving window of ``key``."""
        self._table.clear(encode(b"c", key))
        self._table.clear(encode(b"w", key))

    def check(self) -> bool:
        """Whether the region is usable (open in this process)."""
        try:
            return self._region.size > 0
        except ValueError:
            return False

    def reset(self) -> int:
        """Forget every key of the table (every process's); how many there were."""
        return self._table.reset()

    # -- moving window -------------------------------------------------------------------------------
    def acquire_entry(self, key: str, limit: int, expiry: int, amount: int = 1) -> bool:
        """Add ``amount`` entries to the moving window of ``key`` if at most ``limit`` are then
        younger than ``expiry`` seconds; whether it did. ``limit`` is at most ``window``."""
        if amount > limit:
            return False
        if limit > self._table.window:
            raise ValueError(
                f"limit must be at most the storage's window={self._table.window} for the "
                f"moving window strategy, got {limit}: raise window in the uri "
                "(fastbreaker+shm://NAME?window=N, in every process)"
            )
        return self._table.acquire(encode(b"w", key), limit, expiry, amount, self._clock())

    def get_moving_window(self, key: str, limit: int, expiry: int) -> tuple[float, int]:
        """``(the oldest entry's time, the entries)`` of the moving window of ``key`` over the
        last ``expiry`` seconds (``limit`` is not used)."""
        return self._table.moving_window(encode(b"w", key), expiry, self._clock())

    # -- sliding window counter ----------------------------------------------------------------------
    def acquire_sliding_window_entry(
        self, key: str, limit: int, expiry: int, amount: int = 1
    ) -> bool:
        """Count ``amount`` in the current window of ``key`` if the weighted count of the
        previous and current windows stays at most ``limit`` (``expiry``: the window, s)."""
        if amount > limit:
            return False
        now = self._clock()
        previous, current = self.sliding_window_keys(key, expiry, now)
        prev_count, prev_ttl, count, _ = self._sliding(previous, current, expiry, now)
        if floor(prev_count * prev_ttl / expiry + count) + amount > limit:
            return False
        count = self._table.incr(encode(b"c", current), 2 * expiry, amount, now)
        if floor(prev_count * prev_ttl / expiry + count) > limit:
            # another process counted first: take ours back (each incr is atomic, so the
            # weighted count never passes the limit; a race may refuse both)
            self._table.decr(encode(b"c", current), amount, now)
            return False
        return True

    def _sliding(
        self, previous: str, current: str, expiry: int, now: float
    ) -> tuple[int, float, int, float]:
        prev_count = self._table.get(encode(b"c", previous), now)[0]
        count = self._table.get(encode(b"c", current), now)[0]
        prev_ttl = 0.0 if prev_count == 0 else (1 - (((now - expiry) / expiry) % 1)) * expiry
        return prev_count, prev_ttl, count, (1 - ((now / expiry) % 1)) * expiry + expiry

    def get_sliding_window(self, key: str, expiry: int) -> tuple[int, float, int, float]:
        """``(previous count, previous ttl, current count, current ttl)`` of ``key``'s sliding
        window of ``expiry`` seconds."""
        now = self._clock()
        return self._sliding(*self.sliding_window_keys(key, expiry, now), expiry, now)

    def clear_sliding_window(self, key: str, expiry: int) -> None:
        """Forget both windows of ``key``'s sliding window of ``expiry`` seconds."""
        for k in self.sliding_window_keys(key, expiry, self._clock()):
            self._table.clear(encode(b"c", k))

    def __repr__(self) -> str:
        return f"<SharedRegionStorage {self._region.name!r} capacity={self.capacity}>"


class AsyncSharedRegionStorage(
    aio.Storage, aio.MovingWindowSupport, aio.SlidingWindowCounterSupport
):
    """``SharedRegionStorage`` for ``limits.aio``: ``uri`` is
    ``async+fastbreaker+shm://NAME?capacity=N&window=N``; ``wrap_exceptions``, ``capacity``,
    ``window``, ``region`` and ``clock`` as there. The same counters: a sync and an async
    storage of one region share them (``sync`` is the sync one). Each call runs at once, in
    the event loop: it takes microseconds, but waits (up to the region's lock bounds) while
    another process holds the key's bucket."""

    STORAGE_SCHEME = ["async+" + SCHEME]

    def __init__(
        self,
        uri: str,
        wrap_exceptions: bool = False,
        *,
        capacity: Optional[int] = None,
        window: Optional[int] = None,
        region: Optional[AnyRegion] = None,
        clock: Optional[Callable[[], float]] = None,
    ) -> None:
        if not isinstance(uri, str) or not uri.startswith("async+"):
            raise ValueError(f"uri must be 'async+fastbreaker+shm://NAME', got {uri!r}")
        self.sync = SharedRegionStorage(
            uri[len("async+") :], capacity=capacity, window=window, region=region, clock=clock
        )
        super().__init__(uri, wrap_exceptions=wrap_exceptions)

    @property
    def base_exceptions(self) -> type[Exception] | tuple[type[Exception], ...]:
        """What ``wrap_exceptions`` turns into ``StorageError``: ``SharedStateTimeout``."""
        return SharedStateTimeout

    async def incr(self, key: str, expiry: float, amount: int = 1) -> int:
        """``SharedRegionStorage.incr`` (``key``, ``expiry``, ``amount``)."""
        return self.sync.incr(key, expiry, amount)

    async def decr(self, key: str, amount: int = 1) -> int:
        """``SharedRegionStorage.decr`` (``key``, ``amount``)."""
        return self.sync.decr(key, amount)

    async def get(self, key: str) -> int:
        """``SharedRegionStorage.get`` (``key``)."""
        return self.sync.get(key)

    async def get_expiry(self, key: str) -> float:
        """``SharedRegionStorage.get_expiry`` (``key``)."""
        return self.sync.get_expiry(key)

    async def check(self) -> bool:
        """``SharedRegionStorage.check``."""
        return self.sync.check()

    async def reset(self) -> int:
        """``SharedRegionStorage.reset``."""
        return self.sync.reset()

    async def clear(self, key: str) -> None:
        """``SharedRegionStorage.clear`` (``key``)."""
        self.sync.clear(key)

    async def acquire_entry(self, key: str, limit: int, expiry: int, amount: int = 1) -> bool:
        """``SharedRegionStorage.acquire_entry`` (``key``, ``limit``, ``expiry``, ``amount``)."""
        return self.sync.acquire_entry(key, limit, expiry, amount)

    async def get_moving_window(self, key: str, limit: int, expiry: int) -> tuple[float, int]:
        """``SharedRegionStorage.get_moving_window`` (``key``, ``limit``, ``expiry``)."""
        return self.sync.get_moving_window(key, limit, expiry)

    async def acquire_sliding_window_entry(
        self, key: str, limit: int, expiry: int, amount: int = 1
    ) -> bool:
        """``SharedRegionStorage.acquire_sliding_window_entry`` (``key``, ``limit``,
        ``expiry``, ``amount``)."""
        return self.sync.acquire_sliding_window_entry(key, limit, expiry, amount)

    async def get_sliding_window(self, key: str, expiry: int) -> tuple[int, float, int, float]:
        """``SharedRegionStorage.get_sliding_window`` (``key``, ``expiry``)."""
        return self.sync.get_sliding_window(key, expiry)

    async def clear_sliding_window(self, key: str, expiry: int) -> None:
        """``SharedRegionStorage.clear_sliding_window`` (``key``, ``expiry``)."""
        self.sync.clear_sliding_window(key, expiry)
