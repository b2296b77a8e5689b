"""Benchmarks: what a FleetCoordinator costs (fastbreaker.contrib.redis).

    python benchmarks/bench_fleet.py            # every figure in one run (needs redis-server)
    python -m pytest benchmarks/bench_fleet.py --benchmark-enable --benchmark-columns=min,median

* ``allow()`` in CLOSED on a breaker attached to a coordinator, against the same breaker kind
  with none, interleaved in one run (ratio of minima). The coordinator never touches the call
  path, so the ratio is 1.0 within noise; ``python -m fastbreaker`` shows the same as the row
  ``fastbreaker (compiled) + FleetCoordinator``.
* one ``sync_once()`` against a real local redis-server (started here from the binary on a free
  port): a single breaker, and a BreakerMap of 10,000 keys of which 100 had outcomes since the
  previous sync (the coordinator reads all 10,000 locally, sends 100 to Redis).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

import fastbreaker

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

KEYS = 10_000
CHANGED = 100


def _server() -> Any:
    from fleet_support import BINARY, RedisServer

    if BINARY is None:
        return None
    return RedisServer().start()


def _coordinator(server: Any, ns: str) -> Any:
    from fastbreaker.contrib.redis import FleetCoordinator

    return FleetCoordinator(server.client(), namespace=ns, sync_timeout=2.0)


def setup_map(server: Any, ns: str) -> tuple[Any, Any, Any]:
    """A synced map of KEYS keys, and a step that makes CHANGED of them change."""
    m = fastbreaker.BreakerMap(1000, 30.0)
    keys = [f"host-{i}" for i in range(KEYS)]
    for k in keys:
        m.allow(k)
        m.record_success(k)
    coord = _coordinator(server, ns)
    coord.add_map(m, "hosts")
    coord.sync_once()
    state = {"i": 0}

    def change() -> None:
        start = state["i"]
        for k in keys[start : start + CHANGED]:
            m.allow(k)
            m.record_success(k)
        state["i"] = (start + CHANGED) % KEYS

    return m, coord, change


def setup_breaker(server: Any, ns: str) -> tuple[Any, Any]:
    b = fastbreaker.CircuitBreaker(name="pay")
    coord = _coordinator(server, ns)
    coord.add_breaker(b)
    return b, coord


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    pytest.importorskip("redis")
    srv = _server()
    if srv is None:
        pytest.skip("redis-server is not installed")
    yield srv
    srv.stop()


def test_allow_without_coordinator(benchmark: Any) -> None:
    b = fastbreaker.CircuitBreaker(name="pay")
    benchmark(b.allow)


def test_allow_with_coordinator(benchmark: Any) -> None:
    from fastbreaker.contrib.redis import FleetCoordinator

    b = fastbreaker.CircuitBreaker(name="pay")
    FleetCoordinator(object(), namespace="bench").add_breaker(b)
    benchmark(b.allow)


def test_sync_once_one_breaker(benchmark: Any, server: Any) -> None:
    b, coord = setup_breaker(server, "bench1")

    def step() -> None:
        b.allow()
        b.record_success()
        assert coord.sync_once().ok

    benchmark(step)


def test_sync_once_map_10000_keys_100_changed(benchmark: Any, server: Any) -> None:
    m, coord, change = setup_map(server, "bench2")

    def step() -> None:
        change()
        report = coord.sync_once()
        assert report.ok and report.keys == CHANGED

    benchmark(step)


def _min_ns(fn: Any, n: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter_ns() - t0) / n)
    return best


def main() -> None:
    from fastbreaker.contrib.redis import FleetCoordinator

    alone = fastbreaker.CircuitBreaker(name="pay")
    attached = fastbreaker.CircuitBreaker(name="pay")
    FleetCoordinator(object(), namespace="bench").add_breaker(attached)
    a = w = float("inf")
    for _ in range(15):  # interleaved, so that both rows see the same machine state
        a = min(a, _min_ns(alone.allow, 200_000, 1))
        w = min(w, _min_ns(attached.allow, 200_000, 1))
    core = "compiled" if fastbreaker.COMPILED else "pure twin"
    print(
        f"allow() in CLOSED ({core}): alone {a:.1f} ns, with a coordinator {w:.1f} ns, "
        f"ratio {w / a:.3f}"
    )
    srv = _server()
    if srv is None:
        print("sync_once(): skipped, redis-server is not installed")
        return
    try:
        b, coord = setup_breaker(srv, "main1")

        def one() -> None:
            b.allow()
            b.record_success()
            coord.sync_once()

        one_us = _min_ns(one, 200, 5) / 1000
        m, mcoord, change = setup_map(srv, "main2")
        t_change = _min_ns(change, 20, 3)
        t_sync = float("inf")
        for _ in range(20):
            change()
            t0 = time.perf_counter_ns()
            mcoord.sync_once()
            t_sync = min(t_sync, time.perf_counter_ns() - t0)
        print(f"sync_once(), 1 breaker with an outcome: {one_us:.0f} us (min of 5 x 200)")
        print(
            f"sync_once(), BreakerMap of {KEYS:,} keys, {CHANGED} changed: "
            f"{t_sync / 1e6:.2f} ms (min of 20; making the {CHANGED} outcomes: "
            f"{t_change / 1e3:.0f} us, not included)"
        )
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
