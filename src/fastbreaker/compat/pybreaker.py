"""pybreaker 1.4 on fastbreaker's lock-free core: replace ``import pybreaker`` and nothing else.

    import fastbreaker.compat.pybreaker as pybreaker

    db_breaker = pybreaker.CircuitBreaker(fail_max=5, reset_timeout=60)

This module offers what pybreaker documents: ``CircuitBreaker`` (``call``, ``calling()``, use as
a decorator, ``open()``/``half_open()``/``close()``, ``current_state`` and ``state``,
``fail_counter``/``success_counter``, read/write ``fail_max``, ``reset_timeout``,
``success_threshold`` and ``name``, excluded exceptions, listeners), ``CircuitBreakerListener``,
``CircuitBreakerError``, ``CircuitMemoryStorage`` and the ``STATE_*`` constants.

How it maps onto the core, its thread safety without pybreaker's lock, and every difference
from pybreaker and why: docs/migrating.md, "pybreaker in detail".
"""

from __future__ import annotations

import calendar
import contextlib
import importlib.util
import threading
import time
import types
import weakref
from datetime import datetime, timezone
from functools import wraps
from time import monotonic_ns
from typing import Any, Callable, Generator, Iterable, Iterator, Optional, Sequence, TypeVar, cast

from .. import CircuitBreaker as _SelectedCore
from .._errors import CircuitOpenError, State
from .._options import OUT_FAILURE, OUT_NEUTRAL, OUT_SUCCESS, BreakerOptions
from .._permit import config as _core_config, options, permits
from ._pybreaker_base import (
    MSG_OPEN as _MSG_OPEN,
    MSG_STORAGE as _MSG_STORAGE,
    MSG_TRIAL_FAILED as _MSG_TRIAL_FAILED,
    MSG_TRIAL_RUNNING as _MSG_TRIAL_RUNNING,
    MSG_TRIP as _MSG_TRIP,
    NAMES as _NAMES,
    STATE_CLASSES as _STATE_CLASSES,
    STATE_CLOSED,
    STATE_HALF_OPEN,
    STATE_OPEN,
    CircuitBreakerError,
    CircuitBreakerListener,
    CircuitBreakerState,
    CircuitBreakerStorage,
    CircuitClosedState,
    CircuitHalfOpenState,
    CircuitOpenState,
    CircuitRedisStorage,
)

__all__ = (
    "CircuitBreaker",
    "CircuitBreakerListener",
    "CircuitBreakerError",
    "CircuitMemoryStorage",
    "CircuitRedisStorage",
    "STATE_OPEN",
    "STATE_CLOSED",
    "STATE_HALF_OPEN",
)


#: pybreaker's feature flags: neither optional backend exists here.
HAS_TORNADO_SUPPORT = False
HAS_REDIS_SUPPORT = importlib.util.find_spec("redis") is not None

T = TypeVar("T")

_CLOSED, _OPEN, _HALF_OPEN = State.CLOSED, State.OPEN, State.HALF_OPEN
_GeneratorType = types.GeneratorType
_MIN_TRIAL_TIMEOUT = 1.0  # seconds; the floor of the time a trial call may take


@contextlib.contextmanager
def _own_names() -> Iterator[None]:
    """Validation errors of the core, worded with pybreaker's option names."""
    try:
        yield
    except (TypeError, ValueError) as exc:
        msg = str(exc)
        for core_name, name in (
            ("failure_threshold", "fail_max"),
            ("probe_timeout", "reset_timeout"),
        ):
            if msg.startswith(core_name + " "):
                raise type(exc)(name + msg[len(core_name) :]) from None
        raise


_PUBLIC_HOME = (  # their public home: pickling, help() and the docs name this module
    CircuitBreakerError,
    CircuitBreakerListener,
    CircuitBreakerState,
    CircuitClosedState,
    CircuitOpenState,
    CircuitHalfOpenState,
    CircuitBreakerStorage,
    CircuitRedisStorage,
)
for _cls in _PUBLIC_HOME:
    _cls.__module__ = __name__
del _cls


