"""Benchmarks: the compatibility modules against the packages they replace.

    python -m pytest benchmarks/bench_compat.py --benchmark-enable --benchmark-columns=min,median,mean,ops

Groups (compare within a group, same run, same machine):

* ``compat.pybreaker.success`` / ``compat.pybreaker.open``: a decorated function that succeeds,
  and one refused by an open circuit, with the original pybreaker and with
  ``fastbreaker.compat.pybreaker`` on the compiled core (``c``) and on the pure-Python twin
  (``python``).
* ``compat.circuitbreaker.success`` / ``compat.circuitbreaker.open``: the same with
  ``@circuit`` from circuitbreaker and from ``fastbreaker.compat.circuitbreaker``.

The open groups catch the breaker's error inside the measured function, as a caller would.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest

import fastbreaker
import fastbreaker.compat.circuitbreaker as compat_circuitbreaker
import fastbreaker.compat.pybreaker as compat_pybreaker
from fastbreaker import _breaker_py

IMPLS = ["c", "python"] if fastbreaker.COMPILED else ["python"]


def _core(impl: str) -> Any:
    if impl == "c":
        from fastbreaker import _breaker_c

        return _breaker_c.CircuitBreaker
    return _breaker_py.CircuitBreaker


def _on(cls: type, impl: str) -> Any:
    """``cls`` (a compat breaker class) driving the ``impl`` core."""
    return type(cls.__name__, (cls,), {"_core_breaker_cls": _core(impl)})


def work() -> int:
    return 1


def fail() -> int:
    raise ConnectionError("down")


def refused(fn: Callable[[], int], error: type[BaseException]) -> Callable[[], bool]:
    def attempt() -> bool:
        try:
            fn()
        except error:
            return True
        return False

    return attempt


# --- pybreaker ------------------------------------------------------------------------------------


@pytest.mark.benchmark(group="compat.pybreaker.success")
def test_pybreaker_success_original(benchmark: Any) -> None:
    pybreaker = pytest.importorskip("pybreaker")
    fn = pybreaker.CircuitBreaker()(work)
    assert benchmark(fn) == 1


@pytest.mark.benchmark(group="compat.pybreaker.success")
@pytest.mark.parametrize("impl", IMPLS)
def test_pybreaker_success_compat(benchmark: Any, impl: str) -> None:
    fn = _on(compat_pybreaker.CircuitBreaker, impl)()(work)
    assert benchmark(fn) == 1


@pytest.mark.benchmark(group="compat.pybreaker.open")
def test_pybreaker_open_original(benchmark: Any) -> None:
    pybreaker = pytest.importorskip("pybreaker")
    breaker = pybreaker.CircuitBreaker(reset_timeout=3600)
    breaker.open()
    assert benchmark(refused(breaker(work), pybreaker.CircuitBreakerError)) is True


@pytest.mark.benchmark(group="compat.pybreaker.open")
@pytest.mark.parametrize("impl", IMPLS)
def test_pybreaker_open_compat(benchmark: Any, impl: str) -> None:
    breaker = _on(compat_pybreaker.CircuitBreaker, impl)(reset_timeout=3600)
    breaker.open()
    assert benchmark(refused(breaker(work), compat_pybreaker.CircuitBreakerError)) is True


# --- circuitbreaker -------------------------------------------------------------------------------


def _open_circuit(circuit: Any, cls: Any) -> Callable[[], int]:
    fn = circuit(failure_threshold=1, recovery_timeout=3600, cls=cls)(fail)
    try:
        fn()
    except ConnectionError:
        pass
    return fn  # type: ignore[no-any-return]


@pytest.mark.benchmark(group="compat.circuitbreaker.success")
def test_circuitbreaker_success_original(benchmark: Any) -> None:
    circuitbreaker = pytest.importorskip("circuitbreaker")
    fn = circuitbreaker.circuit(work)
    assert benchmark(fn) == 1


@pytest.mark.benchmark(group="compat.circuitbreaker.success")
@pytest.mark.parametrize("impl", IMPLS)
def test_circuitbreaker_success_compat(benchmark: Any, impl: str) -> None:
    fn = compat_circuitbreaker.circuit(cls=_on(compat_circuitbreaker.CircuitBreaker, impl))(work)
    assert benchmark(fn) == 1


@pytest.mark.benchmark(group="compat.circuitbreaker.open")
def test_circuitbreaker_open_original(benchmark: Any) -> None:
    circuitbreaker = pytest.importorskip("circuitbreaker")
    fn = _open_circuit(circuitbreaker.circuit, circuitbreaker.CircuitBreaker)
    assert benchmark(refused(fn, circuitbreaker.CircuitBreakerError)) is True


@pytest.mark.benchmark(group="compat.circuitbreaker.open")
@pytest.mark.parametrize("impl", IMPLS)
def test_circuitbreaker_open_compat(benchmark: Any, impl: str) -> None:
    fn = _open_circuit(
        compat_circuitbreaker.circuit, _on(compat_circuitbreaker.CircuitBreaker, impl)
    )
    assert benchmark(refused(fn, compat_circuitbreaker.CircuitBreakerError)) is True
