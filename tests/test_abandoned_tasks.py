"""Tasks abandoned on a closed event loop, and the clock failing, in ``LoadShedder`` and
``Bulkhead`` (both cores): issue 26, items 12 to 14.

A task that waits for a slot (or holds one) on an event loop closed by hand with the task still
pending is collected later by the cyclic GC, and its cleanup runs as a finalizer, possibly while
the same thread holds the queue lock. The tests make that happen deterministically: the GC is
disabled, and user code that runs under the lock (a clock read by the shedder, an event loop's
``call_soon`` reached by a handoff) calls ``gc.collect()``. The part that could deadlock runs in
a thread joined with a timeout, so a regression fails instead of hanging.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
import time
import types
import weakref
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest

from fastbreaker.testing import FakeClock, implementations

JOIN_S = 10.0  # a passing run takes milliseconds; a deadlocked one never ends


@pytest.fixture(autouse=True)
def _no_automatic_gc() -> Iterator[None]:
    # Only the gc.collect() calls of a test collect: the finalizers run exactly where it says.
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def pending_on_closed_loop(make: Callable[[], Coroutine[Any, Any, Any]]) -> asyncio.Task[Any]:
    """Run ``make()`` as a task on a new loop until it waits, then close the loop with the task
    still pending."""
    loop = asyncio.new_event_loop()
    task = loop.create_task(make())
    loop.run_until_complete(asyncio.sleep(0))
    assert not task.done()
    loop.close()
    return task


def abandon(make: Callable[[], Coroutine[Any, Any, Any]]) -> weakref.ref[Any]:
    """``pending_on_closed_loop``, keeping no reference: only the object it waits in (or a
    reference cycle) keeps the task alive afterwards."""
    return weakref.ref(pending_on_closed_loop(make))


def in_thread(fn: Callable[[], None]) -> None:
    """Run ``fn`` in a thread; fail (not hang) if it does not end."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(JOIN_S)
    assert not t.is_alive(), "did not end: a cleanup waited for a lock (deadlock)"
    if errors:
        raise errors[0]


class CollectingClock:
    """A fake clock that runs the cyclic GC at each read while armed."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.armed = False

    def __call__(self) -> int:
        if self.armed:
            gc.collect()
        return self.clock()


class CollectingLoop(asyncio.SelectorEventLoop):
    """An event loop that runs the cyclic GC when a callback is scheduled on it while armed:
    a bulkhead's handoff to a task of this loop then collects under the queue lock."""

    armed = False

    def call_soon(self, *args: Any, **kwargs: Any) -> Any:
        if self.armed:
            gc.collect()
        return super().call_soon(*args, **kwargs)


@contextlib.contextmanager
def quiet_asyncio() -> Iterator[None]:
    # "Task was destroyed but it is pending!" is what the scenario is about: not noise.
    import logging

    logger = logging.getLogger("asyncio")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


# -- 12: a finalizer under the lock -------------------------------------------------------------


def test_shedder_a_waiter_finalized_under_its_lock_does_not_deadlock(
    fb: types.SimpleNamespace, clock: FakeClock
) -> None:
    # The abandoned waiter is displaced: its wake fails (its loop is closed), which drops the
    # last reference to its task, finalized at once, inside the displacement, under the lock.
    shedder = fb.LoadShedder(fb.Bulkhead(1), max_queue=1, queue_timeout=100, clock=clock)
    served: list[str] = []

    async def sheddable() -> None:
        fb.priority(fb.Priority.SHEDDABLE).__enter__()  # for this task's context, never left
        async with shedder:
            served.append("abandoned")

    def scenario() -> None:
        shedder.__enter__()  # the only slot
        gone = abandon(sheddable)
        loop = asyncio.new_event_loop()

        async def important() -> None:
            with fb.priority(fb.Priority.CRITICAL_PLUS):
                async with shedder:
                    served.append("important")

        task = loop.create_task(important())
        loop.run_until_complete(asyncio.sleep(0))
        gc.collect()
        assert gone() is None
        shedder.__exit__(None, None, None)
        loop.run_until_complete(task)
        loop.close()

    with quiet_asyncio():
        in_thread(scenario)
    assert served == ["important"]
    m = shedder.metrics()
    assert (m.in_flight, m.queue_len, m.admitted, m.shed_priority) == (0, 0, 2, 1)
    with shedder:
        assert shedder.metrics().in_flight == 1
    assert shedder.metrics().in_flight == 0


