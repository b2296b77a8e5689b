"""The rarely-run steps of a BreakerMap, shared by the compiled map and its twin.

Both ``BreakerMap`` classes (``_map_c.pyx``, ``_map_py.py``) keep only the per-call path (key
lookup, CLOSED admission) and call these functions for everything that runs rarely: construction,
first sight of a key, eviction, metrics, callbacks. The functions reach a core only through the
map's ``_core`` (``CircuitBreaker``, ``Config``, ``Group`` of that core) and the map's own
``_closed_items()`` / ``_detach()``, so this module imports neither core.

Memory: the map stores nothing per key but the dict entry and the breaker. The dict's insertion
order is the creation order that eviction follows, and eviction inspects breakers only when the
map is full, so the call path does no bookkeeping at all.

Concurrency: lookups of existing keys take no lock (a dict read is atomic). Creation and eviction
take the map's lock, so a key never gets two breakers and the map never holds more than
``max_keys``. The lock is re-entrant, because the dict runs the key's own ``__hash__`` and
``__eq__`` while it is held: a key whose hash or eq touches the same map must not deadlock. A key
first seen from inside such a call, while this thread is already creating or evicting, gets an
untracked breaker (the map is in the middle of a change and must not change under itself).

The breakers share one ``Config`` (options, clock, the ``Group`` counters behind
``max_open_ratio``, and the state-change hook); the core keeps the group's count of non-CLOSED
breakers at every transition, so the map needs no timer and no thread.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import threading
import weakref
from typing import Any, Callable, Hashable, Iterator, Optional, TypeVar

from ._durations import check_count, check_rate
from ._errors import State, is_uninitialised, not_copyable
from ._metrics import Metrics
from ._options import BreakerOptions

__all__ = ["MapMetrics", "map_signature"]


def map_signature() -> inspect.Signature:
    """``BreakerMap(...)``'s signature, built from ``BreakerOptions``'s (the option list is
    written once): every breaker option but ``name``, then ``max_open_ratio`` and ``max_keys``."""
    params = [
        p
        for p in inspect.signature(BreakerOptions.__init__).parameters.values()
        if p.name != "name"
    ]
    own = [
        inspect.Parameter(
            "max_open_ratio", inspect.Parameter.KEYWORD_ONLY, default=1.0, annotation="float"
        ),
        inspect.Parameter(
            "max_keys", inspect.Parameter.KEYWORD_ONLY, default=None, annotation="Optional[int]"
        ),
    ]
    return inspect.Signature(params[:-1] + own + params[-1:])  # clock stays last


T = TypeVar("T")
StateCallback = Callable[[Any, State, State], Any]
CB = TypeVar("CB", bound=StateCallback)

CLOSED = State.CLOSED
_logger = logging.getLogger("fastbreaker")
_COUNTERS = (
    "permitted",
    "rejected",
    "successes",
    "failures",
    "slow_calls",
    "ignored",
    "stale",
    "opened",
    "would_reject",
    "probe_successes",
    "probe_failures",
    "timeouts",
    "open_seconds_total",
)
# When the map is full it makes room for max(1, max_keys // _ROOM_DIVISOR) keys at once: the
# eviction scan walks the dict in creation order, so a batch amortizes each scan over many
# insertions (a million new keys through a 10,000-key map cost ~6,400 scans, not a million).
_ROOM_DIVISOR = 64
# The eviction scan passes over at most this many breakers with calls in flight (beyond the
# number it must drop) looking for others: a map of keys admitted by raw allow() and never
# reported must not make every scan walk the whole map.
_BUSY_LOOKAHEAD = 64


@dataclasses.dataclass(frozen=True)
class MapMetrics:
    """A point-in-time snapshot of a BreakerMap.

    ``keys`` is the number of breakers held; ``open``, ``half_open`` and ``isolated`` count them by
    state. ``evicted`` counts breakers dropped to respect ``max_keys``; ``suppressed_trips`` the
    automatic trips refused by ``max_open_ratio``; ``untracked`` the new keys that got a breaker
    the map could not hold (every held breaker was OPEN, HALF_OPEN or ISOLATED).

    The call counters are totals over every breaker the map has held since it was created,
    dropped ones included (up to the moment they were dropped), so they only grow and can be
    exported as monotonic counters. Untracked breakers are not included. ``open_seconds_total``
    adds up the time each breaker spent OPEN. They are the sums of the breakers' ``Metrics``
    fields of the same names: ``permitted``, ``rejected``, ``successes``, ``failures``,
    ``slow_calls``, ``ignored``, ``stale``, ``opened``, ``would_reject``, ``probe_successes``,
    ``probe_failures`` and ``timeouts``.
    """

    keys: int
    open: int
    half_open: int
    isolated: int
    evicted: int
    suppressed_trips: int
    untracked: int
    permitted: int
    rejected: int
    successes: int
    failures: int
    slow_calls: int
    ignored: int
    stale: int
    opened: int
    would_reject: int = 0
    probe_successes: int = 0
    probe_failures: int = 0
    timeouts: int = 0
    open_seconds_total: float = 0.0


class _Hook:
    """The map's state-change hook: calls ``callback(key, old, new)`` for each map callback.

    It refers to the map only weakly, so a map is freed by reference counting (its breakers hold
    their config, and the config holds this hook).
    """

    __slots__ = ("callbacks", "_map")

    def __init__(self, owner: Any) -> None:
        # Only ever appended to: firing can read it while another thread registers.
        self.callbacks: list[StateCallback] = []
        self._map = weakref.ref(owner)

    def __call__(self, breaker: Any, old: State, new: State) -> None:
        if not self.callbacks:
            return
        key = self._key_of(breaker)
        for cb in tuple(self.callbacks):
            try:
                cb(key, old, new)
            except Exception:
                _logger.exception("fastbreaker: BreakerMap state-change callback %r raised", cb)

    def _key_of(self, breaker: Any) -> Any:
        label = breaker._label
        return None if label is _NONE_KEY else label


class _NoneKey:
    """The label of the breaker of the key ``None``: a breaker labelled ``None`` has no name,
    while a map names each key's breaker ``str(key)``, so ``m[None].name == "None"``."""

    __slots__ = ()

    def __str__(self) -> str:
        return "None"

    def __repr__(self) -> str:
        return "None"

    def __reduce__(self) -> str:
        return "_NONE_KEY"


