"""fastbreaker.compat.circuitbreaker: circuitbreaker's API and behaviour, on both cores.

The module is imported as a user would import circuitbreaker. An autouse fixture switches the
core it drives (``c`` / ``python``, from the ``fb`` fixture), gives it a fresh monitor and
freezes time: both this module and the real circuitbreaker read ``monotonic`` and ``datetime``
from their globals, and one ``FakeTime`` drives them. The fidelity tests run the same
operations against the real circuitbreaker (skipped when it is not installed) and compare
everything a user can observe.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import threading
import weakref
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import fastbreaker.compat.circuitbreaker as circuitbreaker
from fastbreaker.compat.circuitbreaker import (
    CircuitBreaker,
    CircuitBreakerError,
    CircuitBreakerMonitor,
    circuit,
)

WAIT = 10.0  # seconds a thread test may block before it fails (never reached when it passes)


class FakeTime:
    """``monotonic`` and ``datetime`` for both modules."""

    BASE = datetime(2030, 1, 1, tzinfo=timezone.utc)

    def __init__(self) -> None:
        self.t = 1000.0
        ft = self

        class FakeDatetime(datetime):
            @classmethod
            def now(cls, tz: Any = None) -> datetime:  # type: ignore[override]
                return ft.BASE + timedelta(seconds=ft.t)

        self.datetime = FakeDatetime

    def monotonic(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


def patch_time(module: Any, ft: FakeTime, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(module, "monotonic", ft.monotonic)
    monkeypatch.setattr(module, "datetime", ft.datetime)


@pytest.fixture
def ft(monkeypatch: pytest.MonkeyPatch) -> FakeTime:
    ft = FakeTime()
    patch_time(circuitbreaker, ft, monkeypatch)
    return ft


@pytest.fixture(autouse=True)
def core(fb: Any, ft: FakeTime, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Every test runs on both cores (the breaker class hook), with time frozen."""
    monkeypatch.setattr(CircuitBreaker, "_core_breaker_cls", fb.CircuitBreaker)
    monkeypatch.setattr(CircuitBreakerMonitor, "circuit_breakers", weakref.WeakValueDictionary())
    return fb.CircuitBreaker


