"""The permit protocol: how code outside a core admits a call and reports its outcome.

A core (the compiled ``CircuitBreaker`` or its twin) admits a call with a *permit* (the
generation it was admitted in) and takes the outcome back with that permit. The call paths
(``_calls``), the compat layers and the integrations all speak to a breaker through this one
typed protocol, so that no module outside a core reaches into its private attributes:

    admit, finish = permits(breaker)
    permit = admit()                  # or CircuitOpenError
    try:
        result = work()
    except BaseException as exc:
        finish(permit, classify(breaker, exc))
        raise
    finish(permit, OUT_SUCCESS)

Outcomes are the ``OUT_*`` codes of ``_options``. Only this module and the cores know the names
of the private methods behind the protocol.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Protocol, runtime_checkable

from . import _calls
from ._options import OUT_FAILURE, OUT_NEUTRAL, OUT_SLOW, OUT_SUCCESS, BreakerOptions

if TYPE_CHECKING:
    from ._errors import CircuitOpenError

__all__ = [
    "OUT_FAILURE",
    "OUT_NEUTRAL",
    "OUT_SLOW",
    "OUT_SUCCESS",
    "PermitCore",
    "Permits",
    "classify",
    "is_breaker",
    "start_ns",
    "timed_outcome",
    "config",
    "now_ns",
    "open_error",
    "options",
    "permits",
]


class _ConfigLike(Protocol):
    @property
    def options(self) -> BreakerOptions: ...


@runtime_checkable
class PermitCore(Protocol):
    """What both breaker cores provide to the call paths (private to fastbreaker)."""

    def _permit_or_raise(self) -> int:
        """Admit one call: its permit, or raise ``CircuitOpenError``."""
        ...

    def _finish(self, permit: int, outcome: int) -> None:
        """Record the outcome (an ``OUT_*`` code) of the call admitted with ``permit``."""
        ...

    def _now(self) -> int:
        """The breaker's clock, in monotonic nanoseconds."""
        ...

    def _observe(self, elapsed_ns: int) -> None:
        """Add a timed call's duration to the latency histogram (no-op when not timing)."""
        ...

    def _open_error(self) -> CircuitOpenError:
        """The error a rejected call raises, built now."""
        ...

    @property
    def _config(self) -> _ConfigLike: ...


class Permits(NamedTuple):
    """A breaker's permit operations, bound once (no attribute lookups per call)."""

    admit: Callable[[], int]
    finish: Callable[[int, int], None]


def is_breaker(obj: object) -> bool:
    """Whether ``obj`` speaks the permit protocol (a breaker of either core)."""
    return isinstance(obj, PermitCore)


def start_ns(breaker: PermitCore) -> int:
    """Where a timed call starts: the clock when ``slow_call_duration`` or ``record_latency`` is
    set, else 0."""
    return _calls.start_ns(breaker)


def timed_outcome(breaker: PermitCore, start: int) -> int:
    """OUT_SLOW or OUT_SUCCESS for a call that started at ``start`` (see ``start_ns``); a timed
    call's duration goes to the breaker's latency histogram."""
    return _calls.timed_outcome(breaker, start)


def permits(breaker: PermitCore) -> Permits:
    """``(admit, finish)`` bound to ``breaker``."""
    return Permits(breaker._permit_or_raise, breaker._finish)


def config(breaker: PermitCore) -> Any:
    """The breaker's ``Config`` (options, listeners; ``reconfigure()`` changes options in place)."""
    return breaker._config


def options(breaker: PermitCore) -> BreakerOptions:
    """The breaker's validated options (thresholds, durations, classification, clock)."""
    return breaker._config.options


def classify(breaker: PermitCore, exc: BaseException) -> int:
    """The outcome code of a call of ``breaker`` that raised ``exc``."""
    return breaker._config.options.classify(exc)


def now_ns(breaker: PermitCore) -> int:
    """The breaker's clock reading (its ``clock=`` or the monotonic clock), in ns."""
    return breaker._now()


def open_error(breaker: PermitCore) -> Any:
    """The ``CircuitOpenError`` that a call rejected by ``breaker`` now would raise."""
    return breaker._open_error()
