"""RateLimiter, RateLimiterMap and Rate (issue 29), on both cores (``fb`` fixture), fake clock.

Exactness over random schedules and the step-by-step agreement of the cores are in
``test_ratelimit_hypothesis.py``; the nogil races in ``test_ratelimit_stress.py``.
"""

from __future__ import annotations

import asyncio
import gc
import math
import selectors
import tracemalloc
import types
from typing import Any

import pytest

from fastbreaker import _ratelimit
from fastbreaker.testing import FakeClock


# -- Rate ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "limit", "per"),
    [("10/s", 10, 1), ("600/min", 600, 60), ("10000/h", 10000, 3600), ("100000/day", 100000, 86400),
     ("5/2s", 5, 2), (" 3 / 250ms ", 3, 0.25), ("7/hours", 7, 3600)],
)  # fmt: skip
def test_rate_parse(fb: Any, text: str, limit: int, per: float) -> None:
    r = fb.Rate.parse(text)
    assert r == fb.Rate(limit, per)
    assert r.interval_ns == math.ceil(per * 10**9 / limit)
    assert r.tolerance_ns == limit * r.interval_ns


@pytest.mark.parametrize("text", ["", "10", "10/", "/s", "0/s", "10/0s", "-1/s", "1.5/s", "10/week",
                                  "10/s/s", "ten/s", "10 per s"])  # fmt: skip
def test_rate_parse_refuses_other_text_naming_it(fb: Any, text: str) -> None:
    with pytest.raises(ValueError, match="cannot parse rate") as info:
        fb.Rate.parse(text)
    assert repr(text) in str(info.value)


def test_interval_is_rounded_up(fb: Any) -> None:
    # 3 per second: T = 333,333,333.33 ns -> 333,333,334; limit * T never falls below per.
    for limit, per in [(3, 1), (7, 0.001), (10**6, 1), (3, 10**-8)]:
        r = fb.Rate(limit, per)
        assert r.interval_ns * limit >= round(per * 1e9)
        assert (r.interval_ns - 1) * limit < round(per * 1e9)


@pytest.mark.parametrize(
    ("args", "kwargs", "exc", "words"),
    [((0, 1), {}, ValueError, ["limit", "> 0"]), ((-1, 1), {}, ValueError, ["limit", "> 0"]),
     ((math.inf, 1), {}, ValueError, ["limit", "finite"]), ((math.nan, 1), {}, ValueError, ["limit"]),
     (("10", 1), {}, TypeError, ["limit"]), ((True, 1), {}, TypeError, ["limit"]),
     ((1, 0), {}, ValueError, ["per", "> 0"]), ((1, -1), {}, ValueError, ["per"]),
     ((1, math.inf), {}, ValueError, ["per"]), ((1, "1s"), {}, TypeError, ["per"]),
     ((1, 1), {"burst": 0}, ValueError, ["burst", "> 0"]),
     ((10, 1), {"burst": 0.5}, ValueError, ["burst", ">= 1"]),
     ((1, 1e9), {"burst": 1e9}, ValueError, ["burst", "at most"])],
)  # fmt: skip
def test_rate_validation_names_the_parameter_and_range(
    fb: Any, args: tuple[Any, ...], kwargs: dict[str, Any], exc: type, words: list[str]
) -> None:
    with pytest.raises(exc) as info:
        fb.Rate(*args, **kwargs)
    for w in words:
        assert w in str(info.value)


