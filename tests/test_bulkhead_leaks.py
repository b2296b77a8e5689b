"""No slot leaks, ever: thousands of asyncio waiters cancelled at random points, threads timing
out, and the memory of long waiting/cancel loops (both cores)."""

from __future__ import annotations

import asyncio
import gc
import os
import random
import threading
import tracemalloc
import types

import pytest


async def _storm(fb: types.SimpleNamespace, seed: int, n: int) -> tuple[int, int, object]:
    rng = random.Random(seed)
    bh = fb.Bulkhead(8, max_wait=30.0, max_waiting=n)
    done = {"released": 0, "entered": 0}

    async def job() -> None:
        async with bh:
            done["entered"] += 1
            for _ in range(rng.randrange(3)):
                await asyncio.sleep(0)
            done["released"] += 1

    tasks = [asyncio.create_task(job()) for _ in range(n)]
    pending = list(tasks)
    while pending:
        # Let some tasks run (and some slots be handed over, their futures resolved but the
        # tasks not yet resumed), then cancel a random handful: waiting, handed-over, running.
        for _ in range(rng.randrange(1, 4)):
            await asyncio.sleep(0)
        for t in rng.sample(pending, min(len(pending), rng.randrange(0, 12))):
            t.cancel()
        pending = [t for t in pending if not t.done()]
    await asyncio.gather(*tasks, return_exceptions=True)
    return done["entered"], sum(t.cancelled() for t in tasks), bh


def _yield_cpu() -> None:
    """Let other threads run (no timed sleep: nothing waits for a duration)."""
    if hasattr(os, "sched_yield"):
        os.sched_yield()


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_thousands_of_cancelled_waiters_leave_no_slot_behind(
    fb: types.SimpleNamespace, seed: int
) -> None:
    entered, cancelled, bh = await _storm(fb, seed, 3000)
    m = bh.metrics()  # type: ignore[attr-defined]
    print(f"\n[bulkhead storm {fb.impl} seed={seed}] {m}")
    assert (m.in_flight, m.waiting) == (0, 0)
    # Every admission ran its body (a slot handed to a cancelled waiter was passed on, not
    # counted), and every body released its slot (in_flight == 0).
    assert m.admitted == entered
    assert m.admitted + m.cancelled == 3000
    assert cancelled > 100 and m.cancelled > 0 and m.waited > 0
    async with bh:  # still fully usable: not "full with nothing running"
        assert bh.in_flight == 1  # type: ignore[attr-defined]


async def test_hyx_leak_scenario_repeated(fb: types.SimpleNamespace) -> None:
    """The hyx bug: a waiter is woken (the slot is handed to it) and cancelled before it runs.
    Repeated many times, a leaking bulkhead would end up "full" with nothing running."""
    bh = fb.Bulkhead(1, max_wait=30.0, max_waiting=2)
    for _ in range(2000):
        assert bh.try_acquire()
        t = asyncio.create_task(bh.call_async(asyncio.sleep, 0))
        while bh.waiting == 0:
            await asyncio.sleep(0)
        bh.release()  # hand the slot to t
        t.cancel()  # before t runs
        with pytest.raises(asyncio.CancelledError):
            await t
        assert (bh.in_flight, bh.waiting) == (0, 0)
    m = bh.metrics()
    assert (m.cancelled, m.admitted, m.in_flight) == (2000, 2000, 0)


def test_threads_timing_out_leave_in_flight_zero(fb: types.SimpleNamespace) -> None:
    bh = fb.Bulkhead(2, max_wait=0.0005, max_waiting=16)
    counts = {"in": 0, "full": 0}
    lock = threading.Lock()
    barrier = threading.Barrier(8)

    def worker() -> None:
        barrier.wait()
        for i in range(300):
            try:
                with bh:
                    with lock:
                        counts["in"] += 1
                    for _ in range(i % 3):
                        _yield_cpu()  # yield the GIL inside the slot: real contention
            except fb.BulkheadFullError:
                with lock:
                    counts["full"] += 1

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    m = bh.metrics()
    print(f"\n[bulkhead threads {fb.impl}] {counts} {m}")
    assert (m.in_flight, m.waiting) == (0, 0)
    assert m.admitted == counts["in"] and m.rejected == counts["full"]
    assert m.peak_in_flight <= 2 and m.timed_out == counts["full"]


def test_threads_and_loops_together_balance(fb: types.SimpleNamespace) -> None:
    bh = fb.Bulkhead(3, max_wait=5.0, max_waiting=64)
    errors: list[BaseException] = []

    def thread_worker() -> None:
        for _ in range(200):
            try:
                with bh:
                    pass
            except fb.BulkheadFullError:
                pass
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

    def loop_worker(seed: int) -> None:
        async def main() -> None:
            rng = random.Random(seed)

            async def one() -> None:
                async with bh:
                    await asyncio.sleep(0)

            tasks = [asyncio.create_task(one()) for _ in range(300)]
            for _ in range(50):
                await asyncio.sleep(0)
                rng.choice(tasks).cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run(main())

    threads = [threading.Thread(target=thread_worker) for _ in range(3)]
    threads += [threading.Thread(target=loop_worker, args=(s,)) for s in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    m = bh.metrics()
    assert (m.in_flight, m.waiting) == (0, 0) and m.peak_in_flight <= 3


def _growth(fn: object, rounds: int) -> int:
    fn(rounds)  # type: ignore[operator]  # warm up caches
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        fn(rounds)  # type: ignore[operator]
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    return sum(s.size_diff for s in after.compare_to(before, "filename"))


def test_long_wait_and_cancel_loops_do_not_grow_memory(fb: types.SimpleNamespace) -> None:
    bh = fb.Bulkhead(1, max_wait=30.0, max_waiting=10)
    assert bh.try_acquire()  # held for the whole run: every waiter gives up

    def cancel_loop(rounds: int) -> None:
        async def main() -> None:
            for _ in range(rounds):
                t = asyncio.create_task(bh.call_async(asyncio.sleep, 0))
                await asyncio.sleep(0)
                t.cancel()
                await asyncio.gather(t, return_exceptions=True)

        asyncio.run(main())

    def timeout_loop(rounds: int) -> None:
        quick = fb.Bulkhead(1, max_wait=1e-6)
        with quick:
            for _ in range(rounds):
                try:
                    quick.call(lambda: None)
                except fb.BulkheadFullError:
                    pass

    grew_cancel = _growth(cancel_loop, 3000)
    grew_timeout = _growth(timeout_loop, 3000)
    print(
        f"\n[bulkhead memory {fb.impl}] cancel loop {grew_cancel} B, timeout loop {grew_timeout} B"
    )
    assert grew_cancel < 64_000 and grew_timeout < 64_000
    assert (bh.in_flight, bh.waiting) == (1, 0)
    assert len(bh._queue.q) < 32  # type: ignore[attr-defined]
    bh.release()
