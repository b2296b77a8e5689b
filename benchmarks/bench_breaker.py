"""Benchmarks: the circuit breaker's hot paths on both cores, the floor, and the peers.

    python -m pytest benchmarks/bench_breaker.py --benchmark-enable \
        --benchmark-columns=min,median,ops

Compare within a group (same run, same machine); each benchmark is one operation through a
function call, so the absolute numbers carry pytest-benchmark's own overhead, the same in every
row of a group. ``python -m fastbreaker`` measures the same paths with that overhead removed.

Groups:

* ``breaker.allow``: ``allow()`` in CLOSED, compiled vs twin, next to the floor.
* ``breaker.allow+record``: ``allow()`` then ``record_success()``, the raw permit API.
* ``breaker.window (allow+record)``: ``allow()`` then ``record_success()`` in consecutive mode,
  with a count window and with a time window.
* ``breaker.dry_run (call)``: ``call(f)`` on a normal breaker and on a ``dry_run=True`` one.
* ``breaker.call``: ``call(f)`` next to ``f()`` alone, the floor's ``call(f)`` and each peer on
  its success path (pybreaker, circuitbreaker, aiobreaker, purgatory through their documented API).
* ``breaker.open``: rejection while OPEN: ``allow()`` returning False, ``call(f)`` raising
  CircuitOpenError, and each peer's rejection (raising its own error, caught), next to raising
  and catching a plain three-argument exception (the floor of a rejection).
* ``breaker.with``: ``with breaker:`` around nothing, next to ``nullcontext()``, the floor's
  empty ``__enter__``/``__exit__`` and the peers' context managers.
* ``breaker.decorator``: a decorated ``f()``, next to ``f()`` and the peers' decorators.
* ``breaker.async``: ``await`` paths (``call_async``, ``async with``, decorated coroutine
  functions), next to ``await af()``, the floor's (empty ``async with``, a compiled wrapper
  returning ``af()``) and the asyncio peers; coroutines are driven with
  ``send(None)`` (the ``drive`` fixture), without an event loop.
"""

from __future__ import annotations

import contextlib
import datetime
import types
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

OPEN_SECONDS = 3600  # tripped breakers stay open for the whole run

Drive = Callable[[Callable[[], Coroutine[Any, Any, Any]]], Any]


def f() -> int:
    return 1


async def af() -> int:
    return 1


class Boom(Exception):
    pass


def boom() -> None:
    raise Boom


def _breaker(fb: types.SimpleNamespace, *, tripped: bool = False) -> Any:
    cb = fb.CircuitBreaker(reset_timeout=OPEN_SECONDS)
    if tripped:
        cb.trip()
    return cb


def _circuitbreaker(name: str) -> Any:
    circuitbreaker = pytest.importorskip("circuitbreaker")
    return circuitbreaker.CircuitBreaker(
        failure_threshold=5, recovery_timeout=OPEN_SECONDS, name=name
    )


def _aiobreaker() -> Any:
    aiobreaker = pytest.importorskip("aiobreaker")
    return aiobreaker.CircuitBreaker(
        fail_max=5, timeout_duration=datetime.timedelta(seconds=OPEN_SECONDS)
    )


def _rejected(call: Callable[[], Any], error: type[BaseException]) -> Callable[[], bool]:
    """A function making one rejected call and catching the library's error."""

    def run() -> bool:
        try:
            call()
        except error:
            return True
        return False

    assert run(), f"{call!r} was not rejected"
    return run


# -- allow() and the raw permit API ----------------------------------------------------------


@pytest.mark.benchmark(group="breaker.allow")
def test_allow_closed(benchmark: Any, fb: types.SimpleNamespace) -> None:
    assert benchmark(_breaker(fb).allow) is True


@pytest.mark.benchmark(group="breaker.allow")
def test_allow_floor(benchmark: Any, floor: Any) -> None:
    assert benchmark(floor.allow) is True


@pytest.mark.benchmark(group="breaker.allow+record")
def test_allow_record_success(benchmark: Any, fb: types.SimpleNamespace) -> None:
    cb = _breaker(fb)
    allow, record = cb.allow, cb.record_success

    def run() -> None:
        if allow():
            record()

    benchmark(run)
    assert cb.metrics().successes > 0


