"""OpenTelemetry metrics for breakers, breaker maps, retry budgets, bulkheads, load shedders and
degraded (fallback) functions, read at collection time.

``instrument()`` registers observable instruments on an OpenTelemetry ``Meter``. Their callbacks
read the objects' ``metrics()`` snapshots only when the SDK collects (a periodic exporter, a
scrape of OpenTelemetry's Prometheus exporter, ``InMemoryMetricReader.get_metrics_data()``), as
``fastbreaker.contrib.prometheus`` reads them at scrape time, so they cost nothing on the call
path: nothing is registered on the breakers, nothing counted or wrapped::

    from opentelemetry import metrics
    from fastbreaker.contrib.otel import instrument

    otel = instrument(
        metrics.get_meter("fastbreaker"),
        breakers=[payments],                        # name="payments" (the breaker's name)
        maps={"http": transport.breakers},          # map="http"
        budgets={"http": transport.retry.budget},   # name="http"
        bulkheads=[db_slots],                       # name="db" (the bulkhead's name)
        shedders=[shedder],                         # name="api" (the shedder's name)
        fallbacks={"price": get_price},             # @fastbreaker.fallback / stale_on_error
    )

The instruments are the Prometheus collector's metrics, with its attributes (its labels), named
after its series with dots between the prefix, the object and the field:
``fastbreaker_breaker_slow_calls_total`` is ``fastbreaker.breaker.slow_calls`` (an OpenTelemetry
Prometheus exporter gives the Prometheus names back). Counters are observable counters of the
cumulative totals since each object was created; the others are observable gauges:

=============================================  ===============================================
``fastbreaker.breaker.state{name,state}``      gauge: 1 for the current state, 0 for the other
                                               three (``closed``, ``open``, ``half_open``,
                                               ``isolated``)
``fastbreaker.breaker.<c>{name}``              counter, ``c`` in permitted, rejected,
                                               successes, failures, slow_calls, ignored,
                                               stale, trips, would_reject, open_seconds
                                               (unit ``s``), probe_successes, probe_failures,
                                               timeouts
``fastbreaker.breaker.call_seconds.sum``       counter (unit ``s``), ``{name}``: the total
                                               duration of the timed calls
``fastbreaker.breaker.call_seconds.count``     counter, ``{name}``: the number of timed calls
``fastbreaker.breaker.consecutive_failures``   gauge, ``{name}``
``fastbreaker.breaker.failure_rate{name}``     gauge, count or time window only
``fastbreaker.map.keys{map}``                  gauge: breakers held
``fastbreaker.map.open_keys{map,state}``       gauge: held breakers OPEN, HALF_OPEN, ISOLATED
``fastbreaker.map.evicted{map}``               counter: breakers dropped to respect
                                               ``max_keys``
``fastbreaker.map.suppressed_trips{map}``      counter: trips refused by ``max_open_ratio``
``fastbreaker.map.untracked{map}``             counter: new keys the full map could not hold
``fastbreaker.map.<c>{map}``                   counter: totals over every key, same ``c`` as
                                               above
``fastbreaker.map.key_state{map,key,state}``   gauge: 1 per non-CLOSED key (at most
                                               ``max_key_series``)
``fastbreaker.map.key_series_omitted{map}``    gauge: non-CLOSED keys beyond ``max_key_series``
``fastbreaker.retry_budget.tokens{name}``      gauge: tokens available now
``fastbreaker.retry_budget.capacity{name}``    gauge: the most tokens the bucket holds
``fastbreaker.bulkhead.<c>{name}``             counter, ``c`` in admitted, rejected, timed_out,
                                               cancelled, waited
``fastbreaker.bulkhead.<g>{name}``             gauge, ``g`` in in_flight, waiting,
                                               peak_in_flight, limit (``max_concurrent``, or
                                               an ``AdaptiveLimiter``'s current ``limit``)
``fastbreaker.shedder.admitted{name}``         counter: requests a ``LoadShedder`` admitted
``fastbreaker.shedder.queued{name}``           counter: requests that waited in its queue
``fastbreaker.shedder.shed{name,reason}``      counter: requests refused, ``reason`` in
                                               queue_full, too_old, priority, deadline
``fastbreaker.shedder.in_flight{name}``        gauge: the limit's slots in use now
``fastbreaker.shedder.queue_len{name}``        gauge: requests waiting now
``fastbreaker.shedder.congested{name}``        gauge: 1 while CoDel judges the queue
                                               congested, else 0
``fastbreaker.fallback.<c>{name}``             counter, ``c`` in calls, fallbacks,
                                               stale_served: calls of the wrapped function and
                                               its degraded answers
``fastbreaker.fallback.active_seconds{name}``  gauge (unit ``s``): seconds since the current
                                               unbroken run of degraded answers began (0 once a
                                               normal answer follows)
=============================================  ===============================================

The latency histogram: an observable instrument cannot be a histogram (OpenTelemetry has no
asynchronous histogram), so a timed breaker's (``record_latency`` or ``slow_call_duration``)
``metrics().latency`` is exported as two observable counters, its sum and its count
(``fastbreaker_breaker_call_seconds_sum`` and ``_count`` in Prometheus): their rates give the
mean duration. The buckets are not exported (the Prometheus collector exports them). Bulkheads
have no Prometheus series: theirs follow the same scheme, from ``Bulkhead.metrics()``.

Label cardinality stays bounded for maps of any size, as in the Prometheus collector: a map
exports a fixed number of aggregate series, plus one ``fastbreaker.map.key_state`` series per
key that is not CLOSED, and at most ``max_key_series`` of those (the first ones in ``str(key)``
order, so the choice is stable from one collection to the next;
``fastbreaker.map.key_series_omitted`` counts the rest). CLOSED keys never get a series of their
own; a key's series disappears when it closes.

One collection reads each object once: the first callback of a collection takes a snapshot of
every object given to the ``instrument()`` call (as one Prometheus scrape does), and the other
instruments' callbacks of that collection read the same snapshot, so the values exported
together agree with each other. A callback called again takes a new snapshot.

The callbacks hold weak references to the objects: one that is dropped is no longer exported
(OpenTelemetry cannot unregister an instrument, but its series stop). Give each kind
of object to one ``instrument()`` call per meter: the SDK answers a second registration of a
name with the instrument already registered, without the new callback, so such a call raises
``ValueError`` instead of silently exporting nothing (pass everything to one call, or use a meter
of another name).

This module imports nothing from OpenTelemetry when it is imported: ``instrument()`` imports
``opentelemetry.metrics`` (``pip install 'fastbreaker[otel]'``, the ``opentelemetry-api``
package; an SDK provides the meter). ``import fastbreaker`` does not import this module.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Optional, Union, final

from .._errors import State
from .._metrics import EXPORTED_COUNTERS, non_closed_keys

if TYPE_CHECKING:
    from opentelemetry.metrics import (
        CallbackOptions,
        Meter,
        ObservableCounter,
        ObservableGauge,
        Observation,
    )

    from .. import (
        AdaptiveLimiter,
        BreakerMap,
        Bulkhead,
        BulkheadMetrics,
        CircuitBreaker,
        FallbackMetrics,
        LoadShedder,
        MapMetrics,
        Metrics,
        RetryBudget,
        ShedderMetrics,
    )

__all__ = ["Instrumentation", "instrument"]

PREFIX = "fastbreaker"

_STATES = tuple(State)
_STATE_LABEL = {s: s.name.lower() for s in State}

_COUNTERS = EXPORTED_COUNTERS  # the Prometheus collector's, field for field

# (BulkheadMetrics field, description) of a bulkhead's counters and gauges.
_BULKHEAD_COUNTERS = (
    ("admitted", "Calls given a slot"),
    ("rejected", "Acquisitions refused (full, timed out, or past their deadline)"),
    ("timed_out", "Waits for a slot that timed out"),
    ("cancelled", "Waits for a slot that were cancelled"),
    ("waited", "Admissions that had to wait for a slot"),
)
_BULKHEAD_GAUGES = (
    ("in_flight", "Slots held now"),
    ("waiting", "Callers waiting for a slot now"),
    ("peak_in_flight", "The most slots held at once"),
)

# (ShedderMetrics field, reason attribute) of a shedder's refusals: LoadShedError's reasons.
_SHED_REASONS = (
    ("shed_queue_full", "queue_full"),
    ("shed_too_old", "too_old"),
    ("shed_priority", "priority"),
    ("shed_deadline", "deadline"),
)

# (FallbackMetrics field, description) of a degraded function's counters.
_FALLBACK_COUNTERS = (
    ("calls", "Calls of a degraded (fallback or stale_on_error) function"),
    ("fallbacks", "Answers given by the fallback handler"),
    ("stale_served", "Stale results served on error by stale_on_error"),
)

_ROUND_SECONDS = 1.0
"""A snapshot older than this is not reused, even by a callback it has not served yet."""

_Attributes = dict[str, str]
_Point = tuple[float, _Attributes]
"""An observation to make: its value and its attributes."""


class _MapView(NamedTuple):
    label: str
    metrics: MapMetrics
    shown: list[tuple[str, State]]  # the non-CLOSED keys that get a series
    omitted: int


class _BulkheadView(NamedTuple):
    name: str
    metrics: BulkheadMetrics
    limit: float


class _Snapshot:
    """What one collection reads: every object's metrics, taken at once."""

    __slots__ = (
        "taken",
        "served",
        "breakers",
        "maps",
        "budgets",
        "bulkheads",
        "shedders",
        "fallbacks",
    )

    def __init__(
        self,
        breakers: list[tuple[str, Metrics]],
        maps: list[_MapView],
        budgets: list[tuple[str, float, float]],
        bulkheads: list[_BulkheadView],
        shedders: list[tuple[str, ShedderMetrics]],
        fallbacks: list[tuple[str, FallbackMetrics]],
    ) -> None:
        self.taken = time.monotonic()
        self.served: set[int] = set()  # the instruments whose callbacks read this snapshot
        self.breakers = breakers
        self.maps = maps
        self.budgets = budgets
        self.bulkheads = bulkheads
        self.shedders = shedders
        self.fallbacks = fallbacks


