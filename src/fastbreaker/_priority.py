"""Priorities: how important the current request is, from the bottom (shed first) up.

``with fastbreaker.priority(Priority.SHEDDABLE):`` sets the priority of this thread or asyncio
task (a ``contextvars`` variable, like ``deadline()``, so tasks created inside the block inherit
it). Load shedding reads it with ``current_priority()``, which is ``CRITICAL`` where none is set.
The names are those of Google's SRE book ("Handling Overload").
"""

from __future__ import annotations

import contextvars
import enum
import re
from types import TracebackType

__all__ = ["Priority", "current_priority", "priority"]

# An integer as a header carries it: ASCII digits with at most one sign. A longer run of digits
# than this cannot be 0..3 whatever its leading zeros, and int() refuses over 4,300 digits.
_INT_TEXT = re.compile(r"[+-]?[0-9]{1,32}", re.ASCII)


class Priority(enum.IntEnum):
    """Request criticality; higher is more important, and lower priorities are shed first."""

    SHEDDABLE = 0
    SHEDDABLE_PLUS = 1
    CRITICAL = 2
    CRITICAL_PLUS = 3

    @classmethod
    def parse(cls, value: object) -> Priority:
        """A ``Priority`` from a member, its integer value or its name (any case, as in a
        header); anything else is a ``ValueError`` or ``TypeError`` listing what is accepted."""
        if isinstance(value, Priority):
            return value
        if isinstance(value, bool):
            raise TypeError(f"priority must be a Priority, an int 0..3 or a name, got {value!r}")
        if isinstance(value, int):
            try:
                return cls(value)
            except ValueError:
                raise ValueError(f"priority must be in 0..3, got {value}") from None
        if isinstance(value, str):
            text = value.strip()
            if _INT_TEXT.fullmatch(text):
                level = int(text)
                if 0 <= level <= 3:
                    return cls(level)
            elif text.isascii():
                member = cls.__members__.get(text.upper().replace("-", "_"))
                if member is not None:
                    return member
            names = ", ".join(p.name for p in cls)
            shown = repr(value) if len(value) <= 40 else repr(value[:40]) + "..."
            raise ValueError(f"priority must be one of {names} or 0..3, got {shown}")
        raise TypeError(f"priority must be a Priority, an int 0..3 or a name, got {value!r}")


current_var: contextvars.ContextVar[Priority] = contextvars.ContextVar(
    "fastbreaker_priority", default=Priority.CRITICAL
)


def current_priority() -> Priority:
    """The priority of the innermost ``priority()`` block around this code (``CRITICAL`` when
    there is none)."""
    return current_var.get()


def priority(level: Priority | int | str) -> PriorityScope:
    """``with priority(Priority.SHEDDABLE):`` makes ``level`` the current priority inside the
    block (a ``Priority``, its integer value 0..3, or its name). Unlike a deadline, an inner
    block may raise or lower it. Leaving the block restores the previous priority."""
    return PriorityScope(Priority.parse(level))


class PriorityScope:
    """The context manager returned by ``priority()``; use each one in one ``with`` at a time.

    ``level`` is the ``Priority`` the block sets (``priority()`` parses it).
    """

    __slots__ = ("_level", "_token")

    def __init__(self, level: Priority) -> None:
        self._level = level
        self._token: contextvars.Token[Priority] | None = None

    def __enter__(self) -> Priority:
        if self._token is not None:
            raise RuntimeError("this priority() block is already active; call priority() again")
        self._token = current_var.set(self._level)
        return self._level

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._token is not None
        token, self._token = self._token, None
        current_var.reset(token)
