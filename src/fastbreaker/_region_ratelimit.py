"""Rate limiters in a SharedRegion: ``region.rate_limiter`` and ``region.rate_limiter_map``.

A shared ``RateLimiterMap`` keeps its keys in a ``SharedTable`` (``_region_map``: str/bytes keys,
open addressing, seqlock tags, repair of a slot left half written by a killed writer). Each
slot's block holds its last-used time, then one TAT word per rate (the compiled core's words are
charged by CAS; the twin keeps them as a ``SharedRecord`` under the slot's record lock)::

    last-used ns, TAT_0 ... TAT_n-1

Insertions and evictions are serialised by the table's record lock. A new key in a full table
takes the slot of an idle key (every TAT <= now: nothing is lost), searched from its home slot,
else of the least recently used one (whose debt is forgotten). A writer marks the slot (odd tag),
resets its words, writes the key and publishes an even tag; one killed in between leaves an odd
tag, which lookups look past and the next writer on that path repairs.

Each process caches ``key -> slot`` and checks the slot's tag on every call, so an eviction by
any process makes the others rebind. The cache holds at most one key per slot. In the compiled
core the tag check and the CAS are two steps: a charge racing the eviction of its key may land
on the slot's new key (making it wait, never admitting more); the twin checks the tag under the
slot's lock, which the evicting writer holds.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Optional, cast

from ._region import KIND_RATE, KIND_RATE_MAP
from ._region_map import (
    MAX_CAPACITY,
    SLOT_SIZE,
    TAGS_AT,
    SharedTable,
    encode_key,
    key_hash,
    map_size,
)

if TYPE_CHECKING:
    from ._ratelimit import RateSpec
    from ._ratelimit_py import RateLimiter, RateLimiterMap
    from ._region import SharedRegion

__all__ = ["SharedKeys", "rate_limiter", "rate_limiter_map"]

_STRIDE = SLOT_SIZE // 8


def _core(region: SharedRegion) -> Any:
    if region._core == "c":
        from . import _ratelimit_c as core
    else:
        from . import _ratelimit_py as core  # type: ignore[no-redef]
    return core


def _rates_key(rates: tuple[RateSpec, ...]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    from ._ratelimit import rates_config

    out, t, tau = rates_config(rates)
    return out, {"rates": tuple(f"{a}ns/{b}ns" for a, b in zip(t, tau))}


def rate_limiter(region: SharedRegion, name: str, rates: tuple[RateSpec, ...]) -> RateLimiter:
    """``region.rate_limiter(name, *rates)``."""
    out, key = _rates_key(rates)
    core = _core(region)
    nbytes = core.shared_size(len(out))
    offset, _ = region._object(
        KIND_RATE, name, key, nbytes, lambda view: core.shared_init(view, len(out))
    )
    view, lock = region._view(offset, nbytes), region._lock_at(offset)
    lim = core.RateLimiter._shared(out, name, region._clock, view, lock)
    return cast("RateLimiter", region._made(lim))


def rate_limiter_map(
    region: SharedRegion, name: str, rates: tuple[RateSpec, ...], capacity: object
) -> RateLimiterMap:
    """``region.rate_limiter_map(name, *rates, capacity=...)``."""
    from ._durations import check_count

    check_count(capacity, "capacity", 1, MAX_CAPACITY)
    out, key = _rates_key(rates)
    key["capacity"] = capacity
    core = _core(region)
    n = len(out)
    block = core.map_block_size(n)
    cap = cast(int, capacity)
    nbytes = map_size(cap, block)
    offset, _ = region._object(
        KIND_RATE_MAP, name, key, nbytes, lambda view: SharedTable.init(view, cap)
    )
    view = region._view(offset, nbytes)
    table = SharedTable(view, cap, block, region._lock_at(offset), region._lock_at, offset)
    m = core.RateLimiterMap(*out, max_keys=cap, name=name, clock=region._clock)
    m._attach(SharedKeys(table, core, n, region._core == "python"))
    return cast("RateLimiterMap", region._made(m))


class SharedKeys:
    """A shared RateLimiterMap's keys: the table, and this process's ``slot -> key`` record that
    bounds its cache (see the module docstring)."""

    def __init__(self, table: SharedTable, core: Any, n: int, locked: bool) -> None:
        self.table = table
        self._core = core
        self._n = n
        self._locked = locked  # the twin: a slot's words change under its record lock
        self._holders: list[Any] = [None] * table.capacity
        self._q = table.view.cast("q")  # the table as words, for reads in bulk

    @property
    def capacity(self) -> int:
        return self.table.capacity

    def lock_for(self, slot: int) -> Any:
        return self.table.lock_for(slot) if self._locked else contextlib.nullcontext()

    def slot_view(self, slot: int) -> memoryview:
        return self.table.block_view(slot)

    def words(self, slot: int) -> tuple[int, ...]:
        """Slot ``slot``'s last-used time, then its TATs."""
        return cast("tuple[int, ...]", self._core.map_slot_read(self.slot_view(slot), self._n))

    def tag(self, slot: int) -> int:
        return self.table.tag(slot)

    def remember(self, d: dict[Any, Any], key: Any, entry: Any) -> None:
        """Cache ``entry`` (bound to ``entry.slot``) for ``key`` in ``d``, dropping the key this
        process last cached for that slot: ``d`` never holds more than ``capacity`` keys."""
        slot = entry.slot
        prev = self._holders[slot]
        if prev is not None and (type(prev) is not type(key) or prev != key):
            old = d.get(prev)
            if old is not None and old.slot == slot:
                del d[prev]
        self._holders[slot] = key
        d[key] = entry

    # -- finding and inserting keys ---------------------------------------------------------------
    def _scan(self, raw: bytes) -> tuple[Optional[tuple[int, int]], list[int], Optional[int]]:
        """One pass over ``raw``'s probe path, its tags and hashes read in bulk (a miss in a full
        table walks every slot: list searches in C, not a Python loop per slot): the key's
        ``(slot, tag)`` if found whole, the slots on the path with an odd tag (being rewritten,
        or left so by a writer that died; a slot whose tag moved while it was read counts too),
        and the first slot on the path that holds no key."""
        t = self.table
        cap = t.capacity
        h = key_hash(raw)
        home = h % cap
        q = self._q
        tags = q[TAGS_AT // 8 : TAGS_AT // 8 + cap].tolist()
        s0 = t.slots_at // 8
        hashes = q[s0 : s0 + cap * _STRIDE : _STRIDE].tolist()
        tags = tags[home:] + tags[:home]
        hashes = hashes[home:] + hashes[:home]
        end = tags.index(0) + 1 if 0 in tags else cap  # the path stops at a never-assigned slot
        found = None
        odd = [(home + i) % cap for i in range(end) if tags[i] & 1]
        i = -1
        while found is None:
            try:
                i = hashes.index(h, i + 1, end)
            except ValueError:
                break
            slot, tag = (home + i) % cap, tags[i]
            if tag & 1:
                continue
            if t.whole_key(slot) == raw:
                if t.tag(slot) == tag:
                    found = (slot, tag)
                else:
                    odd.append(slot)
        free, i = None, -1
        while True:
            try:
                i = hashes.index(0, i + 1, end)
            except ValueError:
                break
            if not tags[i] & 1:
                free = (home + i) % cap
                break
        return found, odd, free

    def find(self, key: Any) -> Optional[tuple[int, int]]:
        """``(slot, tag)`` of ``key``, or None (no insertion). A path that crosses a slot being
        rewritten is looked at again under the table's lock, after repairs."""
        raw = encode_key(key, "RateLimiterMap")
        found, odd, _ = self._scan(raw)
        if found is None and odd:
            with self.table.lock:
                self._repair(raw, odd)
                found = self._scan(raw)[0]
        return found

    def contains(self, key: object) -> bool:
        try:
            return self.find(key) is not None
        except (TypeError, ValueError):
            return False

    def bind(self, key: Any, now: int) -> tuple[int, int]:
        """``(slot, tag)`` of ``key``, inserted if absent (evicting a key if the table is full)."""
        raw = encode_key(key, "RateLimiterMap")
        found = self._scan(raw)[0]
        if found is not None:
            return found
        with self.table.lock:
            found, odd, free = self._scan(raw)
            if odd:
                self._repair(raw, odd)
                found, _, free = self._scan(raw)
            if found is None:
                found = self._insert(raw, now, free)
        return found

    def _insert(self, raw: bytes, now: int, free: Optional[int]) -> tuple[int, int]:
        table = self.table
        slot = free  # never assigned, or emptied by _repair
        evicting = slot is None
        if slot is None:
            slot = self._victim(raw, now)
        with self.lock_for(slot):
            table.mark_rewriting(slot)
            self._core.map_slot_reset(self.slot_view(slot), self._n, now)
            tag = table.assign(raw, slot)
        if evicting:
            table.count_evicted()
        return slot, tag

    def _victim(self, raw: bytes, now: int) -> int:
        """A full table's slot to give to a new key: the first idle one on its probe path, else
        the least recently used."""
        table = self.table
        cap = table.capacity
        home = key_hash(raw) % cap
        order = list(range(home, cap)) + list(range(home))
        tags = self._q[TAGS_AT // 8 : TAGS_AT // 8 + cap].tolist()
        best, best_last = -1, 0
        if self._locked:  # the twin: each slot's record, read until an idle one
            for slot in order:
                if tags[slot] & 1:
                    continue
                words = self.words(slot)
                if all(tat <= now for tat in words[1:]):
                    return slot
                if best < 0 or words[0] < best_last:
                    best, best_last = slot, words[0]
        else:  # the compiled core's words, read in bulk: every slot's last-used, each TAT
            b0, step = table.blocks_at // 8, table.block // 8
            lasts = self._q[b0 : b0 + cap * step : step].tolist()
            tats = [
                self._q[b0 + r : b0 + r + cap * step : step].tolist() for r in range(1, self._n + 1)
            ]
            for slot in order:
                if not tags[slot] & 1 and all(tat[slot] <= now for tat in tats):
                    return slot
            for slot in order:
                if not tags[slot] & 1 and (best < 0 or lasts[slot] < best_last):
                    best, best_last = slot, lasts[slot]
        if best < 0:
            raise RuntimeError("the shared RateLimiterMap's slots are all being rewritten")
        return best

    def _repair(self, raw: bytes, odd: list[int]) -> None:
        """Under the table's lock: repair the ``odd`` slots on ``raw``'s probe path, left so by
        a writer killed halfway. A whole key found nowhere else keeps its slot; anything else is
        emptied (lookups go on past it, the next new key takes it)."""
        table = self.table
        for slot in odd:
            if not table.tag(slot) & 1:
                continue  # a tag that moved while the path was read: nothing to repair
            with self.lock_for(slot):
                key = table.whole_key(slot)
                if key is not None and table.find(key) is None:
                    table.restore_tag(slot, table.tag(slot) + 1)
                    continue
                self._core.map_slot_reset(self.slot_view(slot), self._n, 0)
                table.empty(slot)

    def __len__(self) -> int:
        """The keys in the table now (counted: no count to leave wrong when a writer dies)."""
        t = self.table
        s0 = t.slots_at // 8
        hashes = self._q[s0 : s0 + t.capacity * _STRIDE : _STRIDE].tolist()
        tags = self._q[TAGS_AT // 8 : TAGS_AT // 8 + t.capacity].tolist()
        return sum(1 for h, tag in zip(hashes, tags) if h and not tag & 1)

    @property
    def evicted(self) -> int:
        return self.table.evicted
