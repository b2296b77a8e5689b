"""fastbreaker.contrib.prometheus: a real registry, scraped over HTTP on 127.0.0.1 and parsed.

Every test registers a ``BreakerCollector`` in a fresh ``CollectorRegistry`` served by
``prometheus_client.start_http_server`` on an ephemeral port, scrapes ``/metrics`` and parses the
exposition text with ``prometheus_client.parser``.
"""

from __future__ import annotations

import gc
import itertools
import os
import subprocess
import sys
import urllib.request
import weakref
from collections.abc import Iterator
from typing import Any, Callable

import pytest

pytest.importorskip("prometheus_client")  # the optional extra: fastbreaker[prometheus]

from memory_support import assert_flat, not_on_free_threading  # noqa: E402
from prometheus_client import CollectorRegistry, start_http_server  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from fastbreaker.contrib.prometheus import BreakerCollector  # noqa: E402

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


class Scrape:
    """The parsed samples of one scrape, looked up by sample name and labels."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.samples: Samples = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                self.samples[(s.name, frozenset(s.labels.items()))] = s.value

    def __call__(self, metric: str, /, **labels: str) -> float:
        return self.samples[(metric, frozenset(labels.items()))]

    def series(self, name: str) -> dict[frozenset[tuple[str, str]], float]:
        return {labels: v for (n, labels), v in self.samples.items() if n == name}

    def names(self) -> set[str]:
        return {n for n, _ in self.samples}


class _TestRegistry:
    """The module's real registry, seen by one test: what the test registers is removed after."""

    def __init__(self, real: CollectorRegistry) -> None:
        self.real = real
        self.added: list[Any] = []

    def register(self, collector: Any) -> None:
        self.real.register(collector)
        self.added.append(collector)


@pytest.fixture(scope="module")
def _server() -> Iterator[tuple[CollectorRegistry, str]]:
    # One registry and one exposition server for the module (stopping a server waits for its
    # poll interval, so one per test would be slow).
    real = CollectorRegistry()
    server, thread = start_http_server(0, addr="127.0.0.1", registry=real)
    try:
        yield real, f"http://127.0.0.1:{server.server_port}/metrics"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def registry(_server: tuple[CollectorRegistry, str]) -> Iterator[_TestRegistry]:
    test_registry = _TestRegistry(_server[0])
    try:
        yield test_registry
    finally:
        for collector in test_registry.added:
            test_registry.real.unregister(collector)


@pytest.fixture
def scrape(_server: tuple[CollectorRegistry, str], registry: _TestRegistry) -> Callable[[], Scrape]:
    url = _server[1]

    def get() -> Scrape:
        with urllib.request.urlopen(url, timeout=5) as response:
            assert response.status == 200
            return Scrape(response.read().decode())

    return get


def states(s: Scrape, **labels: str) -> dict[str, float]:
    return {
        dict(k)["state"]: v
        for k, v in s.series("fastbreaker_breaker_state").items()
        if all(dict(k).get(n) == v2 for n, v2 in labels.items())
    }


# -- breakers ------------------------------------------------------------------------------------
def test_breaker_state_and_counters(fb, clock, registry, scrape):
    b = fb.CircuitBreaker(failure_threshold=2, reset_timeout=10.0, name="payments", clock=clock)
    other = fb.CircuitBreaker(name="search", clock=clock)
    registry.register(BreakerCollector(breakers=[b, other]))
    for _ in range(3):
        b.call(lambda: None)
    for _ in range(2):
        with pytest.raises(ValueError):
            b.call(_raise)
    with pytest.raises(fb.CircuitOpenError):
        b.call(lambda: None)
    other.allow()
    other.record_failure()

    s = scrape()
    assert states(s, name="payments") == {"closed": 0, "open": 1, "half_open": 0, "isolated": 0}
    assert states(s, name="search") == {"closed": 1, "open": 0, "half_open": 0, "isolated": 0}
    m = b.metrics()
    for field, part in (
        ("permitted", "permitted"),
        ("rejected", "rejected"),
        ("successes", "successes"),
        ("failures", "failures"),
        ("slow_calls", "slow_calls"),
        ("ignored", "ignored"),
        ("stale", "stale"),
        ("opened", "trips"),
    ):
        assert s(f"fastbreaker_breaker_{part}_total", name="payments") == getattr(m, field)
    assert (m.permitted, m.rejected, m.successes, m.failures, m.opened) == (5, 1, 3, 2, 1)
    assert s("fastbreaker_breaker_consecutive_failures", name="search") == 1
    assert "fastbreaker_breaker_failure_rate" not in s.names()  # no breaker in window mode

    # Read at scrape time: the next scrape sees the recovery.
    clock.advance(10.0)
    b.call(lambda: None)
    s = scrape()
    assert states(s, name="payments")["closed"] == 1
    assert s("fastbreaker_breaker_trips_total", name="payments") == 1
    assert s("fastbreaker_breaker_successes_total", name="payments") == 4