def test_limiter_validation(fb: Any, clock: FakeClock) -> None:
    with pytest.raises(ValueError, match="rates: give 1 to 8"):
        fb.RateLimiter(clock=clock)
    with pytest.raises(ValueError, match="rates: give 1 to 8"):
        fb.RateLimiter(*["1/s"] * 9)
    with pytest.raises(TypeError, match="rates must be Rate"):
        fb.RateLimiter(10)
    with pytest.raises(ValueError, match="'10/x'"):
        fb.RateLimiter("10/x")
    with pytest.raises(TypeError, match="name"):
        fb.RateLimiter("1/s", name=3)
    with pytest.raises(TypeError, match="clock"):
        fb.RateLimiter("1/s", clock=5)
    for bad in (0, -1, 2**31 + 1, True, "2", 2**40):
        with pytest.raises((TypeError, ValueError), match="max_keys.*\\[1, 2\\*\\*31\\]"):
            fb.RateLimiterMap("1/s", max_keys=bad)


@pytest.mark.parametrize("make", ["limiter", "map"])
def test_weight_validation_names_weight_and_burst(fb: Any, clock: FakeClock, make: str) -> None:
    if make == "limiter":
        lim = fb.RateLimiter(fb.Rate(100, 1, burst=20), "5/s", clock=clock)
        calls = [lim.try_acquire, lim.retry_after, lim.refund, lim.acquire]
    else:
        m = fb.RateLimiterMap(fb.Rate(100, 1, burst=20), "5/s", clock=clock)
        calls = [
            lambda w: m.try_acquire("k", w),
            lambda w: m.retry_after("k", w),
            lambda w: m.refund("k", w),
            lambda w: m.acquire("k", w),
        ]
    for call in calls:
        with pytest.raises(ValueError, match=r"weight 6 exceeds the burst of Rate\(5, 1.0\) \(5\)"):
            call(6)
        with pytest.raises(ValueError, match=r"weight must be an int >= 1, got 0"):
            call(0)
        with pytest.raises(ValueError, match="weight"):
            call(2**70)
        with pytest.raises(TypeError, match="weight must be an int"):
            call(1.0)
    assert (lim if make == "limiter" else m).metrics()[:2] == (0, 0)


# -- GCRA ----------------------------------------------------------------------------------------
def test_burst_then_one_per_interval(fb: Any, clock: FakeClock) -> None:
    r = fb.Rate(10, 1, burst=4)
    lim = fb.RateLimiter(r, clock=clock)
    assert [lim.try_acquire() for _ in range(5)] == [True] * 4 + [False]
    assert lim.retry_after() == r.interval_ns / 1e9
    clock._ns += r.interval_ns - 1
    assert not lim.try_acquire()
    clock._ns += 1
    assert lim.try_acquire() and not lim.try_acquire()
    assert lim.metrics() == fb.RateLimiterMetrics(5, 3, 5, 3, 0)


def test_weighted_requests(fb: Any, clock: FakeClock) -> None:
    r = fb.Rate(100, 60)  # tokens per minute
    lim = fb.RateLimiter(r, clock=clock)
    assert lim.try_acquire(70)
    assert not lim.try_acquire(31)
    assert lim.retry_after(31) == r.interval_ns / 1e9
    assert lim.try_acquire(30)
    assert lim.metrics() == fb.RateLimiterMetrics(2, 1, 100, 31, 0)


def _run(lim: Any, clock: FakeClock, script: list[tuple[int, int]]) -> list[object]:
    out: list[object] = []
    for advance, w in script:
        clock._ns += advance
        out.append((lim.try_acquire(w), lim._retry_after_ns(1), lim._retry_after_ns(w)))
    return out


def test_a_refused_request_charges_no_rate(fb: Any) -> None:
    # Class: all or nothing. A limiter that refused requests (each refused by one rate after
    # another rate would have admitted it) behaves afterwards exactly like one that never saw them.
    rates = (fb.Rate(10, 1), fb.Rate(3, 1), fb.Rate(30, 60))
    c1, c2 = FakeClock(10**12), FakeClock(10**12)
    a, b = fb.RateLimiter(*rates, clock=c1), fb.RateLimiter(*rates, clock=c2)
    for lim in (a, b):
        assert all(lim.try_acquire() for _ in range(3))
    for w in (1, 2, 3, 1):
        assert not a.try_acquire(w)  # refused by the 3/s rate, not by 10/s nor 30/min
    script = [(10**8 * (i % 7), 1 + i % 3) for i in range(60)]
    assert _run(a, c1, script) == _run(b, c2, script)


