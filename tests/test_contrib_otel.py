"""fastbreaker.contrib.otel: a real OpenTelemetry SDK MeterProvider, read by an InMemoryMetricReader.

Every test registers the instruments on a fresh ``MeterProvider`` and collects with
``InMemoryMetricReader.get_metrics_data()``, which runs the instruments' callbacks as any
exporter's collection does.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk.metrics")  # the test extra: opentelemetry-sdk

from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import Gauge, InMemoryMetricReader, Sum  # noqa: E402

from fastbreaker.contrib.otel import Instrumentation, instrument  # noqa: E402

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")

Labels = frozenset[tuple[str, str]]

_COUNTER_PARTS = (
    "permitted",
    "rejected",
    "successes",
    "failures",
    "slow_calls",
    "ignored",
    "stale",
    "trips",
    "would_reject",
    "open_seconds",
    "probe_successes",
    "probe_failures",
    "timeouts",
)
BREAKER_NAMES = [
    "fastbreaker.breaker.state",
    *(f"fastbreaker.breaker.{c}" for c in _COUNTER_PARTS),
    "fastbreaker.breaker.call_seconds.sum",
    "fastbreaker.breaker.call_seconds.count",
    "fastbreaker.breaker.consecutive_failures",
    "fastbreaker.breaker.failure_rate",
]
MAP_NAMES = [
    "fastbreaker.map.keys",
    "fastbreaker.map.open_keys",
    "fastbreaker.map.evicted",
    "fastbreaker.map.suppressed_trips",
    "fastbreaker.map.untracked",
    *(f"fastbreaker.map.{c}" for c in _COUNTER_PARTS),
    "fastbreaker.map.key_state",
    "fastbreaker.map.key_series_omitted",
]
BUDGET_NAMES = ["fastbreaker.retry_budget.tokens", "fastbreaker.retry_budget.capacity"]
BULKHEAD_NAMES = [
    *(f"fastbreaker.bulkhead.{c}" for c in ("admitted", "rejected", "timed_out", "cancelled")),
    "fastbreaker.bulkhead.waited",
    "fastbreaker.bulkhead.in_flight",
    "fastbreaker.bulkhead.waiting",
    "fastbreaker.bulkhead.peak_in_flight",
    "fastbreaker.bulkhead.limit",
]
SHEDDER_NAMES = [
    "fastbreaker.shedder.admitted",
    "fastbreaker.shedder.queued",
    "fastbreaker.shedder.shed",
    "fastbreaker.shedder.in_flight",
    "fastbreaker.shedder.queue_len",
    "fastbreaker.shedder.congested",
]
FALLBACK_NAMES = [
    "fastbreaker.fallback.calls",
    "fastbreaker.fallback.fallbacks",
    "fastbreaker.fallback.stale_served",
    "fastbreaker.fallback.active_seconds",
]
ALL_NAMES = (
    BREAKER_NAMES + MAP_NAMES + BUDGET_NAMES + BULKHEAD_NAMES + SHEDDER_NAMES + FALLBACK_NAMES
)
GAUGES = {
    "fastbreaker.breaker.state",
    "fastbreaker.breaker.consecutive_failures",
    "fastbreaker.breaker.failure_rate",
    "fastbreaker.map.keys",
    "fastbreaker.map.open_keys",
    "fastbreaker.map.key_state",
    "fastbreaker.map.key_series_omitted",
    *BUDGET_NAMES,
    "fastbreaker.bulkhead.in_flight",
    "fastbreaker.bulkhead.waiting",
    "fastbreaker.bulkhead.peak_in_flight",
    "fastbreaker.bulkhead.limit",
    "fastbreaker.shedder.in_flight",
    "fastbreaker.shedder.queue_len",
    "fastbreaker.shedder.congested",
    "fastbreaker.fallback.active_seconds",
}


class Collection:
    """The data points of one collection, looked up by instrument name and attributes."""

    def __init__(self, reader: InMemoryMetricReader) -> None:
        self.points: dict[str, dict[Labels, float]] = {}
        self.kinds: dict[str, str] = {}
        self.units: dict[str, str] = {}
        data = reader.get_metrics_data()
        for rm in data.resource_metrics if data is not None else ():
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if isinstance(metric.data, Sum):
                        assert metric.data.is_monotonic
                        self.kinds[metric.name] = "counter"
                    else:
                        assert isinstance(metric.data, Gauge)
                        self.kinds[metric.name] = "gauge"
                    self.units[metric.name] = metric.unit or ""
                    series = self.points.setdefault(metric.name, {})
                    for p in metric.data.data_points:
                        series[frozenset((k, str(v)) for k, v in p.attributes.items())] = p.value

    def __call__(self, name: str, /, **attributes: str) -> float:
        return self.points[name][frozenset(attributes.items())]

    def series(self, name: str) -> dict[Labels, float]:
        return self.points.get(name, {})

    def names(self) -> set[str]:
        return {n for n, series in self.points.items() if series}


class Otel:
    def __init__(self) -> None:
        self.reader = InMemoryMetricReader()
        self.provider = MeterProvider(metric_readers=[self.reader])
        self.meter = self.provider.get_meter("fastbreaker-tests")

    def collect(self) -> Collection:
        return Collection(self.reader)


@pytest.fixture
def otel() -> Iterator[Otel]:
    o = Otel()
    try:
        yield o
    finally:
        o.provider.shutdown()


def states(c: Collection, **labels: str) -> dict[str, float]:
    return {
        dict(k)["state"]: v
        for k, v in c.series("fastbreaker.breaker.state").items()
        if all(dict(k).get(n) == v2 for n, v2 in labels.items())
    }


def _raise() -> None:
    raise ValueError("down")


def _open(breaker: Any) -> Any:
    """A function that calls ``breaker``: it raises CircuitOpenError while it is open."""

    def call() -> str:
        return str(breaker.call(lambda: "fresh"))

    return call


def _fail(m: Any, key: Any, times: int = 1) -> None:
    for _ in range(times):
        if m.allow(key):
            m.record_failure(key)


# -- breakers ------------------------------------------------------------------------------------
def test_three_failures_trip_a_breaker(fb, clock, otel):
    b = fb.CircuitBreaker(failure_threshold=3, reset_timeout=10.0, name="payments", clock=clock)
    other = fb.CircuitBreaker(name="search", clock=clock)
    instrument(otel.meter, breakers=[b, other])
    b.call(lambda: None)
    for _ in range(3):
        with pytest.raises(ValueError):
            b.call(_raise)
    other.allow()
    other.record_failure()

    c = otel.collect()
    assert states(c, name="payments") == {"closed": 0, "open": 1, "half_open": 0, "isolated": 0}
    assert states(c, name="search") == {"closed": 1, "open": 0, "half_open": 0, "isolated": 0}
    assert c("fastbreaker.breaker.failures", name="payments") == 3
    assert c("fastbreaker.breaker.trips", name="payments") == 1
    assert c("fastbreaker.breaker.permitted", name="payments") == 4
    assert c("fastbreaker.breaker.successes", name="payments") == 1
    assert c("fastbreaker.breaker.rejected", name="payments") == 0
    assert c("fastbreaker.breaker.consecutive_failures", name="search") == 1
    assert c("fastbreaker.breaker.failures", name="search") == 1
    assert "fastbreaker.breaker.failure_rate" not in c.names()  # no breaker in window mode
    assert "fastbreaker.breaker.call_seconds.count" not in c.names()  # none times its calls

    # A rejected allow() shows in the next collection.
    assert not b.allow()
    with pytest.raises(fb.CircuitOpenError):
        b.call(lambda: None)
    c = otel.collect()
    assert c("fastbreaker.breaker.rejected", name="payments") == 2
    assert c("fastbreaker.breaker.permitted", name="payments") == 4

    # The recovery too.
    clock.advance(10.0)
    b.call(lambda: None)
    c = otel.collect()
    assert states(c, name="payments")["closed"] == 1
    assert c("fastbreaker.breaker.trips", name="payments") == 1
    assert c("fastbreaker.breaker.successes", name="payments") == 2
    assert c("fastbreaker.breaker.probe_successes", name="payments") == 1
    assert c("fastbreaker.breaker.open_seconds", name="payments") == pytest.approx(10.0)


def test_counters_are_counters_and_levels_are_gauges(fb, clock, otel):
    b = fb.CircuitBreaker(window=4, min_calls=4, name="w", clock=clock, record_latency=True)
    m = fb.BreakerMap(failure_threshold=1, clock=clock)
    _fail(m, "down")
    b.call(lambda: None)
    # kept alive here: instrument() holds weak references
    budget, slots = fb.RetryBudget(clock=clock), fb.Bulkhead(2, name="slots")
    shedder, f = fb.LoadShedder(1, name="api"), fb.fallback(lambda exc: None)(lambda: None)
    instrument(
        otel.meter,
        breakers=[b],
        maps={"m": m},
        budgets={"b": budget},
        bulkheads=[slots],
        shedders=[shedder],
        fallbacks={"f": f},
    )
    c = otel.collect()
    everything = ALL_NAMES
    assert c.names() == set(everything)  # every instrument has a data point here
    for name in everything:
        assert c.kinds[name] == ("gauge" if name in GAUGES else "counter"), name
    seconds = {
        "fastbreaker.breaker.open_seconds",
        "fastbreaker.map.open_seconds",
        "fastbreaker.breaker.call_seconds.sum",
        "fastbreaker.fallback.active_seconds",
    }
    assert {n for n, unit in c.units.items() if unit} == seconds
    assert all(c.units[n] == "s" for n in seconds)


def test_values_are_read_at_collection_time(fb, clock, otel):
    # A stand-in that counts the reads: the compiled classes are final, but the instruments
    # accept anything with the breaker's metrics(), state and name.
    class Counting:
        def __init__(self, breaker: Any) -> None:
            self.breaker = breaker
            self.reads = 0

        @property
        def name(self) -> str:
            return str(self.breaker.name)

        @property
        def state(self) -> Any:
            return self.breaker.state

        def metrics(self) -> Any:
            self.reads += 1
            return self.breaker.metrics()

    b = fb.CircuitBreaker(failure_threshold=1, reset_timeout=1.0, name="late", clock=clock)
    counting = Counting(b)
    instrument(otel.meter, breakers=[counting])
    assert counting.reads == 0  # registering reads nothing

    b.allow()
    b.record_failure()  # after instrument(): seen by the collection
    c = otel.collect()
    assert states(c, name="late")["open"] == 1
    assert c("fastbreaker.breaker.failures", name="late") == 1
    # 18 instruments read one snapshot: one metrics() call per collection, not one per callback
    assert counting.reads == 1

    assert counting.reads == 1  # nothing is read between collections
    clock.advance(1.0)
    b.call(lambda: None)
    c = otel.collect()
    assert states(c, name="late")["closed"] == 1
    assert c("fastbreaker.breaker.successes", name="late") == 1
    assert counting.reads == 2


def test_each_reader_collection_reads_afresh(fb, clock):
    # Two readers on one provider collect separately: the second sees what changed in between.
    first, second = InMemoryMetricReader(), InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[first, second])
    try:
        b = fb.CircuitBreaker(name="p", clock=clock)
        instrument(provider.get_meter("t"), breakers=[b])
        b.call(lambda: None)
        assert Collection(first)("fastbreaker.breaker.successes", name="p") == 1
        b.call(lambda: None)
        assert Collection(second)("fastbreaker.breaker.successes", name="p") == 2
        assert Collection(first)("fastbreaker.breaker.successes", name="p") == 2
    finally:
        provider.shutdown()


def test_dry_run_would_reject_and_the_latency_sum_and_count(fb, clock, otel):
    b = fb.CircuitBreaker(
        failure_threshold=1,
        reset_timeout=5.0,
        name="dry",
        clock=clock,
        dry_run=True,
        record_latency=True,
        latency_buckets=(0.1, 1.0),
    )
    untimed = fb.CircuitBreaker(name="untimed", clock=clock)
    instrument(otel.meter, breakers=[b, untimed])

    def slow_timeout() -> None:
        clock.advance(0.5)
        raise TimeoutError

    with pytest.raises(TimeoutError):
        b.call(slow_timeout)  # trips
    b.call(lambda: clock.advance(0.05))  # would be rejected: admitted
    b.call(lambda: clock.advance(0.05))  # and again
    clock.advance(5.0)
    b.call(lambda: clock.advance(2.0))  # the probe: closes
    c = otel.collect()
    assert c("fastbreaker.breaker.would_reject", name="dry") == 2
    assert c("fastbreaker.breaker.rejected", name="dry") == 0
    assert c("fastbreaker.breaker.timeouts", name="dry") == 1
    assert c("fastbreaker.breaker.probe_successes", name="dry") == 1
    assert c("fastbreaker.breaker.probe_failures", name="dry") == 0
    assert c("fastbreaker.breaker.open_seconds", name="dry") == pytest.approx(5.1)
    assert c("fastbreaker.breaker.call_seconds.count", name="dry") == 4
    assert c("fastbreaker.breaker.call_seconds.sum", name="dry") == pytest.approx(2.6)
    assert c.kinds["fastbreaker.breaker.call_seconds.sum"] == "counter"
    assert set(c.series("fastbreaker.breaker.call_seconds.count")) == {
        frozenset({("name", "dry")})  # the untimed breaker has no latency series
    }


def test_window_mode_exports_the_failure_rate(fb, clock, otel):
    b = fb.CircuitBreaker(window=10, min_calls=10, name="w", clock=clock)
    instrument(otel.meter, breakers=[b])
    for ok in (True, True, True, False):
        b.allow()
        b.record_success() if ok else b.record_failure()
    assert otel.collect()("fastbreaker.breaker.failure_rate", name="w") == 0.25


def test_isolated_and_half_open_states(fb, clock, otel):
    a = fb.CircuitBreaker(name="a", clock=clock)
    h = fb.CircuitBreaker(reset_timeout=1.0, name="h", clock=clock)
    instrument(otel.meter, breakers=(a, h))
    a.isolate()
    h.trip()
    clock.advance(1.0)
    assert h.allow()  # the probe: HALF_OPEN until it reports
    c = otel.collect()
    assert states(c, name="a") == {"closed": 0, "open": 0, "half_open": 0, "isolated": 1}
    assert states(c, name="h") == {"closed": 0, "open": 0, "half_open": 1, "isolated": 0}


# -- maps ----------------------------------------------------------------------------------------
def test_map_aggregates_and_bounded_key_series(fb, clock, otel):
    m = fb.BreakerMap(failure_threshold=1, reset_timeout=5.0, clock=clock)
    instrument(otel.meter, maps={"http": m}, max_key_series=3)
    for i in range(1000):
        m.call(f"host-{i:04d}", lambda: None)
    for i in (7, 3, 900, 42, 5):
        _fail(m, f"host-{i:04d}")
    m["host-0500"].isolate()
    clock.advance(5.0)
    assert m.allow("host-0900")  # a probe: HALF_OPEN

    c = otel.collect()
    assert c("fastbreaker.map.keys", map="http") == 1000
    assert c("fastbreaker.map.open_keys", map="http", state="open") == 4
    assert c("fastbreaker.map.open_keys", map="http", state="half_open") == 1
    assert c("fastbreaker.map.open_keys", map="http", state="isolated") == 1
    assert c("fastbreaker.map.successes", map="http") == 1000
    assert c("fastbreaker.map.failures", map="http") == 5
    assert c("fastbreaker.map.trips", map="http") == 5
    assert c("fastbreaker.map.permitted", map="http") == 1006

    # 1000 keys, 6 not CLOSED, max_key_series=3: exactly 3 key series, the first by str(key).
    keyed = c.series("fastbreaker.map.key_state")
    assert {(dict(k)["key"], dict(k)["state"]) for k in keyed} == {
        ("host-0003", "open"),
        ("host-0005", "open"),
        ("host-0007", "open"),
    }
    assert all(dict(k)["map"] == "http" for k in keyed) and set(keyed.values()) == {1.0}
    assert c("fastbreaker.map.key_series_omitted", map="http") == 3

    # Closing keys removes their series; the selection moves on, stably.
    clock.advance(5.0)
    for key in ("host-0003", "host-0005"):
        m.call(key, lambda: None)
    c = otel.collect()
    keyed = c.series("fastbreaker.map.key_state")
    assert sorted((dict(k)["key"], dict(k)["state"]) for k in keyed) == [
        ("host-0007", "open"),
        ("host-0042", "open"),
        ("host-0500", "isolated"),
    ]
    assert c("fastbreaker.map.key_series_omitted", map="http") == 1


def test_only_non_closed_keys_get_a_series(fb, clock, otel):
    m = fb.BreakerMap(failure_threshold=1, clock=clock)
    _fail(m, ("api.example", 443))
    for i in range(20):
        m.call(f"fine-{i}", lambda: None)
    instrument(otel.meter, maps={"m": m})  # default bound: 100
    c = otel.collect()
    assert c.series("fastbreaker.map.key_state") == {
        frozenset({("map", "m"), ("key", "('api.example', 443)"), ("state", "open")}): 1.0
    }
    assert c("fastbreaker.map.key_series_omitted", map="m") == 0
    assert c("fastbreaker.map.keys", map="m") == 21


def test_max_key_series_zero_exports_aggregates_only(fb, clock, otel):
    m = fb.BreakerMap(failure_threshold=1, clock=clock)
    for i in range(50):
        _fail(m, i)
    instrument(otel.meter, maps={"m": m}, max_key_series=0)
    c = otel.collect()
    assert c.series("fastbreaker.map.key_state") == {}
    assert c("fastbreaker.map.open_keys", map="m", state="open") == 50
    assert c("fastbreaker.map.key_series_omitted", map="m") == 50


def test_map_bounds_apply_to_each_map(fb, clock, otel):
    a = fb.BreakerMap(failure_threshold=1, clock=clock)
    b = fb.BreakerMap(failure_threshold=1, clock=clock)
    for i in range(5):
        _fail(a, f"a{i}")
        _fail(b, f"b{i}")
    instrument(otel.meter, maps={"a": a, "b": b}, max_key_series=2)
    c = otel.collect()
    keyed = sorted((dict(k)["map"], dict(k)["key"]) for k in c.series("fastbreaker.map.key_state"))
    assert keyed == [("a", "a0"), ("a", "a1"), ("b", "b0"), ("b", "b1")]
    assert c("fastbreaker.map.key_series_omitted", map="a") == 3
    assert c("fastbreaker.map.key_series_omitted", map="b") == 3


def test_map_evictions_and_suppressed_trips(fb, clock, otel):
    bounded = fb.BreakerMap(max_keys=10, clock=clock)
    for i in range(25):
        bounded.call(i, lambda: None)
    guarded = fb.BreakerMap(failure_threshold=1, max_open_ratio=0.2, clock=clock)
    for i in range(10):
        guarded.call(i, lambda: None)
    for i in range(5):
        _fail(guarded, i)  # at most 2 of 10 may open: 3 trips are refused
    instrument(otel.meter, maps={"bounded": bounded, "guarded": guarded})

    c = otel.collect()
    bm = bounded.metrics()
    assert bm.evicted >= 15
    assert c("fastbreaker.map.keys", map="bounded") == bm.keys <= 10
    assert c("fastbreaker.map.evicted", map="bounded") == bm.evicted
    assert c("fastbreaker.map.successes", map="bounded") == 25  # dropped keys included
    assert c("fastbreaker.map.untracked", map="bounded") == bm.untracked
    assert c("fastbreaker.map.suppressed_trips", map="guarded") == 3
    assert c("fastbreaker.map.open_keys", map="guarded", state="open") == 2


def test_map_dry_run_and_open_seconds(fb, clock, otel):
    m = fb.BreakerMap(failure_threshold=1, clock=clock, dry_run=True)
    instrument(otel.meter, maps={"hosts": m})
    m.allow("a")
    m.record_failure("a")
    m.allow("a")
    clock.advance(3.0)
    c = otel.collect()
    assert c("fastbreaker.map.would_reject", map="hosts") == 1
    assert c("fastbreaker.map.open_seconds", map="hosts") == pytest.approx(3.0)


def test_keys_with_equal_str_give_one_series(fb, clock, otel):
    m = fb.BreakerMap(failure_threshold=1, clock=clock)
    _fail(m, 1)
    _fail(m, "1")
    instrument(otel.meter, maps={"m": m})
    c = otel.collect()
    assert len(c.series("fastbreaker.map.key_state")) == 1
    assert c("fastbreaker.map.open_keys", map="m", state="open") == 2


class _Unprintable:
    """A map key whose ``__str__`` raises (its ``repr`` works)."""

    def __str__(self) -> str:
        raise RuntimeError("no str for this key")

    def __repr__(self) -> str:
        return "<Unprintable>"


def test_a_key_whose_str_raises_is_labelled_by_its_repr(fb, clock, otel):
    m = fb.BreakerMap(failure_threshold=1, clock=clock)
    _fail(m, _Unprintable())
    _fail(m, "plain")
    breaker = fb.CircuitBreaker(name="api", clock=clock)
    instrument(otel.meter, breakers=[breaker], maps={"m": m})
    c = otel.collect()
    assert {dict(k)["key"] for k in c.series("fastbreaker.map.key_state")} == {
        "<Unprintable>",
        "plain",
    }
    assert c("fastbreaker.map.open_keys", map="m", state="open") == 2
    assert states(c, name="api")["closed"] == 1


# -- budgets and bulkheads -----------------------------------------------------------------------
def test_budget_tokens(fb, clock, otel):
    budget = fb.RetryBudget(ratio=0.5, capacity=10, min_per_sec=0, clock=clock)
    instrument(otel.meter, budgets={"http": budget})
    for _ in range(3):
        assert budget.allow_retry()
    c = otel.collect()
    assert c("fastbreaker.retry_budget.tokens", name="http") == 7.0
    assert c("fastbreaker.retry_budget.capacity", name="http") == 10.0
    budget.record_success()
    assert otel.collect()("fastbreaker.retry_budget.tokens", name="http") == 7.5


def test_bulkhead_in_flight_and_limits(fb, clock, otel):
    bh = fb.Bulkhead(2, name="db", clock=clock)
    limiter = fb.AdaptiveLimiter(8, min_limit=2, max_limit=10, name="api", clock=clock)
    instrument(otel.meter, bulkheads=[bh, limiter])
    assert bh.try_acquire() and bh.try_acquire()
    assert not bh.try_acquire()  # full: a rejection
    assert limiter.try_acquire()

    c = otel.collect()
    assert c("fastbreaker.bulkhead.in_flight", name="db") == 2
    assert c("fastbreaker.bulkhead.admitted", name="db") == 2
    assert c("fastbreaker.bulkhead.rejected", name="db") == 1
    assert c("fastbreaker.bulkhead.limit", name="db") == 2
    assert c("fastbreaker.bulkhead.waiting", name="db") == 0
    assert c("fastbreaker.bulkhead.in_flight", name="api") == 1
    assert c("fastbreaker.bulkhead.limit", name="api") == 8

    bh.release()
    bh.release()
    limiter.release(dropped=True)  # a drop cuts the adaptive limit
    c = otel.collect()
    assert c("fastbreaker.bulkhead.in_flight", name="db") == 0
    assert c("fastbreaker.bulkhead.peak_in_flight", name="db") == 2
    assert c("fastbreaker.bulkhead.in_flight", name="api") == 0
    assert c("fastbreaker.bulkhead.limit", name="api") == pytest.approx(limiter.limit)
    assert limiter.limit < 8


# -- load shedders and degraded functions -----------------------------------------------------------
def test_shedder_admissions_refusals_and_levels(fb, otel):
    shedder = fb.LoadShedder(fb.Bulkhead(1), max_queue=0, name="api")
    instrument(otel.meter, shedders=[shedder])
    with shedder:
        with pytest.raises(fb.LoadShedError) as info:
            shedder.call(lambda: None)  # the only slot is held, and nobody may wait
        assert info.value.reason == "queue_full"
        c = otel.collect()
        assert c("fastbreaker.shedder.in_flight", name="api") == 1
        assert c("fastbreaker.shedder.queue_len", name="api") == 0
    c = otel.collect()
    assert c("fastbreaker.shedder.admitted", name="api") == 1
    assert c("fastbreaker.shedder.queued", name="api") == 0
    assert c.series("fastbreaker.shedder.shed") == {
        frozenset({("name", "api"), ("reason", "queue_full")}): 1,
        frozenset({("name", "api"), ("reason", "too_old")}): 0,
        frozenset({("name", "api"), ("reason", "priority")}): 0,
        frozenset({("name", "api"), ("reason", "deadline")}): 0,
    }
    assert c("fastbreaker.shedder.in_flight", name="api") == 0
    assert c("fastbreaker.shedder.congested", name="api") == 0
    assert c.kinds["fastbreaker.shedder.shed"] == "counter"
    assert c.kinds["fastbreaker.shedder.congested"] == "gauge"
    m = shedder.metrics()
    assert (m.admitted, m.shed_queue_full) == (1, 1)  # the collections admitted nothing


def test_fallback_calls_fallbacks_and_active_seconds(fb, clock, otel):
    breaker = fb.CircuitBreaker(clock=clock)
    breaker.trip()
    price = fb.fallback(lambda exc: "default", clock=clock)(_open(breaker))
    instrument(otel.meter, fallbacks={"price": price})
    c = otel.collect()
    assert c("fastbreaker.fallback.calls", name="price") == 0
    assert c("fastbreaker.fallback.active_seconds", name="price") == 0.0

    assert price() == "default"
    assert price() == "default"
    clock.advance(2.5)
    c = otel.collect()
    assert c("fastbreaker.fallback.calls", name="price") == 2
    assert c("fastbreaker.fallback.fallbacks", name="price") == 2
    assert c("fastbreaker.fallback.stale_served", name="price") == 0
    assert c("fastbreaker.fallback.active_seconds", name="price") == pytest.approx(2.5)
    assert c.units["fastbreaker.fallback.active_seconds"] == "s"

    clock.advance(1.0)  # still degraded: the run goes on
    c = otel.collect()
    assert c("fastbreaker.fallback.active_seconds", name="price") == pytest.approx(3.5)

    breaker.reset()
    assert price() == "fresh"  # a normal answer ends the run
    c = otel.collect()
    assert c("fastbreaker.fallback.calls", name="price") == 3
    assert c("fastbreaker.fallback.fallbacks", name="price") == 2
    assert c("fastbreaker.fallback.active_seconds", name="price") == 0.0


def test_stale_on_error_stale_served(fb, clock, otel):
    breaker = fb.CircuitBreaker(clock=clock)
    cached = fb.stale_on_error(0, stale_ttl=60.0, clock=clock)(_open(breaker))
    plain = fb.fallback(lambda exc: "default", clock=clock)(_open(breaker))
    instrument(otel.meter, fallbacks={"cached": cached, "plain": plain})
    assert cached() == "fresh"
    breaker.trip()
    clock.advance(4.0)
    assert cached() == "fresh"  # the last good result, served stale
    assert cached() == "fresh"
    clock.advance(1.0)
    c = otel.collect()
    assert c("fastbreaker.fallback.calls", name="cached") == 3
    assert c("fastbreaker.fallback.stale_served", name="cached") == 2
    assert c("fastbreaker.fallback.fallbacks", name="cached") == 0
    assert c("fastbreaker.fallback.active_seconds", name="cached") == pytest.approx(1.0)
    assert c("fastbreaker.fallback.calls", name="plain") == 0  # each label its own series


# -- names, and the Prometheus collector -----------------------------------------------------------
def test_instrument_names(fb, clock, otel):
    result = instrument(
        otel.meter,
        breakers=[fb.CircuitBreaker(name="b", clock=clock)],
        maps={"m": fb.BreakerMap(clock=clock)},
        budgets={"r": fb.RetryBudget(clock=clock)},
        bulkheads=[fb.Bulkhead(1, name="s")],
        shedders=[fb.LoadShedder(1, name="l")],
        fallbacks={"f": fb.stale_on_error(1.0, stale_ttl=2.0)(lambda: None)},
    )
    assert isinstance(result, Instrumentation)
    assert [i.name for i in result.instruments] == ALL_NAMES
    assert repr(result) == "<Instrumentation instruments=59>"


def test_only_the_kinds_given_are_registered(fb, clock, otel):
    assert instrument(otel.meter).instruments == ()
    budget, m = fb.RetryBudget(clock=clock), fb.BreakerMap(clock=clock)  # alive: held weakly
    budgets = instrument(otel.meter, budgets={"r": budget})
    assert [i.name for i in budgets.instruments] == BUDGET_NAMES
    # another kind on the same meter is fine
    maps = instrument(otel.meter, maps={"m": m})
    assert [i.name for i in maps.instruments] == MAP_NAMES
    assert otel.collect().names() == {
        *BUDGET_NAMES,
        *(n for n in MAP_NAMES if n != "fastbreaker.map.key_state"),  # no key is open
    }


def test_the_same_series_as_the_prometheus_collector(fb, clock, otel):
    # The names are the Prometheus names with dots (counters without the "_total" suffix),
    # the attributes its labels, and the values its values, series for series.
    pytest.importorskip("prometheus_client")
    from fastbreaker.contrib.prometheus import BreakerCollector

    b = fb.CircuitBreaker(window=4, min_calls=2, name="b", clock=clock, record_latency=True)
    b.call(lambda: clock.advance(0.25))
    with pytest.raises(ValueError):
        b.call(_raise)
    clock.advance(1.5)
    m = fb.BreakerMap(failure_threshold=1, clock=clock)
    for i in range(4):
        _fail(m, f"k{i}")
    m.call("fine", lambda: None)
    budget = fb.RetryBudget(ratio=0.5, capacity=10, min_per_sec=0, clock=clock)
    assert budget.allow_retry()
    objects: dict[str, Any] = {"breakers": [b], "maps": {"m": m}, "budgets": {"r": budget}}
    instrument(otel.meter, max_key_series=2, **objects)
    collector = BreakerCollector(max_key_series=2, **objects)

    assert _same_series(otel.collect(), collector) == 21 + 23 + 2  # breaker, map, budget


def _same_series(c: Collection, collector: Any) -> int:
    """Check that ``c`` holds the collector's series, by Prometheus name; how many there are."""
    prometheus: dict[tuple[str, Labels], float] = {}
    for family in collector.collect():
        for s in family.samples:
            if not s.name.endswith("_bucket"):  # OTel exports the latency's sum and count
                prometheus[(s.name, frozenset(s.labels.items()))] = s.value
    exported: dict[tuple[str, Labels], float] = {}
    for name, series in c.points.items():
        prom_name = name.replace(".", "_")
        if c.kinds[name] == "counter" and not name.startswith("fastbreaker.breaker.call_seconds."):
            prom_name += "_total"
        for labels, value in series.items():
            exported[(prom_name, labels)] = value
    assert exported.keys() == prometheus.keys()
    for key, value in exported.items():
        assert value == pytest.approx(prometheus[key]), key
    return len(exported)