@pytest.fixture
def peer(ft: FakeTime, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The real circuitbreaker, on the same fake time, with an empty monitor."""
    real = pytest.importorskip("circuitbreaker")
    patch_time(real, ft, monkeypatch)
    monkeypatch.setattr(real.CircuitBreakerMonitor, "circuit_breakers", {})
    return real


def work(kind: str) -> str:
    if kind == "fail":
        raise ConnectionError("down")
    if kind == "other":
        raise KeyError("not a failure")
    return "ok:" + kind


def drive(awaitable: Any) -> Any:
    """Run a coroutine that never suspends (no event loop needed)."""
    try:
        awaitable.send(None)
    except StopIteration as stop:
        return stop.value
    raise AssertionError("suspended")


def drive_agen(agen: Any) -> list[Any]:
    items = []
    while True:
        try:
            items.append(drive(agen.__anext__()))
        except StopAsyncIteration:
            return items


def outcome(fn: Any) -> tuple[Any, ...]:
    try:
        value = fn()
    except Exception as exc:
        return ("raised", type(exc).__name__, str(exc))
    return ("returned", value)


def observe(b: Any) -> tuple[Any, ...]:
    return (
        b.state,
        b.closed,
        b.opened,
        b.failure_count,
        b.open_remaining,
        b.open_until,
        repr(b.last_failure),
        str(b),
        b.name,
    )


EXPECTED = {
    "type": ConnectionError,
    "tuple": (ConnectionError, TimeoutError),
    "predicate": lambda t, v: issubclass(t, ConnectionError),
}


def trace(
    mod: Any, ft: FakeTime, ops: list[tuple[Any, ...]], expected: str = "type", **kw: Any
) -> list[tuple[Any, ...]]:
    ft.t = 1000.0
    b = mod.CircuitBreaker(expected_exception=EXPECTED[expected], **kw)

    @b
    def f(kind: str) -> str:
        return work(kind)

    @b
    def g(kind: str) -> Any:
        yield 1
        work(kind)
        yield 2

    @b
    async def a(kind: str) -> str:
        return work(kind)

    @b
    async def ag(kind: str) -> Any:
        yield 1
        work(kind)

    run = {
        "call": lambda k: f(k),
        "gen": lambda k: list(g(k)),
        "async": lambda k: drive(a(k)),
        "agen": lambda k: drive_agen(ag(k)),
    }
    steps = []
    for what, arg in ops:
        if what == "advance":
            ft.advance(arg)
            result: Any = None
        elif what == "reset":
            result = b.reset()
        else:
            result = outcome(lambda: run[what](arg))
        steps.append(((what, arg), result, observe(b)))
    return steps


OPS = st.one_of(
    st.tuples(
        st.sampled_from(["call", "call", "call", "gen", "async", "agen"]),
        st.sampled_from(["ok", "fail", "fail", "other"]),
    ),
    st.tuples(st.just("advance"), st.sampled_from([0.3, 1, 5, 9.5, 10, 31])),
    st.tuples(st.just("reset"), st.none()),
)


# -- fidelity: the same operations against the real circuitbreaker ------------------------------


def test_scenario_matches_circuitbreaker(peer: Any, ft: FakeTime) -> None:
    ops: list[tuple[Any, ...]] = [
        ("call", "ok"),
        ("call", "fail"),
        ("call", "other"),
        ("call", "fail"),
        ("call", "fail"),
        ("call", "ok"),
        ("advance", 0.3),
        ("gen", "ok"),
        ("advance", 9.5),
        ("async", "ok"),
        ("advance", 0.3),
        ("call", "fail"),
        ("advance", 10),
        ("agen", "ok"),
        ("call", "fail"),
        ("gen", "fail"),
        ("reset", None),
        ("async", "fail"),
        ("agen", "fail"),
    ]
    kw = dict(failure_threshold=2, recovery_timeout=10)
    ours = trace(circuitbreaker, ft, ops, **kw)
    assert ours == trace(peer, ft, ops, **kw)
    rejected = [step[1] for step in ours if step[1] and step[1][1] == "CircuitBreakerError"]
    assert rejected and rejected[0][2].startswith(
        'Circuit "trace.<locals>.f" OPEN until 2030-01-01'
    )
    assert {step[2][0] for step in ours} == {"closed", "open", "half_open"}


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    ops=st.lists(OPS, max_size=30),
    threshold=st.integers(1, 4),
    recovery=st.sampled_from([1, 10, 30]),
    expected=st.sampled_from(sorted(EXPECTED)),
)
def test_random_operations_match_circuitbreaker(
    peer: Any,
    ft: FakeTime,
    ops: list[tuple[Any, ...]],
    threshold: int,
    recovery: int,
    expected: str,
) -> None:
    kw = dict(failure_threshold=threshold, recovery_timeout=recovery)
    assert trace(circuitbreaker, ft, ops, expected, **kw) == trace(peer, ft, ops, expected, **kw)


def test_fallbacks_match_circuitbreaker(peer: Any, ft: FakeTime) -> None:
    def results(mod: Any) -> list[Any]:
        def fb_sync(x: int) -> str:
            return f"fallback {x}"

        def fb_gen(x: int) -> Any:
            yield f"fallback {x}"

        async def fb_async(x: int) -> str:
            return f"fallback {x}"

        async def fb_agen(x: int) -> Any:
            yield f"fallback {x}"

        def broken(x: int) -> Any:
            raise ConnectionError

        fns = [
            mod.circuit(failure_threshold=1, fallback_function=fb_sync)(broken),
            mod.circuit(failure_threshold=1, fallback_function=fb_gen)(_gen_broken),
            mod.circuit(failure_threshold=1, fallback_function=fb_async)(_async_broken),
            mod.circuit(failure_threshold=1, fallback_function=fb_agen)(_agen_broken),
        ]
        out = []
        for fn, run in zip(fns, [lambda r: r, list, drive, drive_agen]):
            out.append(outcome(lambda: run(fn(7))))  # fails and opens
            out.append(outcome(lambda: run(fn(8))))  # open: the fallback answers
        return out

    ours = results(circuitbreaker)
    assert ours == results(peer)
    assert ours[1::2] == [
        ("returned", "fallback 8"),
        ("returned", ["fallback 8"]),
        ("returned", "fallback 8"),
        ("returned", ["fallback 8"]),
    ]


def _gen_broken(x: int) -> Any:
    yield x
    raise ConnectionError


async def _async_broken(x: int) -> Any:
    raise ConnectionError


async def _agen_broken(x: int) -> Any:
    raise ConnectionError
    yield  # pragma: no cover


def test_expected_exception_errors_match_circuitbreaker(peer: Any) -> None:
    for bad in ("ConnectionError", b"x", 42, KeyboardInterrupt, object()):
        with pytest.raises(ValueError) as ours:
            CircuitBreaker(expected_exception=bad)
        with pytest.raises(ValueError) as theirs:
            peer.CircuitBreaker(expected_exception=bad)
        assert str(ours.value) == str(theirs.value)
    assert str(ours.value) == "expected_exception does not look like a predicate"


@pytest.mark.parametrize("elapsed", [0, 0.2, 9.8, 10, 10.2, 31])
def test_open_remaining_rounding_matches_circuitbreaker(
    peer: Any, ft: FakeTime, elapsed: float
) -> None:
    def remaining(mod: Any) -> tuple[Any, ...]:
        ft.t = 1000.0
        b = mod.CircuitBreaker(failure_threshold=1, recovery_timeout=10)
        with pytest.raises(ConnectionError):
            b.decorate(work)("fail")
        ft.advance(elapsed)
        return b.open_remaining, b.open_until, b.state

    assert remaining(circuitbreaker) == remaining(peer)


def test_str_and_names_match_circuitbreaker(peer: Any) -> None:
    for mod in (circuitbreaker, peer):
        assert str(mod.CircuitBreaker()) == "unnamed_CircuitBreaker"
        assert str(mod.CircuitBreaker(name="db")) == "db"
    assert (
        circuitbreaker.STATE_CLOSED,
        circuitbreaker.STATE_OPEN,
        circuitbreaker.STATE_HALF_OPEN,
    ) == (peer.STATE_CLOSED, peer.STATE_OPEN, peer.STATE_HALF_OPEN)
    assert (
        CircuitBreaker.FAILURE_THRESHOLD,
        CircuitBreaker.RECOVERY_TIMEOUT,
        CircuitBreaker.EXPECTED_EXCEPTION,
        CircuitBreaker.FALLBACK_FUNCTION,
    ) == (
        peer.CircuitBreaker.FAILURE_THRESHOLD,
        peer.CircuitBreaker.RECOVERY_TIMEOUT,
        peer.CircuitBreaker.EXPECTED_EXCEPTION,
        peer.CircuitBreaker.FALLBACK_FUNCTION,
    )


# -- the documented API ----------------------------------------------------------------------------


def test_bare_decorator_names_registers_and_uses_defaults() -> None:
    @circuit
    def external_call() -> str:
        return "ok"

    b = CircuitBreakerMonitor.get(
        "test_bare_decorator_names_registers_and_uses_defaults.<locals>.external_call"
    )
    assert b is not None and external_call() == "ok"
    assert (b._failure_threshold, b._recovery_timeout, b.closed) == (5, 30, True)
    assert list(CircuitBreakerMonitor.get_circuits()) == [b]
    assert CircuitBreakerMonitor.all_closed()


def test_decorating_keeps_the_kind_and_metadata() -> None:
    b = CircuitBreaker(name="kinds")

    def plain(x: int) -> int:
        """Docs."""
        return x

    def gen() -> Any:
        yield 1

    async def coro() -> int:
        return 1

    async def agen() -> Any:
        yield 1

    assert not inspect.isgeneratorfunction(b(plain)) and b(plain).__doc__ == "Docs."
    assert inspect.isgeneratorfunction(b(gen))
    assert inspect.iscoroutinefunction(b(coro))
    assert inspect.isasyncgenfunction(b(agen))
    assert b(plain).__wrapped__ is plain


def test_subclass_class_attributes() -> None:
    def is_rate_limited(thrown_type: type, value: BaseException) -> bool:
        return issubclass(thrown_type, ConnectionError)

    class MyBreaker(CircuitBreaker):
        FAILURE_THRESHOLD = 2
        RECOVERY_TIMEOUT = 60
        EXPECTED_EXCEPTION = is_rate_limited  # stays a plain function, not a method

    class Deeper(MyBreaker):  # circuitbreaker would fall back to Exception here
        pass

    for b in (MyBreaker(), circuit(cls=Deeper)):
        assert (b._failure_threshold, b._recovery_timeout) == (2, 60)
        assert b.is_failure(ConnectionError, ConnectionError()) is True
        assert b.is_failure(KeyError, KeyError()) is False


def test_arguments_override_and_zero_means_default() -> None:
    b = circuit(failure_threshold=0, recovery_timeout=0, name="z")
    assert (b._failure_threshold, b._recovery_timeout, b.name) == (5, 30, "z")
    b = CircuitBreaker(failure_threshold=3, recovery_timeout=2.5)
    assert (b._failure_threshold, b._recovery_timeout) == (3, 2.5)


def test_expected_exception_forms() -> None:
    assert CircuitBreaker(expected_exception=KeyError).is_failure(KeyError, KeyError())
    pred = CircuitBreaker(expected_exception=[KeyError, ValueError]).is_failure
    assert pred(ValueError, ValueError()) and not pred(OSError, OSError())
    with pytest.raises(ValueError, match="cannot be a string. Did you mean name"):
        circuit(expected_exception="ConnectionError")


def test_failures_open_then_one_trial_closes(ft: FakeTime) -> None:
    b = CircuitBreaker(2, 10, ConnectionError, name="trial")
    fn = b.decorate(work)
    with pytest.raises(KeyError):
        fn("other")  # not an expected failure: counts as a success
    for _ in range(2):
        with pytest.raises(ConnectionError):
            fn("fail")
    assert (b.state, b.opened, b.failure_count, b.open_remaining) == ("open", True, 2, 10)
    assert isinstance(b.last_failure, ConnectionError)
    with pytest.raises(CircuitBreakerError) as err:
        fn("ok")
    assert str(err.value) == (
        'Circuit "trial" OPEN until 2030-01-01 00:16:50+00:00 (2 failures, 10 sec remaining) '
        "(last_failure: ConnectionError('down'))"
    )
    assert list(CircuitBreakerMonitor.get_open()) == [b] and not CircuitBreakerMonitor.all_closed()
    ft.advance(10)
    assert b.state == "half_open" and not b.opened and not b.closed
    assert fn("ok") == "ok:ok"
    assert (b.state, b.failure_count, b.last_failure) == ("closed", 0, None)
    assert list(CircuitBreakerMonitor.get_closed()) == [b]


def test_reset_closes_and_clears() -> None:
    b = CircuitBreaker(failure_threshold=1)
    with pytest.raises(ConnectionError):
        b.decorate(work)("fail")
    b.reset()
    assert (b.state, b.failure_count, b.last_failure) == ("closed", 0, None)


def test_instance_predicate_and_fallback_can_be_patched() -> None:
    class Quiet(CircuitBreaker):
        @property
        def fallback_function(self) -> Any:
            return lambda kind: "quiet"

    b = Quiet(failure_threshold=1)
    fn = b.decorate(work)
    b.is_failure = lambda t, v: issubclass(t, KeyError)  # type: ignore[method-assign]
    with pytest.raises(ConnectionError):
        fn("fail")  # not a failure any more
    with pytest.raises(KeyError):
        fn("other")
    assert fn("ok") == "quiet"


# -- fixed bugs ----------------------------------------------------------------------------------------


def test_call_and_with_refuse_when_open() -> None:
    b = CircuitBreaker(failure_threshold=1)
    assert b.call(work, "ok") == "ok:ok"
    with pytest.raises(ConnectionError):
        b.call(work, "fail")
    called: list[int] = []
    with pytest.raises(CircuitBreakerError):
        b.call(called.append, 1)  # circuitbreaker would run it, and close the circuit
    with pytest.raises(CircuitBreakerError):
        with b:
            called.append(2)
    with pytest.raises(CircuitBreakerError):
        list(b.call_generator(iter, [1]))
    with pytest.raises(CircuitBreakerError):
        drive(b.call_async(asyncio.sleep, 0))
    assert called == [] and b.opened


def test_with_block_records_outcomes() -> None:
    b = CircuitBreaker(failure_threshold=2)
    with b:
        pass
    for _ in range(2):
        with pytest.raises(ConnectionError):
            with b:
                raise ConnectionError
    assert b.opened


def test_late_success_does_not_close_an_open_circuit() -> None:
    b = CircuitBreaker(failure_threshold=1)

    @b
    def stream() -> Any:
        yield 1
        yield 2

    late = stream()
    assert next(late) == 1  # admitted while closed
    with pytest.raises(ConnectionError):
        b.call(work, "fail")
    assert list(late) == [2]  # circuitbreaker: reset() here closes the circuit
    assert b.opened


def test_half_open_lets_one_trial_through(ft: FakeTime) -> None:
    b = CircuitBreaker(failure_threshold=1, recovery_timeout=5, name="one-trial")
    fn = b.decorate(work)
    with pytest.raises(ConnectionError):
        fn("fail")
    ft.advance(5)
    inside, release = threading.Event(), threading.Event()

    @b
    def trial() -> str:
        inside.set()
        assert release.wait(WAIT)
        return "ok"

    result: list[Any] = []
    t = threading.Thread(target=lambda: result.append(trial()))
    t.start()
    assert inside.wait(WAIT)
    refused = [outcome(lambda: fn("ok"))[1] for _ in range(5)]  # circuitbreaker lets all in
    release.set()
    t.join(WAIT)
    assert refused == ["CircuitBreakerError"] * 5
    assert result == ["ok"] and b.closed


async def test_cancelled_trial_is_neither_success_nor_failure(ft: FakeTime) -> None:
    b = CircuitBreaker(failure_threshold=1, recovery_timeout=5)
    started = asyncio.Event()

    @b
    async def slow() -> None:
        started.set()
        await asyncio.Event().wait()  # hangs until cancelled

    with pytest.raises(ConnectionError):
        b.call(work, "fail")
    ft.advance(5)
    task = asyncio.ensure_future(slow())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert b.state == "half_open"  # circuitbreaker: reset(), closed by a cancellation
    assert b.call(work, "ok") == "ok:ok" and b.closed  # the trial permit was released


def test_closing_a_generator_early_is_not_a_success() -> None:
    b = CircuitBreaker(failure_threshold=2)

    @b
    def stream() -> Any:
        yield 1
        yield 2

    with pytest.raises(ConnectionError):
        b.call(work, "fail")
    gen = stream()
    next(gen)
    gen.close()
    assert b.failure_count == 1  # circuitbreaker would reset it to 0


def test_concurrent_failures_open_once() -> None:
    n = 8
    b = CircuitBreaker(failure_threshold=3)
    changes: list[Any] = []
    b._core.on_state_change(lambda core, old, new: changes.append((old.name, new.name)))
    barrier = threading.Barrier(n, timeout=WAIT)

    @b
    def fail() -> None:
        barrier.wait()
        raise ConnectionError

    def run() -> None:
        with pytest.raises(ConnectionError):
            fail()

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert changes == [("CLOSED", "OPEN")]
    assert (b.state, b.failure_count) == ("open", 3)


def test_monitor_holds_breakers_weakly() -> None:
    @circuit(name="temporary")
    def temporary() -> None:
        pass

    assert CircuitBreakerMonitor.get("temporary") is not None
    del temporary
    gc.collect()
    assert CircuitBreakerMonitor.get("temporary") is None


def test_recovery_timeout_is_validated() -> None:
    with pytest.raises(ValueError, match="recovery_timeout"):
        CircuitBreaker(recovery_timeout=-1)


def test_dry_run_never_refuses(ft: FakeTime) -> None:
    breaker = CircuitBreaker(
        failure_threshold=2, recovery_timeout=30, expected_exception=ConnectionError, dry_run=True
    )
    call = breaker(work)
    for _ in range(2):
        with pytest.raises(ConnectionError):
            call("fail")
    assert breaker.opened
    assert call("ok") == "ok:ok"  # would have been refused
    m = breaker._core.metrics()
    assert (m.would_reject, m.rejected, m.stale) == (1, 0, 1)
    assert circuit(dry_run=True)._core.metrics().would_reject == 0
