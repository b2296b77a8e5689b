"""A BreakerMap in a SharedRegion: a fixed-capacity table of str/bytes keys, one breaker each.

The map's block in the region::

    0        header: capacity, keys assigned, evictions, untracked, then the totals of the
             breakers evicted so far (one word per _COUNTERS name, open time in ns)
    256      the map's group (the count of non-CLOSED breakers and the max_open_ratio bound)
    512      capacity tags, one word per slot, dense: every keyed call reads its key's
    ...      capacity slots of SLOT_SIZE bytes: hash, key length, key bytes
    ...      capacity breaker blocks (the core's shared breaker layout), slot i's at i

Open addressing with linear probing from ``hash % capacity``; a slot, once assigned, is never
emptied, only given to another key by an eviction, so a lookup can stop at the first empty
slot. The hash is blake2b of the key (the same in every process; Python's ``hash`` is not).

Readers do not lock: a slot's tag is odd while a writer rewrites it and grows by two per
assignment, so a reader that reads the same even tag before and after matching the key has a
whole slot (a seqlock). A reader that finds no match, or an odd tag, takes the map's lock and
looks again there, where writers (insertion, eviction) are serialised: the region's record
lock, so a writer killed halfway releases it.

A writer killed between marking a slot and restoring its tag (or writing a new key) leaves the
odd tag for good. Lookups look past an odd slot, and the next writer whose key's probe path
crosses one repairs it under the lock, whatever its breaker's state (``_map_steps._repair``):
a slot whose key is whole (its stored hash is the key's) gets an even tag back and keeps its
breaker; a slot whose key was half written, or whose key is also in another slot, is emptied
(hash 0, even tag: lookups go on past it, the next insertion takes it) and its breaker reset.

A process caches ``key -> breaker`` bound to (slot, tag). Every keyed call checks that the
slot's tag is still the bound one: an eviction by any process makes the others rebind the key
on their next call. Eviction follows BreakerMap's rules: a CLOSED breaker that carries no
information and has no call in flight first, then other CLOSED ones, then CLOSED ones with calls
in flight (their outcomes go stale: the reset starts a new generation); never a non-CLOSED one.
When every slot holds a non-CLOSED breaker, a new key gets a breaker of its own, in this process
only, outside the map (counted in ``untracked``), as a full BreakerMap does.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator
from typing import Any, Optional

from ._map_steps import _COUNTERS

__all__ = [
    "KEY_MAX",
    "SLOT_SIZE",
    "TAGS_AT",
    "SharedTable",
    "encode_key",
    "key_hash",
    "map_size",
]

SLOT_SIZE = 256
KEY_MAX = SLOT_SIZE - 16 - 1
"""The longest key: 239 bytes (a str's UTF-8)."""
MAX_CAPACITY = 1 << 22
GROUP_AT = 256
TAGS_AT = 512
_H_CAPACITY, _H_ASSIGNED, _H_EVICTED, _H_UNTRACKED = 0, 8, 16, 24
_H_TOTALS = 32  # one word per _COUNTERS name (open time in ns)
_q = struct.Struct("<q")
assert _H_TOTALS + 8 * len(_COUNTERS) <= GROUP_AT


def encode_key(key: object, what: str = "BreakerMap") -> bytes:
    """The key as stored: a type byte (str and bytes keys never collide), then its bytes."""
    if isinstance(key, str):
        raw = b"s" + key.encode("utf-8")
    elif isinstance(key, bytes):
        raw = b"b" + key
    else:
        raise TypeError(
            f"keys of a shared {what} are str or bytes (the same in every process), got "
            f"{type(key).__name__}: {key!r}"
        )
    if len(raw) - 1 > KEY_MAX:
        raise ValueError(f"a shared {what}'s key is at most {KEY_MAX} bytes, got {key!r}")
    return raw


def decode_key(raw: bytes) -> Any:
    return raw[1:].decode("utf-8") if raw[:1] == b"s" else bytes(raw[1:])


def _hash(raw: bytes) -> int:
    h = int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "little") >> 1
    return h | 1  # never 0: 0 marks an empty slot


key_hash = _hash


def _slots_at(capacity: int) -> int:
    return TAGS_AT + ((capacity * 8 + 63) & ~63)


def map_size(capacity: int, block: int) -> int:
    """The bytes of a shared map's block with ``capacity`` keys of ``block`` bytes each."""
    block = (block + 63) & ~63
    return _slots_at(capacity) + capacity * (SLOT_SIZE + block)