def _raise() -> None:
    raise ValueError("down")


def test_round_two_metrics_and_the_latency_histogram(fb, clock, registry, scrape):
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
    registry.register(BreakerCollector(breakers=[b, untimed]))

    def slow_timeout() -> None:
        clock.advance(0.5)
        raise TimeoutError

    with pytest.raises(TimeoutError):
        b.call(slow_timeout)  # trips
    b.call(lambda: clock.advance(0.05))  # would be rejected: admitted
    clock.advance(5.0)
    b.call(lambda: clock.advance(2.0))  # the probe: closes
    s = scrape()
    m = b.metrics()
    assert (m.would_reject, m.timeouts, m.probe_successes, m.probe_failures) == (1, 1, 1, 0)
    for field, part in (
        ("would_reject", "would_reject"),
        ("timeouts", "timeouts"),
        ("probe_successes", "probe_successes"),
        ("probe_failures", "probe_failures"),
        ("open_seconds_total", "open_seconds"),
    ):
        assert s(f"fastbreaker_breaker_{part}_total", name="dry") == getattr(m, field)
    assert s("fastbreaker_breaker_open_seconds_total", name="dry") == pytest.approx(5.05)
    assert s("fastbreaker_breaker_call_seconds_bucket", name="dry", le="0.1") == 1
    assert s("fastbreaker_breaker_call_seconds_bucket", name="dry", le="1.0") == 2
    assert s("fastbreaker_breaker_call_seconds_bucket", name="dry", le="+Inf") == 3
    assert s("fastbreaker_breaker_call_seconds_count", name="dry") == 3
    assert s("fastbreaker_breaker_call_seconds_sum", name="dry") == pytest.approx(2.55)
    assert not any(
        dict(labels).get("name") == "untimed"
        for labels in s.series("fastbreaker_breaker_call_seconds_count")
    )


def test_map_totals_of_round_two_counters(fb, clock, registry, scrape):
    m = fb.BreakerMap(failure_threshold=1, clock=clock, dry_run=True)
    registry.register(BreakerCollector(maps={"hosts": m}))
    m.allow("a")
    m.record_failure("a")
    m.allow("a")
    clock.advance(3.0)
    s = scrape()
    assert s("fastbreaker_map_would_reject_total", map="hosts") == 1
    assert s("fastbreaker_map_open_seconds_total", map="hosts") == pytest.approx(3.0)


def test_window_mode_exports_the_failure_rate(fb, clock, registry, scrape):
    b = fb.CircuitBreaker(window=10, min_calls=10, name="w", clock=clock)
    for ok in (True, True, True, False):
        b.allow()
        b.record_success() if ok else b.record_failure()
    registry.register(BreakerCollector(breakers={"renamed": b}))
    assert scrape()("fastbreaker_breaker_failure_rate", name="renamed") == 0.25


def test_isolated_and_half_open_states(fb, clock, registry, scrape):
    a = fb.CircuitBreaker(name="a", clock=clock)
    h = fb.CircuitBreaker(reset_timeout=1.0, name="h", clock=clock)
    registry.register(BreakerCollector(breakers=[a, h]))
    a.isolate()
    h.trip()
    clock.advance(1.0)
    assert h.allow()  # the probe: HALF_OPEN until it reports
    s = scrape()
    assert states(s, name="a")["isolated"] == 1
    assert states(s, name="h")["half_open"] == 1
    assert sum(states(s, name="h").values()) == 1


