"""Benchmarks: objects in a SharedRegion against the same objects in process memory, one run.

    python benchmarks/bench_region.py             # the README figures
    python benchmarks/bench_region.py --quick     # smaller sizes, for a smoke run
    python -m pytest benchmarks/bench_region.py --benchmark-enable --benchmark-columns=min,median

Targets (SharedRegion issue): a shared breaker's ``allow()`` at most 1.3x a local breaker's; a
shared map's ``allow(key)`` round-robin over 10,000 keys at most 2x the local ``BreakerMap``'s.
Both sides are timed interleaved, best of the repeats, so they see the same machine state. The
script also reports the bytes per key a shared map takes in the region (its table slot and the
breaker's block), and what a process holds per key it has used (its cached breaker objects).
The regions are unlinked as soon as they are made: nothing is left in /dev/shm.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import timeit
import tracemalloc
import types
import uuid
from typing import Any

import pytest

import fastbreaker

HOSTS = 10_000
TARGETS = {"allow": 1.3, "map_allow": 2.0}


def region(core: Any, keys: int) -> Any:
    from fastbreaker._region_map import map_size

    size = max(1 << 20, 2 * map_size(keys, 512) + (1 << 16))
    r = core.SharedRegion(f"fbbench-{os.getpid()}-{uuid.uuid4().hex[:6]}", size=size)
    r.unlink()  # the mapping stays for this process
    return r


def systems(core: Any, keys: list[str]) -> dict[str, dict[str, Any]]:
    r = region(core, len(keys))
    shared_map = r.breaker_map("hosts", capacity=len(keys))
    local_map = core.BreakerMap()
    for m in (shared_map, local_map):
        for k in keys:
            m.allow(k)
            m.record_success(k)
    return {
        "local": {"b": core.CircuitBreaker(), "m": local_map, "keys": keys},
        "shared": {"b": r.breaker("bench"), "m": shared_map, "keys": keys, "region": r},
    }


STMTS = {
    "allow": ("b.allow()", 1),
    "map_allow": ("for k in keys: m.allow(k)", None),
}


def measure(core: Any, n_keys: int, repeats: int) -> dict[str, Any]:
    keys = [f"host-{i}" for i in range(n_keys)]
    made = systems(core, keys)
    best: dict[tuple[str, str], float] = {}
    for _ in range(repeats):
        for metric, (stmt, per) in STMTS.items():
            for side, ns in made.items():
                number = 200_000 if per else 20
                t = timeit.timeit(stmt, globals=ns, number=number)
                per_op = t / (number * (per or n_keys)) * 1e9
                key = (metric, side)
                best[key] = min(best.get(key, float("inf")), per_op)
    out: dict[str, Any] = {}
    for metric in STMTS:
        local, shared = best[(metric, "local")], best[(metric, "shared")]
        out[metric] = {"local_ns": local, "shared_ns": shared, "ratio": shared / local}
    from fastbreaker._region_map import SLOT_SIZE

    out["region_bytes_per_key"] = SLOT_SIZE + 8 + _block_size(core)  # slot, tag, block
    out["process_bytes_per_key"] = _process_bytes(core, n_keys)
    return out


def _block_size(core: Any) -> int:
    from fastbreaker import _options

    mod = sys.modules[core.CircuitBreaker.__module__]
    return (int(mod.shared_size(_options.BreakerOptions())) + 63) & ~63


def _process_bytes(core: Any, n_keys: int) -> float:
    """What one process holds per key of a shared map it has used (traced, keys excluded)."""
    keys = [f"key-{i}" for i in range(n_keys)]
    r = region(core, n_keys)
    m = r.breaker_map("mem", capacity=n_keys)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for k in keys:
        m.allow(k)
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return (after - before) / n_keys


def report(quick: bool) -> int:
    if not fastbreaker.COMPILED:
        print("the compiled core is not selected: these targets are the compiled core's")
    core = fastbreaker.testing.implementations()["c" if fastbreaker.COMPILED else "python"]
    n = 1000 if quick else HOSTS
    result = measure(core, n, 3 if quick else 7)
    missed = []
    for metric, target in TARGETS.items():
        r = result[metric]
        met = r["ratio"] <= target
        missed += [] if met else [metric]
        print(
            f"{metric:10} local {r['local_ns']:8.1f} ns  shared {r['shared_ns']:8.1f} ns  "
            f"= {r['ratio']:.2f}x (target <= {target}x: {'met' if met else 'MISSED'})"
        )
    print(
        f"shared map: {result['region_bytes_per_key']} bytes per key in the region, "
        f"{result['process_bytes_per_key']:.0f} bytes per key used in each process ({n:,} keys)"
    )
    return 1 if missed and fastbreaker.COMPILED and not quick else 0


# -- pytest-benchmark ----------------------------------------------------------------------------
needs_posix = pytest.mark.skipif(sys.platform == "win32", reason="SharedRegion is POSIX only")


@pytest.fixture(scope="module", params=["local", "shared"])
def made(request: pytest.FixtureRequest) -> Any:
    core = fastbreaker.testing.implementations()["c" if fastbreaker.COMPILED else "python"]
    return systems(core, [f"host-{i}" for i in range(1000)])[request.param]


@needs_posix
@pytest.mark.benchmark(group="region allow()")
def test_allow(benchmark: Any, made: dict[str, Any]) -> None:
    b = made["b"]
    assert benchmark(b.allow) is True


@needs_posix
@pytest.mark.benchmark(group="region map.allow(key), 1,000 keys")
def test_map_allow(benchmark: Any, made: dict[str, Any]) -> None:
    m, keys = made["m"], made["keys"]

    def loop() -> None:
        for k in keys:
            m.allow(k)

    benchmark(loop)
    assert m[keys[0]].state == fastbreaker.State.CLOSED


@needs_posix
def test_region_bytes_per_key_is_reported(fb: types.SimpleNamespace) -> None:
    out = measure(fb, 200, 1)
    assert out["region_bytes_per_key"] >= 256 and out["process_bytes_per_key"] > 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    sys.exit(report(parser.parse_args().quick))