class SharedTable:
    """The key table of one shared map (see the module docstring)."""

    def __init__(
        self, view: memoryview, capacity: int, block: int, lock: Any, lock_at: Any, offset: int
    ) -> None:
        """``lock``: the map's record lock; ``lock_at(offset)``: the region's lock at an offset
        (the twin's breaker blocks), ``offset`` the map's block in the region."""
        self.view = view
        self._lock_at = lock_at
        self._offset = offset
        self.capacity = capacity
        self.block = (block + 63) & ~63
        self.slots_at = _slots_at(capacity)
        self.blocks_at = self.slots_at + capacity * SLOT_SIZE
        self.lock = lock
        if self._get(_H_CAPACITY) != capacity:
            raise ValueError("the shared map's table has another capacity")

    @staticmethod
    def init(view: memoryview, capacity: int) -> None:
        _q.pack_into(view, _H_CAPACITY, capacity)

    def _get(self, at: int) -> int:
        return int(_q.unpack_from(self.view, at)[0])

    def _put(self, at: int, value: int) -> None:
        _q.pack_into(self.view, at, value)

    def group_view(self, nbytes: int) -> memoryview:
        return self.view[GROUP_AT : GROUP_AT + nbytes]

    def group_lock(self) -> Any:
        return self._lock_at(self._offset + GROUP_AT)

    def lock_for(self, slot: int) -> Any:
        return self._lock_at(self._offset + self.blocks_at + slot * self.block)

    def block_view(self, slot: int) -> memoryview:
        at = self.blocks_at + slot * self.block
        return self.view[at : at + self.block]

    def tag_offset(self, slot: int) -> int:
        """The byte offset of slot ``slot``'s tag word in the map's block."""
        return TAGS_AT + slot * 8

    def tag(self, slot: int) -> int:
        return self._get(self.tag_offset(slot))

    def _slot_key(self, slot: int) -> tuple[int, int, bytes]:
        at = self.slots_at + slot * SLOT_SIZE
        tag = self._get(TAGS_AT + slot * 8)
        h, n = struct.unpack_from("<qq", self.view, at)
        return tag, h, bytes(self.view[at + 16 : at + 16 + n])

    def find(self, raw: bytes) -> Optional[tuple[int, int]]:
        """``(slot, tag)`` of the key, without locking; None: absent or being rewritten (look
        again under the lock)."""
        return self.lookup(raw)[0]

    def lookup(self, raw: bytes) -> tuple[Optional[tuple[int, int]], bool]:
        """``find(raw)``, and whether the key's probe path crossed a slot being rewritten (odd
        tag): the answer is then worth a look under the lock, after ``odd_slots`` are repaired."""
        h = _hash(raw)
        cap = self.capacity
        home = h % cap
        odd = False
        for i in range(cap):
            slot = (home + i) % cap
            tag, sh, key = self._slot_key(slot)
            if tag == 0 and sh == 0:
                break  # never assigned: the key is not further along
            if tag & 1:
                odd = True  # being rewritten, or left so by a writer that died: look past it
                continue
            if sh == h and key == raw:
                if self.tag(slot) == tag:
                    return (slot, tag), odd
                return None, True
        return None, odd

    def odd_slots(self, raw: bytes) -> list[int]:
        """The slots with an odd tag on the key's probe path (under the lock: each was left so
        by a writer that died)."""
        out = []
        for slot in self._path(raw):
            if self.tag(slot) & 1:
                out.append(slot)
        return out

    def whole_key(self, slot: int) -> Optional[bytes]:
        """The key stored in ``slot`` if it is whole (its stored hash is its own), else None."""
        at = self.slots_at + slot * SLOT_SIZE
        h, n = struct.unpack_from("<qq", self.view, at)
        if not 1 <= n <= KEY_MAX + 1:
            return None
        raw = bytes(self.view[at + 16 : at + 16 + n])
        if raw[:1] not in (b"s", b"b") or _hash(raw) != h:
            return None
        return raw

    def empty(self, slot: int) -> None:
        """Under the lock, on a slot with an odd tag: no key (hash 0), even tag. Lookups go on
        past it (its tag is not 0); ``open_slot`` hands it to the next new key."""
        struct.pack_into("<qq", self.view, self.slots_at + slot * SLOT_SIZE, 0, 0)
        self._put(TAGS_AT + slot * 8, self.tag(slot) + 1)

    def open_slot(self, raw: bytes) -> Optional[int]:
        """The first slot on the key's probe path that holds no key (never assigned, or
        emptied), or None."""
        for slot in self._path(raw):
            tag, sh, _ = self._slot_key(slot)
            if sh == 0 and not tag & 1:
                return slot
        return None

    def _path(self, raw: bytes) -> Iterator[int]:
        """The key's probe path, up to and including its first never-assigned slot."""
        cap = self.capacity
        home = _hash(raw) % cap
        for i in range(cap):
            slot = (home + i) % cap
            yield slot
            if self.tag(slot) == 0:
                return

    def keys(self) -> list[tuple[int, Any]]:
        """``(slot, key)`` of every assigned slot (a snapshot)."""
        out = []
        for slot in range(self.capacity):
            tag, h, key = self._slot_key(slot)
            if h and not tag & 1:
                out.append((slot, decode_key(key)))
        return out

    @property
    def assigned(self) -> int:
        return self._get(_H_ASSIGNED)

    @property
    def evicted(self) -> int:
        return self._get(_H_EVICTED)

    @property
    def untracked(self) -> int:
        return self._get(_H_UNTRACKED)

    def count_untracked(self) -> None:
        self._put(_H_UNTRACKED, self._get(_H_UNTRACKED) + 1)

    def totals(self) -> dict[str, Any]:
        """The counters of the breakers evicted so far (open time kept in ns)."""
        totals: dict[str, Any] = {}
        for i, name in enumerate(_COUNTERS):
            value = self._get(_H_TOTALS + 8 * i)
            totals[name] = value / 1e9 if name == "open_seconds_total" else value
        return totals

    # -- writers (under self.lock) ---------------------------------------------------------------
    def assign(self, raw: bytes, slot: int) -> int:
        """Write ``raw`` into ``slot`` (its breaker block already fresh); the new even tag."""
        at = self.slots_at + slot * SLOT_SIZE
        tag_at = TAGS_AT + slot * 8
        tag = self._get(tag_at)
        if not tag & 1:
            tag += 1
            self._put(tag_at, tag)  # odd: being rewritten
        struct.pack_into("<qq", self.view, at, _hash(raw), len(raw))
        self.view[at + 16 : at + 16 + len(raw)] = raw
        self._put(tag_at, tag + 1)
        return tag + 1

    def restore_tag(self, slot: int, tag: int) -> None:
        self._put(TAGS_AT + slot * 8, tag)

    def mark_rewriting(self, slot: int) -> None:
        at = TAGS_AT + slot * 8
        tag = self._get(at)
        if not tag & 1:
            self._put(at, tag + 1)

    def free_slot(self, raw: bytes) -> Optional[int]:
        """The first never-assigned slot on the key's probe path, or None (the table is full)."""
        h = _hash(raw)
        cap = self.capacity
        for i in range(cap):
            slot = (h % cap + i) % cap
            tag, sh, _ = self._slot_key(slot)
            if tag == 0 and sh == 0:
                return slot
        return None

    def probe_order(self, raw: bytes) -> list[int]:
        h = _hash(raw)
        cap = self.capacity
        return [(h % cap + i) % cap for i in range(cap)]

    def count_assigned(self, delta: int = 1) -> None:
        self._put(_H_ASSIGNED, self._get(_H_ASSIGNED) + delta)

    def count_evicted(self) -> None:
        self._put(_H_EVICTED, self._get(_H_EVICTED) + 1)

    def add_evicted(self, metrics: Any) -> None:
        self.count_evicted()
        for i, name in enumerate(_COUNTERS):
            value = getattr(metrics, name)
            add = round(value * 1e9) if name == "open_seconds_total" else int(value)
            self._put(_H_TOTALS + 8 * i, self._get(_H_TOTALS + 8 * i) + add)