_Labelled = list[tuple[str, "weakref.ref[Any]"]]


def _weakly(objects: list[tuple[str, Any]]) -> _Labelled:
    return [(label, weakref.ref(obj)) for label, obj in objects]


def _live(held: _Labelled) -> list[tuple[str, Any]]:
    """The objects of ``held`` still alive; the entries of the dropped ones are deleted."""
    pairs = [(label, ref()) for label, ref in held]
    if any(obj is None for _, obj in pairs):
        held[:] = [(label, ref) for label, ref in held if ref() is not None]
    return [(label, obj) for label, obj in pairs if obj is not None]


class _Reader:
    """The objects of one ``instrument()`` call (weakly), and the snapshot their callbacks
    share."""

    def __init__(
        self,
        breakers: list[tuple[str, CircuitBreaker]],
        maps: list[tuple[str, BreakerMap]],
        budgets: list[tuple[str, RetryBudget]],
        bulkheads: list[tuple[str, Union[Bulkhead, AdaptiveLimiter]]],
        shedders: list[tuple[str, LoadShedder]],
        fallbacks: list[tuple[str, Any]],
        max_key_series: int,
    ) -> None:
        self._breakers = _weakly(breakers)
        self._maps = _weakly(maps)
        self._budgets = _weakly(budgets)
        self._bulkheads = _weakly(bulkheads)
        self._shedders = _weakly(shedders)
        self._fallbacks = _weakly(fallbacks)
        self._max_key_series = max_key_series
        self._lock = threading.Lock()
        self._snapshot: Optional[_Snapshot] = None
        self.active = False  # set once every instrument is registered

    def snapshot(self, instrument: int) -> Optional[_Snapshot]:
        """The snapshot for the callback of instrument number ``instrument`` (None: inactive).

        A new one is taken when this callback has already read the current one (a new
        collection has begun) or the current one is older than ``_ROUND_SECONDS``.
        """
        if not self.active:
            return None
        with self._lock:
            s = self._snapshot
            if s is None or instrument in s.served or time.monotonic() - s.taken > _ROUND_SECONDS:
                s = self._snapshot = self._take()
            s.served.add(instrument)
            return s

    def _take(self) -> _Snapshot:
        # under self._lock: _live prunes the lists
        return _Snapshot(
            [(name, b.metrics()) for name, b in _live(self._breakers)],
            [self._map_view(label, m) for label, m in _live(self._maps)],
            [(name, float(b.tokens), float(b.capacity)) for name, b in _live(self._budgets)],
            [_BulkheadView(name, b.metrics(), _limit(b)) for name, b in _live(self._bulkheads)],
            [(name, s.metrics()) for name, s in _live(self._shedders)],
            [(label, fn.metrics()) for label, fn in _live(self._fallbacks)],
        )

    def _map_view(self, label: str, breakers: BreakerMap) -> _MapView:
        m = breakers.metrics()
        # One series per key that is not CLOSED, at most max_key_series of them.
        not_closed = non_closed_keys(breakers)
        shown = not_closed[: self._max_key_series]
        return _MapView(label, m, shown, len(not_closed) - len(shown))


