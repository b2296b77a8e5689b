"""circuitbreaker 2.1 on fastbreaker's lock-free core: replace the import and nothing else:

    from fastbreaker.compat.circuitbreaker import circuit

    @circuit(failure_threshold=10, expected_exception=ConnectionError)
    def external_call():
        ...

This module offers what circuitbreaker documents: ``circuit`` (bare or with arguments, and
``cls=`` for a subclass), ``CircuitBreaker`` with the class attributes ``FAILURE_THRESHOLD``,
``RECOVERY_TIMEOUT``, ``EXPECTED_EXCEPTION`` and ``FALLBACK_FUNCTION``, decoration of functions,
generators, coroutines and async generators (each keeps its kind), ``call``, ``state``,
``closed``, ``opened``, ``failure_count``, ``open_until``, ``open_remaining``, ``last_failure``,
``name``, ``reset()``, ``CircuitBreakerError`` and ``CircuitBreakerMonitor``.

How it maps onto the core
-------------------------
``failure_threshold`` is the core's consecutive ``failure_threshold`` and ``recovery_timeout`` its
open period; a half-open circuit admits one trial call and closes on its success. The
exception classification is circuitbreaker's and happens here: ``expected_exception`` (a type,
an iterable of types, or a predicate ``(type, value) -> bool``) makes a failure, any other
``Exception`` a success. What users observe is circuitbreaker's: the ``"half_open"`` state name,
``CircuitBreakerError``'s message, ``str(breaker)``, ``open_remaining`` rounded up while positive
and down once past (read from ``monotonic``, a module global that tests may patch), the failure
count going on after the circuit opens, the ``or`` defaults (``0`` means the class default) and
the name taken from the first decorated function.

Known bugs of circuitbreaker, fixed here
----------------------------------------
- It lets every call through in half-open, so a recovering service gets the whole load at once.
  Here exactly one trial call runs; concurrent calls get the fallback or ``CircuitBreakerError``.
- A call that started before the circuit opened and succeeds afterwards closes it (any success
  calls ``reset()``), and a late failure extends the open period. Here the outcome of a call
  admitted before a transition changes nothing (the core's generations).
- ``call()``, ``call_generator()``, ``call_async()``, ``call_async_generator()`` and
  ``with breaker:`` never check the state: only decorated functions are refused. Here they raise
  ``CircuitBreakerError`` when the circuit refuses the call (the fallback remains a decorator
  feature, as before).
- ``BaseException``s that are not ``Exception``s (``asyncio.CancelledError``,
  ``KeyboardInterrupt``, ``GeneratorExit`` when a guarded generator is closed early) count as
  successes there, so cancelling a trial call closes the circuit. Here they count as neither,
  unless ``expected_exception`` matches them.
- ``EXPECTED_EXCEPTION`` is read from the instance's own class only, so a subclass of a subclass
  silently gets ``Exception``. Here the class hierarchy is searched (still through ``__dict__``,
  so a predicate function is not turned into a method).
- There is no locking at all; here the state machine is the core's and is thread-safe.
- ``CircuitBreakerMonitor`` keeps every breaker ever decorated alive; here it holds them weakly
  (a breaker lives as long as the functions it decorates).

Deliberate limits: decorated functions go straight to the core, so they honour
``fallback_function``, ``is_failure`` and the class attributes, but not overrides of ``call*()``,
``opened`` or ``reset()`` (circuitbreaker also calls ``reset()`` after every success; here it is
only called by users). Sync generators are delegated to with ``yield from``, so ``send()`` and
``throw()`` reach them and their return value is kept.
"""

from __future__ import annotations

import contextvars
import threading
import weakref
from datetime import datetime, timedelta, timezone
from functools import wraps
from inspect import isasyncgenfunction, isclass, iscoroutinefunction, isgeneratorfunction
from math import ceil, floor
from time import monotonic
from typing import Any, AnyStr, Callable, Iterable, Iterator, Literal, Optional

from .. import CircuitBreaker as _SelectedCore
from .._durations import seconds_to_ns
from .._errors import CircuitOpenError, State
from .._options import OUT_FAILURE, OUT_NEUTRAL, OUT_SUCCESS
from .._permit import permits

STRING_TYPES = (bytes, str)
STATE_CLOSED = "closed"
STATE_OPEN = "open"
STATE_HALF_OPEN = "half_open"

