"""The bulkhead section: fastbreaker's Bulkhead (compiled and pure twin), the floor and the peers.

The peers are the standard library's ``threading.BoundedSemaphore`` and ``asyncio.Semaphore``,
``anyio.CapacityLimiter`` (in ``fastbreaker[bench]``) and pyresilience's bulkhead (when it is
installed), each driven through its documented API; a cell a system has no API for is ``-``.
Every bulkhead has room to spare (``SLOTS`` slots, one taken at a time), so nothing ever waits:
what is measured is the admission and the release. What each column means is in ``notes``.
"""

from __future__ import annotations

import asyncio
import platform
import threading
from typing import Any, Mapping, Optional, Sequence

from ._format import ratio
from ._section import Section, System, peer, summary_lines, version
from ._timing import af, f

SLOTS = 10  # every bulkhead's capacity: never full while measured

# (key, table header, unit) in table order; ``x_*`` are ratios (see ``_ratios``).
COLUMNS = [
    ("try_release_ns", "try_acquire()+release()", "ns"),
    ("with_ns", "with bh: f()", "ns"),
    ("call_ns", "call(f)-f()", "ns"),
    ("async_ns", "async with", "ns"),
    ("x_floor", "x Floor() pair", "x"),
    ("x_with", "with: x fastbreaker", "x"),
    ("x_call", "call(f): x fastbreaker", "x"),
    ("x_async", "async with: x fastbreaker", "x"),
]
# The text and Markdown output: two tables, so that lines stay within ``_format.WIDTH`` columns.
# ``x_call`` and ``x_async`` are in the JSON and in the summary, not in a table.
TABLES = [
    (
        "bulkheads: ns per operation, median of {rounds} rounds (lower is faster)",
        ["try_release_ns", "with_ns", "call_ns", "async_ns"],
    ),
    (
        "bulkheads: try_acquire()+release() as a ratio to the floor's, with bh: f() to "
        "fastbreaker's",
        ["x_floor", "x_with"],
    ),
]
# What fastbreaker's time is compared with, per peer, in the summary.
PEER_RATIOS = [
    ("try_release_ns", "try+release"),
    ("with_ns", "with"),
    ("call_ns", "call"),
    ("async_ns", "async with"),
]
BASELINE = {
    "try_release_ns": ("sync", "pass"),
    "with_ns": ("sync", "f()"),
    "call_ns": ("sync", "f()"),
    "async_ns": ("async", "await af()"),
}
WITH = "with bh:\n    f()"
ASYNC_WITH = "async with bh:\n    await af()"


def _fastbreaker_system(key: str, label: str, bulkhead_mod: Any) -> System:
    from .. import __version__

    bh = bulkhead_mod.Bulkhead(SLOTS, name="fastbreaker-bench")
    return System(
        key=key,
        label=label,
        version=__version__,
        ns={"bh": bh},
        stmts={
            "try_release_ns": "bh.try_acquire(); bh.release()",
            "with_ns": WITH,
            "call_ns": "bh.call(f)",
            "async_ns": ASYNC_WITH,
        },
        api={
            "try_release_ns": "bh.try_acquire(); bh.release()",
            "with_ns": "with bh: f()",
            "call_ns": "bh.call(f)",
            "async_ns": "async with bh: await af()",
        },
    )


def _compiled(loop: asyncio.AbstractEventLoop) -> tuple[Optional[System], str]:
    from .. import COMPILED

    if not COMPILED:
        return None, "the pure-Python core is selected (FASTBREAKER_NO_EXTENSIONS or not CPython)"
    try:
        from .. import _bulkhead_c
    except ImportError as exc:
        return None, f"the compiled core is not built ({exc})"
    return _fastbreaker_system("fastbreaker", "fastbreaker Bulkhead (compiled)", _bulkhead_c), ""


def _twin(loop: asyncio.AbstractEventLoop) -> tuple[Optional[System], str]:
    from .. import _bulkhead_py

    return _fastbreaker_system(
        "fastbreaker_py", "fastbreaker Bulkhead (pure twin)", _bulkhead_py
    ), ""


def _bounded_semaphore(loop: asyncio.AbstractEventLoop) -> tuple[Optional[System], str]:
    sem = threading.BoundedSemaphore(SLOTS)
    return System(
        key="stdlib_bounded_semaphore",
        label="threading.BoundedSemaphore",
        version=platform.python_version(),
        ns={"sem": sem},
        stmts={
            "try_release_ns": "sem.acquire(False); sem.release()",
            "with_ns": "with sem:\n    f()",
        },
        api={
            "try_release_ns": "sem.acquire(blocking=False); sem.release()",
            "with_ns": "with sem: f()",
            "call_ns": "n/a: no call(); `with sem: f()` is the with column",
            "async_ns": "n/a: blocks the thread, not awaitable",
        },
    ), ""


def _asyncio_semaphore(loop: asyncio.AbstractEventLoop) -> tuple[Optional[System], str]:
    sem = asyncio.Semaphore(SLOTS)
    return System(
        key="stdlib_asyncio_semaphore",
        label="asyncio.Semaphore",
        version=platform.python_version(),
        ns={"sem": sem},
        stmts={"async_ns": "async with sem:\n    await af()"},
        api={"async_ns": "async with sem: await af()  (its only API: acquire() is a coroutine)"},
    ), ""


