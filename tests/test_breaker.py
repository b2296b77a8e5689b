"""Behaviour of CircuitBreaker's state machine, on both implementations (the ``fb`` fixture)."""

from __future__ import annotations

import datetime
import math
import threading

import pytest

from fastbreaker.testing import FakeClock


def make(fb, clock, **kw):
    kw.setdefault("clock", clock)
    return fb.CircuitBreaker(**kw)


def fail_n(b, n):
    for _ in range(n):
        assert b.allow()
        b.record_failure()


# -- consecutive mode -------------------------------------------------------------------------


def test_consecutive_failures_trip(fb, clock):
    b = make(fb, clock, failure_threshold=3)
    fail_n(b, 2)
    assert b.state == fb.State.CLOSED
    fail_n(b, 1)
    assert b.state == fb.State.OPEN
    assert not b.allow()
    m = b.metrics()
    assert (m.permitted, m.rejected, m.failures, m.opened) == (3, 1, 3, 1)


def test_success_resets_consecutive_count(fb, clock):
    b = make(fb, clock, failure_threshold=3)
    fail_n(b, 2)
    assert b.metrics().consecutive_failures == 2
    b.allow()
    b.record_success()
    assert b.metrics().consecutive_failures == 0
    fail_n(b, 2)
    assert b.state == fb.State.CLOSED
    fail_n(b, 1)
    assert b.state == fb.State.OPEN


def test_default_threshold_is_five(fb, clock):
    b = make(fb, clock)
    fail_n(b, 4)
    assert b.state == fb.State.CLOSED
    fail_n(b, 1)
    assert b.state == fb.State.OPEN


# -- window mode --------------------------------------------------------------------------------


def test_window_trips_on_failure_rate_after_min_calls(fb, clock):
    b = make(fb, clock, window=10, min_calls=4, failure_rate=0.5)
    for ok in (False, False, True):
        b.allow()
        b.record_success() if ok else b.record_failure()
    assert b.state == fb.State.CLOSED  # 3 < min_calls even at 66% failures
    b.allow()
    b.record_success()  # 2/4 = 0.5 >= 0.5
    assert b.state == fb.State.OPEN


def test_window_rate_below_threshold_stays_closed(fb, clock):
    b = make(fb, clock, window=10, min_calls=10, failure_rate=0.5)
    for i in range(100):
        b.allow()
        b.record_failure() if i % 3 == 0 else b.record_success()
    assert b.state == fb.State.CLOSED
    m = b.metrics()
    assert m.recorded == 10
    assert 0 < m.failure_rate < 0.5


def test_window_forgets_old_outcomes(fb, clock):
    b = make(fb, clock, window=4, min_calls=4, failure_rate=0.75)
    fail_n(b, 2)
    for _ in range(4):
        b.allow()
        b.record_success()
    assert b.metrics().failure_rate == 0.0
    fail_n(b, 2)
    assert b.state == fb.State.CLOSED  # 2/4
    fail_n(b, 1)
    assert b.state == fb.State.OPEN  # 3/4


def test_min_calls_is_capped_at_window(fb, clock):
    b = make(fb, clock, window=3, min_calls=100, failure_rate=1.0)
    fail_n(b, 3)
    assert b.state == fb.State.OPEN


def test_failure_rate_exact_decimal_boundary(fb, clock):
    # 7/10 must trip at failure_rate=0.7 (no float surprise)
    b = make(fb, clock, window=10, min_calls=10, failure_rate=0.7)
    for i in range(10):
        b.allow()
        b.record_failure() if i < 7 else b.record_success()
    assert b.state == fb.State.OPEN


def test_slow_call_rate_trips_window(fb, clock):
    b = make(fb, clock, window=5, min_calls=5, slow_call_duration=0.2, slow_call_rate=0.6)
    for elapsed in (0.3, 0.1, 0.25, 0.0):
        b.allow()
        b.record_success(elapsed)
    assert b.state == fb.State.CLOSED
    b.allow()
    b.record_success(datetime.timedelta(milliseconds=200))  # exactly the limit: slow
    assert b.state == fb.State.OPEN
    m = b.metrics()
    assert m.slow_calls == 3 and m.successes == 5 and m.failures == 0
    assert m.slow_call_rate == pytest.approx(0.6)


