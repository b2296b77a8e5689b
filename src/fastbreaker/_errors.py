"""The library's exceptions and the breaker state enum."""

from __future__ import annotations

import enum
import inspect
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

__all__ = [
    "BreakerError",
    "BulkheadFullError",
    "CircuitOpenError",
    "DeadlineExceeded",
    "LoadShedError",
    "RateLimitedError",
    "SharedStateTimeout",
    "State",
    "exception_matcher",
]


class State(enum.IntEnum):
    """The state of a circuit breaker."""

    CLOSED = 0
    OPEN = 1
    HALF_OPEN = 2
    ISOLATED = 3

    def __str__(self) -> str:
        return self.name

    def __format__(self, spec: str) -> str:
        # "{}" and str() show the name; a numeric spec ("{:d}") still formats the int
        return self.name if not spec else int.__format__(self, spec)


def _made_of(**annotations: str) -> inspect.Signature:
    """What ``inspect.signature`` shows for an exception class: its positional arguments (kept
    in ``args``; BaseException takes no keywords). Without it inspect finds none."""
    P = inspect.Parameter
    return inspect.Signature(
        [P(n, P.POSITIONAL_ONLY, annotation=a) for n, a in annotations.items()]
    )


class BreakerError(Exception):
    """Base class of every error fastbreaker raises itself."""

    __signature__ = inspect.Signature(
        [inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL, annotation="object")]
    )


class SharedStateTimeout(BreakerError, TimeoutError):
    """State shared between processes (a ``SharedRegion``) is held by another process for longer
    than the bound: that process is alive but stopped (``SIGSTOP``, a debugger) or stuck.

    Raised by what must change the state and cannot wait: ``trip()``, ``reset()`` and
    ``isolate()`` of a shared breaker, and opening a region or making objects in it. Nothing
    changed; the call may be retried. Admission never raises it (see the shared-memory page).
    """


class CircuitOpenError(BreakerError):
    """A call was rejected because the breaker is OPEN, ISOLATED, or HALF_OPEN with no probe left.

    ``retry_after`` is the number of seconds until a probe may pass (``math.inf`` when ISOLATED).
    """

    # Rejection is a hot path: no Python-level __init__ (the arguments are kept in ``args`` by
    # BaseException in C) and the message is built only when shown.
    args: tuple[str | None, State, float]
    __signature__ = _made_of(name="str | None", state="State", retry_after="float")

    if TYPE_CHECKING:

        def __init__(self, name: str | None, state: State, retry_after: float) -> None: ...

    # Users may construct it themselves (tests, fallbacks) with any arguments: the properties
    # read ``args`` only when it has the breaker's shape, so any instance stays printable.
    @property
    def name(self) -> str | None:
        """The breaker's name."""
        return self.args[0] if len(self.args) == 3 else None

    @property
    def state(self) -> State:
        """The state that rejected the call: OPEN, HALF_OPEN (no probe left) or ISOLATED."""
        return self.args[1] if len(self.args) == 3 else State.OPEN

    @property
    def retry_after(self) -> float:
        """Seconds until a probe may pass (``math.inf`` when ISOLATED)."""
        return self.args[2] if len(self.args) == 3 else 0.0

    def __str__(self) -> str:
        args = self.args
        if (
            len(args) != 3
            or not isinstance(args[1], State)
            or not isinstance(args[2], (int, float))
        ):
            return super().__str__() or "circuit is open"
        label = f"circuit {self.name!r}" if self.name is not None else "circuit"
        if math.isinf(self.retry_after):
            detail = "isolated until reset()"
        else:
            detail = f"retry after {self.retry_after:.3f}s"
        return f"{label} is {self.state.name}: {detail}"


