"""Bulkhead and AdaptiveLimiter on both cores: admission, release, waiting, FIFO handoff,
deadlines, cancellation, call paths, validation and composition with breakers and retries.

Thread tests wait for a state (``waiting == n``) by yielding the CPU (``_yield_cpu()``), never
by sleeping for a duration; wake-ups are the library's own (a lock or a future per waiter).
"""

from __future__ import annotations

import asyncio
import inspect
import math
import os
import threading
import time
import types
from typing import Any

import pytest

import fastbreaker
from fastbreaker import _bulkhead
from fastbreaker.testing import FakeClock


def _yield_cpu() -> None:
    """Let other threads run (no timed sleep: nothing waits for a duration)."""
    if hasattr(os, "sched_yield"):
        os.sched_yield()


def until(cond: Any, what: str = "condition", limit_s: float = 10.0) -> None:
    """Yield the CPU until ``cond()`` holds (a safety bound only; no timed sleep)."""
    end = time.monotonic() + limit_s
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        _yield_cpu()


class Waiters:
    """Threads that enter ``with bh:`` and record what happened to them, in order."""

    def __init__(self, bh: Any) -> None:
        self.bh = bh
        self.log: list[tuple[str, Any]] = []
        self.threads: list[threading.Thread] = []
        self.inside = threading.Event()
        self.leave = threading.Event()

    def start(self, tag: str, *, hold: bool = False) -> None:
        before = self.bh.waiting

        def run() -> None:
            try:
                with self.bh:
                    self.log.append(("in", tag))
                    if hold:
                        self.inside.set()
                        self.leave.wait()
            except BaseException as exc:  # noqa: BLE001 - recorded for the test
                self.log.append((type(exc).__name__, tag))

        t = threading.Thread(target=run)
        t.start()
        self.threads.append(t)
        if not hold:
            until(lambda: self.bh.waiting > before or self.log, f"{tag} to wait")

    def join(self) -> None:
        for t in self.threads:
            t.join(10)
            assert not t.is_alive()


# --- admission and release ------------------------------------------------------------------


def test_try_acquire_and_release(fb: types.SimpleNamespace) -> None:
    bh = fb.Bulkhead(2, name="db")
    assert (bh.max_concurrent, bh.name, bh.in_flight, bh.waiting) == (2, "db", 0, 0)
    assert bh.try_acquire() and bh.try_acquire()
    assert not bh.try_acquire()
    assert bh.in_flight == 2
    bh.release()
    bh.release()
    m = bh.metrics()
    assert m == fastbreaker.BulkheadMetrics(
        admitted=2,
        rejected=1,
        timed_out=0,
        cancelled=0,
        waited=0,
        in_flight=0,
        waiting=0,
        peak_in_flight=2,
    )


def test_release_with_nothing_held_raises_and_changes_nothing(fb: types.SimpleNamespace) -> None:
    for bh in (fb.Bulkhead(1), fb.AdaptiveLimiter(clock=FakeClock())):
        before = bh.metrics()
        with pytest.raises(RuntimeError, match="nothing is held"):
            bh.release()
        assert bh.metrics() == before
    lim = fb.AdaptiveLimiter(clock=FakeClock())
    with pytest.raises(RuntimeError):
        lim.release(0.01)
    with pytest.raises(RuntimeError):
        lim.release(dropped=True)
    assert lim.limit == 20.0 and lim.metrics().in_flight == 0


def test_fail_fast_error(fb: types.SimpleNamespace) -> None:
    bh = fb.Bulkhead(1, name="pay")
    with bh:
        with pytest.raises(fb.BulkheadFullError) as info:
            with bh:
                pass
        with pytest.raises(fb.BulkheadFullError):
            bh.call(lambda: 1)
    err = info.value
    assert isinstance(err, fb.BreakerError)
    assert (err.name, err.max_concurrent, err.waited) == ("pay", 1, 0.0)
    assert "'pay'" in str(err) and "full" in str(err)
    m = bh.metrics()
    assert (m.admitted, m.rejected, m.in_flight) == (1, 2, 0)


def test_bulkhead_full_error_is_printable_when_built_by_users() -> None:
    assert str(fastbreaker.BulkheadFullError()) == "bulkhead is full"
    assert str(fastbreaker.BulkheadFullError("x")) == "x"
    assert fastbreaker.BulkheadFullError("x").name is None


