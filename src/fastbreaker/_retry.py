"""Retries that cannot become a storm: full-jitter backoff, a retry budget, and deadlines.

Retries multiply across layers (3 x 3 x 3 = 27 requests per user request), so each retry here
must pass three checks, in this order, before it is sent:

1. the deadline: the explicit ``deadline=`` and the current ``fastbreaker.deadline()`` combined
   (the earlier wins). Expired, or the next delay would end past it: ``DeadlineExceeded``,
   chained from the last error. No budget token is spent when the deadline refuses.
2. the budget (``RetryBudget``): no token, and the last error is re-raised unchanged.
3. ``on_retry(attempt, exc, delay)``, then the full-jitter sleep.

Put a circuit breaker *outside* the retry, so that it sees one outcome per operation and no
retry runs against an open circuit (``CircuitOpenError`` is never retried)::

    budget = fb.RetryBudget()

    @breaker
    @fb.retry(on=ConnectionError, attempts=3, budget=budget)
    def fetch(url: str) -> bytes: ...

All state lives in one call (or one ``retrying()`` loop): a decorated function called from many
threads and tasks at once keeps a separate attempt count per call.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import random as _random
import time
from collections.abc import AsyncIterator, Callable, Iterator
from time import monotonic_ns as _monotonic_ns
from types import TracebackType
from typing import Any, ParamSpec, Protocol, TypeVar, Union, cast

from . import _calls
from ._deadline import Deadline, current_var, earlier
from ._durations import Seconds, seconds_to_ns
from ._errors import (
    BulkheadFullError,
    CircuitOpenError,
    DeadlineExceeded,
    LoadShedError,
    exception_matcher,
)
from ._keywords import check_keywords, checks_keywords, keyword_names
from ._select import COMPILED

__all__ = ["Attempt", "retry", "retrying"]

#: [0, 1); a module global, so that tests (and contrib.httpx, for the same draw) can pin it.
uniform = _random.random

P = ParamSpec("P")
T = TypeVar("T")

On = Union[
    type[Exception],
    tuple[type[Exception], ...],
    Callable[[Exception], bool],
]
"""What to retry: an exception type, a tuple of types, or a predicate ``exc -> bool``."""

OnRetry = Callable[[int, Exception, float], object]


class Budget(Protocol):
    """What ``retry(budget=...)`` needs: ``fastbreaker.RetryBudget`` or anything like it."""

    def allow_retry(self) -> bool: ...

    def record_success(self) -> None: ...


# While fastbreaker.testing.instant_retries() is active this holds one list per active block;
# retries then do not sleep and append each delay to every list instead.
instant_blocks: list[list[float]] = []


def skip_sleep(delay: float) -> bool:
    """Inside ``testing.instant_retries()``: record ``delay`` in every active block and return
    True (the caller does not sleep). Otherwise False."""
    if not instant_blocks:
        return False
    for record in tuple(instant_blocks):
        record.append(delay)
    return True


def sleep(delay: float) -> None:
    """Sleep between attempts (not at all inside ``testing.instant_retries()``)."""
    if not skip_sleep(delay):
        time.sleep(delay)


async def async_sleep(delay: float) -> None:
    """Await between attempts (one scheduling point only inside ``instant_retries()``)."""
    await asyncio.sleep(0 if skip_sleep(delay) else delay)


def _ceiling_ns(n: int, base_ns: int, cap_ns: int) -> int:
    """The upper bound of the delay before retry ``n`` (0-based): ``min(cap, base * 2**n)``.

    Integer nanoseconds: exact, and O(1) for any ``n`` (``cap_ns <= 2**62`` by validation, so
    from ``n = 62`` on any nonzero base has reached the cap).
    """
    if base_ns == 0:
        return 0
    if n >= 62:
        return cap_ns
    return min(cap_ns, base_ns << n)


def jitter(n: int, base_ns: int, cap_ns: int, u: float) -> float:
    """Full jitter: ``u`` in [0, 1) scaled to [0, ceiling] seconds."""
    return u * _ceiling_ns(n, base_ns, cap_ns) / 1e9


class Policy:
    """The validated options of one ``retry``/``retrying``; shared, never mutated."""

    __slots__ = (
        "matches",
        "attempts",
        "base_ns",
        "cap_ns",
        "budget",
        "deadline",
        "deadline_ns",
        "on_retry",
    )

    def __init__(
        self,
        on: On,
        attempts: int,
        base: Seconds,
        cap: Seconds,
        budget: Budget | None,
        deadline: Seconds | Deadline | None,
        on_retry: OnRetry | None,
    ) -> None:
        self.matches = exception_matcher(on)
        if isinstance(attempts, bool) or not isinstance(attempts, int):
            raise TypeError(f"attempts must be an int >= 1, got {attempts!r}")
        if attempts < 1:
            raise ValueError(f"attempts must be >= 1 (it counts the first try), got {attempts!r}")
        self.attempts = attempts
        self.base_ns = seconds_to_ns(base, "base")
        self.cap_ns = seconds_to_ns(cap, "cap")
        if self.cap_ns < self.base_ns:
            raise ValueError(f"cap must be >= base ({base!r} seconds), got {cap!r}")
        if budget is not None and not (
            callable(getattr(budget, "allow_retry", None))
            and callable(getattr(budget, "record_success", None))
        ):
            raise TypeError(f"budget must be a RetryBudget, got {budget!r}")
        self.budget = budget
        self.deadline = deadline
        self.deadline_ns = (
            None
            if deadline is None or isinstance(deadline, Deadline)
            else seconds_to_ns(deadline, "deadline", positive=True)
        )
        if on_retry is not None and not callable(on_retry):
            raise TypeError(f"on_retry must be callable (attempt, exc, delay), got {on_retry!r}")
        self.on_retry = on_retry

    def start(self) -> Deadline | None:
        """The deadline of one operation starting now: explicit and current, the earlier wins."""
        cur = current_var.get()
        own: Deadline
        if self.deadline_ns is not None:
            own = Deadline._at(_monotonic_ns() + self.deadline_ns, _monotonic_ns)
        elif isinstance(self.deadline, Deadline):
            own = self.deadline
        else:
            return cur
        return own if cur is None else earlier(cur, own)

    def after_failure(self, attempt: int, exc: Exception, dl: Deadline | None) -> float | None:
        """Attempt number ``attempt`` failed with ``exc``: the delay before the next attempt, or
        ``None`` to re-raise ``exc`` unchanged. Raises ``DeadlineExceeded`` from ``exc``; an
        error of the user's ``on`` predicate or ``on_retry`` carries ``exc`` as its context
        (callers run this outside their ``except`` block, so Python would not chain it)."""
        try:
            return self._next_delay(attempt, exc, dl)
        except BaseException as err:
            if err is not exc and err.__context__ is None:
                err.__context__ = exc
            raise

    def _next_delay(self, attempt: int, exc: Exception, dl: Deadline | None) -> float | None:
        if isinstance(
            exc, (CircuitOpenError, BulkheadFullError, LoadShedError)
        ) or not self.matches(exc):
            return None
        if attempt >= self.attempts:
            return None
        delay = jitter(attempt - 1, self.base_ns, self.cap_ns, uniform())
        if dl is not None:
            left_ns = dl.remaining_ns()
            if left_ns <= 0:
                raise DeadlineExceeded(
                    f"deadline expired after attempt {attempt} of {self.attempts}"
                ) from exc
            if delay * 1e9 >= left_ns:
                raise DeadlineExceeded(
                    f"retry {attempt} would end past the deadline "
                    f"(delay {delay:.3f}s, {left_ns / 1e9:.3f}s left)"
                ) from exc
        if self.budget is not None and not self.budget.allow_retry():
            return None
        if self.on_retry is not None:
            self.on_retry(attempt, exc, delay)
        return delay


def expired(attempt: int, last: BaseException | None) -> DeadlineExceeded:
    err = DeadlineExceeded(f"deadline expired before attempt {attempt}")
    err.__cause__ = last
    err.__suppress_context__ = True
    return err


@checks_keywords
def retry(
    *,
    on: On,
    attempts: int = 3,
    base: Seconds = 0.05,
    cap: Seconds = 2.0,
    budget: Budget | None = None,
    deadline: Seconds | Deadline | None = None,
    on_retry: OnRetry | None = None,
) -> Callable[[Callable[P, T]], Callable[P, T]]:
    """Retry a sync or async function on ``on`` errors, with full-jitter backoff.

    ``on`` (required) is an exception type, a tuple of types, or a predicate ``exc -> bool``.
    ``attempts`` counts every try including the first. The delay before retry ``n`` (``n = 0``
    for the first retry) is uniform in ``[0, min(cap, base * 2**n)]`` seconds. With a
    ``budget``, a retry is sent only if ``budget.allow_retry()`` (else the last error is
    re-raised unchanged), and every success calls ``budget.record_success()``. ``deadline``
    (seconds per call, or a ``Deadline``) combines with ``fastbreaker.current_deadline()``, the
    earlier winning, and is the current deadline inside the call; when it has expired before an
    attempt, or the next delay would end past it, ``DeadlineExceeded`` is raised from the last
    error. ``on_retry(attempt, exc, delay)`` runs before each sleep (``attempt`` is the 1-based
    number of the attempt that failed). Errors that do not match ``on``, ``CircuitOpenError``,
    ``BulkheadFullError``, ``LoadShedError`` and ``BaseException`` that are not ``Exception``
    propagate at once.

    Put a breaker above the retry (``@breaker`` then ``@fb.retry(...)``) so that it sees one
    outcome per operation.
    """
    return _decorator(Policy(on, attempts, base, cap, budget, deadline, on_retry), _CORE)


_CORE = "c" if COMPILED else "python"


def _decorator(policy: Policy, core: str) -> Callable[[Callable[P, T]], Callable[P, T]]:
    def decorate(fn: Callable[P, T]) -> Callable[P, T]:
        if _calls.kind(fn) == "async":  # an instance with `async def __call__` too
            return cast(Callable[P, T], _async_wrapper(policy, fn))
        return _sync_wrapper(policy, fn, core)

    return decorate


def retry_on_core(core: str) -> Callable[..., Callable[[Callable[P, T]], Callable[P, T]]]:
    """``retry`` whose sync first attempt is ``core``'s (``"c"`` or ``"python"``), for
    ``fastbreaker.testing.implementations()``; same signature and rules as ``retry``."""
    if core not in ("c", "python"):
        raise ValueError(f"core must be 'c' or 'python', got {core!r}")

    signature = inspect.signature(retry)
    accepted = keyword_names(signature)

    @functools.wraps(retry)
    def retry_on(*args: Any, **options: Any) -> Callable[[Callable[P, T]], Callable[P, T]]:
        check_keywords("retry", options, accepted)
        bound = signature.bind(*args, **options)  # retry's own TypeErrors: missing ones
        bound.apply_defaults()
        return _decorator(Policy(**bound.arguments), core)

    return retry_on


def run_from(
    policy: Policy,
    fn: Callable[..., T],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    dl: Deadline | None,
    exc: Exception | None,
) -> T:
    """The rest of a retried sync call, after its lean first attempt (``_retry_c``/``_retry_py``).

    ``exc`` is the error of the first attempt; ``None`` means nothing ran yet because a deadline
    ``dl`` is current (the first attempt checks it here, off the fast path).
    """
    attempt = 1
    if exc is None:
        if dl is not None and dl.expired():
            raise expired(1, None)
        try:
            result = fn(*args, **kwargs)
        except Exception as first:
            exc = first
        else:
            if policy.budget is not None:
                policy.budget.record_success()
            return result
    last = exc
    delay = policy.after_failure(attempt, last, dl)
    if delay is None:
        raise last
    while True:
        sleep(delay)
        attempt += 1
        if dl is not None and dl.expired():
            raise expired(attempt, last)
        try:
            result = fn(*args, **kwargs)
        except Exception as err:
            delay = policy.after_failure(attempt, err, dl)
            if delay is None:
                raise
            last = err
        else:
            if policy.budget is not None:
                policy.budget.record_success()
            return result


def _sync_wrapper(policy: Policy, fn: Callable[P, T], core: str) -> Callable[P, T]:
    # The first attempt is the common case: it is the core's (compiled, or the twin), lean, with
    # no loop and no try/finally; everything after it is run_from.
    if core == "c":
        from ._retry_c import first_attempt
    else:
        from ._retry_py import first_attempt
    retrying_call = cast(Callable[P, T], first_attempt(policy, fn))
    if policy.deadline is None:
        return retrying_call
    return _with_own_deadline(policy, fn, retrying_call)


def _with_own_deadline(policy: Policy, fn: Callable[P, T], call: Callable[P, T]) -> Callable[P, T]:
    # deadline= given: it (or an earlier current one) is the current deadline inside the call,
    # so that the retry loop and any code it calls see the same one.
    @functools.wraps(fn)
    def retrying_call(*args: P.args, **kwargs: P.kwargs) -> T:
        token = current_var.set(policy.start())
        try:
            return call(*args, **kwargs)
        finally:
            current_var.reset(token)

    return retrying_call


def _async_wrapper(policy: Policy, fn: Callable[P, Any]) -> Callable[P, Any]:
    budget = policy.budget
    current = current_var.get

    @functools.wraps(fn)
    async def retrying_call(*args: P.args, **kwargs: P.kwargs) -> Any:
        token = current_var.set(policy.start()) if policy.deadline is not None else None
        try:
            dl = current()
            attempt = 1
            last: Exception | None = None
            while True:
                if dl is not None and dl.expired():
                    raise expired(attempt, last)
                try:
                    result = await fn(*args, **kwargs)
                except Exception as exc:
                    delay = policy.after_failure(attempt, exc, dl)
                    if delay is None:
                        raise
                    last = exc
                else:
                    if budget is not None:
                        budget.record_success()
                    return result
                await async_sleep(delay)
                attempt += 1
        finally:
            if token is not None:
                current_var.reset(token)

    return retrying_call


class Attempt:
    """One attempt of a ``retrying()`` loop: use it as ``with attempt:`` around the work.

    Leaving the block with a retryable error swallows it when another attempt will follow (the
    loop then sleeps and yields that attempt); otherwise the error propagates from the block:
    unchanged when attempts or the budget are used up, or as ``DeadlineExceeded`` chained from
    it when the deadline refuses. ``number`` is 1-based; ``run`` is the loop that made it (the
    loop makes attempts; code does not).
    """

    __slots__ = ("number", "_run", "_token")

    def __init__(self, number: int, run: _Run) -> None:
        self.number = number
        self._run = run
        self._token: Any = None

    def __enter__(self) -> Attempt:
        run = self._run
        if run.explicit:
            self._token = current_var.set(run.dl)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        if self._token is not None:
            current_var.reset(self._token)
            self._token = None
        return self._run.finished(self.number, exc)

    def __repr__(self) -> str:
        return f"<Attempt {self.number}>"


class _Run:
    """The state of one pass over a ``retrying()`` loop."""

    __slots__ = ("policy", "dl", "explicit", "attempt", "delay", "last", "done")

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.explicit = policy.deadline is not None
        self.dl = policy.start()
        self.attempt = 0
        self.delay: float | None = None
        self.last: Exception | None = None
        self.done = False

    def finished(self, number: int, exc: BaseException | None) -> bool:
        # Called from Attempt.__exit__: True swallows exc, because another attempt follows.
        if number != self.attempt or self.done:
            return False  # an attempt object used out of turn: not part of this loop's count
        self.delay = None
        self.done = True  # unless another attempt follows, below
        if exc is None:
            if self.policy.budget is not None:
                self.policy.budget.record_success()
            return False
        if not isinstance(exc, Exception):
            return False
        delay = self.policy.after_failure(number, exc, self.dl)  # may raise DeadlineExceeded
        if delay is None:
            return False
        self.done = False
        self.delay = delay
        self.last = exc
        return True

    def advance(self) -> float | None:
        """Before the next attempt: ``None`` when the loop is over, else the delay to sleep."""
        if self.done or (self.attempt > 0 and self.delay is None):
            # Success, an error that propagated, or a body that did not use `with attempt`.
            self.done = True
            return None
        delay, self.delay = self.delay, None
        return 0.0 if delay is None else delay

    def next_attempt(self) -> Attempt:
        if self.dl is not None and self.dl.expired():
            self.done = True
            last, self.last = self.last, None
            raise expired(self.attempt + 1, last)
        self.attempt += 1
        return Attempt(self.attempt, self)


class _SyncRun(_Run):
    __slots__ = ()

    def __iter__(self) -> Iterator[Attempt]:
        return self

    def __next__(self) -> Attempt:
        delay = self.advance()
        if delay is None:
            raise StopIteration
        if self.attempt > 0:
            sleep(delay)
        return self.next_attempt()


class _AsyncRun(_Run):
    __slots__ = ()

    def __aiter__(self) -> AsyncIterator[Attempt]:
        return self

    async def __anext__(self) -> Attempt:
        delay = self.advance()
        if delay is None:
            raise StopAsyncIteration
        if self.attempt > 0:
            await async_sleep(delay)
        return self.next_attempt()


class Retrying:
    """What ``retrying()`` returns: iterate it with ``for`` (sync) or ``async for`` (async).

    Each loop over it is a separate operation with its own attempt count and deadline.
    ``policy`` holds ``retrying()``'s validated options (``retrying()`` makes it).
    """

    __slots__ = ("_policy",)

    def __init__(self, policy: Policy) -> None:
        self._policy = policy

    def __iter__(self) -> Iterator[Attempt]:
        return _SyncRun(self._policy)

    def __aiter__(self) -> AsyncIterator[Attempt]:
        return _AsyncRun(self._policy)


@checks_keywords
def retrying(
    *,
    on: On,
    attempts: int = 3,
    base: Seconds = 0.05,
    cap: Seconds = 2.0,
    budget: Budget | None = None,
    deadline: Seconds | Deadline | None = None,
    on_retry: OnRetry | None = None,
) -> Retrying:
    """The block form of ``retry``, with the same options and rules (``on``, ``attempts``,
    ``base``, ``cap``, ``budget``, ``deadline``, ``on_retry``)::

        for attempt in fb.retrying(on=ConnectionError, attempts=3):
            with attempt:
                data = fetch()

        async for attempt in fb.retrying(on=ConnectionError):
            with attempt:
                data = await fetch()

    The code after ``with attempt:`` in the loop body runs only after a success or when another
    attempt follows; when the retries are over the error propagates from the ``with`` block.
    """
    return Retrying(Policy(on, attempts, base, cap, budget, deadline, on_retry))
