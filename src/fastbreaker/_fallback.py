"""Degraded answers instead of errors: ``fallback`` (a handler's value) and ``stale_on_error``
(the last good result, as RFC 5861's ``stale-if-error``).

Both decorate a sync or ``async def`` function, keep its signature for type checkers, and add
``metrics()`` to the wrapper. A degraded answer never looks like a plain success: it is counted
(``fallbacks`` or ``stale_served``), it starts or extends the run timed by
``fallback_active_seconds``, and it is logged at DEBUG on the ``fastbreaker`` logger with the
exception. Only ``Exception``s become degraded answers: ``asyncio.CancelledError``,
``KeyboardInterrupt``, ``GeneratorExit`` and other ``BaseException``s always propagate.

Put them outermost, above the breaker, so that rejections become degraded answers too::

    @fb.fallback(lambda exc, user_id: DEFAULT_PROFILE)
    @breaker
    def profile(user_id: int) -> Profile: ...

Plain Python, shared by both cores.
"""

from __future__ import annotations

import collections
import functools
import inspect
import logging
import threading
from collections.abc import Awaitable, Callable, Hashable
from time import monotonic_ns
from typing import (
    Any,
    NamedTuple,
    Optional,
    ParamSpec,
    Protocol,
    TypeVar,
    Union,
    cast,
    runtime_checkable,
)

from . import _calls
from ._durations import Seconds, check_clock, read_clock, seconds_to_ns
from ._errors import BulkheadFullError, CircuitOpenError, LoadShedError, exception_matcher
from ._keywords import checks_keywords

__all__ = ["Degraded", "FallbackMetrics", "fallback", "stale_on_error"]

P = ParamSpec("P")
T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

logger = logging.getLogger("fastbreaker")

On = Union[
    type[Exception],
    tuple[type[Exception], ...],
    Callable[[Exception], bool],
]
"""Which errors get a degraded answer: an exception type, a tuple of types, or a predicate."""

REJECTIONS: tuple[type[Exception], ...] = (CircuitOpenError, BulkheadFullError, LoadShedError)
"""``fallback``'s default ``on``: the refusals of a breaker, a bulkhead and a load shedder."""

_MISSING: Any = object()
_KWARGS: Any = object()  # separates positional from keyword arguments in a default cache key


class FallbackMetrics(NamedTuple):
    """A snapshot of the counters of a function wrapped by ``fallback`` or ``stale_on_error``.

    Args:
        calls: every call of the wrapper, whatever its outcome.
        fallbacks: answers given by ``fallback``'s handler (always 0 for ``stale_on_error``).
        stale_served: stale results served by ``stale_on_error`` (always 0 for ``fallback``).
        fallback_active_seconds: seconds since the current unbroken run of degraded answers
            began; 0.0 once a normal answer (or a fresh cached one) has followed it. A call that
            raises leaves it as it was.
    """

    calls: int
    fallbacks: int
    stale_served: int
    fallback_active_seconds: float


@runtime_checkable
class Degraded(Protocol[P, T_co]):
    """What ``fallback`` and ``stale_on_error`` return: the function, plus ``metrics()``."""

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> T_co:
        """Call the function with ``args`` and ``kwargs``: its result, or a degraded answer."""
        ...

    def metrics(self) -> FallbackMetrics:
        """The wrapper's counters (see ``FallbackMetrics``)."""
        ...


def _clock_reader(clock: Optional[Callable[[], int]]) -> Callable[[], int]:
    check_clock(clock)
    if clock is None:
        return monotonic_ns
    return lambda: read_clock(clock)


def _check_target(fn: object, decorator: str) -> bool:
    """Whether ``fn`` is async; TypeError for what the decorator cannot guard."""
    if not callable(fn):
        raise TypeError(f"@{decorator} needs a callable, got {fn!r}")
    how = _calls.kind(fn)
    if how in ("gen", "asyncgen"):
        # Their errors are raised while iterating, after the call has returned: there is no
        # answer to replace, and a cached generator would be served exhausted.
        raise TypeError(f"@{decorator} cannot guard a generator function, got {fn!r}")
    return how == "async"