def _limit(bulkhead: Union[Bulkhead, AdaptiveLimiter]) -> float:
    limit = getattr(bulkhead, "limit", None)  # an AdaptiveLimiter's current limit
    return float(bulkhead.max_concurrent if limit is None else limit)


# -- what each instrument observes in a snapshot ---------------------------------------------------
class _Spec(NamedTuple):
    gauge: bool  # an observable gauge, else an observable counter
    name: str
    description: str
    unit: str
    points: Callable[[_Snapshot], Iterable[_Point]]


def _breaker_states(s: _Snapshot) -> Iterator[_Point]:
    for name, m in s.breakers:
        for state in _STATES:
            yield (1.0 if m.state == state else 0.0), {"name": name, "state": _STATE_LABEL[state]}


def _breaker_field(field: str) -> Callable[[_Snapshot], Iterator[_Point]]:
    def points(s: _Snapshot) -> Iterator[_Point]:
        for name, m in s.breakers:
            yield getattr(m, field), {"name": name}

    return points


def _breaker_failure_rate(s: _Snapshot) -> Iterator[_Point]:
    for name, m in s.breakers:
        if m.failure_rate is not None:
            yield m.failure_rate, {"name": name}


def _latency_sum(s: _Snapshot) -> Iterator[_Point]:
    for name, m in s.breakers:
        if m.latency is not None:
            yield m.latency.sum, {"name": name}


