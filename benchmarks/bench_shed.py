"""Benchmarks: LoadShedder's uncongested admission next to the Bulkhead it admits to.

    python -m pytest benchmarks/bench_shed.py --benchmark-enable \
        --benchmark-columns=min,median,mean,ops

Groups (compare within a group, same run, same machine):

* ``shed.with``: ``with shedder: f()`` against ``with bulkhead: f()`` (free slots, nobody
  waiting, no deadline). The issue's bound: the shedder costs at most 2x the bulkhead.
* ``shed.async``: ``async with`` of both, driven by one event loop (1,000 entries per round).

``test_the_no_wait_path_creates_no_thread`` checks that admitting through the shedder starts
no thread (and no task), on both cores.
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


@pytest.mark.benchmark(group="shed.with")
def test_with_shedder(benchmark: Any, fb: types.SimpleNamespace) -> None:
    shedder = fb.LoadShedder(fb.Bulkhead(N))

    def enter() -> None:
        with shedder:
            noop()

    benchmark(enter)
    m = shedder.metrics()
    assert (m.in_flight, m.queue_len, m.queued) == (0, 0, 0) and m.admitted > 0


@pytest.mark.benchmark(group="shed.with")
def test_with_bulkhead(benchmark: Any, fb: types.SimpleNamespace) -> None:
    bulkhead = fb.Bulkhead(N)

    def enter() -> None:
        with bulkhead:
            noop()

    benchmark(enter)
    assert bulkhead.in_flight == 0


def _async_bench(benchmark: Any, cm: Any) -> None:
    loop = asyncio.new_event_loop()
    try:

        async def many() -> None:
            for _ in range(1000):
                async with cm:
                    pass

        benchmark(lambda: loop.run_until_complete(many()))
    finally:
        loop.close()


@pytest.mark.benchmark(group="shed.async")
def test_async_with_shedder(benchmark: Any, fb: types.SimpleNamespace) -> None:
    _async_bench(benchmark, fb.LoadShedder(fb.Bulkhead(N)))


@pytest.mark.benchmark(group="shed.async")
def test_async_with_bulkhead(benchmark: Any, fb: types.SimpleNamespace) -> None:
    _async_bench(benchmark, fb.Bulkhead(N))


def test_the_no_wait_path_creates_no_thread(fb: types.SimpleNamespace, drive: Any) -> None:
    shedder = fb.LoadShedder(fb.Bulkhead(N))
    before = threading.active_count()
    started: list[object] = []
    original = threading.Thread.start

    def spy(self: threading.Thread) -> None:
        started.append(self)
        original(self)

    threading.Thread.start = spy  # type: ignore[method-assign]
    try:
        for _ in range(1000):
            with shedder:
                noop()
            shedder.call(noop)

        async def once() -> None:
            async with shedder:
                pass

        for _ in range(100):
            drive(once)  # never suspends: no task, no loop, no timer
    finally:
        threading.Thread.start = original  # type: ignore[method-assign]
    assert started == [] and threading.active_count() == before
    m = shedder.metrics()
    assert (m.admitted, m.queued, m.in_flight) == (2100, 0, 0)