# -- maps ----------------------------------------------------------------------------------------
def _fail(m: Any, key: Any, times: int = 1) -> None:
    for _ in range(times):
        if m.allow(key):
            m.record_failure(key)


def test_map_aggregates_and_bounded_key_series(fb, clock, registry, scrape):
    m = fb.BreakerMap(failure_threshold=1, reset_timeout=5.0, clock=clock)
    for i in range(1000):
        m.call(f"host-{i:04d}", lambda: None)
    for i in (7, 3, 900, 42, 5):
        _fail(m, f"host-{i:04d}")
    m["host-0500"].isolate()
    clock.advance(5.0)
    assert m.allow("host-0900")  # a probe: HALF_OPEN
    registry.register(BreakerCollector(maps={"http": m}, max_key_series=3))

    s = scrape()
    assert s("fastbreaker_map_keys", map="http") == 1000
    assert s("fastbreaker_map_open_keys", map="http", state="open") == 4
    assert s("fastbreaker_map_open_keys", map="http", state="half_open") == 1
    assert s("fastbreaker_map_open_keys", map="http", state="isolated") == 1
    mm = m.metrics()
    for field, part in (
        ("permitted", "permitted"),
        ("rejected", "rejected"),
        ("successes", "successes"),
        ("failures", "failures"),
        ("stale", "stale"),
        ("opened", "trips"),
    ):
        assert s(f"fastbreaker_map_{part}_total", map="http") == getattr(mm, field)
    assert (mm.successes, mm.failures, mm.opened) == (1000, 5, 5)

    # 1000 keys, 6 not CLOSED, max_key_series=3: exactly 3 key series, the first by str(key).
    keyed = s.series("fastbreaker_map_key_state")
    assert {(dict(k)["key"], dict(k)["state"]) for k in keyed} == {
        ("host-0003", "open"),
        ("host-0005", "open"),
        ("host-0007", "open"),
    }
    assert s("fastbreaker_map_key_series_omitted", map="http") == 3
    assert not any("host-0001" in line for line in s.text.splitlines())  # CLOSED: no series

    # Closing keys removes their series; the selection moves on, stably.
    clock.advance(5.0)
    for key in ("host-0003", "host-0005"):
        m.call(key, lambda: None)
    keyed = scrape().series("fastbreaker_map_key_state")
    assert sorted(dict(k)["key"] for k in keyed) == ["host-0007", "host-0042", "host-0500"]


def test_every_non_closed_key_is_shown_up_to_the_bound(fb, clock, registry, scrape):
    m = fb.BreakerMap(failure_threshold=1, clock=clock)
    _fail(m, ("api.example", 443))
    m.call("fine", lambda: None)
    registry.register(BreakerCollector(maps={"m": m}))  # default bound: 100
    s = scrape()
    assert s.series("fastbreaker_map_key_state") == {
        frozenset({("map", "m"), ("key", "('api.example', 443)"), ("state", "open")}): 1.0
    }
    assert s("fastbreaker_map_key_series_omitted", map="m") == 0


def test_max_key_series_zero_exports_aggregates_only(fb, clock, registry, scrape):
    m = fb.BreakerMap(failure_threshold=1, clock=clock)
    for i in range(50):
        _fail(m, i)
    registry.register(BreakerCollector(maps={"m": m}, max_key_series=0))
    s = scrape()
    assert s.series("fastbreaker_map_key_state") == {}
    assert s("fastbreaker_map_open_keys", map="m", state="open") == 50
    assert s("fastbreaker_map_key_series_omitted", map="m") == 50