def test_shedder_a_holder_collected_under_its_lock_does_not_deadlock(
    fb: types.SimpleNamespace, clock: FakeClock
) -> None:
    # The abandoned task holds the only slot (`async with shedder:`), in a reference cycle: the
    # GC collects it when a waiter's re-check reads the clock under the lock, and its exit
    # hands the slot on.
    clk = CollectingClock(clock)
    shedder = fb.LoadShedder(
        fb.Bulkhead(1), queue_timeout=1, codel_target=0.0005, codel_interval=0.001, clock=clk
    )

    async def holder() -> None:
        async with shedder:
            await asyncio.get_running_loop().create_future()  # never resolved

    outcome: list[str] = []

    def scenario() -> None:
        loop = asyncio.new_event_loop()

        async def waiter() -> None:
            try:
                async with shedder:
                    outcome.append("admitted")
            except fb.LoadShedError as exc:
                outcome.append(exc.reason)

        task = loop.create_task(waiter())
        loop.run_until_complete(asyncio.sleep(0))  # it queues
        clock.advance(1)  # its next re-check (within 1 ms) finds it waited queue_timeout
        clk.armed = True
        loop.run_until_complete(task)
        clk.armed = False
        loop.close()

    with quiet_asyncio():
        gone = abandon(holder)
        assert shedder.metrics().in_flight == 1
        in_thread(scenario)
    assert gone() is None
    assert outcome == ["too_old"]
    m = shedder.metrics()
    assert (m.in_flight, m.queue_len, m.admitted, m.shed_too_old) == (0, 0, 1, 1)
    with shedder:
        assert shedder.metrics().in_flight == 1
    assert shedder.metrics().in_flight == 0


@pytest.mark.parametrize("holds", [False, True], ids=["waiting", "holding"])
def test_bulkhead_a_task_finalized_under_its_queue_lock_does_not_deadlock(
    fb: types.SimpleNamespace, holds: bool
) -> None:
    # "waiting": the abandoned task waits for a slot; the handoff to it fails (its loop is
    # closed), which finalizes it at once, under the queue lock (its cleanup leaves the queue).
    # "holding": it holds a slot in `async with`, in a reference cycle; the handoff to a live
    # task schedules its wake-up on a loop that then runs the GC, under the queue lock (its
    # cleanup releases the slot while another task waits).
    cap = 2 if holds else 1
    bh = fb.Bulkhead(cap, max_wait=100, max_waiting=2)
    served: list[int] = []

    async def abandoned() -> None:
        async with bh:
            await asyncio.get_running_loop().create_future()  # never resolved

    def scenario() -> None:
        assert bh.try_acquire()
        gone = abandon(abandoned)
        if not holds:
            bh.release()  # the handoff to the abandoned task: it fails, the slot is passed on
            assert gone() is None
            assert bh.try_acquire()
        loop = CollectingLoop()

        async def live(i: int) -> None:
            async with bh:
                served.append(i)

        tasks = [loop.create_task(live(i)) for i in range(cap)]
        loop.run_until_complete(asyncio.sleep(0))  # they queue
        assert bh.waiting == cap
        loop.armed = True
        bh.release()
        loop.armed = False
        assert gone() is None
        loop.run_until_complete(asyncio.gather(*tasks))
        loop.close()

    with quiet_asyncio():
        in_thread(scenario)
    assert sorted(served) == list(range(cap))
    m = bh.metrics()
    assert (m.in_flight, m.waiting, m.cancelled) == (0, 0, 0 if holds else 1)
    assert all(bh.try_acquire() for _ in range(cap)) and not bh.try_acquire()


