"""The timing engine: timed loops generated like ``timeit``'s, calibrated, run in interleaved rounds.

Nothing here knows what is measured: a statement, the names it uses, and the baseline statement
whose loop is subtracted. The report's docstring (``fastbreaker.bench``) says how it measures.
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import threading
import time
import tracemalloc
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, Callable, Protocol

UNROLL = 10


def f() -> None:
    """The guarded function: does nothing, so that only the breaker is measured."""
    return None


async def af() -> None:
    """The guarded coroutine function: returns without suspending."""
    return None


class Boom(Exception):
    """The failure used to trip breakers that have no ``open()``/``trip()``."""


def boom() -> None:
    raise Boom


# Loops are generated like timeit does: names become default arguments, hence fast locals.

_SYNC = """
def run(_n, {params}):
    _t0 = _timer()
    for _ in _repeat(None, _n):
{body}
    return _timer() - _t0
"""

_HOSTS = """
def run(_n, {params}):
    _t0 = _timer()
    for _ in _repeat(None, _n):
        for h in _hosts:
{body}
    return _timer() - _t0
"""

_ASYNC = """
async def _body(_n, {params}):
    for _ in _repeat(None, _n):
{body}

def run(_n, _loop=_loop):
    _coro = _body(_n)
    _t0 = _timer()
    _loop.run_until_complete(_coro)
    return _timer() - _t0
"""


def make_loop(mode: str, stmt: str, ns: dict[str, Any]) -> Callable[[int], int]:
    """A function ``run(n) -> elapsed ns`` timing ``n`` iterations of ``stmt``.

    ``mode`` is ``sync``, ``async`` (inside ``ns["_loop"]``) or ``hosts`` (once per name in
    ``ns["_hosts"]``, bound to ``h``); ``sync`` and ``async`` bodies are unrolled ``UNROLL`` times.
    """
    template, indent, copies = {
        "sync": (_SYNC, 8, UNROLL),
        "hosts": (_HOSTS, 12, 1),
        "async": (_ASYNC, 8, UNROLL),
    }[mode]
    if stmt == "pass":
        copies = 1  # an empty body: unrolled, each `pass` would stay as a NOP costing ~1 ns
    lines = [" " * indent + line for line in stmt.splitlines()] * copies
    names = sorted(k for k in ns if k != "_loop")
    params = ", ".join(f"{k}={k}" for k in names)
    env: dict[str, Any] = {"_timer": time.perf_counter_ns, "_repeat": repeat, **ns}
    exec(template.format(params=params, body="\n".join(lines)), env)
    return env["run"]  # type: ignore[no-any-return]


def timed(run: Callable[[int], int], n: int) -> int:
    """One batch with the garbage collector disabled (restored afterwards)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return run(n)
    finally:
        if enabled:
            gc.enable()


def calibrate(run: Callable[[int], int], target_ns: float) -> int:
    """The ``n`` whose batch takes about ``target_ns`` (also warms the cell up)."""
    n = 1
    while True:
        t = max(timed(run, n), 1)
        if t >= target_ns / 8 or n >= 1 << 30:
            return max(1, round(n * target_ns / t))
        n *= 4


@dataclass
class Cell:
    """One statement of one system, with its baseline; ``diffs`` holds ns per op, a round each."""

    owner: Any
    metric: str
    run: Callable[[int], int]
    base: Callable[[int], int]
    ops_per_n: int
    n: int = 1
    diffs: list[float] = field(default_factory=list)


class Reporter(Protocol):
    def __call__(self, msg: str, *, transient: bool = False, step: bool = False) -> None: ...


def time_rounds(cells: list[Cell], rounds: int, progress: Reporter) -> None:
    """Time every cell once per round, baseline right before it, the order rotated each round."""
    started = time.perf_counter()
    for r in range(rounds):
        shift = r % len(cells)
        for cell in cells[shift:] + cells[:shift]:
            t_base = timed(cell.base, cell.n)
            t_run = timed(cell.run, cell.n)
            cell.diffs.append((t_run - t_base) / (cell.n * cell.ops_per_n))
        gc.collect()
        eta = (time.perf_counter() - started) / (r + 1) * (rounds - r - 1)
        progress(f"round {r + 1}/{rounds} done, about {eta:.0f}s to go", step=r + 1 < rounds)


def measure_setup(build: Callable[[list[str]], dict[str, Any]], hosts: list[str]) -> dict[str, Any]:
    """Run ``build(hosts)`` under tracemalloc; return its namespace and what it cost per host."""
    threads = threading.active_count()
    gc.collect()
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    ns = build(hosts)
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    if not was_tracing:
        tracemalloc.stop()
    return {
        "ns": ns,
        "bytes_per_host": (after - before) / len(hosts),
        "threads_created": threading.active_count() - threads,
    }


def baselines(loop: asyncio.AbstractEventLoop, target_ns: float) -> dict[str, float]:
    """What the subtracted statements and one bare loop iteration cost (median of 5)."""
    out = {}
    ns = {"f": f, "af": af, "_loop": loop}
    empty = make_loop("sync", "pass", ns)
    n = calibrate(empty, target_ns / 4)
    out["loop iteration"] = statistics.median(timed(empty, n) / n for _ in range(5))
    for label, mode, stmt in [("f()", "sync", "f()"), ("await af()", "async", "await af()")]:
        run = make_loop(mode, stmt, ns)
        empty = make_loop(mode, "pass", ns)
        n = calibrate(run, target_ns / 4)
        per_op = [(timed(run, n) - timed(empty, n)) / (n * UNROLL) for _ in range(5)]
        out[label] = statistics.median(per_op)
    return out