def test_map_evictions_and_suppressed_trips(fb, clock, registry, scrape):
    bounded = fb.BreakerMap(max_keys=10, clock=clock)
    for i in range(25):
        bounded.call(i, lambda: None)
    guarded = fb.BreakerMap(failure_threshold=1, max_open_ratio=0.2, clock=clock)
    for i in range(10):
        guarded.call(i, lambda: None)
    for i in range(5):
        _fail(guarded, i)  # at most 2 of 10 may open: 3 trips are refused
    registry.register(BreakerCollector(maps={"bounded": bounded, "guarded": guarded}))

    s = scrape()
    bm, gm = bounded.metrics(), guarded.metrics()
    assert bm.evicted >= 15 and gm.suppressed_trips == 3
    assert s("fastbreaker_map_keys", map="bounded") == bm.keys <= 10
    assert s("fastbreaker_map_evicted_total", map="bounded") == bm.evicted
    assert s("fastbreaker_map_successes_total", map="bounded") == 25  # dropped keys included
    assert s("fastbreaker_map_suppressed_trips_total", map="guarded") == 3
    assert s("fastbreaker_map_open_keys", map="guarded", state="open") == 2
    assert s("fastbreaker_map_untracked_total", map="bounded") == bm.untracked


def test_label_values_are_escaped(fb, clock, registry, scrape):
    m = fb.BreakerMap(failure_threshold=1, clock=clock)
    odd = 'a "quoted"\\key\nwith a newline'
    _fail(m, odd)
    registry.register(BreakerCollector(maps={"m": m}))
    keyed = scrape().series("fastbreaker_map_key_state")
    assert [dict(k)["key"] for k in keyed] == [odd]


def test_keys_with_equal_str_give_one_series(fb, clock, registry, scrape):
    m = fb.BreakerMap(failure_threshold=1, clock=clock)
    _fail(m, 1)
    _fail(m, "1")
    registry.register(BreakerCollector(maps={"m": m}))
    s = scrape()  # duplicate series would make the exposition invalid (the parser would see two)
    assert len(s.series("fastbreaker_map_key_state")) == 1
    assert s("fastbreaker_map_open_keys", map="m", state="open") == 2


class _Unprintable:
    """A map key whose ``__str__`` raises (its ``repr`` works)."""

    def __str__(self) -> str:
        raise RuntimeError("no str for this key")

    def __repr__(self) -> str:
        return "<Unprintable>"


def test_a_key_whose_str_raises_is_labelled_by_its_repr(fb, clock, registry, scrape):
    m = fb.BreakerMap(failure_threshold=1, clock=clock)
    _fail(m, _Unprintable())
    _fail(m, "plain")
    breaker = fb.CircuitBreaker(name="api", clock=clock)
    registry.register(BreakerCollector(breakers=[breaker], maps={"m": m}))
    s = scrape()
    keyed = s.series("fastbreaker_map_key_state")
    assert {dict(k)["key"] for k in keyed} == {"<Unprintable>", "plain"}
    assert s("fastbreaker_map_open_keys", map="m", state="open") == 2
    assert states(s, name="api")["closed"] == 1


# -- budgets -------------------------------------------------------------------------------------
def test_budget_tokens(fb, clock, registry, scrape):
    budget = fb.RetryBudget(ratio=0.5, capacity=10, min_per_sec=0, clock=clock)
    collector = BreakerCollector()
    assert collector.add_budget(budget, "http") is budget
    registry.register(collector)
    for _ in range(3):
        assert budget.allow_retry()
    s = scrape()
    assert s("fastbreaker_retry_budget_tokens", name="http") == 7.0
    assert s("fastbreaker_retry_budget_capacity", name="http") == 10.0
    budget.record_success()
    assert scrape()("fastbreaker_retry_budget_tokens", name="http") == 7.5


