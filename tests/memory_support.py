"""Measuring memory growth with tracemalloc, for the tests of long-running paths.

``assert_flat(step)`` runs ``step`` many times after a warm-up and fails on growth proportional to
the work done: it measures the traced memory left after ``small`` and after ``large`` steps
(garbage collected) and bounds the extra bytes per extra step. A leak of one small object per
step (a tuple, a list entry, a dict slot) is tens of bytes per step; the bound is a few bytes.
``tests/test_memory_growth.py::test_the_measure_sees_a_leak`` shows that it can fail.
"""

from __future__ import annotations

import gc
import sysconfig
import tracemalloc
from typing import Any, Awaitable, Callable

import pytest

# Free-threaded CPython frees many objects only once every thread has passed a quiescent state
# (QSBR), so memory freed during a measurement can still be traced at its end when threads left
# by earlier tests are alive: the growth these tests measure is then the interpreter's, not ours
# (the twin shows the same figures). They run in the GIL legs: the main suite, the pure-Python
# leg and the debug build.
not_on_free_threading = pytest.mark.skipif(
    bool(sysconfig.get_config_var("Py_GIL_DISABLED")),
    reason="free-threaded CPython defers frees (QSBR): tracemalloc growth is not ours there",
)


def measure_growth(step: Callable[[], Any], n: int, *, warmup: int = 200) -> int:
    """Traced bytes still allocated after ``n`` calls of ``step()`` (after ``warmup`` calls)."""
    for _ in range(warmup):
        step()
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for _ in range(n):
            step()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()


async def ameasure_growth(step: Callable[[], Awaitable[Any]], n: int, *, warmup: int = 200) -> int:
    """``measure_growth`` for an async step, awaited in the running loop."""
    for _ in range(warmup):
        await step()
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for _ in range(n):
            await step()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()


def check_flat(
    small_growth: int, large_growth: int, small: int, large: int, per_step: float = 2.0
) -> None:
    per = (large_growth - small_growth) / (large - small)
    assert per < per_step, (
        f"memory grows with the work: {small_growth} B after {small} steps, "
        f"{large_growth} B after {large} ({per:.1f} B/step)"
    )


# 7,000 extra steps at 2 B per step: a 14 KB allowance, where a leak of one small object per
# step (>= 32 B) shows as >= 224 KB; larger counts only cost time.
def assert_flat(step: Callable[[], Any], small: int = 1_000, large: int = 8_000) -> None:
    check_flat(measure_growth(step, small), measure_growth(step, large), small, large)


async def aassert_flat(
    step: Callable[[], Awaitable[Any]], small: int = 1_000, large: int = 6_000
) -> None:
    check_flat(await ameasure_growth(step, small), await ameasure_growth(step, large), small, large)