def test_shedders_and_fallbacks_as_the_prometheus_collector(fb, clock, otel):
    pytest.importorskip("prometheus_client")
    import inspect

    from fastbreaker.contrib.prometheus import BreakerCollector

    if "shedders" not in inspect.signature(BreakerCollector).parameters:
        pytest.skip("this BreakerCollector exports no load shedders")
    shedder = fb.LoadShedder(fb.Bulkhead(1), max_queue=0, name="api")
    breaker = fb.CircuitBreaker(clock=clock)
    breaker.trip()
    price = fb.fallback(lambda exc: "default", clock=clock)(_open(breaker))
    cached = fb.stale_on_error(0, stale_ttl=60.0, clock=clock)(_open(fb.CircuitBreaker()))
    cached()
    objects: dict[str, Any] = {
        "shedders": [shedder],
        "fallbacks": {"price": price, "cached": cached},
    }
    instrument(otel.meter, **objects)
    collector = BreakerCollector(**objects)
    with shedder:
        with pytest.raises(fb.LoadShedError):
            shedder.call(lambda: None)
        price()
        clock.advance(2.0)
        assert _same_series(otel.collect(), collector) == 9 + 2 * 4


# -- arguments -----------------------------------------------------------------------------------
def _bad_arguments(fb: Any, clock: Any) -> list[tuple[dict[str, Any], type, str]]:
    b = fb.CircuitBreaker(name="x", clock=clock)
    m = fb.BreakerMap(clock=clock)
    degraded = fb.fallback(lambda exc: None)(lambda: None)
    return [
        ({"max_key_series": -1}, ValueError, "max_key_series must be >= 0"),
        ({"max_key_series": 2.0}, TypeError, "max_key_series must be an int >= 0"),
        ({"max_key_series": True}, TypeError, "max_key_series must be an int >= 0"),
        ({"breakers": b}, TypeError, r"breakers must be a sequence .*wrap a single one"),
        ({"breakers": {b}}, TypeError, "breakers must be a sequence"),
        ({"breakers": "x"}, TypeError, "breakers must be a sequence"),
        ({"breakers": [b, object()]}, TypeError, r"breakers\[1\] must be a .*CircuitBreaker"),
        ({"breakers": [fb.RetryBudget()]}, TypeError, r"breakers\[0\] must be a"),
        ({"breakers": [fb.CircuitBreaker(clock=clock)]}, ValueError, r"breakers\[0\] has no name"),
        (
            {"breakers": [b, fb.CircuitBreaker(name="x", clock=clock)]},
            ValueError,
            r"breakers\[1\] and breakers\[0\] are both named 'x'",
        ),
        ({"maps": [m]}, TypeError, "maps must be a mapping"),
        ({"maps": {"": m}}, TypeError, "maps labels must be non-empty strs"),
        ({"maps": {1: m}}, TypeError, "maps labels must be non-empty strs"),
        ({"maps": {"m": b}}, TypeError, r"maps\['m'\] must be a fastbreaker.BreakerMap"),
        ({"budgets": {"r": object()}}, TypeError, r"budgets\['r'\] must be a .*RetryBudget"),
        ({"budgets": (fb.RetryBudget(),)}, TypeError, "budgets must be a mapping"),
        ({"bulkheads": [b]}, TypeError, r"bulkheads\[0\] must be a fastbreaker.Bulkhead"),
        ({"bulkheads": [fb.Bulkhead(1)]}, ValueError, r"bulkheads\[0\] has no name"),
        ({"bulkheads": fb.Bulkhead(1, name="s")}, TypeError, "bulkheads must be a sequence"),
        ({"shedders": [fb.Bulkhead(1, name="s")]}, TypeError, r"shedders\[0\] must be a .*Shedder"),
        ({"shedders": [fb.LoadShedder(1)]}, ValueError, r"shedders\[0\] has no name"),
        (
            {"shedders": [fb.LoadShedder(1, name="l"), fb.LoadShedder(1, name="l")]},
            ValueError,
            r"shedders\[1\] and shedders\[0\] are both named 'l'",
        ),
        ({"shedders": fb.LoadShedder(1, name="l")}, TypeError, "shedders must be a sequence"),
        ({"fallbacks": [degraded]}, TypeError, "fallbacks must be a mapping"),
        ({"fallbacks": {"": degraded}}, TypeError, "fallbacks labels must be non-empty strs"),
        ({"fallbacks": {"f": lambda: None}}, TypeError, r"fallbacks\['f'\] must be a function"),
        ({"fallbacks": {"f": b}}, TypeError, r"fallbacks\['f'\] must be a function wrapped"),
    ]


