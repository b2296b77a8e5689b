"""The pure-Python twin of ``_map_c.pyx``, and the specification of BreakerMap's call path.

Both map classes keep only the per-call path (key lookup, CLOSED admission); everything that
runs rarely (construction, first sight of a key, eviction, metrics) is in ``_map_steps``, so that
logic exists once. ``_map.py`` selects the class.
"""

from __future__ import annotations

import threading
import types
from typing import (
    Any,
    Awaitable,
    Callable,
    Hashable,
    Iterator,
    Optional,
    TypeVar,
    cast,
    final,
)

from . import _breaker_py
from ._breaker_py import CircuitBreaker, Config, Group, _listener_lock
from ._errors import uninitialised
from ._keywords import checks_keywords
from ._map_steps import (
    CB,
    CLOSED,
    MapMetrics,
    _Hook,
    _init,
    _iter,
    _metrics,
    _new,
    _on_state_change,
    _open_keys,
    _refuse_copy,
    _repr,
    _shared_contains,
    _shared_get,
    _uninitialised,
    map_signature,
)
from ._options import BreakerOptions, Duration, class_signature

__all__ = ["BreakerMap", "MapMetrics"]

T = TypeVar("T")


@final
@checks_keywords
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
        "_d",
        "_options",
        "_group",
        "_config",
        "_detached",
        "_hook",
        "_lock",
        "_max_keys",
        "_room",
        "_evicted",
        "_untracked",
        "_dropped",
        "_owner",
        "_table",
        "__weakref__",
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
    _table: Any  # a shared map's table (_region_map.SharedTable), else None

    def __init__(
        self,
        *args: Any,
        max_open_ratio: float = 1.0,
        max_keys: Optional[int] = None,
        **options: Any,
    ) -> None:
        """Every breaker option but ``name`` (see ``BreakerOptions``), plus the map's own.

        Args:
            args: ``failure_threshold`` and ``reset_timeout``, as for ``CircuitBreaker``.
            max_open_ratio: the largest share of keys that may be OPEN, HALF_OPEN or ISOLATED
                at once: an automatic trip beyond ``max(1, floor(ratio * len(map)))`` is
                refused (like Envoy's ``max_ejection_percent``); 1.0 refuses none.
            max_keys: the most breakers held (None: unbounded); information-free CLOSED
                breakers are dropped first, OPEN/HALF_OPEN/ISOLATED ones never.
            options: every other ``CircuitBreaker`` option (``window``, ``min_calls``,
                ``failure_rate``, ``slow_call_duration``, ``slow_call_rate``,
                ``half_open_max_calls``, ``success_threshold``, ``max_reset_timeout``,
                ``probe_timeout``, ``failure_on``, ``ignore``, ``window_seconds``,
                ``window_buckets``, ``dry_run``, ``record_latency``, ``latency_buckets``,
                ``clock``), the same for every key.
        """
        _init(self, *args, max_open_ratio=max_open_ratio, max_keys=max_keys, **options)
        self._d = {}
        self._table = None

    # -- the call path ---------------------------------------------------------------------------
    def _breaker(self, key: Hashable) -> CircuitBreaker:
        try:
            breaker = self._d.get(key)
        except TypeError:  # unhashable: _new raises the error that names the parameter
            breaker = None
        if breaker is None:
            return cast(CircuitBreaker, _new(self, key))
        table = self._table
        if table is not None:
            # a shared map (_region_map): the slot must still hold this key (its tag unchanged)
            slot, tag = breaker._bound()
            if table.tag(slot) != tag:
                return cast(CircuitBreaker, _new(self, key))
        return breaker

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
        if self._table is not None:
            return _shared_get(self, key)  # type: ignore[no-any-return]
        return self._d.get(key)

    def __contains__(self, key: object) -> bool:
        if self._table is not None:
            return _shared_contains(self, key)
        return key in self._d

    def __len__(self) -> int:
        if self._table is not None:
            return int(self._table.assigned)
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

    def __new__(cls, *args: Any, **kwargs: Any) -> "BreakerMap":
        # Until __init__ runs, every slot holds a placeholder that fails clearly when touched.
        self = object.__new__(cls)
        uninitialised(self, BreakerMap.__slots__[:-1], str(_uninitialised()))
        return self

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


BreakerMap.__init__.__signature__ = map_signature()  # type: ignore[attr-defined]

# inspect.signature() and help() show the constructor's parameters, not __new__'s *args/**kwargs.
BreakerMap.__signature__ = class_signature(map_signature())  # type: ignore[attr-defined]