class _Stats:
    """The counters of one wrapper, behind one lock (held for a few field updates only)."""

    __slots__ = ("lock", "now", "calls", "fallbacks", "stale_served", "since", "name")

    def __init__(self, now: Callable[[], int], fn: object) -> None:
        self.lock = threading.Lock()
        self.now = now
        self.calls = self.fallbacks = self.stale_served = 0
        self.since: Optional[int] = None  # when the current run of degraded answers began
        self.name = getattr(fn, "__qualname__", None) or repr(fn)

    def count_call(self) -> None:
        with self.lock:
            self.calls += 1

    def normal(self) -> None:
        with self.lock:
            self.since = None

    def degraded(self, now: int, exc: Exception, stale: bool) -> None:
        with self.lock:
            if stale:
                self.stale_served += 1
            else:
                self.fallbacks += 1
            if self.since is None:
                self.since = now
        logger.debug(
            "fastbreaker: %s answered %s after %r",
            self.name,
            "with a stale result" if stale else "with its fallback",
            exc,
            exc_info=exc,
        )

    def metrics(self) -> FallbackMetrics:
        """An immutable snapshot of the counters (reads the clock while degraded)."""
        with self.lock:
            calls, fallbacks, stale, since = (
                self.calls,
                self.fallbacks,
                self.stale_served,
                self.since,
            )
        active = 0.0 if since is None else max(0, self.now() - since) / 1e9
        return FallbackMetrics(calls, fallbacks, stale, active)


def _attach(wrapper: Callable[..., Any], stats: _Stats) -> Any:
    cast(Any, wrapper).metrics = stats.metrics
    return wrapper


@checks_keywords
def fallback(
    handler: Callable[..., Any],
    *,
    on: On = REJECTIONS,
    clock: Optional[Callable[[], int]] = None,
) -> Callable[[Callable[P, T]], Degraded[P, T]]:
    """Answer with ``handler(exc, *args, **kwargs)`` when the function raises an ``on`` error.

    By default only rejections (``CircuitOpenError``, ``BulkheadFullError``, ``LoadShedError``)
    are replaced, so that ``@fb.fallback(h)`` above ``@breaker`` answers while the circuit is
    open and lets real errors through. Other errors, an error of the handler and every
    ``BaseException`` that is not an ``Exception`` propagate (the handler's error chained to
    the original one). The wrapper's ``metrics()`` counts ``calls`` and ``fallbacks`` and times
    the current run of fallback answers (``FallbackMetrics``); each fallback answer is logged at
    DEBUG on the ``fastbreaker`` logger.

    For an ``async def`` function the wrapper is ``async def`` and an awaitable result of the
    handler is awaited, so the handler may be sync or async. For a sync function the handler
    must answer synchronously: one that returns an awaitable raises ``TypeError`` at call time
    (a coroutine is closed first, so no "never awaited" warning follows).

    Args:
        handler: called as ``handler(exc, *args, **kwargs)`` with the error and the call's own
            arguments; its result is the answer.
        on: the errors to replace: an ``Exception`` subclass, a non-empty tuple of them, or a
            predicate ``exc -> bool`` (an error of the predicate propagates).
        clock: monotonic time in int nanoseconds (default ``time.monotonic_ns``), read once per
            fallback answer and by ``metrics()``; ``fastbreaker.testing.FakeClock`` in tests.
    """
    if not callable(handler):
        raise TypeError(
            f"handler must be callable as handler(exc, *args, **kwargs), got {handler!r}"
        )
    matches = exception_matcher(on)
    now = _clock_reader(clock)

    def decorate(fn: Callable[P, T]) -> Degraded[P, T]:
        is_async = _check_target(fn, "fallback")
        stats = _Stats(now, fn)
        if is_async:
            afn = cast(Callable[..., Awaitable[Any]], fn)

            @functools.wraps(fn)
            async def async_fallback_call(*args: Any, **kwargs: Any) -> Any:
                stats.count_call()
                try:
                    result = await afn(*args, **kwargs)
                except Exception as exc:
                    if not matches(exc):
                        raise
                    value = handler(exc, *args, **kwargs)
                    if inspect.isawaitable(value):
                        value = await value
                    stats.degraded(now(), exc, stale=False)
                    return value
                stats.normal()
                return result

            return cast(Degraded[P, T], _attach(async_fallback_call, stats))

        @functools.wraps(fn)
        def fallback_call(*args: P.args, **kwargs: P.kwargs) -> T:
            stats.count_call()
            try:
                result = fn(*args, **kwargs)
            except Exception as exc:
                if not matches(exc):
                    raise
                value = handler(exc, *args, **kwargs)
                if inspect.isawaitable(value):
                    if inspect.iscoroutine(value):
                        value.close()
                    raise TypeError(
                        f"handler returned an awaitable ({type(value).__name__}) for the sync "
                        f"function {stats.name}: a sync function needs a sync handler"
                    ) from exc
                stats.degraded(now(), exc, stale=False)
                return cast(T, value)
            stats.normal()
            return result

        return cast(Degraded[P, T], _attach(fallback_call, stats))

    return decorate