# --- call paths -----------------------------------------------------------------------------


def test_call_and_with_release_on_error(fb: types.SimpleNamespace) -> None:
    bh = fb.Bulkhead(1)
    assert bh.call(lambda a, b=0: a + b, 1, b=2) == 3

    def boom() -> None:
        raise ValueError("x")

    with pytest.raises(ValueError):
        bh.call(boom)
    with pytest.raises(KeyError):
        with bh:
            raise KeyError
    with pytest.raises(TypeError, match="fn must be callable"):
        bh.call(42)
    assert bh.in_flight == 0 and bh.metrics().admitted == 3


def test_decorator_keeps_signature_sync_and_async(fb: types.SimpleNamespace) -> None:
    bh = fb.Bulkhead(1)

    @bh
    def add(a: int, b: int = 1) -> int:
        """Add."""
        assert bh.in_flight == 1
        return a + b

    @bh
    async def aadd(a: int, b: int = 1) -> int:
        assert bh.in_flight == 1
        return a + b

    assert add(1, b=2) == 3
    assert asyncio.run(aadd(2)) == 3
    assert inspect.signature(add) == inspect.signature(add.__wrapped__)
    assert add.__doc__ == "Add." and inspect.iscoroutinefunction(aadd)
    with pytest.raises(TypeError, match="generator"):

        @bh
        def gen() -> Any:
            yield 1

    with pytest.raises(TypeError):
        bh(3)
    assert bh.in_flight == 0


async def test_async_with_and_call_async(fb: types.SimpleNamespace) -> None:
    bh = fb.Bulkhead(1)
    async with bh as got:
        assert got is bh and bh.in_flight == 1
        with pytest.raises(fb.BulkheadFullError):
            async with bh:
                pass

    async def f(x: int) -> int:
        return x * 2

    assert await bh.call_async(f, 4) == 8
    assert bh.in_flight == 0 and bh.metrics().rejected == 1


# --- waiting, FIFO handoff ------------------------------------------------------------------


def test_threads_are_served_in_order_and_never_barged(fb: types.SimpleNamespace) -> None:
    bh = fb.Bulkhead(1, max_wait=30.0, max_waiting=5)
    assert bh.try_acquire()
    w = Waiters(bh)
    for tag in "abc":
        w.start(tag)
    assert bh.waiting == 3
    assert not bh.try_acquire()  # a newcomer never barges past waiters
    bh.release()  # goes to "a", which releases on exit and hands to "b", then "c"
    w.join()
    assert w.log == [("in", "a"), ("in", "b"), ("in", "c")]
    m = bh.metrics()
    assert (m.admitted, m.waited, m.rejected, m.in_flight, m.waiting) == (4, 3, 1, 0, 0)


def test_slot_handed_to_a_waiter_stays_counted(fb: types.SimpleNamespace) -> None:
    bh = fb.Bulkhead(1, max_wait=30.0)
    assert bh.try_acquire()
    w = Waiters(bh)
    w.start("a", hold=True)
    until(lambda: bh.waiting == 1)
    bh.release()
    w.inside.wait(10)
    assert (bh.in_flight, bh.waiting) == (1, 0)
    assert not bh.try_acquire()
    w.leave.set()
    w.join()
    assert bh.in_flight == 0


def test_queue_bound_rejects_at_once(fb: types.SimpleNamespace) -> None:
    bh = fb.Bulkhead(1, max_wait=30.0, max_waiting=1)
    assert bh.try_acquire()
    w = Waiters(bh)
    w.start("a")
    t0 = time.monotonic()
    with pytest.raises(fb.BulkheadFullError):
        with bh:
            pass
    assert time.monotonic() - t0 < 5
    bh.release()
    w.join()
    m = bh.metrics()
    assert (m.rejected, m.timed_out, m.in_flight) == (1, 0, 0)
    nobody = fb.Bulkhead(1, max_wait=30.0, max_waiting=0)
    with nobody:
        with pytest.raises(fb.BulkheadFullError):
            nobody.call(lambda: None)