def test_invalid_arguments_name_the_parameter(fb, clock, otel):
    for kwargs, err, match in _bad_arguments(fb, clock):
        with pytest.raises(err, match=match):
            instrument(otel.meter, **kwargs)
    with pytest.raises(TypeError, match="meter must be an opentelemetry.metrics.Meter"):
        instrument(object())
    assert otel.collect().names() == set()  # the refused calls registered nothing


def test_the_same_object_twice_is_exported_once(fb, clock, otel):
    b = fb.CircuitBreaker(name="x", clock=clock)
    instrument(otel.meter, breakers=[b, b])
    b.call(lambda: None)
    assert otel.collect().series("fastbreaker.breaker.successes") == {frozenset({("name", "x")}): 1}


def test_a_second_call_for_the_same_kind_is_refused(fb, clock, otel):
    first = fb.BreakerMap(failure_threshold=1, clock=clock)
    instrument(otel.meter, maps={"first": first})
    b = fb.CircuitBreaker(name="b", clock=clock)
    with pytest.raises(ValueError, match="'fastbreaker.map.keys' from an earlier instrument"):
        # the breaker instruments are registered before the map ones are refused
        instrument(otel.meter, breakers=[b], maps={"second": fb.BreakerMap(clock=clock)})
    b.call(lambda: None)
    c = otel.collect()
    assert not any(n.startswith("fastbreaker.breaker.") for n in c.names())  # they stay silent
    assert set(c.series("fastbreaker.map.keys")) == {frozenset({("map", "first")})}
    # another meter (another instrumentation scope) takes them
    instrument(otel.provider.get_meter("other"), breakers=[b])
    assert otel.collect()("fastbreaker.breaker.successes", name="b") == 1


