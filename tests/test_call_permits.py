"""Every call path gives its permit back, whatever raises between admission and the outcome.

The class of defect: a step between ``_permit_or_raise`` and ``_finish`` (a ``failure_on``
predicate, the clock, a state-change callback, a ``with`` block exiting in another context, a
generator iterated after the decorator returned) raises or runs elsewhere, and the permit is lost:
in HALF_OPEN the probe slot stays taken until ``probe_timeout``. Each test runs every call path
through one helper, in HALF_OPEN where a lost permit shows as a rejected next call.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import threading

import pytest

from fastbreaker.testing import FakeClock

SYNC_PATHS = ["call", "with", "decorator", "generator"]
ASYNC_PATHS = ["call_async", "async_with", "async_decorator", "async_generator", "async_callable"]


def run_sync(b, path, fn):
    """Run ``fn()`` through breaker ``b`` by ``path``; return its result."""
    if path == "call":
        return b.call(fn)
    if path == "with":
        with b:
            return fn()
    if path == "decorator":
        return b(fn)()
    if path == "generator":

        @b
        def gen():
            yield fn()

        return next(iter(list(gen())))
    raise AssertionError(path)


async def run_async(b, path, fn):
    async def afn():
        await asyncio.sleep(0)
        return fn()

    if path == "call_async":
        return await b.call_async(afn)
    if path == "async_with":
        async with b:
            return await afn()
    if path == "async_decorator":
        return await b(afn)()
    if path == "async_generator":

        @b
        async def agen():
            yield await afn()

        return [x async for x in agen()][0]
    if path == "async_callable":

        class Client:
            async def __call__(self):
                return await afn()

        return await b(Client())()
    raise AssertionError(path)


def half_open(fb, clock, **kw):
    """A breaker in HALF_OPEN with one probe slot, tripped at ``clock``."""
    b = fb.CircuitBreaker(failure_threshold=1, reset_timeout=10, clock=clock, **kw)
    b.trip()
    clock.advance(10)
    return b


def raise_(exc):
    raise exc


# -- a failure_on predicate that raises ------------------------------------------------------------
def broken_predicate(exc):
    raise LookupError("predicate bug")


def check_predicate_outcome(fb, b, caplog):
    # the probe's outcome was recorded as a failure: re-opened, and the error was logged
    assert b.state == fb.State.OPEN
    m = b.metrics()
    assert m.failures == 1 and m.permitted == 1
    assert any(
        r.name == "fastbreaker" and r.exc_info and r.exc_info[0] is LookupError
        for r in caplog.records
    )


@pytest.mark.parametrize("path", SYNC_PATHS)
def test_raising_predicate_keeps_the_callers_error_and_records_a_failure(fb, clock, caplog, path):
    b = half_open(fb, clock, failure_on=broken_predicate)
    with caplog.at_level(logging.ERROR, logger="fastbreaker"):
        with pytest.raises(ConnectionError):
            run_sync(b, path, lambda: raise_(ConnectionError("down")))
    check_predicate_outcome(fb, b, caplog)


@pytest.mark.parametrize("path", ASYNC_PATHS)
async def test_raising_predicate_async_paths(fb, clock, caplog, path):
    b = half_open(fb, clock, failure_on=broken_predicate)
    with caplog.at_level(logging.ERROR, logger="fastbreaker"):
        with pytest.raises(ConnectionError):
            await run_async(b, path, lambda: raise_(ConnectionError("down")))
    check_predicate_outcome(fb, b, caplog)


def test_raising_predicate_is_counted_as_a_failure_in_closed(fb, clock):
    b = fb.CircuitBreaker(failure_threshold=2, clock=clock, failure_on=broken_predicate)
    for _ in range(2):
        with pytest.raises(KeyError):
            b.call(lambda: raise_(KeyError("k")))
    assert b.state == fb.State.OPEN


# -- a clock that raises inside a timed call --------------------------------------------------------
class FlakyClock(FakeClock):
    """A FakeClock whose next reads raise while ``failing`` is set."""

    __slots__ = ("failing",)

    def __init__(self, start_ns: int) -> None:
        super().__init__(start_ns)
        self.failing = False

    def __call__(self) -> int:
        if self.failing:
            raise OSError("clock broke")
        return super().__call__()


def failing_clock_after(clock):
    """``fn`` for the call paths: succeeds, leaving the clock broken for the end-of-call read."""

    def fn():
        clock.failing = True
        return "ok"

    return fn


@pytest.mark.parametrize("path", SYNC_PATHS)
def test_clock_raising_at_the_end_of_a_timed_call_records_a_success(fb, path):
    clock = FlakyClock(10**12)
    b = half_open(fb, clock, slow_call_duration=1.0)
    with pytest.raises(OSError, match="clock broke"):
        run_sync(b, path, failing_clock_after(clock))
    clock.failing = False
    # the probe reported a plain success: closed again, nothing left in flight
    assert b.state == fb.State.CLOSED
    assert b.metrics().successes == 1


@pytest.mark.parametrize("path", ASYNC_PATHS)
async def test_clock_raising_at_the_end_of_a_timed_async_call(fb, path):
    clock = FlakyClock(10**12)
    b = half_open(fb, clock, slow_call_duration=1.0)
    with pytest.raises(OSError, match="clock broke"):
        await run_async(b, path, failing_clock_after(clock))
    clock.failing = False
    assert b.state == fb.State.CLOSED


@pytest.mark.parametrize("path", SYNC_PATHS)
def test_clock_raising_at_the_start_of_a_timed_call_releases_the_probe(fb, path):
    clock = FlakyClock(10**12)
    b = half_open(fb, clock, slow_call_duration=1.0)
    assert b.allow()  # OPEN -> HALF_OPEN now (it reads the clock); then give the probe back
    b.record_success(0.0)
    b.trip()
    clock.advance(10)
    b.allow()
    b.record_failure()  # HALF_OPEN -> OPEN, then wait again: the next admission needs no clock
    clock.advance(10 * 2)
    assert b.allow()
    b.record_success()  # CLOSED: admission reads no clock, the start of the call does
    clock.failing = True
    called = []
    with pytest.raises(OSError):
        run_sync(b, path, lambda: called.append(1))
    clock.failing = False
    assert called == []
    assert b.metrics().ignored == 1  # released as neutral: nothing ran


# -- a state-change callback raising a BaseException during admission ------------------------------
@pytest.mark.parametrize("path", SYNC_PATHS + ["allow"])
def test_keyboard_interrupt_from_a_callback_on_admission_releases_the_probe(fb, clock, path):
    b = half_open(fb, clock)
    armed = [True]

    @b.on_state_change
    def interrupt(breaker, old, new):
        if armed[0] and new == fb.State.HALF_OPEN:
            armed[0] = False
            raise KeyboardInterrupt

    called = []
    with pytest.raises(KeyboardInterrupt):
        if path == "allow":
            b.allow()
        else:
            run_sync(b, path, lambda: called.append(1))
    assert called == []
    assert b.state == fb.State.HALF_OPEN
    assert b.allow()  # not stuck until probe_timeout


# -- `with` blocks that exit in another context ------------------------------------------------------
def in_thread(fn):
    errors = []

    def target():
        try:
            fn()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    t = threading.Thread(target=target)
    t.start()
    t.join()
    assert errors == []


def test_generator_closed_from_another_thread_releases_its_permit(fb, clock):
    b = half_open(fb, clock)

    def gen():
        with b:
            yield 1

    g = gen()
    next(g)
    assert not b.allow()  # the probe is held by the suspended block
    in_thread(g.close)
    assert b.state == fb.State.HALF_OPEN
    assert b.metrics().ignored == 1  # GeneratorExit is neutral
    assert b.allow()


def test_generator_failing_in_another_thread_records_the_failure(fb, clock):
    b = half_open(fb, clock)

    def gen():
        with b:
            yield 1

    g = gen()
    next(g)

    def throw():
        with pytest.raises(ConnectionError):
            g.throw(ConnectionError("down"))

    in_thread(throw)
    assert b.state == fb.State.OPEN
    assert b.metrics().failures == 1


async def test_async_generator_closed_by_another_task_releases_its_permit(fb, clock):
    b = half_open(fb, clock)

    async def agen():
        async with b:
            yield 1

    a = agen()

    async def start():
        await a.__anext__()

    await asyncio.create_task(start())  # entered in that task's context
    assert not b.allow()
    await a.aclose()  # exits in this task's context
    assert b.metrics().ignored == 1
    assert b.allow()


def test_blocks_exiting_elsewhere_and_at_home_interleaved_balance(fb, clock):
    b = fb.CircuitBreaker(
        failure_threshold=1,
        reset_timeout=10,
        clock=clock,
        half_open_max_calls=3,
        success_threshold=10,
    )
    b.trip()
    clock.advance(10)

    def gen():
        with b:
            yield 1

    g1, g2 = gen(), gen()
    with b:  # entered here first, exits here last
        next(g1)
        next(g2)
        assert not b.allow()  # three probes in flight
        in_thread(g1.close)  # a foreign exit: it takes one open block of b
        assert b.metrics().ignored == 1
    g2.close()  # each of the three blocks is released exactly once, in any order
    m = b.metrics()
    assert (m.successes, m.ignored, m.stale) == (1, 2, 0)
    assert [b.allow() for _ in range(4)] == [True, True, True, False]


def test_outer_block_exits_after_inner_generator_closed_elsewhere(fb, clock):
    b = fb.CircuitBreaker(failure_threshold=5, clock=clock)

    def gen():
        with b:
            yield 1

    g = gen()
    with b:
        next(g)  # g's block is now on top of this context's stack
        in_thread(g.close)
    with b:  # the stack is usable again, with no leftover entry
        pass
    g2 = gen()
    next(g2)
    in_thread(g2.close)
    m = b.metrics()
    assert (m.permitted, m.successes, m.ignored) == (4, 2, 2)


def test_every_entered_block_is_released_once_under_threads(fb, clock):
    b = fb.CircuitBreaker(failure_threshold=10**6, clock=clock)
    gens = []

    def gen():
        with b:
            yield 1

    def worker():
        for _ in range(50):
            g = gen()
            next(g)
            gens.append(g)
            with b:
                pass

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    closers = [
        threading.Thread(target=lambda part=gens[i::3]: [g.close() for g in part]) for i in range(3)
    ]
    for t in closers:
        t.start()
    for t in closers:
        t.join()
    m = b.metrics()
    assert m.permitted == 400
    assert m.successes + m.ignored == 400 and m.ignored == 200


def test_exit_without_enter_still_raises(fb, clock):
    b = fb.CircuitBreaker(clock=clock)
    with pytest.raises(RuntimeError, match="never entered"):
        b.__exit__(None, None, None)


# -- generators guarded by the decorator -------------------------------------------------------------
def test_generator_holds_its_permit_until_exhausted(fb, clock):
    b = half_open(fb, clock)

    @b
    def gen(n):
        yield from range(n)
        return "done"

    assert inspect.isgeneratorfunction(gen) and gen.__name__ == "gen"
    g = gen(2)
    assert b.metrics().permitted == 0  # creating it counts nothing
    assert next(g) == 0
    assert not b.allow()  # the probe is held while it is iterated
    assert next(g) == 1
    with pytest.raises(StopIteration) as stop:
        next(g)
    assert stop.value.value == "done"
    assert b.state == fb.State.CLOSED


def test_generator_send_and_errors_are_relayed_and_classified(fb, clock):
    b = fb.CircuitBreaker(failure_threshold=2, clock=clock, failure_on=ConnectionError)

    @b
    def echo():
        got = yield "ready"
        while True:
            if got == "fail":
                raise ConnectionError("down")
            got = yield got

    g = echo()
    assert next(g) == "ready" and g.send("x") == "x"
    with pytest.raises(ConnectionError):
        g.send("fail")
    g2 = echo()
    next(g2)
    with pytest.raises(ValueError):
        g2.throw(ValueError("thrown in"))  # not a failure_on type: a success
    g3 = echo()
    next(g3)
    g3.close()  # closed early: neutral
    m = b.metrics()
    assert (m.failures, m.successes, m.ignored) == (1, 1, 1)


def test_generator_rejected_when_open_on_first_next(fb, clock):
    b = fb.CircuitBreaker(clock=clock)
    b.trip()

    @b
    def gen():
        yield 1

    g = gen()  # no error yet
    with pytest.raises(fb.CircuitOpenError):
        next(g)


def test_slow_generator_counts_as_slow(fb, clock):
    b = fb.CircuitBreaker(failure_threshold=1, clock=clock, slow_call_duration=1.0)

    @b
    def gen():
        clock.advance(2)
        yield 1

    assert list(gen()) == [1]
    assert b.metrics().slow_calls == 1 and b.state == fb.State.OPEN


async def test_async_generator_holds_its_permit_and_relays(fb, clock):
    b = half_open(fb, clock, success_threshold=1)

    @b
    async def agen():
        got = yield 0
        while got is not None:
            if got == "fail":
                raise ConnectionError
            got = yield got

    assert inspect.isasyncgenfunction(agen)
    a = agen()
    assert b.metrics().permitted == 0
    assert await a.__anext__() == 0
    assert not b.allow()
    assert await a.asend("x") == "x"
    with pytest.raises(ConnectionError):
        await a.asend("fail")
    assert b.state == fb.State.OPEN


async def test_async_generator_closed_early_is_neutral_and_exhausted_is_success(fb, clock):
    b = fb.CircuitBreaker(clock=clock)

    @b
    async def agen():
        yield 1
        yield 2

    a = agen()
    await a.__anext__()
    await a.aclose()
    assert [x async for x in agen()] == [1, 2]
    a = agen()
    await a.__anext__()
    with pytest.raises(KeyError):
        await a.athrow(KeyError("k"))
    m = b.metrics()
    assert (m.ignored, m.successes, m.failures) == (1, 1, 1)


async def test_object_with_async_call_is_awaited_through_the_breaker(fb, clock):
    b = fb.CircuitBreaker(failure_threshold=1, clock=clock)

    class Client:
        async def __call__(self, x):
            await asyncio.sleep(0)
            if x is None:
                raise ConnectionError
            return x

    guarded = b(Client())
    assert inspect.iscoroutinefunction(guarded)
    assert await guarded(3) == 3
    assert b.metrics().successes == 1
    with pytest.raises(ConnectionError):
        await guarded(None)
    assert b.state == fb.State.OPEN


# -- printable errors and states, elapsed validation ------------------------------------------------
def test_circuit_open_error_built_by_hand_is_printable(fb):
    assert str(fb.CircuitOpenError()) == "circuit is open"
    assert str(fb.CircuitOpenError("msg")) == "msg"
    e = fb.CircuitOpenError("db", fb.State.OPEN, 1.5)
    assert str(e) == "circuit 'db' is OPEN: retry after 1.500s"
    assert repr(fb.CircuitOpenError("a", "b"))  # any arguments
    assert str(fb.CircuitOpenError("a", "b", "c"))


def test_state_prints_as_its_name(fb, clock):
    b = fb.CircuitBreaker(clock=clock)
    assert str(b.state) == "CLOSED" and f"{b.state}" == "CLOSED"
    assert f"{fb.State.HALF_OPEN:d}" == "2" and b.state == 0


@pytest.mark.parametrize("elapsed", [math.nan, math.inf, -math.inf, -1, -0.5])
def test_record_success_refuses_elapsed_out_of_range(fb, clock, elapsed):
    b = fb.CircuitBreaker(clock=clock, slow_call_duration=1.0)
    with pytest.raises(ValueError, match=r"elapsed must be a finite number of seconds >= 0"):
        b.record_success(elapsed=elapsed)
    assert b.metrics().successes == 0


async def test_retry_awaits_an_object_with_async_call(fb):
    class Client:
        def __init__(self):
            self.calls = 0

        async def __call__(self):
            self.calls += 1
            if self.calls == 1:
                raise ConnectionError
            return "ok"

    client = Client()
    with fb.testing.instant_retries():
        fetch = fb.retry(on=ConnectionError, attempts=2)(client)
        assert inspect.iscoroutinefunction(fetch)
        assert await fetch() == "ok"
    assert client.calls == 2
