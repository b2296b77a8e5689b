# The compiled core mirrors the pure-Python twin exactly: its types are the twin's.
from collections.abc import Callable, Generator
from types import TracebackType
from typing import Any, final

from ._breaker_py import (
    CircuitBreaker as CircuitBreaker,
    Config as Config,
    Group as Group,
    Metrics as Metrics,
    shared_group_init as shared_group_init,
    shared_group_size as shared_group_size,
    shared_init as shared_init,
    shared_size as shared_size,
)

@final
class WithStack:
    """The open ``with`` blocks of one context: internal."""

    @property
    def open_blocks(self) -> int: ...

def open_with_blocks(breaker: object) -> int:
    """How many ``with`` blocks of ``breaker`` are open in every context (for tests)."""

@final
class GuardedCall:
    """What the compiled ``breaker.call_async(fn, ...)`` returns: await it (internal)."""

    def __await__(self) -> Generator[Any, Any, Any]: ...
    def __iter__(self) -> GuardedCall: ...
    def __next__(self) -> Any: ...
    def send(self, value: Any) -> Any:
        """Send ``value`` into the awaited call (as ``coroutine.send``)."""
    def throw(self, typ: Any, val: Any = None, tb: TracebackType | None = None) -> Any:
        """Raise an exception into the awaited call (as ``coroutine.throw``)."""
    def close(self) -> None:
        """Close the awaited call; a call in flight is recorded as neutral (GeneratorExit)."""

@final
class GuardedFunction:
    """``@breaker`` on a coroutine function, compiled (internal): calling it returns a
    ``GuardedCall``."""

    def __call__(self, *args: Any, **kwargs: Any) -> GuardedCall: ...
    def __get__(
        self, instance: object, owner: type | None = None, /
    ) -> Callable[..., GuardedCall]: ...
