"""The headline benchmark behind ``python -m fastbreaker``: fastbreaker against every peer.

One run measures, on this machine and in this process, what a guarded call costs with the
compiled core, its pure-Python twin, each installed peer (pybreaker, circuitbreaker, aiobreaker,
purgatory: ``pip install 'fastbreaker[bench]'``) and the floor (an empty method call on a Cython
class), and prints one table.

How it measures (also printed under the table and stored in ``--json``):

* Each cell is a loop of ``n`` x 10 unrolled statements timed with ``time.perf_counter_ns``,
  minus the same loop around the baseline statement (``pass``, ``f()`` or ``await af()``) with
  the same ``n``, divided by the number of statements. ``n`` is calibrated once per cell so that
  a batch takes about ``--batch-ms``.
* Rounds are interleaved: every round times every cell once (baseline right before the cell, the
  order rotated each round), so a noisy moment hits every row alike. The table shows the median
  over rounds; the JSON also has the minimum and every round.
* The garbage collector is disabled inside each timed batch (as ``timeit`` does, which if
  anything flatters the allocating peers) and a collection runs between rounds.
* asyncio peers are driven through their async API inside one event loop created by the report:
  ``loop.run_until_complete()`` runs once per batch, and the same batch around ``await af()`` is
  subtracted, so the loop's cost is not charged to anyone.
* 10,000 hosts: one structure per system holding a breaker per host, keys created beforehand,
  one guarded call per host round-robin; bytes per host are what ``tracemalloc`` sees allocated
  while the structure is built (and one call made per host), divided by the number of hosts.
* Nothing here starts a thread: ``threading.active_count()`` is shown before and after.

Only the standard library is imported at module level; peers and matplotlib are imported when
the report runs, and each is optional.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import gc
import importlib
import json
import os
import platform
import statistics
import sys
import textwrap
import threading
import time
import tracemalloc
from dataclasses import dataclass, field
from importlib import metadata
from itertools import repeat
from typing import Any, Callable, Optional, Sequence

__all__ = ["main", "run_report"]

UNROLL = 10
OPEN_SECONDS = 3600  # the open period of every tripped breaker: it stays open while measured

# (key, table header, unit) in table order; ``x_*`` ratios are of the guarded call overhead,
# call(f)-f(), to the same cell of the floor row (``Floor().call(f)``) and of fastbreaker's.
COLUMNS = [
    ("call_ns", "call(f)-f()", "ns"),
    ("allow_ns", "allow()", "ns"),
    ("open_allow_ns", "open: allow()", "ns"),
    ("open_call_ns", "open: call", "ns"),
    ("async_ns", "async call", "ns"),
    ("x_floor", "x Floor().call(f)", "x"),
    ("x_fastbreaker", "x fastbreaker", "x"),
    ("hosts_call_ns", "hosts: ns/call", "ns"),
    ("bytes_per_host", "bytes/host", "B"),
    ("threads_created", "threads", ""),
]
# The text and Markdown output: two tables of at most 6 columns, so that lines stay within
# WIDTH columns. Each title is formatted with the run's ``rounds`` and ``hosts``.
TABLES = [
    (
        "ns per operation, median of {rounds} rounds (lower is faster)",
        ["call_ns", "allow_ns", "open_allow_ns", "open_call_ns", "async_ns"],
    ),
    (
        "call(f)-f() as a ratio to the floor's and to fastbreaker's; {hosts:,} hosts, one breaker "
        "each",
        ["x_floor", "x_fastbreaker", "hosts_call_ns", "bytes_per_host", "threads_created"],
    ),
]
WIDTH = 100
# What fastbreaker's time is compared with, per peer, in the summary.
PEER_RATIOS = [
    ("call_ns", "call"),
    ("open_call_ns", "open: call"),
    ("async_ns", "async"),
    ("hosts_call_ns", "hosts"),
    ("bytes_per_host", "bytes/host"),
]

# Which baseline each kind of cell subtracts.
BASELINE = {
    "call_ns": ("sync", "f()"),
    "allow_ns": ("sync", "pass"),
    "allow_record_ns": ("sync", "pass"),  # not a column: checked against its target only
    "open_allow_ns": ("sync", "pass"),
    "open_call_ns": ("sync", "pass"),
    "async_ns": ("async", "await af()"),
    "hosts_call_ns": ("hosts", "f()"),
}


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


# -- timed loops -------------------------------------------------------------------------------
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
    """A function ``run(n) -> elapsed ns`` timing ``n`` iterations of ``stmt`` (see module doc)."""
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


# -- the systems -------------------------------------------------------------------------------


@dataclass
class System:
    """One row: how to drive a breaker library through its documented API."""

    key: str
    label: str
    version: str
    ns: dict[str, Any]
    stmts: dict[str, str]  # metric -> statement; missing metrics are not applicable
    api: dict[str, str]  # metric -> what the statement does, for the reader
    build_hosts: Optional[Callable[[list[str]], dict[str, Any]]] = None
    hosts_stmt: str = ""
    results: dict[str, Any] = field(default_factory=dict)


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "?"


def _peer(name: str) -> Any:
    """The peer's module, or None when it is not installed (peers are optional)."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _expect_raises(fn: Callable[[], Any], exc: type[BaseException], what: str) -> None:
    try:
        fn()
    except exc:
        return
    raise RuntimeError(f"benchmark setup: {what} did not raise {exc.__name__}")


