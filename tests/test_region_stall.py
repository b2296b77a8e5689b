"""SharedRegion when another process is stopped or its pid was reused (issue 26, items 2 and 3).

Real processes: a child takes a lock or a claim of the region, says so through a pipe, and is
stopped with SIGSTOP while it holds it; the test's operations must end within the bound with
their documented outcome (docs/shared-memory.md), then the child is resumed and killed. The bound
is patched down (``_region.LOCK_TIMEOUT``) or, for a compiled claim, the claim is made to look old
(``_test_claim_clock_shift``), so nothing waits long. PID reuse is simulated by writing an owner
word with a live pid (this process's parent) and another start time into a slot or a claim.
"""

from __future__ import annotations

import faulthandler
import multiprocessing
import os
import signal
import struct
import sys
import threading
import time
import types
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import stall_support as ss

from fastbreaker import _process, _region

pytestmark = [
    pytest.mark.skipif(sys.platform == "win32", reason="SharedRegion is POSIX only"),
    pytest.mark.thread_unsafe(reason="starts processes and maps named segments"),
]

BOUND = 0.05  # the lock bound the tests patch in (seconds)


@pytest.fixture
def name() -> Iterator[str]:
    n = "fbs-" + uuid.uuid4().hex[:12]
    yield n
    try:
        import _posixshmem  # type: ignore[import-not-found]

        _posixshmem.shm_unlink("/" + n)
    except FileNotFoundError:
        pass