def test_retry_after_is_exact_for_each_rate(fb: Any, clock: FakeClock) -> None:
    lim = fb.RateLimiter(fb.Rate(5, 1, burst=2), fb.Rate(20, 60), clock=clock)
    for _ in range(40):
        wait = lim._retry_after_ns(2)
        assert lim.retry_after(2) == wait / 1e9
        if wait:
            clock._ns += wait - 1
            assert not lim.try_acquire(2)
            clock._ns += 1
        assert lim.try_acquire(2)


def test_refund_gives_back_but_never_beyond_fresh(fb: Any, clock: FakeClock) -> None:
    r = fb.Rate(10, 1)
    lim = fb.RateLimiter(r, "100/min", clock=clock)
    assert lim.try_acquire(10) and not lim.try_acquire()
    lim.refund(3)
    assert [lim.try_acquire() for _ in range(4)] == [True] * 3 + [False]
    lim.refund(10)
    lim.refund(10)  # more than was charged: capacity stops at a fresh limiter's
    assert [lim.try_acquire() for _ in range(11)] == [True] * 10 + [False]


# -- the call forms ------------------------------------------------------------------------------
def test_with_call_and_decorator_charge_one_or_raise(fb: Any, clock: FakeClock) -> None:
    lim = fb.RateLimiter(fb.Rate(1, 2, burst=1), name="api", clock=clock)

    @lim
    def f(x: int) -> int:
        return x + 1

    assert f.__name__ == "f"
    assert f(1) == 2
    for form in (lambda: f(1), lambda: lim.call(f, 1), lambda: lim.__enter__()):
        with pytest.raises(fb.RateLimitedError) as info:
            form()
        e = info.value
        assert isinstance(e, fb.BreakerError)
        assert (e.name, e.retry_after, e.weight) == ("api", 2.0, 1)
        assert "rate limiter 'api' refused weight 1: retry after 2.000s" == str(e)
    clock.advance(2)
    with lim:
        pass
    clock.advance(2)
    assert lim.call(f.__wrapped__, 5) == 6
    assert lim.metrics().admitted == 3


def test_async_forms(fb: Any, clock: FakeClock) -> None:
    lim = fb.RateLimiter("1/s", clock=clock)
    m = fb.RateLimiterMap("1/s", clock=clock)

    @lim
    async def g() -> str:
        return "g"

    async def main() -> None:
        assert await g() == "g"
        with pytest.raises(fb.RateLimitedError):
            await g()
        clock.advance(1)
        async with lim:
            pass
        with pytest.raises(fb.RateLimitedError):
            async with lim:
                pass
        clock.advance(1)
        assert await lim.call_async(g.__wrapped__) == "g"
        assert await m.call_async("k", g.__wrapped__) == "g"
        with pytest.raises(fb.RateLimitedError):
            await m.call_async("k", g.__wrapped__)
        assert m.call("j", lambda: 4) == 4

    asyncio.run(main())


# -- waiting (no real sleeps: time.sleep advances the fake clock) ---------------------------------
@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch, clock: FakeClock) -> list[float]:
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        clock._ns += math.ceil(s * 1e9)

    monkeypatch.setattr(_ratelimit, "time", types.SimpleNamespace(sleep=sleep))
    return slept


def test_acquire_sleeps_exactly_retry_after(fb: Any, clock: FakeClock, sleeps: list[float]) -> None:
    r = fb.Rate(4, 1)
    lim = fb.RateLimiter(r, clock=clock)
    m = fb.RateLimiterMap(r, clock=clock)
    for _ in range(4):
        lim.acquire()
        m.acquire("k")
    assert sleeps == []
    lim.acquire(2)
    assert sleeps == [2 * r.interval_ns / 1e9]
    m.acquire("k", 3, timeout=1)  # 0.5 s passed: 2 units back, one more interval to wait
    assert sleeps[1:] == [r.interval_ns / 1e9]
    assert lim.metrics().waits == 1


