"""fallback and stale_on_error: degraded answers that are counted, timed and logged.

Every test runs on both cores (the ``fb`` fixture) with a ``FakeClock``; nothing sleeps.
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import gc
import inspect
import itertools
import logging
import threading
import warnings
from typing import Any, Callable

import pytest
from memory_support import assert_flat, not_on_free_threading

import fastbreaker


class CountingClock:
    """A FakeClock that counts its readings."""

    def __init__(self, clock: fastbreaker.testing.FakeClock) -> None:
        self.clock = clock
        self.reads = 0

    def __call__(self) -> int:
        self.reads += 1
        return self.clock()


def tripped(fb, clock, **options: Any) -> Any:
    b = fb.CircuitBreaker(1, 30, clock=clock, **options)
    b.trip()
    return b


# -- fallback ----------------------------------------------------------------------------------
def test_handler_gets_the_error_and_the_arguments_and_its_value_is_returned(fb, clock) -> None:
    seen: list[tuple[Any, ...]] = []
    b = tripped(fb, clock, name="db")

    def handler(exc: Exception, *args: Any, **kwargs: Any) -> str:
        seen.append((exc, args, kwargs))
        return f"cached-{args[0]}-{kwargs['port']}"

    @fb.fallback(handler, clock=clock)
    @b
    def fetch(host: str, *, port: int = 80) -> str:
        raise AssertionError("not called while OPEN")

    assert fetch("h", port=8080) == "cached-h-8080"
    [(exc, args, kwargs)] = seen
    assert type(exc) is fb.CircuitOpenError and exc.name == "db"
    assert (args, kwargs) == (("h",), {"port": 8080})
    assert b.metrics().rejected == 1
    assert fetch.metrics() == fb.FallbackMetrics(1, 1, 0, 0.0)


def test_a_normal_answer_is_returned_and_the_handler_not_called(fb, clock) -> None:
    handler_calls: list[Exception] = []
    b = fb.CircuitBreaker(clock=clock)

    @fb.fallback(lambda exc, x: handler_calls.append(exc), clock=clock)
    @b
    def double(x: int) -> int:
        return 2 * x

    assert double(21) == 42
    assert handler_calls == []
    assert double.metrics() == fb.FallbackMetrics(1, 0, 0, 0.0)
    assert b.metrics().successes == 1


def test_by_default_only_rejections_get_a_fallback(fb, clock) -> None:
    bulkhead = fb.Bulkhead(1, clock=clock)

    @fb.fallback(lambda exc, fail: type(exc).__name__, clock=clock)
    @bulkhead
    def work(fail: bool) -> str:
        if fail:
            raise ValueError("a real error")
        return "done"

    with pytest.raises(ValueError, match="a real error"):
        work(True)
    assert work(False) == "done"
    assert bulkhead.try_acquire()
    try:
        assert work(False) == "BulkheadFullError"
    finally:
        bulkhead.release()
    assert bulkhead.metrics().rejected == 1
    assert work.metrics() == fb.FallbackMetrics(3, 1, 0, 0.0)


def test_load_shed_errors_get_a_fallback_by_default(fb, clock) -> None:
    @fb.fallback(lambda exc: exc.reason, clock=clock)
    def handle() -> str:
        raise fb.LoadShedError("api", "queue_full", 1.0)

    assert handle() == "queue_full"


def test_errors_not_in_on_propagate(fb, clock) -> None:
    called: list[Exception] = []

    @fb.fallback(
        lambda exc, _: called.append(exc) or "fallback", on=(KeyError, OSError), clock=clock
    )
    def get(exc: Exception) -> str:
        raise exc

    assert get(KeyError("k")) == "fallback"
    assert get(ConnectionResetError("reset")) == "fallback"  # a subclass of OSError
    with pytest.raises(ValueError, match="not in on"):
        get(ValueError("not in on"))
    assert [type(e) for e in called] == [KeyError, ConnectionResetError]
    assert get.metrics()[:3] == (3, 2, 0)


def test_a_single_exception_type_as_on(fb, clock) -> None:
    @fb.fallback(lambda exc, _: "fallback", on=LookupError, clock=clock)
    def get(exc: Exception) -> str:
        raise exc

    assert get(IndexError()) == "fallback"
    with pytest.raises(TypeError):
        get(TypeError())


def test_predicate_on(fb, clock) -> None:
    def retriable(exc: Exception) -> bool:
        return isinstance(exc, OSError) and exc.errno == 503

    @fb.fallback(lambda exc, errno: f"busy-{errno}", on=retriable, clock=clock)
    def get(errno: int) -> str:
        raise OSError(errno, "status")

    assert get(503) == "busy-503"
    with pytest.raises(OSError) as info:
        get(500)
    assert info.value.errno == 500
    assert get.metrics()[:2] == (2, 1)


def test_an_error_of_the_handler_propagates_chained_to_the_original(fb, clock) -> None:
    def handler(exc: Exception) -> str:
        raise RuntimeError("no fallback either")

    @fb.fallback(handler, on=Exception, clock=clock)
    def get() -> str:
        raise ConnectionError("down")

    with pytest.raises(RuntimeError, match="no fallback either") as info:
        get()
    assert isinstance(info.value.__context__, ConnectionError)
    assert get.metrics() == fb.FallbackMetrics(1, 0, 0, 0.0)


async def test_async_function_with_an_async_handler(fb, clock) -> None:
    b = tripped(fb, clock)

    async def handler(exc: Exception, key: str) -> str:
        await asyncio.sleep(0)
        return f"default-{key}"

    @fb.fallback(handler, clock=clock)
    @b
    async def get(key: str) -> str:
        raise AssertionError("not called while OPEN")

    assert inspect.iscoroutinefunction(get)
    assert await get("a") == "default-a"
    b.reset()

    @fb.fallback(handler, clock=clock)
    @b
    async def ok(key: str) -> str:
        await asyncio.sleep(0)
        return key.upper()

    assert await ok("b") == "B"
    assert get.metrics() == fb.FallbackMetrics(1, 1, 0, 0.0)
    assert ok.metrics() == fb.FallbackMetrics(1, 0, 0, 0.0)


async def test_async_function_with_a_sync_handler(fb, clock) -> None:
    @fb.fallback(lambda exc, key: f"sync-{key}-{type(exc).__name__}", on=TimeoutError, clock=clock)
    async def get(key: str) -> str:
        await asyncio.sleep(0)
        raise TimeoutError

    assert await get("k") == "sync-k-TimeoutError"
    assert get.metrics().fallbacks == 1


def test_an_async_handler_for_a_sync_function_is_a_type_error(fb, clock) -> None:
    async def handler(exc: Exception) -> str:
        return "never"

    @fb.fallback(handler, on=Exception, clock=clock)
    def get() -> str:
        raise ConnectionError("down")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(TypeError, match="handler returned an awaitable") as info:
            get()
        gc.collect()
    assert isinstance(info.value.__cause__, ConnectionError)
    assert not [w for w in caught if "never awaited" in str(w.message)]
    assert get.metrics().fallbacks == 0


@pytest.mark.parametrize("error", [KeyboardInterrupt, SystemExit, GeneratorExit])
def test_base_exceptions_always_propagate_from_sync_functions(fb, clock, error) -> None:
    handled: list[BaseException] = []

    @fb.fallback(lambda exc: handled.append(exc), on=lambda exc: True, clock=clock)
    def get() -> None:
        raise error()

    @fb.stale_on_error(0, stale_ttl=60, clock=clock)
    def cached(fail: bool) -> str:
        if fail:
            raise error()
        return "good"

    with pytest.raises(error):
        get()
    assert cached(False) == "good"
    with pytest.raises(error):
        cached(True)
    assert handled == []
    assert get.metrics() == fb.FallbackMetrics(1, 0, 0, 0.0)
    assert cached.metrics() == fb.FallbackMetrics(2, 0, 0, 0.0)


async def test_cancellation_always_propagates_from_async_functions(fb, clock) -> None:
    handled: list[BaseException] = []

    @fb.fallback(lambda exc: handled.append(exc), on=lambda exc: True, clock=clock)
    async def get() -> None:
        raise asyncio.CancelledError

    @fb.stale_on_error(0, stale_ttl=60, clock=clock)
    async def cached(fail: bool) -> str:
        if fail:
            raise asyncio.CancelledError
        return "good"

    with pytest.raises(asyncio.CancelledError):
        await get()
    assert await cached(False) == "good"
    with pytest.raises(asyncio.CancelledError):
        await cached(True)

    started = asyncio.Event()

    @fb.fallback(lambda exc: "fallback", on=lambda exc: True, clock=clock)
    async def slow() -> str:
        started.set()
        await asyncio.sleep(3600)
        return "never"

    task = asyncio.ensure_future(slow())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert handled == []
    assert (get.metrics().fallbacks, cached.metrics().stale_served, slow.metrics().fallbacks) == (
        0,
        0,
        0,
    )


def test_fallback_active_seconds_times_the_unbroken_run_of_degraded_answers(fb, clock) -> None:
    b = fb.CircuitBreaker(1, 30, clock=clock)

    @fb.fallback(lambda exc: "degraded", clock=clock)
    @b
    def get() -> str:
        return "ok"

    assert get() == "ok"
    b.trip()
    assert get() == "degraded"
    assert get.metrics() == fb.FallbackMetrics(2, 1, 0, 0.0)
    clock.advance(2.5)
    assert get.metrics().fallback_active_seconds == 2.5
    assert get() == "degraded"  # the run goes on: still timed from its first answer
    clock.advance(1)
    assert get.metrics() == fb.FallbackMetrics(3, 2, 0, 3.5)
    b.reset()
    assert get() == "ok"
    assert get.metrics() == fb.FallbackMetrics(4, 2, 0, 0.0)
    clock.advance(10)
    assert get.metrics().fallback_active_seconds == 0.0
    b.trip()
    assert get() == "degraded"  # a new run
    clock.advance(0.25)
    assert get.metrics() == fb.FallbackMetrics(5, 3, 0, 0.25)
    assert b.metrics().rejected == 3


def test_an_error_that_propagates_leaves_the_run_as_it_was(fb, clock) -> None:
    state = {"error": fb.CircuitOpenError("x", fb.State.OPEN, 1.0)}

    @fb.fallback(lambda exc: "degraded", clock=clock)
    def get() -> str:
        raise state["error"]

    assert get() == "degraded"
    clock.advance(1)
    state["error"] = ValueError("boom")
    with pytest.raises(ValueError):
        get()
    clock.advance(1)
    assert get.metrics() == fb.FallbackMetrics(2, 1, 0, 2.0)


def test_fallback_reads_the_clock_only_for_degraded_answers(fb, clock) -> None:
    counting = CountingClock(clock)
    fail = [False]

    @fb.fallback(lambda exc: "degraded", on=Exception, clock=counting)
    def get() -> str:
        if fail[0]:
            raise ConnectionError
        return "ok"

    for _ in range(3):
        get()
    assert counting.reads == 0
    fail[0] = True
    for _ in range(3):
        get()
    assert counting.reads == 3


def test_degraded_answers_are_logged_at_debug_with_the_error(fb, clock, caplog) -> None:
    b = tripped(fb, clock)

    @fb.fallback(lambda exc: "degraded", clock=clock)
    @b
    def get() -> str:
        return "ok"

    caplog.set_level(logging.DEBUG, logger="fastbreaker")
    assert get() == "degraded"
    [record] = [r for r in caplog.records if r.name == "fastbreaker"]
    assert record.levelno == logging.DEBUG
    assert record.exc_info is not None and type(record.exc_info[1]) is fb.CircuitOpenError
    assert "get" in record.getMessage() and "fallback" in record.getMessage()


def test_fallback_over_retry_does_not_retry_rejections(fb, clock) -> None:
    b = tripped(fb, clock)
    attempts: list[int] = []

    @fb.fallback(lambda exc: "fallback", clock=clock)
    @fb.retry(on=Exception, attempts=5)
    @b
    def get() -> str:
        attempts.append(1)
        return "ok"

    with fastbreaker.testing.instant_retries() as delays:
        assert get() == "fallback"
    assert (attempts, delays, b.metrics().rejected) == ([], [], 1)


def test_wrappers_keep_the_metadata_and_signature(fb, clock) -> None:
    def fetch(host: str, *, port: int = 80) -> str:
        """Fetch a page."""
        return host

    async def afetch(host: str) -> str:
        return host

    for decorator in (
        fb.fallback(lambda exc, *a, **k: "", clock=clock),
        fb.stale_on_error(1, stale_ttl=2, clock=clock),
    ):
        wrapped = decorator(fetch)
        assert wrapped.__name__ == "fetch" and wrapped.__doc__ == "Fetch a page."
        assert wrapped.__wrapped__ is fetch
        assert inspect.signature(wrapped) == inspect.signature(fetch)
        assert not inspect.iscoroutinefunction(wrapped)
        awrapped = decorator(afetch)
        assert inspect.iscoroutinefunction(awrapped) and awrapped.__name__ == "afetch"


def test_callable_instances_with_an_async_call_get_an_async_wrapper(fb, clock) -> None:
    class Client:
        async def __call__(self, path: str) -> str:
            raise fb.CircuitOpenError("c", fb.State.OPEN, 1.0)

    wrapped = fb.fallback(lambda exc, path: f"offline:{path}", clock=clock)(Client())
    assert inspect.iscoroutinefunction(wrapped)
    assert asyncio.run(wrapped("/x")) == "offline:/x"


def test_metrics_are_an_immutable_named_tuple(fb) -> None:
    assert fb.FallbackMetrics._fields == (
        "calls",
        "fallbacks",
        "stale_served",
        "fallback_active_seconds",
    )
    m = fb.FallbackMetrics(1, 2, 3, 0.5)
    with pytest.raises(AttributeError):
        m.calls = 5


# -- stale_on_error -------------------------------------------------------------------------
class Backend:
    """Answers ``value-<key>-<n>`` (n counts the calls), or raises ``error`` when set."""

    def __init__(self) -> None:
        self.calls: list[Any] = []
        self.error: BaseException | None = None

    def __call__(self, key: Any) -> str:
        self.calls.append(key)
        if self.error is not None:
            raise self.error
        return f"value-{key}-{len(self.calls)}"


def test_a_fresh_result_answers_without_calling_within_ttl(fb, clock) -> None:
    backend = Backend()
    get = fb.stale_on_error(10, stale_ttl=60, clock=clock)(backend)

    assert get("a") == "value-a-1"
    clock.advance(9.999)
    assert get("a") == "value-a-1"
    assert get("b") == "value-b-2"  # another key: called
    assert backend.calls == ["a", "b"]
    assert get.metrics() == fb.FallbackMetrics(3, 0, 0, 0.0)
    clock.advance(0.001)  # exactly ttl after the first result: no longer fresh
    assert get("a") == "value-a-3"
    assert backend.calls == ["a", "b", "a"]


def test_a_stale_result_is_served_on_error_within_stale_ttl(fb, clock) -> None:
    backend = Backend()
    get = fb.stale_on_error(10, stale_ttl=60, clock=clock)(backend)

    assert get("a") == "value-a-1"
    clock.advance(11)
    backend.error = ConnectionError("down")
    assert get("a") == "value-a-1"  # called, failed, served stale
    assert backend.calls == ["a", "a"]
    clock.advance(48.999)  # the result is 59.999 s old
    assert get("a") == "value-a-1"
    assert get.metrics() == fb.FallbackMetrics(3, 0, 2, 48.999)
    clock.advance(0.001)  # 60 s old: past stale_ttl, the error propagates
    with pytest.raises(ConnectionError, match="down"):
        get("a")
    assert get.metrics() == fb.FallbackMetrics(4, 0, 2, 49.0)
    backend.error = None
    assert get("a") == "value-a-5"  # a good answer ends the run
    assert get.metrics() == fb.FallbackMetrics(5, 0, 2, 0.0)


def test_an_error_with_no_result_for_the_key_propagates(fb, clock) -> None:
    backend = Backend()
    get = fb.stale_on_error(10, stale_ttl=60, clock=clock)(backend)
    assert get("a") == "value-a-1"
    clock.advance(11)
    backend.error = ConnectionError("down")
    with pytest.raises(ConnectionError):
        get("b")
    assert get.metrics().stale_served == 0


def test_a_fresh_answer_ends_a_stale_run(fb, clock) -> None:
    backend = Backend()
    get = fb.stale_on_error(10, stale_ttl=60, clock=clock)(backend)
    get("a")
    get("b")
    clock.advance(11)
    backend.error = ConnectionError("down")
    assert get("a") == "value-a-1"
    clock.advance(1)
    assert get.metrics().fallback_active_seconds == 1.0
    backend.error = None
    assert get("a") == "value-a-4"
    assert get("a") == "value-a-4"  # fresh, from the cache: a normal answer
    assert get.metrics() == fb.FallbackMetrics(5, 0, 1, 0.0)


def test_errors_not_in_on_propagate_with_a_result_cached(fb, clock) -> None:
    backend = Backend()
    get = fb.stale_on_error(0, stale_ttl=60, on=(ConnectionError,), clock=clock)(backend)
    assert get("a") == "value-a-1"
    backend.error = ValueError("bad request")
    with pytest.raises(ValueError):
        get("a")
    backend.error = ConnectionError()
    assert get("a") == "value-a-1"
    assert get.metrics() == fb.FallbackMetrics(3, 0, 1, 0.0)


def test_a_predicate_on_for_stale(fb, clock) -> None:
    backend = Backend()
    get = fb.stale_on_error(0, stale_ttl=60, on=lambda exc: "retry" in str(exc), clock=clock)(
        backend
    )
    get("a")
    backend.error = RuntimeError("please retry")
    assert get("a") == "value-a-1"
    backend.error = RuntimeError("fatal")
    with pytest.raises(RuntimeError, match="fatal"):
        get("a")


def test_ttl_zero_always_calls(fb, clock) -> None:
    backend = Backend()
    get = fb.stale_on_error(0, stale_ttl=5, clock=clock)(backend)
    assert [get("a") for _ in range(3)] == ["value-a-1", "value-a-2", "value-a-3"]
    assert backend.calls == ["a", "a", "a"]
    backend.error = OSError()
    assert get("a") == "value-a-3"  # the latest good result
    assert get.metrics() == fb.FallbackMetrics(4, 0, 1, 0.0)


def test_durations_may_be_timedeltas(fb, clock) -> None:
    backend = Backend()
    get = fb.stale_on_error(
        datetime.timedelta(seconds=1), stale_ttl=datetime.timedelta(minutes=1), clock=clock
    )(backend)
    get("a")
    clock.advance(0.5)
    get("a")
    clock.advance(30)
    backend.error = OSError()
    assert get("a") == "value-a-1"
    clock.advance(30)
    with pytest.raises(OSError):
        get("a")
    assert backend.calls == ["a", "a", "a"]


def test_a_custom_key(fb, clock) -> None:
    calls: list[tuple[Any, ...]] = []

    @fb.stale_on_error(10, stale_ttl=60, key=lambda query, *, trace: query["id"], clock=clock)
    def lookup(query: dict[str, Any], *, trace: str) -> str:
        calls.append((query["id"], trace))
        return f"user-{query['id']}-{trace}"

    assert lookup({"id": 7}, trace="t1") == "user-7-t1"
    assert lookup({"id": 7}, trace="t2") == "user-7-t1"  # the same key: fresh, not called
    assert lookup({"id": 8}, trace="t3") == "user-8-t3"
    assert calls == [(7, "t1"), (8, "t3")]


def test_the_default_key_ignores_keyword_order_and_separates_keywords(fb, clock) -> None:
    calls: list[Any] = []

    @fb.stale_on_error(10, stale_ttl=60, clock=clock)
    def get(*args: Any, **kwargs: Any) -> int:
        calls.append((args, kwargs))
        return len(calls)

    assert get(1, a=1, b=2) == 1
    assert get(1, b=2, a=1) == 1
    assert get(1, ("a", 1), ("b", 2)) == 2  # positional values that look like the keywords
    assert get(1) == 3
    assert get(1, 2) == 4
    assert get(1, 2) == 4


def test_least_recently_used_entries_are_dropped_first(fb, clock) -> None:
    backend = Backend()
    get = fb.stale_on_error(10, stale_ttl=60, max_entries=2, clock=clock)(backend)
    get("a")
    get("b")
    assert get("a") == "value-a-1"  # fresh: "a" is now the most recently used
    get("c")  # a third key: "b" is dropped
    assert backend.calls == ["a", "b", "c"]
    assert get("a") == "value-a-1" and get("c") == "value-c-3"  # still cached, not called
    assert get("b") == "value-b-4"  # dropped: called again (and "a" goes now)
    assert backend.calls == ["a", "b", "c", "b"]
    clock.advance(11)
    backend.error = ConnectionError()
    assert get("c") == "value-c-3"
    assert get("b") == "value-b-4"
    with pytest.raises(ConnectionError):
        get("a")
    assert get.metrics().stale_served == 2


def test_a_stale_serve_counts_as_a_use(fb, clock) -> None:
    backend = Backend()
    get = fb.stale_on_error(0, stale_ttl=60, max_entries=2, clock=clock)(backend)
    get("a")
    get("b")
    backend.error = ConnectionError()
    assert get("a") == "value-a-1"  # served stale: "a" is now the most recently used
    backend.error = None
    get("c")  # drops "b"
    backend.error = ConnectionError()
    assert get("a") == "value-a-1"
    with pytest.raises(ConnectionError):
        get("b")


def test_unhashable_arguments_are_a_type_error_naming_key(fb, clock) -> None:
    backend = Backend()
    get = fb.stale_on_error(10, stale_ttl=60, clock=clock)(backend)
    with pytest.raises(TypeError, match="key"):
        get(["not", "hashable"])
    with pytest.raises(TypeError, match="key"):
        get(("a", {}))
    bad_key = fb.stale_on_error(10, stale_ttl=60, key=lambda k: [k], clock=clock)(backend)
    with pytest.raises(TypeError, match=r"key\(\.\.\.\) returned list"):
        bad_key("a")
    assert backend.calls == []
    assert get.metrics().calls == 2


def test_a_rejection_inside_is_served_stale(fb, clock) -> None:
    backend = Backend()
    b = fb.CircuitBreaker(1, 30, clock=clock)
    get = fb.stale_on_error(1, stale_ttl=120, clock=clock)(b(backend))

    assert get("a") == "value-a-1"
    clock.advance(2)
    backend.error = ConnectionError()
    assert get("a") == "value-a-1"  # failed: the breaker trips, the answer is stale
    assert b.state == fb.State.OPEN
    clock.advance(1)
    assert get("a") == "value-a-1"  # rejected: the backend is not called
    assert backend.calls == ["a", "a"]
    assert b.metrics().rejected == 1
    assert get.metrics() == fb.FallbackMetrics(3, 0, 2, 1.0)


async def test_async_stale_on_error(fb, clock) -> None:
    backend = Backend()

    @fb.stale_on_error(10, stale_ttl=60, clock=clock)
    async def get(key: str) -> str:
        await asyncio.sleep(0)
        return backend(key)

    assert inspect.iscoroutinefunction(get)
    assert await get("a") == "value-a-1"
    assert await get("a") == "value-a-1"
    clock.advance(10)
    backend.error = TimeoutError()
    assert await get("a") == "value-a-1"
    clock.advance(50)
    with pytest.raises(TimeoutError):
        await get("a")
    assert backend.calls == ["a", "a", "a"]
    assert get.metrics() == fb.FallbackMetrics(4, 0, 1, 50.0)


async def test_async_calls_for_one_key_are_not_coalesced(fb, clock) -> None:
    calls: list[str] = []

    @fb.stale_on_error(10, stale_ttl=60, clock=clock)
    async def get(key: str) -> str:
        calls.append(key)
        await asyncio.sleep(0)
        return key

    assert await asyncio.gather(get("a"), get("a"), get("a")) == ["a", "a", "a"]
    assert calls == ["a", "a", "a"]
    assert await get("a") == "a"
    assert len(calls) == 3


def test_stale_on_error_reads_the_clock_once_per_call_and_once_per_stale_answer(fb, clock) -> None:
    counting = CountingClock(clock)
    backend = Backend()
    get = fb.stale_on_error(1, stale_ttl=60, clock=counting)(backend)
    get("a")  # called
    get("a")  # fresh
    clock.advance(2)
    backend.error = OSError()
    get("a")  # stale: read at the start and when the failure is answered
    assert counting.reads == 4
    assert get.metrics().fallback_active_seconds == 0.0  # the run began at that answer
    assert counting.reads == 5  # metrics() reads it while degraded


@pytest.mark.parametrize("fails_at", [59.999, 60.0, 130.0])
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_slow_failing_call_judges_the_age_when_it_is_served(fb, clock, fails_at, kind) -> None:
    # stale_ttl 60, the result dated 0; a call starts at 30 and fails at fails_at: the result is
    # fails_at old when it would be served.
    def fail() -> str:
        clock.advance(fails_at - 30)
        raise ConnectionError("slow and down")

    calls = iter([lambda: "good", fail])

    def work(key: str) -> str:
        return next(calls)()

    async def awork(key: str) -> str:
        return work(key)

    get = fb.stale_on_error(10, stale_ttl=60, clock=clock)(work if kind == "sync" else awork)

    def run() -> str:
        return get("a") if kind == "sync" else asyncio.run(get("a"))

    assert run() == "good"
    clock.advance(30)
    if fails_at < 60:
        assert run() == "good"
        assert get.metrics().stale_served == 1
    else:
        with pytest.raises(ConnectionError, match="slow and down"):
            run()
        assert get.metrics().stale_served == 0


def test_stale_answers_are_logged_at_debug(fb, clock, caplog) -> None:
    backend = Backend()
    get = fb.stale_on_error(0, stale_ttl=60, clock=clock)(backend)
    get("a")
    backend.error = ConnectionError("down")
    caplog.set_level(logging.DEBUG, logger="fastbreaker")
    get("a")
    [record] = [r for r in caplog.records if r.name == "fastbreaker"]
    assert record.levelno == logging.DEBUG and "stale" in record.getMessage()
    assert record.exc_info is not None and record.exc_info[1] is backend.error


def test_the_cache_lock_is_not_held_across_the_call(fb, clock) -> None:
    entered, release = threading.Event(), threading.Event()

    @fb.stale_on_error(0, stale_ttl=60, clock=clock)
    def get(key: str) -> str:
        if key == "slow":
            entered.set()
            assert release.wait(10)
        return key

    slow = threading.Thread(target=get, args=("slow",))
    slow.start()
    try:
        assert entered.wait(10)
        done: list[str] = []
        fast = threading.Thread(target=lambda: done.append(get("fast")))
        fast.start()
        fast.join(10)
        assert done == ["fast"]  # while "slow" is still inside the function
    finally:
        release.set()
        slow.join(10)
    assert get.metrics().calls == 2


def test_fallback_over_stale_on_error(fb, clock) -> None:
    backend = Backend()
    backend.error = ConnectionError()
    get = fb.fallback(lambda exc, key: "default", on=ConnectionError, clock=clock)(
        fb.stale_on_error(0, stale_ttl=60, clock=clock)(backend)
    )
    assert get("a") == "default"  # nothing cached: the error reaches the fallback
    assert get.metrics() == fb.FallbackMetrics(1, 1, 0, 0.0)
    assert get.__wrapped__.metrics() == fb.FallbackMetrics(1, 0, 0, 0.0)


# -- validation -------------------------------------------------------------------------------
def handler(exc: Exception) -> None:
    return None


@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda fb: fb.fallback("not callable"), TypeError, "handler must be callable"),
        (lambda fb: fb.fallback(handler, on=42), TypeError, "on must be"),
        (lambda fb: fb.fallback(handler, on=(ValueError, 3)), TypeError, "on must be"),
        (lambda fb: fb.fallback(handler, on=()), TypeError, "non-empty tuple"),
        (lambda fb: fb.fallback(handler, on=KeyboardInterrupt), TypeError, "on must be"),
        (lambda fb: fb.fallback(handler, on=(BaseException,)), TypeError, "on must be"),
        (lambda fb: fb.fallback(handler, clock=5), TypeError, "clock must be"),
        (lambda fb: fb.stale_on_error(-1, stale_ttl=1), ValueError, "ttl must be .* >= 0"),
        (lambda fb: fb.stale_on_error("1", stale_ttl=1), TypeError, "ttl must be a number"),
        (lambda fb: fb.stale_on_error(float("nan"), stale_ttl=1), ValueError, "ttl must be"),
        (lambda fb: fb.stale_on_error(5, stale_ttl=1), ValueError, "stale_ttl must be >= ttl"),
        (lambda fb: fb.stale_on_error(1, stale_ttl=-1), ValueError, "stale_ttl must be"),
        (lambda fb: fb.stale_on_error(1, stale_ttl=2, max_entries=0), ValueError, "max_entries"),
        (lambda fb: fb.stale_on_error(1, stale_ttl=2, max_entries=1.5), TypeError, "max_entries"),
        (lambda fb: fb.stale_on_error(1, stale_ttl=2, max_entries=True), TypeError, "max_entries"),
        (lambda fb: fb.stale_on_error(1, stale_ttl=2, key="id"), TypeError, "key must be"),
        (lambda fb: fb.stale_on_error(1, stale_ttl=2, on="x"), TypeError, "on must be"),
        (lambda fb: fb.stale_on_error(1, stale_ttl=2, clock=5), TypeError, "clock must be"),
    ],
)
def test_bad_options_name_the_parameter(fb, make: Callable[[Any], Any], error, match) -> None:
    with pytest.raises(error, match=match):
        make(fb)


def test_the_range_is_in_the_messages(fb) -> None:
    with pytest.raises(ValueError, match=r"max_entries must be an int >= 1, got 0"):
        fb.stale_on_error(1, stale_ttl=2, max_entries=0)
    with pytest.raises(ValueError, match=r"stale_ttl must be >= ttl \(5 seconds\), got 1"):
        fb.stale_on_error(5, stale_ttl=1)
    fb.stale_on_error(5, stale_ttl=5, max_entries=1)  # the bounds themselves are accepted


def test_what_cannot_be_decorated(fb, clock) -> None:
    def gen() -> Any:
        yield 1

    async def agen() -> Any:
        yield 1

    for decorator in (fb.fallback(handler), fb.stale_on_error(1, stale_ttl=2)):
        with pytest.raises(TypeError, match="needs a callable"):
            decorator(42)
        with pytest.raises(TypeError, match="generator"):
            decorator(gen)
        with pytest.raises(TypeError, match="generator"):
            decorator(agen)
    assert fb.fallback(handler)(functools.partial(int, "3"))() == 3


def test_a_clock_returning_a_bad_value_is_named(fb) -> None:
    get = fb.stale_on_error(1, stale_ttl=2, clock=lambda: 1.5)(str)
    with pytest.raises(TypeError, match="clock must return an int"):
        get("a")


# -- memory ---------------------------------------------------------------------------------
@not_on_free_threading
def test_distinct_keys_keep_memory_flat(fb, clock) -> None:
    fail = [False]

    @fb.stale_on_error(0, stale_ttl=60, max_entries=100, clock=clock)
    def get(key: int) -> str:
        if fail[0]:
            raise ConnectionError
        return "x" * (key % 7)

    keys = itertools.count()

    def step() -> None:
        key = next(keys)
        fail[0] = False
        get(key)
        fail[0] = True
        get(key)  # served stale

    small, large = 2_000, 20_000
    assert_flat(step, small, large)
    m = get.metrics()
    assert m.calls == 2 * (small + large + 400) and m.stale_served == small + large + 400
    fail[0] = True
    with pytest.raises(ConnectionError):
        get(0)  # long dropped
