"""Dry-run mode and the metrics of round two, on both implementations (the ``fb`` fixture)."""

from __future__ import annotations

import math

import pytest


def fail_n(b, n):
    for _ in range(n):
        assert b.allow()
        b.record_failure()


class Boom(Exception):
    pass


def boom():
    raise Boom()


# -- dry run --------------------------------------------------------------------------------------
def test_dry_run_never_rejects_but_counts_and_transitions(fb, clock):
    b = fb.CircuitBreaker(failure_threshold=2, reset_timeout=10, clock=clock, dry_run=True)
    events = []
    b.on_state_change(lambda br, old, new: events.append((old, new)))
    fail_n(b, 2)
    assert b.state == fb.State.OPEN
    assert b.allow() is True  # would have been rejected
    b.record_failure()  # its outcome is stale: the state evolves as a normal breaker's
    assert b.call(lambda: 7) == 7
    with b:
        pass
    m = b.metrics()
    assert (m.permitted, m.would_reject, m.rejected, m.stale, m.failures) == (5, 3, 0, 3, 2)
    assert events == [(fb.State.CLOSED, fb.State.OPEN)]
    assert math.isclose(b.retry_after, 10.0)
    clock.advance(10)
    assert b.allow()  # the real probe
    b.record_success()
    assert b.state == fb.State.CLOSED
    assert events[-2:] == [
        (fb.State.OPEN, fb.State.HALF_OPEN),
        (fb.State.HALF_OPEN, fb.State.CLOSED),
    ]


def test_dry_run_follows_the_same_states_as_a_normal_breaker(fb, clock):
    real = fb.CircuitBreaker(failure_threshold=2, reset_timeout=5, clock=clock)
    dry = fb.CircuitBreaker(failure_threshold=2, reset_timeout=5, clock=clock, dry_run=True)
    script = "ffxfa" + "s" + "ff" + "a" + "s"  # f: failure, s: success, x: call, a: advance 5 s
    for step in script:
        if step == "a":
            clock.advance(5)
            continue
        for b in (real, dry):
            if b.allow():
                (b.record_failure if step in "fx" else b.record_success)()
        assert real.state == dry.state
    r, d = real.metrics(), dry.metrics()
    assert d.would_reject == r.rejected > 0
    assert d.rejected == 0
    assert d.permitted == r.permitted + r.rejected
    assert (d.opened, d.failures, d.successes) == (r.opened, r.failures, r.successes)


def test_dry_run_in_half_open_does_not_use_up_the_probes(fb, clock):
    b = fb.CircuitBreaker(failure_threshold=1, reset_timeout=1, clock=clock, dry_run=True)
    fail_n(b, 1)
    clock.advance(1)
    probe = b._permit_or_raise()
    extra = b._permit_or_raise()  # half_open_max_calls=1: would be rejected
    b._finish(extra, 2)  # a failure of the extra call is stale, the circuit stays HALF_OPEN
    assert b.state == fb.State.HALF_OPEN
    b._finish(probe, 0)
    assert b.state == fb.State.CLOSED
    m = b.metrics()
    assert (m.would_reject, m.stale, m.probe_successes) == (1, 1, 1)


def test_dry_run_isolated_still_admits(fb, clock):
    b = fb.CircuitBreaker(clock=clock, dry_run=True)
    b.isolate()
    assert b.allow()
    assert b.metrics().would_reject == 1


def test_dry_run_in_a_map(fb, clock):
    m = fb.BreakerMap(failure_threshold=1, clock=clock, dry_run=True)
    assert m.allow("a")
    m.record_failure("a")
    assert m.allow("a")
    assert m["a"].metrics().would_reject == 1
    assert m.metrics().rejected == 0


@pytest.mark.parametrize("value", [1, None, "yes"])
def test_dry_run_must_be_a_bool(fb, value):
    with pytest.raises(TypeError, match="dry_run"):
        fb.CircuitBreaker(dry_run=value)


# -- open_seconds_total -----------------------------------------------------------------------------
def test_open_seconds_total_is_exact_mid_episode(fb, clock):
    b = fb.CircuitBreaker(failure_threshold=1, reset_timeout=10, clock=clock)
    assert b.metrics().open_seconds_total == 0.0
    fail_n(b, 1)
    clock.advance(4)
    assert b.metrics().open_seconds_total == pytest.approx(4.0)
    clock.advance(8)  # the open period is over, but leaving OPEN is lazy
    assert b.metrics().open_seconds_total == pytest.approx(12.0)
    assert b.allow()  # leaves OPEN now
    clock.advance(3)
    assert b.metrics().open_seconds_total == pytest.approx(12.0)  # HALF_OPEN is not OPEN
    b.record_failure()  # re-opens
    clock.advance(2)
    assert b.metrics().open_seconds_total == pytest.approx(14.0)
    b.reset()
    clock.advance(5)
    assert b.metrics().open_seconds_total == pytest.approx(14.0)


def test_isolated_is_not_open(fb, clock):
    b = fb.CircuitBreaker(clock=clock)
    b.trip()
    clock.advance(2)
    b.isolate()  # ends the OPEN episode
    clock.advance(100)
    assert b.metrics().open_seconds_total == pytest.approx(2.0)
    b.trip()  # no effect while ISOLATED
    clock.advance(1)
    assert b.metrics().open_seconds_total == pytest.approx(2.0)


