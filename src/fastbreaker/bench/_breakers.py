"""The breaker section: fastbreaker (compiled and pure twin), the floor and each installed peer.

pybreaker, circuitbreaker, aiobreaker and purgatory (``pip install 'fastbreaker[bench]'``) are
each driven through their documented API; fastbreaker's rows use the core the selector picked
and the twin. What each column means is in ``notes`` (printed with ``--verbose``).
"""

from __future__ import annotations

import asyncio
import datetime
import importlib
from typing import Any, Mapping, Optional, Sequence

from ._section import (
    Section,
    System,
    dict_of,
    expect_raises,
    peer,
    summary_lines,
    unlinked_region,
    version,
)
from ._timing import Boom, af, boom, f

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
# The text and Markdown output: two tables of at most 5 columns, so that lines stay within
# ``_format.WIDTH`` columns (threads_created is a line of the summary: a column of zeros).
# Each title is formatted with the run's ``rounds`` and ``hosts``.
TABLES = [
    (
        "ns per operation, median of {rounds} rounds (lower is faster)",
        ["call_ns", "allow_ns", "open_allow_ns", "open_call_ns", "async_ns"],
    ),
    (
        "call(f)-f() as a ratio to the floor's and to fastbreaker's; {hosts:,} hosts, one breaker "
        "each",
        ["x_floor", "x_fastbreaker", "hosts_call_ns", "bytes_per_host"],
    ),
]
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


def _fastbreaker_system(
    key: str, label: str, breaker_mod: Any, map_cls: Any, **options: Any
) -> System:
    from .._errors import CircuitOpenError

    cb = breaker_mod.CircuitBreaker(reset_timeout=OPEN_SECONDS, **options)
    open_cb = breaker_mod.CircuitBreaker(reset_timeout=OPEN_SECONDS, **options)
    open_cb.trip()
    if not options.get("dry_run"):
        expect_raises(lambda: open_cb.call(f), CircuitOpenError, f"{label} call() while OPEN")

    def build_hosts(hosts: list[str]) -> dict[str, Any]:
        if map_cls is None:
            m: Any = {
                h: breaker_mod.CircuitBreaker(reset_timeout=OPEN_SECONDS, **options) for h in hosts
            }
            for h in hosts:
                m[h].call(f)
            return {"m": m}
        m = map_cls(reset_timeout=OPEN_SECONDS, **options)
        for h in hosts:
            m.call(h, f)
        return {"m": m}

    from .. import __version__

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


def _compiled(loop: asyncio.AbstractEventLoop) -> tuple[Optional[System], str]:
    from .. import COMPILED

    if not COMPILED:
        return None, "the pure-Python core is selected (FASTBREAKER_NO_EXTENSIONS or not CPython)"
    try:
        from .. import _breaker_c
    except ImportError as exc:
        return None, f"the compiled core is not built ({exc})"
    label = "fastbreaker (compiled)"
    return _fastbreaker_system("fastbreaker", label, _breaker_c, _map_for(_breaker_c)), ""


def _fleet(loop: asyncio.AbstractEventLoop) -> tuple[Optional[System], str]:
    # "fastbreaker + fleet": the compiled breaker attached to a FleetCoordinator (never synced
    # here: a sync runs beside the calls, not in them): allow() must cost the same as without.
    system, why = _compiled(loop)
    if system is None:
        return None, why
    from .. import _breaker_c
    from ..contrib.redis import FleetCoordinator

    cb = _breaker_c.CircuitBreaker(reset_timeout=OPEN_SECONDS, name="bench")
    coordinator = FleetCoordinator(object(), namespace="bench")
    coordinator.add_breaker(cb)
    system.key = "fastbreaker_fleet"
    system.label = "fastbreaker + fleet"
    system.ns.update(cb=cb, coordinator=coordinator)
    return system, ""


def _variant(key: str, label: str, **options: Any) -> Any:
    """A row of the compiled breaker (and map) built with ``options``."""

    def factory(loop: asyncio.AbstractEventLoop) -> tuple[Optional[System], str]:
        from .. import COMPILED

        if not COMPILED:
            return (
                None,
                "the pure-Python core is selected (FASTBREAKER_NO_EXTENSIONS or not CPython)",
            )
        from .. import _breaker_c

        system = _fastbreaker_system(key, label, _breaker_c, _map_for(_breaker_c), **options)
        opts = ", ".join(f"{k}={v!r}" for k, v in options.items())
        system.api = {k: f"{v}, {opts}" for k, v in system.api.items()}
        if options.get("dry_run"):
            # a dry run never rejects: its "open" cells are admissions of a tripped breaker
            system.stmts["open_call_ns"] = "open_cb.call(f)"
            system.api["open_allow_ns"] = f"cb.allow() -> True after cb.trip(), {opts}"
            system.api["open_call_ns"] = f"cb.call(f) admitted after cb.trip(), {opts}"
        return system, ""

    return factory