# -- load shedders and degraded functions --------------------------------------------------------
def test_shedder_admissions_sheds_and_gauges(fb, clock, registry, scrape):
    shedder = fb.LoadShedder(fb.Bulkhead(1), max_queue=0, name="api", clock=clock)
    registry.register(BreakerCollector(shedders=[shedder]))
    with shedder:
        with pytest.raises(fb.LoadShedError) as info:
            shedder.call(lambda: None)  # the only slot is taken and nothing may wait
        assert info.value.reason == "queue_full"
        s = scrape()
        assert s("fastbreaker_shedder_in_flight", name="api") == 1.0
    s = scrape()
    assert s("fastbreaker_shedder_admitted_total", name="api") == 1.0
    assert s("fastbreaker_shedder_shed_total", name="api", reason="queue_full") == 1.0
    assert s("fastbreaker_shedder_shed_total", name="api", reason="deadline") == 0.0
    assert s("fastbreaker_shedder_queued_total", name="api") == 0.0
    assert s("fastbreaker_shedder_in_flight", name="api") == 0.0
    assert s("fastbreaker_shedder_queue_len", name="api") == 0.0
    assert s("fastbreaker_shedder_congested", name="api") == 0.0
    with pytest.raises(ValueError, match="no name"):
        BreakerCollector().add_shedder(fb.LoadShedder(1))
    with pytest.raises(TypeError, match="shedder must"):
        BreakerCollector().add_shedder(fb.Bulkhead(1))


def test_fallback_answers_and_the_time_on_the_fallback(fb, clock, registry, scrape):
    breaker = fb.CircuitBreaker(name="prices")
    breaker.trip()

    @fb.fallback(lambda exc: -1.0, clock=clock)
    def price() -> float:
        return breaker.call(lambda: 9.5)

    @fb.stale_on_error(0, stale_ttl=60, clock=clock)
    def quote(sku: str) -> float:
        return breaker.call(lambda: 9.5)

    registry.register(BreakerCollector(fallbacks={"price": price, "quote": quote}))
    assert price() == -1.0
    clock.advance(90)
    assert price() == -1.0
    s = scrape()
    assert s("fastbreaker_fallback_calls_total", name="price") == 2.0
    assert s("fastbreaker_fallback_fallbacks_total", name="price") == 2.0
    assert s("fastbreaker_fallback_active_seconds", name="price") == 90.0
    with pytest.raises(fb.CircuitOpenError):
        quote("a")  # nothing good to serve yet
    breaker.reset()
    assert quote("a") == 9.5
    breaker.trip()
    assert quote("a") == 9.5  # stale, within stale_ttl
    s = scrape()
    assert s("fastbreaker_fallback_calls_total", name="quote") == 3.0
    assert s("fastbreaker_fallback_stale_served_total", name="quote") == 1.0
    assert s("fastbreaker_fallback_fallbacks_total", name="quote") == 0.0
    with pytest.raises(TypeError, match="fn must be wrapped"):
        BreakerCollector().add_fallback(lambda: None, "x")


# -- the collector itself ------------------------------------------------------------------------
def test_objects_added_later_and_removed(fb, clock, registry, scrape):
    collector = BreakerCollector()
    registry.register(collector)
    assert scrape().names() == set()  # nothing to export: no families at all
    b = collector.add_breaker(fb.CircuitBreaker(clock=clock), name="late")
    m = collector.add_map(fb.BreakerMap(clock=clock), "m")
    assert states(scrape(), name="late")["closed"] == 1
    collector.remove(b)
    s = scrape()
    assert states(s, name="late") == {} and s("fastbreaker_map_keys", map="m") == 0
    collector.remove(m)
    assert scrape().names() == set()
    with pytest.raises(ValueError, match="not exported"):
        collector.remove(m)


def test_describe_lets_the_registry_refuse_a_second_collector(fb):
    registry = CollectorRegistry()
    first = BreakerCollector()
    registry.register(first)
    names = {f.name for f in first.describe()}
    assert {
        "fastbreaker_breaker_state",
        "fastbreaker_map_key_state",
        "fastbreaker_retry_budget_tokens",
        "fastbreaker_breaker_trips",
    } <= names
    assert all(n.startswith("fastbreaker_") for n in names)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        registry.register(BreakerCollector())