def test_nothing_is_added_to_the_call_path(fb, clock, otel):
    # Only snapshots are read: no callback on the objects, no call made, no key created.
    b = fb.CircuitBreaker(failure_threshold=1, name="p", clock=clock)
    m = fb.BreakerMap(failure_threshold=1, clock=clock)
    bh = fb.Bulkhead(1, name="s")
    shedder = fb.LoadShedder(1, name="l")
    fired: list[Any] = []
    b.on_state_change(lambda *a: fired.append(a))
    instrument(otel.meter, breakers=[b], maps={"m": m}, bulkheads=[bh], shedders=[shedder])
    otel.collect()
    b.allow()
    b.record_failure()
    otel.collect()
    assert len(fired) == 1  # only ours
    assert b.metrics().permitted == 1  # collections called no allow()
    assert m.metrics().permitted == 0 and len(m) == 0  # and created no key
    assert bh.metrics().admitted == 0
    assert shedder.metrics().admitted == 0


# -- imports -------------------------------------------------------------------------------------
def _run(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )


def test_the_module_imports_without_opentelemetry():
    out = _run(
        "import sys\n"
        "sys.modules['opentelemetry'] = None  # as if it were not installed\n"
        "sys.modules['opentelemetry.metrics'] = None\n"
        "import fastbreaker\n"
        "from fastbreaker.contrib.otel import instrument\n"
        "try:\n"
        "    instrument(object(), breakers=[fastbreaker.CircuitBreaker(name='x')])\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    assert out.returncode == 0, out.stderr
    assert "pip install 'fastbreaker[otel]'" in out.stdout


def test_importing_the_module_does_not_import_opentelemetry():
    out = _run(
        "import sys, fastbreaker\n"
        "import fastbreaker.contrib.otel\n"
        "assert not [m for m in sys.modules if m.startswith('opentelemetry')], sys.modules\n"
    )
    assert out.returncode == 0, out.stderr


# -- weak references -------------------------------------------------------------------------------
def test_a_dropped_object_is_no_longer_exported(fb, clock, otel):
    kept = fb.CircuitBreaker(name="kept", clock=clock)
    objs = {
        "b": fb.CircuitBreaker(name="b", clock=clock),
        "m": fb.BreakerMap(clock=clock),
        "budget": fb.RetryBudget(clock=clock),
        "slots": fb.Bulkhead(2, name="slots"),
        "shed": fb.LoadShedder(1, name="shed"),
        "f": fb.fallback(lambda exc: 0)(lambda: 1),
    }
    instrument(
        otel.meter,
        breakers=[kept, objs["b"]],
        maps={"m": objs["m"]},
        budgets={"budget": objs["budget"]},
        bulkheads=[objs["slots"]],
        shedders=[objs["shed"]],
        fallbacks={"f": objs["f"]},
    )
    seen = {
        "fastbreaker.breaker.failures": {"kept", "b"},
        "fastbreaker.map.keys": {"m"},
        "fastbreaker.retry_budget.tokens": {"budget"},
        "fastbreaker.bulkhead.limit": {"slots"},
        "fastbreaker.shedder.admitted": {"shed"},
        "fastbreaker.fallback.calls": {"f"},
    }

    def exported() -> dict[str, set[str]]:
        c = otel.collect()
        return {
            name: {dict(k).get("name") or dict(k)["map"] for k in c.series(name)} for name in seen
        }

    assert exported() == seen
    refs = [weakref.ref(obj) for obj in objs.values()]
    objs.clear()
    gc.collect()
    assert [r() for r in refs] == [None] * 6  # the callbacks kept none of them alive
    assert exported() == {
        name: ({"kept"} if name.startswith("fastbreaker.breaker.") else set()) for name in seen
    }
