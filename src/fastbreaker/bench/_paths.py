"""The call-paths section: the ways users guard a call besides ``allow()`` and ``call(f)``.

``with breaker: f()``, ``@breaker`` on a coroutine function, ``async with breaker:``, the
``@fastbreaker.retry`` success path and a rejected ``call(f)`` (``CircuitOpenError`` raised and
caught), each against its floor and the peers that have the same path, in the same run:

* the floor of ``with`` / ``async with`` is a Cython class whose ``__enter__``/``__exit__``
  (``__aenter__``/``__aexit__``) are empty (``Floor``): what the interpreter charges for any
  compiled context manager;
* the floor of a decorated coroutine function is ``await Floor().call(af)``, a compiled wrapper
  that returns ``af()``'s coroutine;
* the floor of the retry decorator is ``Floor().call(f)``;
* the floor of a rejection is constructing, raising and catching a three-argument ``Exception``
  subclass in Python: ``raise E("svc", 1, 30.0)``.

A cell a system has no API for is ``-``. What each column subtracts is in ``notes``.
"""

from __future__ import annotations

import asyncio
import importlib
from typing import Any, Mapping, Optional, Sequence

from ._format import ratio
from ._section import Section, System, expect_raises, peer, summary_lines, version
from ._timing import Boom, af, f

OPEN_SECONDS = 3600

COLUMNS = [
    ("with_ns", "with: f()", "ns"),
    ("async_dec_ns", "@cb async", "ns"),
    ("async_with_ns", "async with", "ns"),
    ("retry_ns", "@retry ok", "ns"),
    ("rejected_ns", "rejected", "ns"),
    ("x_with", "with x Floor", "x"),
    ("x_async_with", "async with x Floor", "x"),
    ("x_retry", "retry x Floor", "x"),
    ("x_rejected", "rejected x raise E", "x"),
]
TABLES = [
    (
        "call paths: ns per operation minus the bare call, median of {rounds} rounds",
        ["with_ns", "async_dec_ns", "async_with_ns", "retry_ns", "rejected_ns"],
    ),
    (
        "call paths as a ratio to the floor row's same path (Floor(), raise E)",
        ["x_with", "x_async_with", "x_retry", "x_rejected"],
    ),
]
PEER_RATIOS = [
    ("with_ns", "with"),
    ("async_dec_ns", "@cb async"),
    ("async_with_ns", "async with"),
    ("retry_ns", "@retry"),
    ("rejected_ns", "rejected"),
]
BASELINE = {
    "with_ns": ("sync", "f()"),
    "async_dec_ns": ("async", "await af()"),
    "async_with_ns": ("async", "await af()"),
    "retry_ns": ("sync", "f()"),
    "rejected_ns": ("sync", "pass"),
}
WITH = "with cb:\n    f()"
ASYNC_WITH = "async with cb:\n    await af()"
REJECTED = "try:\n    open_cb.call(f)\nexcept _E:\n    pass"


class E(Exception):
    """The floor of a rejection: a plain three-argument exception raised from Python."""


def _fastbreaker_system(key: str, label: str, breaker_mod: Any, core: str) -> System:
    from .. import __version__
    from .._errors import CircuitOpenError
    from .._retry import retry_on_core

    cb = breaker_mod.CircuitBreaker(reset_timeout=OPEN_SECONDS, name="paths")
    open_cb = breaker_mod.CircuitBreaker(reset_timeout=OPEN_SECONDS, name="paths-open")
    open_cb.trip()
    expect_raises(lambda: open_cb.call(f), CircuitOpenError, f"{label} call() while OPEN")
    retried = retry_on_core(core)(on=Boom, attempts=3)(f)
    return System(
        key=key,
        label=label,
        version=__version__,
        ns={"cb": cb, "open_cb": open_cb, "ag": cb(af), "r": retried, "_E": CircuitOpenError},
        stmts={
            "with_ns": WITH,
            "async_dec_ns": "await ag()",
            "async_with_ns": ASYNC_WITH,
            "retry_ns": "r()",
            "rejected_ns": REJECTED,
        },
        api={
            "with_ns": "with cb: f()",
            "async_dec_ns": "await ag() where ag = cb(af)",
            "async_with_ns": "async with cb: await af()",
            "retry_ns": "r() where r = fastbreaker.retry(on=Boom, attempts=3)(f), first try ok",
            "rejected_ns": "cb.call(f) raising CircuitOpenError after cb.trip(), caught",
        },
    )