def _latency_count(s: _Snapshot) -> Iterator[_Point]:
    for name, m in s.breakers:
        if m.latency is not None:
            yield m.latency.count, {"name": name}


def _map_field(field: str) -> Callable[[_Snapshot], Iterator[_Point]]:
    def points(s: _Snapshot) -> Iterator[_Point]:
        for view in s.maps:
            yield getattr(view.metrics, field), {"map": view.label}

    return points


def _map_open_keys(s: _Snapshot) -> Iterator[_Point]:
    for view in s.maps:
        m = view.metrics
        for label, count in (
            ("open", m.open),
            ("half_open", m.half_open),
            ("isolated", m.isolated),
        ):
            yield count, {"map": view.label, "state": label}


def _map_key_states(s: _Snapshot) -> Iterator[_Point]:
    for view in s.maps:
        for key, state in view.shown:
            yield 1.0, {"map": view.label, "key": key, "state": _STATE_LABEL[state]}


def _map_omitted(s: _Snapshot) -> Iterator[_Point]:
    for view in s.maps:
        yield view.omitted, {"map": view.label}


def _budget_tokens(s: _Snapshot) -> Iterator[_Point]:
    for name, tokens, _ in s.budgets:
        yield tokens, {"name": name}


def _budget_capacity(s: _Snapshot) -> Iterator[_Point]:
    for name, _, capacity in s.budgets:
        yield capacity, {"name": name}


