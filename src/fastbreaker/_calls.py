"""The call paths shared by both cores: decorator, ``with``/``async with``, async calls, callbacks.

A core provides the permit API (``_permit_or_raise()``, ``_finish(permit, outcome)``, ``_now()``,
``_config.options``); everything here is plain Python on top of it. The compiled core implements
the synchronous ``call`` itself for speed; ``call`` below is the reference version.

``with breaker:`` needs to remember the permit of each entered block without storing it on the
shared breaker (threads and tasks enter the same breaker concurrently). It keeps a per-context
stack in a ContextVar (every thread and every asyncio task has its own), plus one table of all
open blocks for the blocks that exit in another context (see ``Block`` below).

Every path gives its permit back exactly once, whatever raises between admission and the
outcome: the wrapped call, the ``failure_on`` predicate (``BreakerOptions.classify`` turns its
error into a failure), the clock, or the guarded generator's consumer.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
from typing import Any, Awaitable, Callable, Optional, TypeVar

from ._durations import seconds_to_ns
from ._options import OUT_NEUTRAL, OUT_SLOW, OUT_SUCCESS

T = TypeVar("T")

logger = logging.getLogger("fastbreaker")

# A linked stack of Blocks (below), one per open `with` block.
_active: contextvars.ContextVar[Optional[Any]] = contextvars.ContextVar(
    "fastbreaker_active", default=None
)


def success_outcome(breaker: Any, elapsed: object) -> int:
    """OUT_SLOW when ``elapsed`` (seconds or timedelta) reaches ``slow_call_duration``; a timing
    breaker adds ``elapsed`` to its latency histogram."""
    if elapsed is None:
        return OUT_SUCCESS
    opts = breaker._config.options
    ns = seconds_to_ns(elapsed, "elapsed")  # a finite number >= 0, or a ValueError naming it
    if opts.timed:
        breaker._observe(ns)
    return OUT_SLOW if opts.slow_ns and ns >= opts.slow_ns else OUT_SUCCESS


def timed_outcome(breaker: Any, start: int) -> int:
    """The outcome of a call that returned; a timed call's duration goes to the histogram."""
    opts = breaker._config.options
    if not opts.timed:
        return OUT_SUCCESS
    elapsed = breaker._now() - start
    breaker._observe(elapsed)
    return OUT_SLOW if opts.slow_ns and elapsed >= opts.slow_ns else OUT_SUCCESS


def start_ns(breaker: Any) -> int:
    """Where a timed call starts (``slow_call_duration`` or ``record_latency``), else 0."""
    return breaker._now() if breaker._config.options.timed else 0


# Every step between admission and the outcome may raise (a clock, a predicate, a callback):
# whatever happens, the permit is given back exactly once. A clock that fails before the call
# releases the permit as neutral (nothing ran); one that fails after it records a plain success
# (the dependency answered, its duration is unknown). Then the clock's error propagates.
def start_or_release(breaker: Any, permit: int) -> int:
    """The start time of a timed call (0 if untimed); on a clock error, release ``permit``."""
    try:
        return start_ns(breaker)
    except BaseException:
        breaker._finish(permit, OUT_NEUTRAL)
        raise


def finish_returned(breaker: Any, permit: int, start: int) -> None:
    """Record the outcome of a call that returned (slow or success)."""
    try:
        outcome = timed_outcome(breaker, start)
    except BaseException:
        breaker._finish(permit, OUT_SUCCESS)
        raise
    breaker._finish(permit, outcome)


def finish_raised(breaker: Any, permit: int, start: int, exc: BaseException) -> None:
    """Record the outcome of a call that raised ``exc``; a timed call that failed or succeeded
    (not a neutral one) adds its duration to the histogram after the permit is given back."""
    options = breaker._config.options
    outcome = options.classify(exc)
    breaker._finish(permit, outcome)
    if options.timed and outcome != OUT_NEUTRAL:
        breaker._observe(breaker._now() - start)


