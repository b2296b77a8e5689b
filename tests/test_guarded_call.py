"""``breaker.call_async(fn)`` answers every driver exactly as a coroutine does (issue 26, 15-16).

The twin's ``call_async`` is a coroutine (``async def``); the compiled core returns a
``GuardedCall``. For each state of the call (unstarted, suspended, finished, closed, and
running: driven from inside its own call) and each operation a driver can apply, both must give
the same answer (the same exception type and message, or the same value) and record the same
outcomes in the breaker; the reference is the twin, a real coroutine.
"""

from __future__ import annotations

import types
from typing import Any, Callable

import pytest

from fastbreaker.testing import FakeClock, implementations

REFERENCE = implementations()["python"]

OPS: dict[str, Callable[[Any], Any]] = {
    "send(None)": lambda aw: aw.send(None),
    "send(v)": lambda aw: aw.send("v"),
    "throw(E)": lambda aw: aw.throw(KeyError("thrown")),
    "throw(E type)": lambda aw: aw.throw(KeyError),
    "throw(StopIteration)": lambda aw: aw.throw(StopIteration("stop")),
    "throw(GeneratorExit)": lambda aw: aw.throw(GeneratorExit),
    "close()": lambda aw: aw.close(),
}
STATES = ["unstarted", "suspended", "finished", "closed"]


class _Suspends:
    """An awaitable that suspends once and returns what is sent in."""

    def __await__(self) -> Any:
        value = yield "suspended"
        return value


def _answer(call: Callable[[], Any]) -> tuple[Any, ...]:
    """What a driver sees: a value, a return (StopIteration's value) or an exception, with the
    exception's message and the types of its cause and context."""
    try:
        value = call()
    except StopIteration as stop:
        return ("returned", stop.value)
    except BaseException as exc:
        return (
            type(exc).__name__,
            str(exc),
            type(exc.__cause__).__name__,
            type(exc.__context__).__name__,
        )
    return ("value", value)


def _outcomes(breaker: Any) -> tuple[int, ...]:
    m = breaker.metrics()
    return (m.permitted, m.successes, m.failures, m.ignored, m.stale)


def _observe(ns: types.SimpleNamespace, state: str, op: str) -> tuple[Any, ...]:
    breaker = ns.CircuitBreaker(failure_threshold=100, clock=FakeClock(10**12))

    async def fn() -> Any:
        return await _Suspends()

    aw = breaker.call_async(fn)
    setup = []
    if state != "unstarted":
        setup.append(_answer(lambda: aw.send(None)))
    if state == "finished":
        setup.append(_answer(lambda: aw.send("result")))
    elif state == "closed":
        setup.append(_answer(aw.close))
    answer = _answer(lambda: OPS[op](aw))
    after = _answer(lambda: aw.send(None))  # finished by then, or still suspended
    aw.close()
    return (tuple(setup), answer, after, _outcomes(breaker))


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("state", STATES)
def test_each_state_and_operation_answers_as_a_coroutine(
    fb: types.SimpleNamespace, state: str, op: str
) -> None:
    assert _observe(fb, state, op) == _observe(REFERENCE, state, op)


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("when", ["calling fn", "in fn's awaitable"])
def test_driven_from_inside_its_own_call_it_is_already_executing(
    fb: types.SimpleNamespace, when: str, op: str
) -> None:
    # A coroutine answers ValueError("coroutine already executing") and changes nothing: the
    # call goes on and records one outcome (a breaker with failure_threshold=2 stays CLOSED).
    def run(ns: types.SimpleNamespace) -> tuple[Any, ...]:
        breaker = ns.CircuitBreaker(failure_threshold=2, clock=FakeClock(10**12))
        seen: list[tuple[Any, ...]] = []
        own: list[Any] = []

        async def body() -> str:
            if when == "in fn's awaitable":
                seen.append(_answer(lambda: OPS[op](own[0])))
            return "ok"

        def fn() -> Any:  # a plain function returning an awaitable: it runs inside the call
            if when == "calling fn":
                seen.append(_answer(lambda: OPS[op](own[0])))
            return body()

        own.append(breaker.call_async(fn))
        result = _answer(lambda: own[0].send(None))
        return (tuple(seen), result, _outcomes(breaker), breaker.state)

    got = run(fb)
    assert got == run(REFERENCE)
    seen, result, outcomes, state = got
    assert seen == (("ValueError", "coroutine already executing", "NoneType", "NoneType"),)
    assert result == ("returned", "ok")
    assert outcomes == (1, 1, 0, 0, 0) and state == fb.State.CLOSED