@pytest.fixture
def short_bound(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(_region, "LOCK_TIMEOUT", BOUND)
    monkeypatch.setattr(_region, "DIR_LOCK_TIMEOUT", BOUND)
    # The defect these tests guard against is a wait without end (a blocking lock, a spin that
    # holds the GIL): a watchdog thread in C ends the run loudly, with every thread's stack,
    # rather than letting it hang.
    faulthandler.dump_traceback_later(60, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


class Stopped:
    """A child running ``target(core, name, ..., conn)``, stopped once it holds what it takes."""

    def __init__(self, target: Any, *args: Any, stop: bool = True) -> None:
        ctx = multiprocessing.get_context("fork")
        self.reader, writer = ctx.Pipe(duplex=False)
        self.p = ctx.Process(target=target, args=(*args, writer), daemon=True)
        self.p.start()
        writer.close()
        assert self.reader.poll(30), "the child never took the lock"
        assert os.read(self.reader.fileno(), 1) == b"x"
        assert self.p.pid is not None
        if stop:
            os.kill(self.p.pid, signal.SIGSTOP)

    def end(self) -> None:
        assert self.p.pid is not None
        os.kill(self.p.pid, signal.SIGCONT)
        os.kill(self.p.pid, signal.SIGKILL)
        self.p.join(30)
        self.reader.close()


def within(seconds: float, fn: Any, *args: Any) -> Any:
    start = time.monotonic()
    result = fn(*args)
    assert time.monotonic() - start < seconds, f"{fn} took more than {seconds} s"
    return result


# -- item 2: a stopped process stalls no one ---------------------------------------------------------
def test_a_process_stopped_inside_a_transition_stalls_no_one(
    fb: types.SimpleNamespace, name: str, short_bound: None
) -> None:
    region = fb.SharedRegion(name)
    b = region.breaker("up", failure_threshold=3)
    assert b.allow()
    b.record_success()
    child = Stopped(ss.stall_in_trip, fb.impl, name)
    try:
        if fb.impl == "c":
            from fastbreaker import _breaker_c

            # a claim younger than the bound: rejected, nobody waits (the design's busy bit)
            assert not within(0.5, b.allow)
            # trip() waits for the claim only up to the bound (real time: 100 ms), then raises
            with pytest.raises(fb.SharedStateTimeout, match=r"trip\(\) on the shared breaker"):
                within(1.0, b.trip)
            _breaker_c._test_claim_clock_shift(10**9)  # the claim is now 1 s old: stalled
        with pytest.raises(fb.SharedStateTimeout):
            within(1.0, b.trip)
        # past the bound: the state published before the stopped transition (CLOSED) admits
        for _ in range(5):
            assert within(0.5, b.allow)
            within(0.5, b.record_failure)  # dropped (or stale): never raises, never waits
        assert b.state == fb.State.CLOSED
        for op in (b.reset, b.isolate):
            with pytest.raises(fb.SharedStateTimeout):
                within(1.0, op)
        # a fleet's OPEN record is not applied now (the next sync brings it again)
        assert within(1.0, b._fleet, 1, -1, int(fb.State.OPEN), 30.0, 0)[0] is False
        assert within(0.5, b.metrics).state == fb.State.CLOSED
    finally:
        if fb.impl == "c":
            _breaker_c._test_claim_clock_shift(0)
        child.end()
    # the holder is gone: its transition is rolled back (compiled) or never stored (twin)
    if fb.impl == "c":
        _breaker_c._test_claim_clock_shift(20_000_000)  # past the 10 ms of a dead claim
    try:
        assert b.allow()
        b.record_success()
        b.trip()
        assert b.state == fb.State.OPEN and not b.allow()
        b.reset()
        assert b.state == fb.State.CLOSED
    finally:
        if fb.impl == "c":
            _breaker_c._test_claim_clock_shift(0)


def test_a_stopped_holder_of_a_maps_lock_stalls_no_one(
    fb: types.SimpleNamespace, name: str, short_bound: None
) -> None:
    region = fb.SharedRegion(name)
    m = region.breaker_map("m", capacity=4)
    assert m.allow("known")
    m["known"].record_success()
    child = Stopped(ss.hold_lock, fb.impl, name, "map")
    try:
        # a new key needs the table's lock: past the bound it gets a breaker of this process
        # only (as when the table is full); later new keys try the lock once, without waiting
        start = time.monotonic()
        for i in range(20):
            assert m.allow(f"new-{i}")
        assert time.monotonic() - start < 20 * BOUND / 2
        assert m.allow("known")  # a key already in the table needs no lock
        assert within(0.5, m.metrics).keys == 1
    finally:
        child.end()
    assert m.allow("new-0") and "new-0" in m  # the lock is free again: shared from now on


@pytest.mark.parametrize("what", ["breaker", "budget", "bulkhead", "directory"])
def test_a_stopped_holder_of_a_record_lock_stalls_no_one(
    fb: types.SimpleNamespace, name: str, short_bound: None, what: str
) -> None:
    if fb.impl == "c" and what != "directory":
        pytest.skip("the compiled breaker, budget and bulkhead take no lock (atomics)")
    region = fb.SharedRegion(name)
    b = region.breaker("up", failure_threshold=3)
    bh = region.bulkhead("bh", 2)
    budget = region.retry_budget("rb")
    assert bh.try_acquire()
    child = Stopped(ss.hold_lock, fb.impl, name, what)
    try:
        if what == "directory":
            with pytest.raises(fb.SharedStateTimeout, match=f"the directory of .*{name}"):
                within(1.0, region.breaker, "other")
            return
        if what == "breaker":
            assert within(1.0, b.allow) and b.state == fb.State.CLOSED
            within(0.5, b.record_failure)
            with pytest.raises(fb.SharedStateTimeout):
                within(0.5, b.trip)
        elif what == "budget":
            assert not within(1.0, budget.allow_retry)  # refused, never waits
            within(0.5, budget.record_success)  # the deposit is dropped
        else:
            assert not within(1.0, bh.try_acquire)  # refused, never waits
            with pytest.raises(fb.BulkheadFullError):
                with bh:
                    pass
            within(0.5, bh.release)  # owed: given back once the lock is free
    finally:
        child.end()
    if what == "bulkhead":
        assert bh.in_flight == 0 and bh.try_acquire() and bh.try_acquire()
        assert not bh.try_acquire()
    elif what == "budget":
        assert budget.tokens == 100 and budget.allow_retry()
    else:
        b.trip()
        assert b.state == fb.State.OPEN


@pytest.mark.slow
def test_hammering_workers_go_on_while_one_is_stopped_again_and_again(
    fb: types.SimpleNamespace, name: str
) -> None:
    """The issue's soak, small: 4 workers on a small shared map and a breaker, one stopped 5
    times for 0.6 s (the default bound for a stopped holder: 100 ms; a worker waiting behind
    another that waits for the stopped one takes up to two bounds, and a loaded CI machine adds
    its own delays); every other one makes progress each time."""
    region = fb.SharedRegion(name)
    region.breaker("up", failure_threshold=3)
    region.breaker_map("m", capacity=4)
    ctx = multiprocessing.get_context("fork")
    counts = ctx.Array("q", 4, lock=False)
    procs, pipes = [], []
    for me in range(4):
        reader, writer = ctx.Pipe(duplex=False)
        p = ctx.Process(target=ss.hammer, args=(fb.impl, name, 5.0, me, counts, writer))
        p.start()
        writer.close()
        procs.append(p)
        pipes.append(reader)
    faulthandler.dump_traceback_later(60, exit=True)
    try:
        for reader in pipes:
            assert reader.poll(30) and os.read(reader.fileno(), 1) == b"x"
        stopped = procs[0].pid
        assert stopped is not None
        for _ in range(5):
            time.sleep(0.1)  # a soak: the stops land at arbitrary points of worker 0's loop
            os.kill(stopped, signal.SIGSTOP)
            before = list(counts)
            time.sleep(0.6)
            after = list(counts)
            os.kill(stopped, signal.SIGCONT)
            assert all(after[i] > before[i] for i in range(1, 4)), (before, after)
    finally:
        faulthandler.cancel_dump_traceback_later()
        for p in procs:
            assert p.pid is not None
            os.kill(p.pid, signal.SIGCONT)
            p.join(30)
        for reader in pipes:
            reader.close()
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]


# -- item 3: an owner survives pid reuse ---------------------------------------------------------------
def _block(region: Any, obj: str) -> memoryview:
    """The state block of object ``obj`` in the region (its directory entry's offset)."""
    buf = region._buf
    for at, raw in region._entries():
        if raw == obj.encode():
            offset = _region._get(buf, at + _region._E_OFFSET)
            return region._view(offset, _region._get(buf, at + _region._E_NBYTES))
    raise KeyError(obj)


def _owners() -> tuple[int, int, int]:
    """Owner words of this process's parent (alive): with its start time, with another start
    time (its pid reused by a new process), and with none (a platform without start times)."""
    ppid = os.getppid()
    start = _process.start_time(ppid)
    return _process.owner_of(ppid, start), _process.owner_of(ppid, start + 12345), ppid


def test_owner_words_tell_a_reused_pid_from_its_holder() -> None:
    live, reused, pid_only = _owners()
    assert _process.owner_self() == _process.owner_of(os.getpid(), _process.start_time(os.getpid()))
    if sys.platform.startswith("linux"):
        assert _process.owner_gone(reused)
    assert not _process.owner_gone(live) and not _process.owner_gone(pid_only)
    ctx = multiprocessing.get_context("fork")
    p = ctx.Process(target=time.sleep, args=(0,))
    p.start()
    p.join()
    assert p.pid is not None and _process.owner_gone(_process.owner_of(p.pid, 0))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="start times: Linux")
