"""A shared BreakerMap recovers from a writer killed in the middle of rewriting a slot.

A writer (insertion or eviction, under the table's record lock) marks a slot as being rewritten
(odd tag), then either restores its tag or writes a new key. A process killed in between leaves
the odd tag for good. The children here stop at each such point for real (they do the first
half through the table's own methods, then SIGKILL themselves with the lock held), on both
cores; the parent then checks that every key is found again, by this and by a fresh map, that
the half-written key recovers whatever its breaker's state, and that nothing it leaked counts
against ``max_open_ratio`` or in ``untracked``.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import struct
import sys
import time
import types
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import region_support as rs

from fastbreaker import _region_map

pytestmark = [
    pytest.mark.skipif(sys.platform == "win32", reason="SharedRegion is POSIX only"),
    pytest.mark.thread_unsafe(reason="starts processes and maps named segments"),
]

CAP = 8
OPTIONS: dict[str, Any] = dict(
    capacity=CAP, failure_threshold=1, reset_timeout=10, max_open_ratio=0.25
)


@pytest.fixture
def name() -> Iterator[str]:
    n = "fbr-" + uuid.uuid4().hex[:12]
    yield n
    try:
        import _posixshmem  # type: ignore[import-not-found]

        _posixshmem.shm_unlink("/" + n)
    except FileNotFoundError:
        pass


@pytest.fixture
def clock() -> Iterator[rs.SharedClock]:
    c = rs.SharedClock()
    yield c
    c.close()


def same_home(n: int, start: int = 0) -> list[str]:
    return rs.same_home(n, CAP, start)


def die_mid_rewrite(core: str, name: str, clock: Any, key: str, step: str) -> None:
    """A writer that stops for good between two steps of rewriting ``key``'s slot (``step``:
    ``"marked"``: tag made odd, nothing else written; ``"half_key"``: a new key's hash and length
    written over it; ``"new_slot"``: a never-assigned slot on ``key``'s path, half written)."""
    m = rs.region(core, name, clock).breaker_map("hosts", **OPTIONS)
    table = m._table
    raw = _region_map.encode_key(key)
    with table.lock:
        if step.startswith("new_slot"):
            slot = table.free_slot(raw)
        else:
            slot = m.get(key)._bound()[0]
        table.mark_rewriting(slot)
        at = table.slots_at + slot * _region_map.SLOT_SIZE
        if step == "new_slot_whole":  # the key written in full, the tag not yet even
            struct.pack_into("<qq", table.view, at, _region_map._hash(raw), len(raw))
            table.view[at + 16 : at + 16 + len(raw)] = raw
        elif step != "marked":
            new = _region_map.encode_key("intruder")
            struct.pack_into("<qq", table.view, at, _region_map._hash(new), len(new))
        os.kill(os.getpid(), signal.SIGKILL)


def run_to_death(*args: Any) -> None:
    p = multiprocessing.get_context("fork").Process(target=die_mid_rewrite, args=args)
    p.start()
    p.join(60)
    assert p.exitcode == -signal.SIGKILL


def odd_tags(m: Any) -> list[int]:
    return [s for s in range(CAP) if m._table.tag(s) & 1]


