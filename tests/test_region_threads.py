"""SharedRegion objects under threads and processes, on both cores (each region's name carries
its core, so that a spawned child attaches with the same one).

Cross-process checks run real processes (``multiprocessing`` spawn and fork). Time is a shared
fake clock (an int64 in a ``multiprocessing.Value``), never a sleep: a process waits for another
only through a queue, a pipe or ``join``, each with a bounded timeout.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import multiprocessing
import os
import signal
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import fastbreaker
from fastbreaker import _breaker_py, _budget_py
from fastbreaker._errors import BulkheadFullError
from fastbreaker._options import TOKEN_UNIT
from fastbreaker._region import SharedRecord, SharedRegion, region_class

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX only")

IMPLS = list(fastbreaker.testing.implementations())
METHODS = ["spawn", "fork"]
TIMEOUT = 60.0
N = 200  # operations per thread in the counting tests


class ValueClock:
    """A FakeClock (int ns) whose reading every process shares: a ``multiprocessing.Value``."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __call__(self) -> int:
        return int(self.value.value)

    def advance(self, seconds: float) -> None:
        with self.value.get_lock():
            self.value.value += round(seconds * 1e9)


def make_clock(ctx: Any) -> ValueClock:
    return ValueClock(ctx.Value("q", 1_000_000_000_000))


def bulkhead(r: SharedRegion, name: str, n: int) -> Any:
    return r.bulkhead(name, n)


@pytest.fixture(params=IMPLS)
def region(request: pytest.FixtureRequest) -> Iterator[Callable[..., SharedRegion]]:
    """A factory of fresh regions of one core, closed and unlinked after the test."""
    made: list[SharedRegion] = []
    core = request.param

    def make(clock: Any = None) -> SharedRegion:
        r = region_class(core)(f"fbtest-{core}-{uuid.uuid4().hex[:8]}", size=1 << 20, clock=clock)
        made.append(r)
        return r

    yield make
    gc.collect()
    for r in made:
        try:
            # a free-threaded build may free a dropped object's view of the mapping a moment
            # late: the mapping then stays until the process ends (its name is unlinked below)
            with contextlib.suppress(BufferError):
                r.close()
        finally:
            r.unlink()


def run(ctx: Any, target: Callable[..., Any], *args: Any) -> Any:
    p = ctx.Process(target=target, args=args)
    p.start()
    return p


def join_ok(*procs: Any) -> None:
    for p in procs:
        p.join(TIMEOUT)
        assert p.exitcode == 0, f"{p.name} ended with {p.exitcode}"


def core_of(name: str) -> str:
    return name.split("-")[1]


def attach(name: str, clock: Any) -> SharedRegion:
    return region_class(core_of(name))(name, create=False, clock=clock)


# -- breaker: a trip in one process is seen by the next allow() in another ---------------------
BREAKER = {"failure_threshold": 3, "reset_timeout": 30}


def child_trip(name: str, clock: Any, q: Any) -> None:
    b = attach(name, clock).breaker("svc", **BREAKER)
    events: list[tuple[str, str]] = []
    b.on_state_change(lambda br, old, new: events.append((old.name, new.name)))
    for _ in range(3):
        assert b.allow()
        b.record_failure()
    q.put((b.state.name, events))


def child_report(name: str, clock: Any, q: Any) -> None:
    b = attach(name, clock).breaker("svc", **BREAKER)
    q.put((b.state.name, b.metrics()))


@pytest.mark.parametrize("method", METHODS)
def test_trip_in_one_process_seen_by_the_next_allow_in_another(
    method: str, region: Callable[..., SharedRegion]
) -> None:
    ctx = multiprocessing.get_context(method)
    clock = make_clock(ctx)
    r = region(clock)
    b = r.breaker("svc", **BREAKER)
    events: list[tuple[str, str]] = []
    b.on_state_change(lambda br, old, new: events.append((old.name, new.name)))
    q = ctx.Queue()
    join_ok(run(ctx, child_trip, r.name, clock, q))
    # the child's callback fired in the child, not here
    assert q.get(timeout=TIMEOUT) == ("OPEN", [("CLOSED", "OPEN")])
    assert events == []
    assert b.state.name == "OPEN"
    assert not b.allow()
    assert b.retry_after == 30.0
    clock.advance(30)
    assert b.allow()  # the probe: OPEN -> HALF_OPEN here
    b.record_success()
    assert events == [("OPEN", "HALF_OPEN"), ("HALF_OPEN", "CLOSED")]
    join_ok(run(ctx, child_report, r.name, clock, q))
    state, m = q.get(timeout=TIMEOUT)
    assert state == "CLOSED"
    assert m == b.metrics()
    assert (m.permitted, m.rejected, m.successes, m.failures, m.opened) == (4, 1, 1, 3, 1)
    assert (m.probe_successes, m.open_seconds_total) == (1, 30.0)