def test_a_wait_that_cannot_be_met_raises_at_once(
    fb: Any, clock: FakeClock, sleeps: list[float]
) -> None:
    lim = fb.RateLimiter("2/s", name="x", clock=clock)
    assert lim.try_acquire(2)
    with pytest.raises(fb.RateLimitedError) as info:
        lim.acquire(timeout=0.49)
    assert info.value.retry_after == 0.5
    with fb.deadline(0.3, clock=clock):
        with pytest.raises(fb.RateLimitedError):
            lim.acquire(timeout=10)

    async def main() -> None:
        with pytest.raises(fb.RateLimitedError):
            await lim.acquire_async(timeout=0.1)
        with fb.deadline(0.2, clock=clock):
            with pytest.raises(fb.RateLimitedError):
                await lim.acquire_async()

    asyncio.run(main())
    assert sleeps == [] and clock() == 10**12
    lim.acquire(timeout=0.5)
    assert sleeps == [0.5]


class _VirtualSelector(selectors.DefaultSelector):
    """select(timeout) with nothing ready moves the fake clock to the next timer instead."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock

    def select(self, timeout: float | None = None) -> list[Any]:
        ready = super().select(0)
        if not ready and timeout:
            self.clock._ns += math.ceil(timeout * 1e9)
        return ready


class _VirtualLoop(asyncio.SelectorEventLoop):
    """Loop time is the fake clock; every timer (a sleep) is counted."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(_VirtualSelector(clock))
        self.fake = clock
        self.timers = 0

    def time(self) -> float:
        return self.fake() / 1e9

    def call_at(self, when: float, callback: Any, *args: Any, context: Any = None) -> Any:
        self.timers += 1
        return super().call_at(when, callback, *args, context=context)


@pytest.mark.parametrize("make", ["limiter", "map"])
def test_async_waiters_fifo_and_linear_wakeups(fb: Any, clock: FakeClock, make: str) -> None:
    # Class: waking every waiter on every tick (aiolimiter#73). N waiters of a 1-unit burst must
    # be served in arrival order with O(N) sleeps in total (one per waiter, not one per tick).
    n = 40
    order: list[int] = []
    if make == "limiter":
        lim = fb.RateLimiter(fb.Rate(10, 1, burst=1), clock=clock)
        acq = lim.acquire_async
    else:
        m = fb.RateLimiterMap(fb.Rate(10, 1, burst=1), clock=clock)
        acq = lambda w: m.acquire_async("k", w)  # noqa: E731

    async def waiter(i: int) -> None:
        await acq(1 + i % 2 * 0)
        order.append(i)

    async def main() -> None:
        await asyncio.gather(*(waiter(i) for i in range(n)))

    loop = _VirtualLoop(clock)
    start = clock()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    assert order == list(range(n))
    assert loop.timers <= 2 * n, loop.timers
    # served at the rate: the last one after (n - 1) intervals
    assert clock() - start >= (n - 1) * fb.Rate(10, 1).interval_ns
    if make == "limiter":
        assert lim.metrics().waits == n - 1 and not lim._queues
    else:
        assert not m._queues


# -- the map -------------------------------------------------------------------------------------
def test_map_keys_are_independent(fb: Any, clock: FakeClock) -> None:
    m = fb.RateLimiterMap("2/s", clock=clock)
    assert [m.try_acquire("a") for _ in range(3)] == [True, True, False]
    assert m.try_acquire("b") and "a" in m and "b" in m and "c" not in m
    assert m.retry_after("a") == 0.5 and m.retry_after("c") == 0.0 and "c" not in m
    m.refund("c", 1)
    assert "c" not in m
    m.refund("a", 1)
    assert m.try_acquire("a")
    assert m.metrics() == fb.RateLimiterMapMetrics(2, 0, 4, 1)


