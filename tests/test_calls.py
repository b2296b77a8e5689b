"""The call paths: call, call_async, decorator, with / async with; probes under concurrency."""

from __future__ import annotations

import asyncio
import copy
import gc
import inspect
import threading
import tracemalloc

import pytest

from fastbreaker.testing import FakeClock


def test_call_returns_value_and_passes_arguments(fb, clock):
    b = fb.CircuitBreaker(clock=clock)
    assert b.call(lambda a, *, k: (a, k), 1, k=2) == (1, 2)
    assert b.metrics().successes == 1


def test_call_rejects_when_open_without_calling(fb, clock):
    b = fb.CircuitBreaker(failure_threshold=1, clock=clock)
    b.trip()
    called = []
    with pytest.raises(fb.CircuitOpenError):
        b.call(called.append, 1)
    assert called == []
    assert b.metrics().rejected == 1


def test_decorator_sync_keeps_metadata(fb, clock):
    b = fb.CircuitBreaker(failure_threshold=2, clock=clock)

    @b
    def fetch(x: int, y: int = 2) -> int:
        """Docs."""
        if x < 0:
            raise ConnectionError
        return x + y

    assert fetch.__name__ == "fetch" and fetch.__doc__ == "Docs."
    assert inspect.signature(fetch) == inspect.signature(fetch.__wrapped__)
    assert fetch(1) == 3
    for _ in range(2):
        with pytest.raises(ConnectionError):
            fetch(-1)
    with pytest.raises(fb.CircuitOpenError):
        fetch(1)


async def test_decorator_async(fb, clock):
    b = fb.CircuitBreaker(failure_threshold=1, clock=clock)

    @b
    async def fetch(x):
        await asyncio.sleep(0)
        if x is None:
            raise ConnectionError
        return x * 2

    assert inspect.iscoroutinefunction(fetch)
    assert await fetch(4) == 8
    with pytest.raises(ConnectionError):
        await fetch(None)
    with pytest.raises(fb.CircuitOpenError):
        await fetch(4)
    m = b.metrics()
    assert (m.successes, m.failures, m.rejected) == (1, 1, 1)


async def test_call_async(fb, clock):
    b = fb.CircuitBreaker(failure_threshold=1, clock=clock, slow_call_duration=1.0)

    async def slow():
        clock.advance(2)
        return "x"

    assert await b.call_async(slow) == "x"
    assert b.state == fb.State.OPEN
    assert b.metrics().slow_calls == 1


class _Suspends:
    """An awaitable that suspends once (yields to whoever drives it), then returns "done"."""

    def __await__(self):
        yield "suspended"
        return "done"


async def _suspend_once():
    return await _Suspends()


async def _decorated_module_level():
    return 7


def test_call_async_is_driven_like_a_coroutine(fb, clock):
    # Driven by hand: nothing is admitted before the first send; a value sent in reaches the
    # awaited call; throw() and close() reach it too; each outcome is recorded exactly once,
    # and a call dropped while suspended gives its permit back (neutral), as a coroutine does.
    b = fb.CircuitBreaker(failure_threshold=1, clock=clock, half_open_max_calls=1)
    aw = b.call_async(_suspend_once)
    assert b.metrics().permitted == 0
    assert aw.send(None) == "suspended"
    assert b.metrics().permitted == 1
    with pytest.raises(StopIteration) as done:
        aw.send(None)
    assert done.value.value == "done"
    assert b.metrics().successes == 1

    aw = b.call_async(_suspend_once)
    aw.send(None)
    aw.close()  # GeneratorExit: neutral
    assert b.metrics().ignored == 1

    aw = b.call_async(_suspend_once)
    aw.send(None)
    del aw  # dropped while suspended: finalized (closed), the permit released
    gc.collect()
    assert b.metrics().ignored == 2
    m = b.metrics()
    assert m.permitted == m.successes + m.failures + m.ignored + m.stale  # nothing in flight

    aw = b.call_async(_suspend_once)
    aw.send(None)
    with pytest.raises(ConnectionError):
        aw.throw(ConnectionError("down"))
    assert (b.metrics().failures, b.state) == (1, fb.State.OPEN)
    with pytest.raises(fb.CircuitOpenError):
        b.call_async(_suspend_once).send(None)
    # never driven: nothing admitted, nothing recorded
    b.reset()
    before = b.metrics().permitted
    b.call_async(_suspend_once).close()
    assert b.metrics().permitted == before


async def test_call_async_runs_as_a_task_and_is_cancelled_neutrally(fb, clock):
    b = fb.CircuitBreaker(clock=clock)

    async def quick():
        return 3

    assert await asyncio.create_task(b.call_async(quick)) == 3
    gate, started = asyncio.Event(), asyncio.Event()

    async def waits():
        started.set()
        await gate.wait()

    task = asyncio.ensure_future(b.call_async(waits))
    await started.wait()  # the call is admitted and suspended inside the breaker
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    m = b.metrics()
    assert (m.successes, m.ignored, m.failures) == (1, 1, 0)