# -- 13: a waiter whose handoff failed, collected later -----------------------------------------


@pytest.mark.parametrize("kind", ["bulkhead", "shedder"])
def test_a_task_collected_after_its_handoff_failed_is_counted_once(
    fb: types.SimpleNamespace, kind: str
) -> None:
    bh = fb.Bulkhead(1, max_wait=100)
    guard = bh if kind == "bulkhead" else fb.LoadShedder(bh, queue_timeout=100)

    async def waits() -> None:
        async with guard:
            pass

    guard.__enter__()
    with quiet_asyncio():
        task = pending_on_closed_loop(waits)
        guard.__exit__(None, None, None)  # the handoff fails (loop closed): the slot passes on
        assert bh.in_flight == 0
        gone = weakref.ref(task)
        del task  # its cleanup runs now, outside any lock
        gc.collect()
    assert gone() is None
    m = bh.metrics()
    assert (m.in_flight, m.waiting, m.cancelled) == (0, 0, 1 if kind == "bulkhead" else 0)
    if kind == "shedder":
        assert (guard.metrics().queue_len, guard.metrics().in_flight) == (0, 0)
    with guard:
        assert bh.in_flight == 1
    assert bh.try_acquire()
    bh.release()
    assert bh.metrics().in_flight == 0


# -- 14: the clock fails while a request queues -------------------------------------------------


class ClockBroke(Exception):
    pass


class FailingClock:
    """A fake clock whose ``fail_at``-th read raises ``ClockBroke`` (1-based)."""

    def __init__(self, clock: FakeClock, fail_at: int) -> None:
        self.clock = clock
        self.fail_at = fail_at
        self.reads = 0
        self.failed = False

    def __call__(self) -> int:
        self.reads += 1
        if self.reads == self.fail_at:
            self.failed = True
            raise ClockBroke(f"read {self.reads}")
        return self.clock()


def _queue_and_release_async(shedder: Any) -> list[str]:
    """Hold the only slot, let a task queue for it, release: what happened to each."""
    results: list[str] = []
    loop = asyncio.new_event_loop()

    async def caller() -> None:
        try:
            async with shedder:
                results.append("admitted")
        except ClockBroke:
            results.append("caller: clock")

    shedder.__enter__()
    task = loop.create_task(caller())
    loop.run_until_complete(asyncio.sleep(0))
    try:
        shedder.__exit__(None, None, None)
    except ClockBroke:
        results.append("release: clock")
    loop.run_until_complete(task)
    loop.close()
    return results


def _queue_and_release_thread(shedder: Any) -> list[str]:
    results: list[str] = []

    def caller() -> None:
        try:
            with shedder:
                results.append("admitted")
        except ClockBroke:
            results.append("caller: clock")

    shedder.__enter__()
    t = threading.Thread(target=caller)
    t.start()
    end = time.monotonic() + JOIN_S
    while not results and shedder.metrics().queue_len == 0:  # a bound only, no timed sleep
        assert time.monotonic() < end, "the caller neither queued nor ended"
        time.sleep(0)
    try:
        shedder.__exit__(None, None, None)
    except ClockBroke:
        results.append("release: clock")
    t.join(JOIN_S)
    assert not t.is_alive()
    return results


