"""Checked by mypy (tests/test_typing.py), never run: the public API keeps its types."""

from __future__ import annotations

import datetime
from typing import AsyncIterator, Iterator

from typing_extensions import assert_type  # (typing.assert_type is 3.11+)

import fastbreaker as fb

breaker = fb.CircuitBreaker(3, datetime.timedelta(seconds=5), window=10, name="db")
assert_type(breaker.allow(), bool)
assert_type(breaker.state, fb.State)
assert_type(breaker.retry_after, float)
assert_type(breaker.metrics().permitted, int)
breaker.record_success(0.25)
breaker.record_failure()


@breaker
def fetch(host: str, *, port: int = 80) -> bytes:
    return b""


@breaker
async def afetch(host: str) -> int:
    return 1


@breaker
def numbers(n: int) -> Iterator[int]:
    yield n


@breaker
async def anumbers(n: int) -> AsyncIterator[int]:
    yield n


class Client:
    async def __call__(self, path: str) -> bytes:
        return b""


client = breaker(Client())


assert_type(fetch("a", port=1), bytes)
assert_type(numbers(1), Iterator[int])
assert_type(anumbers(1), AsyncIterator[int])
assert_type(client, Client)
assert_type(breaker.call(fetch, "h", port=2), bytes)


async def use() -> None:
    assert_type(await afetch("x"), int)
    assert_type(await client("/"), bytes)
    assert_type(await breaker.call_async(afetch, "x"), int)
    with breaker:
        pass
    async with breaker:
        pass


@breaker.on_state_change
def changed(b: object, old: fb.State, new: fb.State) -> None:
    pass


try:
    breaker.call(fetch, "h")
except fb.CircuitOpenError as e:
    assert_type(e.retry_after, float)
    assert_type(e.state, fb.State)


def default_page(exc: Exception, host: str) -> bytes:
    return b""


@fb.fallback(default_page)
@breaker
def page(host: str) -> bytes:
    return b""


@fb.fallback(lambda exc, host: 0, on=lambda exc: isinstance(exc, OSError))
async def apage(host: str) -> int:
    return 1


@fb.stale_on_error(5, stale_ttl=datetime.timedelta(minutes=1), key=lambda host, **kw: host)
def cached(host: str, *, port: int = 80) -> bytes:
    return b""


assert_type(page("a"), bytes)
assert_type(cached("a", port=1), bytes)
assert_type(page.metrics(), fb.FallbackMetrics)
assert_type(cached.metrics().stale_served, int)
assert_type(cached.metrics().fallback_active_seconds, float)


async def use_degraded() -> None:
    assert_type(await apage("x"), int)


def use_region() -> None:
    # never run (mypy only): the objects of a SharedRegion are the ordinary classes
    region = fb.SharedRegion("shop", size=1 << 20)
    assert_type(region.breaker("payments", failure_threshold=5), fb.CircuitBreaker)
    assert_type(region.breaker_map("hosts", capacity=100), fb.BreakerMap)
    assert_type(region.retry_budget("rpc", ratio=0.1), fb.RetryBudget)
    assert_type(region.bulkhead("db", 8), fb.Bulkhead)
    assert_type(region.breaker_map("hosts", capacity=100).allow("a"), bool)