def _compiled(loop: asyncio.AbstractEventLoop) -> tuple[Optional[System], str]:
    from .. import COMPILED

    if not COMPILED:
        return None, "the pure-Python core is selected (FASTBREAKER_NO_EXTENSIONS or not CPython)"
    try:
        from .. import _breaker_c
    except ImportError as exc:
        return None, f"the compiled core is not built ({exc})"
    return _fastbreaker_system("fastbreaker", "fastbreaker (compiled)", _breaker_c, "c"), ""


def _twin(loop: asyncio.AbstractEventLoop) -> tuple[Optional[System], str]:
    from .. import _breaker_py

    return _fastbreaker_system(
        "fastbreaker_py", "fastbreaker (pure twin)", _breaker_py, "python"
    ), ""


def _floor(loop: asyncio.AbstractEventLoop) -> tuple[Optional[System], str]:
    try:
        from ._floor_c import Floor
    except ImportError as exc:
        return None, f"the floor helper is not built ({exc})"
    from .. import __version__

    return System(
        key="floor",
        label="floor",
        version=__version__,
        ns={"cb": Floor(), "_E3": E},
        stmts={
            "with_ns": WITH,
            "async_dec_ns": "await cb.call(af)",
            "async_with_ns": ASYNC_WITH,
            "retry_ns": "cb.call(f)",
            "rejected_ns": "try:\n    raise _E3('svc', 1, 30.0)\nexcept _E3:\n    pass",
        },
        api={
            "with_ns": "with Floor(): f(), empty __enter__/__exit__",
            "async_dec_ns": "await Floor().call(af): a compiled wrapper returning af()",
            "async_with_ns": "async with Floor(): await af(), empty __aenter__/__aexit__",
            "retry_ns": "Floor().call(f): return f()",
            "rejected_ns": "raise E('svc', 1, 30.0), caught (E a plain Exception subclass)",
        },
    ), ""


def _pybreaker(loop: asyncio.AbstractEventLoop) -> tuple[Optional[System], str]:
    pybreaker = peer("pybreaker")
    if pybreaker is None:
        return None, "not installed"
    cb = pybreaker.CircuitBreaker(fail_max=5, reset_timeout=OPEN_SECONDS)
    return System(
        key="pybreaker",
        label="pybreaker",
        version=version("pybreaker"),
        ns={"cb": cb},
        stmts={"with_ns": "with cb.calling():\n    f()"},
        api={"with_ns": "with cb.calling(): f()"},
    ), ""


def _circuitbreaker(loop: asyncio.AbstractEventLoop) -> tuple[Optional[System], str]:
    circuitbreaker = peer("circuitbreaker")
    if circuitbreaker is None:
        return None, "not installed"
    guarded = circuitbreaker.circuit(failure_threshold=5, recovery_timeout=OPEN_SECONDS)(af)
    loop.run_until_complete(guarded())
    return System(
        key="circuitbreaker",
        label="circuitbreaker",
        version=version("circuitbreaker"),
        ns={"ag": guarded},
        stmts={"async_dec_ns": "await ag()"},
        api={"async_dec_ns": "await ag() where ag = circuit(...)(af)"},
    ), ""


def _aiobreaker(loop: asyncio.AbstractEventLoop) -> tuple[Optional[System], str]:
    aiobreaker = peer("aiobreaker")
    if aiobreaker is None:
        return None, "not installed"
    import datetime

    cb = aiobreaker.CircuitBreaker(fail_max=5, timeout_duration=datetime.timedelta(hours=1))
    guarded = cb(af)
    loop.run_until_complete(guarded())
    return System(
        key="aiobreaker",
        label="aiobreaker",
        version=version("aiobreaker"),
        ns={"ag": guarded},
        stmts={"async_dec_ns": "await ag()"},
        api={"async_dec_ns": "await ag() where ag = CircuitBreaker(...)(af)"},
    ), ""