def test_a_bulkhead_slot_of_a_reused_pid_is_reclaimed_and_a_live_one_kept(
    fb: types.SimpleNamespace, name: str
) -> None:
    region = fb.SharedRegion(name)
    bh = region.bulkhead("bh", 4)
    block = _block(region, "bh")
    live, reused, pid_only = _owners()
    if fb.impl == "c":
        struct.pack_into("<3q", block, 16 * 8, reused, live, pid_only)  # owner words
        struct.pack_into("<q", block, 0, 3)  # in flight
    else:
        from fastbreaker import _bulkhead_py

        layout = _bulkhead_py._BulkheadLayout(4)
        record = _region.SharedRecord(block, layout.size)
        data = bytearray(record.load())
        struct.pack_into("=3q", data, _bulkhead_py._COUNTERS.size, reused, live, pid_only)
        record.store(bytes(data))
    assert bh.in_flight == 3
    assert bh.try_acquire()  # the free slot
    assert bh.try_acquire()  # none free: the reused pid's slot is reclaimed
    assert not bh.try_acquire()  # the live holders keep theirs
    assert bh.in_flight == 4
    bh.release()
    bh.release()
    assert bh.in_flight == 2


#: fb_claim_t follows fb_state_t (7 int64 words, _fb_breaker.h) in a shared breaker's block
CLAIM_AT = 7 * 8


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="start times: Linux")
def test_a_compiled_claim_of_a_reused_pid_is_taken_over_and_a_live_one_is_not(
    fb: types.SimpleNamespace, name: str
) -> None:
    if fb.impl != "c":
        pytest.skip("the twin's claims are kernel record locks: they record no owner")
    region = fb.SharedRegion(name)
    b = region.breaker("up", failure_threshold=3)
    block = _block(region, "up")
    live, reused, _ = _owners()
    busy = struct.unpack_from("<q", block, 0)[0] | 4  # the state word with the busy bit
    old = time.monotonic_ns() - 5 * 10**9  # the claim clock (CLOCK_MONOTONIC): 5 s ago

    def claim(owner: int) -> None:
        struct.pack_into("<q", block, 0, busy)
        struct.pack_into("<3q", block, CLAIM_AT, busy, owner, old)

    claim(reused)
    assert b.allow()  # the claim's owner is gone (its pid belongs to another process now)
    b.record_success()
    assert struct.unpack_from("<q", block, 0)[0] & 4 == 0  # rolled back
    claim(live)
    assert b.allow()  # stalled, not taken over: CLOSED admits on the state it was claimed from
    assert struct.unpack_from("<q", block, 0)[0] == busy
    with pytest.raises(fb.SharedStateTimeout):
        b.trip()
    struct.pack_into("<q", block, 0, busy & ~4)  # the "holder" publishes
    b.trip()
    assert b.state == fb.State.OPEN