class BulkheadFullError(BreakerError):
    """A bulkhead or adaptive limiter refused a call: every slot was taken and no slot came
    within ``max_wait`` (or the waiting queue was full, or ``max_wait`` is 0).

    ``name`` and ``max_concurrent`` describe the bulkhead (for an ``AdaptiveLimiter``, the limit
    when it refused); ``waited`` is the number of seconds spent waiting, on the bulkhead's clock.
    It is neutral to a breaker it passes through and never retried by ``fastbreaker.retry``: it
    says nothing about the health of the dependency.
    """

    # As CircuitOpenError: no Python-level __init__, the arguments live in ``args``.
    args: tuple[str | None, int, float]
    __signature__ = _made_of(name="str | None", max_concurrent="int", waited="float")

    if TYPE_CHECKING:

        def __init__(self, name: str | None, max_concurrent: int, waited: float) -> None: ...

    @property
    def name(self) -> str | None:
        """The bulkhead's name."""
        return self.args[0] if len(self.args) == 3 else None

    @property
    def max_concurrent(self) -> int:
        """The number of slots when the call was refused."""
        return self.args[1] if len(self.args) == 3 else 0

    @property
    def waited(self) -> float:
        """Seconds spent waiting for a slot before the refusal (0.0 when it failed fast)."""
        return self.args[2] if len(self.args) == 3 else 0.0

    def __str__(self) -> str:
        args = self.args
        if len(args) != 3 or not isinstance(args[1], int) or not isinstance(args[2], (int, float)):
            return super().__str__() or "bulkhead is full"
        label = f"bulkhead {self.name!r}" if self.name is not None else "bulkhead"
        return f"{label} is full: {self.max_concurrent} in flight, waited {self.waited:.3f}s"


class LoadShedError(BreakerError):
    """A load shedder refused a request: this service is over capacity, or the request could not
    be served in time.

    ``reason`` says why: ``"queue_full"`` (no slot and no room to wait), ``"too_old"`` (it waited
    past CoDel's target while congested, or past ``queue_timeout``), ``"priority"`` (displaced by
    a more important request, or not queued while congested because it is ``SHEDDABLE``) or
    ``"deadline"`` (its deadline passed, or too little time was left to start). ``retry_after``
    is a hint in seconds for a ``Retry-After`` header. Like ``BulkheadFullError`` it is neutral to
    a breaker it passes through and never retried by ``fastbreaker.retry``.
    """

    REASONS = ("queue_full", "too_old", "priority", "deadline")

    args: tuple[str | None, str, float]
    __signature__ = _made_of(name="str | None", reason="str", retry_after="float")

    if TYPE_CHECKING:

        def __init__(self, name: str | None, reason: str, retry_after: float) -> None: ...

    @property
    def name(self) -> str | None:
        """The shedder's name."""
        return self.args[0] if len(self.args) == 3 else None

    @property
    def reason(self) -> str:
        """One of ``"queue_full"``, ``"too_old"``, ``"priority"``, ``"deadline"``."""
        return self.args[1] if len(self.args) == 3 else "queue_full"

    @property
    def retry_after(self) -> float:
        """Seconds after which a retry has a chance (a hint for ``Retry-After``)."""
        return self.args[2] if len(self.args) == 3 else 0.0

    def __str__(self) -> str:
        args = self.args
        if len(args) != 3 or not isinstance(args[1], str) or not isinstance(args[2], (int, float)):
            return super().__str__() or "load shed"
        label = f"shedder {self.name!r}" if self.name is not None else "shedder"
        return f"{label} shed the request ({self.reason}), retry after {self.retry_after:.3f}s"


class RateLimitedError(BreakerError):
    """A rate limiter refused a request: admitting it now (or within the ``timeout`` or deadline
    of ``acquire``) would exceed one of its rates.

    ``retry_after`` is the number of seconds until a request of this ``weight`` would be
    admitted (a value for a ``Retry-After`` header); ``name`` is the limiter's name. Like
    ``BulkheadFullError`` it says nothing about the health of a dependency.
    """

    args: tuple[str | None, float, int]
    __signature__ = _made_of(name="str | None", retry_after="float", weight="int")

    if TYPE_CHECKING:

        def __init__(self, name: str | None, retry_after: float, weight: int) -> None: ...

    @property
    def name(self) -> str | None:
        """The limiter's name."""
        return self.args[0] if len(self.args) == 3 else None

    @property
    def retry_after(self) -> float:
        """Seconds until a request of this weight would be admitted."""
        return self.args[1] if len(self.args) == 3 else 0.0

    @property
    def weight(self) -> int:
        """The refused request's weight (units)."""
        return self.args[2] if len(self.args) == 3 else 1

    def __str__(self) -> str:
        args = self.args
        if len(args) != 3 or not isinstance(args[1], (int, float)):
            return super().__str__() or "rate limited"
        label = f"rate limiter {self.name!r}" if self.name is not None else "rate limiter"
        return f"{label} refused weight {self.weight}: retry after {self.retry_after:.3f}s"


