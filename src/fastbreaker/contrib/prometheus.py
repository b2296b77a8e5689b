"""Prometheus metrics for breakers, breaker maps, retry budgets, load shedders and degraded
(fallback) functions, read at scrape time.

``BreakerCollector`` is a ``prometheus_client`` custom collector: it keeps references to the
objects it was given and reads their ``metrics()`` snapshots only when Prometheus scrapes, so it
costs nothing on the call path (no callback, no counter of its own, nothing wrapped)::

    from prometheus_client import REGISTRY
    from fastbreaker.contrib.prometheus import BreakerCollector

    collector = BreakerCollector(max_key_series=100)
    collector.add_breaker(payments)                     # name="payments" (the breaker's name)
    collector.add_map(transport.breakers, "http")       # map="http"
    collector.add_budget(transport.retry.budget, "http")
    collector.add_shedder(shedder)                      # name="api" (the shedder's name)
    collector.add_fallback(get_price, "price")          # @fastbreaker.fallback / stale_on_error
    REGISTRY.register(collector)

Series (``_total`` ones are counters, cumulative since each object was created):

=============================================  ===============================================
``fastbreaker_breaker_state{name,state}``      1 for the current state, 0 for the other three
``fastbreaker_breaker_<c>_total{name}``        ``c`` in permitted, rejected, successes,
                                               failures, slow_calls, ignored, stale, trips,
                                               would_reject, open_seconds, probe_successes,
                                               probe_failures, timeouts
``fastbreaker_breaker_call_seconds{name}``     histogram of the timed calls (breakers that
                                               time calls: ``record_latency`` or
                                               ``slow_call_duration``)
``fastbreaker_breaker_consecutive_failures``   gauge, ``{name}``
``fastbreaker_breaker_failure_rate{name}``     gauge, count or time window only
``fastbreaker_map_keys{map}``                  breakers held
``fastbreaker_map_open_keys{map,state}``       held breakers OPEN, HALF_OPEN, ISOLATED
``fastbreaker_map_evicted_total{map}``         breakers dropped to respect ``max_keys``
``fastbreaker_map_suppressed_trips_total``     trips refused by ``max_open_ratio``, ``{map}``
``fastbreaker_map_untracked_total{map}``       new keys the full map could not hold
``fastbreaker_map_<c>_total{map}``             totals over every key, same ``c`` as above
``fastbreaker_map_key_state{map,key,state}``   1 per non-CLOSED key (at most ``max_key_series``)
``fastbreaker_map_key_series_omitted{map}``    non-CLOSED keys beyond ``max_key_series``
``fastbreaker_retry_budget_tokens{name}``      tokens available now
``fastbreaker_retry_budget_capacity{name}``    the most tokens the bucket holds
``fastbreaker_shedder_admitted_total{name}``   requests a ``LoadShedder`` admitted
``fastbreaker_shedder_queued_total{name}``     requests that waited in its queue
``fastbreaker_shedder_shed_total``             requests refused, ``{name,reason}``: reason in
                                               queue_full, too_old, priority, deadline
``fastbreaker_shedder_in_flight{name}``        the limit's slots in use now
``fastbreaker_shedder_queue_len{name}``        requests waiting now
``fastbreaker_shedder_congested{name}``        1 while CoDel judges the queue congested
``fastbreaker_fallback_<c>_total{name}``       ``c`` in calls, fallbacks, stale_served: calls
                                               of a degraded function and its degraded answers
``fastbreaker_fallback_active_seconds{name}``  seconds since the current unbroken run of
                                               degraded answers began (0 after a normal one):
                                               alert on "living on the fallback for N minutes"
=============================================  ===============================================

Label cardinality stays bounded for maps of any size: a map exports a fixed number of aggregate
series, plus one ``fastbreaker_map_key_state`` series per key that is not CLOSED, and at most
``max_key_series`` of those (the first ones in ``str(key)`` order, so the choice is stable from
one scrape to the next; ``fastbreaker_map_key_series_omitted`` counts the rest). CLOSED keys, the
normal state of almost every key, never get a series of their own; a key's series disappears
when it closes. A ``BreakerMap`` whose ``max_open_ratio`` is below 1 bounds the number of OPEN
keys as well.

The collector holds weak references: an object that is dropped stops being exported (its name
may be used again), without ``remove(obj)``. Register one collector per registry and add
everything to it: two collectors would export the same metric names.

This module imports prometheus_client; ``import fastbreaker`` does not import this module.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Optional, TypeVar, Union

try:
    from prometheus_client.metrics_core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        Metric,
    )
except ImportError as exc:  # pragma: no cover - tested in a subprocess
    raise ImportError(
        "fastbreaker.contrib.prometheus needs prometheus_client, which is not installed: "
        "pip install 'fastbreaker[prometheus]'"
    ) from exc

from .._errors import State
from .._metrics import EXPORTED_COUNTERS, Latency, non_closed_keys

__all__ = ["BreakerCollector"]

T = TypeVar("T")
_Family = Union[GaugeMetricFamily, CounterMetricFamily]
Held = weakref.WeakValueDictionary[str, Any]

PREFIX = "fastbreaker"

_STATES = tuple(State)
_SHED_REASONS = ("queue_full", "too_old", "priority", "deadline")
_STATE_LABEL = {s: s.name.lower() for s in State}

_COUNTERS = EXPORTED_COUNTERS


def _latency_family() -> HistogramMetricFamily:
    return HistogramMetricFamily(
        f"{PREFIX}_breaker_call_seconds", "Duration of the calls the breaker timed", labels=["name"]
    )


def _collect_latency(family: HistogramMetricFamily, name: str, lat: Optional[Latency]) -> None:
    """Add a breaker's latency histogram (Prometheus buckets are cumulative; ours are not)."""
    if lat is None:
        return
    cumulative, buckets = 0, []
    for bound, count in zip((*map(repr, lat.bounds), "+Inf"), lat.counts):
        cumulative += count
        buckets.append((bound, float(cumulative)))
    family.add_metric([name], buckets, lat.sum)