@pytest.mark.parametrize("limit_kind", ["Bulkhead", "AdaptiveLimiter"])
@pytest.mark.parametrize("path", ["async", "thread"])
def test_a_clock_failing_at_any_read_while_a_request_queues_loses_no_slot(
    fb: types.SimpleNamespace, clock: FakeClock, path: str, limit_kind: str
) -> None:
    run = _queue_and_release_async if path == "async" else _queue_and_release_thread
    fail_at = 1
    while True:
        clk = FailingClock(clock, fail_at)
        limit = (
            fb.Bulkhead(1)
            if limit_kind == "Bulkhead"
            else fb.AdaptiveLimiter(initial_limit=1, min_limit=1, max_limit=1, clock=clock)
        )
        # codel_interval bounds each wait: a waiter re-checks within 1 ms (of real time).
        shedder = fb.LoadShedder(
            limit, queue_timeout=100, codel_target=0.0005, codel_interval=0.001, clock=clk
        )
        results = run(shedder)
        where = f"clock failing at read {fail_at}: {results}"
        assert (limit.in_flight, limit.waiting, shedder.metrics().queue_len) == (0, 0, 0), where
        assert results.count("admitted") + results.count("caller: clock") == 1, where
        with shedder:  # the next caller is admitted at once
            assert limit.in_flight == 1, where
        assert limit.in_flight == 0
        if not clk.failed:
            break  # every read of a whole run has failed once
        fail_at += 1
    assert fail_at >= 3  # arrival, the wait's bound, the handoff at least


def test_twin_counter_lock_a_holder_collected_under_it_does_not_deadlock() -> None:
    # The twin keeps its counters under a lock (the compiled core uses atomics); metrics()
    # allocates under it, so the GC may finalize an abandoned holder there, whose exit releases.
    twin = implementations()["python"]
    bh = twin.Bulkhead(1)

    async def holder() -> None:
        async with bh:
            await asyncio.get_running_loop().create_future()  # never resolved

    class CollectingLock:
        """The twin's own lock, running the GC once right after it is taken."""

        def __init__(self, inner: Any) -> None:
            self.inner = inner
            self.armed = True

        def __enter__(self) -> None:
            self.inner.__enter__()
            if self.armed:
                self.armed = False
                gc.collect()

        def __exit__(self, *exc_info: object) -> None:
            self.inner.__exit__(*exc_info)

    with quiet_asyncio():
        gone = abandon(holder)
        assert bh.in_flight == 1
        bh._lock = CollectingLock(bh._lock)
        in_thread(lambda: bh.metrics() and None)  # (a bound method would be shown: its repr locks)
    assert gone() is None
    assert (bh.in_flight, bh.metrics().admitted) == (0, 1)


def test_shedder_a_tasks_own_cleanup_does_not_wait_for_another_thread(
    fb: types.SimpleNamespace, clock: FakeClock
) -> None:
    # Another thread holds the shedder's lock (stopped in a clock read under it); a waiting
    # task's cleanup (GeneratorExit, what its finalizer throws in) must not wait for it: that
    # thread may be waiting for a lock this one holds. The holder settles it as it leaves.
    entered, go = threading.Event(), threading.Event()

    def blocking_clock() -> int:
        if threading.current_thread().name == "holder":
            entered.set()
            assert go.wait(JOIN_S)
        return clock()

    shedder = fb.LoadShedder(fb.Bulkhead(1), queue_timeout=100, clock=blocking_clock)
    shedder.__enter__()

    async def waits() -> None:
        async with shedder:
            pass

    with quiet_asyncio():
        task = pending_on_closed_loop(waits)
        assert shedder.metrics().queue_len == 1
        holder = threading.Thread(
            target=lambda: shedder.__exit__(None, None, None), name="holder", daemon=True
        )
        holder.start()
        assert entered.wait(JOIN_S)  # the holder is inside the handoff, under the lock
        in_thread(task.get_coro().close)  # the task's cleanup returns at once
        go.set()
        holder.join(JOIN_S)
        assert not holder.is_alive()
        del task
        gc.collect()
    m = shedder.metrics()
    assert (m.in_flight, m.queue_len, m.admitted) == (0, 0, 1)
    with shedder:
        assert shedder.metrics().in_flight == 1
