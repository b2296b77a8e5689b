"""What ``fastbreaker.compat.pybreaker``'s breakers share: pybreaker's constants, messages, error,
listener, state and storage classes, and ``CircuitRedisStorage``. Import them from
``fastbreaker.compat.pybreaker``, their public home (their ``__module__`` says so).
"""

from __future__ import annotations

import calendar
import logging
import time
from datetime import datetime
from typing import TYPE_CHECKING, Any, Callable, Optional

from .._errors import State
from ._redis_io import BoundedRedis, check_timeout

if TYPE_CHECKING:
    from .pybreaker import CircuitBreaker

STATE_OPEN = "open"
STATE_CLOSED = "closed"
STATE_HALF_OPEN = "half-open"

_CLOSED, _OPEN, _HALF_OPEN = State.CLOSED, State.OPEN, State.HALF_OPEN

MSG_TRIP = "Failures threshold reached, circuit breaker opened"
MSG_TRIAL_FAILED = "Trial call failed, circuit breaker opened"
MSG_OPEN = "Timeout not elapsed yet, circuit breaker still open"
MSG_TRIAL_RUNNING = "Trial call in progress, circuit breaker half-open"
MSG_STORAGE = (
    "fastbreaker.compat.pybreaker keeps a breaker's state in fastbreaker's in-process lock-free "
    "core (CircuitMemoryStorage) or in Redis (CircuitRedisStorage), so state_storage must be a "
    "fastbreaker.compat.pybreaker.CircuitMemoryStorage or CircuitRedisStorage, got {!r}"
)
log = logging.getLogger("fastbreaker.compat.pybreaker")
VALID_STATES = (STATE_CLOSED, STATE_OPEN, STATE_HALF_OPEN)


class CircuitBreakerError(Exception):
    """A call was refused because the circuit is open, or (by default) its failure opened it."""