_NONE_KEY = _NoneKey()


def _label(key: Hashable) -> Any:
    return _NONE_KEY if key is None else key


# -- the rarely-run steps, shared by both classes -----------------------------------------------
def _init(
    m: Any,
    *args: Any,
    max_open_ratio: float = 1.0,
    max_keys: Optional[int] = None,
    **breaker_options: Any,
) -> None:
    if _initialised(m):
        raise RuntimeError("BreakerMap.__init__ called twice: create a new map instead")
    if "name" in breaker_options:
        raise TypeError("BreakerMap takes no name: each key's breaker is named str(key)")
    # The breaker options are validated (and their names checked) by BreakerOptions.
    options = BreakerOptions(*args, **breaker_options)
    ratio = check_rate(max_open_ratio, "max_open_ratio")
    if max_keys is not None:
        check_count(max_keys, "max_keys", 1, 2**62)
    core = m._core
    m._options = options
    m._group = core.Group(ratio)
    m._hook = _Hook(m)
    m._config = core.Config(options, m._group, m._hook)
    m._config.shared = True  # a breaker that registers its own callback gets a private copy
    # Dropped and untracked breakers share one config without group or hook: they keep working
    # but no longer affect the map.
    m._detached = core.Config(options)
    m._detached.shared = True
    m._lock = threading.RLock()  # re-entrant: see the module docstring
    m._owner = None  # the thread creating or evicting (with the lock held), else None
    m._max_keys = max_keys
    m._room = max(1, max_keys // _ROOM_DIVISOR) if max_keys is not None else 0
    m._evicted = 0
    m._untracked = 0
    m._dropped = dict.fromkeys(_COUNTERS, 0)


def _new(m: Any, key: Hashable) -> Any:
    """First sight of ``key``: create its breaker, making room first if the map is full."""
    if m._config is None:
        raise _uninitialised()
    if m._table is not None:
        return _shared_new(m, key)
    try:
        hash(key)
    except TypeError:
        raise TypeError(
            f"key must be hashable (e.g. a str or a tuple of str), got {key!r}"
        ) from None
    breaker_cls = m._core.CircuitBreaker
    me = threading.get_ident()
    with m._lock:
        if m._owner == me:
            # Re-entered from a key's __hash__/__eq__ while this thread changes the dict.
            m._untracked += 1
            return breaker_cls._from_config(m._detached, _label(key))
        m._owner = me
        try:
            breaker = m._d.get(key)
            if breaker is not None:  # another thread created it while we waited for the lock
                return breaker
            if m._max_keys is not None and len(m._d) >= m._max_keys:
                _make_room(m)
                if len(m._d) >= m._max_keys:
                    # Every held breaker is OPEN, HALF_OPEN or ISOLATED, and none may be dropped.
                    m._untracked += 1
                    return breaker_cls._from_config(m._detached, _label(key))
            breaker = breaker_cls._from_config(m._config, _label(key))
            m._d[key] = breaker
            m._group.add_size(1)
            return breaker
        finally:
            m._owner = None


# -- a map in a SharedRegion (_region_map) -----------------------------------------------------
def attach_table(m: Any, table: Any, max_open_ratio: float) -> None:
    """Make the initialised map ``m`` a shared map over ``table``: its group is the region's
    (``max_open_ratio`` holds across processes), its breakers are bound to table slots."""
    core = m._core
    m._group = core.Group._shared(
        max_open_ratio, table.group_view(core.shared_group_size()), table.group_lock()
    )
    m._config = core.Config(m._options, m._group, m._hook)
    m._config.shared = True
    m._table = table
    if hasattr(m, "_set_tags"):
        m._set_tags(table.view)


def _bind(m: Any, key: Any, slot: int, tag: int) -> Any:
    core = m._core
    table = m._table
    breaker = core.CircuitBreaker._shared(
        m._config, key, table.block_view(slot), table.lock_for(slot)
    )
    breaker._bind(slot, tag)
    m._d[key] = breaker
    return breaker


def _shared_new(m: Any, key: Any) -> Any:
    """A key of a shared map, first seen by this process or rebound after an eviction."""
    from ._region_map import encode_key

    raw = encode_key(key)
    table = m._table
    with m._lock:
        breaker = m._d.get(key)
        if breaker is not None:
            slot, tag = breaker._bound()
            if table.tag(slot) == tag:
                return breaker  # another thread bound it while we waited for the lock
            del m._d[key]
        found, odd = table.lookup(raw)
        if found is None or odd:
            with table.lock:
                _repair(m, table, raw)
                found = table.find(raw)
                if found is None:
                    found = _shared_insert(m, table, raw)
            if found is None:  # every slot holds a breaker that may not be evicted
                return m._core.CircuitBreaker._from_config(m._detached, _label(key))
        return _bind(m, key, *found)


def _shared_insert(m: Any, table: Any, raw: bytes) -> Optional[tuple[int, int]]:
    """Under the table's lock: a slot for a new key, by BreakerMap's eviction rules when the
    table is full; None when every slot holds a breaker that may not be evicted."""
    slot = table.open_slot(raw)  # never assigned, or emptied by _repair
    if slot is not None:
        tag = table.assign(raw, slot)  # its block is a fresh breaker
        table.count_assigned()
        m._group.add_size(1)
        return slot, tag
    order = table.probe_order(raw)
    # Then BreakerMap's tiers: no information and no call in flight; any CLOSED without a call
    # in flight; any CLOSED (the outcomes still out go stale).
    for info_ok, in_flight_ok in ((False, False), (True, False), (True, True)):
        for slot in order:
            tag = table.tag(slot)
            if tag & 1:
                continue
            table.mark_rewriting(slot)  # every process's binding to it is now stale
            before = _probe(m, slot)._recycle(info_ok, in_flight_ok)
            if before is None:
                table.restore_tag(slot, tag)  # kept: the bindings are valid again
                continue
            table.add_evicted(before)
            return slot, table.assign(raw, slot)
    table.count_untracked()
    return None


def _repair(m: Any, table: Any, raw: bytes) -> None:
    """Under the table's lock: repair the slots on the key's probe path that a writer killed
    halfway left with an odd tag (see ``_region_map``), whatever their breakers' states."""
    for slot in table.odd_slots(raw):
        tag = table.tag(slot)
        key = table.whole_key(slot)
        counted = tag != 1  # 1: killed in the slot's first assignment, not counted yet
        if key is not None and table.find(key) is None:
            table.restore_tag(slot, tag + 1)  # a whole key, nowhere else: it keeps its breaker
            if not counted:
                table.count_assigned()
                m._group.add_size(1)
            continue
        # Half written, or a leftover copy of a key that lives on in another slot: reset its
        # breaker whatever its state (its group count is the map's, the probe has none).
        before = _probe(m, slot)._recycle(True, True, True)
        if before is None:
            continue  # claimed by a transition now: the next writer tries again
        if before.state != CLOSED:
            m._group.add_open(-1)
        if before.permitted or before.rejected:  # a fresh breaker has nothing to count
            table.add_evicted(before)
        if counted:
            table.count_assigned(-1)
            m._group.add_size(-1)
        table.empty(slot)


def _probe(m: Any, slot: int) -> Any:
    """A throwaway breaker on ``slot``'s block (the detached config: no group, no callbacks)."""
    table = m._table
    return m._core.CircuitBreaker._shared(
        m._detached, None, table.block_view(slot), table.lock_for(slot)
    )


def _shared_get(m: Any, key: Any) -> Any:
    from ._region_map import encode_key

    try:
        raw = encode_key(key)
    except (TypeError, ValueError):
        return None
    with m._lock:
        breaker = m._d.get(key)
        if breaker is not None:
            slot, tag = breaker._bound()
            if m._table.tag(slot) == tag:
                return breaker
        found = _find(m, raw)
        if found is None:
            return None
        m._d.pop(key, None)
        return _bind(m, key, *found)


def _shared_contains(m: Any, key: object) -> bool:
    from ._region_map import encode_key

    try:
        raw = encode_key(key)
    except (TypeError, ValueError):
        return False
    return _find(m, raw) is not None


def _find(m: Any, raw: bytes) -> Optional[tuple[int, int]]:
    """The key's ``(slot, tag)``; under the lock, after repairs, when a slot being rewritten
    (or left half-written) was on its path."""
    table = m._table
    found: Optional[tuple[int, int]]
    found, odd = table.lookup(raw)
    if odd:
        with table.lock:
            _repair(m, table, raw)
            found = table.find(raw)
    return found


def _shared_breakers(m: Any) -> list[tuple[Any, Any]]:
    """``(key, breaker)`` for every key in the region's table (bound to a throwaway object when
    this process has not seen the key: no callbacks, no caching)."""
    table = m._table
    out = []
    for slot, key in table.keys():
        out.append((key, _probe(m, slot)))
    return out


def _initialised(m: Any) -> bool:
    config = m._config  # None in a fresh compiled map, a placeholder in a fresh twin
    return config is not None and not is_uninitialised(config)


def _uninitialised() -> RuntimeError:
    return RuntimeError("BreakerMap is not initialised: its __init__ was never called")


def _in_flight(metrics: Metrics) -> bool:
    """Admitted calls outnumber reported outcomes: some call may still be running.

    A breaker no call has reached yet counts too: it was just created for a call on its way
    (``m.call`` looks the key up, then the breaker admits), and dropping it in between would
    put that call outside the map.
    """
    done = metrics.successes + metrics.failures + metrics.ignored + metrics.stale
    return metrics.permitted > done or not (metrics.permitted or metrics.rejected or done)


def _carries_no_information(metrics: Any) -> bool:
    """CLOSED with no consecutive failures and no failure or slow call in its window."""
    return (
        metrics.state == CLOSED
        and metrics.consecutive_failures == 0
        and not metrics.failure_rate
        and not metrics.slow_call_rate
    )


def _make_room(m: Any) -> None:
    # One scan in creation order picks the victims: breakers that carry no information first,
    # then other CLOSED ones, and only then breakers with calls in flight. It stops as soon as
    # enough of the first kind are found, the common case (most hosts are healthy), so a scan is
    # short.
    #
    # Calls in flight: a breaker whose admitted calls outnumber its reported outcomes may have a
    # call running; its outcome would land on a dropped breaker and be lost for its key (a host
    # whose calls fail slowly would never trip while other keys churn). The count needs no
    # bookkeeping on the call path: the core already counts permits and outcomes. A raw
    # ``allow()`` whose outcome is never reported looks in flight forever, so in-flight breakers
    # are not pinned: they go last, oldest first, when nothing else can make room. The scan
    # gives up looking past them after ``need + _BUSY_LOOKAHEAD`` of them (bounded work).
    if m._group.open >= len(m._d):
        # Every held breaker is OPEN, HALF_OPEN or ISOLATED (the core counts them): no scan, so
        # that a broad outage does not make every new key pay for a walk over the whole map.
        return
    need = len(m._d) - (m._max_keys - m._room)
    idle: list[tuple[Hashable, Any]] = []
    closed: list[tuple[Hashable, Any]] = []
    busy: list[tuple[Hashable, Any]] = []
    busy_seen = 0
    for key, breaker in m._closed_items():  # only this lock's holder changes the dict
        metrics = breaker.metrics()
        if metrics.state != CLOSED:
            continue
        if _in_flight(metrics):
            if len(busy) < need:
                busy.append((key, breaker))
            busy_seen += 1
            if busy_seen >= need + _BUSY_LOOKAHEAD:
                break
        elif _carries_no_information(metrics):
            idle.append((key, breaker))
            if len(idle) >= need:
                break
        elif len(closed) < need:
            closed.append((key, breaker))
    victims = (idle + closed)[:need]
    for key, breaker in victims:
        if not _drop(m, key, breaker, False):
            need += 1  # a call was admitted since the scan: keep it, take a busy one later
    for key, breaker in busy[: need - len(victims)]:
        _drop(m, key, breaker, True)


def _drop(m: Any, key: Hashable, breaker: Any, in_flight_ok: bool = True) -> bool:
    del m._d[key]
    if not m._detach(breaker, m._config, m._detached, in_flight_ok):
        # It left CLOSED, or a call was admitted, since the scan: keep it.
        m._d[key] = breaker
        return False
    m._group.add_size(-1)
    m._evicted += 1
    # Its counters are read after it left the dict, when keyed calls can no longer reach it.
    metrics = breaker.metrics()
    dropped = m._dropped
    for name in _COUNTERS:
        dropped[name] += getattr(metrics, name)
    return True


def _iter(m: Any) -> Iterator[Hashable]:
    if m._config is None:
        raise _uninitialised()
    if m._table is not None:
        return iter([key for _, key in m._table.keys()])
    return iter(list(m._d))


def _open_keys(m: Any) -> list[Hashable]:
    if m._config is None:
        raise _uninitialised()
    if m._group.open == 0:  # the core counts the non-CLOSED breakers: nothing to look for
        return []
    if m._table is not None:
        return [key for key, b in _shared_breakers(m) if b.state != CLOSED]
    return [key for key, b in list(m._d.items()) if b.state != CLOSED]


def _metrics(m: Any) -> MapMetrics:
    if m._config is None:
        raise _uninitialised()
    if m._table is not None:
        # the region's: every key of every process, and the breakers evicted by any of them
        with m._table.lock:
            breakers = [b for _, b in _shared_breakers(m)]
            totals = m._table.totals()
            evicted, untracked = m._table.evicted, m._table.untracked
    else:
        with m._lock:  # no eviction between the list of breakers and the totals of dropped ones
            breakers = list(m._d.values())
            totals = dict(m._dropped)
            evicted, untracked = m._evicted, m._untracked
    by_state = [0, 0, 0, 0]
    for breaker in breakers:
        metrics = breaker.metrics()
        by_state[metrics.state] += 1
        for name in _COUNTERS:
            totals[name] += getattr(metrics, name)
    return MapMetrics(
        keys=len(breakers),
        open=by_state[State.OPEN],
        half_open=by_state[State.HALF_OPEN],
        isolated=by_state[State.ISOLATED],
        evicted=evicted,
        suppressed_trips=m._group.suppressed,
        untracked=untracked,
        **totals,
    )


def _on_state_change(m: Any, callback: CB) -> CB:
    if m._config is None:
        raise _uninitialised()
    if not callable(callback):
        raise TypeError(f"callback must be callable, got {callback!r}")
    m._hook.callbacks.append(callback)
    return callback


def _refuse_copy(m: Any, *args: Any) -> Any:
    # its breakers hold live state (permits in flight, open periods, callbacks)
    raise not_copyable(m)


def _repr(m: Any) -> str:
    if not _initialised(m):
        return "<BreakerMap (uninitialised)>"
    return f"<BreakerMap keys={len(m._d)} max_keys={m._max_keys}>"