_CLOSED, _OPEN, _HALF_OPEN = State.CLOSED, State.OPEN, State.HALF_OPEN

# `with breaker:` keeps the permits of the blocks it entered per thread and per asyncio task.
_entered: contextvars.ContextVar[Optional[tuple[Any, int, Any]]] = contextvars.ContextVar(
    "fastbreaker_compat_circuitbreaker", default=None
)


def _clock_ns() -> int:
    """The core's clock: this module's ``monotonic`` (looked up per call, so patchable), in ns."""
    return int(monotonic() * 1e9)


def in_exception_list(*exc_types: type[BaseException]) -> Callable[[type, BaseException], bool]:
    """A failure predicate ``(type, value) -> bool`` matching subclasses of ``exc_types``."""

    def matches_types(thrown_type: type, _: BaseException) -> bool:
        return issubclass(thrown_type, exc_types)

    return matches_types


def build_failure_predicate(expected_exception: Any) -> Callable[[type, BaseException], bool]:
    """Turn ``expected_exception`` into a predicate ``(type, value) -> bool`` (True: failure).

    ``expected_exception`` is an ``Exception`` subclass, an iterable of them, or a predicate;
    a string or anything else raises ``ValueError``, with circuitbreaker's messages.
    """
    if isclass(expected_exception) and issubclass(expected_exception, Exception):
        return in_exception_list(expected_exception)
    try:
        iter(expected_exception)
    except TypeError:
        if not callable(expected_exception) or isclass(expected_exception):
            raise ValueError("expected_exception does not look like a predicate") from None
        predicate: Callable[[type, BaseException], bool] = expected_exception
        return predicate
    if isinstance(expected_exception, STRING_TYPES):
        raise ValueError("expected_exception cannot be a string. Did you mean name?")
    return in_exception_list(*expected_exception)