def test_default_queue_bound_is_max_concurrent(fb: types.SimpleNamespace) -> None:
    bh = fb.Bulkhead(2, max_wait=30.0)
    assert bh.try_acquire() and bh.try_acquire()
    w = Waiters(bh)
    w.start("a")
    w.start("b")
    with pytest.raises(fb.BulkheadFullError):
        bh.call(lambda: None)
    bh.release()
    bh.release()
    w.join()
    assert bh.metrics().in_flight == 0
    assert fb.AdaptiveLimiter(7.5, min_limit=1)._max_waiting == 7


def test_wait_times_out(fb: types.SimpleNamespace) -> None:
    bh = fb.Bulkhead(1, max_wait=0.02, name="slow")
    with bh:
        with pytest.raises(fb.BulkheadFullError) as info:
            bh.call(lambda: None)
    assert info.value.waited > 0.0 and info.value.name == "slow"
    m = bh.metrics()
    assert (m.timed_out, m.rejected, m.waiting, m.in_flight) == (1, 1, 0, 0)


def test_waited_is_measured_on_the_clock(fb: types.SimpleNamespace) -> None:
    clock = FakeClock(5)
    bh = fb.Bulkhead(1, max_wait=0.01, clock=clock)
    with bh:
        with pytest.raises(fb.BulkheadFullError) as info:
            bh.call(lambda: None)
    assert info.value.waited == 0.0  # the fake clock did not move


# --- deadlines ------------------------------------------------------------------------------


def test_expired_deadline_refuses_without_admitting(fb: types.SimpleNamespace) -> None:
    clock = FakeClock(10**12)
    bh = fb.Bulkhead(1)
    with fb.deadline(1.0, clock=clock):
        clock.advance(2.0)
        with pytest.raises(fb.DeadlineExceeded):
            with bh:
                pass
        with pytest.raises(fb.DeadlineExceeded):
            bh.call(lambda: None)
    assert bh.metrics().admitted == 0 and bh.metrics().rejected == 2


def test_wait_never_outlasts_the_deadline(fb: types.SimpleNamespace) -> None:
    bh = fb.Bulkhead(1, max_wait=60.0)
    with bh:
        t0 = time.monotonic()
        with fb.deadline(0.02):
            with pytest.raises(fb.DeadlineExceeded):
                bh.call(lambda: None)
        assert time.monotonic() - t0 < 30
    m = bh.metrics()
    assert (m.timed_out, m.in_flight, m.waiting) == (1, 0, 0)


def test_slot_arriving_after_the_deadline_goes_to_the_next_waiter(
    fb: types.SimpleNamespace,
) -> None:
    clock = FakeClock(10**12)
    bh = fb.Bulkhead(1, max_wait=60.0, max_waiting=5)
    assert bh.try_acquire()
    log: list[str] = []

    def late() -> None:
        with fb.deadline(10.0, clock=clock):  # a fake-clock deadline: only the test moves it
            try:
                with bh:
                    log.append("late got it")
            except fb.DeadlineExceeded:
                log.append("late expired")

    t1 = threading.Thread(target=late)
    t1.start()
    until(lambda: bh.waiting == 1)
    w = Waiters(bh)
    w.start("next")
    clock.advance(10.0)  # the deadline passes while "late" still waits
    bh.release()  # handed to "late", which finds its deadline gone and passes it on
    t1.join(10)
    w.join()
    assert log == ["late expired"] and w.log == [("in", "next")]
    m = bh.metrics()
    assert (m.in_flight, m.waiting, m.admitted, m.timed_out) == (0, 0, 2, 1)


# --- asyncio --------------------------------------------------------------------------------


async def test_cancelled_waiter_leaves_no_trace(fb: types.SimpleNamespace) -> None:
    bh = fb.Bulkhead(1, max_wait=60.0)
    assert bh.try_acquire()
    task = asyncio.create_task(bh.call_async(asyncio.sleep, 0))
    while bh.waiting == 0:
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (bh.in_flight, bh.waiting) == (1, 0)
    bh.release()
    m = bh.metrics()
    assert (m.in_flight, m.cancelled, m.admitted) == (0, 1, 1)