def test_invalid_arguments(fb, clock):
    collector = BreakerCollector()
    with pytest.raises(ValueError, match="no name"):
        collector.add_breaker(fb.CircuitBreaker(clock=clock))
    kept = collector.add_breaker(fb.CircuitBreaker(name="x", clock=clock))  # noqa: F841 - alive
    with pytest.raises(ValueError, match="already used"):
        collector.add_breaker(fb.CircuitBreaker(name="x", clock=clock))
    with pytest.raises(TypeError, match="BreakerMap"):
        collector.add_map(fb.CircuitBreaker(clock=clock), "m")
    with pytest.raises(TypeError, match="RetryBudget"):
        collector.add_budget(object(), "b")
    with pytest.raises(TypeError, match="CircuitBreaker"):
        collector.add_breaker(fb.RetryBudget(), "b")
    with pytest.raises(TypeError, match="name"):
        collector.add_map(fb.BreakerMap(), "")
    with pytest.raises(ValueError, match="max_key_series"):
        BreakerCollector(max_key_series=-1)


def test_the_collector_adds_nothing_to_the_call_path(fb, clock, registry, scrape):
    # It only reads snapshots: registering it registers no callback and changes no behaviour.
    b = fb.CircuitBreaker(failure_threshold=1, name="p", clock=clock)
    m = fb.BreakerMap(failure_threshold=1, clock=clock)
    fired: list[Any] = []
    b.on_state_change(lambda *a: fired.append(a))
    registry.register(BreakerCollector(breakers=[b], maps={"m": m}))
    scrape()
    b.allow()
    b.record_failure()
    assert len(fired) == 1  # only ours
    assert b.metrics().permitted == 1  # scrapes called no allow()
    assert m.metrics().permitted == 0 and len(m) == 0  # and created no key


# -- imports -------------------------------------------------------------------------------------
def _run(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )


def test_importing_fastbreaker_does_not_import_prometheus_client():
    out = _run("import sys, fastbreaker\nassert 'prometheus_client' not in sys.modules\n")
    assert out.returncode == 0, out.stderr


def test_a_clear_error_without_prometheus_client():
    out = _run(
        "import sys\n"
        "sys.modules['prometheus_client'] = None  # as if it were not installed\n"
        "try:\n"
        "    import fastbreaker.contrib.prometheus\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    assert out.returncode == 0, out.stderr
    assert "pip install 'fastbreaker[prometheus]'" in out.stdout


# -- weak references -------------------------------------------------------------------------------
def _exported(collector: BreakerCollector) -> set[str]:
    """The names and map labels that one collection exports."""
    return {
        s.labels.get("name") or s.labels["map"]
        for family in collector.collect()
        for s in family.samples
    }


def test_a_dropped_object_is_no_longer_exported(fb, clock):
    collector = BreakerCollector()
    kept = collector.add_breaker(fb.CircuitBreaker(name="kept", clock=clock))
    b = collector.add_breaker(fb.CircuitBreaker(name="b", clock=clock))
    m = collector.add_map(fb.BreakerMap(clock=clock), "m")
    budget = collector.add_budget(fb.RetryBudget(clock=clock), "budget")
    shedder = collector.add_shedder(fb.LoadShedder(1, name="shed", clock=clock))
    f = collector.add_fallback(fb.fallback(lambda exc: 0)(lambda: 1), "f")
    assert _exported(collector) == {"kept", "b", "m", "budget", "shed", "f"}
    refs = [weakref.ref(obj) for obj in (b, m, budget, shedder, f)]
    del b, m, budget, shedder, f
    gc.collect()
    assert [r() for r in refs] == [None] * 5  # the collector kept none of them alive
    assert _exported(collector) == {"kept"}  # without remove()
    again = collector.add_breaker(fb.CircuitBreaker(name="b", clock=clock))  # the name is free
    assert _exported(collector) == {"kept", "b"}
    assert kept.name == "kept" and again.name == "b"


@not_on_free_threading
def test_objects_added_and_dropped_leave_nothing_behind(fb, clock):
    collector = BreakerCollector()
    names = (f"b{i}" for i in itertools.count())

    def step() -> None:
        collector.add_breaker(fb.CircuitBreaker(name=next(names), clock=clock))
        collector.add_budget(fb.RetryBudget(clock=clock), next(names))
        assert _exported(collector) == set()

    assert_flat(step, small=200, large=1_000)