def _bulkhead_field(field: str) -> Callable[[_Snapshot], Iterator[_Point]]:
    def points(s: _Snapshot) -> Iterator[_Point]:
        for view in s.bulkheads:
            yield getattr(view.metrics, field), {"name": view.name}

    return points


def _bulkhead_limit(s: _Snapshot) -> Iterator[_Point]:
    for view in s.bulkheads:
        yield view.limit, {"name": view.name}


def _shedder_field(field: str) -> Callable[[_Snapshot], Iterator[_Point]]:
    def points(s: _Snapshot) -> Iterator[_Point]:
        for name, m in s.shedders:
            yield float(getattr(m, field)), {"name": name}

    return points


def _shedder_shed(s: _Snapshot) -> Iterator[_Point]:
    for name, m in s.shedders:
        for field, reason in _SHED_REASONS:
            yield getattr(m, field), {"name": name, "reason": reason}


def _fallback_field(field: str) -> Callable[[_Snapshot], Iterator[_Point]]:
    def points(s: _Snapshot) -> Iterator[_Point]:
        for label, m in s.fallbacks:
            yield getattr(m, field), {"name": label}

    return points


def _breaker_specs() -> list[_Spec]:
    p = f"{PREFIX}.breaker"
    specs = [
        _Spec(
            True,
            f"{p}.state",
            "1 for the breaker's current state, 0 for the others",
            "",
            _breaker_states,
        )
    ]
    for field, part, doc in _COUNTERS:
        unit = "s" if field == "open_seconds_total" else ""
        specs.append(_Spec(False, f"{p}.{part}", doc, unit, _breaker_field(field)))
    specs += [
        _Spec(
            False,
            f"{p}.call_seconds.sum",
            "Total duration of the calls the breaker timed",
            "s",
            _latency_sum,
        ),
        _Spec(False, f"{p}.call_seconds.count", "Calls the breaker timed", "", _latency_count),
        _Spec(
            True,
            f"{p}.consecutive_failures",
            "Consecutive failures while CLOSED",
            "",
            _breaker_field("consecutive_failures"),
        ),
        _Spec(
            True,
            f"{p}.failure_rate",
            "Failed share of the window (window mode only)",
            "",
            _breaker_failure_rate,
        ),
    ]
    return specs


def _map_specs() -> list[_Spec]:
    p = f"{PREFIX}.map"
    specs = [
        _Spec(True, f"{p}.keys", "Breakers held by the map", "", _map_field("keys")),
        _Spec(
            True,
            f"{p}.open_keys",
            "Held breakers that are OPEN, HALF_OPEN or ISOLATED",
            "",
            _map_open_keys,
        ),
        _Spec(
            False,
            f"{p}.evicted",
            "Breakers dropped to respect max_keys",
            "",
            _map_field("evicted"),
        ),
        _Spec(
            False,
            f"{p}.suppressed_trips",
            "Trips refused by max_open_ratio",
            "",
            _map_field("suppressed_trips"),
        ),
        _Spec(
            False,
            f"{p}.untracked",
            "New keys given a breaker the full map could not hold",
            "",
            _map_field("untracked"),
        ),
    ]
    for field, part, doc in _COUNTERS:
        unit = "s" if field == "open_seconds_total" else ""
        specs.append(
            _Spec(
                False, f"{p}.{part}", f"{doc}, over every key of the map", unit, _map_field(field)
            )
        )
    specs += [
        _Spec(
            True,
            f"{p}.key_state",
            "1 for each key that is not CLOSED, labelled with its state (bounded)",
            "",
            _map_key_states,
        ),
        _Spec(
            True,
            f"{p}.key_series_omitted",
            "Keys not CLOSED that got no key_state series (beyond max_key_series)",
            "",
            _map_omitted,
        ),
    ]
    return specs


def _budget_specs() -> list[_Spec]:
    p = f"{PREFIX}.retry_budget"
    return [
        _Spec(True, f"{p}.tokens", "Retry tokens available now", "", _budget_tokens),
        _Spec(True, f"{p}.capacity", "The most tokens the budget holds", "", _budget_capacity),
    ]


