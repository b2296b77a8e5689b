"""The rate limiter section: fastbreaker's RateLimiter against its breaker, and the peers.

Every limiter admits ``WIDE_LIMIT`` units per second with a burst of as many, so no call is
ever refused: the rows time the admit path. PyrateLimiter (GCRA, in memory and in its
multiprocess store), ``limits`` (memory storage: fixed window, sliding window counter, moving
window) and aiolimiter are in ``fastbreaker[bench]``; each is skipped, with the reason, when it
is not installed. What each column means is in ``notes``.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any, Mapping, Optional, Sequence

from ._format import fmt, ratio, times
from ._section import Section, System, peer, unlinked_region, version

WIDE_LIMIT = 10**9  # units per second, and the burst: never refused at the speed of a loop
WIDE = f"{WIDE_LIMIT}/s"
COMPILED_ONLY = "the pure-Python core is selected (FASTBREAKER_NO_EXTENSIONS or not CPython)"

COLUMNS = [
    ("try_ns", "try_acquire()", "ns"),
    ("async_ns", "async with", "ns"),
    ("hosts_call_ns", "per key", "ns"),
    ("bytes_per_host", "bytes/key", "B"),
    ("x_try", "try: x fastbreaker", "x"),
    ("x_async", "async: x fastbreaker", "x"),
]
TABLES = [
    (
        "rate limiters: ns per admitted call, median of {rounds} rounds (lower is faster); "
        "per key: {hosts:,} keys round-robin",
        ["try_ns", "async_ns", "hosts_call_ns", "bytes_per_host"],
    ),
    (
        "rate limiters: try_acquire() and async with as a multiple of fastbreaker "
        "RateLimiter (compiled)'s",
        ["x_try", "x_async"],
    ),
]
BASELINE = {
    "try_ns": ("sync", "pass"),
    "async_ns": ("async", "await af()"),
    "hosts_call_ns": ("hosts", "pass"),
}
ASYNC_WITH = "async with lim:\n    await af()"


def _core(loop: asyncio.AbstractEventLoop) -> tuple[Optional[Any], str]:
    """The compiled rate limiter module, or why there is none."""
    from .. import COMPILED

    if not COMPILED:
        return None, COMPILED_ONLY
    try:
        from .. import _ratelimit_c
    except ImportError as exc:
        return None, f"the compiled core is not built ({exc})"
    return _ratelimit_c, ""


def _fastbreaker_system(key: str, label: str, core: Any, *, every_cell: bool) -> System:
    """A row of ``core``'s limiter; the twin's (not ``every_cell``) times try_acquire() only,
    as each cell costs the run about a second."""
    from .. import __version__

    def build_hosts(hosts: list[str]) -> dict[str, Any]:
        m = core.RateLimiterMap(WIDE, max_keys=len(hosts))
        for h in hosts:
            m.try_acquire(h)
        return {"m": m}

    system = System(
        key=key,
        label=label,
        version=__version__,
        ns={"lim": core.RateLimiter(WIDE, name="fastbreaker-bench")},
        stmts={"try_ns": "lim.try_acquire()"},
        api={"try_ns": f"lim.try_acquire() on RateLimiter({WIDE!r})"},
    )
    if every_cell:
        system.stmts["async_ns"] = ASYNC_WITH
        system.api["async_ns"] = "async with lim: await af()"
        system.api["hosts_call_ns"] = f"m.try_acquire(key) on RateLimiterMap({WIDE!r})"
        system.build_hosts = build_hosts
        system.hosts_stmt = "m.try_acquire(h)"
    return system


def _compiled(loop: asyncio.AbstractEventLoop) -> tuple[Optional[System], str]:
    core, why = _core(loop)
    if core is None:
        return None, why
    label = "fastbreaker RateLimiter (compiled)"
    return _fastbreaker_system("fastbreaker", label, core, every_cell=True), ""


def _twin(loop: asyncio.AbstractEventLoop) -> tuple[Optional[System], str]:
    from .. import _ratelimit_py

    label = "fastbreaker RateLimiter (pure twin)"
    return _fastbreaker_system("fastbreaker_py", label, _ratelimit_py, every_cell=False), ""


def _shared(loop: asyncio.AbstractEventLoop) -> tuple[Optional[System], str]:
    # The compiled limiter with its TAT word in a SharedRegion.
    core, why = _core(loop)
    if core is None:
        return None, why
    if sys.platform == "win32":
        return None, "SharedRegion is POSIX only"
    from .. import __version__

    region = unlinked_region("ratelimits")
    return System(
        key="fastbreaker_shared",
        label="fastbreaker RateLimiter shared",
        version=__version__,
        ns={"lim": region.rate_limiter("bench", WIDE), "region": region},
        stmts={"try_ns": "lim.try_acquire()"},
        api={"try_ns": f"lim.try_acquire() on region.rate_limiter('bench', {WIDE!r})"},
    ), ""


def _breaker(loop: asyncio.AbstractEventLoop) -> tuple[Optional[System], str]:
    # The reference of the targets: the compiled breaker's allow() in CLOSED (it reads no
    # clock), and BreakerMap.allow(key) over the same keys.
    from .. import COMPILED, __version__

    if not COMPILED:
        return None, COMPILED_ONLY
    from .. import _breaker_c
    from .._map import map_class

    def build_hosts(hosts: list[str]) -> dict[str, Any]:
        m = map_class(_breaker_c)(max_keys=len(hosts))
        for h in hosts:
            m.allow(h)
        return {"m": m}

    return System(
        key="fastbreaker_breaker",
        label="CircuitBreaker.allow() (compiled)",
        version=__version__,
        ns={"cb": _breaker_c.CircuitBreaker()},
        stmts={"try_ns": "cb.allow()"},
        api={
            "try_ns": "cb.allow() in CLOSED (not a limiter: the targets' reference)",
            "hosts_call_ns": "m.allow(key) on BreakerMap(max_keys=keys)",
        },
        build_hosts=build_hosts,
        hosts_stmt="m.allow(h)",
    ), ""


def _clock_floor(loop: asyncio.AbstractEventLoop) -> tuple[Optional[System], str]:
    # The floor of any limiter that reads the clock: an empty Cython method that reads
    # CLOCK_MONOTONIC as the compiled limiter does, and keeps nothing.
    from .. import COMPILED, __version__

    if not COMPILED:
        return None, COMPILED_ONLY
    from ._floor_c import Floor

    return System(
        key="floor_clock",
        label="Floor().now() (a clock read)",
        version=__version__,
        ns={"fl": Floor()},
        stmts={"try_ns": "fl.now()"},
        api={"try_ns": "fl.now(): an empty Cython method that reads CLOCK_MONOTONIC"},
    ), ""


def _pyrate(multiprocess: bool) -> Any:
    def factory(loop: asyncio.AbstractEventLoop) -> tuple[Optional[System], str]:
        pyrate = peer("pyrate_limiter")
        if pyrate is None:
            return None, "not installed"
        if not hasattr(pyrate, "GCRA"):
            return None, f"pyrate-limiter {version('pyrate-limiter')} has no GCRA (4.x has)"
        rates = [pyrate.Rate(WIDE_LIMIT, pyrate.Duration.SECOND)]
        if multiprocess:
            # state in a multiprocessing Manager (a server process) under a cross-process lock
            from pyrate_limiter.buckets.state_bucket import MultiprocessStateStore

            store, where = MultiprocessStateStore.init(), "MultiprocessStateStore.init()"
        else:
            store, where = pyrate.InMemoryStateStore(), "InMemoryStateStore()"
        bucket = pyrate.StateBucket(rates, algorithm=pyrate.GCRA(), store=store)
        lim = pyrate.Limiter(bucket)
        if lim.try_acquire("bench", blocking=False) is not True:
            raise RuntimeError("benchmark setup: PyrateLimiter refused its first call")
        return System(
            key="pyrate_mp" if multiprocess else "pyrate",
            label=f"PyrateLimiter GCRA {'multiprocess' if multiprocess else 'in memory'}",
            version=version("pyrate-limiter"),
            ns={"lim": lim},
            stmts={"try_ns": "lim.try_acquire('bench', blocking=False)"},
            api={
                "try_ns": "lim.try_acquire('bench', blocking=False) on Limiter(StateBucket("
                f"[Rate({WIDE_LIMIT}, Duration.SECOND)], algorithm=GCRA(), store={where}))"
            },
            close=lim.close,  # its leak thread, started by the Limiter
        ), ""

    return factory


def _limits(strategy: str, label: str) -> Any:
    """A row of ``limits``' ``strategy`` (a class of ``limits.strategies``) in memory."""

    def factory(loop: asyncio.AbstractEventLoop) -> tuple[Optional[System], str]:
        limits = peer("limits")
        if limits is None:
            return None, "not installed"
        import limits.storage
        import limits.strategies

        cls = getattr(limits.strategies, strategy, None)
        if cls is None:
            return None, f"limits {version('limits')} has no {strategy}"
        storage = limits.storage.MemoryStorage()
        # Its expiry timer (a thread of 10 ms, started again by every hit once it has ended):
        # let the first end, so that no thread of it runs while the keys are built.
        timer = getattr(storage, "timer", None)
        if timer is not None:
            timer.join()
        lim = cls(storage)
        item = limits.parse(f"{WIDE_LIMIT}/second")
        return System(
            key="limits_" + label.split(" ", 1)[1].replace(" ", "_"),
            label=label,
            version=version("limits"),
            ns={"lim": lim, "item": item},
            stmts={"try_ns": "lim.hit(item, 'bench')"},
            api={"try_ns": f"lim.hit(item, 'bench') on {strategy}(MemoryStorage())"},
        ), ""

    return factory