def _shared(loop: asyncio.AbstractEventLoop) -> tuple[Optional[System], str]:
    # "fastbreaker shared": the compiled breaker with its state in a SharedRegion (the region is
    # unlinked at once: this process's mapping stays, nothing is left in /dev/shm).
    system, why = _compiled(loop)
    if system is None:
        return None, why
    import sys

    if sys.platform == "win32":
        return None, "SharedRegion is POSIX only"
    region = unlinked_region("breakers")
    cb = region.breaker("bench", reset_timeout=OPEN_SECONDS)
    open_cb = region.breaker("bench-open", reset_timeout=OPEN_SECONDS)
    open_cb.trip()
    system.key = "fastbreaker_shared"
    system.label = "fastbreaker shared"
    system.ns.update(cb=cb, open_cb=open_cb, region=region)
    system.api = {k: f"{v}, in a SharedRegion" for k, v in system.api.items()}
    system.api["hosts_call_ns"] = "m.call(host, f) on region.breaker_map(capacity=hosts)"

    def build_hosts(hosts: list[str]) -> dict[str, Any]:
        from .. import _breaker_c
        from .._options import BreakerOptions
        from .._region_map import map_size

        block = _breaker_c.shared_size(BreakerOptions(reset_timeout=OPEN_SECONDS))
        r = unlinked_region("hosts", map_size(len(hosts), block) + (1 << 16))
        m = r.breaker_map("hosts", capacity=len(hosts), reset_timeout=OPEN_SECONDS)
        for h in hosts:
            m.call(h, f)
        return {"m": m, "region": r}

    system.build_hosts = build_hosts
    system.hosts_stmt = "m.call(h, f)"
    return system, ""


# Rows of the compiled core with other options (labels fit the table's first column).
VARIANTS = [
    (
        "fastbreaker window=100",
        _variant("fastbreaker_count_window", "fastbreaker window=100", window=100),
    ),
    (
        "fastbreaker time window 60s",
        _variant("fastbreaker_time_window", "fastbreaker time window 60s", window_seconds=60),
    ),
    (
        "fastbreaker dry_run=True",
        _variant("fastbreaker_dry_run", "fastbreaker dry_run=True", dry_run=True),
    ),
]


def _twin(loop: asyncio.AbstractEventLoop) -> tuple[Optional[System], str]:
    from .. import _breaker_py

    label = "fastbreaker (pure twin)"
    return _fastbreaker_system("fastbreaker_py", label, _breaker_py, _map_for(_breaker_py)), ""


def _map_for(breaker_mod: Any) -> Any:
    """The BreakerMap class bound to ``breaker_mod`` (None when the map is unavailable)."""
    try:
        from .. import _map
    except ImportError:
        return None
    map_class = getattr(_map, "map_class", None)
    if map_class is not None:
        return map_class(breaker_mod)
    return getattr(_map, "BreakerMap", None)


def _floor(loop: asyncio.AbstractEventLoop) -> tuple[Optional[System], str]:
    try:
        from ._floor_c import Floor
    except ImportError as exc:
        return None, f"the floor helper is not built ({exc})"
    from .. import __version__

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
        build_hosts=dict_of(Floor),
        hosts_stmt="d[h].call(f)",
    ), ""


def _pybreaker(loop: asyncio.AbstractEventLoop) -> tuple[Optional[System], str]:
    pybreaker = peer("pybreaker")
    if pybreaker is None:
        return None, "not installed"

    def make() -> Any:
        return pybreaker.CircuitBreaker(fail_max=5, reset_timeout=OPEN_SECONDS)

    cb, open_cb = make(), make()
    open_cb.open()
    error = pybreaker.CircuitBreakerError
    expect_raises(lambda: open_cb.call(f), error, "pybreaker call() while open")

    return System(
        key="pybreaker",
        label="pybreaker",
        version=version("pybreaker"),
        ns={"cb": cb, "open_cb": open_cb, "f": f, "_E": error},
        stmts={"call_ns": "cb.call(f)", "open_call_ns": "try: open_cb.call(f)\nexcept _E: pass"},
        api={
            "call_ns": "cb.call(f)",
            "open_call_ns": "cb.call(f) raising CircuitBreakerError after cb.open()",
            "async_ns": "n/a: pybreaker's call_async needs Tornado",
            "hosts_call_ns": "d[host].call(f) on a dict of CircuitBreaker",
        },
        build_hosts=dict_of(make),
        hosts_stmt="d[h].call(f)",
    ), ""


