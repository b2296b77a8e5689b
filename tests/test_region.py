"""SharedRegion: breakers, budgets and bulkheads whose state every process of a host shares.

Real processes, with ``spawn`` and ``fork``, on both cores. Time is a ``SharedClock`` (an
int64 in shared memory that every process reads), moved by the test; nothing sleeps to wait
for a state change. The C-level stress hammer of ``test_stress`` runs in four processes on one
shared breaker, and the racy control build is caught there too.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import queue
import signal
import struct
import sys
import types
import uuid
from collections.abc import Iterator
from typing import Any

import hypothesis
import pytest
import region_support as rs

import capi_ext
import fastbreaker
from fastbreaker import _region

pytestmark = [
    pytest.mark.skipif(sys.platform == "win32", reason="SharedRegion is POSIX only"),
    pytest.mark.thread_unsafe(reason="starts processes and maps named segments"),
]

METHODS = ["spawn", "fork"]


@pytest.fixture
def name() -> Iterator[str]:
    n = "fbt-" + uuid.uuid4().hex[:12]
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


def run(method: str, target: Any, *args: Any) -> Any:
    """Run ``target(*args, q)`` in a new process; its one result."""
    ctx = multiprocessing.get_context(method)
    q = ctx.Queue()
    p = ctx.Process(target=target, args=(*args, q))
    p.start()
    try:
        while True:
            try:
                return q.get(timeout=1)
            except queue.Empty:
                assert p.is_alive(), f"the child ended with {p.exitcode} and no result"
    finally:
        p.join(60)
        assert p.exitcode == 0


# -- same name, same state -------------------------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
def test_a_trip_in_one_process_is_seen_by_the_next_allow_in_another(
    fb: types.SimpleNamespace, name: str, clock: rs.SharedClock, method: str
) -> None:
    region = fb.SharedRegion(name, clock=clock)
    b = region.breaker("up", failure_threshold=3)
    assert type(b) is fb.CircuitBreaker and b.name == "up"
    pid, seen = run(method, rs.trip, fb.impl, name, clock)
    assert pid != os.getpid() and seen == "OPEN"
    assert b.state == fb.State.OPEN and not b.allow()
    m = b.metrics()
    assert (m.permitted, m.failures, m.opened, m.rejected) == (3, 3, 1, 1)
    # another process sees it too, on its first call
    assert run(method, rs.observe, fb.impl, name, clock) == ("OPEN", False, 2)
    # lazy recovery works across processes: after the open period this process probes
    clock.advance(31)
    assert b.allow() and b.state == fb.State.HALF_OPEN
    b.record_success()
    assert run(method, rs.observe, fb.impl, name, clock)[:2] == ("CLOSED", True)
    del b
    region.close()


def test_callbacks_fire_in_the_process_that_made_the_transition(
    fb: types.SimpleNamespace, name: str, clock: rs.SharedClock
) -> None:
    region = fb.SharedRegion(name, clock=clock)
    b = region.breaker("up", failure_threshold=3)
    seen: list[tuple[str, str]] = []
    b.on_state_change(lambda br, old, new: seen.append((old.name, new.name)))
    run("fork", rs.trip, fb.impl, name, clock)
    assert seen == [] and b.state == fb.State.OPEN  # the child tripped it, its callbacks ran
    b.reset()
    assert seen == [("OPEN", "CLOSED")]


def test_two_breakers_in_one_process_share_one_state(
    fb: types.SimpleNamespace, name: str, clock: rs.SharedClock
) -> None:
    region = fb.SharedRegion(name, clock=clock)
    a = region.breaker("up", failure_threshold=2)
    b = region.breaker("up", failure_threshold=2)
    other = region.breaker("other", failure_threshold=2)
    assert a is not b
    a.allow()
    a.record_failure()
    b.allow()
    b.record_failure()
    assert a.state == b.state == fb.State.OPEN and other.state == fb.State.CLOSED
    assert region.objects() == {"up": "breaker", "other": "breaker"}


@pytest.mark.parametrize("mode", ["window", "window_seconds", "latency"])
def test_windows_and_histograms_live_in_the_region(
    fb: types.SimpleNamespace, name: str, clock: rs.SharedClock, mode: str
) -> None:
    opts: dict[str, Any] = {
        "window": dict(window=10, min_calls=4, failure_rate=0.5),
        "window_seconds": dict(window_seconds=10, min_calls=4, failure_rate=0.5),
        "latency": dict(record_latency=True, latency_buckets=[0.1, 1.0]),
    }[mode]
    region = fb.SharedRegion(name, clock=clock)
    a = region.breaker("w", **opts)
    b = region.breaker("w", **opts)
    if mode == "latency":
        a.call(lambda: None)
        b.call(lambda: None)
        lat = a.metrics().latency
        assert lat is not None and lat.count == 2 and b.metrics().latency == lat
        return
    for br in (a, b, a):
        assert br.allow()
        br.record_success()
    assert a.metrics().recorded == 3
    for br in (b, a):
        assert br.allow()
        br.record_failure()
    # 2 of 5 failed: closed; the third failure, from the other object, trips
    assert a.state == fb.State.CLOSED
    assert b.allow()
    b.record_failure()
    assert a.state == fb.State.OPEN and a.metrics().failures == 3


# -- options, layout and bad input ------------------------------------------------------------------
def test_other_options_for_the_same_name_name_the_option(
    fb: types.SimpleNamespace, name: str
) -> None:
    region = fb.SharedRegion(name)
    region.breaker("up", failure_threshold=3, reset_timeout=10)
    region.breaker("up", failure_threshold=3, reset_timeout=10)  # the same: fine
    with pytest.raises(ValueError, match="failure_threshold=3, asked with failure_threshold=4"):
        region.breaker("up", failure_threshold=4, reset_timeout=10)
    with pytest.raises(ValueError, match="reset_timeout"):
        region.breaker("up", failure_threshold=3)
    with pytest.raises(ValueError, match="is a breaker, not a retry_budget"):
        region.retry_budget("up")
    region.retry_budget("rb", ratio=0.2)
    with pytest.raises(ValueError, match="ratio"):
        region.retry_budget("rb", ratio=0.3)
    region.bulkhead("bh", 3)
    with pytest.raises(ValueError, match="max_concurrent=3, asked with max_concurrent=4"):
        region.bulkhead("bh", 4)


def test_bad_input_is_refused_clearly(fb: types.SimpleNamespace, name: str) -> None:
    with pytest.raises(ValueError, match="size must be an int in"):
        fb.SharedRegion(name, size=100)
    with pytest.raises(TypeError, match="size must be an int"):
        fb.SharedRegion(name, size=1.5)
    with pytest.raises(TypeError, match="name must be a str"):
        fb.SharedRegion(b"raw")
    with pytest.raises(ValueError, match="bytes of UTF-8 on this platform"):
        fb.SharedRegion("x" * (_region.REGION_NAME_MAX + 1))
    with pytest.raises(ValueError, match="without '/'"):
        fb.SharedRegion("a/b")
    with pytest.raises(FileNotFoundError, match="create it first"):
        fb.SharedRegion(name, create=False)
    region = fb.SharedRegion(name, size=_region.MIN_SIZE)
    with pytest.raises(ValueError, match="at most 63 bytes"):
        region.breaker("é" * 32)
    with pytest.raises(TypeError, match="takes no 'clock'"):
        region.breaker("up", clock=lambda: 0)
    with pytest.raises(TypeError, match="takes no 'name'"):
        region.breaker("up", name="other")
    with pytest.raises(ValueError, match="failure_threshold"):
        region.breaker("up", failure_threshold=0)
    with pytest.raises(ValueError, match="too small for breaker 'big'.*larger size"):
        region.breaker("big", window=1_000_000)
    with pytest.raises(ValueError, match="max_concurrent"):
        region.bulkhead("bh", 0)
    assert region.objects() == {}  # nothing half-built


def test_attaching_to_another_layout_version_or_core_is_refused(
    fb: types.SimpleNamespace, name: str
) -> None:
    region = fb.SharedRegion(name)
    buf = region._buf
    struct.pack_into("<q", buf, 8, _region.LAYOUT_VERSION + 1)
    region.close()
    with pytest.raises(ValueError, match=f"layout version {_region.LAYOUT_VERSION + 1}"):
        fb.SharedRegion(name, create=False)
    other = "python" if fb.impl == "c" else "c"
    if other == "c" and not fastbreaker.COMPILED:
        return
    # restore the version, then attach with the other core
    import _posixshmem  # type: ignore[import-not-found]

    _posixshmem.shm_unlink("/" + name)
    fb.SharedRegion(name).close()
    with pytest.raises(ValueError, match=f"made by the '{fb.impl}' core"):
        _region.region_class(other)(name, create=False)


def test_close_unmaps_once_the_objects_are_gone_and_unlink_removes_the_name(
    fb: types.SimpleNamespace, name: str
) -> None:
    region = fb.SharedRegion(name)
    b = region.breaker("up")
    budget, bulkhead = region.retry_budget("rb"), region.bulkhead("bh", 2)
    m = region.breaker_map("m", capacity=2)
    region.unlink()
    region.close()
    with pytest.raises(ValueError, match="closed"):
        region.breaker("up")
    # the objects keep working: their state is in the mapping, which stays while they live
    assert b.allow() and budget.allow_retry() and bulkhead.try_acquire() and m.allow("k")
    assert name in _region._segments
    del b, budget, m
    gc.collect()
    assert name in _region._segments and bulkhead.in_flight == 1
    bulkhead.release()
    del bulkhead
    gc.collect()
    assert name not in _region._segments  # unmapped with the last object
    with pytest.raises(FileNotFoundError):
        fb.SharedRegion(name, create=False)


# -- exact accounting across processes ---------------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
def test_four_processes_leave_exact_metrics(
    fb: types.SimpleNamespace, name: str, clock: rs.SharedClock, method: str
) -> None:
    region = fb.SharedRegion(name, clock=clock)
    b = region.breaker("hot", failure_threshold=1_000_000, ignore=(KeyError,))
    n = 3000 if fb.impl == "c" else 600
    ctx = multiprocessing.get_context(method)
    q = ctx.Queue()
    procs = [
        ctx.Process(target=rs.hammer_calls, args=(fb.impl, name, clock, n, i, q)) for i in range(4)
    ]
    for p in procs:
        p.start()
    admitted = sum(q.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    m = b.metrics()
    fails = sum(1 for i in range(4) for k in range(i, i + n) if k % 7 == 0)
    neutral = sum(1 for i in range(4) for k in range(i, i + n) if k % 7 and k % 11 == 0)
    assert admitted == m.permitted == 4 * n
    assert (m.failures, m.ignored, m.successes) == (fails, neutral, 4 * n - fails - neutral)
    assert m.stale == m.rejected == 0 and m.state == fb.State.CLOSED


@pytest.mark.parametrize("method", METHODS)
def test_a_shared_budget_conserves_tokens_exactly(
    fb: types.SimpleNamespace, name: str, clock: rs.SharedClock, method: str
) -> None:
    region = fb.SharedRegion(name, clock=clock)
    budget = region.retry_budget("rb", ratio=0.5, capacity=50, min_per_sec=0)
    ctx = multiprocessing.get_context(method)
    q = ctx.Queue()

    def together(target: Any, *args: Any) -> int:
        procs = [
            ctx.Process(target=target, args=(fb.impl, name, clock, *args, q)) for _ in range(4)
        ]
        for p in procs:
            p.start()
        total = sum(q.get(timeout=120) for _ in procs)
        for p in procs:
            p.join(60)
            assert p.exitcode == 0
        return int(total)

    # 4 x 40 tries on a full bucket of 50: exactly 50 succeed across the processes
    assert together(rs.take_all, 40) == 50 and budget.tokens == 0
    # 4 x 15 successes deposit 30 tokens; 4 x 10 tries take exactly those 30
    assert together(rs.deposit_budget, 15) == 60 and budget.tokens == 30
    assert together(rs.take_all, 10) == 30 and budget.tokens == 0
    assert not budget.allow_retry()


def test_a_shared_bulkhead_bounds_every_process_and_reclaims_a_killed_holder(
    fb: types.SimpleNamespace, name: str, clock: rs.SharedClock
) -> None:
    region = fb.SharedRegion(name, clock=clock)
    bh = region.bulkhead("bh", 4)
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=rs.hold_slots, args=(fb.impl, name, clock, 3, q))
    p.start()
    try:
        pid, got = q.get(timeout=60)
        assert got == [True, True, True] and bh.in_flight == 3
        assert bh.try_acquire() and not bh.try_acquire()
        with pytest.raises(fb.BulkheadFullError):
            with bh:
                pass
        os.kill(pid, signal.SIGKILL)
    finally:
        p.join(60)
    # the holder is gone; its slots are reclaimed by the next try_acquire() that finds none
    # free, at most once every 100 ms (the last reclaim ran with the refusal above)
    assert not bh.try_acquire()
    clock.advance(0.1)
    assert bh.try_acquire() and bh.in_flight == 2
    assert bh.try_acquire() and bh.try_acquire() and not bh.try_acquire()
    for _ in range(4):
        bh.release()
    with pytest.raises(RuntimeError, match="nothing is held"):
        bh.release()
    m = bh.metrics()
    assert (m.in_flight, m.waiting, m.peak_in_flight) == (0, 0, 4)
    assert m.admitted == 3 + 1 + 3 and m.rejected == 4


# -- a process killed inside a claimed transition -------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
def test_a_process_killed_inside_a_transition_stops_no_one(
    fb: types.SimpleNamespace, name: str, clock: rs.SharedClock, method: str
) -> None:
    region = fb.SharedRegion(name, clock=clock)
    b = region.breaker("up", failure_threshold=3)
    assert b.allow()
    b.record_success()
    ctx = multiprocessing.get_context(method)
    # a pipe the child's C hook writes one raw byte to (a Connection crosses to a spawned child)
    reader, writer = ctx.Pipe(duplex=False)
    p = ctx.Process(target=rs.stall_in_transition, args=(fb.impl, name, clock, writer), daemon=True)
    p.start()
    try:
        assert os.read(reader.fileno(), 1) == b"x"  # the child is inside its claimed trip
        os.kill(p.pid, signal.SIGKILL)
    finally:
        p.join(60)
        reader.close()
        writer.close()
    assert p.exitcode == -signal.SIGKILL
    if fb.impl == "c":
        from fastbreaker import _breaker_c

        # The claim's owner is gone, but the claim is younger than the bound (10 ms): rejected,
        # nobody waits. Past the bound the next caller rolls the trip back and goes on. (This
        # process's claim clock is moved, back then forward: the bound is real time.)
        try:
            _breaker_c._test_claim_clock_shift(-(10**12))
            assert b.state == fb.State.CLOSED and not b.allow()
            _breaker_c._test_claim_clock_shift(20_000_000)
            assert b.allow()
        finally:
            _breaker_c._test_claim_clock_shift(0)
    else:
        # the kernel dropped the dead process's record lock; the record is the one from before
        assert b.allow()
    assert b.state == fb.State.CLOSED
    b.record_success()
    for _ in range(3):
        assert b.allow()
        b.record_failure()
    assert b.state == fb.State.OPEN and not b.allow()
    m = b.metrics()
    assert m.permitted == m.successes + m.failures + m.ignored + m.stale
    b.reset()
    assert b.state == fb.State.CLOSED and b.allow()


# -- the stress hammer across processes, and its racy control ---------------------------------------
needs_cc = pytest.mark.skipif(
    not (fastbreaker.COMPILED and capi_ext.have_compiler()),
    reason="needs the compiled core and a C compiler",
)


def hammer_processes(
    region: Any, core: types.ModuleType, client: Any, seconds: float, obj: str = "stress"
) -> Any:
    import test_stress

    b = region._breaker_of(core, obj, (), dict(test_stress.BREAKER_CONFIGS["consecutive"]))
    ctx = multiprocessing.get_context("fork")  # the breaker made before the fork: preload_app
    pipes, procs = [], []
    for _ in range(4):
        parent, child = ctx.Pipe(duplex=False)
        p = ctx.Process(target=rs.hammer_c, args=(client, b, seconds, child))
        p.start()
        pipes.append(parent)
        procs.append(p)
    logs = [conn.recv() for conn in pipes]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    return test_stress.check_breaker(client, b, logs)


@needs_cc
def test_stress_invariants_hold_across_four_processes(
    name: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from fastbreaker import _breaker_c

    client = capi_ext.cached("client", tmp_path_factory)
    region = _region.region_class("c")(name)
    report = hammer_processes(region, _breaker_c, client, 1.0)
    print(f"\n[stress shared breaker, 4 processes] {report}")
    assert not report.violations, str(report)


@pytest.mark.slow  # a racy control: needs both cores to itself (`.ci/run slow`)
@needs_cc
def test_the_racy_control_is_caught_across_processes(
    name: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    if capi_ext.core_source_dir() is None:
        pytest.skip("the core's .pyx sources are not available to build the racy control")
    racy = capi_ext.cached("racy", tmp_path_factory)
    core = sys.modules[racy.CircuitBreaker.__module__]
    region = _region.region_class("c")(name)
    reports = []
    for attempt in range(4):
        reports.append(hammer_processes(region, core, racy.client, 1.0, f"stress{attempt}"))
        if reports[-1].violations:
            break
    print(f"\n[stress shared breaker racy] {reports[-1]}")
    assert reports[-1].violations, f"the racy core went undetected: {[str(r) for r in reports]}"


# -- the shared map ---------------------------------------------------------------------------------
def shared_map(fb: types.SimpleNamespace, region: Any, **options: Any) -> Any:
    return region.breaker_map("hosts", capacity=8, failure_threshold=2, **options)


@pytest.mark.parametrize("method", METHODS)
def test_a_shared_map_is_one_map_for_every_process(
    fb: types.SimpleNamespace, name: str, clock: rs.SharedClock, method: str
) -> None:
    region = fb.SharedRegion(name, clock=clock)
    m = shared_map(fb, region)
    assert type(m) is fb.BreakerMap and len(m) == 0
    assert m.allow(b"raw") and m.allow("a")
    m.record_success(b"raw")
    m.record_success("a")
    # another process trips "a" ...
    assert run(method, rs.map_fail, fb.impl, name, clock, "a", 2, 1.0) == "OPEN"
    # ... and this one's cached breaker for "a" sees it on its next call
    assert not m.allow("a") and m["a"].state == fb.State.OPEN
    assert m.open_keys() == ["a"] and "a" in m and b"raw" in m and "raw" not in m
    assert run(method, rs.map_look, fb.impl, name, clock) == (
        sorted(["'a'", "b'raw'"]),
        2,
        False,
        ["a"],
    )
    mm = m.metrics()
    assert (mm.keys, mm.open, mm.permitted, mm.failures, mm.rejected) == (2, 1, 4, 2, 2)
    assert sorted(map(repr, m)) == ["'a'", "b'raw'"] and m.get("zz") is None


def test_a_full_shared_map_evicts_by_breakermaps_rules_in_any_process(
    fb: types.SimpleNamespace, name: str, clock: rs.SharedClock
) -> None:
    region = fb.SharedRegion(name, clock=clock)
    m = region.breaker_map("hosts", capacity=4, failure_threshold=2)
    for key in "abgh":
        assert m.allow(key)
    for key in "abh":
        m.record_success(key)
    # "a" trips, "b" carries information (one failure), "g" has a call in flight, "h" is idle
    for _ in range(2):
        m.allow("a")
        m.record_failure("a")
    m.allow("b")
    m.record_failure("b")
    assert m["a"].state == fb.State.OPEN and len(m) == 4
    # another process adds "n1": the idle "h" goes (lossless), nothing else
    assert run("fork", rs.map_fill, fb.impl, name, clock, ["n1"], 4) == 1
    assert set(m) == {"a", "b", "g", "n1"} and "h" not in m
    # "n1" gets a call in flight: no idle breaker is left, so "n2" evicts "b", the only CLOSED
    # one without a call in flight (it loses b's one failure)
    assert m.allow("n1")
    assert m.allow("n2")
    m.record_success("n2")
    assert set(m) == {"a", "g", "n1", "n2"}
    # "n2" fails once (information, no call in flight): "n3" takes it before the busy ones
    m.allow("n2")
    m.record_failure("n2")
    assert m.allow("n3")
    assert set(m) == {"a", "g", "n1", "n3"}
    # only busy and OPEN ones left: "n4" evicts a busy one; OPEN "a" stays throughout
    m.record_success("n3")
    m.allow("n3")
    assert m.allow("n4")
    assert "a" in m and "n4" in m and len(m) == 4 and m.open_keys() == ["a"]
    mm = m.metrics()
    assert mm.evicted == 4 and mm.keys == 4 and mm.open == 1 and mm.untracked == 0
    # the totals include the evicted breakers: every admission is counted once
    assert mm.permitted == 4 + 2 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1
    # an outcome of "g" that comes back after its eviction is stale or counts for "g" again
    m.record_success("g")
    assert m["g"].state == fb.State.CLOSED


def test_when_every_slot_is_not_closed_a_new_key_gets_an_untracked_breaker(
    fb: types.SimpleNamespace, name: str, clock: rs.SharedClock
) -> None:
    region = fb.SharedRegion(name, clock=clock)
    m = region.breaker_map("hosts", capacity=2, failure_threshold=1)
    for key in ("a", "b"):
        m.allow(key)
        m.record_failure(key)
    assert set(m.open_keys()) == {"a", "b"}
    b = m["new"]
    assert b.state == fb.State.CLOSED and "new" not in m and len(m) == 2
    assert m.metrics().untracked == 1


def test_max_open_ratio_holds_across_processes(
    fb: types.SimpleNamespace, name: str, clock: rs.SharedClock
) -> None:
    region = fb.SharedRegion(name, clock=clock)
    m = region.breaker_map("hosts", capacity=8, failure_threshold=2, max_open_ratio=0.25)
    for key in "abcd":
        assert m.allow(key)
        m.record_success(key)
    # 4 keys, ratio 0.25: one may open; another process fails two keys
    assert run("fork", rs.map_fail, fb.impl, name, clock, "a", 2, 0.25) == "OPEN"
    assert run("fork", rs.map_fail, fb.impl, name, clock, "b", 2, 0.25) == "CLOSED"
    assert m.open_keys() == ["a"] and m.metrics().suppressed_trips == 1


def test_shared_map_bad_input(fb: types.SimpleNamespace, name: str) -> None:
    region = fb.SharedRegion(name)
    with pytest.raises(TypeError, match="takes no 'max_keys'"):
        region.breaker_map("m", capacity=4, max_keys=4)
    with pytest.raises(TypeError, match="takes no 'clock'"):
        region.breaker_map("m", capacity=4, clock=lambda: 0)
    with pytest.raises(ValueError, match="capacity must be in"):
        region.breaker_map("m", capacity=0)
    with pytest.raises(TypeError, match="capacity"):
        region.breaker_map("m", capacity="4")
    with pytest.raises(ValueError, match="max_open_ratio"):
        region.breaker_map("m", capacity=4, max_open_ratio=2.0)
    m = region.breaker_map("m", capacity=4)
    with pytest.raises(ValueError, match="capacity=4, asked with capacity=5"):
        region.breaker_map("m", capacity=5)
    for bad in (3, ("a", "b"), None):
        with pytest.raises(TypeError, match="str or bytes"):
            m.allow(bad)
    with pytest.raises(ValueError, match="at most 239 bytes"):
        m.allow("x" * 240)
    assert len(m) == 0 and m.get(3) is None and 3 not in m


def test_a_probe_held_by_a_killed_process_is_reclaimed_by_probe_timeout(
    fb: types.SimpleNamespace, name: str, clock: rs.SharedClock
) -> None:
    region = fb.SharedRegion(name, clock=clock)
    b = region.breaker("up", failure_threshold=1, reset_timeout=10, probe_timeout=5)
    b.allow()
    b.record_failure()
    clock.advance(10)
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=rs.take_probe, args=(fb.impl, name, clock, q))
    p.start()
    try:
        assert q.get(timeout=60) is True  # the child holds the one probe
        os.kill(p.pid, signal.SIGKILL)
    finally:
        p.join(60)
    assert b.state == fb.State.HALF_OPEN and not b.allow()  # its probe is still out
    clock.advance(5)
    # probe_timeout: the lost probe counts as failed, the breaker re-opens with backoff as today
    assert not b.allow() and b.state == fb.State.OPEN
    clock.advance(10)
    assert b.allow() and b.state == fb.State.HALF_OPEN
    b.record_success()
    assert b.state == fb.State.CLOSED


@pytest.mark.skipif(not fastbreaker.COMPILED, reason="compares the compiled core with the twin")
@hypothesis.given(
    cap=hypothesis.strategies.integers(1, 4),
    ops=hypothesis.strategies.lists(
        hypothesis.strategies.sampled_from(["try", "release", "with", "with_raises", "call"]),
        max_size=40,
    ),
)
@hypothesis.settings(max_examples=150, deadline=None)
def test_shared_bulkheads_of_both_cores_agree_step_by_step(cap: int, ops: list[str]) -> None:
    regions = [
        _region.region_class(core)(f"fbbh-{uuid.uuid4().hex[:12]}", size=_region.MIN_SIZE)
        for core in ("c", "python")
    ]
    for r in regions:
        r.unlink()
    sides = [r.bulkhead("bh", cap) for r in regions]

    def step(bh: Any, op: str) -> Any:
        try:
            if op == "try":
                return bh.try_acquire()
            if op == "release":
                return bh.release()
            if op == "call":
                return bh.call(lambda: "ok")
            with bh:
                if op == "with_raises":
                    raise KeyError("inside")
            return "with"
        except Exception as exc:
            return type(exc).__name__

    for op in ops:
        assert step(sides[0], op) == step(sides[1], op), op
        assert sides[0].metrics() == sides[1].metrics()
        assert sides[0].in_flight == sides[1].in_flight
    del sides
    for r in regions:
        r.close()


def test_the_lock_file_fallback_works_across_processes(
    fb: types.SimpleNamespace, name: str, clock: rs.SharedClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # macOS refuses record locks on POSIX shared memory: the region then locks a file beside it
    monkeypatch.setattr(_region, "FORCE_LOCK_FILE", True)
    region = fb.SharedRegion(name, clock=clock)
    assert region._seg.lock_file >= 0 and os.path.exists(_region.lock_file_path(name))
    b = region.breaker("up", failure_threshold=3)
    assert run("fork", rs.trip, fb.impl, name, clock)[1] == "OPEN"
    assert b.state == fb.State.OPEN and not b.allow()
    bh = region.bulkhead("bh", 4)
    assert run("fork", rs.observe, fb.impl, name, clock)[:2] == ("OPEN", False)
    assert bh.try_acquire()
    bh.release()
    del b, bh
    region.unlink()
    region.close()
    assert not os.path.exists(_region.lock_file_path(name))


def test_a_shared_breaker_cannot_be_reconfigured_in_one_process(
    fb: types.SimpleNamespace, name: str
) -> None:
    from fastbreaker._options import BreakerOptions

    region = fb.SharedRegion(name)
    b = region.breaker("up", failure_threshold=3)
    with pytest.raises(ValueError, match="cannot be reconfigured: its options are the region's"):
        b._config.reconfigure(BreakerOptions(failure_threshold=9, name="up"))
    assert b._config.options.failure_threshold == 3