def _fastbreaker_system(key: str, label: str, breaker_mod: Any, map_cls: Any) -> System:
    from ._errors import CircuitOpenError

    cb = breaker_mod.CircuitBreaker(reset_timeout=OPEN_SECONDS)
    open_cb = breaker_mod.CircuitBreaker(reset_timeout=OPEN_SECONDS)
    open_cb.trip()
    _expect_raises(lambda: open_cb.call(f), CircuitOpenError, f"{label} call() while OPEN")

    def build_hosts(hosts: list[str]) -> dict[str, Any]:
        if map_cls is None:
            m: Any = {h: breaker_mod.CircuitBreaker(reset_timeout=OPEN_SECONDS) for h in hosts}
            for h in hosts:
                m[h].call(f)
            return {"m": m}
        m = map_cls(reset_timeout=OPEN_SECONDS)
        for h in hosts:
            m.call(h, f)
        return {"m": m}

    from . import __version__

    return System(
        key=key,
        label=label,
        version=__version__,
        ns={"cb": cb, "open_cb": open_cb, "f": f, "af": af, "_E": CircuitOpenError},
        stmts={
            "call_ns": "cb.call(f)",
            "allow_ns": "cb.allow()",
            "allow_record_ns": "cb.allow(); cb.record_success()",
            "open_allow_ns": "open_cb.allow()",
            "open_call_ns": "try: open_cb.call(f)\nexcept _E: pass",
            "async_ns": "await cb.call_async(af)",
        },
        api={
            "call_ns": "cb.call(f)",
            "allow_ns": "cb.allow() in CLOSED",
            "open_allow_ns": "cb.allow() -> False after cb.trip()",
            "open_call_ns": "cb.call(f) raising CircuitOpenError after cb.trip()",
            "async_ns": "await cb.call_async(af)",
            "hosts_call_ns": "m.call(host, f) on a BreakerMap"
            if map_cls is not None
            else "d[host].call(f) on a dict of CircuitBreaker (BreakerMap unavailable)",
        },
        build_hosts=build_hosts,
        hosts_stmt="m.call(h, f)" if map_cls is not None else "m[h].call(f)",
    )


def _compiled() -> tuple[Optional[System], str]:
    if os.environ.get("FASTBREAKER_NO_EXTENSIONS"):
        return None, "FASTBREAKER_NO_EXTENSIONS is set"
    try:
        from . import _breaker_c
    except ImportError as exc:
        return None, f"the compiled core is not built ({exc})"
    label = "fastbreaker (compiled)"
    return _fastbreaker_system("fastbreaker", label, _breaker_c, _map_for(_breaker_c)), ""


def _twin() -> tuple[Optional[System], str]:
    from . import _breaker_py

    label = "fastbreaker (pure twin)"
    return _fastbreaker_system("fastbreaker_py", label, _breaker_py, _map_for(_breaker_py)), ""


def _map_for(breaker_mod: Any) -> Any:
    """The BreakerMap class bound to ``breaker_mod`` (None when the map is unavailable)."""
    try:
        from . import _map
    except ImportError:
        return None
    map_class = getattr(_map, "map_class", None)
    if map_class is not None:
        return map_class(breaker_mod)
    return getattr(_map, "BreakerMap", None)


def _floor() -> tuple[Optional[System], str]:
    try:
        from ._floor_c import Floor
    except ImportError as exc:
        return None, f"the floor helper is not built ({exc})"
    from . import __version__

    return System(
        key="floor",
        label="floor (empty Cython method)",
        version=__version__,
        ns={"fl": Floor(), "f": f},
        stmts={"call_ns": "fl.call(f)", "allow_ns": "fl.allow()"},
        api={
            "call_ns": "Floor().call(f): return f()",
            "allow_ns": "Floor().allow(): return True",
            "hosts_call_ns": "d[host].call(f) on a dict of Floor objects",
        },
        build_hosts=_dict_of(Floor),
        hosts_stmt="d[h].call(f)",
    ), ""


def _dict_of(make: Callable[[], Any]) -> Callable[[list[str]], dict[str, Any]]:
    """``build_hosts`` for a peer kept as a dict of breakers, one ``make()`` per host."""

    def build_hosts(hosts: list[str]) -> dict[str, Any]:
        d = {h: make() for h in hosts}
        for h in hosts:
            d[h].call(f)
        return {"d": d}

    return build_hosts