@pytest.mark.benchmark(group="breaker.allow+record")
def test_allow_record_success_floor(benchmark: Any, floor: Any) -> None:
    allow, record = floor.allow, floor.record_success

    def run() -> None:
        if allow():
            record()

    benchmark(run)


@pytest.mark.benchmark(group="breaker.window (allow+record)")
@pytest.mark.parametrize("mode", ["consecutive", "window=100", "window_seconds=60"])
def test_allow_record_success_window(benchmark: Any, fb: types.SimpleNamespace, mode: str) -> None:
    # issue 18: the time window's allow()+record_success() <= 1.5x the count window's
    options = {"window=100": {"window": 100}, "window_seconds=60": {"window_seconds": 60}}
    cb = fb.CircuitBreaker(reset_timeout=OPEN_SECONDS, **options.get(mode, {}))
    allow, record = cb.allow, cb.record_success

    def run() -> None:
        if allow():
            record()

    benchmark(run)
    m = cb.metrics()
    assert m.successes > 0 and (m.recorded > 0) == (mode != "consecutive")


@pytest.mark.benchmark(group="breaker.dry_run (call)")
@pytest.mark.parametrize("dry_run", [False, True], ids=["normal", "dry_run"])
def test_call_dry_run(benchmark: Any, fb: types.SimpleNamespace, dry_run: bool) -> None:
    # issue 18: a dry run costs no more than a normal breaker
    cb = fb.CircuitBreaker(reset_timeout=OPEN_SECONDS, dry_run=dry_run)
    assert benchmark(cb.call, f) == 1
    assert cb.metrics().would_reject == 0


# -- call(f) on the success path ----------------------------------------------------------------


@pytest.mark.benchmark(group="breaker.call")
def test_call_baseline_f(benchmark: Any) -> None:
    """``f()`` alone: what every guarded call in this group adds to."""
    assert benchmark(f) == 1


@pytest.mark.benchmark(group="breaker.call")
def test_call(benchmark: Any, fb: types.SimpleNamespace) -> None:
    assert benchmark(_breaker(fb).call, f) == 1


@pytest.mark.benchmark(group="breaker.call")
def test_call_floor(benchmark: Any, floor: Any) -> None:
    assert benchmark(floor.call, f) == 1


@pytest.mark.benchmark(group="breaker.call")
def test_call_pybreaker(benchmark: Any) -> None:
    pybreaker = pytest.importorskip("pybreaker")
    cb = pybreaker.CircuitBreaker(fail_max=5, reset_timeout=OPEN_SECONDS)
    assert benchmark(cb.call, f) == 1


@pytest.mark.benchmark(group="breaker.call")
def test_call_circuitbreaker(benchmark: Any) -> None:
    """circuitbreaker's documented API is the decorator (its ``call()`` skips the state check)."""
    assert benchmark(_circuitbreaker("bench-call")(f)) == 1


@pytest.mark.benchmark(group="breaker.call")
def test_call_aiobreaker(benchmark: Any) -> None:
    assert benchmark(_aiobreaker().call, f) == 1


@pytest.mark.benchmark(group="breaker.call")
def test_call_purgatory(benchmark: Any) -> None:
    """purgatory's documented use fetches the breaker by name for every call."""
    purgatory = pytest.importorskip("purgatory")
    factory = purgatory.SyncCircuitBreakerFactory(default_threshold=5, default_ttl=OPEN_SECONDS)

    def run() -> int:
        with factory.get_breaker("bench-call"):
            return f()

    assert benchmark(run) == 1


# -- rejection while OPEN -----------------------------------------------------------------------


@pytest.mark.benchmark(group="breaker.open")
def test_open_allow(benchmark: Any, fb: types.SimpleNamespace) -> None:
    assert benchmark(_breaker(fb, tripped=True).allow) is False


@pytest.mark.benchmark(group="breaker.open")
def test_open_call(benchmark: Any, fb: types.SimpleNamespace) -> None:
    cb = _breaker(fb, tripped=True)
    assert benchmark(_rejected(lambda: cb.call(f), fb.CircuitOpenError)) is True


