"""Counters and moving windows in a SharedRegion: the shared state of ``contrib.limits``.

A fixed table of ``capacity`` keys in buckets of ``WAYS`` slots (set-associative: a key lives
only in the bucket its hash picks, so a lookup reads at most ``WAYS`` slots and a bucket is the
unit of locking: the region's record lock at the bucket's offset, which the kernel drops when
its holder dies). Times are the caller's wall-clock seconds (float), as ``limits`` expects.

A slot, in int64 words::

    0  hash of the key (0: empty)        1  key length     2..30  key bytes (KEY_BYTES)
    31 counter                           32 expiry (a double: the counter's, or the newest
                                            moving-window entry's)
    33 ring: first entry | count << 32   34.. the moving window's entries (doubles), ``window``

Crash safety without a journal: every change is made under the bucket's lock and is published
by one aligned 8-byte store written last. A new key empties its slot (hash 0) before writing
the key and writes its hash last; a moving window writes its new entries in free ring cells,
then the ring word. A process killed at any point leaves the previous state, or an empty slot.
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable

from ._durations import check_count
from ._region import KIND_LIMITS

__all__ = ["KEY_BYTES", "MAX_WINDOW", "WAYS", "SharedCounters", "encode", "region_size"]

WAYS = 8
KEY_BYTES = 232
MAX_CAPACITY = 1 << 22
MAX_WINDOW = 1 << 16
_HASH, _LEN, _KEY, _COUNT, _EXPIRY, _RING, _ENTRIES = 0, 1, 2, 31, 32, 33, 34
_HEADER = 8  # words: the table's header, and each bucket's (word 0: keys evicted while live)
_OBJECT = "limits"
_LAYOUT = 1


def encode(kind: bytes, key: object) -> bytes:
    """The key as stored: ``kind`` (b"c" counter, b"w" moving window), then its UTF-8; a longer
    key than KEY_BYTES is stored as its 32-byte blake2b digest (kind in upper case)."""
    if not isinstance(key, str):
        raise TypeError(f"a rate limit key must be a str, got {key!r}")
    raw = kind + key.encode("utf-8")
    if len(raw) > KEY_BYTES:
        raw = kind.upper() + hashlib.blake2b(raw[1:], digest_size=32).digest()
    return raw


def _slot_words(window: int) -> int:
    return _ENTRIES + window


def _buckets(capacity: int) -> int:
    return (capacity + WAYS - 1) // WAYS


def table_size(capacity: int, window: int) -> int:
    """The bytes of a table of ``capacity`` keys with ``window`` moving-window entries each."""
    bucket_words = _HEADER + WAYS * _slot_words(window)
    return 8 * (_HEADER + _buckets(capacity) * bucket_words)


def region_size(capacity: int, window: int) -> int:
    """A region size that holds the table (and the region's directory), in 64 KiB units."""
    from ._region import DATA

    need = DATA + table_size(capacity, window) + 4096
    return (need + 0xFFFF) & ~0xFFFF


def check_table(capacity: object, window: object) -> tuple[int, int]:
    """Validate the table's options: ``capacity`` (keys), ``window`` (entries per key)."""
    return (
        check_count(capacity, "capacity", WAYS, MAX_CAPACITY),
        check_count(window, "window", 1, MAX_WINDOW),
    )


def _digest(raw: bytes) -> tuple[int, int]:
    x = int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "little")
    return (x >> 1) | 1, x >> 33  # the stored hash (never 0), and bits to pick the bucket