def _pybreaker() -> tuple[Optional[System], str]:
    pybreaker = _peer("pybreaker")
    if pybreaker is None:
        return None, "not installed"

    def make() -> Any:
        return pybreaker.CircuitBreaker(fail_max=5, reset_timeout=OPEN_SECONDS)

    cb, open_cb = make(), make()
    open_cb.open()
    error = pybreaker.CircuitBreakerError
    _expect_raises(lambda: open_cb.call(f), error, "pybreaker call() while open")

    return System(
        key="pybreaker",
        label="pybreaker",
        version=_version("pybreaker"),
        ns={"cb": cb, "open_cb": open_cb, "f": f, "_E": error},
        stmts={"call_ns": "cb.call(f)", "open_call_ns": "try: open_cb.call(f)\nexcept _E: pass"},
        api={
            "call_ns": "cb.call(f)",
            "open_call_ns": "cb.call(f) raising CircuitBreakerError after cb.open()",
            "async_ns": "n/a: pybreaker's call_async needs Tornado",
            "hosts_call_ns": "d[host].call(f) on a dict of CircuitBreaker",
        },
        build_hosts=_dict_of(make),
        hosts_stmt="d[h].call(f)",
    ), ""


def _circuitbreaker() -> tuple[Optional[System], str]:
    circuitbreaker = _peer("circuitbreaker")
    if circuitbreaker is None:
        return None, "not installed"

    # circuitbreaker's documented API is the decorator; its call() does not check the state.
    def make(name: str) -> Any:
        return circuitbreaker.CircuitBreaker(
            failure_threshold=5, recovery_timeout=OPEN_SECONDS, name=name
        )

    cb = make("fastbreaker-bench")
    guarded, aguarded = cb(f), cb(af)
    open_cb = make("fastbreaker-bench-open")
    open_guarded, failing = open_cb(f), open_cb(boom)
    for _ in range(5):
        _expect_raises(failing, Boom, "circuitbreaker tripping")
    error = circuitbreaker.CircuitBreakerError
    _expect_raises(open_guarded, error, "circuitbreaker while open")

    def build_hosts(hosts: list[str]) -> dict[str, Any]:
        d = {h: make(h)(f) for h in hosts}
        for h in hosts:
            d[h]()
        return {"d": d}

    return System(
        key="circuitbreaker",
        label="circuitbreaker",
        version=_version("circuitbreaker"),
        ns={"g": guarded, "ag": aguarded, "open_g": open_guarded, "_E": error},
        stmts={
            "call_ns": "g()",
            "open_call_ns": "try: open_g()\nexcept _E: pass",
            "async_ns": "await ag()",
        },
        api={
            "call_ns": "g() where g = breaker(f)",
            "open_call_ns": "g() raising CircuitBreakerError after 5 failures",
            "async_ns": "await ag() where ag = breaker(af)",
            "hosts_call_ns": "d[host]() on a dict of functions decorated per host",
        },
        build_hosts=build_hosts,
        hosts_stmt="d[h]()",
    ), ""


def _aiobreaker() -> tuple[Optional[System], str]:
    aiobreaker = _peer("aiobreaker")
    if aiobreaker is None:
        return None, "not installed"

    def make() -> Any:
        period = datetime.timedelta(seconds=OPEN_SECONDS)
        return aiobreaker.CircuitBreaker(fail_max=5, timeout_duration=period)

    cb, open_cb = make(), make()
    open_cb.open()
    error = aiobreaker.CircuitBreakerError
    _expect_raises(lambda: open_cb.call(f), error, "aiobreaker call() while open")

    return System(
        key="aiobreaker",
        label="aiobreaker",
        version=_version("aiobreaker"),
        ns={"cb": cb, "open_cb": open_cb, "f": f, "af": af, "_E": error},
        stmts={
            "call_ns": "cb.call(f)",
            "open_call_ns": "try: open_cb.call(f)\nexcept _E: pass",
            "async_ns": "await cb.call_async(af)",
        },
        api={
            "call_ns": "cb.call(f)",
            "open_call_ns": "cb.call(f) raising CircuitBreakerError after cb.open()",
            "async_ns": "await cb.call_async(af)",
            "hosts_call_ns": "d[host].call(f) on a dict of CircuitBreaker",
        },
        build_hosts=_dict_of(make),
        hosts_stmt="d[h].call(f)",
    ), ""