async def test_hyx_scenario_cancel_after_the_slot_was_handed_over(
    fb: types.SimpleNamespace,
) -> None:
    """hyx leaks a slot when a waiter is cancelled after it was woken but before it ran: then
    the bulkhead reports "full" with nothing running. Here the slot goes on to the next waiter."""
    bh = fb.Bulkhead(1, max_wait=60.0, max_waiting=10)
    assert bh.try_acquire()
    ran: list[str] = []

    async def job(tag: str) -> None:
        async with bh:
            ran.append(tag)

    first = asyncio.create_task(job("first"))
    second = asyncio.create_task(job("second"))
    while bh.waiting < 2:
        await asyncio.sleep(0)
    bh.release()  # hands the slot to "first" (its future resolves; it has not run yet)
    first.cancel()  # ... and it is cancelled before it runs
    await asyncio.gather(first, second, return_exceptions=True)
    assert first.cancelled() and ran == ["second"]
    m = bh.metrics()
    assert (m.in_flight, m.waiting, m.cancelled, m.admitted) == (0, 0, 1, 2)
    async with bh:  # not "full with nothing running"
        pass


def test_release_in_a_thread_wakes_a_task_on_its_own_loop(fb: types.SimpleNamespace) -> None:
    bh = fb.Bulkhead(1, max_wait=60.0, max_waiting=10)
    assert bh.try_acquire()
    results: list[str] = []

    def loop_thread(tag: str) -> None:
        async def main() -> None:
            async with bh:
                results.append(tag)

        asyncio.run(main())

    threads = [threading.Thread(target=loop_thread, args=(t,)) for t in ("x", "y")]
    for i, t in enumerate(threads):
        t.start()
        until(lambda: bh.waiting == i + 1)
    threads_waiter = Waiters(bh)
    threads_waiter.start("thread")
    bh.release()
    for t in threads:
        t.join(10)
    threads_waiter.join()
    assert results == ["x", "y"] and threads_waiter.log == [("in", "thread")]
    assert bh.metrics().in_flight == 0


def test_keyboard_interrupt_while_waiting_does_not_leak(
    fb: types.SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    bh = fb.Bulkhead(1, max_wait=60.0)
    assert bh.try_acquire()
    real_lock = threading.Lock

    class InterruptedLock:
        def __init__(self) -> None:
            self._lock = real_lock()
            self.n = 0

        def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
            self.n += 1
            if self.n == 2:  # the wait itself
                raise KeyboardInterrupt
            return self._lock.acquire(blocking, timeout)

        def release(self) -> None:
            self._lock.release()

    monkeypatch.setattr(_bulkhead.threading, "Lock", InterruptedLock)
    with pytest.raises(KeyboardInterrupt):
        bh.call(lambda: None)
    monkeypatch.undo()
    assert (bh.in_flight, bh.waiting, bh.metrics().cancelled) == (1, 0, 1)
    bh.release()
    assert bh.in_flight == 0


# --- validation -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, err, name",
    [
        ({"max_concurrent": 0}, ValueError, "max_concurrent"),
        ({"max_concurrent": 1.5}, TypeError, "max_concurrent"),
        ({"max_concurrent": True}, TypeError, "max_concurrent"),
        ({"max_concurrent": 2, "max_wait": -1}, ValueError, "max_wait"),
        ({"max_concurrent": 2, "max_wait": math.nan}, ValueError, "max_wait"),
        ({"max_concurrent": 2, "max_wait": "1"}, TypeError, "max_wait"),
        ({"max_concurrent": 2, "max_waiting": -1}, ValueError, "max_waiting"),
        ({"max_concurrent": 2, "max_waiting": 1.0}, TypeError, "max_waiting"),
        ({"max_concurrent": 2, "name": 3}, TypeError, "name"),
        ({"max_concurrent": 2, "clock": 3}, TypeError, "clock"),
    ],
)
def test_bulkhead_bad_input(fb: types.SimpleNamespace, kwargs: dict, err: type, name: str) -> None:
    with pytest.raises(err, match=name):
        fb.Bulkhead(**kwargs)


