"""Scaling without the GIL: throughput with 1 thread and with 2 threads, in one run.

Measured only on a free-threaded build with the GIL off (elsewhere the GIL runs one thread at a
time, and the section says so). One op is ``allow()`` + ``record_success()``:

* **per-host**: one compiled ``BreakerMap``; each thread calls its own 1,000 keys
  (``m.allow(k); m.record_success(k)``);
* **one shared breaker**: every thread calls the same compiled ``CircuitBreaker``;
* **floor**: each thread calls its own ``Floor()`` (two empty Cython methods): how far the
  interpreter itself scales on this machine, with nothing shared.

Each thread binds the two methods once (``allow = cb.allow``), as a hot loop does: a call through
the attribute (``cb.allow()``) takes a reference to ``cb`` and to the method on every call, and
on a free-threaded build a shared object's reference count is a word that every thread writes.
Each thread runs for ``seconds`` by its own clock, checked every 1,000 ops; the case's throughput
is the ops of all its threads over the longest thread's time, the best of ``repeats`` runs, the
1- and 2-thread runs interleaved. The threads are the benchmark's own and are joined before the
report goes on.

After each run the breaker's and the map's ``metrics()`` must count exactly the ops the threads
made (``permitted`` and ``successes``): the striped counters of a free-threaded build
(``_fb_stripe.h``) are summed there, and at quiescence the sum is exact.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import threading
import time
from typing import Any, Callable, Mapping, Optional

# (key, label, target: the least 2-thread / 1-thread ratio, or None)
CASES = [
    ("per_host", "per-host: one BreakerMap, each thread its own 1,000 keys", 1.8),
    ("shared", "one shared CircuitBreaker, every thread", 1.5),
    ("floor", "floor: each thread its own Floor()", None),
]
KEYS = 1000
BATCH = 1000  # ops between two looks at the clock


def unavailable() -> Optional[str]:
    """Why the scaling rows cannot be measured here, or None."""
    if not sysconfig.get_config_var("Py_GIL_DISABLED"):
        return "not a free-threaded build (the GIL runs one thread at a time)"
    is_gil_enabled = getattr(sys, "_is_gil_enabled", None)
    if is_gil_enabled is not None and is_gil_enabled():
        return "a free-threaded build with the GIL on (PYTHON_GIL=1 or a module that needs it)"
    if (os.cpu_count() or 1) < 2:
        return "fewer than 2 CPUs"
    from .. import COMPILED

    if not COMPILED:
        return "the pure-Python core is selected"
    return None


Work = Callable[[], None]


def _make(case: str) -> tuple[Callable[[int], Work], Callable[[], tuple[int, int]]]:
    """``(make_work, counted)``: ``make_work(i)`` is thread i's batch of BATCH ops (built in
    that thread); ``counted()`` is (permitted, successes) of what the case calls."""
    from .. import _breaker_c, _map_c
    from ._floor_c import Floor

    if case == "per_host":
        m = _map_c.BreakerMap(reset_timeout=3600)

        def make_map_work(i: int) -> Work:
            keys = [f"t{i}-host-{j}" for j in range(KEYS)]
            allow, record = m.allow, m.record_success

            def work() -> None:
                for k in keys:
                    allow(k)
                    record(k)

            return work

        def map_counted() -> tuple[int, int]:
            mm = m.metrics()
            return mm.permitted, mm.successes

        return make_map_work, map_counted
    if case == "shared":
        cb = _breaker_c.CircuitBreaker(reset_timeout=3600)

        def shared_counted() -> tuple[int, int]:
            mm = cb.metrics()
            return mm.permitted, mm.successes

        return lambda i: _pairs(cb), shared_counted
    return lambda i: _pairs(Floor()), lambda: (-1, -1)


def _pairs(obj: Any) -> Work:
    """A batch of BATCH ``obj.allow(); obj.record_success()``, the methods bound once."""
    allow, record = obj.allow, obj.record_success
    ops = [None] * BATCH

    def work() -> None:
        for _ in ops:
            allow()
            record()

    return work


def _run(case: str, threads: int, seconds: float) -> tuple[float, bool]:
    """One run: (ops per second, whether the metrics counted every op exactly)."""
    make_work, counted = _make(case)
    start = threading.Barrier(threads)
    done = [0] * threads
    took = [0.0] * threads

    def worker(i: int) -> None:
        work = make_work(i)
        work()  # the first batch creates a map's breakers: not timed
        start.wait()
        t0 = time.perf_counter()
        end = t0 + seconds
        n = 0
        while True:
            work()
            n += 1
            now = time.perf_counter()
            if now >= end:
                break
        done[i], took[i] = n, now - t0

    pool = [
        threading.Thread(target=worker, args=(i,), name=f"fb-scaling-{i}") for i in range(threads)
    ]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    ops = sum(done) * BATCH
    exact = True
    if case != "floor":
        exact = counted() == (ops + threads * BATCH,) * 2
    return ops / max(took), exact


def measure(seconds: float = 1.0, repeats: int = 3) -> dict[str, Any]:
    """Every case with 1 and with 2 threads (best of ``repeats``, interleaved)."""
    best: dict[tuple[str, int], float] = {}
    exact: dict[str, bool] = {}
    for _ in range(repeats):
        for case, _label, _target in CASES:
            for threads in (1, 2):
                rate, ok = _run(case, threads, seconds)
                best[(case, threads)] = max(best.get((case, threads), 0.0), rate)
                exact[case] = exact.get(case, True) and ok
    rows = []
    for case, label, target in CASES:
        one, two = best[(case, 1)], best[(case, 2)]
        x = two / one if one else None
        rows.append(
            {
                "key": case,
                "label": label,
                "ops_per_s": {"1": one, "2": two},
                "x": x,
                "target": target,
                "met": None if target is None or x is None else x >= target,
                "exact": exact[case] if case != "floor" else None,
            }
        )
    return {"rows": rows, "seconds": seconds, "repeats": repeats}


def section(quick: bool, tiny: bool) -> dict[str, Any]:
    """The report's ``scaling`` part: measured, or the reason it is not."""
    reason = unavailable()
    if reason is not None:
        return {"skipped": reason}
    if tiny:
        return measure(seconds=0.01, repeats=1)
    return measure(seconds=0.3 if quick else 1.0, repeats=3)