def _bulkhead_specs() -> list[_Spec]:
    p = f"{PREFIX}.bulkhead"
    specs = [_Spec(False, f"{p}.{f}", doc, "", _bulkhead_field(f)) for f, doc in _BULKHEAD_COUNTERS]
    specs += [_Spec(True, f"{p}.{f}", doc, "", _bulkhead_field(f)) for f, doc in _BULKHEAD_GAUGES]
    specs.append(
        _Spec(
            True,
            f"{p}.limit",
            "Calls that may hold a slot at once (an adaptive limiter's current limit)",
            "",
            _bulkhead_limit,
        )
    )
    return specs


def _shedder_specs() -> list[_Spec]:
    p = f"{PREFIX}.shedder"
    return [
        _Spec(
            False,
            f"{p}.admitted",
            "Requests the load shedder admitted",
            "",
            _shedder_field("admitted"),
        ),
        _Spec(
            False,
            f"{p}.queued",
            "Requests that waited in the shedder's queue",
            "",
            _shedder_field("queued"),
        ),
        _Spec(False, f"{p}.shed", "Requests the load shedder refused", "", _shedder_shed),
        _Spec(
            True,
            f"{p}.in_flight",
            "Slots of the shedder's limit in use",
            "",
            _shedder_field("in_flight"),
        ),
        _Spec(
            True,
            f"{p}.queue_len",
            "Requests waiting in the shedder's queue",
            "",
            _shedder_field("queue_len"),
        ),
        _Spec(
            True,
            f"{p}.congested",
            "1 while CoDel judges the queue congested",
            "",
            _shedder_field("congested"),
        ),
    ]


def _fallback_specs() -> list[_Spec]:
    p = f"{PREFIX}.fallback"
    specs = [_Spec(False, f"{p}.{f}", doc, "", _fallback_field(f)) for f, doc in _FALLBACK_COUNTERS]
    specs.append(
        _Spec(
            True,
            f"{p}.active_seconds",
            "Seconds since the current unbroken run of degraded answers began",
            "s",
            _fallback_field("fallback_active_seconds"),
        )
    )
    return specs


# -- validation ------------------------------------------------------------------------------------
def _is_breaker(obj: object) -> bool:
    return callable(getattr(obj, "metrics", None)) and hasattr(obj, "state")


def _is_map(obj: object) -> bool:
    return callable(getattr(obj, "metrics", None)) and callable(getattr(obj, "open_keys", None))


def _is_budget(obj: object) -> bool:
    return hasattr(obj, "tokens") and hasattr(obj, "capacity")


def _is_bulkhead(obj: object) -> bool:
    return callable(getattr(obj, "metrics", None)) and hasattr(obj, "max_concurrent")


def _is_shedder(obj: object) -> bool:
    # a LoadShedder has its limit, not a max_concurrent of its own (as bulkheads have)
    return (
        callable(getattr(obj, "metrics", None))
        and hasattr(obj, "limit")
        and not hasattr(obj, "max_concurrent")
    )


def _is_fallback(obj: object) -> bool:
    # read once, to refuse anything that does not report FallbackMetrics' fields
    m = getattr(obj, "metrics", None)
    return callable(obj) and callable(m) and hasattr(m(), "fallback_active_seconds")


def _named(param: str, objs: object, check: Callable[[object], bool], kind: str) -> list[Any]:
    """``[(name, obj)]`` from a sequence of objects labelled by their ``.name``."""
    if not isinstance(objs, Sequence) or isinstance(objs, (str, bytes)):
        raise TypeError(
            f"{param} must be a sequence (list or tuple) of {kind}s, got {objs!r}"
            + (" (wrap a single one in a list)" if check(objs) else "")
        )
    out: list[tuple[str, Any]] = []
    owners: dict[str, tuple[int, object]] = {}
    for i, obj in enumerate(objs):
        if not check(obj):
            raise TypeError(f"{param}[{i}] must be a {kind}, got {obj!r}")
        name = getattr(obj, "name", None)
        if name is None:
            raise ValueError(
                f"{param}[{i}] has no name, which labels its series: create it with name=..."
            )
        if not isinstance(name, str) or not name:
            raise TypeError(f"{param}[{i}].name must be a non-empty str, got {name!r}")
        if name in owners:
            first, owner = owners[name]
            if owner is obj:
                continue  # the same object twice: exported once
            raise ValueError(f"{param}[{i}] and {param}[{first}] are both named {name!r}")
        owners[name] = (i, obj)
        out.append((name, obj))
    return out