def _purgatory(loop: asyncio.AbstractEventLoop) -> tuple[Optional[System], str]:
    purgatory = _peer("purgatory")
    if purgatory is None:
        return None, "not installed"
    OpenedState = importlib.import_module("purgatory.domain.model").OpenedState

    # purgatory is keyed by circuit name; its documented use fetches the breaker per call:
    # ``with factory.get_breaker(name): ...`` (the decorator does the same).
    sync = purgatory.SyncCircuitBreakerFactory(default_threshold=5, default_ttl=OPEN_SECONDS)
    asyn = purgatory.AsyncCircuitBreakerFactory(default_threshold=5, default_ttl=OPEN_SECONDS)
    sync.get_breaker("bench")
    loop.run_until_complete(asyn.get_breaker("bench"))

    def fail_once() -> None:
        with sync.get_breaker("bench-open"):
            boom()

    for _ in range(5):
        _expect_raises(fail_once, Boom, "purgatory tripping")

    def rejected() -> None:
        with sync.get_breaker("bench-open"):
            f()

    _expect_raises(rejected, OpenedState, "purgatory while open")

    def build_hosts(hosts: list[str]) -> dict[str, Any]:
        factory = purgatory.SyncCircuitBreakerFactory(default_threshold=5, default_ttl=OPEN_SECONDS)
        for h in hosts:
            with factory.get_breaker(h):
                f()
        return {"cbf": factory}

    return System(
        key="purgatory",
        label="purgatory",
        version=_version("purgatory"),
        ns={"cbf": sync, "acbf": asyn, "f": f, "af": af, "_E": OpenedState},
        stmts={
            "call_ns": "with cbf.get_breaker('bench'): f()",
            "open_call_ns": "try:\n    with cbf.get_breaker('bench-open'): f()\nexcept _E: pass",
            "async_ns": "async with await acbf.get_breaker('bench'): await af()",
        },
        api={
            "call_ns": "with factory.get_breaker(name): f()  (SyncCircuitBreakerFactory)",
            "open_call_ns": "the same, raising OpenedState after 5 failures",
            "async_ns": "async with await factory.get_breaker(name): await af()"
            "  (AsyncCircuitBreakerFactory)",
            "hosts_call_ns": "with factory.get_breaker(host): f(), one factory for all hosts",
        },
        build_hosts=build_hosts,
        hosts_stmt="with cbf.get_breaker(h): f()",
    ), ""


# -- measuring ---------------------------------------------------------------------------------


@dataclass
class Cell:
    system: System
    metric: str
    run: Callable[[int], int]
    base: Callable[[int], int]
    ops_per_n: int
    n: int = 1
    diffs: list[float] = field(default_factory=list)


def calibrate(run: Callable[[int], int], target_ns: float) -> int:
    """The ``n`` whose batch takes about ``target_ns`` (also warms the cell up)."""
    n = 1
    while True:
        t = max(timed(run, n), 1)
        if t >= target_ns / 8 or n >= 1 << 30:
            return max(1, round(n * target_ns / t))
        n *= 4


def measure_hosts(system: System, hosts: list[str]) -> dict[str, Any]:
    """Build the per-host structure under tracemalloc; return its namespace and costs."""
    assert system.build_hosts is not None
    threads = threading.active_count()
    gc.collect()
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    ns = system.build_hosts(hosts)
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    if not was_tracing:
        tracemalloc.stop()
    return {
        "ns": ns,
        "bytes_per_host": (after - before) / len(hosts),
        "threads_created": threading.active_count() - threads,
    }


class Progress:
    """Progress on stderr: a rewritten status line on a terminal, plain lines otherwise.

    ``transient`` messages (every step) show only on a terminal; ``step`` messages (every round)
    rewrite the status line on a terminal and are printed as lines elsewhere.
    """

    def __init__(self, stream: Any, quiet: bool = False) -> None:
        self.stream = stream
        self.quiet = quiet
        self.tty = hasattr(stream, "isatty") and stream.isatty()
        self.t0 = time.perf_counter()
        self._pending = False

    def __call__(self, msg: str, *, transient: bool = False, step: bool = False) -> None:
        if self.quiet or (transient and not self.tty):
            return
        text = f"[{time.perf_counter() - self.t0:5.1f}s] {msg}"
        if self.tty and (transient or step):
            self.stream.write("\r\x1b[K" + text)
            self._pending = True
        else:
            if self._pending:
                self.stream.write("\r\x1b[K")
                self._pending = False
            self.stream.write(text + "\n")
        self.stream.flush()


def run_report(
    *,
    quick: bool = False,
    rounds: Optional[int] = None,
    batch_ms: Optional[float] = None,
    hosts: int = 10_000,
    progress: Optional[Progress] = None,
) -> dict[str, Any]:
    """Run the benchmark and return the results (the structure written by ``--json``)."""
    progress = progress or Progress(sys.stderr)
    rounds = rounds or (9 if quick else 21)
    batch_ms = batch_ms or (8.0 if quick else 25.0)
    threads_before = threading.active_count()
    date = datetime.datetime.now(datetime.timezone.utc)
    loop = asyncio.new_event_loop()
    try:
        result = _run(loop, quick, rounds, batch_ms, hosts, progress)
    finally:
        loop.close()
    result["threads"] = {"before": threads_before, "after": threading.active_count()}
    result["date"] = date.isoformat(timespec="seconds")
    return result


