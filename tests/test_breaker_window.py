"""The time window (``window_seconds``), on both implementations (the ``fb`` fixture)."""

from __future__ import annotations

import datetime
import gc
import math
import tracemalloc

import pytest

import fastbreaker
import fastbreaker._options


def make(fb, clock, **kw):
    kw.setdefault("clock", clock)
    kw.setdefault("window_seconds", 10)
    return fb.CircuitBreaker(**kw)


def record(b, *outcomes):
    for o in outcomes:
        assert b.allow()
        if o == "f":
            b.record_failure()
        elif o == "s":
            b.record_success()
        else:
            b.record_success(elapsed=o)


class SettableClock:
    """A clock that can be set anywhere, backwards too (a writer delayed with an old reading)."""

    def __init__(self, ns: int) -> None:
        self.ns = ns

    def __call__(self) -> int:
        return self.ns


def test_failure_rate_in_the_window_trips(fb, clock):
    b = make(fb, clock, min_calls=4, failure_rate=0.5)
    record(b, "s", "s", "f")
    assert b.state == fb.State.CLOSED
    m = b.metrics()
    assert (m.recorded, m.failure_rate, m.slow_call_rate) == (3, pytest.approx(1 / 3), 0.0)
    record(b, "f")
    assert b.state == fb.State.OPEN
    assert b.metrics().failure_rate == 0.5


def test_outcomes_age_out_bucket_by_bucket(fb, clock):
    b = make(fb, clock, window_seconds=10, window_buckets=10, min_calls=4, failure_rate=0.5)
    record(b, "f", "f")  # bucket of t=0
    clock.advance(5)
    record(b, "s")  # bucket of t=5
    assert b.metrics().recorded == 3
    clock.advance(5)  # t=10: the bucket of t=0 left the window
    m = b.metrics()
    assert (m.recorded, m.failure_rate) == (1, 0.0)
    record(b, "f", "f")  # 2 of 3 failed, but min_calls is 4
    assert b.state == fb.State.CLOSED
    record(b, "f")
    assert b.state == fb.State.OPEN


def test_a_success_never_trips_unlike_the_count_window(fb, clock):
    timed = make(fb, clock, min_calls=3, failure_rate=0.5)
    counted = fb.CircuitBreaker(window=10, min_calls=3, failure_rate=0.5, clock=clock)
    for b in (timed, counted):
        record(b, "f", "f", "s")  # the success brings the count to min_calls at 2/3 failed
    assert counted.state == fb.State.OPEN
    assert timed.state == fb.State.CLOSED
    assert timed.metrics().failure_rate == pytest.approx(2 / 3)
    record(timed, "f")
    assert timed.state == fb.State.OPEN


def test_slow_calls_trip(fb, clock):
    b = make(fb, clock, min_calls=2, slow_call_duration=1.0, slow_call_rate=0.5)
    record(b, 0.1, 2.0)
    assert b.state == fb.State.OPEN
    m = b.metrics()
    assert (m.slow_calls, m.slow_call_rate, m.failures) == (1, 0.5, 0)


def test_min_calls_is_not_capped(fb, clock):
    b = make(fb, clock, window_buckets=1, min_calls=50, failure_rate=0.1)
    record(b, *"f" * 49)
    assert b.state == fb.State.CLOSED
    record(b, "f")
    assert b.state == fb.State.OPEN


def test_consecutive_failures_still_reported(fb, clock):
    b = make(fb, clock, min_calls=10)
    record(b, "f", "f")
    assert b.metrics().consecutive_failures == 2
    record(b, "s")
    assert b.metrics().consecutive_failures == 0


def test_catch_up_after_a_long_quiet_period(fb, clock):
    b = make(fb, clock, min_calls=2, failure_rate=0.5)
    record(b, "f")
    clock.advance(10**7)  # months: the next outcome costs one pass over the buckets
    record(b, "f")
    m = b.metrics()
    assert (m.recorded, b.state) == (1, fb.State.CLOSED)
    record(b, "s", "f")
    assert b.state == fb.State.OPEN


def test_reset_clears_the_window(fb, clock):
    b = make(fb, clock, min_calls=2, failure_rate=0.5)
    record(b, "f", "f")
    assert b.state == fb.State.OPEN
    b.reset()
    assert b.metrics().recorded == 0
    record(b, "s", "s", "f")
    assert b.state == fb.State.CLOSED


def test_reopens_and_closes_through_probes(fb, clock):
    b = make(fb, clock, min_calls=2, failure_rate=0.5, reset_timeout=5)
    record(b, "f", "f")
    clock.advance(5)
    record(b, "s")
    assert b.state == fb.State.CLOSED
    assert b.metrics().recorded == 0  # the window starts empty after a close