def _purgatory(loop: asyncio.AbstractEventLoop) -> tuple[Optional[System], str]:
    purgatory = peer("purgatory")
    if purgatory is None:
        return None, "not installed"
    importlib.import_module("purgatory.domain.model")
    sync = purgatory.SyncCircuitBreakerFactory(default_threshold=5, default_ttl=OPEN_SECONDS)
    asyn = purgatory.AsyncCircuitBreakerFactory(default_threshold=5, default_ttl=OPEN_SECONDS)
    brk = sync.get_breaker("paths")
    abrk = loop.run_until_complete(asyn.get_breaker("paths"))
    return System(
        key="purgatory",
        label="purgatory",
        version=version("purgatory"),
        ns={"cb": brk, "acb": abrk},
        stmts={"with_ns": WITH, "async_with_ns": "async with acb:\n    await af()"},
        api={
            "with_ns": "with brk: f() where brk = factory.get_breaker(name), fetched once",
            "async_with_ns": "async with abrk: await af(), abrk fetched once (async factory)",
        },
    ), ""


def _tenacity(loop: asyncio.AbstractEventLoop) -> tuple[Optional[System], str]:
    tenacity = peer("tenacity")
    if tenacity is None:
        return None, "not installed"
    retried = tenacity.retry(
        stop=tenacity.stop_after_attempt(3), retry=tenacity.retry_if_exception_type(Boom)
    )(f)
    return System(
        key="tenacity",
        label="tenacity",
        version=version("tenacity"),
        ns={"r": retried},
        stmts={"retry_ns": "r()"},
        api={"retry_ns": "r() where r = retry(stop=stop_after_attempt(3), retry=...Boom)(f)"},
    ), ""


def _stamina(loop: asyncio.AbstractEventLoop) -> tuple[Optional[System], str]:
    stamina = peer("stamina")
    if stamina is None:
        return None, "not installed"
    retried = stamina.retry(on=Boom, attempts=3)(f)
    return System(
        key="stamina",
        label="stamina",
        version=version("stamina"),
        ns={"r": retried},
        stmts={"retry_ns": "r()"},
        api={"retry_ns": "r() where r = stamina.retry(on=Boom, attempts=3)(f)"},
    ), ""


def _ratios(systems: Sequence[System]) -> None:
    """``x_*``: a cell over the floor row's same cell."""
    floor = next((s.results for s in systems if s.key == "floor"), {})
    for s in systems:
        r = s.results
        for key, metric in (
            ("x_with", "with_ns"),
            ("x_async_with", "async_with_ns"),
            ("x_retry", "retry_ns"),
            ("x_rejected", "rejected_ns"),
        ):
            r[key] = ratio(r.get(metric), floor.get(metric))


def _summary(result: Mapping[str, Any]) -> list[str]:
    return [""] + summary_lines(
        result,
        title="fastbreaker (compiled), from the call-path tables:",
        missing="The compiled core is not in this run, so there is nothing to compare.",
        floors=[
            ("with_ns", "with cb: f()", "with Floor(): f()"),
            ("async_dec_ns", "await ag() (ag = cb(af))", "await Floor().call(af)"),
            ("async_with_ns", "async with cb", "async with Floor()"),
            ("retry_ns", "@fastbreaker.retry, first try ok", "Floor().call(f)"),
            ("rejected_ns", "rejected call(f), caught", "raise E('svc', 1, 30.0), caught"),
        ],
        others_header="  the others' cost as a multiple of fastbreaker (compiled)'s:",
        peer_ratios=PEER_RATIOS,
    )


def _notes(result: Mapping[str, Any]) -> list[str]:
    return [
        "call paths: with and @retry subtract f(); @cb async and async with subtract await af() "
        "(in one asyncio loop); rejected is timed against `pass` (the raise and the catch are "
        "the cost). The floor row is what the interpreter charges for the same path on a "
        "Cython object that does nothing (see fastbreaker/bench/_paths.py); each ratio is a "
        "cell over the floor row's same cell.",
    ]


SECTION = Section(
    key="paths",
    systems=[
        ("fastbreaker (compiled)", _compiled),
        ("fastbreaker (pure twin)", _twin),
        ("floor", _floor),
        ("pybreaker", _pybreaker),
        ("circuitbreaker", _circuitbreaker),
        ("aiobreaker", _aiobreaker),
        ("purgatory", _purgatory),
        ("tenacity", _tenacity),
        ("stamina", _stamina),
    ],
    columns=COLUMNS,
    tables=TABLES,
    baselines=BASELINE,
    derive=_ratios,
    summary=_summary,
    notes=_notes,
)
