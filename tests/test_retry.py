"""retry() and retrying(): matching, full jitter, budget, deadlines, per-call state, test mode."""

from __future__ import annotations

import asyncio
import datetime
import inspect
import itertools
import os
import pickle
import threading
import time
import types
from collections.abc import Iterator
from typing import Any

import pytest

from fastbreaker import _retry
from fastbreaker.testing import FakeClock, instant_retries

# The test mode is process-wide and the tests pin the jitter: not for pytest-run-parallel.
pytestmark = pytest.mark.thread_unsafe


@pytest.fixture(autouse=True)
def instant_blocks() -> Iterator[list[float]]:
    with instant_retries() as delays:
        yield delays


@pytest.fixture
def pin_jitter(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Pin the uniform draw of the full jitter: ``pin_jitter(0.5)``."""

    def pin(u: float) -> None:
        monkeypatch.setattr(_retry, "uniform", lambda: u)

    return pin


class Flaky:
    """Fails with ``errors`` in turn, then returns ``value``; records every call."""

    def __init__(
        self, *errors: BaseException, value: object = "ok", clock: Any = None, cost: float = 0.0
    ) -> None:
        self.errors = list(errors)
        self.raised: list[BaseException] = []
        self.calls = 0
        self.value = value
        self.clock = clock
        self.cost = cost

    def __call__(self, *args: object, **kwargs: object) -> object:
        self.calls += 1
        if self.clock is not None:
            self.clock.advance(self.cost)
        if self.errors:
            exc = self.errors.pop(0)
            self.raised.append(exc)
            raise exc
        return self.value


class SpyBudget:
    def __init__(self, allow: bool = True) -> None:
        self.allow = allow
        self.asked = 0
        self.successes = 0

    def allow_retry(self) -> bool:
        self.asked += 1
        return self.allow

    def record_success(self) -> None:
        self.successes += 1


# --- the decorator, sync ----------------------------------------------------------------------


def test_success_first_time_calls_once(
    fb: types.SimpleNamespace, instant_blocks: list[float]
) -> None:
    f = Flaky(value=42)
    assert fb.retry(on=ConnectionError)(f)(1, x=2) == 42
    assert f.calls == 1
    assert instant_blocks == []


def test_retries_until_success(fb: types.SimpleNamespace, instant_blocks: list[float]) -> None:
    f = Flaky(ConnectionError("a"), ConnectionError("b"))
    seen: list[tuple[int, str, float]] = []
    g = fb.retry(
        on=ConnectionError, attempts=3, on_retry=lambda a, e, d: seen.append((a, str(e), d))
    )(f)
    assert g() == "ok"
    assert f.calls == 3
    assert [(a, e) for a, e, _ in seen] == [(1, "a"), (2, "b")]
    assert [d for *_, d in seen] == instant_blocks  # on_retry sees the delay that is slept


def test_attempts_exhausted_reraises_the_last_error_unchanged(fb: types.SimpleNamespace) -> None:
    f = Flaky(*(ConnectionError(i) for i in range(5)))
    with pytest.raises(ConnectionError) as info:
        fb.retry(on=ConnectionError, attempts=4)(f)()
    assert f.calls == 4
    assert info.value is f.raised[-1]
    assert info.value.__cause__ is None and info.value.__context__ is None


def test_attempts_one_means_no_retry(fb: types.SimpleNamespace) -> None:
    f = Flaky(ConnectionError())
    with pytest.raises(ConnectionError):
        fb.retry(on=ConnectionError, attempts=1)(f)()
    assert f.calls == 1


@pytest.mark.parametrize(
    "on",
    [
        (KeyError, ConnectionError),
        ConnectionError,
        OSError,  # ConnectionError is an OSError
        lambda exc: isinstance(exc, ConnectionError) and exc.args == ("x",),
    ],
)
def test_on_accepts_types_tuples_and_predicates(fb: types.SimpleNamespace, on: Any) -> None:
    f = Flaky(ConnectionError("x"))
    assert fb.retry(on=on)(f)() == "ok"
    assert f.calls == 2


@pytest.mark.parametrize(
    "on",
    [KeyError, (KeyError, IndexError), lambda exc: False, lambda exc: isinstance(exc, KeyError)],
)
def test_errors_not_matching_on_propagate_at_once(fb: types.SimpleNamespace, on: Any) -> None:
    f = Flaky(ConnectionError("x"))
    with pytest.raises(ConnectionError):
        fb.retry(on=on, attempts=5)(f)()
    assert f.calls == 1


@pytest.mark.parametrize("on", [Exception, (Exception,), lambda exc: True])
def test_circuit_open_error_is_never_retried(fb: types.SimpleNamespace, on: Any) -> None:
    err = fb.CircuitOpenError("db", fb.State.OPEN, 3.0)
    f = Flaky(err)
    with pytest.raises(fb.CircuitOpenError) as info:
        fb.retry(on=on, attempts=5)(f)()
    assert info.value is err
    assert f.calls == 1


@pytest.mark.parametrize("on", [Exception, lambda exc: True])
def test_load_shed_error_is_never_retried(fb: types.SimpleNamespace, on: Any) -> None:
    err = fb.LoadShedError("api", "queue_full", 1.0)
    f = Flaky(err)
    with pytest.raises(fb.LoadShedError) as info:
        fb.retry(on=on, attempts=5)(f)()
    assert info.value is err
    assert f.calls == 1


def test_base_exceptions_propagate_at_once(fb: types.SimpleNamespace) -> None:
    class Stop(BaseException):
        pass

    f = Flaky(Stop())
    with pytest.raises(Stop):
        fb.retry(on=lambda exc: True, attempts=5)(f)()
    assert f.calls == 1


def test_the_predicate_can_raise(fb: types.SimpleNamespace) -> None:
    def on(exc: Exception) -> bool:
        raise RuntimeError("predicate")

    with pytest.raises(RuntimeError, match="predicate"):
        fb.retry(on=on)(Flaky(ConnectionError()))()


def _run_retried(fb: types.SimpleNamespace, path: str, f: Flaky, **options: Any) -> None:
    """Call ``f`` retried through one of the call paths (each evaluates ``on`` in its own way)."""
    if path == "sync":
        fb.retry(**options)(f)()
    elif path == "sync_deadline":  # a current deadline: the first attempt runs in run_from
        with fb.deadline(60):
            fb.retry(**options)(f)()
    elif path == "async":

        async def af() -> object:
            return f()

        asyncio.run(fb.retry(**options)(af)())
    else:
        for attempt in fb.retrying(**options):
            with attempt:
                f()


@pytest.mark.parametrize("path", ["sync", "sync_deadline", "async", "block"])
@pytest.mark.parametrize("fails_at", [1, 2])
@pytest.mark.parametrize("hook", ["on", "on_retry"])
def test_an_error_of_the_users_hook_carries_the_failure_as_its_context(
    fb: types.SimpleNamespace, path: str, fails_at: int, hook: str
) -> None:
    calls = 0

    def user_hook(*args: object) -> bool:
        nonlocal calls
        calls += 1
        if calls == fails_at:
            raise RuntimeError(hook)
        return True

    f = Flaky(ConnectionError("first"), ConnectionError("second"))
    options: dict[str, Any] = {"on": user_hook} if hook == "on" else {"on": ConnectionError}
    if hook == "on_retry":
        options["on_retry"] = user_hook
    with pytest.raises(RuntimeError, match=hook) as info:
        _run_retried(fb, path, f, **options)
    assert info.value.__context__ is f.raised[fails_at - 1]


def test_on_retry_error_propagates(fb: types.SimpleNamespace, instant_blocks: list[float]) -> None:
    def on_retry(attempt: int, exc: Exception, delay: float) -> None:
        raise RuntimeError("hook")

    f = Flaky(ConnectionError())
    with pytest.raises(RuntimeError, match="hook"):
        fb.retry(on=ConnectionError, on_retry=on_retry)(f)()
    assert f.calls == 1
    assert instant_blocks == []  # no sleep after the hook failed


def test_signature_and_metadata_are_kept(fb: types.SimpleNamespace) -> None:
    def fetch(url: str, *, timeout: float = 1.0) -> bytes:
        """Fetch it."""
        return b""

    async def afetch(url: str, *, timeout: float = 1.0) -> bytes:
        """Fetch it, async."""
        return b""

    for fn, options in itertools.product((fetch, afetch), ({}, {"deadline": 5.0})):
        wrapped = fb.retry(on=ConnectionError, **options)(fn)
        assert inspect.signature(wrapped) == inspect.signature(fn)
        assert wrapped.__name__ == fn.__name__
        assert wrapped.__doc__ == fn.__doc__
        assert wrapped.__wrapped__ is fn
        assert inspect.iscoroutinefunction(wrapped) == inspect.iscoroutinefunction(fn)


def test_methods_can_be_decorated(fb: types.SimpleNamespace) -> None:
    class Client:
        def __init__(self) -> None:
            self.calls = 0

        @fb.retry(on=ConnectionError)
        def get(self, key: str) -> str:
            self.calls += 1
            if self.calls < 2:
                raise ConnectionError
            return key

    c = Client()
    assert c.get("k") == "k"
    assert c.calls == 2


def _module_level(x: int, *, y: int = 0) -> int:
    return x + y


def test_wrapper_behaves_as_a_function(fb: types.SimpleNamespace) -> None:
    # The compiled wrapper is an extension type: it must pass for the twin's function everywhere
    # a user would notice (keywords, binding on classes and instances, pickling by name).
    wrapped = fb.retry(on=ConnectionError)(_module_level)
    assert wrapped(1, y=2) == 3
    assert wrapped(x=4) == 4
    with pytest.raises(TypeError):
        wrapped(1, 2)  # y is keyword-only: fn's own TypeError, not retried
    assert wrapped.__qualname__ == "_module_level"
    assert wrapped.__module__ == __name__
    assert "_module_level" in repr(wrapped)

    class K:
        @fb.retry(on=ConnectionError)
        def m(self, v: int) -> tuple[Any, int]:
            return self, v

    k = K()
    assert k.m(5) == (k, 5)
    assert K.m(k, 6) == (k, 6)  # looked up on the class: unbound, like a function
    globals()["_pickled"] = wrapped
    try:
        wrapped.__qualname__ = "_pickled"
        assert pickle.loads(pickle.dumps(wrapped)) is wrapped
    finally:
        del globals()["_pickled"]


# --- validation -------------------------------------------------------------------------------


def test_on_is_required(fb: types.SimpleNamespace) -> None:
    with pytest.raises(TypeError):
        fb.retry()
    with pytest.raises(TypeError):
        fb.retrying()


@pytest.mark.parametrize("on", [BaseException, KeyboardInterrupt, (), (KeyError, 3), 3, "x", None])
def test_bad_on(fb: types.SimpleNamespace, on: Any) -> None:
    with pytest.raises(TypeError, match="on must be"):
        fb.retry(on=on)
    with pytest.raises(TypeError, match="on must be"):
        fb.retrying(on=on)


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"attempts": 0}, ValueError, "attempts must be >= 1"),
        ({"attempts": -3}, ValueError, "attempts"),
        ({"attempts": 2.0}, TypeError, "attempts"),
        ({"attempts": True}, TypeError, "attempts"),
        ({"base": -0.1}, ValueError, "base must be"),
        ({"base": float("nan")}, ValueError, "base"),
        ({"cap": -1}, ValueError, "cap must be"),
        ({"base": 1.0, "cap": 0.5}, ValueError, "cap must be >= base"),
        ({"cap": float("inf")}, ValueError, "cap"),
        ({"deadline": 0}, ValueError, "deadline"),
        ({"deadline": -1}, ValueError, "deadline"),
        ({"deadline": "1"}, TypeError, "deadline"),
        ({"budget": object()}, TypeError, "budget"),
        ({"on_retry": 1}, TypeError, "on_retry"),
    ],
)
def test_bad_options(
    fb: types.SimpleNamespace, kwargs: dict[str, Any], exc: type, match: str
) -> None:
    with pytest.raises(exc, match=match):
        fb.retry(on=KeyError, **kwargs)
    with pytest.raises(exc, match=match):
        fb.retrying(on=KeyError, **kwargs)


def test_durations_accept_timedelta(fb: types.SimpleNamespace, pin_jitter: Any) -> None:
    pin_jitter(0.5)
    seen: list[float] = []
    g = fb.retry(
        on=KeyError,
        base=datetime.timedelta(milliseconds=100),
        cap=datetime.timedelta(seconds=1),
        deadline=datetime.timedelta(seconds=30),
        on_retry=lambda a, e, d: seen.append(d),
    )(Flaky(KeyError()))
    assert g() == "ok"
    assert seen == [0.05]
    assert fb.retry(on=KeyError, base=0, cap=0)(Flaky(KeyError()))() == "ok"  # no backoff at all


# --- full jitter --------------------------------------------------------------------------------


def test_delays_follow_full_jitter(fb: types.SimpleNamespace, pin_jitter: Any) -> None:
    pin_jitter(0.999999)
    seen: list[float] = []
    f = Flaky(*(KeyError() for _ in range(9)))
    record = lambda a, e, d: seen.append(d)  # noqa: E731
    fb.retry(on=KeyError, attempts=10, base=0.05, cap=2.0, on_retry=record)(f)()
    ceilings = [min(2.0, 0.05 * 2**n) for n in range(9)]
    assert seen == pytest.approx([0.999999 * c for c in ceilings], rel=1e-12)
    pin_jitter(0.0)
    seen.clear()
    fb.retry(on=KeyError, attempts=3, on_retry=record)(Flaky(KeyError(), KeyError()))()
    assert seen == [0.0, 0.0]


def test_real_random_delays_stay_in_bounds(fb: types.SimpleNamespace) -> None:
    seen: list[tuple[int, float]] = []
    f = Flaky(*(KeyError() for _ in range(199)))
    record = lambda a, e, d: seen.append((a, d))  # noqa: E731
    fb.retry(on=KeyError, attempts=200, base=0.01, cap=0.5, on_retry=record)(f)()
    assert len(seen) == 199
    for attempt, delay in seen:
        assert 0.0 <= delay <= min(0.5, 0.01 * 2 ** (attempt - 1))
    assert len({d for _, d in seen}) > 150  # really random


def test_huge_retry_numbers_do_not_overflow_or_slow_down() -> None:
    t0 = time.perf_counter()
    for n in (62, 63, 1024, 10**6, 10**18, 2**200):
        assert _retry.jitter(n, 1, 2**62, 0.5) == 0.5 * 2**62 / 1e9
        assert _retry._ceiling_ns(n, 50_000_000, 2_000_000_000) == 2_000_000_000
    assert time.perf_counter() - t0 < 0.05
    assert _retry._ceiling_ns(61, 1, 2**62) == 2**61
    assert _retry._ceiling_ns(3, 50_000_000, 2_000_000_000) == 400_000_000
    assert _retry._ceiling_ns(10**9, 0, 2_000_000_000) == 0


# --- budget -----------------------------------------------------------------------------------


def test_budget_refusal_reraises_the_error_unchanged(
    fb: types.SimpleNamespace, clock: FakeClock
) -> None:
    budget = fb.RetryBudget(ratio=0, capacity=1, min_per_sec=0, clock=clock)
    assert budget.allow_retry() is True  # empty now
    f = Flaky(ConnectionError("x"), ConnectionError("y"))
    hook: list[int] = []
    with pytest.raises(ConnectionError) as info:
        fb.retry(on=ConnectionError, budget=budget, on_retry=lambda a, e, d: hook.append(a))(f)()
    assert info.value is f.raised[0]
    assert f.calls == 1
    assert hook == []


def test_budget_spends_one_token_per_retry(fb: types.SimpleNamespace, clock: FakeClock) -> None:
    budget = fb.RetryBudget(ratio=0, capacity=2, min_per_sec=0, clock=clock)
    f = Flaky(*(ConnectionError() for _ in range(10)))
    with pytest.raises(ConnectionError):
        fb.retry(on=ConnectionError, attempts=10, budget=budget)(f)()
    assert f.calls == 3  # two retries, then the budget is empty
    assert budget.tokens == 0.0


def test_every_success_records_into_the_budget(fb: types.SimpleNamespace, clock: FakeClock) -> None:
    budget = fb.RetryBudget(ratio=0.25, capacity=10, min_per_sec=0, clock=clock)
    while budget.allow_retry():
        pass
    g = fb.retry(on=KeyError, budget=budget)
    g(Flaky())()
    assert budget.tokens == 0.25
    spy = SpyBudget()
    fb.retry(on=KeyError, budget=spy)(Flaky(KeyError(), KeyError()))()
    assert (spy.asked, spy.successes) == (2, 1)
    with pytest.raises(ValueError):
        fb.retry(on=KeyError, budget=spy)(Flaky(ValueError()))()
    assert spy.successes == 1  # failures deposit nothing


def test_budget_is_not_asked_when_attempts_are_used_up(fb: types.SimpleNamespace) -> None:
    spy = SpyBudget()
    with pytest.raises(KeyError):
        fb.retry(on=KeyError, attempts=2, budget=spy)(Flaky(KeyError(), KeyError()))()
    assert spy.asked == 1


# --- deadlines --------------------------------------------------------------------------------


def test_deadline_expired_between_attempts_raises_chained(
    fb: types.SimpleNamespace, clock: FakeClock, pin_jitter: Any
) -> None:
    pin_jitter(0.0)
    f = Flaky(*(ConnectionError(i) for i in range(5)), clock=clock, cost=0.6)
    d = fb.Deadline.after(1, clock=clock)
    with pytest.raises(fb.DeadlineExceeded) as info:
        fb.retry(on=ConnectionError, attempts=5, deadline=d)(f)()
    assert f.calls == 2  # 0.6 s each: the deadline passed during the second
    assert info.value.__cause__ is f.raised[-1]
    assert isinstance(info.value, TimeoutError)


def test_deadline_refuses_a_delay_that_would_end_past_it(
    fb: types.SimpleNamespace, clock: FakeClock, pin_jitter: Any, instant_blocks: list[float]
) -> None:
    pin_jitter(0.5)  # delays 0.5, 1.0, 2.0 with base=1, cap=4
    d = fb.Deadline.after(2.0, clock=clock)
    f = Flaky(*(ConnectionError(i) for i in range(5)), clock=clock, cost=0.1)
    with pytest.raises(fb.DeadlineExceeded, match="would end past the deadline") as info:
        fb.retry(on=ConnectionError, attempts=5, base=1, cap=4, deadline=d)(f)()
    # 0.1 + 0.5 (instant sleep: the clock does not move) + 0.1 ... the third delay (2.0) is refused.
    assert f.calls == 3
    assert instant_blocks == [0.5, 1.0]
    assert info.value.__cause__ is f.raised[-1]


def test_deadline_expired_before_the_first_attempt(
    fb: types.SimpleNamespace, clock: FakeClock
) -> None:
    f = Flaky()
    d = fb.Deadline.after(1, clock=clock)
    clock.advance(1)
    with pytest.raises(fb.DeadlineExceeded) as info:
        fb.retry(on=ConnectionError, deadline=d)(f)()
    assert f.calls == 0
    assert info.value.__cause__ is None


def test_deadline_is_checked_before_the_budget(
    fb: types.SimpleNamespace, clock: FakeClock, pin_jitter: Any
) -> None:
    pin_jitter(0.9)
    spy = SpyBudget()
    d = fb.Deadline.after(0.01, clock=clock)
    with pytest.raises(fb.DeadlineExceeded):
        fb.retry(on=KeyError, base=1, cap=1, budget=spy, deadline=d)(Flaky(KeyError()))()
    assert spy.asked == 0  # no token spent when the deadline refuses
    budget = fb.RetryBudget(ratio=0, capacity=5, min_per_sec=0, clock=clock)
    with pytest.raises(fb.DeadlineExceeded):
        fb.retry(on=KeyError, base=1, cap=1, budget=budget, deadline=d)(Flaky(KeyError()))()
    assert budget.tokens == 5.0


def test_current_deadline_applies_and_explicit_one_combines(
    fb: types.SimpleNamespace, clock: FakeClock, pin_jitter: Any
) -> None:
    pin_jitter(0.0)
    seen: list[object] = []

    def op() -> None:
        seen.append(fb.current_deadline())
        clock.advance(0.4)
        raise ConnectionError

    g = fb.retry(on=ConnectionError, attempts=10)(op)
    with fb.deadline(1, clock=clock) as outer:
        with pytest.raises(fb.DeadlineExceeded):
            g()
    assert len(seen) == 3 and all(s is outer for s in seen)

    # The explicit deadline is earlier: it wins, and it is the current one inside the call.
    seen.clear()
    early = fb.Deadline.after(0.5, clock=clock)
    with fb.deadline(10, clock=clock):
        with pytest.raises(fb.DeadlineExceeded):
            fb.retry(on=ConnectionError, attempts=10, deadline=early)(op)()
    assert len(seen) == 2 and all(s is early for s in seen)

    # The current deadline is earlier than the explicit one: it wins.
    seen.clear()
    with fb.deadline(0.5, clock=clock) as cur:
        with pytest.raises(fb.DeadlineExceeded):
            late = fb.Deadline.after(60, clock=clock)
            fb.retry(on=ConnectionError, attempts=10, deadline=late)(op)()
        assert fb.current_deadline() is cur
    assert len(seen) == 2 and all(s is cur for s in seen)
    assert fb.current_deadline() is None


def test_deadline_in_seconds_starts_per_call(fb: types.SimpleNamespace) -> None:
    seen: list[float] = []

    @fb.retry(on=KeyError, deadline=30)
    def op() -> None:
        seen.append(fb.current_deadline().remaining())

    op()
    op()
    assert len(seen) == 2 and all(29 < s <= 30 for s in seen)
    assert fb.current_deadline() is None


# --- per-call state -----------------------------------------------------------------------------


def test_concurrent_threads_keep_separate_attempt_counts(fb: types.SimpleNamespace) -> None:
    local = threading.local()
    barrier = threading.Barrier(8)
    attempts_seen: list[int] = []

    @fb.retry(on=ConnectionError, attempts=3, on_retry=lambda a, e, d: attempts_seen.append(a))
    def op() -> str:
        local.n = getattr(local, "n", 0) + 1
        if local.n % 3:
            os.sched_yield() if hasattr(os, "sched_yield") else None  # let threads interleave
            raise ConnectionError
        return "ok"

    results: list[str] = []

    def worker() -> None:
        barrier.wait()
        for _ in range(100):
            results.append(op())

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == ["ok"] * 800  # a shared attempt count would have run out
    assert sorted(attempts_seen) == [1] * 800 + [2] * 800


async def test_concurrent_tasks_keep_separate_attempt_counts(fb: types.SimpleNamespace) -> None:
    counts: dict[int, int] = {}

    @fb.retry(on=ConnectionError, attempts=3)
    async def op(key: int) -> int:
        counts[key] = counts.get(key, 0) + 1
        await asyncio.sleep(0)
        if counts[key] < 3:
            raise ConnectionError
        return key

    assert await asyncio.gather(*(op(k) for k in range(200))) == list(range(200))
    assert set(counts.values()) == {3}


# --- async decorator ----------------------------------------------------------------------------


async def test_async_retries_and_reraises(
    fb: types.SimpleNamespace, instant_blocks: list[float]
) -> None:
    f = Flaky(ConnectionError(), ConnectionError(), ConnectionError())

    @fb.retry(on=ConnectionError, attempts=3)
    async def op() -> object:
        return f()

    with pytest.raises(ConnectionError) as info:
        await op()
    assert info.value is f.raised[-1]
    assert f.calls == 3 and len(instant_blocks) == 2

    g = Flaky(ConnectionError())
    spy = SpyBudget()

    @fb.retry(on=ConnectionError, budget=spy)
    async def op2() -> object:
        return g()

    assert await op2() == "ok"
    assert (spy.asked, spy.successes) == (1, 1)


async def test_async_deadline_and_circuit_open(fb: types.SimpleNamespace, clock: FakeClock) -> None:
    f = Flaky(*(KeyError() for _ in range(9)), clock=clock, cost=0.5)

    @fb.retry(on=KeyError, attempts=10, base=0, cap=0, deadline=fb.Deadline.after(1, clock=clock))
    async def op() -> object:
        return f()

    with pytest.raises(fb.DeadlineExceeded) as info:
        await op()
    assert f.calls == 2 and info.value.__cause__ is f.raised[-1]

    h = Flaky(fb.CircuitOpenError(None, fb.State.OPEN, 1.0))

    @fb.retry(on=Exception)
    async def op2() -> object:
        return h()

    with pytest.raises(fb.CircuitOpenError):
        await op2()
    assert h.calls == 1


# --- real sleeps (a millisecond) and the test mode -----------------------------------------


def test_real_sleep_when_not_in_test_mode(fb: types.SimpleNamespace, pin_jitter: Any) -> None:
    pin_jitter(0.999)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_retry, "instant_blocks", [])
        t0 = time.perf_counter()
        assert fb.retry(on=KeyError, base=0.002, cap=0.002)(Flaky(KeyError()))() == "ok"
        assert time.perf_counter() - t0 >= 0.0019


async def test_real_async_sleep_when_not_in_test_mode(
    fb: types.SimpleNamespace, pin_jitter: Any
) -> None:
    pin_jitter(0.999)
    f = Flaky(KeyError())

    @fb.retry(on=KeyError, base=0.002, cap=0.002)
    async def op() -> object:
        return f()

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_retry, "instant_blocks", [])
        t0 = time.perf_counter()
        assert await op() == "ok"
        assert time.perf_counter() - t0 >= 0.0019


def test_instant_retries_skips_sleeps_and_reports_them(
    fb: types.SimpleNamespace, pin_jitter: Any
) -> None:
    pin_jitter(0.5)
    f = Flaky(KeyError(), KeyError())
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_retry, "instant_blocks", [])
        with instant_retries() as outer:
            with instant_retries() as inner:
                t0 = time.perf_counter()
                assert fb.retry(on=KeyError, base=10, cap=60)(f)() == "ok"
                assert time.perf_counter() - t0 < 1  # 5 s + 10 s were not slept
            assert inner == outer == [5.0, 10.0]
            assert _retry.instant_blocks == [outer]
        assert _retry.instant_blocks == []


def test_instant_retries_works_from_other_threads(fb: types.SimpleNamespace) -> None:
    # "Anywhere in the process": a thread started inside the block does not sleep either.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_retry, "instant_blocks", [])
        with instant_retries() as delays:
            t = threading.Thread(target=fb.retry(on=KeyError, base=30, cap=30)(Flaky(KeyError())))
            t0 = time.perf_counter()
            t.start()
            t.join()
            assert time.perf_counter() - t0 < 1
        assert len(delays) == 1


# --- the block form -----------------------------------------------------------------------------


def test_block_form_retries_until_success(
    fb: types.SimpleNamespace, instant_blocks: list[float]
) -> None:
    f = Flaky(KeyError(), KeyError())
    numbers: list[int] = []
    after: list[int] = []
    for attempt in fb.retrying(on=KeyError, attempts=3):
        numbers.append(attempt.number)
        with attempt:
            result = f()
        after.append(attempt.number)
    assert result == "ok"
    assert numbers == [1, 2, 3]
    assert after == [1, 2, 3]  # swallowed failures continue the body, as another attempt follows
    assert len(instant_blocks) == 2
    assert repr(attempt) == "<Attempt 3>"


def test_block_form_exhausted_raises_from_the_with_block(fb: types.SimpleNamespace) -> None:
    f = Flaky(*(KeyError(i) for i in range(3)))
    reached: list[int] = []
    with pytest.raises(KeyError) as info:
        for attempt in fb.retrying(on=KeyError, attempts=3):
            with attempt:
                f()
            reached.append(attempt.number)
    assert info.value is f.raised[-1]
    assert reached == [1, 2]  # the code after the last failed attempt did not run
    assert f.calls == 3


def test_block_form_non_matching_and_circuit_open_propagate(fb: types.SimpleNamespace) -> None:
    for exc in (ValueError("v"), fb.CircuitOpenError("x", fb.State.OPEN, 1.0)):
        f = Flaky(exc)
        with pytest.raises(type(exc)):
            for attempt in fb.retrying(on=lambda e: not isinstance(e, ValueError), attempts=5):
                with attempt:
                    f()
        assert f.calls == 1


def test_block_form_budget_and_deadline(
    fb: types.SimpleNamespace, clock: FakeClock, pin_jitter: Any
) -> None:
    pin_jitter(0.0)
    spy = SpyBudget(allow=False)
    f = Flaky(KeyError("a"), KeyError("b"))
    with pytest.raises(KeyError) as info:
        for attempt in fb.retrying(on=KeyError, budget=spy):
            with attempt:
                f()
    assert info.value is f.raised[0] and spy.asked == 1

    spy = SpyBudget()
    for attempt in fb.retrying(on=KeyError, budget=spy):
        with attempt:
            Flaky()()
    assert spy.successes == 1

    f = Flaky(*(KeyError(i) for i in range(9)), clock=clock, cost=0.4)
    d = fb.Deadline.after(1, clock=clock)
    with pytest.raises(fb.DeadlineExceeded) as dinfo:
        for attempt in fb.retrying(on=KeyError, attempts=10, deadline=d):
            with attempt:
                assert fb.current_deadline() is d
                f()
    assert f.calls == 3 and dinfo.value.__cause__ is f.raised[-1]
    assert fb.current_deadline() is None


def test_block_form_deadline_expired_before_the_first_attempt(
    fb: types.SimpleNamespace, clock: FakeClock
) -> None:
    d = fb.Deadline.after(0, clock=clock)
    with pytest.raises(fb.DeadlineExceeded):
        for _ in fb.retrying(on=KeyError, deadline=d):
            pytest.fail("no attempt may start after the deadline")


def test_block_form_is_reusable_with_separate_counts(fb: types.SimpleNamespace) -> None:
    r = fb.retrying(on=KeyError, attempts=2)
    for _ in range(3):
        f = Flaky(KeyError())
        for attempt in r:
            with attempt:
                f()
        assert attempt.number == 2


def test_block_form_without_with_stops_after_one_attempt(fb: types.SimpleNamespace) -> None:
    numbers = [attempt.number for attempt in fb.retrying(on=KeyError)]
    assert numbers == [1]


async def test_async_block_form(fb: types.SimpleNamespace, instant_blocks: list[float]) -> None:
    f = Flaky(KeyError(), KeyError())
    numbers: list[int] = []
    async for attempt in fb.retrying(on=KeyError, attempts=3):
        with attempt:
            numbers.append(attempt.number)
            await asyncio.sleep(0)
            f()
    assert numbers == [1, 2, 3] and len(instant_blocks) == 2

    g = Flaky(*(KeyError(i) for i in range(3)))
    with pytest.raises(KeyError) as info:
        async for attempt in fb.retrying(on=KeyError, attempts=3):
            with attempt:
                g()
    assert info.value is g.raised[-1]


# --- with a circuit breaker ---------------------------------------------------------------------


def test_breaker_above_retry_sees_one_outcome_per_operation(
    fb: types.SimpleNamespace, clock: FakeClock
) -> None:
    breaker = fb.CircuitBreaker(failure_threshold=2, reset_timeout=30, clock=clock)
    f = Flaky(*(ConnectionError(i) for i in range(100)))

    @breaker
    @fb.retry(on=ConnectionError, attempts=3)
    def op() -> object:
        return f()

    with pytest.raises(ConnectionError):
        op()
    assert f.calls == 3
    assert breaker.state == fb.State.CLOSED  # three attempts, one failure
    with pytest.raises(ConnectionError):
        op()
    assert breaker.state == fb.State.OPEN
    with pytest.raises(fb.CircuitOpenError):
        op()
    assert f.calls == 6  # no retry ran against the open circuit


def test_open_breaker_inside_a_retry_is_not_retried(
    fb: types.SimpleNamespace, clock: FakeClock
) -> None:
    breaker = fb.CircuitBreaker(failure_threshold=1, reset_timeout=30, clock=clock)
    breaker.trip()
    f = Flaky()

    @fb.retry(on=Exception, attempts=5)
    @breaker
    def op() -> object:
        return f()

    with pytest.raises(fb.CircuitOpenError):
        op()
    assert f.calls == 0


# --- the outage simulation ----------------------------------------------------------------------


def simulate(fb: types.SimpleNamespace, budget: Any, clock: FakeClock) -> dict[str, float]:
    """1,000 callers, one call each per simulated second: 5 s healthy, then a 10 s outage in
    which every call fails. Returns what the backend saw."""
    callers, healthy_s, outage_s = 1000, 5, 10
    step = 1.0 / callers
    down = False
    sent = 0

    @fb.retry(on=ConnectionError, attempts=3, budget=budget)
    def call() -> str:
        nonlocal sent
        sent += 1
        if down:
            raise ConnectionError("backend down")
        return "ok"

    for _ in range(healthy_s * callers):
        assert call() == "ok"
        clock.advance(step)
    assert sent == healthy_s * callers  # healthy traffic sends no retries
    tokens_at_start = budget.tokens if budget is not None else float("nan")
    down, sent = True, 0
    t0 = clock()
    operations = outage_s * callers
    for _ in range(operations):
        with pytest.raises(ConnectionError):
            call()
        clock.advance(step)
    duration = (clock() - t0) / 1e9
    return {
        "operations": operations,
        "sent": sent,
        "retries": sent - operations,
        "load": sent / operations,
        "tokens_at_start": tokens_at_start,
        "duration": duration,
    }


def test_outage_simulation_budget_bounds_retries(
    fb: types.SimpleNamespace, clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    budget = fb.RetryBudget(ratio=0.1, capacity=100, min_per_sec=1, clock=clock)
    with_budget = simulate(fb, budget, clock)
    without = simulate(fb, None, clock)

    bound = with_budget["tokens_at_start"] + budget.min_per_sec * with_budget["duration"]
    assert with_budget["tokens_at_start"] == 100.0
    assert with_budget["retries"] <= bound
    assert with_budget["retries"] >= 100  # it did retry while it had tokens
    assert without["sent"] == 3 * without["operations"]  # every call tried 3 times

    with capsys.disabled():
        print(
            f"\n[outage simulation, {fb.impl}] 10,000 operations in a 10 s outage, attempts=3: "
            f"with budget {with_budget['sent']:,} requests (load x{with_budget['load']:.3f}, "
            f"{with_budget['retries']:,} retries <= bound {bound:.0f}); "
            f"without budget {without['sent']:,} requests (load x{without['load']:.1f})"
        )