@pytest.mark.parametrize(
    "kwargs, err, name",
    [
        ({"min_limit": 10, "max_limit": 5, "initial_limit": 7}, ValueError, "min_limit"),
        ({"initial_limit": 1000}, ValueError, "initial_limit"),
        ({"initial_limit": 2}, ValueError, "initial_limit"),
        ({"initial_limit": "20"}, TypeError, "initial_limit"),
        ({"min_limit": 0, "initial_limit": 1}, ValueError, "min_limit"),
        ({"max_limit": math.inf}, ValueError, "max_limit"),
        ({"backoff": 1.0}, ValueError, "backoff"),
        ({"backoff": 0}, ValueError, "backoff"),
        ({"backoff": math.nan}, ValueError, "backoff"),
        ({"rtt_threshold": 0}, ValueError, "rtt_threshold"),
        ({"rtt_threshold": -1}, ValueError, "rtt_threshold"),
        ({"algorithm": "vegas"}, ValueError, "algorithm"),
        ({"algorithm": None}, TypeError, "algorithm"),
        ({"drop_on": "x"}, TypeError, "drop_on"),
        ({"max_wait": -0.5}, ValueError, "max_wait"),
        ({"max_waiting": -1}, ValueError, "max_waiting"),
    ],
)
def test_limiter_bad_input(fb: types.SimpleNamespace, kwargs: dict, err: type, name: str) -> None:
    with pytest.raises(err, match=name):
        fb.AdaptiveLimiter(**kwargs)


def test_limiter_release_bad_rtt(fb: types.SimpleNamespace) -> None:
    lim = fb.AdaptiveLimiter(clock=FakeClock())
    assert lim.try_acquire()
    for bad, err in ((-1, ValueError), (math.nan, ValueError), ("1", TypeError)):
        with pytest.raises(err, match="rtt"):
            lim.release(bad)
    assert lim.in_flight == 1
    lim.release(0.01)


def test_not_copyable_nor_subclassable(fb: types.SimpleNamespace) -> None:
    import copy
    import pickle

    for obj in (fb.Bulkhead(1), fb.AdaptiveLimiter()):
        for op in (copy.copy, copy.deepcopy, pickle.dumps):
            with pytest.raises(TypeError, match="cannot be copied"):
                op(obj)
        with pytest.raises(TypeError):
            type("Sub", (type(obj),), {})
        with pytest.raises(RuntimeError, match="twice"):
            obj.__init__(1) if isinstance(obj, fb.Bulkhead) else obj.__init__()


# --- composition ----------------------------------------------------------------------------


def test_bulkhead_full_is_neutral_to_a_breaker(fb: types.SimpleNamespace) -> None:
    br = fb.CircuitBreaker(failure_threshold=1)
    bh = fb.Bulkhead(1)
    with bh:
        for _ in range(5):
            with pytest.raises(fb.BulkheadFullError):
                br.call(bh.call, lambda: None)
    assert br.state == fb.State.CLOSED
    assert br.metrics().failures == 0


def test_retry_never_retries_bulkhead_full(fb: types.SimpleNamespace) -> None:
    bh = fb.Bulkhead(1)
    calls: list[int] = []

    @fb.retry(attempts=5, on=Exception)
    def op() -> None:
        calls.append(1)
        bh.call(lambda: None)

    with fastbreaker.testing.instant_retries() as delays, bh:
        with pytest.raises(fb.BulkheadFullError):
            op()
    assert calls == [1] and delays == []


# --- AdaptiveLimiter ------------------------------------------------------------------------


def test_limiter_has_the_bulkhead_api(fb: types.SimpleNamespace) -> None:
    clock = FakeClock(10**12)
    lim = fb.AdaptiveLimiter(4, min_limit=1, max_limit=10, clock=clock, name="api")
    assert (lim.limit, lim.max_concurrent, lim.name) == (4.0, 4, "api")
    for _ in range(4):
        assert lim.try_acquire()
    assert not lim.try_acquire()
    for _ in range(4):
        lim.release()  # no sample: the limit stays
    assert lim.limit == 4.0 and lim.metrics().admitted == 4


def test_aimd_grows_while_used_and_cuts_once_per_round_trip(fb: types.SimpleNamespace) -> None:
    clock = FakeClock(10**12)
    lim = fb.AdaptiveLimiter(10, min_limit=2, max_limit=100, rtt_threshold=0.1, clock=clock)
    for _ in range(10):
        assert lim.try_acquire()
    lim.release(0.05)  # in_flight 10 >= 0.9 * 10: grow by 1/limit
    assert lim.limit == 10 + 1 / 10
    lim.release(0.05)  # in_flight 9 >= 9: grow
    assert lim.limit == pytest.approx(10.1 + 1 / 10.1)
    grown = lim.limit
    lim.release(0.05)  # in_flight 8 < 9: no growth
    assert lim.limit == grown
    clock.advance(1.0)
    lim.release(0.5)  # slow: cut once
    assert lim.limit == grown * 0.9
    lim.release(0.5)  # started before that cut: no second cut
    lim.release(dropped=True)  # a drop without rtt starts now == the cut: cuts again? no, same ns
    assert lim.limit == grown * 0.9 * 0.9
    for _ in range(2):
        assert lim.try_acquire()
    clock.advance(0.001)
    lim.release(0.0005, dropped=True)  # started after the last cut
    assert lim.limit == pytest.approx(grown * 0.9**3)


