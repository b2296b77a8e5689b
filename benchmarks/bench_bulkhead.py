"""Benchmarks: Bulkhead and AdaptiveLimiter on both cores, against the floor and peers.

    python -m pytest benchmarks/bench_bulkhead.py --benchmark-enable \
        --benchmark-columns=min,median,mean,ops

Groups (compare within a group, same run, same machine):

* ``bulkhead.try_release``: ``try_acquire()`` + ``release()`` (uncontended) next to the floor
  (two empty method calls on a Cython class). The issue's bound: at most 2.5x the floor.
* ``bulkhead.with``: ``with bulkhead:`` against ``with threading.BoundedSemaphore(n):``.
* ``bulkhead.call``: ``bulkhead.call(f)`` against a semaphore around ``f()`` and pyresilience's
  bulkhead (``@resilient(bulkhead=...)``, skipped when pyresilience is not installed).
* ``bulkhead.async``: ``async with`` against ``asyncio.Semaphore`` and
  ``anyio.CapacityLimiter``, each driven by one event loop (``run_until_complete`` of a loop of
  1,000 entries, so that the loop's own cost is amortised).
"""

from __future__ import annotations

import asyncio
import threading
import types
from typing import Any

import pytest

N = 10


def noop() -> None:
    return None


@pytest.mark.benchmark(group="bulkhead.try_release")
def test_try_release(benchmark: Any, fb: types.SimpleNamespace) -> None:
    bh = fb.Bulkhead(N)
    acquire, release = bh.try_acquire, bh.release

    def pair() -> None:
        acquire()
        release()

    benchmark(pair)
    assert bh.in_flight == 0


@pytest.mark.benchmark(group="bulkhead.try_release")
def test_try_release_limiter(benchmark: Any, fb: types.SimpleNamespace) -> None:
    lim = fb.AdaptiveLimiter(N)
    acquire, release = lim.try_acquire, lim.release

    def pair() -> None:
        acquire()
        release()

    benchmark(pair)


@pytest.mark.benchmark(group="bulkhead.try_release")
def test_try_release_floor(benchmark: Any, floor: Any) -> None:
    allow, record = floor.allow, floor.record_success

    def pair() -> None:
        allow()
        record()

    benchmark(pair)


@pytest.mark.benchmark(group="bulkhead.with")
def test_with_bulkhead(benchmark: Any, fb: types.SimpleNamespace) -> None:
    bh = fb.Bulkhead(N)

    def enter() -> None:
        with bh:
            pass

    benchmark(enter)


@pytest.mark.benchmark(group="bulkhead.with")
def test_with_bounded_semaphore(benchmark: Any) -> None:
    sem = threading.BoundedSemaphore(N)

    def enter() -> None:
        with sem:
            pass

    benchmark(enter)


@pytest.mark.benchmark(group="bulkhead.call")
def test_call_bulkhead(benchmark: Any, fb: types.SimpleNamespace) -> None:
    bh = fb.Bulkhead(N)
    benchmark(bh.call, noop)


@pytest.mark.benchmark(group="bulkhead.call")
def test_call_limiter(benchmark: Any, fb: types.SimpleNamespace) -> None:
    lim = fb.AdaptiveLimiter(N)
    benchmark(lim.call, noop)


@pytest.mark.benchmark(group="bulkhead.call")
def test_call_bounded_semaphore(benchmark: Any) -> None:
    sem = threading.BoundedSemaphore(N)

    def call() -> None:
        with sem:
            noop()

    benchmark(call)


@pytest.mark.benchmark(group="bulkhead.call")
def test_call_pyresilience(benchmark: Any) -> None:
    pyresilience = pytest.importorskip("pyresilience")
    guarded = pyresilience.resilient(bulkhead=pyresilience.BulkheadConfig(max_concurrent=N))(noop)
    benchmark(guarded)


def _async_bench(benchmark: Any, make_cm: Any) -> None:
    loop = asyncio.new_event_loop()
    try:
        cm = loop.run_until_complete(_make(make_cm))

        async def many() -> None:
            for _ in range(1000):
                async with cm:
                    pass

        benchmark(lambda: loop.run_until_complete(many()))
    finally:
        loop.close()


async def _make(make_cm: Any) -> Any:
    return make_cm()  # inside the loop: anyio needs a running backend


@pytest.mark.benchmark(group="bulkhead.async")
def test_async_with_bulkhead(benchmark: Any, fb: types.SimpleNamespace) -> None:
    _async_bench(benchmark, lambda: fb.Bulkhead(N))


@pytest.mark.benchmark(group="bulkhead.async")
def test_async_with_asyncio_semaphore(benchmark: Any) -> None:
    _async_bench(benchmark, lambda: asyncio.Semaphore(N))


@pytest.mark.benchmark(group="bulkhead.async")
def test_async_with_anyio_capacity_limiter(benchmark: Any) -> None:
    anyio = pytest.importorskip("anyio")
    _async_bench(benchmark, lambda: anyio.CapacityLimiter(N))