@pytest.mark.parametrize("step", ["marked", "half_key"])
def test_a_writer_killed_mid_rewrite_of_an_open_slot_wedges_nothing(
    fb: types.SimpleNamespace, name: str, clock: rs.SharedClock, step: str
) -> None:
    region = fb.SharedRegion(name, clock=clock)
    m = region.breaker_map("hosts", **OPTIONS)
    keys = same_home(4)
    for key in keys:
        assert m.allow(key)
        m.record_success(key)
    victim = keys[0]  # the head of the path: every other key's lookup passes its slot
    assert m.allow(victim)
    m.record_failure(victim)
    assert m[victim].state == fb.State.OPEN and m._group.open == 1
    run_to_death(fb.impl, name, clock, victim, step)
    assert len(odd_tags(m)) == 1
    # lookups look past the half-written slot, in this process and in a fresh map
    fresh = region.breaker_map("hosts", **OPTIONS)
    for key in keys[1:]:
        assert key in m and key in fresh and m.get(key) is not None
        assert fresh.allow(key)
        fresh.record_success(key)
    # the half-written key is usable again: its slot is rewritten by the next writer
    if step == "marked":  # its key is whole: it keeps its breaker, still OPEN, and recovers
        assert victim in fresh and fresh[victim].state == fb.State.OPEN
        assert not fresh.allow(victim)
        clock.advance(10)
        assert fresh.allow(victim)
        fresh.record_success(victim)
    else:  # its key was half overwritten: the slot is reset (the OPEN breaker is gone)
        assert victim not in fresh and fresh.allow(victim)
        fresh.record_success(victim)
    assert m[victim].state == fb.State.CLOSED and odd_tags(m) == []
    assert set(m) == set(keys) and len(m) == len(keys)
    # nothing leaked: no key untracked, no OPEN breaker counted against max_open_ratio (8 keys
    # at 0.25: two may open)
    for key in same_home(4, start=1000):
        assert m.allow(key)
        m.record_success(key)
    mm = m.metrics()
    assert (mm.keys, mm.open, mm.untracked) == (8, 0, 0) and m._group.open == 0
    for key in keys[:2]:
        assert m.allow(key)
        m.record_failure(key)
    assert sorted(m.open_keys()) == sorted(keys[:2]) and m.metrics().suppressed_trips == 0


@pytest.mark.parametrize("step", ["new_slot", "new_slot_whole"])
def test_a_writer_killed_mid_first_assignment_leaves_a_usable_slot(
    fb: types.SimpleNamespace, name: str, clock: rs.SharedClock, step: str
) -> None:
    region = fb.SharedRegion(name, clock=clock)
    m = region.breaker_map("hosts", **OPTIONS)
    keys = same_home(3)
    for key in keys[:2]:
        assert m.allow(key)
        m.record_success(key)
    run_to_death(fb.impl, name, clock, keys[2], step)
    assert len(odd_tags(m)) == 1
    fresh = region.breaker_map("hosts", **OPTIONS)
    # a key written in full is kept (counted once); a half-written one is not there
    assert (keys[2] in fresh) == (step == "new_slot_whole") and fresh.allow(keys[2])
    fresh.record_success(keys[2])
    for key in keys:
        assert key in m and key in fresh
    assert odd_tags(m) == [] and len(m) == 3 and set(m) == set(keys)
    # the table fills up to its capacity, no more and no less
    for key in same_home(CAP - 3, start=500):
        assert m.allow(key)
        m.record_success(key)
    assert (m.metrics().keys, m.metrics().untracked, m.metrics().evicted) == (CAP, 0, 0)


def test_a_duplicate_left_by_a_wedged_slot_is_reset(
    fb: types.SimpleNamespace, name: str, clock: rs.SharedClock
) -> None:
    # A region wedged before this fix may hold a key twice: in the half-written slot (OPEN) and
    # in a later one. The half-written copy is a leftover: it is reset, whatever its state.
    region = fb.SharedRegion(name, clock=clock)
    m = region.breaker_map("hosts", **OPTIONS)
    keys = same_home(2)
    for key in keys:
        assert m.allow(key)
        m.record_success(key)
    assert m.allow(keys[0])
    m.record_failure(keys[0])
    table = m._table
    raw = _region_map.encode_key(keys[0])
    with table.lock:
        slot = m.get(keys[0])._bound()[0]
        table.mark_rewriting(slot)
        other = table.free_slot(raw)
        table.assign(raw, other)
        table.count_assigned()
        m._group.add_size(1)
    fresh = region.breaker_map("hosts", **OPTIONS)
    assert fresh.allow(keys[0]) and fresh[keys[0]]._bound()[0] == other
    fresh.record_success(keys[0])
    assert keys[1] in fresh and odd_tags(m) == []
    mm = m.metrics()
    assert (mm.keys, mm.open, m._group.open) == (2, 0, 0) and sorted(m) == sorted(keys)