class CircuitBreaker:
    """circuitbreaker's ``CircuitBreaker``, driven by fastbreaker's lock-free core.

    Subclass it and override the class attributes to change the defaults; an argument that is
    falsy (``None``, ``0``) falls back to them. See the module docstring for the bugs of
    circuitbreaker that this class fixes.

    ``failure_threshold`` consecutive failures open the circuit for ``recovery_timeout``
    seconds; ``expected_exception`` (a type, an iterable of types, or a predicate
    ``(type, value) -> bool``) says what is a failure; ``name`` names the breaker (default: the
    first decorated function's name); ``fallback_function`` answers, with the call's arguments,
    the calls a decorated function refuses; ``dry_run=True`` never refuses.
    """

    FAILURE_THRESHOLD = 5
    RECOVERY_TIMEOUT = 30
    EXPECTED_EXCEPTION: Any = Exception
    FALLBACK_FUNCTION: Optional[Callable[..., Any]] = None

    #: The core class this compatibility layer drives (tests switch it to each implementation).
    _core_breaker_cls: Any = _SelectedCore

    def __init__(
        self,
        failure_threshold: Optional[int] = None,
        recovery_timeout: Optional[float] = None,
        expected_exception: Any = None,
        name: Optional[str] = None,
        fallback_function: Optional[Callable[..., Any]] = None,
        *,
        dry_run: bool = False,
    ) -> None:
        self._last_failure: Optional[BaseException] = None
        self._failure_threshold = failure_threshold or self.FAILURE_THRESHOLD
        self._recovery_timeout = recovery_timeout or self.RECOVERY_TIMEOUT
        seconds_to_ns(self._recovery_timeout, "recovery_timeout")  # validates
        recovery = self._recovery_timeout
        self._recovery_s = recovery.total_seconds() if isinstance(recovery, timedelta) else recovery
        if not expected_exception:
            expected_exception = self._class_expected_exception()
        self.is_failure = build_failure_predicate(expected_exception)
        self._fallback_function = fallback_function or self.FALLBACK_FUNCTION
        self._dry_run = dry_run  # the core never refuses: neither does this layer
        self._name = name
        self._opened = monotonic()
        self._open_failures = 0  # circuitbreaker's failure count outside CLOSED
        self._lock = threading.Lock()
        ref = weakref.ref(self)

        def on_change(core: Any, old: State, new: State) -> None:
            # holds the breaker weakly: the compiled core is not tracked by the garbage collector
            me = ref()
            if me is not None:
                me._core_changed(old, new)

        self._core = type(self)._core_breaker_cls(
            self._failure_threshold,
            self._recovery_s,
            half_open_max_calls=1,
            name=name if isinstance(name, str) else None,
            clock=_clock_ns,
            dry_run=dry_run,
        )
        self._core_admit, self._core_finish = permits(self._core)
        self._core.on_state_change(on_change)

    @classmethod
    def _class_expected_exception(cls) -> Any:
        # Through __dict__, as circuitbreaker does, so that a function stays a plain function;
        # but along the whole hierarchy.
        for klass in cls.__mro__:
            if "EXPECTED_EXCEPTION" in klass.__dict__:
                return klass.__dict__["EXPECTED_EXCEPTION"]
        return Exception

    def _core_changed(self, old: State, new: State) -> None:
        with self._lock:
            if new is _OPEN:
                self._opened = monotonic()
                if old is _CLOSED:
                    self._open_failures = self._failure_threshold
                elif old is _HALF_OPEN:
                    self._open_failures += 1  # the trial call failed, or never reported back
            elif new is _CLOSED:
                self._open_failures = 0
                self._last_failure = None

    # -- decoration ----------------------------------------------------------------------------------
    def __call__(self, wrapped: Callable[..., Any]) -> Callable[..., Any]:
        """``@breaker``: guard ``wrapped``, the decorated function (see ``decorate``)."""
        return self.decorate(wrapped)

    def decorate(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """Guard ``function`` (a function, generator, coroutine or async generator function).

        Names the breaker after the function if it has no name yet and registers it with
        ``CircuitBreakerMonitor``.
        """
        if self._name is None:
            try:
                self._name = function.__qualname__
            except AttributeError:
                self._name = function.__name__
        CircuitBreakerMonitor.register(self)
        if iscoroutinefunction(function) or isasyncgenfunction(function):
            return self._decorate_async(function)
        return self._decorate_sync(function)

    def _decorate_sync(self, function: Callable[..., Any]) -> Callable[..., Any]:
        core = self._core
        finish = self._core_finish
        admit = self._admit

        if isgeneratorfunction(function):

            @wraps(function)
            def gen_wrapper(*args: Any, **kwargs: Any) -> Any:
                permit = admit()
                if permit < 0:
                    fallback = self.fallback_function
                    if fallback:
                        yield from fallback(*args, **kwargs)
                        return
                    raise CircuitBreakerError(self)
                try:
                    result = yield from function(*args, **kwargs)
                except BaseException as exc:
                    self._failed(permit, exc)
                    raise
                self._succeeded(permit)
                return result

            return gen_wrapper

        @wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if core.state is _CLOSED:
                try:
                    permit = self._core_admit()
                except CircuitOpenError:
                    permit = -1
            else:
                permit = admit()
            if permit < 0:
                fallback = self.fallback_function
                if fallback:
                    return fallback(*args, **kwargs)
                raise CircuitBreakerError(self)
            try:
                result = function(*args, **kwargs)
            except BaseException as exc:
                self._failed(permit, exc)
                raise
            finish(permit, OUT_SUCCESS)
            if self._last_failure is not None:
                self._last_failure = None
            return result

        return wrapper

    def _decorate_async(self, function: Callable[..., Any]) -> Callable[..., Any]:
        admit = self._admit

        if isasyncgenfunction(function):

            @wraps(function)
            async def gen_awrapper(*args: Any, **kwargs: Any) -> Any:
                permit = admit()
                if permit < 0:
                    fallback = self.fallback_function
                    if fallback:
                        async for el in fallback(*args, **kwargs):
                            yield el
                        return
                    raise CircuitBreakerError(self)
                try:
                    async for el in function(*args, **kwargs):
                        yield el
                except BaseException as exc:
                    self._failed(permit, exc)
                    raise
                self._succeeded(permit)

            return gen_awrapper

        @wraps(function)
        async def awrapper(*args: Any, **kwargs: Any) -> Any:
            permit = admit()
            if permit < 0:
                fallback = self.fallback_function
                if fallback:
                    return await fallback(*args, **kwargs)
                raise CircuitBreakerError(self)
            try:
                result = await function(*args, **kwargs)
            except BaseException as exc:
                self._failed(permit, exc)
                raise
            self._succeeded(permit)
            return result

        return awrapper

    # -- the permit protocol ----------------------------------------------------------------------------
    def _admit(self) -> int:
        """A permit for one call, or -1 when the circuit refuses it."""
        core = self._core
        if (
            core.state is _OPEN
            and not self._dry_run
            and self._opened + self._recovery_s > monotonic()
        ):
            # Refused without asking the core (which would build an error). This deadline is
            # circuitbreaker's arithmetic; it only refuses, the core decides what it lets through.
            return -1
        try:
            return int(self._core_admit())
        except CircuitOpenError:
            return -1

    def _admit_or_raise(self) -> int:
        permit = self._admit()
        if permit < 0:
            raise CircuitBreakerError(self)
        return permit

    def _succeeded(self, permit: int) -> None:
        self._core_finish(permit, OUT_SUCCESS)
        if self._last_failure is not None:
            self._last_failure = None

    def _failed(self, permit: int, exc: BaseException) -> None:
        try:
            failure = self.is_failure(type(exc), exc)
        except BaseException:
            self._core_finish(permit, OUT_NEUTRAL)
            raise
        if failure:
            self._last_failure = exc
            self._core_finish(permit, OUT_FAILURE)
        elif isinstance(exc, Exception):
            self._succeeded(permit)  # the dependency answered
        else:
            self._core_finish(permit, OUT_NEUTRAL)

    def call(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call ``func(*args, **kwargs)`` through the breaker; ``CircuitBreakerError`` if refused."""
        permit = self._admit_or_raise()
        try:
            result = func(*args, **kwargs)
        except BaseException as exc:
            self._failed(permit, exc)
            raise
        self._succeeded(permit)
        return result

    def call_generator(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Iterate the generator ``func(*args, **kwargs)`` through the breaker."""
        permit = self._admit_or_raise()
        try:
            result = yield from func(*args, **kwargs)
        except BaseException as exc:
            self._failed(permit, exc)
            raise
        self._succeeded(permit)
        return result

    async def call_async(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Await ``func(*args, **kwargs)`` through the breaker."""
        permit = self._admit_or_raise()
        try:
            result = await func(*args, **kwargs)
        except BaseException as exc:
            self._failed(permit, exc)
            raise
        self._succeeded(permit)
        return result

    async def call_async_generator(
        self, func: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Any:
        """Iterate the async generator ``func(*args, **kwargs)`` through the breaker."""
        permit = self._admit_or_raise()
        try:
            async for el in func(*args, **kwargs):
                yield el
        except BaseException as exc:
            self._failed(permit, exc)
            raise
        self._succeeded(permit)

    def __enter__(self) -> None:
        permit = self._admit_or_raise()
        _entered.set((self, permit, _entered.get()))

    def __exit__(self, exc_type: Any, exc_value: Any, _traceback: Any) -> Literal[False]:
        # Pop this breaker's innermost entry (normally the top of the stack).
        node, kept = _entered.get(), []
        while node is not None and node[0] is not self:
            kept.append(node[:2])
            node = node[2]
        if node is None:
            raise RuntimeError(
                "breaker exited a `with` block that it did not enter in this context"
            )
        _, permit, rest = node
        for breaker, other in reversed(kept):
            rest = (breaker, other, rest)
        _entered.set(rest)
        if exc_type is None:
            self._succeeded(permit)
        else:
            self._failed(permit, exc_value if exc_value is not None else exc_type())
        return False

    # -- state ------------------------------------------------------------------------------------------
    def reset(self) -> None:
        """Close the circuit and clear the failure count and the last failure."""
        self._core.reset()
        self._last_failure = None
        self._open_failures = 0

    @property
    def state(self) -> str:
        """``"closed"``, ``"open"``, or ``"half_open"`` once the recovery timeout has passed."""
        state = self._core.state
        if state is _CLOSED:
            return STATE_CLOSED
        if state is _OPEN and self.open_remaining > 0:
            return STATE_OPEN
        return STATE_HALF_OPEN

    @property
    def open_until(self) -> datetime:
        """The approximate (UTC) time when the circuit will let a trial call through."""
        return datetime.now(timezone.utc) + timedelta(seconds=self.open_remaining)

    @property
    def open_remaining(self) -> int:
        """Whole seconds the circuit stays open: rounded up while positive, down once past."""
        remain = (self._opened + self._recovery_s) - monotonic()
        return ceil(remain) if remain > 0 else floor(remain)

    @property
    def failure_count(self) -> int:
        """Consecutive failures; it goes on counting failed trial calls while open."""
        if self._core.state is _CLOSED:
            return int(self._core.metrics().consecutive_failures)
        return self._open_failures

    @property
    def closed(self) -> bool:
        """Whether the state is ``"closed"``."""
        return self.state == STATE_CLOSED

    @property
    def opened(self) -> bool:
        """Whether the state is ``"open"`` (not ``"half_open"``)."""
        return self.state == STATE_OPEN

    @property
    def name(self) -> Optional[str]:
        """The breaker's name: given, or the qualified name of the first decorated function."""
        return self._name

    @property
    def last_failure(self) -> Optional[BaseException]:
        """The exception of the latest failure, until a success or ``reset()`` clears it."""
        return self._last_failure if self.failure_count else None

    @property
    def fallback_function(self) -> Optional[Callable[..., Any]]:
        """Called with the decorated function's arguments instead of raising when open."""
        return self._fallback_function

    def __str__(self) -> str:
        return self.name or "unnamed_CircuitBreaker"


class CircuitBreakerError(Exception):
    """Raised instead of calling the guarded function while the circuit is open."""

    def __init__(self, circuit_breaker: CircuitBreaker, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._circuit_breaker = circuit_breaker

    def __str__(self) -> str:
        cb = self._circuit_breaker
        return 'Circuit "%s" OPEN until %s (%d failures, %d sec remaining) (last_failure: %r)' % (
            cb.name,
            cb.open_until,
            cb.failure_count,
            round(cb.open_remaining),
            cb.last_failure,
        )


class CircuitBreakerMonitor:
    """Every decorated breaker by name, for health checks (held weakly: no leak)."""

    circuit_breakers: Any = weakref.WeakValueDictionary()

    @classmethod
    def register(cls, circuit_breaker: CircuitBreaker) -> None:
        """Register ``circuit_breaker`` under its name (replacing one of the same name)."""
        cls.circuit_breakers[circuit_breaker.name] = circuit_breaker

    @classmethod
    def all_closed(cls) -> bool:
        """Whether no registered breaker is open."""
        return len(list(cls.get_open())) == 0

    @classmethod
    def get_circuits(cls) -> Iterable[CircuitBreaker]:
        """All registered breakers."""
        return list(cls.circuit_breakers.values())

    @classmethod
    def get(cls, name: AnyStr) -> Optional[CircuitBreaker]:
        """The breaker registered under ``name``, or None."""
        breaker: Optional[CircuitBreaker] = cls.circuit_breakers.get(name)
        return breaker

    @classmethod
    def get_open(cls) -> Iterator[CircuitBreaker]:
        """The registered breakers whose state is ``"open"``."""
        for circuit in cls.get_circuits():
            if circuit.opened:
                yield circuit

    @classmethod
    def get_closed(cls) -> Iterator[CircuitBreaker]:
        """The registered breakers whose state is ``"closed"``."""
        for circuit in cls.get_circuits():
            if circuit.closed:
                yield circuit


def circuit(
    failure_threshold: Any = None,
    recovery_timeout: Optional[float] = None,
    expected_exception: Any = None,
    name: Optional[str] = None,
    fallback_function: Optional[Callable[..., Any]] = None,
    cls: type[CircuitBreaker] = CircuitBreaker,
    *,
    dry_run: bool = False,
) -> Any:
    """Decorator: ``@circuit`` or ``@circuit(failure_threshold=..., ..., cls=MyBreaker)``.

    ``failure_threshold``, ``recovery_timeout``, ``expected_exception``, ``name``,
    ``fallback_function`` and ``dry_run`` are ``CircuitBreaker``'s; ``cls`` is the breaker
    class to make (a subclass with other defaults).
    """
    if callable(failure_threshold):  # used bare: the function comes as the first argument
        return cls().decorate(failure_threshold)
    return cls(
        failure_threshold=failure_threshold,
        recovery_timeout=recovery_timeout,
        expected_exception=expected_exception,
        name=name,
        fallback_function=fallback_function,
        dry_run=dry_run,
    )