def _aiolimiter(loop: asyncio.AbstractEventLoop) -> tuple[Optional[System], str]:
    aiolimiter = peer("aiolimiter")
    if aiolimiter is None:
        return None, "not installed"
    return System(
        key="aiolimiter",
        label="aiolimiter",
        version=version("aiolimiter"),
        ns={"lim": aiolimiter.AsyncLimiter(WIDE_LIMIT, 1)},
        stmts={"async_ns": ASYNC_WITH},
        api={
            "async_ns": f"async with lim: await af() on AsyncLimiter({WIDE_LIMIT}, 1)",
            "try_ns": "n/a: no try; has_capacity() checks without taking",
        },
    ), ""


def _ratios(systems: Sequence[System]) -> None:
    """``x_try``, ``x_async``: a cell over fastbreaker RateLimiter (compiled)'s."""
    fb = next((s.results for s in systems if s.key == "fastbreaker"), {})
    for s in systems:
        s.results["x_try"] = ratio(s.results.get("try_ns"), fb.get("try_ns"))
        s.results["x_async"] = ratio(s.results.get("async_ns"), fb.get("async_ns"))


def _summary(result: Mapping[str, Any]) -> list[str]:
    """Ours against the breaker and local memory, then each peer as a multiple of ours."""
    rows = {row["key"]: row for row in result["rows"]}
    fb = rows.get("fastbreaker")
    if fb is None:
        return ["", "The compiled RateLimiter is not in this run, so there is nothing to compare."]
    out = ["", "fastbreaker RateLimiter (compiled), from the rate limiter tables:"]
    pairs = [
        ("try_ns", "try_acquire()", "fastbreaker_breaker", "CircuitBreaker.allow()"),
        (
            "hosts_call_ns",
            "RateLimiterMap.try_acquire(key)",
            "fastbreaker_breaker",
            "BreakerMap.allow(key)",
        ),
        ("try_ns", "try_acquire()", "floor_clock", "the clock floor Floor().now()"),
        ("try_ns", "shared-memory try_acquire()", "fastbreaker_shared", "local"),
    ]
    for metric, what, ref, ref_what in pairs:
        other = rows.get(ref, {})
        mine, theirs = (other, fb) if ref == "fastbreaker_shared" else (fb, other)
        if mine.get(metric) is None or theirs.get(metric) is None:
            continue
        r = ratio(mine[metric], theirs[metric])
        out.append(
            f"  {what}: {fmt(metric, mine[metric])} ns = {times(r)} {ref_what} "
            f"({fmt(metric, theirs[metric])} ns)"
        )
    others = [r for r in result["rows"] if r["key"].startswith(("pyrate", "limits", "aiolim"))]
    if others:
        out.append("  the peers' cost as a multiple of fastbreaker RateLimiter (compiled)'s:")
    for row in others:
        cells = [
            f"{what} {times(row[key])}"
            for key, what in (("x_try", "try_acquire"), ("x_async", "async with"))
            if row.get(key) is not None
        ]
        out.append(f"    {row['label']}: {', '.join(cells) or 'n/a'}")
    return out