async def test_async_decorator_is_a_coroutine_function_and_binds_as_a_method(fb, clock):
    b = fb.CircuitBreaker(clock=clock)

    class Client:
        @b
        async def get(self, path, *, retries=1):
            """Fetch a path."""
            return f"{path}:{retries}"

    client = Client()
    assert inspect.iscoroutinefunction(Client.get) and inspect.iscoroutinefunction(client.get)
    assert asyncio.iscoroutinefunction(client.get)
    assert str(inspect.signature(client.get)) == "(path, *, retries=1)"
    assert Client.get.__name__ == "get" and Client.get.__doc__ == "Fetch a path."
    assert Client.get.__qualname__.endswith("Client.get")
    assert await client.get("/a", retries=2) == "/a:2"
    assert b.metrics().successes == 1
    guarded = b(_decorated_module_level)
    assert copy.copy(guarded) is guarded or inspect.iscoroutinefunction(copy.copy(guarded))
    assert await guarded() == 7


async def test_long_running_async_calls_keep_no_memory(fb, clock):
    b = fb.CircuitBreaker(clock=clock)

    async def af():
        return 1

    guarded = b(af)

    async def calls(n):
        for _ in range(n):
            await b.call_async(af)
            await guarded()

    await calls(1000)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        await calls(20_000)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 20_000, f"{grown} bytes kept by 40,000 guarded async calls"
    m = b.metrics()
    assert m.successes == m.permitted == 42_000


def test_with_block_records_outcomes(fb, clock):
    b = fb.CircuitBreaker(failure_threshold=2, clock=clock, ignore=(KeyError,))
    with b:
        pass
    with pytest.raises(KeyError):
        with b:
            raise KeyError
    for _ in range(2):
        with pytest.raises(ConnectionError):
            with b:
                raise ConnectionError
    with pytest.raises(fb.CircuitOpenError):
        with b:
            pytest.fail("body must not run")
    m = b.metrics()
    assert (m.successes, m.ignored, m.failures, m.rejected) == (1, 1, 2, 1)


def test_nested_with_blocks_keep_their_permits(fb, clock):
    a = fb.CircuitBreaker(failure_threshold=1, clock=clock)
    b = fb.CircuitBreaker(failure_threshold=1, clock=clock)
    with pytest.raises(ValueError):
        with a:
            with b:
                pass
            raise ValueError
    assert a.state == fb.State.OPEN and b.state == fb.State.CLOSED
    with b:
        with b:
            pass
    assert b.metrics().successes == 3


async def test_async_with(fb, clock):
    b = fb.CircuitBreaker(failure_threshold=1, clock=clock)
    async with b:
        await asyncio.sleep(0)
    with pytest.raises(TimeoutError):
        async with b:
            raise TimeoutError
    with pytest.raises(fb.CircuitOpenError):
        async with b:
            pass
    m = b.metrics()
    assert (m.successes, m.failures, m.rejected) == (1, 1, 1)


def test_async_with_methods_driven_by_hand(fb, clock):
    # What __aenter__/__aexit__ return is awaitable and, driven as an iterator, finishes at
    # once: the compiled core's is an awaitable already complete, the twin's a coroutine.
    b = fb.CircuitBreaker(failure_threshold=1, clock=clock)
    with pytest.raises(StopIteration) as entered:
        next(b.__aenter__().__await__())
    assert entered.value.value is b
    with pytest.raises(StopIteration) as left:
        next(b.__aexit__(None, None, None).__await__())
    assert left.value.value is None
    assert b.metrics().successes == 1
    # a failure suppresses nothing (the awaited result is None, so the error propagates)
    with pytest.raises(StopIteration):
        next(b.__aenter__().__await__())
    with pytest.raises(StopIteration) as left:
        next(b.__aexit__(TimeoutError, TimeoutError(), None).__await__())
    assert left.value.value is None
    assert (b.metrics().failures, b.state) == (1, fb.State.OPEN)


async def test_async_with_keeps_nothing_per_block(fb, clock):
    # a long-running `async with` loop holds no memory per block (nor a reference per block)
    import gc
    import sys
    import tracemalloc

    b = fb.CircuitBreaker(clock=clock)

    async def blocks(n):
        for _ in range(n):
            async with b:
                pass

    await blocks(1000)  # warm up: caches, the context's stack
    enter = b.__aenter__()
    kind = type(enter)  # the awaitable's type (a heap type in the compiled core)
    await enter
    await b.__aexit__(None, None, None)
    gc.collect()
    refs = sys.getrefcount(kind)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        await blocks(20_000)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 20_000, f"{grown} bytes kept by 20,000 async with blocks"
    assert sys.getrefcount(kind) <= refs
    assert b.metrics().successes == 21_001


async def test_async_with_interleaved_tasks(fb, clock):
    # Each task's `async with` keeps its own permit even when they interleave.
    b = fb.CircuitBreaker(failure_threshold=100, clock=clock)
    gate = asyncio.Event()

    async def job(fail):
        async with b:
            await gate.wait()
            if fail:
                raise ValueError

    tasks = [asyncio.ensure_future(job(i % 2 == 0)) for i in range(10)]
    await asyncio.sleep(0)
    gate.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert sum(isinstance(r, ValueError) for r in results) == 5
    m = b.metrics()
    assert (m.successes, m.failures, m.stale) == (5, 5, 0)