def test_failure_rate_metric_none_in_consecutive_mode(fb, clock):
    assert make(fb, clock).metrics().failure_rate is None


# -- slow calls -----------------------------------------------------------------------------------


def test_slow_success_counts_as_failure_in_consecutive_mode(fb, clock):
    b = make(fb, clock, failure_threshold=2, slow_call_duration=1.0)
    b.allow()
    b.record_success(elapsed=1.5)
    b.allow()
    b.record_success(elapsed=0.5)  # fast success resets
    assert b.metrics().consecutive_failures == 0
    for _ in range(2):
        b.allow()
        b.record_success(elapsed=2)
    assert b.state == fb.State.OPEN
    m = b.metrics()
    assert (m.successes, m.slow_calls, m.failures) == (4, 3, 0)


def test_elapsed_ignored_without_slow_call_duration(fb, clock):
    b = make(fb, clock, failure_threshold=1)
    b.allow()
    b.record_success(elapsed=1000.0)
    assert b.state == fb.State.CLOSED
    assert b.metrics().slow_calls == 0


def test_call_path_measures_elapsed_with_breaker_clock(fb, clock):
    b = make(fb, clock, failure_threshold=1, slow_call_duration=0.5)

    def slow():
        clock.advance(0.6)
        return "ok"

    assert b.call(slow) == "ok"
    assert b.state == fb.State.OPEN
    assert b.metrics().slow_calls == 1


def test_call_path_does_not_read_clock_without_slow_detection(fb):
    reads = []
    base = FakeClock(10**12)

    def counting_clock():
        reads.append(1)
        return base()

    b = fb.CircuitBreaker(clock=counting_clock)
    for _ in range(10):
        b.call(lambda: None)
        with b:
            pass
        b.allow()
        b.record_success()
    assert reads == []


def test_slow_probe_reopens(fb, clock):
    b = make(fb, clock, failure_threshold=1, reset_timeout=10, slow_call_duration=1.0)
    fail_n(b, 1)
    clock.advance(10)
    assert b.allow()
    b.record_success(elapsed=3.0)
    assert b.state == fb.State.OPEN


# -- OPEN and lazy recovery ----------------------------------------------------------------------


def test_open_rejects_until_reset_timeout(fb, clock):
    b = make(fb, clock, failure_threshold=1, reset_timeout=30)
    fail_n(b, 1)
    clock.advance(29.999)
    assert not b.allow()
    assert b.retry_after == pytest.approx(0.001)
    clock.advance(0.001)
    assert b.allow()
    assert b.state == fb.State.HALF_OPEN
    assert not b.allow()  # one probe at a time by default


def test_reading_state_never_transitions(fb, clock):
    b = make(fb, clock, failure_threshold=1, reset_timeout=1)
    fail_n(b, 1)
    clock.advance(5)
    assert b.state == fb.State.OPEN
    assert b.retry_after == 0.0
    b.metrics()
    assert b.state == fb.State.OPEN
    assert b.allow()
    assert b.state == fb.State.HALF_OPEN


def test_reset_timeout_zero_probes_immediately(fb, clock):
    b = make(fb, clock, failure_threshold=1, reset_timeout=0)
    fail_n(b, 1)
    assert b.state == fb.State.OPEN
    assert b.allow()
    assert b.state == fb.State.HALF_OPEN


def test_backoff_doubles_and_caps_and_resets_on_close(fb, clock):
    b = make(fb, clock, failure_threshold=1, reset_timeout=10, max_reset_timeout=35)
    fail_n(b, 1)
    periods = []
    for _ in range(4):
        periods.append(b.retry_after)
        clock.advance(b.retry_after)
        assert b.allow()
        b.record_failure()  # probe fails: re-trip, period doubles
    assert periods == [10.0, 20.0, 35.0, 35.0]
    clock.advance(35)
    assert b.allow()
    b.record_success()
    assert b.state == fb.State.CLOSED
    fail_n(b, 1)
    assert b.retry_after == 10.0