def _labelled(param: str, objs: object, check: Callable[[object], bool], kind: str) -> list[Any]:
    """``[(label, obj)]`` from a mapping ``{label: obj}``."""
    if not isinstance(objs, Mapping):
        raise TypeError(f"{param} must be a mapping {{label: {kind}}}, got {objs!r}")
    out: list[tuple[str, Any]] = []
    for label, obj in objs.items():
        if not isinstance(label, str) or not label:
            raise TypeError(f"{param} labels must be non-empty strs, got {label!r}")
        if not check(obj):
            raise TypeError(f"{param}[{label!r}] must be a {kind}, got {obj!r}")
        out.append((label, obj))
    return out


# Every instrument instrument() has received: the SDK answers a second registration of a name on
# the same meter with the instrument it already holds (and drops the new callback).
_received: weakref.WeakSet[object] = weakref.WeakSet()
_received_lock = threading.Lock()


def _first_time(obj: object) -> bool:
    """Whether ``obj`` is an instrument no earlier registration received."""
    with _received_lock:
        try:
            if obj in _received:
                return False
            _received.add(obj)
        except TypeError:  # not weakly referenceable or not hashable: cannot tell
            pass
    return True


# -- the API ---------------------------------------------------------------------------------------
@final
class Instrumentation:
    """What ``instrument()`` registered: ``instruments``, the observable counters and gauges, in
    registration order (each has the SDK's ``name``). Keep it to keep a reference to them."""

    __slots__ = ("instruments",)

    def __init__(self, instruments: tuple[Union[ObservableCounter, ObservableGauge], ...]) -> None:
        self.instruments = instruments

    def __repr__(self) -> str:
        return f"<Instrumentation instruments={len(self.instruments)}>"