def test_outcome_whose_bucket_rolled_out_is_stale(fb):
    clock = SettableClock(100 * 10**9)
    b = fb.CircuitBreaker(window_seconds=10, window_buckets=10, clock=clock, min_calls=1)
    record(b, "s")  # t=100 s: bucket 0 now holds epoch 100
    clock.ns = 90 * 10**9  # a writer that read the clock at t=90 s arrives late
    assert b.allow()
    b.record_failure()  # its bucket (epoch 90, also bucket 0) rolled out: dropped
    m = b.metrics()
    assert (m.failures, m.stale, b.state) == (0, 1, fb.State.CLOSED)
    clock.ns = 100 * 10**9
    assert b.metrics().recorded == 1


def test_counters_saturate_rather_than_wrap(fb, clock):
    b = make(fb, clock, window_buckets=1, min_calls=1, failure_rate=1.0)
    limit = 2**14 - 1
    for _ in range(limit + 5):
        b.allow()
        b.record_success()
    m = b.metrics()
    assert (m.recorded, m.successes) == (limit, limit + 5)
    record(b, "f")  # the bucket is full: the rate stays that of its first outcomes
    assert b.metrics().recorded == limit
    assert b.state == fb.State.CLOSED


def test_call_paths_and_timedelta(fb, clock):
    b = make(fb, clock, window_seconds=datetime.timedelta(seconds=30), min_calls=2)

    def boom():
        raise OSError("down")

    for _ in range(2):
        with pytest.raises(OSError):
            b.call(boom)
    assert b.state == fb.State.OPEN
    with pytest.raises(fb.CircuitOpenError):
        b.call(lambda: 1)


def test_breaker_map_takes_the_time_window(fb, clock):
    m = fb.BreakerMap(window_seconds=10, min_calls=2, failure_rate=0.5, clock=clock)
    for _ in range(2):
        assert m.allow("a")
        m.record_failure("a")
    assert m["a"].state == fb.State.OPEN
    assert m["a"].metrics().recorded == 2
    assert m.allow("b")


@pytest.mark.parametrize(
    ("kw", "error", "names"),
    [
        (dict(window=10, window_seconds=5), ValueError, ("window", "window_seconds")),
        (dict(window_seconds=0), ValueError, ("window_seconds",)),
        (dict(window_seconds=-1), ValueError, ("window_seconds",)),
        (dict(window_seconds=math.nan), ValueError, ("window_seconds",)),
        (dict(window_seconds="10"), TypeError, ("window_seconds",)),
        (dict(window_seconds=10, window_buckets=0), ValueError, ("window_buckets",)),
        (dict(window_seconds=10, window_buckets=1001), ValueError, ("window_buckets",)),
        (dict(window_seconds=10, window_buckets=2.0), TypeError, ("window_buckets",)),
        (dict(window_seconds=10, window_buckets=True), TypeError, ("window_buckets",)),
        (dict(window_seconds=0.005, window_buckets=10), ValueError, ("window_buckets", "1 ms")),
    ],
)
def test_validation_names_the_option(fb, kw, error, names):
    with pytest.raises(error) as info:
        fb.CircuitBreaker(**kw)
    for name in names:
        assert name in str(info.value)
    with pytest.raises(error):
        fb.BreakerMap(**kw)


def test_one_ms_buckets_are_accepted(fb, clock):
    b = make(fb, clock, window_seconds=0.01, window_buckets=10)
    record(b, "s")
    assert b.metrics().recorded == 1


@pytest.mark.skipif(not fastbreaker.COMPILED, reason="the bound is the compiled core's layout")
def test_window_memory_is_at_most_128_bytes_per_breaker():
    from fastbreaker import _breaker_c

    n = 2000

    def allocated(**kw):
        # Breakers sharing one config (as a BreakerMap's do): the difference is the window.
        config = _breaker_c.Config(fastbreaker._options.BreakerOptions(**kw))
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            keep = [_breaker_c.CircuitBreaker._from_config(config, None) for _ in range(n)]
            after = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        assert len(keep) == n
        return (after - before) / n

    plain = allocated()
    timed = allocated(window_seconds=60, window_buckets=10)
    per_breaker = timed - plain
    print(f"\n[time window] {per_breaker:.1f} bytes per breaker (10 buckets)")
    assert 0 < per_breaker <= 128


def test_a_dry_run_time_window_trips_on_a_failure_and_still_admits(fb, clock):
    # The documentation's example (docs/semantics.md, "Dry run"): the 4th outcome is the first
    # that can trip (min_calls=4), and only a failure can; after the trip the dry run admits
    # what it would have rejected.
    b = fb.CircuitBreaker(
        window_seconds=60, min_calls=4, failure_rate=0.5, dry_run=True, clock=clock
    )
    for ok in (True, True, False, False):
        assert b.allow()
        b.record_success() if ok else b.record_failure()
    assert b.state is fb.State.OPEN and b.allow()
    m = b.metrics()
    assert (m.opened, m.would_reject, m.rejected, m.permitted) == (1, 1, 0, 5)
