"""The call paths: call, call_async, decorator, with / async with; probes under concurrency."""

from __future__ import annotations

import asyncio
import inspect
import threading

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