def test_no_backoff_without_max_reset_timeout(fb, clock):
    b = make(fb, clock, failure_threshold=1, reset_timeout=10)
    fail_n(b, 1)
    for _ in range(3):
        clock.advance(10)
        assert b.allow()
        b.record_failure()
        assert b.retry_after == 10.0


def test_no_threads_created(fb, clock):
    before = threading.active_count()
    b = make(fb, clock, failure_threshold=1, reset_timeout=1)
    for _ in range(50):
        fail_n(b, 1) if b.state == fb.State.CLOSED else None
        clock.advance(1)
        if b.allow():
            b.record_success()
    assert threading.active_count() == before


# -- HALF_OPEN -------------------------------------------------------------------------------------


def test_half_open_probe_limit_and_success_threshold(fb, clock):
    b = make(
        fb, clock, failure_threshold=1, reset_timeout=5, half_open_max_calls=3, success_threshold=2
    )
    fail_n(b, 1)
    clock.advance(5)
    assert [b.allow() for _ in range(5)] == [True, True, True, False, False]
    b.record_success()
    assert b.state == fb.State.HALF_OPEN
    assert b.allow()  # the released permit can be reused
    b.record_success()
    assert b.state == fb.State.CLOSED


def test_probe_failure_reopens_with_fresh_trip_time(fb, clock):
    b = make(fb, clock, failure_threshold=1, reset_timeout=10)
    fail_n(b, 1)
    clock.advance(15)
    assert b.allow()
    clock.advance(3)
    b.record_failure()
    assert b.state == fb.State.OPEN
    assert b.retry_after == 10.0
    assert b.metrics().opened == 2


def test_closing_starts_a_fresh_window(fb, clock):
    b = make(fb, clock, window=4, min_calls=4, failure_rate=0.5, reset_timeout=1)
    fail_n(b, 4)
    assert b.state == fb.State.OPEN
    clock.advance(1)
    b.allow()
    b.record_success()
    assert b.state == fb.State.CLOSED
    m = b.metrics()
    assert m.recorded == 0 and m.failure_rate == 0.0 and m.consecutive_failures == 0
    fail_n(b, 1)
    assert b.state == fb.State.CLOSED


def test_leaked_probe_is_reclaimed_after_probe_timeout(fb, clock):
    b = make(fb, clock, failure_threshold=1, reset_timeout=10, probe_timeout=2)
    fail_n(b, 1)
    clock.advance(10)
    assert b.allow()  # the probe never reports back
    clock.advance(1.9)
    assert not b.allow()
    assert b.state == fb.State.HALF_OPEN
    clock.advance(0.1)
    assert not b.allow()  # this allow() counts the leaked probe as failed
    assert b.state == fb.State.OPEN
    assert b.retry_after == 10.0
    clock.advance(10)
    assert b.allow()
    b.record_success()
    assert b.state == fb.State.CLOSED


def test_probe_timeout_defaults_to_reset_timeout(fb, clock):
    b = make(fb, clock, failure_threshold=1, reset_timeout=4)
    fail_n(b, 1)
    clock.advance(4)
    assert b.allow()
    clock.advance(3.99)
    assert not b.allow()
    assert b.state == fb.State.HALF_OPEN
    clock.advance(0.01)
    assert not b.allow()
    assert b.state == fb.State.OPEN


# -- stale and neutral outcomes --------------------------------------------------------------------


def test_raw_outcomes_while_open_or_isolated_are_stale(fb, clock):
    b = make(fb, clock, failure_threshold=1)
    fail_n(b, 1)
    b.record_success()
    b.record_failure()
    b.isolate()
    b.record_failure()
    m = b.metrics()
    assert m.stale == 3 and m.successes == 0 and m.failures == 1
    assert b.state == fb.State.ISOLATED


def test_raw_outcome_in_half_open_without_probe_is_stale(fb, clock):
    b = make(fb, clock, failure_threshold=1, reset_timeout=1, success_threshold=2)
    fail_n(b, 1)
    clock.advance(1)
    assert b.allow()
    b.record_success()  # the probe's outcome
    b.record_failure()  # nobody is out: stale, must not re-open
    assert b.state == fb.State.HALF_OPEN
    assert b.metrics().stale == 1


