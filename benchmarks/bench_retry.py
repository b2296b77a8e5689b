"""Benchmarks: RetryBudget on both cores, and the cost of ``@fb.retry`` when nothing fails.

    python -m pytest benchmarks/bench_retry.py --benchmark-enable \
        --benchmark-columns=min,median,mean,ops

Groups (compare within a group, same run, same machine):

* ``budget.record_success`` / ``budget.allow_retry``: compiled vs pure-Python twin, next to the
  floor (an empty method call on a Cython class).
* ``retry.sync`` / ``retry.async``: a call that succeeds first time, bare and wrapped by
  fastbreaker, tenacity and stamina with equivalent settings (3 attempts, exponential full
  jitter). The async group drives each coroutine with ``send(None)``, without an event loop,
  so that only the wrappers are measured.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

import fastbreaker

# The fb, floor and drive fixtures come from benchmarks/conftest.py.


# --- RetryBudget ----------------------------------------------------------------------------------


@pytest.mark.benchmark(group="budget.record_success")
def test_record_success_full(benchmark: Any, fb: types.SimpleNamespace) -> None:
    """The healthy steady state: the bucket is full, a success is one atomic load."""
    b = fb.RetryBudget()
    benchmark(b.record_success)
    assert b.tokens == 100.0


@pytest.mark.benchmark(group="budget.record_success")
def test_record_success_filling(benchmark: Any, fb: types.SimpleNamespace) -> None:
    """Below capacity: every success is a compare-and-swap (huge capacity keeps it below)."""
    b = fb.RetryBudget(ratio=1e-6, capacity=1e12, min_per_sec=0)
    for _ in range(10):
        b.allow_retry()
    benchmark(b.record_success)


@pytest.mark.benchmark(group="budget.record_success")
def test_record_success_floor(benchmark: Any, floor: Any) -> None:
    benchmark(floor.record_success)


@pytest.mark.benchmark(group="budget.allow_retry")
def test_allow_retry_granted(benchmark: Any, fb: types.SimpleNamespace) -> None:
    """A token is taken; the refill reads CLOCK_MONOTONIC (default min_per_sec=1)."""
    b = fb.RetryBudget(capacity=1e12)
    assert benchmark(b.allow_retry) is True


@pytest.mark.benchmark(group="budget.allow_retry")
def test_allow_retry_refused(benchmark: Any, fb: types.SimpleNamespace) -> None:
    """An empty bucket with no reserve: the refusal path (no clock read)."""
    b = fb.RetryBudget(ratio=0, capacity=1, min_per_sec=0)
    b.allow_retry()
    assert benchmark(b.allow_retry) is False


@pytest.mark.benchmark(group="budget.allow_retry")
def test_allow_retry_floor(benchmark: Any, floor: Any) -> None:
    benchmark(floor.allow)


# --- @retry on a call that succeeds first time --------------------------------------------------


def work(x: int) -> int:
    return x + 1


async def awork(x: int) -> int:
    return x + 1


def _fastbreaker(fn: Callable[..., Any], **options: Any) -> Callable[..., Any]:
    return fastbreaker.retry(on=ConnectionError, attempts=3, base=0.05, cap=2.0, **options)(fn)


def _tenacity(fn: Callable[..., Any]) -> Callable[..., Any]:
    tenacity = pytest.importorskip("tenacity")
    return tenacity.retry(  # type: ignore[no-any-return]
        retry=tenacity.retry_if_exception_type(ConnectionError),
        stop=tenacity.stop_after_attempt(3),
        wait=tenacity.wait_random_exponential(multiplier=0.05, max=2.0),
        reraise=True,
    )(fn)


def _stamina(fn: Callable[..., Any]) -> Callable[..., Any]:
    stamina = pytest.importorskip("stamina")
    return stamina.retry(  # type: ignore[no-any-return]
        on=ConnectionError, attempts=3, timeout=None, wait_initial=0.05, wait_max=2.0
    )(fn)


SYNC: dict[str, Callable[[], Callable[..., Any]]] = {
    "bare": lambda: work,
    "fastbreaker": lambda: _fastbreaker(work),
    "fastbreaker+budget": lambda: _fastbreaker(work, budget=fastbreaker.RetryBudget()),
    "fastbreaker+deadline": lambda: _fastbreaker(work, deadline=30.0),
    "tenacity": lambda: _tenacity(work),
    "stamina": lambda: _stamina(work),
}


@pytest.mark.benchmark(group="retry.sync")
@pytest.mark.parametrize("name", list(SYNC))
def test_retry_sync_success(benchmark: Any, name: str) -> None:
    fn = SYNC[name]()
    assert benchmark(fn, 1) == 2


ASYNC: dict[str, Callable[[], Callable[..., Coroutine[Any, Any, int]]]] = {
    "bare": lambda: awork,
    "fastbreaker": lambda: _fastbreaker(awork),
    "fastbreaker+budget": lambda: _fastbreaker(awork, budget=fastbreaker.RetryBudget()),
    "tenacity": lambda: _tenacity(awork),
    "stamina": lambda: _stamina(awork),
}


@pytest.mark.benchmark(group="retry.async")
@pytest.mark.parametrize("name", list(ASYNC))
def test_retry_async_success(benchmark: Any, drive: Any, name: str) -> None:
    call = functools.partial(ASYNC[name](), 1)
    assert benchmark(drive, call) == 2