def _anyio(loop: asyncio.AbstractEventLoop) -> tuple[Optional[System], str]:
    anyio = peer("anyio")
    if anyio is None:
        return None, "not installed"

    async def make() -> Any:
        return anyio.CapacityLimiter(SLOTS)  # inside the loop: anyio needs a running backend

    limiter = loop.run_until_complete(make())
    return System(
        key="anyio",
        label="anyio.CapacityLimiter",
        version=version("anyio"),
        ns={"lim": limiter},
        stmts={"async_ns": "async with lim:\n    await af()"},
        api={
            "async_ns": "async with lim: await af()  (on asyncio)",
            "try_release_ns": "n/a: acquire_nowait() needs a running task (a sync loop has none)",
        },
    ), ""


def _pyresilience(loop: asyncio.AbstractEventLoop) -> tuple[Optional[System], str]:
    pyresilience = peer("pyresilience")
    if pyresilience is None:
        return None, "not installed (pip install pyresilience)"
    # pyresilience's bulkhead is configured through its one decorator, @resilient(...).
    config = pyresilience.BulkheadConfig(max_concurrent=SLOTS)
    guarded = pyresilience.resilient(bulkhead=config)(f)
    aguarded = pyresilience.resilient(bulkhead=config)(af)
    guarded()
    loop.run_until_complete(aguarded())
    return System(
        key="pyresilience",
        label="pyresilience",
        version=version("pyresilience"),
        ns={"g": guarded, "ag": aguarded},
        stmts={"call_ns": "g()", "async_ns": "await ag()"},
        api={
            "call_ns": "g() where g = resilient(bulkhead=BulkheadConfig(max_concurrent=10))(f)",
            "async_ns": "await ag() where ag = the same decorator around af",
        },
    ), ""


def _floor(loop: asyncio.AbstractEventLoop) -> tuple[Optional[System], str]:
    try:
        from ._floor_c import Floor
    except ImportError as exc:
        return None, f"the floor helper is not built ({exc})"
    from .. import __version__

    return System(
        key="floor",
        label="floor (empty Cython methods)",
        version=__version__,
        ns={"fl": Floor()},
        stmts={"try_release_ns": "fl.allow(); fl.record_success()", "call_ns": "fl.call(f)"},
        api={
            "try_release_ns": "Floor().allow(); Floor().record_success(): two empty methods",
            "call_ns": "Floor().call(f): return f()",
        },
    ), ""


def _ratios(systems: Sequence[System]) -> None:
    """``x_floor``: try+release over the floor row's pair; ``x_*``: a cell over fastbreaker's."""
    rows = {s.key: s.results for s in systems}
    floor, fb = rows.get("floor", {}), rows.get("fastbreaker", {})
    for s in systems:
        r = s.results
        r["x_floor"] = ratio(r.get("try_release_ns"), floor.get("try_release_ns"))
        for key, metric in (("x_with", "with_ns"), ("x_call", "call_ns"), ("x_async", "async_ns")):
            r[key] = ratio(r.get(metric), fb.get(metric))


def _summary(result: Mapping[str, Any]) -> list[str]:
    """The compiled Bulkhead against the floor and against each peer."""
    return [""] + summary_lines(
        result,
        title="fastbreaker Bulkhead (compiled), from the bulkhead tables:",
        missing="The compiled Bulkhead is not in this run, so there is nothing to compare.",
        floors=[
            (
                "try_release_ns",
                "try_acquire()+release()",
                "Floor().allow(); Floor().record_success()",
            ),
            ("call_ns", "call(f)-f()", "Floor().call(f)-f()"),
        ],
        others_header="  the others' cost as a multiple of fastbreaker Bulkhead (compiled)'s:",
        peer_ratios=PEER_RATIOS,
    )


def _notes(result: Mapping[str, Any]) -> list[str]:
    return [
        f"bulkheads: each has {SLOTS} slots and is never full, so nobody waits: the cells are "
        "the admission plus the release. try_acquire()+release() is timed against `pass`; its "
        "floor is two empty Cython methods, Floor().allow(); Floor().record_success() (x Floor() "
        "pair). `with bh: f()` and call(f) subtract f(), `async with` subtracts await af(). "
        "with: x fastbreaker, and the summary's ratios: a cell over fastbreaker Bulkhead "
        "(compiled)'s.",
    ]


SECTION = Section(
    key="bulkheads",
    systems=[
        ("fastbreaker Bulkhead (compiled)", _compiled),
        ("fastbreaker Bulkhead (pure twin)", _twin),
        ("threading.BoundedSemaphore", _bounded_semaphore),
        ("asyncio.Semaphore", _asyncio_semaphore),
        ("anyio.CapacityLimiter", _anyio),
        ("pyresilience", _pyresilience),
        ("floor", _floor),
    ],
    columns=COLUMNS,
    tables=TABLES,
    baselines=BASELINE,
    derive=_ratios,
    summary=_summary,
    notes=_notes,
    # no panels: ``_render.figure`` draws the first section only
)