def _run(
    loop: asyncio.AbstractEventLoop,
    quick: bool,
    rounds: int,
    batch_ms: float,
    n_hosts: int,
    progress: Progress,
) -> dict[str, Any]:
    progress("setting up: fastbreaker, the floor and the installed peers")
    factories: list[tuple[str, Callable[[], tuple[Optional[System], str]]]] = [
        ("fastbreaker (compiled)", _compiled),
        ("fastbreaker (pure twin)", _twin),
        ("pybreaker", _pybreaker),
        ("circuitbreaker", _circuitbreaker),
        ("aiobreaker", _aiobreaker),
        ("purgatory", lambda: _purgatory(loop)),
        ("floor", _floor),
    ]
    systems: list[System] = []
    skipped: list[dict[str, str]] = []
    for label, factory in factories:
        system, reason = factory()
        if system is None:
            skipped.append({"label": label, "reason": reason})
        else:
            systems.append(system)

    hosts = [f"host-{i}" for i in range(n_hosts)]  # created before any memory is measured
    progress(f"building {n_hosts:,} hosts for {len(systems)} systems (measuring memory)")
    for system in systems:
        progress(f"building {n_hosts:,} hosts: {system.label}", transient=True)
        built = measure_hosts(system, hosts)
        system.ns.update(built.pop("ns"))
        system.results.update(built)

    target_ns = batch_ms * 1e6
    progress(f"calibrating: batches of about {batch_ms:g} ms")
    cells: list[Cell] = []
    for system in systems:
        ns = dict(system.ns, f=f, af=af, _loop=loop, _hosts=hosts)
        stmts = dict(system.stmts)
        if system.hosts_stmt:
            stmts["hosts_call_ns"] = system.hosts_stmt
        for metric, stmt in stmts.items():
            mode, base_stmt = BASELINE[metric]
            progress(f"calibrating {system.label}: {metric}", transient=True)
            run = make_loop(mode, stmt, ns)
            base = make_loop(mode, base_stmt, ns)
            cell = Cell(system, metric, run, base, len(hosts) if mode == "hosts" else UNROLL)
            cell.n = calibrate(run, target_ns)
            cells.append(cell)

    progress(f"timing {len(cells)} cells, {rounds} interleaved rounds")
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

    baselines = _baselines(loop, target_ns)
    for cell in cells:
        results = cell.system.results
        results[cell.metric] = statistics.median(cell.diffs)
        results.setdefault("min", {})[cell.metric] = min(cell.diffs)
        results.setdefault("rounds", {})[cell.metric] = [round(d, 2) for d in cell.diffs]
    _ratios(systems)
    for system in systems:
        for key, _, _ in COLUMNS:
            system.results.setdefault(key, None)  # not applicable: null in JSON, "-" in the table
    return {
        "schema": 1,
        "machine": _machine(),
        "versions": _versions(systems),
        "method": {
            "statistic": "median over interleaved rounds (ns per operation, baseline subtracted)",
            "rounds": rounds,
            "batch_ms": batch_ms,
            "unroll": UNROLL,
            "hosts": n_hosts,
            "quick": quick,
            "gc": "disabled inside each timed batch (as timeit does); collected between rounds",
            "baselines_ns": baselines,
            "async": "one asyncio loop made by the report; run_until_complete once per batch "
            "of awaits; the same batch around `await af()` is subtracted",
            "memory": "tracemalloc: bytes allocated while building the per-host structure and "
            "making one guarded call per host, divided by the hosts (keys created beforehand)",
        },
        "columns": {key: {"header": header, "unit": unit} for key, header, unit in COLUMNS},
        "rows": [
            {"key": s.key, "label": s.label, "version": s.version, "api": s.api, **s.results}
            for s in systems
        ],
        "skipped": skipped,
        "targets": _targets(systems, baselines["loop iteration"]),
    }


def _baselines(loop: asyncio.AbstractEventLoop, target_ns: float) -> dict[str, float]:
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


def _ratios(systems: Sequence[System]) -> None:
    ref = {s.key: s.results.get("call_ns") for s in systems}
    for s in systems:
        call = s.results.get("call_ns")
        for key, ref_key in (("x_floor", "floor"), ("x_fastbreaker", "fastbreaker")):
            base = ref.get(ref_key)
            s.results[key] = call / base if call is not None and base and base > 0 else None


TARGETS = [
    ("allow_ns", "allow() in CLOSED", 1.15),
    ("allow_record_ns", "allow() + record_success()", 2.5),
    ("call_ns", "call(f) minus f()", 3.0),
    ("open_allow_ns", "rejection in OPEN: allow() -> False", 3.0),
    ("open_call_ns", "rejection in OPEN: call(f) raising CircuitOpenError", None),
]


def _targets(systems: Sequence[System], loop_ns: float) -> dict[str, Any]:
    """The compiled core against the ratios its developers aim for (``--check-targets``).

    These are the project's targets, not the user's: they are printed only with
    ``--check-targets`` (and always stored in ``--json``). Every ratio there is to one floor,
    ``Floor().allow()``, as ``timeit`` reports it: the call plus one loop iteration (``loop_ns``).
    ``allow()`` and the rejections are taken the same way, loop included; ``call(f)`` minus
    ``f()`` is a difference, so the loop cancels out of it.
    """
    by_key = {s.key: s.results for s in systems}
    fb, floor = by_key.get("fastbreaker"), by_key.get("floor")
    if fb is None or floor is None or floor.get("allow_ns") is None:
        return {}
    unit = floor["allow_ns"] + loop_ns
    checks = []
    for metric, what, limit in TARGETS:
        if fb.get(metric) is None:
            continue
        loop = 0.0 if metric == "call_ns" else loop_ns
        ratio = (fb[metric] + loop) / unit
        met = None if limit is None else ratio <= limit  # unrounded: what is printed may round
        checks.append({"what": what, "ns": fb[metric] + loop, "x_floor": ratio, "target": limit,
                       "met": met})
    return {"floor": "Floor().allow()", "floor_ns": unit, "loop_ns": loop_ns, "checks": checks}