def test_call_admitted_before_a_transition_is_stale(fb, clock):
    b = make(fb, clock, failure_threshold=1, reset_timeout=1)

    def trips_meanwhile():
        b.trip()
        clock.advance(1)
        assert b.allow()  # a probe of the new generation
        raise ConnectionError

    with pytest.raises(ConnectionError):
        b.call(trips_meanwhile)
    assert b.state == fb.State.HALF_OPEN  # the old call's failure did not re-open
    m = b.metrics()
    assert m.stale == 1 and m.failures == 0
    b.record_success()
    assert b.state == fb.State.CLOSED


def test_with_block_outcome_after_reset_is_stale(fb, clock):
    b = make(fb, clock, failure_threshold=1)
    with pytest.raises(OSError):
        with b:
            b.reset()
            raise OSError
    assert b.state == fb.State.CLOSED
    assert b.metrics().stale == 1


def test_quiescent_accounting_identity(fb, clock):
    b = make(fb, clock, failure_threshold=2, reset_timeout=1, ignore=(KeyError,))
    outcomes = [None, ValueError, KeyError, None, ValueError, ValueError, None, KeyError]
    for i in range(200):
        exc = outcomes[i % len(outcomes)]

        def fn(exc=exc):
            if exc is not None:
                raise exc

        try:
            b.call(fn)
        except (ValueError, KeyError, fb.CircuitOpenError):
            pass
        clock.advance(0.3)
    m = b.metrics()
    assert m.permitted == m.successes + m.failures + m.ignored + m.stale
    assert m.permitted + m.rejected == 200
    assert m.ignored > 0 and m.rejected > 0 and m.opened > 1


# -- exceptions ------------------------------------------------------------------------------------


def test_failure_on_types_and_non_matching_is_success(fb, clock):
    b = make(fb, clock, failure_threshold=1, failure_on=(ConnectionError, TimeoutError))
    with pytest.raises(ValueError):
        b.call(lambda: int("x"))
    assert b.state == fb.State.CLOSED
    assert b.metrics().successes == 1
    with pytest.raises(TimeoutError):
        b.call(_raiser(TimeoutError))
    assert b.state == fb.State.OPEN


def test_failure_on_single_type(fb, clock):
    b = make(fb, clock, failure_threshold=1, failure_on=ConnectionError)
    with pytest.raises(KeyError):
        b.call(_raiser(KeyError))
    assert b.state == fb.State.CLOSED
    with pytest.raises(ConnectionResetError):
        b.call(_raiser(ConnectionResetError))
    assert b.state == fb.State.OPEN


def test_failure_on_predicate(fb, clock):
    b = make(
        fb,
        clock,
        failure_threshold=1,
        failure_on=lambda e: isinstance(e, OSError) and e.errno == 111,
    )
    with pytest.raises(OSError):
        b.call(_raiser(OSError(2, "nope")))
    assert b.state == fb.State.CLOSED
    with pytest.raises(OSError):
        b.call(_raiser(OSError(111, "refused")))
    assert b.state == fb.State.OPEN


def test_ignored_exception_is_neutral_and_propagates_unchanged(fb, clock):
    b = make(fb, clock, failure_threshold=1, ignore=(KeyError,))
    err = KeyError("k")
    with pytest.raises(KeyError) as info:
        b.call(_raiser(err))
    assert info.value is err
    m = b.metrics()
    assert (m.ignored, m.failures, m.successes, b.state) == (1, 0, 0, fb.State.CLOSED)


@pytest.mark.parametrize("exc_type", [KeyboardInterrupt, GeneratorExit, SystemExit])
def test_base_exceptions_are_neutral(fb, clock, exc_type):
    b = make(fb, clock, failure_threshold=1, failure_on=(BaseException,))
    with pytest.raises(exc_type):
        b.call(_raiser(exc_type))
    m = b.metrics()
    assert m.ignored == 1 and m.failures == 0 and b.state == fb.State.CLOSED


