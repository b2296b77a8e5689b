"""The call paths shared by both cores: decorator, ``with``/``async with``, async calls, callbacks.

A core provides the permit API (``_permit_or_raise()``, ``_finish(permit, outcome)``, ``_now()``,
``_config.options``); everything here is plain Python on top of it. The compiled core implements
the synchronous ``call`` itself for speed; ``call`` below is the reference version.

``with breaker:`` needs to remember the permit of each entered block without storing it on the
shared breaker (threads and tasks enter the same breaker concurrently). It keeps a per-context
stack in a ContextVar: every thread and every asyncio task has its own.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
from typing import Any, Awaitable, Callable, Optional, TypeVar

from ._durations import to_seconds
from ._options import OUT_SLOW, OUT_SUCCESS

T = TypeVar("T")

logger = logging.getLogger("fastbreaker")

# A linked stack of (breaker, permit, start_ns, rest) entries, one per open `with` block.
_active: contextvars.ContextVar[Optional[tuple[Any, int, int, Any]]] = contextvars.ContextVar(
    "fastbreaker_active", default=None
)


def success_outcome(breaker: Any, elapsed: object) -> int:
    """OUT_SLOW when ``elapsed`` (seconds or timedelta) reaches ``slow_call_duration``."""
    if elapsed is None:
        return OUT_SUCCESS
    slow_ns = breaker._config.options.slow_ns
    seconds = to_seconds(elapsed, "elapsed")
    return OUT_SLOW if slow_ns and round(seconds * 1e9) >= slow_ns else OUT_SUCCESS


def _timed_outcome(breaker: Any, start: int) -> int:
    slow_ns = breaker._config.options.slow_ns
    return OUT_SLOW if slow_ns and breaker._now() - start >= slow_ns else OUT_SUCCESS


def _start(breaker: Any) -> int:
    return breaker._now() if breaker._config.options.slow_ns else 0


def call(breaker: Any, fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {fn!r}")
    permit = breaker._permit_or_raise()
    start = _start(breaker)
    try:
        result = fn(*args, **kwargs)
    except BaseException as exc:
        breaker._finish(permit, breaker._config.options.classify(exc))
        raise
    breaker._finish(permit, _timed_outcome(breaker, start))
    return result


async def call_async(
    breaker: Any, fn: Callable[..., Awaitable[T]], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> T:
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {fn!r}")
    permit = breaker._permit_or_raise()
    start = _start(breaker)
    try:
        result = await fn(*args, **kwargs)
    except BaseException as exc:
        breaker._finish(permit, breaker._config.options.classify(exc))
        raise
    breaker._finish(permit, _timed_outcome(breaker, start))
    return result


def decorate(breaker: Any, fn: Any) -> Any:
    """``@breaker``: wrap a sync or async function, keeping its signature and metadata."""
    if not callable(fn):
        raise TypeError(f"@breaker needs a callable, got {fn!r}")
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            return await call_async(breaker, fn, args, kwargs)

        return async_wrapper

    breaker_call = breaker.call

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return breaker_call(fn, *args, **kwargs)

    return wrapper


def enter(breaker: Any) -> None:
    permit = breaker._permit_or_raise()
    _active.set((breaker, permit, _start(breaker), _active.get()))


def pop_entry(breaker: Any) -> tuple[int, int]:
    """Remove ``breaker``'s innermost entry from this context's stack: (permit, start_ns)."""
    node = _active.get()
    kept = []
    while node is not None and node[0] is not breaker:
        kept.append(node[:3])
        node = node[3]
    if node is None:
        raise RuntimeError("breaker exited a `with` block that it did not enter in this context")
    _, permit, start, rest = node
    for b, p, s in reversed(kept):
        rest = (b, p, s, rest)
    _active.set(rest)
    return permit, start


def exit(breaker: Any, exc: Optional[BaseException]) -> None:
    permit, start = pop_entry(breaker)
    if exc is None:
        breaker._finish(permit, _timed_outcome(breaker, start))
    else:
        breaker._finish(permit, breaker._config.options.classify(exc))


def fire(breaker: Any, listeners: tuple[Callable[..., Any], ...], hook: Any, old: Any, new: Any) -> None:
    """Run state-change callbacks; one that raises is logged and changes nothing else."""
    for cb in listeners:
        try:
            cb(breaker, old, new)
        except Exception:
            logger.exception("fastbreaker: state-change callback %r raised", cb)
    if hook is not None:
        try:
            hook(breaker, old, new)
        except Exception:
            logger.exception("fastbreaker: state-change hook %r raised", hook)