class CircuitMemoryStorage(CircuitBreakerStorage):
    """In-process storage: sets the initial state of the breaker it is given to, then mirrors it.

    Before it is passed to a ``CircuitBreaker`` it is a plain record (``state``, ``counter``,
    ``success_counter``, ``opened_at``). Once passed, it shows the breaker's live values and is
    read-only: change the breaker with ``open()``, ``half_open()`` and ``close()``.
    """

    def __init__(self, state: str) -> None:
        super().__init__("memory")
        self._state = state
        self._fail_counter = 0
        self._success_counter = 0
        self._opened_at: Optional[datetime] = None
        self._breaker: Optional[CircuitBreaker] = None

    def _writable(self) -> None:
        if self._breaker is not None:
            raise RuntimeError(
                "this CircuitMemoryStorage mirrors a fastbreaker.compat.pybreaker.CircuitBreaker "
                "whose core owns the state: use the breaker's open(), half_open() and close()"
            )

    @property
    def state(self) -> str:
        """The circuit state: ``"closed"``, ``"open"`` or ``"half-open"``."""
        return self._state if self._breaker is None else self._breaker.current_state

    @state.setter
    def state(self, state: str) -> None:
        self._writable()
        self._state = state

    def increment_counter(self) -> None:
        """Add one to the failure counter (before the storage backs a breaker)."""
        self._writable()
        self._fail_counter += 1

    def reset_counter(self) -> None:
        """Set the failure counter to zero (before the storage backs a breaker)."""
        self._writable()
        self._fail_counter = 0

    def increment_success_counter(self) -> None:
        """Add one to the success counter (before the storage backs a breaker)."""
        self._writable()
        self._success_counter += 1

    def reset_success_counter(self) -> None:
        """Set the success counter to zero (before the storage backs a breaker)."""
        self._writable()
        self._success_counter = 0

    @property
    def counter(self) -> int:
        """The consecutive failures (the breaker's ``fail_counter``)."""
        return self._fail_counter if self._breaker is None else self._breaker.fail_counter

    @property
    def success_counter(self) -> int:
        """The consecutive trial successes (the breaker's ``success_counter``)."""
        return self._success_counter if self._breaker is None else self._breaker.success_counter

    @property
    def opened_at(self) -> Optional[datetime]:
        """When the circuit last opened (aware UTC ``datetime``), or None."""
        return self._opened_at if self._breaker is None else self._breaker._opened_at

    @opened_at.setter
    def opened_at(self, value: datetime) -> None:
        self._writable()
        self._opened_at = value


def _calling_block() -> None:
    """What listeners see as ``func`` for a ``with breaker.calling():`` block."""