def instrument(
    meter: Meter,
    *,
    breakers: Sequence[CircuitBreaker] = (),
    maps: Mapping[str, BreakerMap] = {},  # noqa: B006 - read, never mutated
    budgets: Mapping[str, RetryBudget] = {},  # noqa: B006 - read, never mutated
    bulkheads: Sequence[Union[Bulkhead, AdaptiveLimiter]] = (),
    shedders: Sequence[LoadShedder] = (),
    fallbacks: Mapping[str, Callable[..., Any]] = {},  # noqa: B006 - read, never mutated
    max_key_series: int = 100,
) -> Instrumentation:
    """Register observable instruments on ``meter`` that export these objects when the SDK
    collects; see the module docstring for the instruments.

    Only the instruments of the kinds of objects given are registered (no breakers: no
    ``fastbreaker.breaker.*`` instruments). Their callbacks read the objects' ``metrics()`` at
    collection only, one snapshot per collection; nothing is registered on the objects.

    Args:
        meter: an OpenTelemetry ``Meter`` (``opentelemetry.metrics.get_meter(...)`` or
            ``MeterProvider.get_meter(...)``).
        breakers: circuit breakers, a sequence; each is labelled ``name=`` with its own name,
            which must be set and unique among them.
        maps: ``{map_label: BreakerMap}``; each map is labelled ``map=map_label``.
        budgets: ``{name: RetryBudget}``; each budget is labelled ``name=``.
        bulkheads: ``Bulkhead`` and ``AdaptiveLimiter`` objects, a sequence; each is labelled
            ``name=`` with its own name, which must be set and unique among them.
        shedders: ``LoadShedder`` objects, a sequence; each is labelled ``name=`` with its own
            name, which must be set and unique among them.
        fallbacks: ``{name: fn}``, functions wrapped by ``fastbreaker.fallback`` or
            ``fastbreaker.stale_on_error`` (anything whose ``metrics()`` returns
            ``FallbackMetrics``); each is labelled ``name=``. ``instrument()`` calls each one's
            ``metrics()`` once, to check it.
        max_key_series: the most per-key ``fastbreaker.map.key_state`` series each map exports,
            an int >= 0 (0 for aggregates only).

    Returns:
        an ``Instrumentation`` holding the registered instruments.

    Raises:
        ImportError: ``opentelemetry-api`` is not installed.
        TypeError, ValueError: an argument is invalid (the message names it).
        ValueError: ``meter`` already has one of the instruments from an earlier
            ``instrument()`` call (the instruments this call registered stay silent).
    """
    try:
        from opentelemetry.metrics import Observation
    except ImportError as exc:
        raise ImportError(
            "fastbreaker.contrib.otel needs opentelemetry-api, which is not installed: "
            "pip install 'fastbreaker[otel]'"
        ) from exc

    if not (
        callable(getattr(meter, "create_observable_counter", None))
        and callable(getattr(meter, "create_observable_gauge", None))
    ):
        raise TypeError(f"meter must be an opentelemetry.metrics.Meter, got {meter!r}")
    if isinstance(max_key_series, bool) or not isinstance(max_key_series, int):
        raise TypeError(f"max_key_series must be an int >= 0, got {max_key_series!r}")
    if max_key_series < 0:
        raise ValueError(f"max_key_series must be >= 0, got {max_key_series!r}")
    named_breakers = _named("breakers", breakers, _is_breaker, "fastbreaker.CircuitBreaker")
    labelled_maps = _labelled("maps", maps, _is_map, "fastbreaker.BreakerMap")
    labelled_budgets = _labelled("budgets", budgets, _is_budget, "fastbreaker.RetryBudget")
    named_bulkheads = _named(
        "bulkheads", bulkheads, _is_bulkhead, "fastbreaker.Bulkhead or AdaptiveLimiter"
    )
    named_shedders = _named("shedders", shedders, _is_shedder, "fastbreaker.LoadShedder")
    labelled_fallbacks = _labelled(
        "fallbacks",
        fallbacks,
        _is_fallback,
        "function wrapped by fastbreaker.fallback or stale_on_error",
    )
    reader = _Reader(
        named_breakers,
        labelled_maps,
        labelled_budgets,
        named_bulkheads,
        named_shedders,
        labelled_fallbacks,
        max_key_series,
    )
    specs = [
        *(_breaker_specs() if named_breakers else ()),
        *(_map_specs() if labelled_maps else ()),
        *(_budget_specs() if labelled_budgets else ()),
        *(_bulkhead_specs() if named_bulkheads else ()),
        *(_shedder_specs() if named_shedders else ()),
        *(_fallback_specs() if labelled_fallbacks else ()),
    ]
    registered: list[Union[ObservableCounter, ObservableGauge]] = []
    for index, spec in enumerate(specs):
        create = meter.create_observable_gauge if spec.gauge else meter.create_observable_counter
        inst = create(
            spec.name,
            callbacks=[_callback(reader, index, spec.points, Observation)],
            unit=spec.unit,
            description=spec.description,
        )
        if not _first_time(inst):
            # The instruments registered so far stay silent: the reader is never activated.
            raise ValueError(
                f"meter already has the instrument {spec.name!r} from an earlier instrument() "
                "call, which the SDK keeps without the new callback: pass every object of a "
                "kind to one instrument() call per meter, or use a meter of another name"
            )
        registered.append(inst)
    reader.active = True
    return Instrumentation(tuple(registered))


def _callback(
    reader: _Reader,
    index: int,
    points: Callable[[_Snapshot], Iterable[_Point]],
    observation: type[Observation],
) -> Callable[[CallbackOptions], list[Observation]]:
    def callback(options: CallbackOptions) -> list[Observation]:
        snapshot = reader.snapshot(index)
        if snapshot is None:
            return []
        return [observation(value, attributes) for value, attributes in points(snapshot)]

    return callback