def breaker_map(
    region: Any,
    name: str,
    args: tuple[Any, ...],
    capacity: int,
    max_open_ratio: float,
    options: dict[str, Any],
) -> Any:
    """``region.breaker_map(name, *args, capacity=..., max_open_ratio=..., **options)``."""
    from ._durations import check_count, check_rate
    from ._map import map_class
    from ._map_steps import attach_table
    from ._options import BreakerOptions
    from ._region import KIND_MAP

    for banned in ("max_keys", "clock", "name"):
        if banned in options:
            raise TypeError(f"region.breaker_map() takes no {banned!r}: {BANNED_OPTIONS[banned]}")
    check_count(capacity, "capacity", 1, MAX_CAPACITY)
    ratio = check_rate(max_open_ratio, "max_open_ratio")
    validated = BreakerOptions(*args, clock=region._clock, **options)
    core = region._cores()[0]
    block = core.shared_size(validated)
    nbytes = map_size(capacity, block)
    key = breaker_key(validated)
    key.update(capacity=capacity, max_open_ratio=ratio)

    def init(view: memoryview) -> None:
        SharedTable.init(view, capacity)
        table = SharedTable(view, capacity, block, None, None, 0)
        core.shared_group_init(table.group_view(core.shared_group_size()), ratio)
        for slot in range(capacity):
            core.shared_init(table.block_view(slot)[:block], validated)

    offset, _ = region._object(KIND_MAP, name, key, nbytes, init)
    view = region._view(offset, nbytes)
    table = SharedTable(view, capacity, block, region._lock_at(offset), region._lock_at, offset)
    m = map_class(core)(*args, max_open_ratio=ratio, clock=region._clock, **options)
    attach_table(m, table, ratio)
    return region._made(m)


BANNED_OPTIONS = {
    "name": "the name given to region.breaker() is the breaker's name; a map's breakers are "
    "named by their keys",
    "max_keys": "a shared map holds at most capacity keys",
    "clock": "every process must read the same clock (the region's)",
}


def breaker_key(options: Any) -> dict[str, Any]:
    """The breaker options stored with a shared breaker (all but name and clock)."""
    kw: dict[str, Any] = options.kwargs()
    kw.pop("name")
    kw.pop("clock")
    return kw
