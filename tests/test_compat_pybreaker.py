"""fastbreaker.compat.pybreaker: pybreaker's API and behaviour, on both cores.

The module is imported as a user would import pybreaker. An autouse fixture switches the core
it drives (``c`` / ``python``, from the ``fb`` fixture) and freezes time: the compat module reads
``monotonic_ns`` and ``datetime`` from its globals, the real pybreaker reads ``datetime``, and
one ``FakeTime`` drives them all. The fidelity tests run the same operations against the real
pybreaker (skipped when it is not installed) and compare everything a user can observe.
"""

from __future__ import annotations

import abc
import gc
import threading
import weakref
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import fastbreaker.compat.pybreaker as pybreaker

WAIT = 10.0  # seconds a thread test may block before it fails (never reached when it passes)


class FakeTime:
    """A time source for the compat module (monotonic ns) and both modules' ``datetime``."""

    BASE = datetime(2030, 1, 1, tzinfo=timezone.utc)

    def __init__(self) -> None:
        self.t = 1000.0
        ft = self

        class FakeDatetime(datetime):
            @classmethod
            def now(cls, tz: Any = None) -> datetime:  # type: ignore[override]
                return ft.BASE + timedelta(seconds=ft.t)

        self.datetime = FakeDatetime

    def monotonic_ns(self) -> int:
        return int(self.t * 1e9)

    def advance(self, seconds: float) -> None:
        self.t += seconds


@pytest.fixture
def ft(monkeypatch: pytest.MonkeyPatch) -> FakeTime:
    ft = FakeTime()
    monkeypatch.setattr(pybreaker, "monotonic_ns", ft.monotonic_ns)
    monkeypatch.setattr(pybreaker, "datetime", ft.datetime)
    return ft