# -- a holder that runs is waited for: load alone must not drop an outcome -------------------------
def test_a_record_lock_holder_that_runs_is_waited_for_not_stalled(
    fb: types.SimpleNamespace, name: str, short_bound: None
) -> None:
    if fb.impl == "c":
        pytest.skip("the compiled breaker takes no lock (atomics); its claim: the test below")
    region = fb.SharedRegion(name)
    b = region.breaker("up", failure_threshold=3)
    child = Stopped(ss.hold_lock, fb.impl, name, "breaker", stop=False)
    # the holder runs (it sleeps in pause(), as a descheduled holder would look) and lets go
    # after several bounds: the outcome waits for it instead of being dropped
    ender = threading.Timer(6 * BOUND, child.end)
    ender.start()
    try:
        b.record_failure()
    finally:
        ender.join()
    assert b.metrics().failures == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process states: Linux")
def test_a_compiled_claim_of_an_owner_that_runs_is_stalled_only_when_stuck(
    fb: types.SimpleNamespace, name: str
) -> None:
    if fb.impl != "c":
        pytest.skip("the twin's claims are kernel record locks: the test above")
    region = fb.SharedRegion(name)
    b = region.breaker("up", failure_threshold=3)
    block = _block(region, "up")
    live, _, _ = _owners()  # this process's parent: alive and not stopped
    busy = struct.unpack_from("<q", block, 0)[0] | 4

    def claim(age_s: float) -> None:
        struct.pack_into("<q", block, 0, busy)
        struct.pack_into("<3q", block, CLAIM_AT, busy, live, time.monotonic_ns() - int(age_s * 1e9))

    claim(0.5)  # past the stopped owner's bound, within the stuck bound: still held
    assert not b.allow()
    claim(5.0)  # past the stuck bound: stalled, CLOSED admits on the state it was claimed from
    assert b.allow()
    struct.pack_into("<q", block, 0, busy & ~4)