class BreakerCollector:
    """A Prometheus collector for fastbreaker objects; see the module docstring for the series.

    ``breakers``: circuit breakers, as an iterable (each labelled with its ``name``, which must
    be set) or a mapping ``{name: breaker}``. ``maps``: ``{map_label: BreakerMap}``.
    ``budgets``: ``{name: RetryBudget}``. ``shedders``: load shedders, each labelled with its
    ``name``. ``fallbacks``: ``{name: fn}``, functions wrapped by ``fastbreaker.fallback`` or
    ``stale_on_error``. ``max_key_series``: the most per-key series each map
    exports (0 for aggregates only). More can be added later with ``add_breaker``, ``add_map``
    ``add_budget``, ``add_shedder`` and ``add_fallback``. Register it with
    ``registry.register(collector)``.
    """

    def __init__(
        self,
        *,
        breakers: Optional[Iterable[Any] | Mapping[str, Any]] = None,
        maps: Optional[Mapping[str, Any]] = None,
        budgets: Optional[Mapping[str, Any]] = None,
        shedders: Optional[Iterable[Any]] = None,
        fallbacks: Optional[Mapping[str, Any]] = None,
        max_key_series: int = 100,
    ) -> None:
        if isinstance(max_key_series, bool) or not isinstance(max_key_series, int):
            raise TypeError(f"max_key_series must be an int >= 0, got {max_key_series!r}")
        if max_key_series < 0:
            raise ValueError(f"max_key_series must be >= 0, got {max_key_series!r}")
        self._max_key_series = max_key_series
        self._lock = threading.Lock()
        # name -> object, weakly: an entry goes when its object does
        self._breakers: Held = weakref.WeakValueDictionary()
        self._maps: Held = weakref.WeakValueDictionary()
        self._budgets: Held = weakref.WeakValueDictionary()
        self._shedders: Held = weakref.WeakValueDictionary()
        self._fallbacks: Held = weakref.WeakValueDictionary()
        if isinstance(breakers, Mapping):
            for name, breaker in breakers.items():
                self.add_breaker(breaker, name)
        else:
            for breaker in breakers or ():
                self.add_breaker(breaker)
        for name, m in (maps or {}).items():
            self.add_map(m, name)
        for name, budget in (budgets or {}).items():
            self.add_budget(budget, name)
        for shedder in shedders or ():
            self.add_shedder(shedder)
        for name, fn in (fallbacks or {}).items():
            self.add_fallback(fn, name)

    # -- what is exported --------------------------------------------------------------------
    def add_breaker(self, breaker: T, name: Optional[str] = None) -> T:
        """Export ``breaker`` with label ``name`` (default: the breaker's own name); returns it."""
        if not (callable(getattr(breaker, "metrics", None)) and hasattr(breaker, "state")):
            raise TypeError(f"breaker must be a fastbreaker.CircuitBreaker, got {breaker!r}")
        if name is None:
            name = getattr(breaker, "name", None)
            if name is None:
                raise ValueError("this breaker has no name: pass name=... to add_breaker()")
        self._add(self._breakers, name, breaker)
        return breaker

    def add_map(self, breakers: T, name: str) -> T:
        """Export ``breakers``, a ``BreakerMap``, with label ``map=name``; returns it."""
        if not (
            callable(getattr(breakers, "metrics", None))
            and callable(getattr(breakers, "open_keys", None))
        ):
            raise TypeError(f"breakers must be a fastbreaker.BreakerMap, got {breakers!r}")
        self._add(self._maps, name, breakers)
        return breakers

    def add_budget(self, budget: T, name: str) -> T:
        """Export ``budget``, a ``RetryBudget``, with label ``name``; returns it."""
        if not (hasattr(budget, "tokens") and hasattr(budget, "capacity")):
            raise TypeError(f"budget must be a fastbreaker.RetryBudget, got {budget!r}")
        self._add(self._budgets, name, budget)
        return budget

    def add_shedder(self, shedder: T, name: Optional[str] = None) -> T:
        """Export ``shedder``, a ``LoadShedder``, with label ``name`` (default: its own name);
        returns it."""
        m = getattr(shedder, "metrics", None)
        if not (callable(m) and hasattr(shedder, "limit")):
            raise TypeError(f"shedder must be a fastbreaker.LoadShedder, got {shedder!r}")
        if name is None:
            name = getattr(shedder, "name", None)
            if name is None:
                raise ValueError("this shedder has no name: pass name=... to add_shedder()")
        self._add(self._shedders, name, shedder)
        return shedder

    def add_fallback(self, fn: T, name: str) -> T:
        """Export ``fn``, a function wrapped by ``fastbreaker.fallback`` or ``stale_on_error``,
        with label ``name``; returns it."""
        m = getattr(fn, "metrics", None)
        if not callable(m) or not hasattr(m(), "fallback_active_seconds"):
            raise TypeError(
                f"fn must be wrapped by fastbreaker.fallback or stale_on_error, got {fn!r}"
            )
        self._add(self._fallbacks, name, fn)
        return fn

    def remove(self, obj: object) -> None:
        """Stop exporting ``obj`` (an object added before), before it is dropped."""
        with self._lock:
            for held in (
                self._breakers,
                self._maps,
                self._budgets,
                self._shedders,
                self._fallbacks,
            ):
                for name, value in list(held.items()):
                    if value is obj:
                        del held[name]
                        return
        raise ValueError(f"{obj!r} is not exported by this collector")

    def _add(self, held: Held, name: str, obj: object) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"name must be a non-empty str, got {name!r}")
        with self._lock:
            used = held.get(name)
            if used is not None and used is not obj:
                raise ValueError(f"name {name!r} is already used by {used!r}")
            held[name] = obj

    # -- the prometheus_client collector protocol ----------------------------------------------
    def describe(self) -> list[Metric]:
        """Every metric family this collector can export (no samples): the registry uses the
        names to refuse a second collector that would export the same ones."""
        families: list[Metric] = list(self._families().values())
        return [*families, _latency_family()]

    def collect(self) -> Iterator[Metric]:
        """Read every object's metrics now and yield the families that have samples."""
        with self._lock:
            breakers = list(self._breakers.items())
            maps = list(self._maps.items())
            budgets = list(self._budgets.items())
            shedders = list(self._shedders.items())
            fallbacks = list(self._fallbacks.items())
        f = self._families()
        latency = _latency_family()
        for name, breaker in breakers:
            m = breaker.metrics()
            self._collect_breaker(f, name, m)
            _collect_latency(latency, name, m.latency)
        for name, m in maps:
            self._collect_map(f, name, m)
        for name, budget in budgets:
            f["budget_tokens"].add_metric([name], float(budget.tokens))
            f["budget_capacity"].add_metric([name], float(budget.capacity))
        for name, shedder in shedders:
            sm = shedder.metrics()
            f["shed_admitted"].add_metric([name], sm.admitted)
            f["shed_queued"].add_metric([name], sm.queued)
            for reason in _SHED_REASONS:
                f["shed_shed"].add_metric([name, reason], getattr(sm, f"shed_{reason}"))
            f["shed_in_flight"].add_metric([name], sm.in_flight)
            f["shed_queue_len"].add_metric([name], sm.queue_len)
            f["shed_congested"].add_metric([name], 1.0 if sm.congested else 0.0)
        for name, fn in fallbacks:
            fm = fn.metrics()
            for field in ("calls", "fallbacks", "stale_served"):
                f[f"fallback_{field}"].add_metric([name], getattr(fm, field))
            f["fallback_active"].add_metric([name], fm.fallback_active_seconds)
        for family in (*f.values(), latency):
            if family.samples:
                yield family

    @staticmethod
    def _families() -> dict[str, _Family]:
        p = PREFIX
        f: dict[str, _Family] = {
            "breaker_state": GaugeMetricFamily(
                f"{p}_breaker_state",
                "1 for the breaker's current state, 0 for the others",
                labels=["name", "state"],
            ),
        }
        for field, part, doc in _COUNTERS:
            f[f"breaker_{field}"] = CounterMetricFamily(f"{p}_breaker_{part}", doc, labels=["name"])
        f["breaker_consecutive"] = GaugeMetricFamily(
            f"{p}_breaker_consecutive_failures",
            "Consecutive failures while CLOSED",
            labels=["name"],
        )
        f["breaker_failure_rate"] = GaugeMetricFamily(
            f"{p}_breaker_failure_rate",
            "Failed share of the window (window mode only)",
            labels=["name"],
        )
        f["map_keys"] = GaugeMetricFamily(
            f"{p}_map_keys", "Breakers held by the map", labels=["map"]
        )
        f["map_open_keys"] = GaugeMetricFamily(
            f"{p}_map_open_keys",
            "Held breakers that are OPEN, HALF_OPEN or ISOLATED",
            labels=["map", "state"],
        )
        f["map_evicted"] = CounterMetricFamily(
            f"{p}_map_evicted", "Breakers dropped to respect max_keys", labels=["map"]
        )
        f["map_suppressed"] = CounterMetricFamily(
            f"{p}_map_suppressed_trips", "Trips refused by max_open_ratio", labels=["map"]
        )
        f["map_untracked"] = CounterMetricFamily(
            f"{p}_map_untracked",
            "New keys given a breaker the full map could not hold",
            labels=["map"],
        )
        for field, part, doc in _COUNTERS:
            f[f"map_{field}"] = CounterMetricFamily(
                f"{p}_map_{part}", f"{doc}, over every key of the map", labels=["map"]
            )
        f["map_key_state"] = GaugeMetricFamily(
            f"{p}_map_key_state",
            "1 for each key that is not CLOSED, labelled with its state (bounded)",
            labels=["map", "key", "state"],
        )
        f["map_key_omitted"] = GaugeMetricFamily(
            f"{p}_map_key_series_omitted",
            "Keys not CLOSED that got no key_state series (beyond max_key_series)",
            labels=["map"],
        )
        f["budget_tokens"] = GaugeMetricFamily(
            f"{p}_retry_budget_tokens", "Retry tokens available now", labels=["name"]
        )
        f["budget_capacity"] = GaugeMetricFamily(
            f"{p}_retry_budget_capacity", "The most tokens the budget holds", labels=["name"]
        )
        f["shed_admitted"] = CounterMetricFamily(
            f"{p}_shedder_admitted", "Requests the load shedder admitted", labels=["name"]
        )
        f["shed_queued"] = CounterMetricFamily(
            f"{p}_shedder_queued", "Requests that waited in the shedder's queue", labels=["name"]
        )
        f["shed_shed"] = CounterMetricFamily(
            f"{p}_shedder_shed", "Requests the load shedder refused", labels=["name", "reason"]
        )
        f["shed_in_flight"] = GaugeMetricFamily(
            f"{p}_shedder_in_flight", "Slots of the shedder's limit in use", labels=["name"]
        )
        f["shed_queue_len"] = GaugeMetricFamily(
            f"{p}_shedder_queue_len", "Requests waiting in the shedder's queue", labels=["name"]
        )
        f["shed_congested"] = GaugeMetricFamily(
            f"{p}_shedder_congested", "1 while CoDel judges the queue congested", labels=["name"]
        )
        for field, doc in (
            ("calls", "Calls of a degraded (fallback or stale_on_error) function"),
            ("fallbacks", "Answers given by the fallback handler"),
            ("stale_served", "Stale results served in place of an error"),
        ):
            f[f"fallback_{field}"] = CounterMetricFamily(
                f"{p}_fallback_{field}", doc, labels=["name"]
            )
        f["fallback_active"] = GaugeMetricFamily(
            f"{p}_fallback_active_seconds",
            "Seconds since the current unbroken run of degraded answers began",
            labels=["name"],
        )
        return f

    @staticmethod
    def _collect_breaker(f: dict[str, _Family], name: str, m: Any) -> None:
        for state in _STATES:
            value = 1.0 if m.state == state else 0.0
            f["breaker_state"].add_metric([name, _STATE_LABEL[state]], value)
        for field, _, _ in _COUNTERS:
            f[f"breaker_{field}"].add_metric([name], getattr(m, field))
        f["breaker_consecutive"].add_metric([name], m.consecutive_failures)
        if m.failure_rate is not None:
            f["breaker_failure_rate"].add_metric([name], m.failure_rate)

    def _collect_map(self, f: dict[str, _Family], name: str, breakers: Any) -> None:
        m = breakers.metrics()
        f["map_keys"].add_metric([name], m.keys)
        counts = (("open", m.open), ("half_open", m.half_open), ("isolated", m.isolated))
        for label, count in counts:
            f["map_open_keys"].add_metric([name, label], count)
        f["map_evicted"].add_metric([name], m.evicted)
        f["map_suppressed"].add_metric([name], m.suppressed_trips)
        f["map_untracked"].add_metric([name], getattr(m, "untracked", 0))
        for field, _, _ in _COUNTERS:
            f[f"map_{field}"].add_metric([name], getattr(m, field))
        # One series per key that is not CLOSED, at most max_key_series of them.
        not_closed = non_closed_keys(breakers)
        shown = not_closed[: self._max_key_series]
        for label, state in shown:
            f["map_key_state"].add_metric([name, label, _STATE_LABEL[state]], 1.0)
        f["map_key_omitted"].add_metric([name], len(not_closed) - len(shown))

    def __repr__(self) -> str:
        return (
            f"<BreakerCollector breakers={len(self._breakers)} maps={len(self._maps)} "
            f"budgets={len(self._budgets)} max_key_series={self._max_key_series}>"
        )