def test_map_evicts_idle_keys_first_then_lru(fb: Any, clock: FakeClock) -> None:
    r = fb.Rate(1, 10)
    m = fb.RateLimiterMap(r, max_keys=32, clock=clock)
    for i in range(16):  # keys 0..15: busy for 10 s
        m.try_acquire(i)
    clock.advance(11)  # now idle: indistinguishable from fresh keys
    for i in range(16, 32):  # keys 16..31: busy
        m.try_acquire(i)
        clock._ns += 1
    m.try_acquire("new")  # the idle keys go, every busy key stays
    assert len(m) == 17 and all(i in m for i in range(16, 32)) and "new" in m
    assert m.metrics().evicted == 16
    for i in range(100, 115):
        m.try_acquire(i)
        clock._ns += 1
    m.try_acquire(16)  # used again: no longer the least recently used
    assert len(m) == 32
    m.try_acquire("last")  # nothing idle: the least recently used go (32 // 16 = 2 of them)
    assert 17 not in m and 18 not in m and 16 in m and 19 in m and "last" in m and len(m) == 31
    assert m.metrics().evicted == 18


def test_map_never_grows_past_max_keys(fb: Any, clock: FakeClock) -> None:
    m = fb.RateLimiterMap("5/s", "100/h", max_keys=50, clock=clock)
    for i in range(1000):
        m.try_acquire(i % 300)
        assert len(m) <= 50
        if i % 7 == 0:
            clock._ns += 10**7


def test_map_memory_is_flat_under_churn(fb: Any, clock: FakeClock) -> None:
    # Class: an unbounded key space (Sentinel PR #3391). 10 x max_keys distinct keys, made before
    # tracing; the traced memory after the churn stays at the level of a full map.
    max_keys = 1000
    m = fb.RateLimiterMap("5/s", max_keys=max_keys, clock=clock)
    keys = [f"k{i}" for i in range(10 * max_keys)]
    gc.collect()
    tracemalloc.start()
    try:
        for k in keys[:max_keys]:
            m.try_acquire(k)
        full, _ = tracemalloc.get_traced_memory()
        for k in keys[max_keys:]:
            m.try_acquire(k)
            clock._ns += 1000
        gc.collect()
        after, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    print(f"\n[ratelimit map {fb.impl}] {full / max_keys:.0f} bytes per key, "
          f"after 10x churn {after} (full {full}, peak {peak})")  # fmt: skip
    assert len(m) <= max_keys
    assert after <= full * 1.5 + 4096
    assert m.metrics().evicted >= 9 * max_keys


def test_a_cancelled_waiter_passes_its_turn_on(fb: Any, clock: FakeClock) -> None:
    # Class: waiter accounting under cancellation (a cancelled head must wake the next one, a
    # cancelled waiter must leave the queue), and a queued waiter's own timeout.
    lim = fb.RateLimiter(fb.Rate(1, 1, burst=1), clock=clock)
    assert lim.try_acquire()
    served: list[int] = []

    async def waiter(i: int, timeout: float | None = None) -> None:
        await lim.acquire_async(timeout=timeout)
        served.append(i)

    async def main() -> None:
        tasks = [asyncio.ensure_future(waiter(i)) for i in range(4)]
        await asyncio.sleep(0)
        tasks[0].cancel()  # the head, while it sleeps
        tasks[2].cancel()  # a queued one
        late = asyncio.ensure_future(waiter(9, timeout=1.5))  # needs 3 s: refused at once
        with pytest.raises(fb.RateLimitedError):
            await late
        await asyncio.gather(*tasks, return_exceptions=True)

    loop = _VirtualLoop(clock)
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    assert served == [1, 3] and not lim._queues
