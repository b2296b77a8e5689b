"""Scaling without the GIL: 1 thread and 2 threads on one run, the rows of ``python -m fastbreaker``.

    python benchmarks/bench_scaling.py [SECONDS]       # on a free-threaded build, GIL off
    python -m pytest benchmarks/bench_scaling.py        # the same, once, as a test

The cases (``fastbreaker.bench._scaling``): a per-host ``BreakerMap`` where each thread calls its
own 1,000 keys, one ``CircuitBreaker`` that both threads call, and the floor (each thread its own
``Floor()``). One op is ``allow()`` + ``record_success()``; the targets are 2-thread throughput
at least 1.8x (per-host) and 1.5x (shared) the 1-thread throughput. After every run the
breakers' ``metrics()`` must count every op exactly. On a GIL build the threads take turns, so
the ratios mean nothing there; the exactness still holds and is checked.
"""

from __future__ import annotations

import sys

import pytest

import fastbreaker
from fastbreaker.bench import _scaling


@pytest.mark.skipif(not fastbreaker.COMPILED, reason="the scaling rows drive the compiled core")
def test_scaling_rows(request: pytest.FixtureRequest) -> None:
    timed = not request.config.getoption("benchmark_disable", default=False)
    free = _scaling.unavailable() is None
    result = _scaling.measure(seconds=1.0 if timed and free else 0.01, repeats=3 if timed else 1)
    for line in _scaling.lines({"scaling": result, "check_targets": free}):
        print(line)
    rows = {row["key"]: row for row in result["rows"]}
    assert rows["per_host"]["exact"] and rows["shared"]["exact"]


if __name__ == "__main__":
    reason = _scaling.unavailable()
    if reason is not None:
        print(f"not measured: {reason}")
        sys.exit(0)
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
    result = _scaling.measure(seconds=seconds, repeats=3)
    print("\n".join(_scaling.lines({"scaling": result, "check_targets": True})))
    sys.exit(1 if _scaling.missed({"scaling": result}) else 0)
