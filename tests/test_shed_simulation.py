"""The overload curve: goodput of a service with and without load shedding (``-s`` shows it).

A deterministic discrete-event simulation, no real time: asyncio tasks run on an event loop whose
clock is a FakeClock that jumps to the next timer instead of sleeping (``VirtualLoop``), so the
real ``LoadShedder`` code (its queue, CoDel, its waiters' own bounded waits on that loop) makes
every decision. The service has ``C`` slots and a fixed service time ``S``; open-loop clients
arrive (seeded exponential gaps) at 0.5x .. 3x capacity, each with a deadline of ``2.5 S``.
Goodput is answers within the client's deadline per second, as a share of capacity ``C / S``.

Without shedding (an unbounded FIFO queue, ``asyncio.Semaphore``, that serves every request
however late) goodput collapses past 1x; with a ``LoadShedder`` (adaptive LIFO, CoDel, the
request's deadline propagated) it plateaus.
"""

from __future__ import annotations

import asyncio
import random
import selectors
import types
from typing import Any, Callable, Optional

import pytest

from fastbreaker.testing import FakeClock

C = 10  # slots
S = 0.1  # service time, seconds
DEADLINE = 2.5 * S
DURATION = 20.0  # simulated seconds of arrivals
LOADS = (0.5, 1.0, 1.5, 2.0, 3.0)


class VirtualSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    """A selector that never blocks: waiting ``timeout`` seconds moves the fake clock instead."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self._fake = clock

    def select(self, timeout: Optional[float] = None) -> Any:
        if timeout is not None and timeout > 0:
            self._fake.advance(timeout + 1e-9)  # at or just past the timer's due time
        return super().select(0)


class VirtualLoop(asyncio.SelectorEventLoop):
    """An event loop on a FakeClock: deterministic, and as fast as the work it runs."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(VirtualSelector(clock))
        self._fake = clock

    def time(self) -> float:
        return self._fake() / 1e9


def simulate(load: float, make_guard: Callable[[FakeClock], Any], fb: Any, seed: int = 7) -> float:
    """Goodput (answers within the deadline per second) as a share of capacity ``C / S``."""
    clock = FakeClock(10**12)
    loop = VirtualLoop(clock)
    good = [0]

    async def request(guard: Any, with_deadline: bool) -> None:
        t0 = loop.time()
        try:
            if with_deadline:
                with fb.deadline(DEADLINE, clock=clock):
                    async with guard:
                        await asyncio.sleep(S)
            else:
                async with guard:
                    await asyncio.sleep(S)
        except fb.LoadShedError:
            return
        if loop.time() - t0 <= DEADLINE:
            good[0] += 1

    async def main() -> None:
        guard, with_deadline = make_guard(clock)
        rng = random.Random(seed)
        rate = load * C / S
        end = loop.time() + DURATION
        tasks = []
        t = loop.time()
        while True:
            t += rng.expovariate(rate)
            if t >= end:
                break
            await asyncio.sleep(max(0.0, t - loop.time()))
            tasks.append(asyncio.create_task(request(guard, with_deadline)))
        await asyncio.gather(*tasks)

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    return good[0] / DURATION / (C / S)


def test_goodput_collapses_without_shedding_and_plateaus_with_it(
    fb: types.SimpleNamespace,
) -> None:
    def unbounded(clock: FakeClock) -> tuple[Any, bool]:
        return asyncio.Semaphore(C), False

    def shedder(clock: FakeClock) -> tuple[Any, bool]:
        return fb.LoadShedder(fb.Bulkhead(C), clock=clock), True

    rows = [(load, simulate(load, unbounded, fb), simulate(load, shedder, fb)) for load in LOADS]
    print(f"\n[overload curve, {fb.impl} core] C={C} S={S}s deadline={DEADLINE}s")
    print(" offered load | goodput, unbounded FIFO | goodput, LoadShedder  (share of C/S)")
    for load, plain, shed in rows:
        print(f"     {load:4.1f}x    |         {plain:6.1%}          |       {shed:6.1%}")
    by_load = {load: (plain, shed) for load, plain, shed in rows}
    assert by_load[0.5][0] > 0.45 and by_load[0.5][1] > 0.45  # light load: everything answers
    for load in (1.5, 2.0, 3.0):
        assert by_load[load][0] < 0.2, f"no collapse without shedding at {load}x"
        assert by_load[load][1] >= 0.85, f"no plateau with shedding at {load}x"
    assert by_load[3.0][1] >= 0.85


@pytest.mark.parametrize("order", ["fifo", "adaptive"])
def test_the_simulation_is_deterministic(fb: types.SimpleNamespace, order: str) -> None:
    def shedder(clock: FakeClock) -> tuple[Any, bool]:
        return fb.LoadShedder(fb.Bulkhead(C), order=order, clock=clock), True

    global DURATION
    saved, DURATION = DURATION, 2.0
    try:
        assert simulate(2.0, shedder, fb, seed=3) == simulate(2.0, shedder, fb, seed=3)
    finally:
        DURATION = saved