class CircuitBreakerListener:
    """Subclass and register with ``CircuitBreaker.add_listener`` to observe a breaker."""

    def before_call(
        self, cb: CircuitBreaker, func: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> None:
        """Called before the breaker ``cb`` calls ``func(*args, **kwargs)`` (only for calls it
        lets through)."""

    def failure(self, cb: CircuitBreaker, exc: BaseException) -> None:
        """Called when a call through ``cb`` raised ``exc``, a system error (not excluded)."""

    def success(self, cb: CircuitBreaker) -> None:
        """Called when a call through ``cb`` succeeded (or raised an excluded exception)."""

    def state_change(
        self,
        cb: CircuitBreaker,
        old_state: Optional[CircuitBreakerState],
        new_state: CircuitBreakerState,
    ) -> None:
        """Called when ``cb`` changes state from ``old_state`` (None at creation) to
        ``new_state`` (manual transitions too, even to the same state)."""


class CircuitBreakerState:
    """A breaker's state as listeners see it; ``name`` is one of the ``STATE_*`` strings."""

    _state_name = ""

    def __init__(
        self,
        cb: CircuitBreaker,
        prev_state: Optional[CircuitBreakerState] = None,
        notify: bool = False,
    ) -> None:
        self._breaker = cb

    @property
    def name(self) -> str:
        """``"closed"``, ``"open"`` or ``"half-open"``."""
        return self._state_name


class CircuitClosedState(CircuitBreakerState):
    """Calls pass; consecutive failures are counted and ``fail_max`` of them open the circuit."""

    _state_name = STATE_CLOSED


class CircuitOpenState(CircuitBreakerState):
    """Calls are refused until ``reset_timeout`` has passed; then the next call is a trial."""

    _state_name = STATE_OPEN


class CircuitHalfOpenState(CircuitBreakerState):
    """One trial call at a time; ``success_threshold`` successes close, a failure re-opens."""

    _state_name = STATE_HALF_OPEN


STATE_CLASSES: dict[object, type[CircuitBreakerState]] = {
    _CLOSED: CircuitClosedState,
    _OPEN: CircuitOpenState,
    _HALF_OPEN: CircuitHalfOpenState,
    STATE_CLOSED: CircuitClosedState,
    STATE_OPEN: CircuitOpenState,
    STATE_HALF_OPEN: CircuitHalfOpenState,
}
NAMES = {_CLOSED: STATE_CLOSED, _OPEN: STATE_OPEN, _HALF_OPEN: STATE_HALF_OPEN}


class CircuitBreakerStorage:
    """pybreaker's storage interface; only ``CircuitMemoryStorage`` can back a breaker here."""

    def __init__(self, name: str) -> None:
        self._name = name

    @property
    def name(self) -> str:
        """The kind of storage (``"memory"``)."""
        return self._name


_FAILED = object()  # what a read gives when Redis failed


class CircuitRedisStorage(CircuitBreakerStorage):
    """pybreaker's Redis storage: a breaker's state, counters and opening time in Redis.

    The same arguments and keys as pybreaker (``[namespace:]pybreaker:state``, ``fail_counter``,
    ``success_counter``, ``opened_at`` in whole UTC seconds), so processes running pybreaker and
    this module can share a breaker. A breaker backed by it has pybreaker's semantics: a few
    Redis round trips per call (no lock is held across the call itself). Each Redis operation is
    bounded by ``timeout`` seconds (connect and read, on a client made from ``redis_object``'s
    connection settings, without its retries). When Redis fails, reads give
    ``fallback_circuit_state`` and zero counters, writes are lost, Redis is left alone for a
    second (a call meets at most one timeout), and one line is logged per outage (another when
    Redis answers again); a missing state is set to ``fallback_circuit_state``. For new code,
    prefer ``fastbreaker.contrib.redis.FleetCoordinator``: local decisions, no I/O on the call
    path.

    ``state`` is the initial state, ``redis_object`` a redis-py client, ``namespace`` a prefix
    for the keys; ``cluster_mode=True`` (Redis Cluster) writes the state with a plain
    compare-and-set instead of a ``WATCH`` transaction, as pybreaker does. ``timeout``: the most
    one Redis operation may take, in seconds (0 to 60; a cluster client or a client that is not
    redis-py's or valkey's own is used as given, with its own timeouts).
    """

    BASE_NAMESPACE = "pybreaker"

    def __init__(
        self,
        state: str,
        redis_object: Any,
        namespace: Optional[str] = None,
        fallback_circuit_state: str = STATE_CLOSED,
        cluster_mode: bool = False,
        *,
        timeout: float = 0.25,
    ) -> None:
        super().__init__("redis")
        for value in (state, fallback_circuit_state):
            if value not in VALID_STATES:
                raise ValueError(
                    f"Unknown state {value!r}, valid states: "
                    f"{STATE_CLOSED}, {STATE_OPEN}, {STATE_HALF_OPEN}"
                )
        self._redis = redis_object
        self._namespace_name = namespace
        self._fallback_circuit_state = fallback_circuit_state
        self._cluster_mode = cluster_mode
        self._io = BoundedRedis(redis_object, check_timeout(timeout), log)
        self._write(lambda r: r.setnx(self._key("fail_counter"), 0))
        self._write(lambda r: r.setnx(self._key("success_counter"), 0))
        self._write(lambda r: r.setnx(self._key("state"), state))

    def _key(self, name: str) -> str:
        parts = [self.BASE_NAMESPACE, name]
        if self._namespace_name:
            parts.insert(0, self._namespace_name)
        return ":".join(parts)

    def _write(self, op: Callable[[Any], Any]) -> None:
        self._io.run(op, None)

    def _get(self, name: str, default: Any = None) -> Any:
        key = self._key(name)
        return self._io.run(lambda r: r.get(key), default)

    def _int(self, name: str) -> int:
        value = self._get(name)
        return int(value) if value is not None else 0

    @property
    def state(self) -> str:
        """The circuit state; ``fallback_circuit_state`` when Redis fails or has none."""
        raw = self._get("state", _FAILED)
        if raw is _FAILED:
            return self._fallback_circuit_state
        if raw is None:
            fallback = self._fallback_circuit_state
            self.state = fallback
            self.reset_counter()
            return fallback
        value = raw.decode() if isinstance(raw, bytes) else str(raw)
        return value if value in VALID_STATES else self._fallback_circuit_state

    @state.setter
    def state(self, state: str) -> None:
        self._write(lambda r: r.set(self._key("state"), str(state)))

    def increment_counter(self) -> None:
        """Add one to the failure counter (an atomic INCR)."""
        self._write(lambda r: r.incr(self._key("fail_counter")))

    def reset_counter(self) -> None:
        """Set the failure counter in Redis to zero."""
        self._write(lambda r: r.set(self._key("fail_counter"), 0))

    def increment_success_counter(self) -> None:
        """Add one to the success counter in Redis."""
        self._write(lambda r: r.incr(self._key("success_counter")))

    def reset_success_counter(self) -> None:
        """Set the success counter in Redis to zero."""
        self._write(lambda r: r.set(self._key("success_counter"), 0))

    @property
    def counter(self) -> int:
        """The failure counter."""
        return self._int("fail_counter")

    @property
    def success_counter(self) -> int:
        """The trial successes counter."""
        return self._int("success_counter")

    def _opened_ts(self) -> Optional[int]:
        raw = self._get("opened_at")
        return int(raw) if raw is not None else None

    @property
    def opened_at(self) -> Optional[datetime]:
        """When the circuit last opened, to the second (a naive UTC ``datetime``), or None."""
        ts = self._opened_ts()
        return None if ts is None else datetime(*time.gmtime(ts)[:6])

    @opened_at.setter
    def opened_at(self, now: datetime) -> None:
        # Only ever moves forward (several processes may open the same circuit).
        key, value = self._key("opened_at"), calendar.timegm(now.utctimetuple())

        def forward(pipe: Any) -> None:
            current = pipe.get(key)
            if current is None or int(current) < value:
                if hasattr(pipe, "multi"):
                    pipe.multi()
                pipe.set(key, value)

        if self._cluster_mode:  # no WATCH across a cluster: a plain compare-and-set
            self._write(forward)
        else:
            self._write(lambda r: r.transaction(forward, key))