def missed_targets(result: dict[str, Any]) -> list[str]:
    """The targets the compiled core missed in ``result`` (``--check-targets`` fails on them)."""
    checks = result.get("targets", {}).get("checks", [])
    return [t["what"] for t in checks if t["met"] is False]


def _ratio_vs(ratio: float, limit: float) -> str:
    """``ratio`` with enough decimals that a missed target never prints as equal to it."""
    for digits in range(2, 7):
        text = f"{ratio:.{digits}f}"
        if (ratio <= limit) == (float(text) <= limit):
            return text
    return repr(ratio)


def _versions(systems: Sequence[System]) -> dict[str, str]:
    from . import __version__

    peers = {s.key: s.version for s in systems if not s.key.startswith(("fastbreaker", "floor"))}
    return {"python": platform.python_version(), "fastbreaker": __version__, **peers}


def _machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
    }


# -- output ------------------------------------------------------------------------------------


def _fmt(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key == "threads_created":
        return str(value)
    if key.startswith("x_"):
        return f"{value:.2f}x" if value < 10 else f"{value:.0f}x"
    if key == "bytes_per_host" or value >= 100:
        return f"{value:,.0f}"
    return f"{value:.1f}"


def _header(key: str) -> str:
    return next(header for k, header, _ in COLUMNS if k == key)


def tables(result: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    """The tables as text cells: ``(title, headers, rows)`` each, in ``TABLES`` order."""
    m = result["method"]
    out = []
    for title, keys in TABLES:
        headers = ["system"] + [_header(k) for k in keys]
        rows = [[row["label"]] + [_fmt(k, row.get(k)) for k in keys] for row in result["rows"]]
        out.append((title.format(rounds=m["rounds"], hosts=m["hosts"]), headers, rows))
    return out


def format_text(result: dict[str, Any]) -> str:
    out: list[str] = []
    for title, headers, rows in tables(result):
        widths = [max(len(r[i]) for r in [headers] + rows) for i in range(len(headers))]

        def line(cells: list[str]) -> str:
            first = [cells[0].ljust(widths[0])]
            return "  ".join(first + [c.rjust(w) for c, w in zip(cells[1:], widths[1:])])

        out += [title, line(headers), "  ".join("-" * w for w in widths)]
        out += [line(r) for r in rows] + [""]
    for note in _summary(result) + [""] + _notes(result) + _target_lines(result):
        indent = " " * (len(note) - len(note.lstrip(" ")))
        out += textwrap.wrap(note, WIDTH, subsequent_indent=indent + "  ") or [""]
    return "\n".join(out)


def format_markdown(result: dict[str, Any]) -> str:
    out: list[str] = []
    for title, headers, rows in tables(result):
        out += [f"**{title}**", "", "| " + " | ".join(headers) + " |"]
        out.append("|" + "|".join([" --- "] + [" ---: "] * (len(headers) - 1)) + "|")
        out += ["| " + " | ".join(r) + " |" for r in rows] + [""]
    for note in _summary(result) + [""] + _notes(result) + _target_lines(result):
        if not note:
            out.append("")
            continue
        depth = (len(note) - len(note.lstrip(" "))) // 2  # two spaces a level, as in the text
        bullet = "  " * depth + "- " + note.strip()
        out += textwrap.wrap(bullet, WIDTH, subsequent_indent="  " * (depth + 1))
    return "\n".join(out)


def _ratio(value: Any, base: Any) -> Optional[float]:
    """``value / base``, or None when either is missing or not positive (a noisy tiny run)."""
    if value is None or base is None or value <= 0 or base <= 0:
        return None
    return float(value / base)


def _x(ratio: Optional[float]) -> str:
    return "n/a" if ratio is None else _fmt("x_", ratio)


def _summary(result: dict[str, Any]) -> list[str]:
    """What the user came for: the compiled core against the floors and against each peer."""
    rows = {row["key"]: row for row in result["rows"]}
    fb, floor = rows.get("fastbreaker"), rows.get("floor")
    if fb is None:
        return ["The compiled core is not in this run, so there is nothing to compare it with."]
    out = ["fastbreaker (compiled), from the tables above:"]
    if floor is not None:
        for key, what, floor_what in [
            ("allow_ns", "allow() in CLOSED", "Floor().allow()"),
            ("call_ns", "call(f)-f()", "Floor().call(f)-f()"),
        ]:
            out.append(
                f"  {what}: {_fmt(key, fb[key])} ns = {_x(_ratio(fb[key], floor[key]))} "
                f"the floor {floor_what} ({_fmt(key, floor[key])} ns)"
            )
    others = [r for r in result["rows"] if r["key"] not in ("fastbreaker", "floor")]
    if others:
        out.append("  the others' cost as a multiple of fastbreaker (compiled)'s (higher: slower):")
    for row in others:
        cells = []
        for key, what in PEER_RATIOS:
            ratio = _ratio(row.get(key), fb.get(key))
            if ratio is not None:
                cells.append(f"{what} {_x(ratio)}")
        out.append(f"    {row['label']}: {', '.join(cells) or 'n/a'}")
    return out


def _target_lines(result: dict[str, Any]) -> list[str]:
    targets = result.get("targets") or {}
    if not result.get("check_targets"):
        return []
    if not targets:
        return ["--check-targets: no compiled core or no floor in this run; nothing was checked."]
    out = [
        f"--check-targets: the developers' targets for the compiled core, timeit-style (one loop "
        f"iteration, {targets['loop_ns']:.1f} ns, included); every ratio is to one floor, "
        f"{targets['floor']} = {targets['floor_ns']:.1f} ns:"
    ]
    for t in targets["checks"]:
        if t["target"] is None:
            out.append(f"  {t['what']}: {t['ns']:.1f} ns = {t['x_floor']:.2f}x {targets['floor']}")
            continue
        verdict = "met" if t["met"] else "MISSED"
        out.append(
            f"  {t['what']}: {t['ns']:.1f} ns = {_ratio_vs(t['x_floor'], t['target'])}x "
            f"{targets['floor']}, target <= {t['target']:g}x: {verdict}"
        )
    return out


def _notes(result: dict[str, Any]) -> list[str]:
    m, mach, th = result["method"], result["machine"], result["threads"]
    versions = ", ".join(f"{k} {v}" for k, v in result["versions"].items())
    notes = [
        f"ns per operation, median of {m['rounds']} interleaved rounds (~{m['batch_ms']:g} ms "
        f"batches, {m['unroll']}x unrolled), baseline loop subtracted; GC {m['gc']}.",
        "The floor row is the same operation on Floor(), an empty method on a Cython class: "
        "Floor().allow() returns True, Floor().call(f) returns f(). Each ratio names its floor.",
        "call(f)-f(): a guarded call of a function doing nothing, minus calling it directly "
        f"(f() alone: {m['baselines_ns']['f()']:.1f} ns). async call: the same for `await` "
        f"(await af() alone: {m['baselines_ns']['await af()']:.1f} ns), {m['async']}.",
        "open: a breaker held OPEN; `allow()` returns False, `call` raises the library's error "
        "(caught). x Floor().call(f), x fastbreaker: call(f)-f() divided by the floor row's and "
        "by fastbreaker (compiled)'s.",
        f"hosts: {m['hosts']:,} hosts, one breaker per host, one guarded call per host "
        f"round-robin; bytes/host by {m['memory']}.",
        f"threading.active_count(): {th['before']} before, {th['after']} after.",
        f"{result['date']}; {mach['python']}; {mach['platform']}; "
        f"{mach['cpu']} ({mach['cpus']} CPUs).",
        f"versions: {versions}.",
        "how each system is driven:",
    ]
    for row in result["rows"]:
        how = "; ".join(f"[{_header(k)}] {v}" for k, v in row["api"].items())
        notes.append(f"  {row['label']}: {how}")
    for skip in result["skipped"]:
        hint = "  (pip install 'fastbreaker[bench]')" if skip["reason"] == "not installed" else ""
        notes.append(f"  skipped {skip['label']}: {skip['reason']}{hint}")
    notes.append(
        "Shared machines are noisy: absolute numbers vary from run to run, the ratios carry over."
    )
    if m.get("smoke"):
        notes.append(m["smoke"] + ".")
    return notes


_COLORS = {"fastbreaker": "#d62728", "fastbreaker_py": "#f4a582", "floor": "#7f7f7f"}


def plot(result: dict[str, Any], path: str) -> None:
    """A PNG bar chart of the table (matplotlib must be importable; see ``_require_matplotlib``)."""
    import matplotlib.pyplot as plt

    fig = figure(result)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def figure(result: dict[str, Any]) -> Any:
    """The chart: one panel per measurement, each bar labelled with its ratio to its reference."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    hosts = result["method"]["hosts"]
    # (metric, title, reference row, what the ratio is to); allow() is fastbreaker's permit API,
    # which no peer has, so its bars are compared with the floor, Floor().allow().
    panels = [
        ("call_ns", "guarded call: call(f) - f()", "fastbreaker", "fastbreaker"),
        ("allow_ns", "allow() in CLOSED (no peer has one)", "floor", "Floor().allow()"),
        ("open_call_ns", "rejected call while OPEN", "fastbreaker", "fastbreaker"),
        ("hosts_call_ns", f"{hosts:,} hosts: per guarded call", "fastbreaker", "fastbreaker"),
    ]
    labels = [r["label"] for r in rows]
    height = 0.45 * len(rows) + 1.4
    fig, axes = plt.subplots(2, 2, figsize=(14, 2 * height + 1.0), sharey=True)
    by_key = {r["key"]: r for r in rows}
    for ax, (key, title, ref_key, ref_name) in zip(axes.flat, panels):
        values = [r.get(key) for r in rows]
        shown = [v if v is not None and v > 0 else 0 for v in values]
        colors = [_COLORS.get(r["key"], "#1f77b4") for r in rows]
        ax.barh(range(len(rows)), shown, color=colors)
        ax.set_title(f"{title}  (x = times {ref_name})", fontsize=10)
        ax.set_xlabel("ns per operation (shorter is faster)")
        top = max(shown) if any(shown) else 1
        ax.set_xlim(0, top * 1.5)  # room for the labels
        base = by_key.get(ref_key, {}).get(key)
        for i, v in enumerate(values):
            if v is None or v <= 0:
                ax.text(top * 0.02, i, "n/a", va="center", fontsize=9, color="#555555")
                continue
            text = f"{v:,.0f} ns" if v >= 100 else f"{v:.1f} ns"
            ratio = _ratio(v, base)
            if ratio is not None and rows[i]["key"] != ref_key:
                text += f"  ({_x(ratio)})"
            ax.text(v + top * 0.02, i, text, va="center", fontsize=9)
        ax.grid(axis="x", which="major", alpha=0.3)
    for ax in axes[:, 0]:
        ax.set_yticks(list(range(len(rows))))
        ax.set_yticklabels(labels)
    axes[0, 0].invert_yaxis()
    mach = result["machine"]
    fig.suptitle(
        f"python -m fastbreaker: ns per operation, median of {result['method']['rounds']} rounds"
        f"\n{mach['python']}, {mach['cpu']} ({mach['cpus']} CPUs), "
        f"{result['date'][:10]}; shared machines are noisy, the ratios carry over",
        fontsize=10,
    )
    fig.tight_layout()
    return fig


def _require_matplotlib() -> Optional[str]:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "--plot needs matplotlib, which is not installed: pip install matplotlib"
    return None


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m fastbreaker``: run the headline benchmark and print the table."""
    parser = argparse.ArgumentParser(
        prog="python -m fastbreaker",
        description="Measure fastbreaker against its pure-Python twin, every installed peer and "
        "the floor (an empty Cython method call), on this machine, in this run.",
        epilog="A full run takes under a minute on 2 cores and starts no thread. Peers: "
        "pip install 'fastbreaker[bench]'. How each cell is measured is printed under the table.",
    )
    parser.add_argument("--quick", action="store_true", help="fewer, shorter rounds (seconds)")
    parser.add_argument(
        "--json", metavar="PATH", help="also write the results as JSON to PATH ('-': stdout)"
    )
    parser.add_argument(
        "--plot", metavar="PATH", help="also draw the table as a PNG bar chart (needs matplotlib)"
    )
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    parser.add_argument(
        "--check-targets",
        action="store_true",
        help="also check the compiled core against the developers' targets (ratios to "
        "Floor().allow()); exit with status 1 when one is missed",
    )
    # For tests and CI smoke runs: FASTBREAKER_REPORT_TINY=1 (or these) makes a run of seconds
    # whose numbers mean nothing but whose every path runs.
    tiny = bool(os.environ.get("FASTBREAKER_REPORT_TINY"))
    hidden = argparse.SUPPRESS
    parser.add_argument("--rounds", type=int, default=2 if tiny else None, help=hidden)
    parser.add_argument("--batch-ms", type=float, default=0.5 if tiny else None, help=hidden)
    parser.add_argument("--hosts", type=int, default=500 if tiny else 10_000, help=hidden)
    args = parser.parse_args(argv)
    if args.rounds is not None and args.rounds < 1:
        parser.error("--rounds must be >= 1")
    if args.hosts < 1:
        parser.error("--hosts must be >= 1")
    if args.plot:
        problem = _require_matplotlib()
        if problem:
            print(f"python -m fastbreaker: {problem}", file=sys.stderr)
            return 2

    progress = Progress(sys.stderr, quiet=args.quiet)
    result = run_report(
        quick=args.quick,
        rounds=args.rounds,
        batch_ms=args.batch_ms,
        hosts=args.hosts,
        progress=progress,
    )
    if tiny:
        result["method"]["smoke"] = (
            "FASTBREAKER_REPORT_TINY is set: a smoke run, its numbers mean nothing"
        )
    result["command"] = "python -m fastbreaker" + "".join(
        " " + a for a in (sys.argv[1:] if argv is None else argv)
    )
    result["check_targets"] = args.check_targets
    if args.json == "-":
        json.dump(result, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(format_markdown(result) if args.markdown else format_text(result))
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(result, fh, indent=2)
                fh.write("\n")
            progress(f"wrote {args.json}")
    if args.plot:
        plot(result, args.plot)
        progress(f"wrote {args.plot}")
    if args.check_targets:
        missed = missed_targets(result)
        if not result.get("targets"):
            print("python -m fastbreaker: --check-targets needs the compiled core and the floor",
                  file=sys.stderr)
            return 1
        if missed:
            print(f"python -m fastbreaker: targets missed: {'; '.join(missed)}", file=sys.stderr)
            return 1
    return 0