class SharedCounters:
    """The table of one region (see the module docstring); every method takes ``now``."""

    def __init__(self, region: Any, capacity: int, window: int) -> None:
        self.capacity, self.window = check_table(capacity, window)
        nbytes = table_size(capacity, window)

        def init(view: memoryview) -> None:
            q = view.cast("q")
            q[0], q[1] = capacity, window

        # The region's allocator and record locks (the core's SharedRegion, not public API).
        offset, _ = region._object(
            KIND_LIMITS,
            _OBJECT,
            {"capacity": capacity, "window": window, "layout": _LAYOUT},
            nbytes,
            init,
        )
        view = region._view(offset, nbytes)
        self._region = region
        self._view = view
        self._q = view.cast("q")
        self._d = view.cast("d")
        self._offset = offset
        self._lock_at: Callable[[int], Any] = region._lock_at
        self._slot = _slot_words(window)
        self._bucket = _HEADER + WAYS * self._slot
        self._nbuckets = _buckets(capacity)
        self.slots = self._nbuckets * WAYS
        region._made(self)  # the segment stays mapped while this table lives

    # -- buckets and slots (under the bucket's lock) ----------------------------------------------
    def _locate(self, raw: bytes) -> tuple[int, int, Any]:
        """``(hash, the bucket's first word, its lock)``."""
        h, pick = _digest(raw)
        base = _HEADER + (pick % self._nbuckets) * self._bucket
        return h, base, self._lock_at(self._offset + 8 * base)

    def _find(self, base: int, h: int, raw: bytes) -> int:
        """The first word of the key's slot, or -1."""
        q, view, n = self._q, self._view, len(raw)
        for s in range(base + _HEADER, base + self._bucket, self._slot):
            if q[s] == h and q[s + _LEN] == n:
                at = 8 * (s + _KEY)
                if view[at : at + n] == raw:
                    return s
        return -1

    def _insert(self, base: int, h: int, raw: bytes, now: float) -> int:
        """A slot for a new key: an empty one, else one whose state expired, else the one that
        expires first (counted as evicted)."""
        q, d = self._q, self._d
        victim, soonest = -1, float("inf")
        for s in range(base + _HEADER, base + self._bucket, self._slot):
            if q[s] == 0:
                victim = s
                break
            if d[s + _EXPIRY] < soonest:
                victim, soonest = s, d[s + _EXPIRY]
        if q[victim] and soonest > now:
            q[base] += 1
        q[victim] = 0  # empty first: a writer killed below leaves an empty slot
        q[victim + _LEN] = len(raw)
        at = 8 * (victim + _KEY)
        self._view[at : at + len(raw)] = raw
        q[victim + _COUNT] = 0
        d[victim + _EXPIRY] = 0.0
        q[victim + _RING] = 0
        q[victim] = h  # published
        return victim

    def _slot_for(self, base: int, h: int, raw: bytes, now: float) -> int:
        s = self._find(base, h, raw)
        return s if s >= 0 else self._insert(base, h, raw, now)

    # -- counters (fixed and sliding windows) --------------------------------------------------------
    def incr(self, raw: bytes, expiry: float, amount: int, now: float) -> int:
        """Add ``amount`` to the counter (a fresh one, expiring ``expiry`` s after ``now``, if
        it is absent or expired); its new value."""
        h, base, lock = self._locate(raw)
        q, d = self._q, self._d
        with lock:
            s = self._slot_for(base, h, raw, now)
            if d[s + _EXPIRY] <= now:
                q[s + _COUNT] = amount  # then the expiry: killed in between, it stays expired
                d[s + _EXPIRY] = now + expiry
            else:
                q[s + _COUNT] += amount
            return int(q[s + _COUNT])

    def decr(self, raw: bytes, amount: int, now: float) -> int:
        """Take ``amount`` from a live counter (not below 0); its new value (0 if absent)."""
        h, base, lock = self._locate(raw)
        q = self._q
        with lock:
            s = self._find(base, h, raw)
            if s < 0 or self._d[s + _EXPIRY] <= now:
                return 0
            q[s + _COUNT] = max(q[s + _COUNT] - amount, 0)
            return int(q[s + _COUNT])

    def get(self, raw: bytes, now: float) -> tuple[int, float]:
        """``(counter, expiry)`` of a live counter, else ``(0, now)``."""
        h, base, lock = self._locate(raw)
        with lock:
            s = self._find(base, h, raw)
            if s < 0 or self._d[s + _EXPIRY] <= now:
                return 0, now
            return int(self._q[s + _COUNT]), float(self._d[s + _EXPIRY])

    def clear(self, raw: bytes) -> None:
        """Forget the key (one store: its slot is empty)."""
        h, base, lock = self._locate(raw)
        with lock:
            s = self._find(base, h, raw)
            if s >= 0:
                self._q[s] = 0

    # -- moving windows -------------------------------------------------------------------------------
    def _ring(self, s: int) -> tuple[int, int]:
        word = self._q[s + _RING]
        first, n = word & 0xFFFFFFFF, word >> 32
        if first >= self.window or not 0 <= n <= self.window:
            return 0, 0  # not a ring this layout writes: take it as empty
        return first, n

    def acquire(self, raw: bytes, limit: int, expiry: float, amount: int, now: float) -> bool:
        """Add ``amount`` entries stamped ``now`` if the entries newer than ``now - expiry``
        and these make at most ``limit``; whether it did."""
        h, base, lock = self._locate(raw)
        q, d, w = self._q, self._d, self.window
        with lock:
            s = self._slot_for(base, h, raw, now)
            first, n = self._ring(s)
            ring = s + _ENTRIES
            cutoff = now - expiry
            while n and d[ring + first] < cutoff:  # older than any window asked: drop them
                first, n = (first + 1) % w, n - 1
            if n + amount > limit:
                q[s + _RING] = first | n << 32
                return False
            # Stamps never go back (a wall clock stepped back): the ring stays sorted.
            stamp = max(now, d[ring + (first + n - 1) % w]) if n else now
            for i in range(n, n + amount):
                d[ring + (first + i) % w] = stamp  # free cells: nothing reads them yet
            q[s + _RING] = first | (n + amount) << 32  # published
            d[s + _EXPIRY] = stamp + expiry
            return True

    def moving_window(self, raw: bytes, expiry: float, now: float) -> tuple[float, int]:
        """``(the oldest entry newer than now - expiry, how many are)``; ``(now, 0)`` if none."""
        h, base, lock = self._locate(raw)
        d, w = self._d, self.window
        with lock:
            s = self._find(base, h, raw)
            if s < 0:
                return now, 0
            first, n = self._ring(s)
            ring = s + _ENTRIES
            cutoff = now - expiry
            for i in range(n):
                stamp = d[ring + (first + i) % w]
                if stamp > cutoff:
                    return float(stamp), n - i
            return now, 0

    # -- the whole table ----------------------------------------------------------------------------
    def reset(self) -> int:
        """Forget every key, bucket by bucket; how many there were."""
        q, count = self._q, 0
        for b in range(self._nbuckets):
            base = _HEADER + b * self._bucket
            with self._lock_at(self._offset + 8 * base):
                for s in range(base + _HEADER, base + self._bucket, self._slot):
                    if q[s]:
                        count += 1
                        q[s] = 0
        return count

    def stats(self) -> tuple[int, int]:
        """``(keys held, keys evicted before they expired)``, read without locking."""
        q, keys, evicted = self._q, 0, 0
        for b in range(self._nbuckets):
            base = _HEADER + b * self._bucket
            evicted += q[base]
            keys += sum(1 for s in range(base + _HEADER, base + self._bucket, self._slot) if q[s])
        return keys, evicted
