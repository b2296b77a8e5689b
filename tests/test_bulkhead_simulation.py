"""A deterministic simulation with a fake clock: does the adaptive limit find the capacity?

The dependency has capacity C: a call admitted when ``in_flight`` calls run (itself included)
takes ``base * max(1, in_flight / C)``. The offered load is 4C closed-loop clients, far above C,
so the limiter is always the bottleneck (``in_flight == floor(limit)``). Events are processed in
time order on a FakeClock; each completion is one sample ``release(rtt)``.

Run with ``-s`` to see the figures:

    python -m pytest -q -s tests/test_bulkhead_simulation.py
"""

from __future__ import annotations

import heapq
import types
from typing import Any

import pytest

from fastbreaker.testing import FakeClock

BASE = 0.010  # 10 ms unloaded latency
SAMPLES = 2000  # the bound, to reach the band and to follow a change


def simulate(lim: Any, clock: FakeClock, capacity: Any, samples: int) -> list[float]:
    """Run ``samples`` completions; ``capacity(i)`` is C at sample ``i``. Returns the limit
    after each sample."""
    clients = 4 * max(capacity(0), capacity(samples - 1))
    idle = clients
    running: list[tuple[int, int, int]] = []  # (end_ns, seq, rtt_ns)
    seq = 0
    limits: list[float] = []
    for i in range(samples):
        c = capacity(i)
        while idle and lim.try_acquire():
            idle -= 1
            rtt_ns = round(BASE * max(1.0, lim.in_flight / c) * 1e9)
            heapq.heappush(running, (clock() + rtt_ns, seq, rtt_ns))
            seq += 1
        end, _, rtt_ns = heapq.heappop(running)
        clock.advance((end - clock()) / 1e9)
        lim.release(rtt_ns / 1e9)
        idle += 1
        limits.append(lim.limit)
    return limits


def entered(limits: list[float], lo: float, hi: float) -> int | None:
    """The first sample index from which the limit stays in [lo, hi] to the end."""
    for i in range(len(limits) - 1, -1, -1):
        if not lo <= limits[i] <= hi:
            return i + 1 if i + 1 < len(limits) else None
    return 0


def run(fb: types.SimpleNamespace, algorithm: str) -> dict[str, Any]:
    clock = FakeClock(10**12)
    kwargs: dict[str, Any] = {"algorithm": algorithm, "clock": clock}
    if algorithm == "aimd":
        kwargs["rtt_threshold"] = 1.2 * BASE
    lim = fb.AdaptiveLimiter(20, min_limit=4, max_limit=400, **kwargs)
    c1, c2 = 50, 25
    n = 3 * SAMPLES
    limits = simulate(lim, clock, lambda i: c1 if i < n else c2, 2 * n)
    first, second = limits[:n], limits[n:]
    e1 = entered(first, 0.7 * c1, 1.3 * c1)
    e2 = entered(second, 0.7 * c2, 1.3 * c2)
    fig = {
        "algorithm": algorithm,
        "C=50 entered band at sample": e1,
        "C=50 range after": (round(min(first[e1:]), 2), round(max(first[e1:]), 2))
        if e1 is not None
        else None,
        "C=25 entered band after": e2,
        "C=25 range after": (round(min(second[e2:]), 2), round(max(second[e2:]), 2))
        if e2 is not None
        else None,
        "final": round(limits[-1], 2),
        "in_flight": lim.in_flight,
    }
    print(f"\n[limit simulation {fb.impl}] {fig}")
    return {"e1": e1, "e2": e2, "limits": limits}


@pytest.mark.parametrize("algorithm", ["aimd", "gradient"])
def test_limit_finds_the_capacity_and_follows_when_it_halves(
    fb: types.SimpleNamespace, algorithm: str
) -> None:
    r = run(fb, algorithm)
    assert r["e1"] is not None and r["e1"] <= SAMPLES, "did not settle within [0.7C, 1.3C]"
    assert r["e2"] is not None and r["e2"] <= SAMPLES, "did not follow C halving"


def test_both_cores_give_the_same_trajectory() -> None:
    import fastbreaker

    impls = fastbreaker.testing.implementations()
    if len(impls) < 2:
        pytest.skip("only one core is built")
    for algorithm in ("aimd", "gradient"):
        runs = [run(ns, algorithm)["limits"] for ns in impls.values()]
        assert runs[0] == runs[1]


def test_seed_rule_without_the_once_per_round_trip_guard_collapses() -> None:
    """The seed's AIMD as written (a cut per slow sample, growth only when in_flight >= limit)
    never finds the capacity: once floor(limit) < limit, in_flight (at most floor(limit)) never
    reaches limit, so growth stops for good; and each slow round trip is many cuts."""
    clock = FakeClock(10**12)

    class Naive:
        def __init__(self) -> None:
            self.limit = 20.0
            self.in_flight = 0

        def try_acquire(self) -> bool:
            if self.in_flight < int(self.limit):
                self.in_flight += 1
                return True
            return False

        def release(self, rtt: float) -> None:
            if rtt > 1.2 * BASE:
                self.limit = max(4.0, self.limit * 0.9)
            elif self.in_flight >= self.limit:
                self.limit = min(400.0, self.limit + 1 / self.limit)
            self.in_flight -= 1

    limits = simulate(Naive(), clock, lambda i: 50, 2 * SAMPLES)
    print(f"\n[limit simulation naive seed rule] max {max(limits):.2f}, final {limits[-1]:.2f}")
    assert limits[-1] < 0.7 * 50
