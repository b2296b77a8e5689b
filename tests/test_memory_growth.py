"""Long-running paths keep their memory flat (tracemalloc).

Each test runs a step many times after a warm-up and fails on growth proportional to the work
done: ``assert_flat`` measures the traced memory left after ``small`` and after ``large`` steps
(garbage collected) and bounds the extra bytes per extra step. A leak of one small object per
step (a tuple, a list entry, a dict slot) is tens of bytes per step; the bound is a few bytes.
"""

from __future__ import annotations

import contextvars
from typing import Any

import pytest
from memory_support import (  # noqa: E402
    aassert_flat,
    ameasure_growth,
    assert_flat,
    check_flat,
    measure_growth,
    not_on_free_threading,
)

import fastbreaker
from fastbreaker import _calls

pytestmark = not_on_free_threading


def test_the_measure_sees_a_leak() -> None:
    kept: list[object] = []
    with pytest.raises(AssertionError, match="memory grows"):
        assert_flat(lambda: kept.append(()), 200, 2_000)


# -- rejections ----------------------------------------------------------------------------------------
def test_rejections_keep_memory_flat(fb, clock) -> None:
    b = fb.CircuitBreaker(clock=clock)
    b.trip()

    def work() -> None:
        pass

    guarded = b(work)

    def step() -> None:
        for reject in (lambda: b.call(work), guarded, b.__enter__):
            try:
                reject()
            except fb.CircuitOpenError as exc:
                str(exc)

    assert_flat(step, 1_000, 10_000)
    assert b.metrics().rejected > 30_000


