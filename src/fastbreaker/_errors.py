"""The library's exceptions and the breaker state enum."""

from __future__ import annotations

import enum
import math

__all__ = ["BreakerError", "CircuitOpenError", "DeadlineExceeded", "State"]


class State(enum.IntEnum):
    """The state of a circuit breaker."""

    CLOSED = 0
    OPEN = 1
    HALF_OPEN = 2
    ISOLATED = 3


class BreakerError(Exception):
    """Base class of every error fastbreaker raises itself."""


class CircuitOpenError(BreakerError):
    """A call was rejected because the breaker is OPEN, ISOLATED, or HALF_OPEN with no probe left.

    ``retry_after`` is the number of seconds until a probe may pass (``math.inf`` when ISOLATED).
    """

    def __init__(self, name: str | None, state: State, retry_after: float) -> None:
        self.name = name
        self.state = state
        self.retry_after = retry_after
        label = f"circuit {name!r}" if name is not None else "circuit"
        if math.isinf(retry_after):
            detail = "isolated until reset()"
        else:
            detail = f"retry after {retry_after:.3f}s"
        super().__init__(f"{label} is {state.name}: {detail}")

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (type(self), (self.name, self.state, self.retry_after))


class DeadlineExceeded(BreakerError, TimeoutError):
    """The operation's deadline expired (or the next retry would end past it)."""