def test_neutral_outcome_releases_probe_permit(fb, clock):
    b = make(fb, clock, failure_threshold=1, reset_timeout=1, ignore=(KeyError,))
    fail_n(b, 1)
    clock.advance(1)
    with pytest.raises(KeyError):
        b.call(_raiser(KeyError))  # the probe hit an ignored error
    assert b.state == fb.State.HALF_OPEN
    assert b.call(lambda: 42) == 42  # the permit was released: a new probe passes
    assert b.state == fb.State.CLOSED


def test_cancelled_probe_releases_permit(fb, clock):
    import asyncio

    b = make(fb, clock, failure_threshold=1, reset_timeout=1)
    fail_n(b, 1)
    clock.advance(1)

    async def main():
        started = asyncio.Event()

        async def hang():
            started.set()
            await asyncio.Event().wait()

        task = asyncio.ensure_future(b.call_async(hang))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert b.state == fb.State.HALF_OPEN
        assert await b.call_async(_async_value(7)) == 7

    asyncio.run(main())
    assert b.state == fb.State.CLOSED
    assert b.metrics().ignored == 1


# -- manual control ---------------------------------------------------------------------------------


def test_trip_from_any_state_but_isolated(fb, clock):
    b = make(fb, clock, reset_timeout=10)
    b.trip()
    assert b.state == fb.State.OPEN and b.retry_after == 10.0
    clock.advance(4)
    b.trip()  # a fresh open period
    assert b.retry_after == 10.0
    assert b.metrics().opened == 2
    b.isolate()
    b.trip()
    assert b.state == fb.State.ISOLATED
    assert b.metrics().opened == 2


def test_isolate_rejects_until_reset(fb, clock):
    b = make(fb, clock, reset_timeout=0)
    b.isolate()
    clock.advance(10**6)
    assert not b.allow()
    assert b.retry_after == math.inf
    with pytest.raises(fb.CircuitOpenError) as info:
        b.call(lambda: None)
    assert info.value.state == fb.State.ISOLATED and info.value.retry_after == math.inf
    b.reset()
    assert b.allow()


def test_reset_clears_state_machine_not_counters(fb, clock):
    b = make(fb, clock, failure_threshold=3, reset_timeout=1, max_reset_timeout=100)
    fail_n(b, 3)
    clock.advance(1)
    b.allow()
    b.record_failure()  # backoff level 1
    b.reset()
    assert b.state == fb.State.CLOSED
    m = b.metrics()
    assert m.consecutive_failures == 0 and m.failures == 4 and m.opened == 2
    fail_n(b, 3)
    assert b.retry_after == 1.0  # backoff was reset


def test_open_error_attributes(fb, clock):
    b = make(fb, clock, failure_threshold=1, reset_timeout=8, name="db")
    fail_n(b, 1)
    clock.advance(3)
    with pytest.raises(fb.CircuitOpenError) as info:
        b.call(lambda: None)
    err = info.value
    assert isinstance(err, fb.BreakerError)
    assert err.name == "db" and err.state == fb.State.OPEN
    assert err.retry_after == pytest.approx(5.0)
    assert "db" in str(err)


def test_half_open_rejection_has_zero_retry_after(fb, clock):
    b = make(fb, clock, failure_threshold=1, reset_timeout=1)
    fail_n(b, 1)
    clock.advance(1)
    assert b.allow()
    with pytest.raises(fb.CircuitOpenError) as info:
        b.call(lambda: None)
    assert info.value.state == fb.State.HALF_OPEN and info.value.retry_after == 0.0


def test_timedelta_durations(fb, clock):
    b = make(fb, clock, failure_threshold=1, reset_timeout=datetime.timedelta(seconds=90))
    fail_n(b, 1)
    assert b.retry_after == 90.0


def test_name(fb):
    assert fb.CircuitBreaker(name="svc").name == "svc"
    assert fb.CircuitBreaker().name is None


# -- callbacks ---------------------------------------------------------------------------------------