@pytest.mark.benchmark(group="breaker.open")
def test_open_baseline_raise(benchmark: Any) -> None:
    # the floor of a rejection: a three-argument Exception subclass raised and caught in Python
    class E(Exception):
        pass

    def run() -> bool:
        try:
            raise E("svc", 1, 30.0)
        except E:
            return True

    assert benchmark(run) is True


@pytest.mark.benchmark(group="breaker.open")
def test_open_pybreaker(benchmark: Any) -> None:
    pybreaker = pytest.importorskip("pybreaker")
    cb = pybreaker.CircuitBreaker(fail_max=5, reset_timeout=OPEN_SECONDS)
    cb.open()
    assert benchmark(_rejected(lambda: cb.call(f), pybreaker.CircuitBreakerError)) is True


@pytest.mark.benchmark(group="breaker.open")
def test_open_circuitbreaker(benchmark: Any) -> None:
    circuitbreaker = pytest.importorskip("circuitbreaker")
    cb = _circuitbreaker("bench-open")
    guarded, failing = cb(f), cb(boom)
    for _ in range(5):
        _rejected(failing, Boom)
    assert benchmark(_rejected(guarded, circuitbreaker.CircuitBreakerError)) is True


@pytest.mark.benchmark(group="breaker.open")
def test_open_aiobreaker(benchmark: Any) -> None:
    aiobreaker = pytest.importorskip("aiobreaker")
    cb = _aiobreaker()
    cb.open()
    assert benchmark(_rejected(lambda: cb.call(f), aiobreaker.CircuitBreakerError)) is True


@pytest.mark.benchmark(group="breaker.open")
def test_open_purgatory(benchmark: Any) -> None:
    purgatory = pytest.importorskip("purgatory")
    from purgatory.domain.model import OpenedState

    factory = purgatory.SyncCircuitBreakerFactory(default_threshold=5, default_ttl=OPEN_SECONDS)

    def fail() -> None:
        with factory.get_breaker("bench-open"):
            boom()

    def guarded() -> int:
        with factory.get_breaker("bench-open"):
            return f()

    for _ in range(5):
        _rejected(fail, Boom)
    assert benchmark(_rejected(guarded, OpenedState)) is True


# -- with / decorator ---------------------------------------------------------------------------


@pytest.mark.benchmark(group="breaker.with")
def test_with_baseline_nullcontext(benchmark: Any) -> None:
    null = contextlib.nullcontext()

    def run() -> None:
        with null:
            pass

    benchmark(run)


@pytest.mark.benchmark(group="breaker.with")
def test_with(benchmark: Any, fb: types.SimpleNamespace) -> None:
    cb = _breaker(fb)

    def run() -> None:
        with cb:
            pass

    benchmark(run)
    assert cb.metrics().successes > 0


@pytest.mark.benchmark(group="breaker.with")
def test_with_floor(benchmark: Any, floor: Any) -> None:
    # empty __enter__/__exit__ on a Cython object: what the interpreter charges any `with`
    def run() -> None:
        with floor:
            pass

    benchmark(run)


@pytest.mark.benchmark(group="breaker.with")
def test_with_pybreaker(benchmark: Any) -> None:
    pybreaker = pytest.importorskip("pybreaker")
    cb = pybreaker.CircuitBreaker(fail_max=5, reset_timeout=OPEN_SECONDS)

    def run() -> None:
        with cb.calling():
            pass

    benchmark(run)


@pytest.mark.benchmark(group="breaker.with")
def test_with_purgatory(benchmark: Any) -> None:
    purgatory = pytest.importorskip("purgatory")
    factory = purgatory.SyncCircuitBreakerFactory(default_threshold=5, default_ttl=OPEN_SECONDS)

    def run() -> None:
        with factory.get_breaker("bench-with"):
            pass

    benchmark(run)


@pytest.mark.benchmark(group="breaker.decorator")
def test_decorator_baseline_f(benchmark: Any) -> None:
    assert benchmark(f) == 1