@pytest.fixture(autouse=True)
def core(fb: Any, ft: FakeTime, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Every test runs on both cores (the breaker class hook), with time frozen."""
    monkeypatch.setattr(pybreaker.CircuitBreaker, "_core_breaker_cls", fb.CircuitBreaker)
    return fb.CircuitBreaker


@pytest.fixture
def peer(ft: FakeTime, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The real pybreaker, on the same fake time."""
    real = pytest.importorskip("pybreaker")
    monkeypatch.setattr(real, "datetime", ft.datetime)
    return real


class BusinessError(Exception):
    """Excluded by type."""


class Declined(Exception):
    """Excluded by a predicate."""


class Recorder:
    """A listener recording every event (duck-typed, like pybreaker allows)."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def before_call(self, cb: Any, func: Any, *args: Any, **kwargs: Any) -> None:
        self.events.append(("before_call", *args))

    def success(self, cb: Any) -> None:
        self.events.append(("success",))

    def failure(self, cb: Any, exc: BaseException) -> None:
        self.events.append(("failure", type(exc).__name__))

    def state_change(self, cb: Any, old: Any, new: Any) -> None:
        self.events.append(("state_change", old.name if old else None, new.name))


def work(kind: str) -> str:
    if kind == "fail":
        raise ConnectionError("down")
    if kind == "business":
        raise BusinessError("invalid")
    if kind == "declined":
        raise Declined("no")
    return "ok:" + kind


def gen_work(kind: str) -> Any:
    yield 1
    work(kind)
    yield 2


def outcome(fn: Any) -> tuple[Any, ...]:
    try:
        value = fn()
    except Exception as exc:
        ctx = exc.__context__
        return ("raised", type(exc).__name__, str(exc), type(ctx).__name__ if ctx else None)
    return ("returned", value)


def make(mod: Any, rec: Recorder, **kw: Any) -> Any:
    return mod.CircuitBreaker(
        exclude=[BusinessError, lambda e: isinstance(e, Declined)], listeners=[rec], name="db", **kw
    )


def apply(b: Any, ft: FakeTime, op: tuple[Any, ...]) -> Any:
    what, arg = op
    if what == "call":
        return outcome(lambda: b(work)(arg))
    if what == "direct":
        return outcome(lambda: b.call(work, arg))
    if what == "calling":

        def block() -> str:
            with b.calling():
                return work(arg)

        return outcome(block)
    if what == "gen":
        return outcome(lambda: list(b.call(gen_work, arg)))
    if what == "advance":
        ft.advance(arg)
        return None
    if what == "open":
        return b.open()
    if what == "half_open":
        return b.half_open()
    if what == "close":
        return b.close()
    setattr(b, what, arg)
    return getattr(b, what)


def trace(mod: Any, ft: FakeTime, ops: list[tuple[Any, ...]], **kw: Any) -> list[tuple[Any, ...]]:
    ft.t = 1000.0
    rec = Recorder()
    b = make(mod, rec, **kw)
    steps = []
    for op in ops:
        result = apply(b, ft, op)
        steps.append(
            (
                op,
                result,
                b.current_state,
                b.state.name,
                b.fail_counter,
                b.success_counter,
                b._state_storage.opened_at,
                list(rec.events),
            )
        )
        rec.events.clear()
    return steps


KINDS = st.sampled_from(["ok", "ok", "fail", "fail", "fail", "business", "declined"])
OPS = st.one_of(
    st.tuples(st.sampled_from(["call", "call", "call", "direct", "calling", "gen"]), KINDS),
    st.tuples(st.just("advance"), st.sampled_from([0.5, 1, 5, 9.5, 10, 30, 61])),
    st.tuples(st.sampled_from(["open", "half_open", "close"]), st.none()),
    st.tuples(st.just("fail_max"), st.integers(0, 5)),
    st.tuples(st.just("reset_timeout"), st.sampled_from([0, 1, 10, 60])),
    st.tuples(st.just("success_threshold"), st.integers(1, 3)),
)


# -- fidelity: the same operations against the real pybreaker -----------------------------------


def test_scenario_matches_pybreaker(peer: Any, ft: FakeTime) -> None:
    ops: list[tuple[Any, ...]] = [
        ("call", "ok"),
        ("call", "fail"),
        ("call", "business"),
        ("call", "fail"),
        ("call", "declined"),
        ("call", "fail"),
        ("call", "fail"),
        ("call", "fail"),
        ("call", "ok"),
        ("advance", 9.5),
        ("call", "ok"),
        ("advance", 0.5),
        ("call", "fail"),
        ("advance", 10),
        ("call", "ok"),
        ("call", "ok"),
        ("open", None),
        ("half_open", None),
        ("calling", "ok"),
        ("close", None),
        ("close", None),
        ("gen", "ok"),
        ("gen", "fail"),
    ]
    theirs = trace(peer, ft, ops, fail_max=3, reset_timeout=10)
    ours = trace(pybreaker, ft, ops, fail_max=3, reset_timeout=10)
    assert ours == theirs
    # the scenario exercises what it is meant to
    results = [step[1] for step in ours]
    assert (
        "raised",
        "CircuitBreakerError",
        "Failures threshold reached, circuit breaker opened",
        "ConnectionError",
    ) in results
    assert (
        "raised",
        "CircuitBreakerError",
        "Trial call failed, circuit breaker opened",
        "ConnectionError",
    ) in results
    assert (
        "raised",
        "CircuitBreakerError",
        "Timeout not elapsed yet, circuit breaker still open",
        None,
    ) in results


def test_success_threshold_and_original_error_on_trip_match_pybreaker(
    peer: Any, ft: FakeTime
) -> None:
    ops: list[tuple[Any, ...]] = [
        ("call", "fail"),
        ("call", "fail"),
        ("advance", 5),
        ("call", "ok"),
        ("call", "ok"),
        ("call", "fail"),
        ("advance", 5),
        ("call", "ok"),
        ("call", "business"),
        ("call", "ok"),
        ("call", "ok"),
    ]
    kw = dict(fail_max=2, reset_timeout=5, success_threshold=3, throw_new_error_on_trip=False)
    ours = trace(pybreaker, ft, ops, **kw)
    assert ours == trace(peer, ft, ops, **kw)
    assert [s[4:6] for s in ours][3:5] == [(0, 1), (0, 2)]  # trial successes, counted
    assert ours[1][1][:2] == ("raised", "ConnectionError")  # the original error on the trip


def test_options_changed_on_the_fly_match_pybreaker(peer: Any, ft: FakeTime) -> None:
    ops: list[tuple[Any, ...]] = [
        ("call", "fail"),
        ("call", "fail"),
        ("call", "fail"),
        ("fail_max", 2),
        ("call", "fail"),
        ("reset_timeout", 1),
        ("advance", 1),
        ("success_threshold", 2),
        ("call", "ok"),
        ("success_threshold", 1),
        ("call", "ok"),
        ("fail_max", 0),
        ("call", "fail"),
    ]
    ours = trace(pybreaker, ft, ops, fail_max=5, reset_timeout=10)
    assert ours == trace(peer, ft, ops, fail_max=5, reset_timeout=10)
    assert ours[4][2:5] == ("open", "open", 4)  # fail_max went below the count: pybreaker shows 4


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    ops=st.lists(OPS, max_size=30),
    fail_max=st.integers(1, 4),
    reset_timeout=st.sampled_from([0, 1, 10]),
    success_threshold=st.integers(1, 3),
    throw=st.booleans(),
)
def test_random_operations_match_pybreaker(
    peer: Any,
    ft: FakeTime,
    ops: list[tuple[Any, ...]],
    fail_max: int,
    reset_timeout: int,
    success_threshold: int,
    throw: bool,
) -> None:
    kw = dict(
        fail_max=fail_max,
        reset_timeout=reset_timeout,
        success_threshold=success_threshold,
        throw_new_error_on_trip=throw,
    )
    assert trace(pybreaker, ft, ops, **kw) == trace(peer, ft, ops, **kw)


def test_public_names_match_pybreaker(peer: Any) -> None:
    assert pybreaker.__all__ == peer.__all__
    for name in peer.__all__:
        assert hasattr(pybreaker, name)
    assert (pybreaker.STATE_OPEN, pybreaker.STATE_CLOSED, pybreaker.STATE_HALF_OPEN) == (
        peer.STATE_OPEN,
        peer.STATE_CLOSED,
        peer.STATE_HALF_OPEN,
    )
    for method in ("before_call", "success", "failure", "state_change"):
        assert callable(getattr(pybreaker.CircuitBreakerListener, method))


# -- the documented API ----------------------------------------------------------------------------


def test_defaults_and_read_write_options() -> None:
    b = pybreaker.CircuitBreaker()
    assert (b.fail_max, b.reset_timeout, b.success_threshold, b.name) == (5, 60, 1, None)
    assert (b.current_state, b.state.name, b.fail_counter, b.success_counter) == (
        "closed",
        "closed",
        0,
        0,
    )
    assert isinstance(b.state, pybreaker.CircuitClosedState)
    b.fail_max, b.reset_timeout, b.success_threshold, b.name = 1, 2.5, 2, "db"
    assert (b.fail_max, b.reset_timeout, b.success_threshold, b.name) == (1, 2.5, 2, "db")
    with pytest.raises(pybreaker.CircuitBreakerError, match="Failures threshold reached"):
        b.call(work, "fail")  # fail_max=1 now: this failure opens the circuit
    assert b.current_state == "open"


def test_fail_max_change_applies_to_the_next_failure() -> None:
    b = pybreaker.CircuitBreaker(fail_max=3)
    with pytest.raises(ConnectionError):
        b.call(work, "fail")
    b.fail_max = 2
    with pytest.raises(pybreaker.CircuitBreakerError, match="Failures threshold reached"):
        b.call(work, "fail")
    assert (b.current_state, b.fail_counter) == ("open", 2)


def test_reset_timeout_change_applies_to_the_current_open_period(ft: FakeTime) -> None:
    b = pybreaker.CircuitBreaker(fail_max=1, reset_timeout=60)
    b.open()
    ft.advance(10)
    with pytest.raises(pybreaker.CircuitBreakerError, match="Timeout not elapsed"):
        b.call(work, "ok")
    b.reset_timeout = 10
    assert b.call(work, "ok") == "ok:ok"
    assert b.current_state == "closed"


def test_decorator_forms_keep_metadata() -> None:
    b = pybreaker.CircuitBreaker()

    @b
    def plain(x: int) -> int:
        """Docs."""
        return x + 1

    @b()
    def called(x: int) -> int:
        return x * 2

    assert (plain(1), called(2)) == (2, 4)
    assert plain.__name__ == "plain" and plain.__doc__ == "Docs." and plain.__wrapped__ is not None


def test_decorator_goes_through_a_subclass_call() -> None:
    seen = []

    class Counting(pybreaker.CircuitBreaker):
        def call(self, func: Any, *args: Any, **kwargs: Any) -> Any:
            seen.append(args)
            return super().call(func, *args, **kwargs)

    assert Counting()(work)("x") == "ok:x"
    assert seen == [("x",)]


def test_tornado_paths_are_refused_clearly() -> None:
    b = pybreaker.CircuitBreaker()
    with pytest.raises(NotImplementedError, match="Tornado"):
        b(__pybreaker_call_async=True)
    with pytest.raises(NotImplementedError, match="Tornado"):
        b.call_async(work, "ok")


def test_exclusions_types_predicates_add_remove() -> None:
    b = pybreaker.CircuitBreaker(fail_max=1, exclude=[BusinessError])
    b.add_excluded_exceptions(KeyError, lambda e: isinstance(e, Declined))
    assert b.excluded_exceptions[:2] == (BusinessError, KeyError)
    for exc in (BusinessError(), KeyError(), Declined()):
        assert not b.is_system_error(exc)
    assert b.is_system_error(ConnectionError())
    b.remove_excluded_exception(KeyError)
    assert b.is_system_error(KeyError())
    with pytest.raises(ValueError):
        b.remove_excluded_exception(KeyError)
    # an excluded exception propagates and counts as a success
    with pytest.raises(BusinessError):
        b.call(work, "business")
    assert b.current_state == "closed"


def test_excluded_class_with_a_metaclass_is_matched_by_type() -> None:
    class Abstract(Exception, metaclass=abc.ABCMeta):
        pass

    b = pybreaker.CircuitBreaker(exclude=[Abstract])
    assert b.is_system_error(ConnectionError())  # pybreaker would call Abstract(exc): truthy
    assert not b.is_system_error(type("Sub", (Abstract,), {})())


def test_listeners_add_remove_and_events() -> None:
    rec, other = Recorder(), Recorder()
    b = pybreaker.CircuitBreaker(fail_max=1, listeners=[rec])
    b.add_listeners(other)
    assert b.listeners == (rec, other)
    b.remove_listener(other)
    with pytest.raises(ValueError):
        b.remove_listener(other)
    b.call(work, "ok")
    with pytest.raises(pybreaker.CircuitBreakerError):
        b.call(work, "fail")
    assert rec.events == [
        ("before_call", "ok"),
        ("success",),
        ("before_call", "fail"),
        ("failure", "ConnectionError"),
        ("state_change", "closed", "open"),
    ]
    assert other.events == []


def test_listener_errors_in_before_call_propagate_and_release_the_trial() -> None:
    class Veto(pybreaker.CircuitBreakerListener):
        def before_call(self, cb: Any, func: Any, *args: Any, **kwargs: Any) -> None:
            raise RuntimeError("veto")

    b = pybreaker.CircuitBreaker(fail_max=1, reset_timeout=0)
    b.open()
    veto = Veto()
    b.add_listener(veto)
    with pytest.raises(RuntimeError, match="veto"):
        b.call(work, "ok")
    b.remove_listener(veto)
    assert b.call(work, "ok") == "ok:ok"  # the trial permit was given back
    assert b.current_state == "closed"


def test_state_change_listener_error_on_automatic_transition_is_logged(caplog: Any) -> None:
    class Broken(pybreaker.CircuitBreakerListener):
        def state_change(self, cb: Any, old: Any, new: Any) -> None:
            raise RuntimeError("listener bug")

    b = pybreaker.CircuitBreaker(fail_max=1, listeners=[Broken()])
    with pytest.raises(pybreaker.CircuitBreakerError):
        b.call(work, "fail")
    assert b.current_state == "open"
    assert "listener bug" in caplog.text
    with pytest.raises(RuntimeError, match="listener bug"):
        b.close()  # manual transitions propagate, as in pybreaker


def test_manual_transitions_notify_even_to_the_same_state() -> None:
    rec = Recorder()
    b = pybreaker.CircuitBreaker(listeners=[rec])
    assert b.open() is True
    assert pybreaker.CircuitBreaker(throw_new_error_on_trip=False).open() is False
    b.open()
    b.half_open()
    b.half_open()
    b.close()
    b.close()
    assert [e[1:] for e in rec.events] == [
        ("closed", "open"),
        ("open", "open"),
        ("open", "half-open"),
        ("half-open", "half-open"),
        ("half-open", "closed"),
        ("closed", "closed"),
    ]


def test_state_setter_drives_transitions() -> None:
    b = pybreaker.CircuitBreaker()
    b.state = pybreaker.STATE_OPEN  # type: ignore[assignment]
    assert b.current_state == "open"
    b.state = pybreaker.STATE_HALF_OPEN  # type: ignore[assignment]
    assert isinstance(b.state, pybreaker.CircuitHalfOpenState)
    with pytest.raises(ValueError, match="Unknown state 'bogus'"):
        b.state = "bogus"  # type: ignore[assignment]


def test_half_open_lets_one_trial_then_waits_for_its_outcome() -> None:
    b = pybreaker.CircuitBreaker(fail_max=1, reset_timeout=60)
    b.half_open()
    assert (b.current_state, b.success_counter) == ("half-open", 0)
    gen = b.call(gen_work, "ok")  # the trial: admitted, outcome pending until exhausted
    assert next(gen) == 1
    with pytest.raises(pybreaker.CircuitBreakerError, match="Trial call in progress"):
        b.call(work, "ok")
    assert list(gen) == [2]
    assert b.current_state == "closed"


def test_calling_context_manager() -> None:
    b = pybreaker.CircuitBreaker(fail_max=2)
    with b.calling():
        pass
    for _ in range(2):
        with pytest.raises((ConnectionError, pybreaker.CircuitBreakerError)):
            with b.calling():
                raise ConnectionError
    assert b.current_state == "open"
    entered = []
    with pytest.raises(pybreaker.CircuitBreakerError, match="Timeout not elapsed"):
        with b.calling():
            entered.append(1)
    assert entered == []


def test_validation_errors_name_the_option() -> None:
    # pybreaker's names, never the core's (failure_threshold, probe_timeout)
    with pytest.raises(TypeError, match=r"^fail_max must be an int"):
        pybreaker.CircuitBreaker(fail_max="5")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^fail_max must be in"):
        pybreaker.CircuitBreaker(fail_max=2**60)
    with pytest.raises(TypeError, match=r"^reset_timeout"):
        pybreaker.CircuitBreaker(reset_timeout="60")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^success_threshold"):
        pybreaker.CircuitBreaker(success_threshold=1.5)  # type: ignore[arg-type]
    b = pybreaker.CircuitBreaker()
    with pytest.raises(TypeError, match=r"^fail_max must be an int"):
        b.fail_max = "3"  # type: ignore[assignment]
    assert b.fail_max == 5
    b = pybreaker.CircuitBreaker(fail_max=0, success_threshold=0, reset_timeout=-1)
    assert (b.fail_max, b.success_threshold, b.reset_timeout) == (0, 0, -1)  # as given
    with pytest.raises(pybreaker.CircuitBreakerError):
        b.call(work, "fail")  # acts as fail_max=1, as in pybreaker
    assert b.call(work, "ok") == "ok:ok"  # reset_timeout < 0 acts as 0


# -- deliberate differences ---------------------------------------------------------------------


def test_closing_a_guarded_generator_early_is_not_a_failure() -> None:
    b = pybreaker.CircuitBreaker(fail_max=1)
    gen = b.call(gen_work, "ok")
    assert next(gen) == 1
    gen.close()  # pybreaker counts the GeneratorExit as a failure and opens the circuit
    assert (b.current_state, b.fail_counter) == ("closed", 0)


def test_keyboard_interrupt_is_neither_success_nor_failure() -> None:
    b = pybreaker.CircuitBreaker(fail_max=2)
    with pytest.raises(ConnectionError):
        b.call(work, "fail")

    def interrupted() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        b.call(interrupted)
    assert b.fail_counter == 1


def test_late_success_does_not_close_a_reopened_circuit() -> None:
    b = pybreaker.CircuitBreaker(fail_max=1, reset_timeout=0)
    gen = b.call(gen_work, "ok")  # admitted while closed
    assert next(gen) == 1
    b.open()
    assert list(gen) == [2]  # succeeds after the circuit opened: a stale outcome
    assert b.current_state == "open"


# -- storage ----------------------------------------------------------------------------------------


def test_default_storage_mirrors_the_breaker() -> None:
    b = pybreaker.CircuitBreaker(fail_max=3)
    storage = b._state_storage
    assert isinstance(storage, pybreaker.CircuitMemoryStorage) and storage.name == "memory"
    with pytest.raises(ConnectionError):
        b.call(work, "fail")
    assert (storage.state, storage.counter, storage.success_counter, storage.opened_at) == (
        "closed",
        1,
        0,
        None,
    )
    b.open()
    assert storage.state == "open" and storage.opened_at is not None
    with pytest.raises(RuntimeError, match="open\\(\\), half_open\\(\\) and close\\(\\)"):
        storage.state = "closed"
    with pytest.raises(RuntimeError):
        storage.increment_counter()


def test_storage_sets_the_initial_state(ft: FakeTime) -> None:
    rec = Recorder()
    b = pybreaker.CircuitBreaker(
        state_storage=pybreaker.CircuitMemoryStorage(pybreaker.STATE_OPEN), listeners=[rec]
    )
    assert b.current_state == "open"
    assert rec.events == []  # no notification for the initial state
    assert b.call(work, "ok") == "ok:ok"  # no opened_at: the next call is a trial
    assert rec.events[0] == ("state_change", "open", "half-open")

    storage = pybreaker.CircuitMemoryStorage(pybreaker.STATE_OPEN)
    storage.opened_at = ft.datetime.now(timezone.utc) - timedelta(seconds=10)
    b = pybreaker.CircuitBreaker(reset_timeout=60, state_storage=storage)
    ft.advance(49)
    with pytest.raises(pybreaker.CircuitBreakerError):
        b.call(work, "ok")
    ft.advance(1)
    assert b.call(work, "ok") == "ok:ok"

    storage = pybreaker.CircuitMemoryStorage(pybreaker.STATE_HALF_OPEN)
    b = pybreaker.CircuitBreaker(state_storage=storage, success_threshold=2)
    assert b.current_state == "half-open"
    b.call(work, "ok")
    assert (b.current_state, b.success_counter) == ("half-open", 1)


def test_storage_errors_are_clear(peer: Any) -> None:
    with pytest.raises(
        ValueError, match="Unknown state 'bogus', valid states: closed, open, half-open"
    ):
        pybreaker.CircuitBreaker(state_storage=pybreaker.CircuitMemoryStorage("bogus"))
    with pytest.raises(ValueError, match="Unknown state 'bogus'"):
        pybreaker.CircuitRedisStorage("bogus", object())
    with pytest.raises(TypeError, match="CircuitMemoryStorage or CircuitRedisStorage"):
        pybreaker.CircuitBreaker(state_storage=peer.CircuitMemoryStorage(peer.STATE_CLOSED))
    storage = pybreaker.CircuitMemoryStorage(pybreaker.STATE_CLOSED)
    pybreaker.CircuitBreaker(state_storage=storage)
    with pytest.raises(ValueError, match="already backs"):
        pybreaker.CircuitBreaker(state_storage=storage)


# -- thread safety without a global lock --------------------------------------------------------


def test_calls_are_not_serialized() -> None:
    b = pybreaker.CircuitBreaker()
    barrier = threading.Barrier(2, timeout=WAIT)  # breaks (and fails) if the calls serialize
    results: list[Any] = []

    def both_inside() -> None:
        results.append(b.call(barrier.wait))

    threads = [threading.Thread(target=both_inside) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert sorted(results) == [0, 1]


def test_one_trial_at_a_time_and_others_refused() -> None:
    rec = Recorder()
    b = pybreaker.CircuitBreaker(fail_max=1, reset_timeout=0, listeners=[rec])
    b.open()
    inside, release = threading.Event(), threading.Event()

    def trial() -> str:
        inside.set()
        assert release.wait(WAIT)
        return "ok"

    result: list[Any] = []
    t = threading.Thread(target=lambda: result.append(b.call(trial)))
    t.start()
    assert inside.wait(WAIT)
    refused = [outcome(lambda: b.call(work, "ok")) for _ in range(5)]
    release.set()
    t.join(WAIT)
    assert result == ["ok"] and b.current_state == "closed"
    assert (
        refused
        == [
            (
                "raised",
                "CircuitBreakerError",
                "Trial call in progress, circuit breaker half-open",
                None,
            )
        ]
        * 5
    )
    changes = [e[1:] for e in rec.events if e[0] == "state_change"]
    assert changes == [("closed", "open"), ("open", "half-open"), ("half-open", "closed")]


def test_concurrent_failures_trip_once() -> None:
    n = 8
    rec = Recorder()
    b = pybreaker.CircuitBreaker(fail_max=3, listeners=[rec])
    barrier = threading.Barrier(n, timeout=WAIT)  # every call is admitted before any fails
    errors: list[tuple[Any, ...]] = []

    def fail() -> None:
        barrier.wait()
        raise ConnectionError("down")

    def run() -> None:
        errors.append(outcome(lambda: b.call(fail)))

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    names = [e[1] for e in errors]
    assert names.count("CircuitBreakerError") == 1 and names.count("ConnectionError") == n - 1
    assert [e for e in rec.events if e[0] == "state_change"] == [("state_change", "closed", "open")]
    assert (b.current_state, b.fail_counter) == ("open", 3)


def test_breaker_is_garbage_collected() -> None:
    b = pybreaker.CircuitBreaker(listeners=[Recorder()])
    b.call(work, "ok")
    ref = weakref.ref(b)
    del b
    gc.collect()
    assert ref() is None


def test_redis_storage_is_shared_with_real_pybreaker(peer: Any) -> None:
    """The same keys and formats as pybreaker: a circuit opened by a pybreaker process is open
    here, and the other way round."""
    fakeredis = pytest.importorskip("fakeredis")
    client = fakeredis.FakeStrictRedis()
    theirs = peer.CircuitBreaker(
        fail_max=2, state_storage=peer.CircuitRedisStorage("closed", client, namespace="ns")
    )
    ours = pybreaker.CircuitBreaker(
        fail_max=2, state_storage=pybreaker.CircuitRedisStorage("closed", client, namespace="ns")
    )
    for _ in range(2):
        with pytest.raises((ConnectionError, peer.CircuitBreakerError)):
            theirs.call(work, "fail")
    assert ours.current_state == "open" and ours.fail_counter == 2
    with pytest.raises(pybreaker.CircuitBreakerError):
        ours.call(lambda: 1)
    ours.close()
    assert theirs.current_state == "closed" and theirs.fail_counter == 0


def test_dry_run_never_refuses_and_keeps_the_original_errors(ft: FakeTime) -> None:
    breaker = pybreaker.CircuitBreaker(fail_max=2, reset_timeout=30, dry_run=True)

    def fail() -> None:
        raise ConnectionError("down")

    for _ in range(2):
        with pytest.raises(ConnectionError):  # no CircuitBreakerError on the trip either
            breaker.call(fail)
    assert breaker.current_state == pybreaker.STATE_OPEN
    assert breaker.call(lambda: 5) == 5  # would have been refused
    with pytest.raises(ConnectionError):
        breaker.call(fail)
    m = breaker._core.metrics()
    assert (m.would_reject, m.rejected, m.stale, m.failures) == (2, 0, 2, 2)
