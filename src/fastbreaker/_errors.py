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
        # Rejection is a hot path: the message is built only when shown.
        super().__init__(name, state, retry_after)
        self.name = name
        self.state = state
        self.retry_after = retry_after

    def __str__(self) -> str:
        label = f"circuit {self.name!r}" if self.name is not None else "circuit"
        if math.isinf(self.retry_after):
            detail = "isolated until reset()"
        else:
            detail = f"retry after {self.retry_after:.3f}s"
        return f"{label} is {self.state.name}: {detail}"


class DeadlineExceeded(BreakerError, TimeoutError):
    """The operation's deadline expired (or the next retry would end past it)."""