@pytest.mark.benchmark(group="breaker.decorator")
def test_decorator(benchmark: Any, fb: types.SimpleNamespace) -> None:
    assert benchmark(_breaker(fb)(f)) == 1


@pytest.mark.benchmark(group="breaker.decorator")
def test_decorator_pybreaker(benchmark: Any) -> None:
    pybreaker = pytest.importorskip("pybreaker")
    assert benchmark(pybreaker.CircuitBreaker(fail_max=5, reset_timeout=OPEN_SECONDS)(f)) == 1


@pytest.mark.benchmark(group="breaker.decorator")
def test_decorator_circuitbreaker(benchmark: Any) -> None:
    assert benchmark(_circuitbreaker("bench-deco")(f)) == 1


@pytest.mark.benchmark(group="breaker.decorator")
def test_decorator_aiobreaker(benchmark: Any) -> None:
    assert benchmark(_aiobreaker()(f)) == 1


@pytest.mark.benchmark(group="breaker.decorator")
def test_decorator_purgatory(benchmark: Any) -> None:
    purgatory = pytest.importorskip("purgatory")
    factory = purgatory.SyncCircuitBreakerFactory(default_threshold=5, default_ttl=OPEN_SECONDS)
    assert benchmark(factory("bench-deco")(f)) == 1


# -- async ---------------------------------------------------------------------------------------


@pytest.mark.benchmark(group="breaker.async")
def test_async_baseline_af(benchmark: Any, drive: Drive) -> None:
    async def run() -> int:
        return await af()

    assert benchmark(drive, run) == 1


@pytest.mark.benchmark(group="breaker.async")
def test_async_call(benchmark: Any, fb: types.SimpleNamespace, drive: Drive) -> None:
    cb = _breaker(fb)

    async def run() -> Any:
        return await cb.call_async(af)

    assert benchmark(drive, run) == 1


@pytest.mark.benchmark(group="breaker.async")
def test_async_with(benchmark: Any, fb: types.SimpleNamespace, drive: Drive) -> None:
    cb = _breaker(fb)

    async def run() -> int:
        async with cb:
            return await af()

    assert benchmark(drive, run) == 1


@pytest.mark.benchmark(group="breaker.async")
def test_async_decorator(benchmark: Any, fb: types.SimpleNamespace, drive: Drive) -> None:
    guarded = _breaker(fb)(af)

    async def run() -> Any:
        return await guarded()

    assert benchmark(drive, run) == 1


@pytest.mark.benchmark(group="breaker.async")
def test_async_with_floor(benchmark: Any, floor: Any, drive: Drive) -> None:
    # empty __aenter__/__aexit__ coroutines on a Cython object
    async def run() -> int:
        async with floor:
            return await af()

    assert benchmark(drive, run) == 1


@pytest.mark.benchmark(group="breaker.async")
def test_async_decorator_floor(benchmark: Any, floor: Any, drive: Drive) -> None:
    # a compiled wrapper that returns af()'s coroutine: Floor().call(af)
    async def run() -> Any:
        return await floor.call(af)

    assert benchmark(drive, run) == 1


@pytest.mark.benchmark(group="breaker.async")
def test_async_circuitbreaker(benchmark: Any, drive: Drive) -> None:
    guarded = _circuitbreaker("bench-async")(af)

    async def run() -> Any:
        return await guarded()

    assert benchmark(drive, run) == 1


@pytest.mark.benchmark(group="breaker.async")
def test_async_aiobreaker(benchmark: Any, drive: Drive) -> None:
    cb = _aiobreaker()

    async def run() -> Any:
        return await cb.call_async(af)

    assert benchmark(drive, run) == 1


@pytest.mark.benchmark(group="breaker.async")
def test_async_purgatory(benchmark: Any, drive: Drive) -> None:
    purgatory = pytest.importorskip("purgatory")
    factory = purgatory.AsyncCircuitBreakerFactory(default_threshold=5, default_ttl=OPEN_SECONDS)

    async def run() -> int:
        async with await factory.get_breaker("bench-async"):
            return await af()

    assert benchmark(drive, run) == 1