def _circuitbreaker(loop: asyncio.AbstractEventLoop) -> tuple[Optional[System], str]:
    circuitbreaker = peer("circuitbreaker")
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
        expect_raises(failing, Boom, "circuitbreaker tripping")
    error = circuitbreaker.CircuitBreakerError
    expect_raises(open_guarded, error, "circuitbreaker while open")

    def build_hosts(hosts: list[str]) -> dict[str, Any]:
        d = {h: make(h)(f) for h in hosts}
        for h in hosts:
            d[h]()
        return {"d": d}

    return System(
        key="circuitbreaker",
        label="circuitbreaker",
        version=version("circuitbreaker"),
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


def _aiobreaker(loop: asyncio.AbstractEventLoop) -> tuple[Optional[System], str]:
    aiobreaker = peer("aiobreaker")
    if aiobreaker is None:
        return None, "not installed"

    def make() -> Any:
        period = datetime.timedelta(seconds=OPEN_SECONDS)
        return aiobreaker.CircuitBreaker(fail_max=5, timeout_duration=period)

    cb, open_cb = make(), make()
    open_cb.open()
    error = aiobreaker.CircuitBreakerError
    expect_raises(lambda: open_cb.call(f), error, "aiobreaker call() while open")

    return System(
        key="aiobreaker",
        label="aiobreaker",
        version=version("aiobreaker"),
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
        build_hosts=dict_of(make),
        hosts_stmt="d[h].call(f)",
    ), ""


def _purgatory(loop: asyncio.AbstractEventLoop) -> tuple[Optional[System], str]:
    purgatory = peer("purgatory")
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
        expect_raises(fail_once, Boom, "purgatory tripping")

    def rejected() -> None:
        with sync.get_breaker("bench-open"):
            f()

    expect_raises(rejected, OpenedState, "purgatory while open")

    def build_hosts(hosts: list[str]) -> dict[str, Any]:
        factory = purgatory.SyncCircuitBreakerFactory(default_threshold=5, default_ttl=OPEN_SECONDS)
        for h in hosts:
            with factory.get_breaker(h):
                f()
        return {"cbf": factory}

    return System(
        key="purgatory",
        label="purgatory",
        version=version("purgatory"),
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


def _ratios(systems: Sequence[System]) -> None:
    """``x_floor`` and ``x_fastbreaker``: each row's call(f)-f() over the reference row's."""
    ref = {s.key: s.results.get("call_ns") for s in systems}
    for s in systems:
        call = s.results.get("call_ns")
        for key, ref_key in (("x_floor", "floor"), ("x_fastbreaker", "fastbreaker")):
            base = ref.get(ref_key)
            s.results[key] = call / base if call is not None and base and base > 0 else None


def _summary(result: Mapping[str, Any]) -> list[str]:
    """What the user came for: the compiled core against the floors and against each peer."""
    threads = [
        f"{r['label']} {r['threads_created']}" for r in result["rows"] if r["threads_created"]
    ]
    started = ", ".join(threads) if threads else "none, by any system"
    return [
        f"threads started while building the {result['method']['hosts']:,} hosts: {started}"
    ] + summary_lines(
        result,
        title="fastbreaker (compiled), from the tables above:",
        missing="The compiled core is not in this run, so there is nothing to compare it with.",
        floors=[
            ("allow_ns", "allow() in CLOSED", "Floor().allow()"),
            ("call_ns", "call(f)-f()", "Floor().call(f)-f()"),
        ],
        others_header="  the others' cost as a multiple of fastbreaker (compiled)'s (higher: slower):",
        peer_ratios=PEER_RATIOS,
    )


def _notes(result: Mapping[str, Any]) -> list[str]:
    m = result["method"]
    return [
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
        *_shared_note(),
    ]


def _shared_note() -> list[str]:
    """What a shared map's key takes in the region (bytes/host above is this process's part)."""
    try:
        from .. import _breaker_c
        from .._options import BreakerOptions
        from .._region_map import SLOT_SIZE
    except ImportError:
        return []
    block = (_breaker_c.shared_size(BreakerOptions()) + 63) & ~63
    return [
        f"fastbreaker shared: state in a SharedRegion; a shared map's key takes "
        f"{SLOT_SIZE + 8 + block} bytes in the region (table slot {SLOT_SIZE}, tag 8, breaker "
        f"block {block}), besides the bytes/host this process holds for the keys it used."
    ]


SECTION = Section(
    key="breakers",
    systems=[
        ("fastbreaker (compiled)", _compiled),
        ("fastbreaker + fleet", _fleet),
        ("fastbreaker shared", _shared),
        *VARIANTS,
        ("fastbreaker (pure twin)", _twin),
        ("pybreaker", _pybreaker),
        ("circuitbreaker", _circuitbreaker),
        ("aiobreaker", _aiobreaker),
        ("purgatory", _purgatory),
        ("floor", _floor),
    ],
    columns=COLUMNS,
    tables=TABLES,
    baselines=BASELINE,
    derive=_ratios,
    summary=_summary,
    notes=_notes,
    # allow() is fastbreaker's permit API, which no peer has, so its bars are compared with the
    # floor, Floor().allow().
    panels=[
        ("call_ns", "guarded call: call(f) - f()", "fastbreaker", "fastbreaker"),
        ("allow_ns", "allow() in CLOSED (no peer has one)", "floor", "Floor().allow()"),
        ("open_call_ns", "rejected call while OPEN", "fastbreaker", "fastbreaker"),
        ("hosts_call_ns", "{hosts:,} hosts: per guarded call", "fastbreaker", "fastbreaker"),
    ],
)