def test_callbacks_once_per_transition_after_it(fb, clock):
    b = make(fb, clock, failure_threshold=1, reset_timeout=1)
    seen = []

    @b.on_state_change
    def cb(breaker, old, new):
        seen.append((old, new, breaker.state, threading.get_ident()))

    fail_n(b, 1)
    clock.advance(1)
    b.allow()
    b.record_success()
    b.isolate()
    b.reset()
    S = fb.State
    assert [(o, n) for o, n, _, _ in seen] == [
        (S.CLOSED, S.OPEN),
        (S.OPEN, S.HALF_OPEN),
        (S.HALF_OPEN, S.CLOSED),
        (S.CLOSED, S.ISOLATED),
        (S.ISOLATED, S.CLOSED),
    ]
    assert all(state == new for _, new, state, _ in seen)  # runs after the transition
    assert {t for *_, t in seen} == {threading.get_ident()}


def test_reentrant_callback(fb, clock):
    b = make(fb, clock, failure_threshold=1)
    seen = []

    def cb(breaker, old, new):
        seen.append(new)
        if new == fb.State.OPEN:
            breaker.reset()  # calls back into the breaker

    b.on_state_change(cb)
    fail_n(b, 1)
    assert seen == [fb.State.OPEN, fb.State.CLOSED]
    assert b.state == fb.State.CLOSED


def test_raising_callback_is_logged_and_changes_nothing(fb, clock, caplog):
    b = make(fb, clock, failure_threshold=1)
    after = []
    b.on_state_change(lambda *a: 1 / 0)
    b.on_state_change(lambda br, o, n: after.append(n))
    with caplog.at_level("ERROR", logger="fastbreaker"):
        fail_n(b, 1)
    assert b.state == fb.State.OPEN
    assert after == [fb.State.OPEN]
    rec = [r for r in caplog.records if r.name == "fastbreaker"]
    assert rec and rec[0].exc_info and rec[0].exc_info[0] is ZeroDivisionError


def test_exactly_once_transition_under_threads(fb):
    clock = FakeClock(10**12)
    b = fb.CircuitBreaker(failure_threshold=50, reset_timeout=1, clock=clock)
    trips = []
    b.on_state_change(lambda br, o, n: trips.append((o, n)))
    barrier = threading.Barrier(4)

    def worker():
        barrier.wait()
        for _ in range(100):
            if b.allow():
                b.record_failure()

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert trips == [(fb.State.CLOSED, fb.State.OPEN)]
    m = b.metrics()
    assert m.opened == 1
    assert m.permitted == m.failures + m.stale
    assert m.permitted + m.rejected == 400


# -- validation ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw, exc, word",
    [
        ({"failure_threshold": 0}, ValueError, "failure_threshold"),
        ({"failure_threshold": 2.5}, TypeError, "failure_threshold"),
        ({"reset_timeout": -1}, ValueError, "reset_timeout"),
        ({"reset_timeout": "5"}, TypeError, "reset_timeout"),
        ({"window": -1}, ValueError, "window"),
        ({"min_calls": 0}, ValueError, "min_calls"),
        ({"failure_rate": 1.5}, ValueError, "failure_rate"),
        ({"failure_rate": 0}, ValueError, "failure_rate"),
        ({"slow_call_rate": 0.0}, ValueError, "slow_call_rate"),
        ({"slow_call_duration": 0}, ValueError, "slow_call_duration"),
        ({"half_open_max_calls": 0}, ValueError, "half_open_max_calls"),
        ({"success_threshold": 0}, ValueError, "success_threshold"),
        ({"probe_timeout": -2}, ValueError, "probe_timeout"),
        ({"max_reset_timeout": 1, "reset_timeout": 5}, ValueError, "max_reset_timeout"),
        ({"failure_on": 42}, TypeError, "failure_on"),
        ({"failure_on": (ValueError, 3)}, TypeError, "failure_on"),
        ({"ignore": "KeyError"}, TypeError, "ignore"),
        ({"name": 5}, TypeError, "name"),
        ({"clock": 5}, TypeError, "clock"),
    ],
)
def test_bad_configuration(fb, kw, exc, word):
    with pytest.raises(exc, match=word):
        fb.CircuitBreaker(**kw)


def test_non_callables_rejected(fb):
    b = fb.CircuitBreaker()
    with pytest.raises(TypeError):
        b.call(42)
    with pytest.raises(TypeError):
        b(42)
    assert b.metrics().permitted == 0  # no permit was taken


def _raiser(exc):
    def fn():
        raise exc

    return fn


def _async_value(v):
    async def fn():
        return v

    return fn
