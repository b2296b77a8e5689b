"""The pure-Python twin of ``_map_c.pyx``, and the specification of BreakerMap.

The compiled ``BreakerMap`` runs the per-call path (key lookup, CLOSED admission) in C and calls
the module-level functions below for everything that runs rarely (construction, first sight of a
key, eviction, metrics), so that logic exists once. ``_map.py`` selects the class.

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
import logging
import threading
import types
import weakref
from typing import (
    TYPE_CHECKING, Any, Awaitable, Callable, Hashable, Iterator, Optional, TypeVar,
)

from . import _breaker_py
from ._breaker_py import CircuitBreaker, Config, Group, _listener_lock
from ._durations import check_count, check_rate
from ._errors import State, not_copyable
from ._metrics import Metrics
from ._options import BreakerOptions, Duration, ExcTypes, FailurePredicate

__all__ = ["BreakerMap", "MapMetrics"]

T = TypeVar("T")
StateCallback = Callable[[Any, State, State], Any]
CB = TypeVar("CB", bound=StateCallback)

CLOSED = State.CLOSED
_logger = logging.getLogger("fastbreaker")
_COUNTERS = (
    "permitted", "rejected", "successes", "failures", "slow_calls", "ignored", "stale", "opened",
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
    exported as monotonic counters. Untracked breakers are not included.
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
    try:
        hash(key)
    except TypeError:
        raise TypeError(f"key must be hashable (e.g. a str or a tuple of str), got {key!r}") from None
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


def _initialised(m: Any) -> bool:
    try:
        return m._config is not None
    except RuntimeError:  # the twin's unset slot
        return False


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
    return iter(list(m._d))


def _open_keys(m: Any) -> list[Hashable]:
    if m._config is None:
        raise _uninitialised()
    if m._group.open == 0:  # the core counts the non-CLOSED breakers: nothing to look for
        return []
    return [key for key, b in list(m._d.items()) if b.state != CLOSED]


def _metrics(m: Any) -> MapMetrics:
    if m._config is None:
        raise _uninitialised()
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


class BreakerMap:
    """One circuit breaker per key (a host, or a ``(host, operation)`` tuple), bounded, no threads.

    ``BreakerMap(failure_threshold=5, reset_timeout=30.0, *, <every CircuitBreaker option but
    name>, max_open_ratio=1.0, max_keys=None, clock=None)``. Keys are any hashable.

    Every key behaves exactly like a ``CircuitBreaker`` with the map's options and clock.
    ``allow``, ``record_success``, ``record_failure``, ``call``, ``call_async`` and ``m[key]``
    create the key's breaker on first sight (its ``name`` is ``str(key)``; ``with m[key]:``
    works); ``get`` never creates. ``key in m``, ``len(m)`` and ``iter(m)`` see the keys held.

    ``max_open_ratio`` (like Envoy's ``max_ejection_percent``): an automatic CLOSED -> OPEN trip
    happens only if afterwards at most ``max(1, floor(max_open_ratio * len(m)))`` breakers are
    OPEN, HALF_OPEN or ISOLATED (computed exactly: 0.29 x 100 keys allows 29). Otherwise the
    breaker stays CLOSED with its failures recorded and ``metrics().suppressed_trips`` counts the
    refusal. ``trip()``, ``isolate()`` and re-trips from HALF_OPEN are never refused.

    ``max_keys``: the map never holds more breakers. When a new key arrives and the map is full,
    it makes room for ``max(1, max_keys // 64)`` keys at once, dropping in creation order the
    breakers that carry no information (CLOSED, no consecutive failures, no failure or slow call
    in the window), then, if there are not enough of those, the oldest other CLOSED ones, and
    only then the oldest CLOSED ones with a call in flight (more calls admitted than outcomes
    reported: ``call``, ``call_async``, ``with``, or a raw ``allow()`` not yet reported), so that
    a running call's outcome still counts for its key; a breaker no call has reached yet counts
    as busy too (its first call may be on its way). (To bound its work, a scan looks past at
    most 64 more of those than it must drop.) A raw ``allow()`` whose outcome is never
    reported makes its key look busy until a later outcome evens the count; it never pins the
    key, which goes last instead. (An outcome reported without a permit, a raw ``record_*()``
    with no ``allow()``, offsets one in-flight call of its key.) OPEN,
    HALF_OPEN and ISOLATED breakers are never dropped: if every held breaker is in one of those
    states, a new key gets a fresh CLOSED breaker that the map does not hold. Its calls are
    admitted, nothing about them is remembered, the key is not in the map, and
    ``metrics().untracked`` counts it. A breaker obtained earlier keeps working after its key was
    dropped but no longer affects the map: no map callbacks, no share of ``max_open_ratio``, and
    its later calls are not in the map's totals.

    Thread-safe, with no lock on the call path for keys already held; no threads, timers or tasks.
    A key's ``__hash__`` and ``__eq__`` may use the map (a key first seen from inside them, while
    the same thread is adding or dropping a key, gets an untracked breaker). A key's breaker is
    named ``str(key)`` (``repr`` if ``str`` raises), so a rejection always raises
    ``CircuitOpenError``. ``__init__`` runs once (a second call raises RuntimeError), and a map
    is neither copied nor pickled (TypeError): its breakers hold live state.
    """

    __slots__ = (
        "_d", "_options", "_group", "_config", "_detached", "_hook", "_lock", "_max_keys",
        "_room", "_evicted", "_untracked", "_dropped", "_owner", "__weakref__",
    )

    _core: types.ModuleType = _breaker_py
    _d: dict[Hashable, CircuitBreaker]
    _options: BreakerOptions
    _group: Group
    _config: Config
    _detached: Config
    _hook: _Hook
    _lock: threading.Lock
    _max_keys: Optional[int]
    _room: int
    _evicted: int
    _untracked: int
    _dropped: dict[str, int]
    _owner: Optional[int]

    def __init__(
        self,
        failure_threshold: int = 5,
        reset_timeout: Duration = 30.0,
        *,
        window: int = 0,
        min_calls: int = 20,
        failure_rate: float = 0.5,
        slow_call_duration: Optional[Duration] = None,
        slow_call_rate: float = 1.0,
        half_open_max_calls: int = 1,
        success_threshold: int = 1,
        max_reset_timeout: Optional[Duration] = None,
        probe_timeout: Optional[Duration] = None,
        failure_on: ExcTypes | FailurePredicate = (Exception,),
        ignore: ExcTypes = (),
        max_open_ratio: float = 1.0,
        max_keys: Optional[int] = None,
        clock: Optional[Callable[[], int]] = None,
    ) -> None:
        _init(
            self, failure_threshold, reset_timeout, window=window, min_calls=min_calls,
            failure_rate=failure_rate, slow_call_duration=slow_call_duration,
            slow_call_rate=slow_call_rate, half_open_max_calls=half_open_max_calls,
            success_threshold=success_threshold, max_reset_timeout=max_reset_timeout,
            probe_timeout=probe_timeout, failure_on=failure_on, ignore=ignore,
            max_open_ratio=max_open_ratio, max_keys=max_keys, clock=clock,
        )
        self._d = {}

    # -- the call path ---------------------------------------------------------------------------
    def _breaker(self, key: Hashable) -> CircuitBreaker:
        try:
            breaker = self._d.get(key)
        except TypeError:  # unhashable: _new raises the error that names the parameter
            breaker = None
        return _new(self, key) if breaker is None else breaker

    def allow(self, key: Hashable) -> bool:
        """Admit one call for ``key`` (True) or reject it (False); creates the key's breaker."""
        return self._breaker(key).allow()

    def record_success(self, key: Hashable, elapsed: Optional[Duration] = None) -> None:
        """Report a success for ``key`` (``elapsed`` seconds make it slow when over the limit)."""
        self._breaker(key).record_success(elapsed)

    def record_failure(self, key: Hashable) -> None:
        """Report a failure for ``key``."""
        self._breaker(key).record_failure()

    def call(self, key: Hashable, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Call ``fn(*args, **kwargs)`` through ``key``'s breaker (CircuitOpenError if rejected)."""
        return self._breaker(key).call(fn, *args, **kwargs)

    def call_async(
        self, key: Hashable, fn: Callable[..., Awaitable[T]], /, *args: Any, **kwargs: Any
    ) -> Awaitable[T]:
        """Await ``fn(*args, **kwargs)`` through ``key``'s breaker."""
        return self._breaker(key).call_async(fn, *args, **kwargs)

    def __getitem__(self, key: Hashable) -> CircuitBreaker:
        """The key's breaker, created if absent."""
        return self._breaker(key)

    def get(self, key: Hashable) -> Optional[CircuitBreaker]:
        """The key's breaker, or None; never creates one."""
        return self._d.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._d

    def __len__(self) -> int:
        return len(self._d)

    # -- the rest ----------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Hashable]:
        """The keys currently held, in creation order (a snapshot)."""
        return _iter(self)

    def open_keys(self) -> list[Hashable]:
        """Keys whose breaker is OPEN, HALF_OPEN or ISOLATED (the stored state; no transition)."""
        return _open_keys(self)

    def metrics(self) -> MapMetrics:
        """A snapshot: counts by state, evictions, suppressed trips, and cumulative call totals."""
        return _metrics(self)

    def on_state_change(self, callback: CB) -> CB:
        """Register ``callback(key, old_state, new_state)`` for every breaker of the map.

        Returns the callback (decorator-friendly). A callback that raises is logged and does not
        stop the others. Dropped and untracked breakers do not call it.
        """
        return _on_state_change(self, callback)

    def __repr__(self) -> str:
        return _repr(self)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # The compiled class is final; the twin behaves the same.
        raise TypeError("BreakerMap cannot be subclassed: wrap it or register callbacks")

    if not TYPE_CHECKING:  # hidden from type checkers: it would make every attribute valid

        def __getattr__(self, name: str) -> Any:
            # Reached only when a slot is unset: the object was made with __new__, not __init__.
            if name in BreakerMap.__slots__:
                raise _uninitialised()
            raise AttributeError(f"'BreakerMap' object has no attribute {name!r}")

    # One rule on both cores: a map is neither copied nor pickled (its breakers are live state).
    __copy__ = __deepcopy__ = __reduce_ex__ = __reduce__ = _refuse_copy

    def _closed_items(self) -> Iterator[tuple[Hashable, CircuitBreaker]]:
        """``(key, breaker)`` for the held breakers whose stored state is CLOSED, oldest first.

        The eviction scan skips OPEN, HALF_OPEN and ISOLATED breakers through this (in C in the
        compiled map), so that a map mostly made of them is walked quickly.
        """
        for key, breaker in self._d.items():
            if breaker._state == CLOSED:
                yield key, breaker

    def _detach(
        self, breaker: CircuitBreaker, shared: Config, detached: Config, in_flight_ok: bool = True
    ) -> bool:
        """Give ``breaker`` a group-less config iff it is CLOSED (and, unless ``in_flight_ok``,
        has no call in flight), with no transition or admission in between.

        A breaker on the map's ``shared`` config gets ``detached``; one with its own listeners
        gets a private group-less copy without the map's hook. Holding the breaker's lock (and
        the listener lock, so that no callback registration is lost) makes check and swap one
        step: a trip in between would leave the map's count of non-CLOSED breakers off forever.
        """
        with _listener_lock, breaker._lock:
            if breaker._state != CLOSED:
                return False
            if not in_flight_ok and breaker._permitted > (
                breaker._successes + breaker._failures + breaker._ignored + breaker._stale
            ):
                return False
            config = breaker._config
            if config is shared:
                config = detached
            else:
                config = config.copy(keep_group=False)
                config.hook = None
            breaker._set_config(config)
            return True