def test_trip_while_open_keeps_counting(fb, clock):
    b = fb.CircuitBreaker(clock=clock)
    b.trip()
    clock.advance(3)
    b.trip()
    clock.advance(1)
    assert b.metrics().open_seconds_total == pytest.approx(4.0)


# -- probes and timeouts ----------------------------------------------------------------------------
def test_probe_successes_and_failures(fb, clock):
    b = fb.CircuitBreaker(
        failure_threshold=1,
        reset_timeout=1,
        success_threshold=2,
        half_open_max_calls=2,
        slow_call_duration=1.0,
        clock=clock,
    )
    fail_n(b, 1)
    clock.advance(1)
    assert b.allow()
    b.record_failure()  # probe failure: re-opens
    clock.advance(1)
    assert b.allow()
    b.record_success(elapsed=2.0)  # a slow probe re-opens too: a failure
    clock.advance(1)
    for _ in range(2):
        assert b.allow()
        b.record_success()
    m = b.metrics()
    assert b.state == fb.State.CLOSED
    assert (m.probe_successes, m.probe_failures) == (2, 2)
    b.allow()
    b.record_success()  # not a probe
    assert b.metrics().probe_successes == 2


def test_timeouts_count_timeout_errors(fb, clock):
    b = fb.CircuitBreaker(failure_threshold=100, clock=clock)

    def raise_(exc):
        raise exc

    for exc in (TimeoutError(), fb.DeadlineExceeded(1.0), Boom()):
        with pytest.raises(type(exc)):
            b.call(raise_, exc)
    m = b.metrics()
    assert (m.failures, m.timeouts) == (3, 2)


def test_timeouts_only_when_timeout_is_a_failure(fb, clock):
    b = fb.CircuitBreaker(clock=clock, failure_on=Boom)
    with pytest.raises(TimeoutError):
        b.call(lambda: (_ for _ in ()).throw(TimeoutError()))
    m = b.metrics()
    assert (m.failures, m.timeouts, m.successes) == (0, 0, 1)


# -- latency histogram ------------------------------------------------------------------------------
def test_latency_is_none_when_calls_are_not_timed(fb, clock):
    b = fb.CircuitBreaker(clock=clock)
    b.call(lambda: 1)
    assert b.metrics().latency is None


def test_latency_histogram(fb, clock):
    b = fb.CircuitBreaker(clock=clock, record_latency=True, latency_buckets=[0.1, 1.0])

    def takes(seconds, fail=False):
        clock.advance(seconds)
        if fail:
            raise Boom()

    empty = b.metrics().latency
    assert (empty.bounds, empty.counts, empty.sum, empty.count) == ((0.1, 1.0), (0, 0, 0), 0.0, 0)
    b.call(takes, 0.05)
    b.call(takes, 0.1)  # on the bound: in its bucket
    with b:
        takes(0.5)
    with pytest.raises(Boom):
        b.call(takes, 3.0, True)  # a failed call is timed too
    b.allow()
    b.record_success(elapsed=0.2)
    lat = b.metrics().latency
    assert lat.counts == (2, 2, 1)
    assert lat.count == 5
    assert lat.sum == pytest.approx(3.85)


def test_slow_call_duration_times_into_the_default_buckets(fb, clock):
    b = fb.CircuitBreaker(clock=clock, slow_call_duration=1.0)
    b.call(lambda: clock.advance(0.003))
    lat = b.metrics().latency
    assert lat.bounds[0] == 0.005 and lat.bounds[-1] == 10.0 and len(lat.bounds) == 14
    assert lat.counts[0] == 1 and lat.count == 1


async def test_async_calls_are_timed(fb, clock):
    b = fb.CircuitBreaker(clock=clock, record_latency=True)

    async def work():
        clock.advance(0.02)
        return 1

    assert await b.call_async(work) == 1
    assert b.metrics().latency.count == 1


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ([], ValueError),
        ([1.0, 0.5], ValueError),
        ([0.0], ValueError),
        ([math.nan], ValueError),
        (["1"], TypeError),
        ("1", TypeError),
        (1.0, TypeError),
        ([1.0, 1.0], ValueError),
    ],
)
def test_latency_buckets_validation(fb, value, error):
    with pytest.raises(error, match="latency_buckets"):
        fb.CircuitBreaker(latency_buckets=value)


def test_record_latency_must_be_a_bool(fb):
    with pytest.raises(TypeError, match="record_latency"):
        fb.CircuitBreaker(record_latency=1)


def test_untimed_breaker_does_not_read_the_clock_on_calls(fb):
    reads = []

    def clock():
        reads.append(1)
        return 0

    b = fb.CircuitBreaker(clock=clock)
    b.call(lambda: 1)
    assert reads == []
    assert b.metrics().latency is None


def test_map_breakers_time_calls(fb, clock):
    m = fb.BreakerMap(clock=clock, record_latency=True)
    m.call("a", lambda: clock.advance(0.2))
    assert m["a"].metrics().latency.count == 1