class DeadlineExceeded(BreakerError, TimeoutError):
    """The operation's deadline expired (or the next retry would end past it)."""


def not_copyable(obj: object) -> TypeError:
    """The error for ``copy.copy``, ``copy.deepcopy`` and pickling of a stateful object.

    A breaker, map or budget is shared state: a copy would either share it (so that callbacks
    registered on the copy fire for the original) or silently fork it. Both cores refuse.
    """
    return TypeError(
        f"{type(obj).__name__} objects cannot be copied or pickled: create a new one with the "
        f"same options instead"
    )


def label_name(label: object) -> str | None:
    """A breaker's name from its label (a map's key): ``str(label)``, never an exception.

    A rejection must raise ``CircuitOpenError`` whatever the key, so a label whose ``__str__``
    raises falls back to its ``repr``, then to a placeholder naming its type.
    """
    if label is None or type(label) is str:
        return label
    try:
        return str(label)
    except Exception:
        pass
    try:
        return repr(label)
    except Exception:
        return f"<unprintable {type(label).__name__}>"


class Uninitialised:
    """What the slots of a twin object made with ``__new__`` (``__init__`` never ran) hold.

    Every use of it raises ``RuntimeError`` with ``message``, so such an object fails clearly
    wherever it is touched, like the compiled classes. (A ``__getattr__`` on the twin classes
    would say the same, but a class with one loses CPython's specialised attribute loads: the
    twin breaker's ``allow()`` ran 60% slower with it.)
    """

    __slots__ = ("message",)
    message: str

    def __init__(self, message: str) -> None:
        object.__setattr__(self, "message", message)

    def fail(self, *args: object, **kwargs: object) -> Any:
        raise RuntimeError(self.message)

    __getattr__ = __setattr__ = __call__ = __enter__ = __exit__ = fail
    __bool__ = __len__ = __iter__ = __contains__ = __getitem__ = __str__ = fail
    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __hash__ = fail
    __add__ = __sub__ = __mul__ = __truediv__ = __floordiv__ = __index__ = __int__ = fail
    __float__ = fail

    def __repr__(self) -> str:
        return "<not initialised>"


def uninitialised(obj: object, slots: tuple[str, ...], message: str) -> None:
    """Fill ``slots`` of a fresh object with one ``Uninitialised`` that raises ``message``."""
    sentinel = Uninitialised(message)
    for name in slots:
        object.__setattr__(obj, name, sentinel)


def is_uninitialised(value: object) -> bool:
    """Whether ``value`` is the placeholder of a slot that ``__init__`` never filled."""
    return type(value) is Uninitialised


def exception_matcher(on: Any) -> Callable[[Exception], bool]:
    """``on`` (an ``Exception`` subclass, a non-empty tuple of them, or a predicate
    ``exc -> bool``) as a predicate: what ``retry(on=...)``, ``fallback(on=...)`` and
    ``stale_on_error(on=...)`` match. A ``BaseException`` that is not an ``Exception`` is never
    matched (it always propagates), so it is refused as a type here."""
    if isinstance(on, type):
        on = (on,)
    if isinstance(on, tuple):
        if not on or not all(isinstance(t, type) and issubclass(t, Exception) for t in on):
            raise TypeError(
                f"on must be an Exception subclass, a non-empty tuple of them, or a predicate "
                f"exc -> bool (BaseExceptions always propagate), got {on!r}"
            )
        types = on
        return lambda exc: isinstance(exc, types)
    if callable(on):
        return cast(Callable[[Exception], bool], on)
    raise TypeError(
        f"on must be an Exception subclass, a non-empty tuple of them, or a predicate "
        f"exc -> bool, got {on!r}"
    )