def call(breaker: Any, fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {fn!r}")
    permit = breaker._permit_or_raise()
    start = start_or_release(breaker, permit)
    try:
        result = fn(*args, **kwargs)
    except BaseException as exc:
        finish_raised(breaker, permit, start, exc)
        raise
    finish_returned(breaker, permit, start)
    return result


async def call_async(
    breaker: Any, fn: Callable[..., Awaitable[T]], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> T:
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {fn!r}")
    permit = breaker._permit_or_raise()
    start = start_or_release(breaker, permit)
    try:
        result = await fn(*args, **kwargs)
    except BaseException as exc:
        finish_raised(breaker, permit, start, exc)
        raise
    finish_returned(breaker, permit, start)
    return result


async def awaiting(aw: Any) -> Any:
    """A coroutine that awaits ``aw`` (any awaitable): what the compiled core's ``call_async``
    drives when ``fn`` returns something other than a coroutine."""
    return await aw


def throw_into(target: Any, typ: Any, val: Any = None, tb: Any = None) -> Any:
    """``target.throw(typ, val, tb)`` as a coroutine's ``throw`` passes it on (only the
    arguments given); with no target (or one without ``throw``), raise the exception."""
    thrower = getattr(target, "throw", None)
    if thrower is not None:
        if tb is not None:
            return thrower(typ, val, tb)
        if val is not None:
            return thrower(typ, val)
        return thrower(typ)
    if isinstance(typ, BaseException):
        raise typ.with_traceback(tb) if tb is not None else typ
    exc = val if isinstance(val, BaseException) else (typ() if val is None else typ(val))
    raise exc.with_traceback(tb) if tb is not None else exc


def _call_target(fn: Any) -> Any:
    """What ``fn(...)`` runs: ``fn`` itself, or ``fn.__call__`` for a callable instance."""
    if inspect.isroutine(fn) or inspect.isclass(fn) or isinstance(fn, functools.partial):
        return fn
    return getattr(fn, "__call__", fn)


def kind(fn: Any) -> str:
    """How ``@breaker`` must guard ``fn``: "async", "gen", "asyncgen" or "sync".

    An instance whose ``__call__`` is ``async def`` (or a generator) is detected through its
    ``__call__``: ``inspect.iscoroutinefunction`` is False for the instance itself.
    """
    for target in (fn, _call_target(fn)):
        if inspect.iscoroutinefunction(target):
            return "async"
        if inspect.isasyncgenfunction(target):
            return "asyncgen"
        if inspect.isgeneratorfunction(target):
            return "gen"
    return "sync"


def _guard_gen(breaker: Any, fn: Any) -> Any:
    # The permit is taken when iteration starts and held until the generator is exhausted
    # (its return is the outcome), raises (classified) or is closed early (GeneratorExit is a
    # BaseException that is not an Exception: neutral). Creating the generator counts nothing.
    @functools.wraps(fn)
    def gen_wrapper(*args: Any, **kwargs: Any) -> Any:
        permit = breaker._permit_or_raise()
        start = start_or_release(breaker, permit)
        try:
            result = yield from fn(*args, **kwargs)
        except BaseException as exc:
            finish_raised(breaker, permit, start, exc)
            raise
        finish_returned(breaker, permit, start)
        return result

    return gen_wrapper


def _guard_asyncgen(breaker: Any, fn: Any) -> Any:
    # As _guard_gen; async generators have no `yield from`, so values, asend() and athrow()
    # are relayed by hand.
    @functools.wraps(fn)
    async def asyncgen_wrapper(*args: Any, **kwargs: Any) -> Any:
        permit = breaker._permit_or_raise()
        start = start_or_release(breaker, permit)
        try:
            agen = fn(*args, **kwargs)
            try:
                value = await agen.__anext__()
                while True:
                    try:
                        sent = yield value
                    except GeneratorExit:
                        await agen.aclose()
                        raise
                    except BaseException as thrown:
                        value = await agen.athrow(thrown)
                    else:
                        value = await agen.asend(sent)
            except StopAsyncIteration:
                pass
        except BaseException as exc:
            finish_raised(breaker, permit, start, exc)
            raise
        finish_returned(breaker, permit, start)

    return asyncgen_wrapper


def decorate(breaker: Any, fn: Any) -> Any:
    """``@breaker``: wrap a sync or async function, generator or async generator, keeping its
    signature and metadata."""
    if not callable(fn):
        raise TypeError(f"@breaker needs a callable, got {fn!r}")
    how = kind(fn)
    if how == "async":
        call_async_of = breaker.call_async  # the compiled core's is an awaitable, no coroutine

        @functools.wraps(fn)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            return await call_async_of(fn, *args, **kwargs)

        return async_wrapper
    if how == "gen":
        return _guard_gen(breaker, fn)
    if how == "asyncgen":
        return _guard_asyncgen(breaker, fn)

    breaker_call = breaker.call

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return breaker_call(fn, *args, **kwargs)

    return wrapper


# `with breaker:` across contexts. An open block is a `Block` on the per-context stack
# (`_active`), and a key of `_open_blocks`, shared by every thread and task (a dict keyed by
# identity: ordered by entry, so "most recent" has a meaning). A block normally exits where it was
# entered and finds its node on top of its own stack. A generator or async generator closed from
# another thread or task exits in a foreign context: its node is not on that stack, so it takes
# the most recently entered open block of the same breaker from `_open_blocks`. Taking is one
# atomic `dict.pop`: whoever pops a node owns its permit, so every entered block is released
# exactly once, by exactly one exit. A context that later finds its own node taken (a foreign
# exit cannot tell which of several open blocks of a breaker is closing, and may have taken this
# one) skips it and takes the next, so the counts always balance; only the pairing of start time
# and generation between two such blocks can be swapped. Nodes left on a stack by a block that
# exited elsewhere are dropped when that stack is next entered on or walked.
class Block:
    """An open ``with`` block: its breaker, permit, start time and the block it is nested in.

    Immutable once pushed (a child task shares its parent's stack). The compiled core has its
    own equivalent with the same attribute names.
    """

    __slots__ = ("breaker", "permit", "start", "rest")

    def __init__(self, breaker: Any, permit: int, start: int, rest: Any) -> None:
        self.breaker = breaker
        self.permit = permit
        self.start = start
        self.rest = rest


_open_blocks: dict[Any, None] = {}
_MISSING: Any = object()


def enter(breaker: Any) -> None:
    permit = breaker._permit_or_raise()
    start = start_or_release(breaker, permit)
    rest = _active.get()
    while rest is not None and rest not in _open_blocks:
        rest = rest.rest  # a block that exited in another context
    node = Block(breaker, permit, start, rest)
    _open_blocks[node] = None
    _active.set(node)


def pop_entry(breaker: Any) -> tuple[int, int]:
    """Take the entry of the block of ``breaker`` that is exiting: (permit, start_ns)."""
    node = _active.get()
    kept: list[Any] = []
    while node is not None:
        if node not in _open_blocks:
            node = node.rest  # taken by an exit in another context: drop it
            continue
        if node.breaker is breaker:
            if _open_blocks.pop(node, _MISSING) is None:
                rest = node.rest
                for n in reversed(kept):  # re-link the blocks entered after it
                    if _open_blocks.pop(n, _MISSING) is None:
                        rest = type(n)(n.breaker, n.permit, n.start, rest)
                        _open_blocks[rest] = None
                _active.set(rest)
                return node.permit, node.start
            continue  # taken meanwhile by another context: look again
        kept.append(node)
        node = node.rest
    # Not entered in this context: the innermost open block of this breaker entered elsewhere.
    for other in reversed(list(_open_blocks)):
        if other.breaker is breaker and _open_blocks.pop(other, _MISSING) is None:
            return other.permit, other.start
    raise RuntimeError("breaker exited a `with` block that it never entered")


def exit(breaker: Any, exc: Optional[BaseException]) -> None:
    permit, start = pop_entry(breaker)
    if exc is None:
        finish_returned(breaker, permit, start)
    else:
        finish_raised(breaker, permit, start, exc)


def fire(
    breaker: Any, listeners: tuple[Callable[..., Any], ...], hook: Any, old: Any, new: Any
) -> None:
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
