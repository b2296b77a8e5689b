"""The twin breaker's call paths (the counterpart of ``_breaker_calls_c.pxi``): ``call``,
``call_async``, the decorator and ``with``/``async with`` over the permit protocol of ``_calls``
(``_permit_or_raise``, ``_finish``, ``_open_error``), as a base class of ``CircuitBreaker``."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Coroutine, Optional, ParamSpec, TypeVar

from . import _calls
from ._errors import CircuitOpenError, State
from ._options import OUT_NEUTRAL

T = TypeVar("T")
P = ParamSpec("P")
F = TypeVar("F", bound=Callable[..., Any])
B = TypeVar("B", bound="CallPaths")


class CallPaths:
    """The call paths of the twin ``CircuitBreaker`` (its only subclass)."""

    __slots__ = ()

    if TYPE_CHECKING:  # what the paths use of the breaker
        _lock: AbstractContextManager[Any]
        _state: State

        @property
        def name(self) -> Optional[str]: ...

        @property
        def retry_after(self) -> float: ...

        def _acquire(self) -> tuple[int, Optional[tuple[State, State]]]: ...

        def _release(
            self, permit: int, outcome: int, raw: bool = False
        ) -> Optional[tuple[State, State]]: ...

        def _fire(self, trans: Optional[tuple[State, State]]) -> None: ...

    def _admit(self) -> int:
        """Admit a call and announce the transition it made: the permit, or -1."""
        permit, trans = self._acquire()
        if trans is not None:
            try:
                self._fire(trans)
            except BaseException:
                # a callback raised a BaseException (KeyboardInterrupt): the caller never gets
                # the permit, so give it back, or the probe slot stays taken
                if permit >= 0:
                    self._finish(permit, OUT_NEUTRAL)
                raise
        return permit

    def _permit_or_raise(self) -> int:
        permit = self._admit()
        if permit < 0:
            raise self._open_error()
        return permit

    def _open_error(self) -> CircuitOpenError:
        with self._lock:
            state = self._state
        return CircuitOpenError(self.name, state, self.retry_after)

    def _finish(self, permit: int, outcome: int) -> None:
        self._fire(self._release(permit, outcome))

    def call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Call ``fn(*args, **kwargs)`` through the breaker; raise CircuitOpenError if rejected."""
        return _calls.call(self, fn, args, kwargs)

    def call_async(
        self, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs
    ) -> Coroutine[Any, Any, T]:
        """Await ``fn(*args, **kwargs)`` through the breaker."""
        return _calls.call_async(self, fn, args, kwargs)

    def __call__(self, fn: F) -> F:
        """``@breaker``: guard ``fn``, a sync or async function, generator or async generator
        (its signature is kept)."""
        return _calls.decorate(self, fn)  # type: ignore[no-any-return]

    def __enter__(self: B) -> B:
        _calls.enter(self)
        return self

    def __exit__(self, et: Any, exc: Any, tb: Any) -> None:
        _calls.exit(self, exc)

    async def __aenter__(self: B) -> B:
        _calls.enter(self)
        return self

    async def __aexit__(self, et: Any, exc: Any, tb: Any) -> None:
        _calls.exit(self, exc)
