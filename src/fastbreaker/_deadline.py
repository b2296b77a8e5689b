"""Deadlines: one point in time by which a whole operation, retries included, must be done.

A deadline set with ``with fastbreaker.deadline(seconds):`` is the *current* deadline of this
thread or asyncio task (a ``contextvars`` variable, so tasks created inside the block inherit
it). Retries consult it, and code can read it with ``current_deadline()`` to size its own
timeouts. Nested blocks never extend an outer deadline: the earlier one wins.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable
from types import TracebackType

from ._durations import Seconds, seconds_to_ns

__all__ = ["Deadline", "current_deadline", "deadline"]

Clock = Callable[[], int]

current_var: contextvars.ContextVar[Deadline | None] = contextvars.ContextVar(
    "fastbreaker_deadline", default=None
)


def _check_clock(clock: object) -> None:
    if clock is not None and not callable(clock):
        raise TypeError(f"clock must be a zero-argument callable returning int ns, got {clock!r}")


class Deadline:
    """A point in time on a monotonic clock, by which an operation must be done.

    Build one with ``Deadline.after(seconds)``; ``Deadline(at_ns)`` is the deadline at ``at_ns``
    on the clock. ``clock`` (a zero-argument callable returning int nanoseconds, e.g.
    ``fastbreaker.testing.FakeClock``) replaces ``time.monotonic_ns`` in tests.
    """

    __slots__ = ("_at_ns", "_clock")

    def __init__(self, at_ns: int, *, clock: Clock | None = None) -> None:
        if isinstance(at_ns, bool) or not isinstance(at_ns, int):
            raise TypeError(f"at_ns must be an int of nanoseconds, got {at_ns!r}")
        _check_clock(clock)
        self._at_ns = at_ns
        self._clock: Clock = time.monotonic_ns if clock is None else clock

    @classmethod
    def after(cls, seconds: Seconds, *, clock: Clock | None = None) -> Deadline:
        """The deadline ``seconds`` (>= 0, float or ``timedelta``) from now on ``clock``
        (default ``time.monotonic_ns``)."""
        delta = seconds_to_ns(seconds, "seconds")
        _check_clock(clock)
        now = (time.monotonic_ns if clock is None else clock)()
        return cls(now + delta, clock=clock)

    @classmethod
    def _at(cls, at_ns: int, clock: Clock) -> Deadline:
        # Unchecked constructor for the retry hot path.
        self = object.__new__(cls)
        self._at_ns = at_ns
        self._clock = clock
        return self

    @property
    def at_ns(self) -> int:
        """The deadline on its clock, in nanoseconds."""
        return self._at_ns

    def remaining(self) -> float:
        """Seconds left before the deadline (0.0 once it has passed)."""
        return max(0, self._at_ns - self._clock()) / 1e9

    def expired(self) -> bool:
        """Whether the deadline has been reached."""
        return self._clock() >= self._at_ns

    def sub(self, reserve: Seconds = 0.05) -> float:
        """Seconds left minus ``reserve`` (>= 0), never below 0: a timeout for one step that
        leaves ``reserve`` for the work after it (handling the answer, reporting the error)."""
        reserve_ns = seconds_to_ns(reserve, "reserve")
        return max(0, self._at_ns - self._clock() - reserve_ns) / 1e9

    def remaining_ns(self) -> int:
        """Nanoseconds left before the deadline (negative once it has passed)."""
        return self._at_ns - self._clock()

    def __repr__(self) -> str:
        return f"Deadline(remaining={self.remaining():.6f}s)"


def earlier(a: Deadline | None, b: Deadline | None) -> Deadline | None:
    """The earlier of two deadlines (either may be ``None``)."""
    if a is None:
        return b
    if b is None:
        return a
    if a._clock is b._clock:
        return a if a._at_ns <= b._at_ns else b
    # Different clocks (a test clock and the real one): compare what is left on each.
    return a if a.remaining_ns() <= b.remaining_ns() else b


def current_deadline() -> Deadline | None:
    """The deadline of the innermost ``deadline()`` block around this code, or ``None``."""
    return current_var.get()


def deadline(seconds: Seconds | Deadline, *, clock: Clock | None = None) -> DeadlineScope:
    """``with deadline(seconds) as d:`` makes ``d`` the current deadline inside the block.

    ``seconds`` is a float, a ``timedelta`` or a ``Deadline``; the clock starts when the block is
    entered. An outer deadline that is earlier wins (``d`` is then the outer one): nesting never
    extends a deadline. Leaving the block restores the previous deadline; it raises nothing by
    itself (retries and your own code enforce the deadline).
    """
    if not isinstance(seconds, Deadline):
        seconds_to_ns(seconds, "seconds")
    _check_clock(clock)
    return DeadlineScope(seconds, clock)


class DeadlineScope:
    """The context manager returned by ``deadline()``; use each one in one ``with`` at a time.

    ``spec`` (seconds from entering the block, or a ``Deadline``) and ``clock`` are
    ``deadline()``'s arguments, checked there.
    """

    __slots__ = ("_spec", "_clock", "_token")

    def __init__(self, spec: Seconds | Deadline, clock: Clock | None) -> None:
        self._spec = spec
        self._clock = clock
        self._token: contextvars.Token[Deadline | None] | None = None

    def __enter__(self) -> Deadline:
        if self._token is not None:
            raise RuntimeError("this deadline() block is already active; call deadline() again")
        spec = self._spec
        new = spec if isinstance(spec, Deadline) else Deadline.after(spec, clock=self._clock)
        effective = earlier(current_var.get(), new)
        assert effective is not None
        self._token = current_var.set(effective)
        return effective

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._token is not None
        token, self._token = self._token, None
        current_var.reset(token)