# -- breaker: 4 processes x 2 threads, exact metrics --------------------------------------------
COUNTING = {
    "consec": {"failure_threshold": 10**9, "record_latency": True},
    "count": {"window": 64, "min_calls": 64, "failure_rate": 1.0},
    "time": {"window_seconds": 10, "min_calls": 10**9},
}


def breakers(r: SharedRegion) -> dict[str, Any]:
    return {key: r.breaker(key, **opts) for key, opts in COUNTING.items()}


def counting_work(bs: dict[str, Any]) -> None:
    for i in range(N):
        for b in bs.values():
            assert b.allow()
            if i % 3 == 0:
                b.record_failure()
            else:
                b.record_success(0.002)


def child_counting(name: str, clock: Any, barrier: Any) -> None:
    bs = breakers(attach(name, clock))
    barrier.wait(TIMEOUT)
    threads = [threading.Thread(target=counting_work, args=(bs,)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


@pytest.mark.parametrize("method", METHODS)
def test_four_processes_leave_exact_metrics(
    method: str, region: Callable[..., SharedRegion]
) -> None:
    ctx = multiprocessing.get_context(method)
    clock = make_clock(ctx)
    r = region(clock)
    bs = breakers(r)
    barrier = ctx.Barrier(4)
    join_ok(*[run(ctx, child_counting, r.name, clock, barrier) for _ in range(4)])
    total = 4 * 2 * N
    failures = 4 * 2 * len(range(0, N, 3))
    for key, b in bs.items():
        m = b.metrics()
        assert m.state.name == "CLOSED", key
        assert (m.permitted, m.rejected, m.stale) == (total, 0, 0), key
        assert (m.successes, m.failures) == (total - failures, failures), key
    lat = bs["consec"].metrics().latency
    assert lat is not None and lat.count == total - failures
    assert lat.counts[0] == total - failures  # 2 ms <= 5 ms
    assert lat.sum == pytest.approx((total - failures) * 0.002)
    assert bs["count"].metrics().recorded == 64
    m = bs["time"].metrics()
    assert m.recorded == total and m.failure_rate == failures / total


def test_threads_of_one_process_share_the_state(region: Callable[..., SharedRegion]) -> None:
    r = region()
    a = breakers(r)
    b = breakers(r)  # other objects, the same state
    threads = [threading.Thread(target=counting_work, args=(x,)) for x in (a, b, a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for key in COUNTING:
        assert a[key].metrics() == b[key].metrics()
        assert a[key].metrics().permitted == 4 * N


def test_shared_breaker_state_machine_in_one_process(region: Callable[..., SharedRegion]) -> None:
    from fastbreaker.testing import FakeClock

    clock = FakeClock(10**12)
    r = region(clock)
    a = r.breaker("x", failure_threshold=2, reset_timeout=5, max_reset_timeout=20)
    b = r.breaker("x", failure_threshold=2, reset_timeout=5, max_reset_timeout=20)
    a.isolate()
    assert b.state.name == "ISOLATED" and b.retry_after == float("inf")
    assert repr(b) == "<CircuitBreaker name='x' state=ISOLATED>"
    b.reset()
    assert a.state.name == "CLOSED"
    a.trip()
    clock.advance(5)
    assert b.allow()  # probe
    a.record_failure()  # the probe fails: backoff level 1 -> 10 s
    assert b.retry_after == 10.0
    clock.advance(10)
    assert a.allow()
    b.record_success()
    assert a.state.name == "CLOSED"
    res = b._fleet(1, -1, 1, 7.0, 0)
    assert res[0] and a.state.name == "OPEN" and a.retry_after == 7.0
    # differing options are refused
    with pytest.raises(ValueError, match="failure_threshold"):
        r.breaker("x", failure_threshold=3, reset_timeout=5, max_reset_timeout=20)


# -- the stall hook: a process killed inside a transition leaves the state before it ------------
STALL = {"failure_threshold": 2, "reset_timeout": 30}


def child_stall(name: str, clock: Any, fd_conn: Any) -> None:
    b = attach(name, clock).breaker("s", **STALL)
    assert b.allow()
    b.record_failure()
    _breaker_py._test_stall_in_claim(fd_conn.fileno())
    assert b.allow()
    b.record_failure()  # trips: the hook writes b"x" and blocks
    raise AssertionError("the stall hook did not block")


def child_use_after_stall(name: str, clock: Any, q: Any) -> None:
    b = attach(name, clock).breaker("s", **STALL)
    before = b.metrics()
    assert b.allow()
    b.record_failure()
    q.put((before, b.state.name))


@pytest.mark.parametrize("method", METHODS)
def test_killed_inside_a_transition_leaves_the_state_before_it(
    method: str, region: Callable[..., SharedRegion]
) -> None:
    ctx = multiprocessing.get_context(method)
    clock = make_clock(ctx)
    r = region(clock)
    if core_of(r.name) != "python":
        pytest.skip("the twin's record: the compiled core's case is in test_region.py")
    b = r.breaker("s", **STALL)
    reader, writer = ctx.Pipe(duplex=False)
    p = run(ctx, child_stall, r.name, clock, writer)
    try:
        assert reader.poll(TIMEOUT), "the child never reached the stall"
        assert os.read(reader.fileno(), 1) == b"x"
        # it holds the record lock now; kill it there
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.join(TIMEOUT)
    assert p.exitcode == -signal.SIGKILL
    q = ctx.Queue()
    join_ok(run(ctx, child_use_after_stall, r.name, clock, q))
    before, state = q.get(timeout=TIMEOUT)
    # the second allow() was stored; the failure that tripped (and the trip) were not
    assert before.state.name == "CLOSED"
    assert (before.permitted, before.failures, before.consecutive_failures) == (2, 1, 1)
    assert state == "OPEN"  # the other process's failure made the second one: it tripped
    m = b.metrics()
    assert (m.permitted, m.failures, m.opened, m.state.name) == (3, 2, 1, "OPEN")
    assert _breaker_py._stall_fd == -1  # the hook was only set in the child


@pytest.mark.parametrize("core", IMPLS)
def test_stall_hook_ignores_local_breakers(core: str) -> None:
    mod = _breaker_py if core == "python" else importlib.import_module("fastbreaker._breaker_c")
    rd, wr = os.pipe()
    try:
        mod._test_stall_in_claim(wr)
        b = mod.CircuitBreaker(failure_threshold=1)
        b.allow()
        b.record_failure()  # a local breaker: no stall
        assert b.state.name == "OPEN"
    finally:
        mod._test_stall_in_claim(-1)
        os.close(rd)
        os.close(wr)


def test_a_torn_store_leaves_the_previous_record() -> None:
    view = memoryview(bytearray(SharedRecord.footprint(12)))
    rec = SharedRecord(view, 12)
    rec.store(b"a" * 12)
    rec.store(b"b" * 12)
    # a writer killed halfway through the next store: the copy not in use is half written
    which = int.from_bytes(view[:8], "little") ^ 1
    start = 8 + which * 16
    view[start : start + 6] = b"c" * 6
    assert rec.load() == b"b" * 12


# -- retry budget ----------------------------------------------------------------------------
BUDGET = {"ratio": 0.5, "capacity": 10_000.0, "min_per_sec": 0.0}


def child_budget(name: str, clock: Any, barrier: Any, q: Any) -> None:
    bud = attach(name, clock).retry_budget("b", **BUDGET)
    granted = [0, 0]

    def work(k: int) -> None:
        for i in range(3 * N):
            granted[k] += bud.allow_retry()
            if i % 3 == 0:
                bud.record_success()

    barrier.wait(TIMEOUT)
    threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    q.put(sum(granted))


@pytest.mark.parametrize("method", METHODS)
def test_budget_conserves_tokens_across_processes(
    method: str, region: Callable[..., SharedRegion]
) -> None:
    ctx = multiprocessing.get_context(method)
    clock = make_clock(ctx)
    r = region(clock)
    bud = r.retry_budget("b", **BUDGET)
    # leave 300 tokens: the deposits (4 * 2 * N/3 * 0.5 < 300) never reach the capacity
    assert bud._fleet(-(10_000 - 300) * TOKEN_UNIT) == 300 * TOKEN_UNIT
    barrier, q = ctx.Barrier(4), ctx.Queue()
    join_ok(*[run(ctx, child_budget, r.name, clock, barrier, q) for _ in range(4)])
    granted = sum(q.get(timeout=TIMEOUT) for _ in range(4))
    deposits = 4 * 2 * len(range(0, 3 * N, 3))
    assert granted < 4 * 2 * 3 * N  # some were refused: the bucket ran dry
    assert bud._fleet(0) == 300 * TOKEN_UNIT + deposits * TOKEN_UNIT // 2 - granted * TOKEN_UNIT


def child_refill(name: str, clock: Any, q: Any) -> None:
    bud = attach(name, clock).retry_budget("r", ratio=0.0, capacity=5.0, min_per_sec=1.0)
    q.put([bud.allow_retry() for _ in range(3)])


@pytest.mark.parametrize("method", METHODS)
def test_budget_refill_is_credited_once_for_all_processes(
    method: str, region: Callable[..., SharedRegion]
) -> None:
    ctx = multiprocessing.get_context(method)
    clock = make_clock(ctx)
    r = region(clock)
    bud = r.retry_budget("r", ratio=0.0, capacity=5.0, min_per_sec=1.0)
    assert [bud.allow_retry() for _ in range(6)] == [True] * 5 + [False]
    clock.advance(2)
    q = ctx.Queue()
    join_ok(run(ctx, child_refill, r.name, clock, q))
    assert q.get(timeout=TIMEOUT) == [True, True, False]
    assert bud.tokens == 0.0  # the child's refill moved the shared refill time
    assert repr(bud) == "RetryBudget(ratio=0.0, capacity=5.0, min_per_sec=1.0, tokens=0.0)"


# -- bulkhead --------------------------------------------------------------------------------
def child_hold(name: str, clock: Any, q: Any, go: Any) -> None:
    bh = bulkhead(attach(name, clock), "bh", 3)
    assert bh.try_acquire() and bh.try_acquire()
    q.put(("held", os.getpid()))
    go.wait(TIMEOUT)  # killed while waiting here
    raise AssertionError("not killed")


def child_release_none(name: str, clock: Any, q: Any) -> None:
    bh = bulkhead(attach(name, clock), "bh", 3)
    try:
        bh.release()
    except RuntimeError as exc:
        q.put(str(exc))
    else:
        q.put("released")
    q.put(bh.metrics().in_flight)


@pytest.mark.parametrize("method", METHODS)
def test_bulkhead_slots_across_processes_and_reclaim(
    method: str, region: Callable[..., SharedRegion]
) -> None:
    ctx = multiprocessing.get_context(method)
    clock = make_clock(ctx)
    r = region(clock)
    bh = bulkhead(r, "bh", 3)
    q, go = ctx.Queue(), ctx.Event()
    p = run(ctx, child_hold, r.name, clock, q, go)
    try:
        assert q.get(timeout=TIMEOUT) == ("held", p.pid)
        assert bh.in_flight == 2
        assert bh.try_acquire()
        assert not bh.try_acquire()  # full; the scan finds every owner alive
        with pytest.raises(BulkheadFullError):
            bh.call(lambda: None)
        with pytest.raises(BulkheadFullError), bh:
            pass
        # a process that holds nothing cannot release another's slot
        join_ok(run(ctx, child_release_none, r.name, clock, q))
        assert q.get(timeout=TIMEOUT) == "release() without a matching acquisition: nothing is held"
        assert q.get(timeout=TIMEOUT) == 3
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.join(TIMEOUT)  # reaped: no zombie keeps its pid alive
    assert not bh.try_acquire()  # the last scan was less than 100 ms ago
    clock.advance(0.1)
    assert bh.try_acquire()  # the killed holder's 2 slots are freed, one taken
    m = bh.metrics()
    assert (m.in_flight, m.waiting, m.admitted, m.peak_in_flight) == (2, 0, 4, 3)
    assert m.rejected == 4
    assert bh.call(lambda: 42) == 42
    bh.release()
    bh.release()
    with pytest.raises(RuntimeError, match="nothing is held"):
        bh.release()
    assert "in_flight=0" in repr(bh)
    assert bh.metrics().in_flight == 0


def child_fork_release(bh: Any, q: Any) -> None:
    try:
        bh.release()  # the parent's slot: not this process's
        q.put("released")
    except RuntimeError:
        q.put("refused")
    q.put(bh.try_acquire())
    q.put(bh.metrics().in_flight)
    bh.release()


def test_bulkhead_owner_pid_is_refreshed_after_fork(region: Callable[..., SharedRegion]) -> None:
    ctx = multiprocessing.get_context("fork")
    r = region()
    bh = bulkhead(r, "f", 2)
    assert bh.try_acquire()
    q = ctx.Queue()
    join_ok(run(ctx, child_fork_release, bh, q))
    assert [q.get(timeout=TIMEOUT) for _ in range(3)] == ["refused", True, 2]
    assert bh.metrics().in_flight == 1
    bh.release()


def test_shared_objects_are_not_copyable_and_region_closes(
    region: Callable[..., SharedRegion],
) -> None:
    import copy
    import pickle

    r = region()
    objs = [r.breaker("c"), r.retry_budget("d"), bulkhead(r, "e", 1)]
    for obj in objs:
        with pytest.raises(TypeError):
            copy.copy(obj)
        with pytest.raises(TypeError):
            pickle.dumps(obj)
    del obj, objs
    gc.collect()
    r2 = attach(r.name, None)
    r2.close()
    r.close()  # no BufferError: dropped objects free their views at once
    if core_of(r.name) == "python":
        assert _budget_py.shared_size() == SharedRecord.footprint(16)