async def test_a_thousand_tasks_interleaving_async_with_account_exactly(fb, clock):
    # Issue 17: the compiled `async with` keeps its per-task bookkeeping in C stacks, one per
    # Context. 1,000 tasks enter one breaker, nest a second block, and yield to each other inside
    # both, leaving in an order unrelated to the order they entered, with every kind of exit
    # (success, failure, ignored, cancellation). The first 500 enter before a trip and reset,
    # the others after: their outer permits are of different generations, so an exit that
    # finished another task's permit would move a count between `stale` and the others.
    import random

    b = fb.CircuitBreaker(failure_threshold=10**6, ignore=(KeyError,), clock=clock)
    rng = random.Random(17)
    n, half = 1000, 500
    plans = [(rng.randrange(4), rng.randrange(1, 6)) for _ in range(n)]
    first_in, all_in = asyncio.Event(), asyncio.Event()
    entered = 0

    async def job(i):
        nonlocal entered
        outcome, yields = plans[i]
        async with b:
            entered += 1
            if entered == half:
                first_in.set()
            if entered == n:
                all_in.set()
            await all_in.wait()  # every task is inside its block before any leaves
            async with b:  # nested on the same breaker, in the same task
                for _ in range(yields):
                    await asyncio.sleep(0)
            if outcome == 1:
                raise ValueError(i)
            if outcome == 2:
                raise KeyError(i)
            if outcome == 3:
                await asyncio.Event().wait()  # cancelled below
        return i

    tasks = [asyncio.ensure_future(job(i)) for i in range(half)]
    await first_in.wait()
    b.trip()
    b.reset()  # two transitions: the first half's outer permits are stale from here
    tasks += [asyncio.ensure_future(job(i)) for i in range(half, n)]
    await all_in.wait()
    for _ in range(10):
        await asyncio.sleep(0)
    for t, (outcome, _) in zip(tasks, plans):
        if outcome == 3:
            t.cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    kinds = (int, ValueError, KeyError, asyncio.CancelledError)
    for k, kind in enumerate(kinds):
        assert sum(isinstance(r, kind) for r in results) == sum(o == k for o, _ in plans)
    late = [sum(o == k for o, _ in plans[half:]) for k in range(4)]  # the second half's exits
    m = b.metrics()
    # two blocks per task: every inner one succeeds (all entered after the reset); the outer
    # ones of the first half are stale, those of the second half end as their task does
    assert m.permitted == 2 * n
    assert m.stale == half
    assert m.successes == n + late[0]
    assert m.failures == late[1]
    assert m.ignored == late[2] + late[3]
    assert m.rejected == 0
    assert m.permitted == m.successes + m.failures + m.ignored + m.stale
    if fb.impl == "c":
        from fastbreaker import _breaker_c

        assert _breaker_c.open_with_blocks(b) == 0


def test_probe_limit_under_threads(fb):
    clock = FakeClock(10**12)
    b = fb.CircuitBreaker(failure_threshold=1, reset_timeout=1, half_open_max_calls=3, clock=clock)
    b.trip()
    clock.advance(1)
    n = 8
    barrier = threading.Barrier(n)
    admitted = []

    def worker():
        barrier.wait()
        for _ in range(200):
            if b.allow():
                admitted.append(1)

    threads = [threading.Thread(target=worker) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(admitted) == 3
    assert b.state == fb.State.HALF_OPEN


async def test_probe_limit_under_tasks(fb):
    clock = FakeClock(10**12)
    b = fb.CircuitBreaker(
        failure_threshold=1,
        reset_timeout=1,
        half_open_max_calls=2,
        success_threshold=2,
        clock=clock,
    )
    b.trip()
    clock.advance(1)
    gate = asyncio.Event()
    ran = []

    async def probe():
        ran.append(1)
        await gate.wait()
        return True

    tasks = [asyncio.ensure_future(b.call_async(probe)) for _ in range(20)]
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    gate.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert len(ran) == 2
    assert sum(r is True for r in results) == 2
    assert sum(isinstance(r, fb.CircuitOpenError) for r in results) == 18
    assert b.state == fb.State.CLOSED


def test_outcomes_not_lost_under_threads(fb):
    b = fb.CircuitBreaker(failure_threshold=10**9, clock=FakeClock())
    barrier = threading.Barrier(4)

    def worker(i):
        barrier.wait()
        for j in range(500):
            try:
                b.call(_maybe_fail, (i + j) % 3 == 0)
            except ConnectionError:
                pass

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    m = b.metrics()
    assert m.permitted == 2000
    assert m.successes + m.failures == 2000
    assert m.failures == sum(1 for i in range(4) for j in range(500) if (i + j) % 3 == 0)


def _maybe_fail(fail):
    if fail:
        raise ConnectionError