class _StaleCache(_Stats):
    """The last good result per key: an LRU ``OrderedDict`` of ``key -> (time_ns, value)``.

    The lock (the counters' own) is held only around dict operations, never across a call.
    """

    __slots__ = ("entries", "ttl_ns", "stale_ns", "max_entries")

    def __init__(
        self,
        now: Callable[[], int],
        fn: object,
        ttl_ns: int,
        stale_ns: int,
        max_entries: int,
    ) -> None:
        super().__init__(now, fn)
        self.entries: collections.OrderedDict[Hashable, tuple[int, Any]] = collections.OrderedDict()
        self.ttl_ns = ttl_ns
        self.stale_ns = stale_ns
        self.max_entries = max_entries

    def fresh(self, key: Hashable, now: int) -> Any:
        """Count the call; the result for ``key`` if younger than ``ttl``, else ``_MISSING``."""
        with self.lock:
            self.calls += 1
            entry = self.entries.get(key)
            if entry is None or now - entry[0] >= self.ttl_ns:
                return _MISSING
            self.entries.move_to_end(key)
            self.since = None  # a fresh answer is a normal one
            return entry[1]

    def store(self, key: Hashable, now: int, value: Any) -> None:
        """Keep a good result (dated ``now``, when its call began) and end a degraded run."""
        with self.lock:
            self.since = None
            old = self.entries.get(key)
            if old is not None and old[0] > now:
                return  # a call that began later has stored a newer result meanwhile
            self.entries[key] = (now, value)
            self.entries.move_to_end(key)
            while len(self.entries) > self.max_entries:
                self.entries.popitem(last=False)

    def stale(self, key: Hashable, now: int) -> Any:
        """The result for ``key`` if younger than ``stale_ttl``, else ``_MISSING``."""
        with self.lock:
            entry = self.entries.get(key)
            if entry is None:
                return _MISSING
            if now - entry[0] >= self.stale_ns:
                del self.entries[key]  # too old to serve, and it only gets older
                return _MISSING
            self.entries.move_to_end(key)
            return entry[1]


