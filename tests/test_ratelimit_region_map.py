"""SharedRegion rate limiter maps (issue 29): one limit per key for every process of a host.

Both cores (``fb``); time is a fake or ``SharedClock`` moved by the test, nothing sleeps. The
cross-process and crash tests fork children that attach to the region by name, as workers do.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import random
import signal
import struct
import sys
import time
import tracemalloc
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import ratelimit_region_support as rrs
import region_support as rs
from conftest import IMPLS
from hypothesis import given, settings, strategies as st
from memory_support import not_on_free_threading

from fastbreaker import _ratelimit_py, _region, _region_map
from fastbreaker.testing import FakeClock

pytestmark = [
    pytest.mark.skipif(sys.platform == "win32", reason="SharedRegion is POSIX only"),
    pytest.mark.thread_unsafe(reason="starts processes and maps named segments"),
]


def _unlink(n: str) -> None:
    try:
        _region.SharedRegion.unlink_name(n)
    except FileNotFoundError:
        pass


@pytest.fixture
def name() -> Iterator[str]:
    n = "fbm-" + uuid.uuid4().hex[:12]
    yield n
    _unlink(n)


@pytest.fixture
def shared_clock() -> Iterator[rs.SharedClock]:
    c = rs.SharedClock()
    yield c
    c.close()


# -- the API ---------------------------------------------------------------------------------------
def test_attachments_share_each_key(fb: Any, name: str, shared_clock: rs.SharedClock) -> None:
    a = fb.SharedRegion(name, clock=shared_clock)
    b = rs.region(fb.impl, name, shared_clock)
    ma = a.rate_limiter_map("per-ip", "2/s", capacity=8)
    mb = b.rate_limiter_map("per-ip", "2/s", capacity=8)
    assert isinstance(ma, fb.RateLimiterMap) and ma.max_keys == 8 and ma.name == "per-ip"
    assert ma.try_acquire("a") and mb.try_acquire("a") and not ma.try_acquire("a")
    assert mb.try_acquire(b"a")  # bytes and str keys never collide
    assert mb.retry_after("a") == 0.5 and mb.retry_after("zz") == 0.0 and "zz" not in mb
    mb.refund("zz", 1)
    assert "zz" not in ma and "a" in mb and b"a" in ma and 3 not in ma and len(ma) == 2
    mb.refund("a", 1)
    assert ma.try_acquire("a") and not mb.try_acquire("a")
    shared_clock.advance(0.5)
    assert mb.try_acquire("a")
    # keys and evictions are the region's, requests this process's
    assert ma.metrics() == fb.RateLimiterMapMetrics(2, 0, 2, 1)
    assert mb.metrics() == fb.RateLimiterMapMetrics(2, 0, 3, 1)
    assert a.objects()["per-ip"] == "rate_limiter_map"


def test_validation(fb: Any, name: str) -> None:
    region = fb.SharedRegion(name, clock=FakeClock(10**12))
    m = region.rate_limiter_map("m", "1/s", "10/min", capacity=4)
    for bad in (0, 2**22 + 1):
        with pytest.raises(ValueError, match=r"capacity must be .*\[1, 4194304\]"):
            region.rate_limiter_map("x", "1/s", capacity=bad)
    with pytest.raises(TypeError, match="capacity"):
        region.rate_limiter_map("x", "1/s", capacity="4")
    with pytest.raises(TypeError, match="capacity"):
        region.rate_limiter_map("x", "1/s")  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="rates="):
        region.rate_limiter_map("m", "1/s", capacity=4)
    with pytest.raises(ValueError, match="capacity=4, asked with capacity=5"):
        region.rate_limiter_map("m", "1/s", "10/min", capacity=5)
    region.rate_limiter("lim", "1/s")
    with pytest.raises(ValueError, match="is a rate_limiter, not a rate_limiter_map"):
        region.rate_limiter_map("lim", "1/s", capacity=4)
    for key, kind in ((5, "int"), (("a",), "tuple"), (None, "NoneType")):
        with pytest.raises(TypeError, match=f"str or bytes .*got {kind}"):
            m.try_acquire(key)
        with pytest.raises(TypeError, match=f"got {kind}"):
            m.retry_after(key)
        assert key not in m
    with pytest.raises(ValueError, match="at most 239 bytes"):
        m.try_acquire("x" * 240)
    with pytest.raises(ValueError, match="weight"):
        m.try_acquire("a", 2)
    assert len(m) == 0 and m.metrics() == fb.RateLimiterMapMetrics(0, 0, 0, 0)


# -- the same results as a local map -------------------------------------------------------------
rate_args = st.tuples(
    st.integers(1, 20), st.sampled_from([1, 60, 0.001]), st.one_of(st.none(), st.integers(1, 8))
)
ops = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(["try", "wait", "refund"]), st.integers(0, 5), st.integers(1, 8)),
        st.tuples(st.just("advance"), st.just(0), st.integers(0, 2 * 10**9)),
        st.tuples(st.just("state"), st.just(0), st.just(0)),
    ),
    max_size=60,
)
KEYS = ["k0", "k1", b"k1", "k3", "\u00e9", "k5"]


def _op(m: Any, op: str, key: Any, arg: int) -> object:
    if op == "try":
        return m.try_acquire(key, arg)
    if op == "wait":
        return m._retry_after_ns(key, arg)
    if op == "refund":
        return m.refund(key, arg)
    return m.metrics(), len(m), [k in m for k in KEYS]


@given(args=st.lists(rate_args, min_size=1, max_size=3), start=st.integers(0, 10**15), script=ops)
@settings(max_examples=60, deadline=None)
def test_shared_maps_of_both_cores_agree_with_a_local_map(
    args: list[tuple[int, float, int | None]], start: int, script: list[tuple[str, int, int]]
) -> None:
    # Within capacity (6 keys, capacity 6), a shared map of either core answers every call as a
    # local RateLimiterMap does: the same admissions, waits to the ns, keys and counts.
    rates = [_ratelimit_py.Rate(a[0], a[1], burst=a[2]) for a in args]
    burst = min(r.tolerance_ns // r.interval_ns for r in rates)
    clock = FakeClock(start)
    local = _ratelimit_py.RateLimiterMap(*rates, max_keys=6, clock=clock)
    regions: list[Any] = []
    maps: list[Any] = []
    try:
        for impl in IMPLS:
            n = "fbh-" + uuid.uuid4().hex[:12]
            regions.append(_region.region_class(impl)(n, size=64 * 1024, clock=clock))
        maps = [r.rate_limiter_map("m", *rates, capacity=6) for r in regions]
        for op, key, arg in script:
            if op == "advance":
                clock._ns += arg
                continue
            arg = min(arg, burst)
            want = _op(local, op, KEYS[key], arg)
            for m in maps:
                assert _op(m, op, KEYS[key], arg) == want, (op, KEYS[key], arg)
    finally:
        del maps
        for r in regions:
            r.close()
            _unlink(r.name)


# -- eviction ------------------------------------------------------------------------------------
def test_eviction_takes_an_idle_key_first_then_the_least_recently_used(fb: Any, name: str) -> None:
    clock = FakeClock(10**12)
    region = fb.SharedRegion(name, clock=clock)
    m = region.rate_limiter_map("m", fb.Rate(1, 10), capacity=4)
    other = region.rate_limiter_map("m", fb.Rate(1, 10), capacity=4)  # another process's view
    for k in ("a", "b"):
        assert m.try_acquire(k)
    clock.advance(11)  # a and b idle: as fresh as a new key
    for k in ("c", "d"):
        assert m.try_acquire(k)
        clock._ns += 1
    assert other.try_acquire("c") is False  # bound in `other`'s cache
    assert m.try_acquire("e")  # takes an idle slot: a or b
    assert ("a" in m) + ("b" in m) == 1 and all(k in m for k in "cde") and len(m) == 4
    assert m.try_acquire("f")  # the other idle one
    assert sorted(k for k in "abcdef" if k in m) == ["c", "d", "e", "f"]
    assert m.metrics().evicted == 2
    # nothing idle now: the least recently used goes; a refused request is a use too
    clock._ns += 1
    assert not m.try_acquire("c")
    clock._ns += 1
    assert m.try_acquire("g")  # d is the least recently used
    assert "d" not in m and all(k in m for k in "cefg")
    clock._ns += 1
    assert not other.try_acquire("e") and not other.try_acquire("f")
    assert m.try_acquire("h")  # c (used by `other`'s process before e and f)
    assert "c" not in m and all(k in m for k in "efgh") and m.metrics().evicted == 4
    # `other` cached c's slot, now h's: its next call rebinds c (a fresh key), h is untouched
    assert other.retry_after("h") == 10.0 and other.try_acquire("c")
    assert other.retry_after("h") == 10.0 and "g" not in m  # c took g's slot (LRU)
    assert len(m) == 4 and len(other._d) <= 4


def test_the_table_never_grows_past_capacity(fb: Any, name: str) -> None:
    clock = FakeClock(10**12)
    region = fb.SharedRegion(name, clock=clock)
    m = region.rate_limiter_map("m", "5/s", "100/h", capacity=16)
    other = region.rate_limiter_map("m", "5/s", "100/h", capacity=16)
    for i in range(400):
        (m if i % 3 else other).try_acquire(f"k{i % 50}")
        assert len(m) <= 16 and len(m._d) <= 16 and len(other._d) <= 16
        if i % 7 == 0:
            clock._ns += 10**7
    assert len(m) == 16 and m.metrics().evicted > 0


def _churn_growth(m: Any, clock: FakeClock, keys: list[str]) -> tuple[int, int]:
    gc.collect()
    tracemalloc.start()
    try:
        for k in keys[: m.max_keys]:
            m.try_acquire(k)
        full = tracemalloc.get_traced_memory()[0]
        for k in keys[m.max_keys :]:
            m.try_acquire(k)
            clock._ns += 1000
        gc.collect()
        return full, tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()


@not_on_free_threading
def test_memory_is_flat_under_churn(fb: Any, name: str) -> None:
    # Class: an unbounded key space (Sentinel PR #3391): 10 x capacity keys through the map; this
    # process's cache stays at one entry per slot at most.
    cap = 64
    clock = FakeClock(10**12)
    region = fb.SharedRegion(name, clock=clock)
    m = region.rate_limiter_map("m", "5/s", capacity=cap)
    keys = [f"k{i}" for i in range(10 * cap)]
    full, after = _churn_growth(m, clock, keys)
    print(f"\n[shared ratelimit map {fb.impl}] region {len(m._shared.table.view) / cap:.0f} "
          f"bytes per key; this process's cache {full / cap:.0f} bytes per key; after 10x "
          f"churn {after} (full {full})")  # fmt: skip
    assert len(m) == cap and len(m._d) <= cap and m.metrics().evicted == 9 * cap
    assert after <= full * 1.2 + 4096


# -- processes -----------------------------------------------------------------------------------
def _run(ctx: Any, target: Any, args_list: list[tuple[Any, ...]], q: Any) -> list[Any]:
    procs = [ctx.Process(target=target, args=args) for args in args_list]
    for p in procs:
        p.start()
    got = [q.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    return got


def test_four_processes_get_exactly_each_keys_burst(
    fb: Any, name: str, shared_clock: rs.SharedClock
) -> None:
    # Forked workers hammer four keys of one two-rate map at a fixed shared time: per key they
    # get the tight rate's burst exactly (no lost update, no charge for a refusal); after 10
    # intervals, 10 more each.
    region = fb.SharedRegion(name, clock=shared_clock)
    m = region.rate_limiter_map("api", *rrs.RATES, capacity=8)
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    args = [(fb.impl, name, shared_clock, 120, i, q) for i in range(4)]

    def total() -> dict[str, int]:
        out: dict[str, int] = {}
        for got in _run(ctx, rrs.hammer_map, args, q):
            for k, v in got.items():
                out[k] = out.get(k, 0) + v
        return out

    assert total() == dict.fromkeys(rrs.MAP_KEYS, 60)
    shared_clock.advance(10 * 60)  # the 60/h rate: 10 intervals of 60 s
    assert total() == dict.fromkeys(rrs.MAP_KEYS, 10)
    assert not any(m.try_acquire(k) for k in rrs.MAP_KEYS) and len(m) == 4


@pytest.mark.slow
def test_four_processes_with_a_moving_clock_stay_within_the_bound(
    fb: Any, name: str, shared_clock: rs.SharedClock
) -> None:
    # One worker advances the shared clock while all four hammer: per key, the total admitted
    # never exceeds burst + elapsed / T.
    region = fb.SharedRegion(name, clock=shared_clock)
    region.rate_limiter_map("api", *rrs.RATES, capacity=8)
    start = shared_clock()
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    args = [(fb.impl, name, shared_clock, 3000, i, q) for i in range(4)]
    totals: dict[str, int] = {}
    for got in _run(ctx, rrs.hammer_map, args, q):
        for k, v in got.items():
            totals[k] = totals.get(k, 0) + v
    elapsed = shared_clock() - start
    t_ns = 60 * 10**9  # the tight rate, 60/h
    for k in rrs.MAP_KEYS:
        assert 60 <= totals[k] <= 60 + elapsed // t_ns, (k, totals[k], elapsed)


def _same_home(n: int, cap: int, start: int = 0) -> list[str]:
    return rs.same_home(n, cap, start, prefix="ip-")


def _die_mid_write(core: str, name: str, clock: Any, key: str, step: str) -> None:
    """A writer that stops for good while giving a slot on ``key``'s path to a key: ``marked``
    (``key``'s slot made odd), ``half_key`` (another key's hash written over it), ``new_slot``
    (a never-assigned slot marked, half written)."""
    m = rs.region(core, name, clock).rate_limiter_map("m", *rrs.RATES, capacity=CAP)
    table = m._shared.table
    raw = _region_map.encode_key(key)
    table.lock.__enter__()
    if step == "new_slot":
        slot = table.free_slot(raw)
    else:
        slot = table.find(raw)[0]
    table.mark_rewriting(slot)
    if step != "marked":
        at = table.slots_at + slot * _region_map.SLOT_SIZE
        new = _region_map.encode_key("intruder")
        struct.pack_into("<qq", table.view, at, _region_map._hash(new), len(new))
    os.kill(os.getpid(), signal.SIGKILL)


CAP = 8


@pytest.mark.parametrize("step", ["marked", "half_key", "new_slot"])
def test_a_writer_killed_mid_insertion_wedges_nothing(
    fb: Any, name: str, shared_clock: rs.SharedClock, step: str
) -> None:
    region = fb.SharedRegion(name, clock=shared_clock)
    m = region.rate_limiter_map("m", *rrs.RATES, capacity=CAP)
    keys = _same_home(4, CAP)
    for k in keys[:3]:
        assert m.try_acquire(k)
    p = multiprocessing.get_context("fork").Process(
        target=_die_mid_write, args=(fb.impl, name, shared_clock, keys[0], step)
    )
    p.start()
    p.join(60)
    assert p.exitcode == -signal.SIGKILL
    table = m._shared.table
    assert sum(table.tag(s) & 1 for s in range(CAP)) == 1
    fresh = rs.region(fb.impl, name, shared_clock).rate_limiter_map("m", *rrs.RATES, capacity=CAP)
    for k in keys[1:3]:  # found past the odd slot, their debt kept
        assert k in fresh and fresh.retry_after(k, 60) > 0
    assert fresh.try_acquire(keys[3])  # a new key, after the repair
    assert sum(table.tag(s) & 1 for s in range(CAP)) == 0
    # the victim: kept whole ("marked"), or gone and admitted afresh
    assert (keys[0] in fresh) == (step != "half_key")
    assert fresh.try_acquire(keys[0], 60) == (step == "half_key")
    assert len(fresh) == 4 and "intruder" not in fresh
    for k in _same_home(CAP - 4, CAP, start=1000):  # the table fills to its capacity exactly
        assert m.try_acquire(k)
    assert len(m) == CAP and m.metrics().evicted == 0


@pytest.mark.slow
def test_random_kills_of_hammering_writers_leave_a_working_map(
    fb: Any, name: str, shared_clock: rs.SharedClock
) -> None:
    region = fb.SharedRegion(name, clock=shared_clock)
    m = region.rate_limiter_map("m", *rrs.RATES, capacity=CAP)
    ctx = multiprocessing.get_context("fork")
    rnd = random.Random(29)
    procs = [
        ctx.Process(target=rrs.churn_map, args=(fb.impl, name, shared_clock, i)) for i in range(4)
    ]
    for p in procs:
        p.start()
    try:
        for kill in range(40):
            time.sleep(rnd.uniform(0.005, 0.05))
            i = kill % len(procs)
            os.kill(procs[i].pid, signal.SIGKILL)
            procs[i].join(60)
            procs[i] = ctx.Process(
                target=rrs.churn_map, args=(fb.impl, name, shared_clock, 100 + kill)
            )
            procs[i].start()
    finally:
        for p in procs:
            os.kill(p.pid, signal.SIGKILL)
            p.join(60)
    shared_clock.advance(3600)
    fresh = rs.region(fb.impl, name, shared_clock).rate_limiter_map("m", *rrs.RATES, capacity=CAP)
    for i in range(24):  # every key can be found or inserted, and admitted
        assert fresh.try_acquire(f"k{i}")
        assert f"k{i}" in fresh
    table = m._shared.table
    assert sum(table.tag(s) & 1 for s in range(CAP)) == 0 and len(m) == CAP