class CircuitBreaker:
    """pybreaker's ``CircuitBreaker``, driven by fastbreaker's lock-free core.

    ``fail_max`` consecutive system errors open the circuit; after ``reset_timeout`` seconds the
    next call is a trial, and ``success_threshold`` successful trials close it again. Exceptions
    matching ``exclude`` (types or predicates ``exc -> bool``) are not system errors and count as
    successes. See the module docstring for the few deliberate differences from pybreaker.

    ``listeners`` are ``CircuitBreakerListener`` objects; ``state_storage`` is a
    ``CircuitMemoryStorage`` (the default) or a ``CircuitRedisStorage``; ``name`` names the
    breaker; with ``throw_new_error_on_trip`` (the default) the call whose failure opens the
    circuit raises ``CircuitBreakerError`` (with the original error's traceback), else the
    original error; ``dry_run=True`` counts and changes state but never refuses a call.
    """

    #: The core class this compatibility layer drives (tests switch it to each implementation).
    _core_breaker_cls: Any = _SelectedCore

    def __init__(
        self,
        fail_max: int = 5,
        reset_timeout: float = 60,
        success_threshold: int = 1,
        exclude: Optional[Iterable[type[BaseException] | Callable[[Any], bool]]] = None,
        listeners: Optional[Sequence[CircuitBreakerListener]] = None,
        state_storage: Optional[CircuitBreakerStorage] = None,
        name: Optional[str] = None,
        throw_new_error_on_trip: bool = True,
        *,
        dry_run: bool = False,
    ) -> None:
        storage = CircuitMemoryStorage(STATE_CLOSED) if state_storage is None else state_storage
        if isinstance(storage, CircuitRedisStorage):
            if type(self) is not CircuitBreaker:
                raise TypeError("a CircuitRedisStorage backs a CircuitBreaker, not a subclass")
            # The state lives in Redis, not in the core: pybreaker's semantics, I/O per call.
            self.__class__ = _RedisBackedBreaker
            _RedisBackedBreaker._setup(
                cast(_RedisBackedBreaker, self),
                fail_max,
                reset_timeout,
                success_threshold,
                exclude,
                listeners,
                storage,
                name,
                throw_new_error_on_trip,
            )
            return
        if not isinstance(storage, CircuitMemoryStorage):
            raise TypeError(_MSG_STORAGE.format(storage))
        if storage._breaker is not None:
            raise ValueError("this CircuitMemoryStorage already backs another CircuitBreaker")
        initial = storage.state
        if initial not in (STATE_CLOSED, STATE_OPEN, STATE_HALF_OPEN):
            raise ValueError(
                f"Unknown state {initial!r}, valid states: "
                f"{STATE_CLOSED}, {STATE_OPEN}, {STATE_HALF_OPEN}"
            )
        self._lock = threading.RLock()
        self._tls = threading.local()  # .trans: the last transition this thread made
        self._fail_max = fail_max
        self._reset_timeout = reset_timeout
        self._success_threshold = success_threshold
        self._excluded: tuple[Any, ...] = tuple(exclude or ())
        self._listeners: tuple[Any, ...] = tuple(listeners or ())
        self._name = name
        self._throw_new_error_on_trip = throw_new_error_on_trip
        self._dry_run = dry_run
        # pybreaker's counters outside CLOSED (in CLOSED the core counts failures)
        self._open_fails = 0
        self._successes = 0
        self._opened_at: Optional[datetime] = None
        # The generation of the current HALF_OPEN: a permit equal to it is a trial call.
        self._probe_gen: Optional[int] = None
        self._in_manual = False  # a manual transition announces itself, once
        self._lowered = False  # fail_max went below the current failure count
        self._state_obj: CircuitBreakerState = CircuitClosedState(self)

        # The core's clock is monotonic ns plus a skew that half_open() advances to end an open
        # period at once. Neither closure holds the breaker: the compiled core is not tracked by
        # the garbage collector, so a cycle through it would never be freed.
        skew = self._skew = [0]

        def clock() -> int:
            return monotonic_ns() + skew[0]

        ref = weakref.ref(self)

        def on_change(core: Any, old: State, new: State) -> None:
            me = ref()
            if me is not None:
                me._core_changed(old, new)

        with _own_names():
            self._core = type(self)._core_breaker_cls(
                **self._core_options(fail_max, reset_timeout, success_threshold),
                name=name if isinstance(name, str) else None,
                clock=clock,
                dry_run=dry_run,
            )
        self._core_admit, self._core_finish = permits(self._core)
        self._core.on_state_change(on_change)
        self._adopt(storage)
        storage._breaker = self
        self._state_storage: CircuitBreakerStorage = storage

    # -- configuration ---------------------------------------------------------------------------
    @staticmethod
    def _core_options(fail_max: Any, reset_timeout: Any, success_threshold: Any) -> dict[str, Any]:
        # pybreaker compares counters with >=, so thresholds below 1 act as 1 and a negative
        # timeout as 0; other types go to the core's validation (TypeError naming the option).
        if isinstance(fail_max, int) and not isinstance(fail_max, bool):
            fail_max = max(1, fail_max)
        if isinstance(success_threshold, int) and not isinstance(success_threshold, bool):
            success_threshold = max(1, success_threshold)
        if isinstance(reset_timeout, (int, float)) and not isinstance(reset_timeout, bool):
            reset_timeout = max(0, reset_timeout)
            probe_timeout = max(reset_timeout, _MIN_TRIAL_TIMEOUT)
        else:
            probe_timeout = None
        return {
            "failure_threshold": fail_max,
            "reset_timeout": reset_timeout,
            "success_threshold": success_threshold,
            "half_open_max_calls": 1,
            "probe_timeout": probe_timeout,
        }

    def _reconfigure(self, fail_max: Any, reset_timeout: Any, success_threshold: Any) -> None:
        """Give the core new options, keeping its state (call with the lock held)."""
        config = _core_config(self._core)
        with _own_names():
            options = BreakerOptions(
                **self._core_options(fail_max, reset_timeout, success_threshold),
                clock=config.options.clock,
            )
        # In place: the core's config is never replaced, so nothing accumulates however often
        # an option is assigned.
        config.reconfigure(options)

    def _adopt(self, storage: CircuitMemoryStorage) -> None:
        """Start in the storage's state, as pybreaker does, without notifying anyone."""
        state, core = storage._state, self._core
        if state == STATE_CLOSED:
            for _ in range(min(storage._fail_counter, options(core).failure_threshold - 1)):
                core.record_failure()
            return
        with self._lock:
            self._in_manual = True
            try:
                if state == STATE_OPEN:
                    core.trip()
                    period = options(core).reset_ns
                    opened_at = storage._opened_at
                    if opened_at is None:  # pybreaker lets the next call through
                        elapsed = period
                    else:
                        passed = (datetime.now(timezone.utc) - opened_at).total_seconds()
                        elapsed = min(period, max(0, round(passed * 1e9)))
                    self._skew[0] += elapsed
                else:
                    self._force_half_open()
                    self._successes = storage._success_counter
            finally:
                self._in_manual = False
            self._open_fails = storage._fail_counter
            self._opened_at = storage._opened_at
            self._state_obj = _STATE_CLASSES[state](self)

    @property
    def fail_max(self) -> int:
        """The number of consecutive failures that opens the circuit (read/write)."""
        return self._fail_max

    @fail_max.setter
    def fail_max(self, number: int) -> None:
        with self._lock:
            self._reconfigure(number, self._reset_timeout, self._success_threshold)
            self._fail_max = number
            if self._core.state is _CLOSED and self._consec() >= self._threshold():
                self._lowered = True

    @property
    def reset_timeout(self) -> float:
        """Seconds the circuit stays open before a trial call (read/write; applies at once)."""
        return self._reset_timeout

    @reset_timeout.setter
    def reset_timeout(self, timeout: float) -> None:
        with self._lock:
            self._reconfigure(self._fail_max, timeout, self._success_threshold)
            self._reset_timeout = timeout

    @property
    def success_threshold(self) -> int:
        """Successful trial calls needed to close a half-open circuit (read/write)."""
        return self._success_threshold

    @success_threshold.setter
    def success_threshold(self, threshold: int) -> None:
        with self._lock:
            self._reconfigure(self._fail_max, self._reset_timeout, threshold)
            self._success_threshold = threshold

    @property
    def name(self) -> Optional[str]:
        """The breaker's name, for logs (read/write)."""
        return self._name

    @name.setter
    def name(self, name: str) -> None:
        self._name = name

    def _threshold(self) -> int:
        return int(options(self._core).failure_threshold)

    def _consec(self) -> int:
        return int(self._core.metrics().consecutive_failures)

    # -- state and counters ------------------------------------------------------------------------
    @property
    def current_state(self) -> str:
        """``"closed"``, ``"open"`` or ``"half-open"``."""
        return _NAMES[self._core.state]

    @property
    def state(self) -> CircuitBreakerState:
        """The current state object (``.name`` is ``current_state``)."""
        obj = self._state_obj
        name = self.current_state
        if obj.name != name:  # another thread is still announcing this transition
            obj = _STATE_CLASSES[name](self)
        return obj

    @state.setter
    def state(self, state_str: str) -> None:
        if state_str not in (STATE_CLOSED, STATE_OPEN, STATE_HALF_OPEN):
            raise ValueError(
                f"Unknown state {state_str!r}, valid states: "
                f"{STATE_CLOSED}, {STATE_OPEN}, {STATE_HALF_OPEN}"
            )
        if state_str == STATE_OPEN:
            self.open()
        elif state_str == STATE_HALF_OPEN:
            self.half_open()
        else:
            self.close()

    @property
    def fail_counter(self) -> int:
        """Consecutive system errors (kept while open; reset by a success or by closing)."""
        if self._core.state is _CLOSED:
            return self._consec()
        return self._open_fails

    @property
    def success_counter(self) -> int:
        """Consecutive successful trial calls in half-open."""
        return self._successes if self._core.state is _HALF_OPEN else 0

    # -- exclusions and listeners (copy-on-write tuples: calls read them without a lock) ---------
    @property
    def excluded_exceptions(self) -> tuple[Any, ...]:
        """Exception types and predicates whose matches are not system errors."""
        return self._excluded

    def add_excluded_exception(
        self, exception: type[BaseException] | Callable[[Any], bool]
    ) -> None:
        """Exclude an exception type (and its subclasses) or a predicate ``exc -> bool``."""
        with self._lock:
            self._excluded = self._excluded + (exception,)

    def add_excluded_exceptions(
        self, *exceptions: type[BaseException] | Callable[[Any], bool]
    ) -> None:
        """Exclude several ``exceptions``: exception types or predicates."""
        for exc in exceptions:
            self.add_excluded_exception(exc)

    def remove_excluded_exception(
        self, exception: type[BaseException] | Callable[[Any], bool]
    ) -> None:
        """Remove the exclusion ``exception``; ``ValueError`` if it is not there."""
        with self._lock:
            excluded = list(self._excluded)
            excluded.remove(exception)
            self._excluded = tuple(excluded)

    def is_system_error(self, exception: BaseException) -> bool:
        """Whether ``exception`` signals a malfunction (counts as a failure): not excluded."""
        exc_type = type(exception)
        for exclusion in self._excluded:
            if isinstance(exclusion, type):
                if issubclass(exc_type, exclusion):
                    return False
            elif callable(exclusion) and exclusion(exception):
                return False
        return True

    @property
    def listeners(self) -> tuple[Any, ...]:
        """The registered listeners."""
        return self._listeners

    def add_listener(self, listener: CircuitBreakerListener) -> None:
        """Register a listener."""
        with self._lock:
            self._listeners = self._listeners + (listener,)

    def add_listeners(self, *listeners: CircuitBreakerListener) -> None:
        """Register several listeners."""
        for listener in listeners:
            self.add_listener(listener)

    def remove_listener(self, listener: CircuitBreakerListener) -> None:
        """Unregister a listener; ``ValueError`` if it is not registered."""
        with self._lock:
            registered = list(self._listeners)
            registered.remove(listener)
            self._listeners = tuple(registered)

    # -- calls -------------------------------------------------------------------------------------
    def call(self, func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Call ``func(*args, **kwargs)`` under the breaker's rules.

        Raises ``CircuitBreakerError`` when the circuit refuses the call, and (unless
        ``throw_new_error_on_trip=False``) when this call's failure opens it. A generator returned
        by ``func`` is guarded until it is exhausted.
        """
        core = self._core
        if core.state is _CLOSED and not self._listeners:
            # The hot path: a permit and an outcome, both lock-free in the core. Should the
            # state change between the check and the permit, the core still records the outcome
            # exactly; only success_counter could lag until the next transition.
            try:
                permit = self._core_admit()
            except CircuitOpenError:
                return self._call(func, args, kwargs)
            try:
                ret = func(*args, **kwargs)
            except BaseException as exc:
                self._on_error(permit, False, exc)
                raise
            if type(ret) is _GeneratorType:
                return cast(T, self._guard_generator(permit, False, ret))
            self._core_finish(permit, OUT_SUCCESS)
            return ret
        return self._call(func, args, kwargs)

    def _call(self, func: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
        permit, trial = self._admit()
        self._before_call(permit, func, args, kwargs)
        try:
            ret = func(*args, **kwargs)
        except BaseException as exc:
            self._on_error(permit, trial, exc)
            raise
        if type(ret) is _GeneratorType:
            return cast(T, self._guard_generator(permit, trial, ret))
        self._on_success(permit, trial)
        return ret

    @contextlib.contextmanager
    def calling(self) -> Iterator[None]:
        """A context manager: ``with breaker.calling(): ...`` guards the block like a call."""
        permit, trial = self._admit()
        self._before_call(permit, _calling_block, (), {})
        try:
            yield
        except BaseException as exc:
            self._on_error(permit, trial, exc)
            raise
        self._on_success(permit, trial)

    def __call__(self, *call_args: Any, **call_kwargs: bool) -> Callable[..., Any]:
        """``@breaker`` or ``@breaker()``: guard every call of the decorated function (passed as
        the one of ``call_args``; ``call_kwargs`` takes pybreaker's ``__pybreaker_call_async``
        flag, which is refused)."""
        if call_kwargs.pop("__pybreaker_call_async", False):
            raise NotImplementedError(
                "Tornado coroutines are not supported by fastbreaker.compat.pybreaker; "
                "use fastbreaker.CircuitBreaker for asyncio"
            )

        def _outer_wrapper(func: Callable[..., Any]) -> Callable[..., Any]:
            call = self.call  # a subclass's call() sees every call, as in pybreaker

            @wraps(func)
            def _inner_wrapper(*args: Any, **kwargs: Any) -> Any:
                return call(func, *args, **kwargs)

            return _inner_wrapper

        if call_args:
            return _outer_wrapper(*call_args)
        return _outer_wrapper

    def call_async(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Not supported: pybreaker's ``call_async(func, *args, **kwargs)`` is for Tornado
        coroutines."""
        raise NotImplementedError(
            "Tornado coroutines are not supported by fastbreaker.compat.pybreaker; "
            "use fastbreaker.CircuitBreaker for asyncio"
        )

    def _admit(self) -> tuple[int, bool]:
        """A permit for one call and whether it is a trial; ``CircuitBreakerError`` if refused."""
        core = self._core
        if core.state is _OPEN and not self._dry_run and core.retry_after > 0.0:
            raise CircuitBreakerError(_MSG_OPEN)  # without building the core's error
        tls = self._tls
        tls.trans = None
        busy = False
        try:
            permit = self._core_admit()
        except CircuitOpenError as err:
            permit, busy = -1, err.state is _HALF_OPEN
        if permit < 0:
            raise CircuitBreakerError(_MSG_TRIAL_RUNNING if busy else _MSG_OPEN)
        trans = tls.trans
        if trans is not None and trans[1] is _HALF_OPEN:
            # This call ended the open period: it is the first trial of a new generation.
            self._probe_gen = permit
            return permit, True
        return permit, permit == self._probe_gen

    def _before_call(
        self, permit: int, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        try:
            for listener in self._listeners:
                listener.before_call(self, func, *args, **kwargs)
        except BaseException:
            self._core_finish(permit, OUT_NEUTRAL)
            raise

    def _on_success(self, permit: int, trial: bool) -> None:
        core = self._core
        if trial:
            with self._lock:
                tls = self._tls
                tls.trans = None
                self._core_finish(permit, OUT_SUCCESS)
                if tls.trans is None and permit == self._probe_gen and core.state is _HALF_OPEN:
                    self._successes += 1  # a trial success that did not close the circuit yet
                    self._open_fails = 0
        else:
            self._core_finish(permit, OUT_SUCCESS)
        for listener in self._listeners:
            listener.success(self)

    def _on_error(self, permit: int, trial: bool, exc: BaseException) -> None:
        """Record a call that raised ``exc``; the caller re-raises it unless this raises."""
        if not isinstance(exc, Exception):
            self._core_finish(permit, OUT_NEUTRAL)
            return
        try:
            system_error = self.is_system_error(exc)
        except BaseException:
            self._core_finish(permit, OUT_NEUTRAL)
            raise
        if not system_error:
            self._on_success(permit, trial)
            return
        tls = self._tls
        try:
            for listener in self._listeners:
                listener.failure(self, exc)
        finally:
            before = self._consec() if self._lowered and not trial else -1
            tls.trans = None
            self._core_finish(permit, OUT_FAILURE)
            trans = tls.trans
        if trans is None or trans[1] is not _OPEN:
            return
        if before >= 0 and trans[0] is _CLOSED:
            with self._lock:  # fail_max was lowered below the count: pybreaker shows the count
                self._open_fails = max(self._open_fails, before + 1)
        if self._throw_new_error_on_trip and not self._dry_run:
            msg = _MSG_TRIAL_FAILED if trans[0] is _HALF_OPEN else _MSG_TRIP
            raise CircuitBreakerError(msg).with_traceback(exc.__traceback__)

    def _guard_generator(self, permit: int, trial: bool, gen: Any) -> Generator[Any, Any, Any]:
        """Guard a generator returned by the called function until it finishes."""
        try:
            result = yield from gen
        except BaseException as exc:
            self._on_error(permit, trial, exc)
            raise
        self._on_success(permit, trial)
        return result

    # -- transitions ---------------------------------------------------------------------------------
    def _core_changed(self, old: State, new: State) -> None:
        """The core's state-change callback: runs once per transition, in the thread that made it."""
        self._tls.trans = (old, new)
        with self._lock:
            self._lowered = False
            if self._in_manual:
                return  # the manual transition does its own bookkeeping and announcement
            if new is _OPEN:
                self._successes = 0
                self._opened_at = datetime.now(timezone.utc)
                if old is _CLOSED:
                    self._open_fails = self._threshold()
                else:
                    self._open_fails += 1  # a trial call failed, or never reported back
            elif new is _HALF_OPEN:
                self._successes = 0
            else:
                self._open_fails = self._successes = 0
            self._announce(new)

    def _announce(self, new: object) -> None:
        """Tell the listeners (call with the lock held, so announcements keep their order)."""
        old_obj = self._state_obj
        new_obj = _STATE_CLASSES[new](self, old_obj, True)
        self._state_obj = new_obj
        for listener in self._listeners:
            listener.state_change(self, old_obj, new_obj)

    def _force_half_open(self) -> None:
        # The core has no manual half-open: trip, end the open period by advancing the clock
        # skew, and take the trial permit; reporting it as neutral leaves HALF_OPEN with no
        # trial in flight, so the next call is the trial (the same generation: _probe_gen).
        core = self._core
        if core.state is _CLOSED:
            self._open_fails = self._consec()
        core.trip()
        self._skew[0] += options(core).reset_ns
        try:
            permit = self._core_admit()
        except CircuitOpenError:
            return  # another caller has just become the trial
        self._probe_gen = permit
        self._core_finish(permit, OUT_NEUTRAL)

    def open(self) -> bool:
        """Open the circuit now: calls fail until ``reset_timeout`` passes. Returns
        ``throw_new_error_on_trip``, as pybreaker does."""
        with self._lock:
            core = self._core
            self._in_manual = True
            try:
                if core.state is _CLOSED:
                    self._open_fails = self._consec()
                core.trip()
            finally:
                self._in_manual = False
            self._successes = 0
            self._opened_at = datetime.now(timezone.utc)
            self._announce(_OPEN)
        return self._throw_new_error_on_trip

    def half_open(self) -> None:
        """Half-open the circuit now: the next call is a trial."""
        with self._lock:
            self._in_manual = True
            try:
                self._force_half_open()
            finally:
                self._in_manual = False
            self._successes = 0
            self._announce(_HALF_OPEN)

    def close(self) -> None:
        """Close the circuit now, clearing the counters."""
        with self._lock:
            self._in_manual = True
            try:
                self._core.reset()
            finally:
                self._in_manual = False
            self._open_fails = self._successes = 0
            self._probe_gen = None
            self._announce(_CLOSED)


class _RedisBackedBreaker(CircuitBreaker):
    """A ``CircuitBreaker`` whose state is a ``CircuitRedisStorage`` (``CircuitBreaker(...,
    state_storage=CircuitRedisStorage(...))`` makes one): pybreaker's state machine over the
    storage. The counters are updated with atomic INCRs; this process runs at most one trial
    call at a time; outcome bookkeeping and the success and failure listeners run under the
    breaker's lock, the call itself does not."""

    def _setup(
        self,
        fail_max: int,
        reset_timeout: float,
        success_threshold: int,
        exclude: Optional[Iterable[Any]],
        listeners: Optional[Sequence[CircuitBreakerListener]],
        storage: CircuitRedisStorage,
        name: Optional[str],
        throw_new_error_on_trip: bool,
    ) -> None:
        for value, what in ((fail_max, "fail_max"), (success_threshold, "success_threshold")):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{what} must be an int, got {value!r}")
        if isinstance(reset_timeout, bool) or not isinstance(reset_timeout, (int, float)):
            raise TypeError(f"reset_timeout must be a number of seconds, got {reset_timeout!r}")
        self._lock = threading.RLock()
        self._fail_max = fail_max
        self._reset_timeout = reset_timeout
        self._success_threshold = success_threshold
        self._excluded = tuple(exclude or ())
        self._listeners = tuple(listeners or ())
        self._name = name
        self._throw_new_error_on_trip = throw_new_error_on_trip
        self._trial = False
        self._state_storage = storage

    # -- options (plain values: nothing to reconfigure) ------------------------------------------
    @property
    def fail_max(self) -> int:
        return self._fail_max

    @fail_max.setter
    def fail_max(self, number: int) -> None:
        self._fail_max = number

    @property
    def reset_timeout(self) -> float:
        return self._reset_timeout

    @reset_timeout.setter
    def reset_timeout(self, timeout: float) -> None:
        self._reset_timeout = timeout

    @property
    def success_threshold(self) -> int:
        return self._success_threshold

    @success_threshold.setter
    def success_threshold(self, threshold: int) -> None:
        self._success_threshold = threshold

    # -- state ---------------------------------------------------------------------------------
    @property
    def current_state(self) -> str:
        return cast(CircuitRedisStorage, self._state_storage).state

    @property
    def state(self) -> CircuitBreakerState:
        return _STATE_CLASSES[self.current_state](self)

    @state.setter
    def state(self, state_str: str) -> None:
        CircuitBreaker.state.fset(self, state_str)  # type: ignore[attr-defined]

    @property
    def fail_counter(self) -> int:
        return cast(CircuitRedisStorage, self._state_storage).counter

    @property
    def success_counter(self) -> int:
        return cast(CircuitRedisStorage, self._state_storage).success_counter

    def _inc_counter(self) -> None:
        cast(CircuitRedisStorage, self._state_storage).increment_counter()

    def _move(self, new: str) -> None:
        """Store ``new`` and tell the listeners (with the lock held)."""
        storage = cast(CircuitRedisStorage, self._state_storage)
        old = _STATE_CLASSES[storage.state](self)
        if new == STATE_OPEN:
            storage.opened_at = datetime.now(timezone.utc)
        if new != STATE_OPEN:
            storage.reset_success_counter()
        if new == STATE_CLOSED:
            storage.reset_counter()
        storage.state = new
        if new != STATE_CLOSED or self._trial:
            self._trial = False
        new_obj = _STATE_CLASSES[new](self, old, True)
        for listener in self._listeners:
            listener.state_change(self, old, new_obj)

    def open(self) -> bool:
        with self._lock:
            self._move(STATE_OPEN)
        return self._throw_new_error_on_trip

    def half_open(self) -> None:
        with self._lock:
            self._move(STATE_HALF_OPEN)

    def close(self) -> None:
        with self._lock:
            self._move(STATE_CLOSED)

    # -- calls -----------------------------------------------------------------------------------
    def call(self, func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return self._call(func, args, kwargs)

    def _admit(self) -> tuple[int, bool]:
        storage = cast(CircuitRedisStorage, self._state_storage)
        with self._lock:
            state = storage.state
            if state == STATE_OPEN:
                opened_at = storage.opened_at  # whole seconds: timegm gives them back exactly
                opened = None if opened_at is None else calendar.timegm(opened_at.utctimetuple())
                if opened is not None and time.time() - opened < self._reset_timeout:
                    raise CircuitBreakerError(_MSG_OPEN)
                self._move(STATE_HALF_OPEN)
                state = STATE_HALF_OPEN
            if state == STATE_HALF_OPEN:
                if self._trial:
                    raise CircuitBreakerError(_MSG_TRIAL_RUNNING)
                self._trial = True
                return 1, True
            return 0, False

    def _before_call(
        self, permit: int, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        try:
            for listener in self._listeners:
                listener.before_call(self, func, *args, **kwargs)
        except BaseException:
            if permit:
                with self._lock:
                    self._trial = False
            raise

    def _on_success(self, permit: int, trial: bool) -> None:
        storage = cast(CircuitRedisStorage, self._state_storage)
        with self._lock:
            if trial:
                self._trial = False
                storage.increment_success_counter()
                if storage.success_counter >= self._success_threshold:
                    self._move(STATE_CLOSED)
            elif storage.state == STATE_CLOSED:
                storage.reset_counter()
            for listener in self._listeners:
                listener.success(self)

    def _on_error(self, permit: int, trial: bool, exc: BaseException) -> None:
        if not isinstance(exc, Exception):
            if trial:
                with self._lock:
                    self._trial = False
            return
        if not self.is_system_error(exc):
            self._on_success(permit, trial)
            return
        storage = cast(CircuitRedisStorage, self._state_storage)
        msg = None
        with self._lock:
            try:
                for listener in self._listeners:
                    listener.failure(self, exc)
            finally:
                if trial:
                    self._trial = False
                    self._inc_counter()
                    self._move(STATE_OPEN)
                    msg = _MSG_TRIAL_FAILED
                elif storage.state == STATE_CLOSED:  # else admitted before the circuit opened
                    self._inc_counter()
                    if storage.counter >= self._fail_max:
                        self._move(STATE_OPEN)
                        msg = _MSG_TRIP
        if msg is not None and self._throw_new_error_on_trip:
            raise CircuitBreakerError(msg).with_traceback(exc.__traceback__)