# -- retries ---------------------------------------------------------------------------------------------
class Flaky:
    """Fails every other call with ConnectionError."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> str:
        self.n += 1
        if self.n % 2:
            raise ConnectionError("flaky")
        return "ok"


def test_retries_with_a_budget_keep_memory_flat(fb, clock) -> None:
    budget = fb.RetryBudget(ratio=0.5, capacity=10, min_per_sec=0, clock=clock)
    fetch = fb.retry(on=ConnectionError, attempts=2, budget=budget)(Flaky())
    with fastbreaker.testing.instant_retries() as delays:

        def step() -> None:
            try:
                fetch()
            except ConnectionError:
                pass  # refused by the budget
            delays.clear()

        assert_flat(step)


async def test_async_retries_with_a_budget_keep_memory_flat(fb, clock) -> None:
    budget = fb.RetryBudget(ratio=0.5, capacity=10, min_per_sec=0, clock=clock)
    flaky = Flaky()

    @fb.retry(on=ConnectionError, attempts=2, budget=budget)
    async def fetch() -> str:
        return flaky()

    with fastbreaker.testing.instant_retries() as delays:

        async def step() -> None:
            try:
                await fetch()
            except ConnectionError:
                pass
            delays.clear()

        await aassert_flat(step)


# -- generators guarded by @breaker, and `with` blocks that exit in another context ------------------
def test_guarded_generators_keep_memory_flat(fb, clock) -> None:
    b = fb.CircuitBreaker(clock=clock)

    @b
    def gen() -> Any:
        yield 1
        yield 2

    def step() -> None:
        assert list(gen()) == [1, 2]
        g = gen()
        next(g)
        g.close()

    assert_flat(step)


async def test_guarded_async_generators_keep_memory_flat(fb, clock) -> None:
    b = fb.CircuitBreaker(clock=clock)

    @b
    async def agen() -> Any:
        yield 1
        yield 2

    async def step() -> None:
        assert [x async for x in agen()] == [1, 2]
        a = agen()
        await a.__anext__()
        await a.aclose()

    await aassert_flat(step)


def test_with_blocks_exiting_in_another_context_keep_memory_flat(fb, clock) -> None:
    b = fb.CircuitBreaker(failure_threshold=10**9, clock=clock)

    def gen() -> Any:
        with b:
            yield 1

    def step() -> None:
        g = gen()
        next(g)
        contextvars.copy_context().run(g.close)  # exits in a foreign context
        with b:
            pass

    assert_flat(step)
    if fb.COMPILED and type(b).__module__ == "fastbreaker._breaker_c":
        from fastbreaker import _breaker_c

        assert _breaker_c.open_with_blocks(b) == 0
    else:
        assert not any(node.breaker is b for node in _calls._open_blocks)
    m = b.metrics()
    assert m.permitted == m.successes + m.ignored


# -- the httpx transport ----------------------------------------------------------------------------
httpx = pytest.importorskip("httpx")


def handler(request: Any) -> Any:
    return httpx.Response(503 if request.url.host.startswith("bad") else 200)


def test_httpx_transport_keeps_memory_flat(fb, clock) -> None:
    from fastbreaker.contrib.httpx import BreakerTransport

    m = fb.BreakerMap(failure_threshold=2, clock=clock)
    transport = BreakerTransport(httpx.MockTransport(handler), breakers=m)
    with httpx.Client(transport=transport) as client:

        def step() -> None:
            assert client.get("http://ok.example/").status_code == 200
            try:  # fails twice, then rejected (OPEN) for the rest of the run
                client.get("http://bad.example/")
            except fb.CircuitOpenError:
                pass

        check_flat(
            measure_growth(step, 200, warmup=50),
            measure_growth(step, 1_500, warmup=0),
            200,
            1_500,
            per_step=8.0,
        )
    assert m[fastbreaker.contrib.httpx.Origin.of("http://bad.example/")].metrics().rejected > 500


async def test_async_httpx_transport_keeps_memory_flat(fb, clock) -> None:
    from fastbreaker.contrib.httpx import AsyncBreakerTransport

    m = fb.BreakerMap(failure_threshold=2, clock=clock)
    transport = AsyncBreakerTransport(httpx.MockTransport(handler), breakers=m)
    async with httpx.AsyncClient(transport=transport) as client:

        async def step() -> None:
            assert (await client.get("http://ok.example/")).status_code == 200
            try:
                await client.get("http://bad.example/")
            except fb.CircuitOpenError:
                pass

        check_flat(
            await ameasure_growth(step, 200, warmup=50),
            await ameasure_growth(step, 1_500, warmup=0),
            200,
            1_500,
            per_step=8.0,
        )


# -- shared memory (SharedRegion) -----------------------------------------------------------------
def test_shared_objects_keep_memory_flat(fb, tmp_path) -> None:
    # Every long-running path of the shared objects: calls and trips of a shared breaker, a
    # shared map whose keys keep changing (evictions, rebinding to new slots), a budget that
    # deposits and withdraws, a bulkhead taken and released. Each step leaves nothing behind in
    # the process: the state is the region's, fixed in size.
    import uuid

    name = "fbm-" + uuid.uuid4().hex[:12]
    clock = fb.testing.FakeClock()
    region = fb.SharedRegion(name, size=1 << 20, clock=clock)
    try:
        b = region.breaker("up", failure_threshold=3, reset_timeout=1.0)
        m = region.breaker_map("hosts", capacity=64, failure_threshold=2, reset_timeout=1.0)
        budget = region.retry_budget("rb", ratio=0.5, capacity=10)
        bh = region.bulkhead("bh", 4)
        keys = [f"host-{i}" for i in range(256)]  # 4x the capacity: the map evicts all along
        n = [0]

        def boom() -> None:
            raise ConnectionError

        def step() -> None:
            i = n[0] = n[0] + 1
            b.call(len, "x")
            if i % 50 == 0:  # trip, wait out the open period, recover through a probe
                for _ in range(3):
                    try:
                        b.call(boom)
                    except ConnectionError:
                        pass
                clock.advance(1.5)
                b.call(len, "x")
            key = keys[i % len(keys)]
            m.call(key, len, key)
            m.allow(key)
            m.record_success(key)
            budget.record_success()
            budget.allow_retry()
            if bh.try_acquire():
                bh.release()

        assert_flat(step, 300, 1_500)
        assert b.metrics().opened > 30
        assert len(m) <= 64
        mm = b.metrics()
        assert mm.permitted == mm.successes + mm.failures + mm.ignored + mm.stale
    finally:
        region.close()
        region.unlink()