def test_aimd_never_below_min_or_above_max(fb: types.SimpleNamespace) -> None:
    clock = FakeClock(10**12)
    lim = fb.AdaptiveLimiter(4, min_limit=4, max_limit=5, rtt_threshold=0.1, clock=clock)
    for _ in range(50):
        assert lim.try_acquire()
        clock.advance(1.0)
        lim.release(dropped=True)
    assert lim.limit == 4.0
    for _ in range(200):
        for _ in range(lim.max_concurrent):
            lim.try_acquire()
        while lim.in_flight:
            lim.release(0.01)
    assert lim.limit == 5.0


def test_limit_below_in_flight_cancels_nothing(fb: types.SimpleNamespace) -> None:
    clock = FakeClock(10**12)
    lim = fb.AdaptiveLimiter(10, min_limit=1, rtt_threshold=0.1, backoff=0.5, clock=clock)
    for _ in range(10):
        assert lim.try_acquire()
    clock.advance(1.0)
    lim.release(0.5)
    assert lim.max_concurrent == 5 and lim.in_flight == 9  # nothing was cancelled
    while lim.in_flight > 4:
        assert not lim.try_acquire()  # admission needs in_flight < floor(limit)
        lim.release()
    assert lim.try_acquire() and not lim.try_acquire()


def test_limiter_call_paths_time_calls_and_report_drops(fb: types.SimpleNamespace) -> None:
    clock = FakeClock(10**12)
    lim = fb.AdaptiveLimiter(10, min_limit=1, rtt_threshold=0.1, clock=clock)

    def slow() -> None:
        clock.advance(0.5)

    lim.call(slow)
    assert lim.limit == 9.0  # rtt 0.5 > threshold
    clock.advance(1.0)

    def times_out() -> None:
        raise TimeoutError

    with pytest.raises(TimeoutError):
        lim.call(times_out)
    assert lim.limit == 9.0 * 0.9
    clock.advance(1.0)
    with pytest.raises(fb.DeadlineExceeded):
        with lim:
            raise fb.DeadlineExceeded("x")
    assert lim.limit == pytest.approx(9.0 * 0.81)
    clock.advance(1.0)
    with pytest.raises(ValueError):
        with lim:
            raise ValueError  # an answer, not a drop: a fast sample, no cut
    assert lim.limit == pytest.approx(9.0 * 0.81)
    assert lim.in_flight == 0


async def test_limiter_async_paths(fb: types.SimpleNamespace) -> None:
    clock = FakeClock(10**12)
    lim = fb.AdaptiveLimiter(10, min_limit=1, rtt_threshold=0.1, clock=clock, drop_on=KeyError)

    async def slow() -> int:
        clock.advance(0.5)
        return 1

    assert await lim.call_async(slow) == 1
    assert lim.limit == 9.0
    clock.advance(1.0)
    with pytest.raises(KeyError):
        async with lim:
            raise KeyError
    assert lim.limit == pytest.approx(8.1)
    with pytest.raises(asyncio.CancelledError):
        async with lim:
            raise asyncio.CancelledError  # cancelled: no sample
    assert lim.limit == pytest.approx(8.1) and lim.in_flight == 0


def test_limiter_waiters_are_admitted_when_the_limit_grows(fb: types.SimpleNamespace) -> None:
    clock = FakeClock(10**12)
    lim = fb.AdaptiveLimiter(
        1.95,
        min_limit=1,
        max_limit=10,
        rtt_threshold=1.0,
        max_wait=60.0,
        max_waiting=3,
        clock=clock,
    )
    assert lim.try_acquire()
    w = Waiters(lim)
    w.start("a", hold=True)
    lim.release(0.01)  # grows to 2.46 and hands the freed slot to "a"
    w.inside.wait(10)
    assert lim.in_flight == 1 and lim.limit > 2
    w.leave.set()
    w.join()
    assert lim.in_flight == 0