def lines(result: Mapping[str, Any]) -> list[str]:
    """The scaling block under the tables (the targets' verdicts with ``--check-targets``)."""
    part = result.get("scaling")
    if not part:
        return []
    if "skipped" in part:
        return [f"scaling with 2 threads: not measured: {part['skipped']}."]
    out = [
        f"scaling without the GIL: allow() + record_success() per op, 1 and 2 threads, "
        f"{part['seconds']:g} s per run, best of {part['repeats']}; each thread binds the "
        f"methods once (see fastbreaker/bench/_scaling.py):"
    ]
    for row in part["rows"]:
        rate = row["ops_per_s"]
        text = (
            f"  {row['label']}: {rate['1'] / 1e6:.2f}M ops/s with 1 thread, "
            f"{rate['2'] / 1e6:.2f}M with 2 = {row['x']:.2f}x"
        )
        if row["target"] is not None and result.get("check_targets"):
            text += f" (target >= {row['target']:g}x: {'met' if row['met'] else 'MISSED'})"
        if row["exact"] is not None:
            text += "; metrics() exact" if row["exact"] else "; metrics() NOT EXACT"
        out.append(text)
    return out


def missed(result: Mapping[str, Any]) -> list[str]:
    """The scaling targets missed, and any case whose metrics lost an op."""
    part = result.get("scaling") or {}
    out = []
    for row in part.get("rows", []):
        if row["met"] is False:
            out.append(f"scaling {row['key']} {row['x']:.2f}x < {row['target']:g}x")
        if row["exact"] is False:
            out.append(f"scaling {row['key']}: metrics() not exact")
    return out