def _notes(result: Mapping[str, Any]) -> list[str]:
    return [
        f"rate limiters: every limiter admits {WIDE_LIMIT:,} units per second with a burst of "
        "as many, so no call is refused: the cells time the admit path (a GCRA limiter also "
        "reads the clock, which a CLOSED breaker's allow() does not). try_acquire() (peers: "
        "their non-blocking acquire, limits' hit()) is timed against `pass`, `async with` "
        "against await af(); per key: one call per key, round-robin over the keys, against a "
        "bare loop. CircuitBreaker.allow() and BreakerMap.allow(key) are the targets' "
        "reference, not limiters; Floor().now(), an empty method that reads "
        "CLOCK_MONOTONIC, is the floor of anything that reads the clock. limits' memory storage starts a timer thread (10 ms) on a hit "
        "when none runs; PyrateLimiter's Limiter runs a leak thread (stopped after the timing). "
        "x fastbreaker: a cell over fastbreaker RateLimiter "
        "(compiled)'s.",
    ]


SECTION = Section(
    key="ratelimits",
    systems=[
        ("fastbreaker RateLimiter (compiled)", _compiled),
        ("fastbreaker RateLimiter (pure twin)", _twin),
        ("fastbreaker RateLimiter shared", _shared),
        ("CircuitBreaker.allow() (compiled)", _breaker),
        ("Floor().now() (a clock read)", _clock_floor),
        ("PyrateLimiter GCRA in memory", _pyrate(multiprocess=False)),
        ("PyrateLimiter GCRA multiprocess", _pyrate(multiprocess=True)),
        ("limits fixed window", _limits("FixedWindowRateLimiter", "limits fixed window")),
        (
            "limits sliding window counter",
            _limits("SlidingWindowCounterRateLimiter", "limits sliding window counter"),
        ),
        ("limits moving window", _limits("MovingWindowRateLimiter", "limits moving window")),
        ("aiolimiter", _aiolimiter),
    ],
    columns=COLUMNS,
    tables=TABLES,
    baselines=BASELINE,
    derive=_ratios,
    summary=_summary,
    notes=_notes,
)