def hammer(core: str, name: str, clock: Any, seed: int) -> None:
    """Keyed calls over 24 keys on an 8-slot map until killed: evictions all the time."""
    m = rs.region(core, name, clock).breaker_map("hosts", **OPTIONS)
    rnd = random.Random(seed)
    while True:
        key = f"k{rnd.randrange(24)}"
        if m.allow(key):
            if rnd.random() < 0.2:
                m.record_failure(key)
            else:
                m.record_success(key)


@pytest.mark.slow
def test_random_kills_of_hammering_writers_leave_a_working_map(
    fb: types.SimpleNamespace, name: str, clock: rs.SharedClock
) -> None:
    region = fb.SharedRegion(name, clock=clock)
    m = region.breaker_map("hosts", **OPTIONS)
    ctx = multiprocessing.get_context("fork")
    rnd = random.Random(26)
    procs = [ctx.Process(target=hammer, args=(fb.impl, name, clock, i)) for i in range(4)]
    for p in procs:
        p.start()
    try:
        for kill in range(40):
            time.sleep(rnd.uniform(0.005, 0.05))
            victim = procs[kill % len(procs)]
            os.kill(victim.pid, signal.SIGKILL)
            victim.join(60)
            procs[kill % len(procs)] = ctx.Process(
                target=hammer, args=(fb.impl, name, clock, 100 + kill)
            )
            procs[kill % len(procs)].start()
    finally:
        for p in procs:
            os.kill(p.pid, signal.SIGKILL)
            p.join(60)
    fresh = region.breaker_map("hosts", **OPTIONS)
    for _ in range(3):  # a probe lost to a kill re-opens once: the next round's probe closes
        clock.advance(3600)
        for i in range(24):
            key = f"k{i}"
            if fresh.allow(key):
                fresh.record_success(key)
    assert odd_tags(m) == []
    mm = m.metrics()
    assert mm.keys == CAP and mm.open == m._group.open == 0, mm


PROBED: dict[str, Any] = dict(
    failure_threshold=1, reset_timeout=10, max_reset_timeout=40, probe_timeout=5
)


def probe_and_die(core: str, name: str, clock: Any) -> None:
    """Take the shared breaker's one probe, then die without reporting it."""
    assert rs.region(core, name, clock).breaker("up", **PROBED).allow()
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_probe_lost_with_its_process_counts_as_failed_and_backs_off(
    fb: types.SimpleNamespace, name: str, clock: rs.SharedClock
) -> None:
    # The rule stated in docs/semantics.md and the gunicorn example's README: the other
    # processes wait probe_timeout, then the lost probe re-opens with the next open period.
    region = fb.SharedRegion(name, clock=clock)
    b = region.breaker("up", **PROBED)
    assert b.allow()
    b.record_failure()
    assert b.retry_after == 10
    for period in (20, 40, 40):  # doubled on each lost probe, up to max_reset_timeout
        clock.advance(b.retry_after)
        p = multiprocessing.get_context("fork").Process(
            target=probe_and_die, args=(fb.impl, name, clock)
        )
        p.start()
        p.join(60)
        assert p.exitcode == -signal.SIGKILL
        assert b.state == fb.State.HALF_OPEN and not b.allow()
        clock.advance(4.9)
        assert not b.allow() and b.state == fb.State.HALF_OPEN  # it may still answer
        clock.advance(0.1)
        assert not b.allow() and b.state == fb.State.OPEN
        assert b.retry_after == period
    clock.advance(40)
    assert b.allow()
    b.record_success()
    assert b.state == fb.State.CLOSED