def _default_key(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Hashable:
    if not kwargs:
        return args
    return (*args, _KWARGS, *sorted(kwargs.items()))


@checks_keywords
def stale_on_error(
    ttl: Seconds,
    *,
    stale_ttl: Seconds,
    max_entries: int = 1024,
    on: On = (Exception,),
    key: Optional[Callable[..., Hashable]] = None,
    clock: Optional[Callable[[], int]] = None,
) -> Callable[[Callable[P, T]], Degraded[P, T]]:
    """Serve the last good result when the function fails: RFC 5861 ``stale-if-error``.

    Within ``ttl`` seconds of a good result, a call with the same key is answered from it
    without calling the function (a normal answer; ``ttl=0`` always calls). After that the
    function is called: a result replaces the entry; an error matching ``on`` (rejections such
    as ``CircuitOpenError`` included) is answered with the last good result while that result
    is younger than ``stale_ttl`` (a degraded answer, counted in ``stale_served`` and logged at
    DEBUG on the ``fastbreaker`` logger); past that, or with no result for the key, or for any
    other error, the error propagates. Unlike the HTTP directive, ``stale_ttl`` is the total
    age of the result, not the time since it went stale. A result is dated when its call began;
    its age is judged when it is served (the clock is read when a call begins, and again when
    a failure is answered stale).

    At most ``max_entries`` keys are kept, the least recently used (stored, answered fresh or
    served stale) dropped first; an entry found too old to serve is dropped. The cache's lock is
    held only around dict operations, never across the call, so threads call the function in
    parallel. There is no request coalescing: concurrent calls for the same key (threads, or
    tasks of an ``async def`` function) that find no fresh entry each call the function.

    Args:
        ttl: seconds (or ``timedelta``) a good result answers calls without calling, >= 0.
        stale_ttl: seconds (or ``timedelta``) a good result may be served on error, >= ``ttl``.
        max_entries: the most keys kept, an int >= 1.
        on: the errors to answer stale: an ``Exception`` subclass, a non-empty tuple of them,
            or a predicate ``exc -> bool`` (default: every ``Exception``).
        key: ``key(*args, **kwargs)`` makes the cache key, which must be hashable. Default: the
            arguments themselves (then they must be hashable; keyword order does not matter,
            ``f(1)`` and ``f(x=1)`` are different keys); unhashable ones raise ``TypeError``.
        clock: monotonic time in int nanoseconds (default ``time.monotonic_ns``), read once per
            call (twice for a failure), and by ``metrics()``; ``fastbreaker.testing.FakeClock`` in tests.
    """
    ttl_ns = seconds_to_ns(ttl, "ttl")
    stale_ns = seconds_to_ns(stale_ttl, "stale_ttl")
    if stale_ns < ttl_ns:
        raise ValueError(f"stale_ttl must be >= ttl ({ttl!r} seconds), got {stale_ttl!r}")
    if isinstance(max_entries, bool) or not isinstance(max_entries, int):
        raise TypeError(f"max_entries must be an int >= 1, got {max_entries!r}")
    if max_entries < 1:
        raise ValueError(f"max_entries must be an int >= 1, got {max_entries!r}")
    if key is not None and not callable(key):
        raise TypeError(f"key must be None or callable as key(*args, **kwargs), got {key!r}")
    matches = exception_matcher(on)
    now = _clock_reader(clock)
    user_key = key

    def make_key(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Hashable:
        k = _default_key(args, kwargs) if user_key is None else user_key(*args, **kwargs)
        try:
            hash(k)
        except TypeError:
            what = "the arguments" if user_key is None else f"key(...) returned {type(k).__name__}"
            raise TypeError(
                f"stale_on_error needs a hashable cache key: {what} cannot be hashed; pass "
                f"key=... to make one, got {k!r}"
            ) from None
        return k

    def decorate(fn: Callable[P, T]) -> Degraded[P, T]:
        is_async = _check_target(fn, "stale_on_error")
        cache = _StaleCache(now, fn, ttl_ns, stale_ns, max_entries)

        def start(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, Hashable, Any]:
            try:
                t = now()
                k = make_key(args, kwargs)
            except BaseException:
                cache.count_call()
                raise
            return t, k, cache.fresh(k, t)

        def serve_stale(k: Hashable, exc: Exception) -> Any:
            # The age is judged now, when the answer is served: a slow failing call must not
            # serve a result that grew older than stale_ttl while it ran.
            t = now()
            value = cache.stale(k, t)
            if value is not _MISSING:
                cache.degraded(t, exc, stale=True)
            return value

        if is_async:
            afn = cast(Callable[..., Awaitable[Any]], fn)

            @functools.wraps(fn)
            async def async_stale_call(*args: Any, **kwargs: Any) -> Any:
                t, k, value = start(args, kwargs)
                if value is not _MISSING:
                    return value
                try:
                    result = await afn(*args, **kwargs)
                except Exception as exc:
                    if not matches(exc):
                        raise
                    value = serve_stale(k, exc)
                    if value is _MISSING:
                        raise
                    return value
                cache.store(k, t, result)
                return result

            return cast(Degraded[P, T], _attach(async_stale_call, cache))

        @functools.wraps(fn)
        def stale_call(*args: P.args, **kwargs: P.kwargs) -> T:
            t, k, value = start(args, kwargs)
            if value is not _MISSING:
                return cast(T, value)
            try:
                result = fn(*args, **kwargs)
            except Exception as exc:
                if not matches(exc):
                    raise
                value = serve_stale(k, exc)
                if value is _MISSING:
                    raise
                return cast(T, value)
            cache.store(k, t, result)
            return result

        return cast(Degraded[P, T], _attach(stale_call, cache))

    return decorate
