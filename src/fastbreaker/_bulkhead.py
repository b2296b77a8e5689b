"""Bulkheads and adaptive limits: what both cores share (plain Python, imported by both).

A core (``_bulkhead_c`` or ``_bulkhead_py``) owns the counters: one word holding ``in_flight``
and ``waiting``, the limit, and the metric counters. Its fast paths never wait:

* ``try_acquire()`` admits when nobody waits and ``in_flight < floor(limit)`` (one CAS);
* ``release()`` frees a slot when nobody waits (one CAS); when someone waits it takes the slow
  path below, which hands the slot to the oldest waiter.

Waiting lives here, identical for both cores. The queue is a FIFO of ``Waiter`` objects guarded
by the queue lock, and every change of the ``waiting`` count happens under that lock, through the
core's ``_q_*`` methods (each one atomic on the counter word). So:

* **No lost wake-up.** A caller that cannot get a slot becomes a waiter with one atomic step
  (``_q_enter``: admit, or count itself as waiting, or refuse when the queue is full). A release
  that sees ``waiting > 0`` cannot free the slot by the fast path (its CAS expects ``waiting ==
  0``): it takes the queue lock, frees the slot and drains.
* **Fair handoff.** ``drain`` moves a free slot to the oldest live waiter (``_q_transfer``:
  ``in_flight + 1, waiting - 1`` in one CAS) and wakes that waiter alone. A newcomer never barges:
  ``try_acquire`` refuses while anyone waits.
* **No leak.** A waiter ends its wait by ``settle`` under the queue lock. If the slot was handed
  to it, it keeps it (woken or timed out, before its deadline) or passes it on (cancelled,
  interrupted, or the slot came at or after its deadline): ``_q_unreserve`` then ``drain``. If not,
  it leaves the queue (``_q_leave``). Either way the counts stay exact.
* **No timer, thread or task.** A thread waits on its own lock with a timeout; a task awaits its
  own future on its own loop, with a timeout handle on that loop. A waker in another thread
  resolves the future through ``loop.call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import dataclasses
import functools
import math
import threading
from collections.abc import Callable
from typing import Any, Awaitable, Optional, TypeVar

from . import _calls
from ._deadline import Deadline, current_var
from ._durations import Seconds, check_clock, seconds_to_ns
from ._errors import BulkheadFullError, DeadlineExceeded
from ._settle_lock import SettleLock

__all__ = ["BulkheadMetrics"]

T = TypeVar("T")

MAX_CONCURRENT = 1 << 30
"""Upper bound of ``max_concurrent``, ``max_limit`` and ``max_waiting``: each count has 31 bits
of the counter word."""

ALGORITHMS = ("aimd", "gradient")
FIXED, AIMD, GRADIENT = 0, 1, 2
NO_CUT = -(2**63)
"""``last_cut`` before the first decrease: every call started after it."""


@dataclasses.dataclass(frozen=True)
class BulkheadMetrics:
    """A snapshot of a bulkhead's (or adaptive limiter's) counters, cumulative since creation.

    ``rejected`` counts every refusal (a ``False`` from ``try_acquire()``, a full queue, a wait
    that timed out, an acquisition whose deadline had passed); ``timed_out`` and ``cancelled``
    count waits that ended so (a cancelled wait is not a refusal); ``waited`` counts admissions
    that had to wait. ``in_flight`` and ``waiting`` are the slots held and the callers waiting
    now, ``peak_in_flight`` the most slots ever held at once. At quiescence ``in_flight == 0``
    and ``admitted`` equals the releases.
    """

    admitted: int
    rejected: int
    timed_out: int
    cancelled: int
    waited: int
    in_flight: int
    waiting: int
    peak_in_flight: int


# --- validation (shared so that both cores accept and refuse exactly the same input) ------------


def _count(value: object, name: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int in [{lo}, {hi}], got {value!r}")
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {value!r}")
    return value


def _number(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {value!r}")
    return float(value)


def _name(name: object) -> Optional[str]:
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name must be a str or None, got {name!r}")
    return name


# The constructors' parameters, which inspect.signature() shows for the compiled classes (Cython
# gives a class no signature); tests/test_signatures.py keeps them equal to the twins' __init__.
def bulkhead_parameters(
    max_concurrent: int,
    *,
    max_wait: Seconds = 0.0,
    max_waiting: Optional[int] = None,
    name: Optional[str] = None,
    clock: Optional[Callable[[], int]] = None,
) -> None:
    """``Bulkhead``'s parameters (see above)."""


def limiter_parameters(
    initial_limit: float = 20,
    *,
    min_limit: float = 4,
    max_limit: float = 400,
    algorithm: str = "aimd",
    rtt_threshold: Seconds = 0.25,
    backoff: float = 0.9,
    max_wait: Seconds = 0.0,
    max_waiting: Optional[int] = None,
    drop_on: type[BaseException] | tuple[type[BaseException], ...] = (TimeoutError,),
    name: Optional[str] = None,
    clock: Optional[Callable[[], int]] = None,
) -> None:
    """``AdaptiveLimiter``'s parameters (see above)."""


def check_bulkhead(
    max_concurrent: object, max_wait: object, max_waiting: object, name: object, clock: object
) -> tuple[int, float, int, Optional[str]]:
    """Validate a Bulkhead's options: ``(max_concurrent, max_wait_s, max_waiting, name)``."""
    cap = _count(max_concurrent, "max_concurrent", 1, MAX_CONCURRENT)
    wait_s = seconds_to_ns(max_wait, "max_wait") / 1e9
    waiting = cap if max_waiting is None else _count(max_waiting, "max_waiting", 0, MAX_CONCURRENT)
    check_clock(clock)
    return cap, wait_s, waiting, _name(name)


def _exc_types(value: object, name: str) -> tuple[type[BaseException], ...]:
    types = value if isinstance(value, tuple) else (value,)
    for t in types:
        if not (isinstance(t, type) and issubclass(t, BaseException)):
            raise TypeError(f"{name} must be an exception type or a tuple of them, got {value!r}")
    return types


@dataclasses.dataclass(frozen=True)
class LimiterConfig:
    initial: float
    min_limit: float
    max_limit: float
    algorithm: int
    threshold_ns: int
    backoff: float
    max_wait: float
    max_waiting: int
    drop_on: tuple[type[BaseException], ...]
    name: Optional[str]


def check_limiter(
    initial_limit: object,
    min_limit: object,
    max_limit: object,
    algorithm: object,
    rtt_threshold: object,
    backoff: object,
    max_wait: object,
    max_waiting: object,
    drop_on: object,
    name: object,
    clock: object,
) -> LimiterConfig:
    """Validate an AdaptiveLimiter's options."""
    lo = _number(min_limit, "min_limit")
    hi = _number(max_limit, "max_limit")
    if not 1 <= lo <= MAX_CONCURRENT:  # also refuses NaN
        raise ValueError(f"min_limit must be in [1, {MAX_CONCURRENT}], got {min_limit!r}")
    if not 1 <= hi <= MAX_CONCURRENT:
        raise ValueError(f"max_limit must be in [1, {MAX_CONCURRENT}], got {max_limit!r}")
    if lo > hi:
        raise ValueError(f"min_limit must be <= max_limit ({max_limit!r}), got {min_limit!r}")
    init = _number(initial_limit, "initial_limit")
    if not lo <= init <= hi:
        raise ValueError(
            f"initial_limit must be in [min_limit, max_limit] = [{min_limit!r}, {max_limit!r}], "
            f"got {initial_limit!r}"
        )
    if not isinstance(algorithm, str):
        raise TypeError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    threshold_ns = seconds_to_ns(rtt_threshold, "rtt_threshold", positive=True)
    b = _number(backoff, "backoff")
    if not 0.0 < b < 1.0:
        raise ValueError(f"backoff must be in (0, 1), got {backoff!r}")
    wait_s = seconds_to_ns(max_wait, "max_wait") / 1e9
    waiting = (
        int(init) if max_waiting is None else _count(max_waiting, "max_waiting", 0, MAX_CONCURRENT)
    )
    check_clock(clock)
    return LimiterConfig(
        init,
        lo,
        hi,
        AIMD if algorithm == "aimd" else GRADIENT,
        threshold_ns,
        b,
        wait_s,
        waiting,
        _exc_types(drop_on, "drop_on"),
        _name(name),
    )


def rtt_ns(rtt: object) -> int:
    """A ``release(rtt=...)`` argument (seconds or timedelta, finite, >= 0) in ns."""
    return seconds_to_ns(rtt, "rtt")


def aimd(
    limit: float,
    last_cut: int,
    rtt: Optional[int],
    dropped: bool,
    now: int,
    in_flight: int,
    cfg: LimiterConfig,
) -> tuple[float, int]:
    """The AIMD step of one sample (the spec; ``_bulkhead_c`` does the same with two CASes).

    Returns ``(limit, last_cut)``. Decrease on a drop or ``rtt > rtt_threshold``, once per round
    trip: only a call that started (``now - rtt``; a drop without rtt starts now) at or after the
    last decrease may cut. Else grow by ``1 / limit`` while the limit is in use:
    ``in_flight >= 0.9 * floor(limit)``, compared exactly as ``10 * in_flight >= 9 * floor``.
    """
    if dropped or (rtt is not None and rtt > cfg.threshold_ns):
        start = now - (rtt or 0)
        if start >= last_cut:
            return max(cfg.min_limit, limit * cfg.backoff), now
        return limit, last_cut
    if 10 * in_flight >= 9 * int(limit):
        return min(cfg.max_limit, limit + 1.0 / limit), last_cut
    return limit, last_cut


# --- the waiting queue --------------------------------------------------------------------------

WAITING, GRANTED, GONE = 0, 1, 2
# settle() reasons, also the kinds of _q_count(): WOKEN counts an admission that waited,
# TIMED_OUT and EXPIRED a wait that timed out (a refusal), CANCELLED a wait given up, REFUSED a
# refusal without a wait (an acquisition whose deadline had passed, max_wait=0).
WOKEN, TIMED_OUT, EXPIRED, CANCELLED, REFUSED = 0, 1, 2, 3, 4
# _q_enter() results
ADMITTED, QUEUED, FULL = 0, 1, 2


class Waiter:
    """One caller waiting for a slot: its state (changed only under the queue lock) and how to
    wake it (a thread's lock release, or resolving a task's future on its loop)."""

    __slots__ = ("state", "wake")

    def __init__(self, wake: Callable[[], None]) -> None:
        self.state = WAITING
        self.wake = wake


class WaitQueue:
    """The FIFO of waiters of one bulkhead and the lock that guards it and the ``waiting`` count.

    A waiter that leaves is marked GONE and left in place (removing from the middle of a deque is
    O(n)); ``drain`` skips it, and the deque is compacted when dead entries outnumber the live
    ones, so a long run of timeouts with every slot held cannot grow it without bound.
    """

    __slots__ = ("lock", "q", "live")

    def __init__(self) -> None:
        self.lock = SettleLock()
        self.q: collections.deque[Waiter] = collections.deque()
        self.live = 0

    def push(self, w: Waiter) -> None:
        self.q.append(w)
        self.live += 1

    def pop(self) -> Waiter:
        q = self.q
        while True:
            w = q.popleft()  # the core's waiting count > 0 guarantees a live waiter
            if w.state == WAITING:
                self.live -= 1
                return w

    def forget(self, w: Waiter) -> None:
        self.live -= 1
        q = self.q
        if q and q[-1] is w:
            q.pop()
        while q and q[0].state != WAITING:
            q.popleft()
        if len(q) > 2 * self.live + 16:
            self.q = collections.deque(x for x in q if x.state == WAITING)

    def __len__(self) -> int:
        return self.live


def drain(core: Any) -> None:
    """Under the queue lock: hand free slots to the oldest waiters, one waiter per slot."""
    queue: WaitQueue = core._queue
    while core._q_transfer():
        w = queue.pop()
        w.state = GRANTED
        try:
            w.wake()
        except BaseException:
            # Its event loop is closed: nobody can take this slot. Pass it on.
            w.state = GONE
            core._q_unreserve()
            core._q_count(CANCELLED)


def release_slow(core: Any) -> None:
    """``release()`` when someone waits: free the slot and hand it on, under the queue lock
    (deferred to the end of the locked section when this thread holds the lock already: a
    release by the finalizer of a task collected there, see ``_settle_lock``)."""
    core._queue.lock.run_or_defer(functools.partial(_free_and_drain, core))


def _free_and_drain(core: Any) -> None:
    if not core._q_free():
        raise RuntimeError("release() without a matching acquisition: nothing is held")
    drain(core)


def enter(core: Any, wake: Callable[[], None]) -> Optional[Waiter]:
    """Admit at once (``None``), or queue a waiter woken by ``wake``; a full queue raises."""
    queue: WaitQueue = core._queue
    with queue.lock:
        r = core._q_enter()
        if r == ADMITTED:
            return None
        if r == FULL:
            raise BulkheadFullError(core._name, core._cap(), 0.0)
        w = Waiter(wake)
        queue.push(w)
        drain(core)  # a limit that grew meanwhile may have left a slot free
        return w


def settle(core: Any, w: Waiter, reason: int) -> bool:
    """End ``w``'s wait; True if it now holds a slot. See the module docstring."""
    with core._queue.lock:
        return _settle(core, w, reason)


def cancel(core: Any, w: Waiter, exc: BaseException) -> None:
    """``settle(core, w, CANCELLED)`` that never waits for a lock this thread holds: it may run
    from the finalizer of a task collected while this thread is inside a locked section (its
    loop was closed with the task waiting); then it runs when that section ends. A task's own
    cleanup (``GeneratorExit``) waits for no other thread either (see ``_settle_lock``)."""
    core._queue.lock.run_or_defer(
        functools.partial(_settle, core, w, CANCELLED), not isinstance(exc, GeneratorExit)
    )


def _settle(core: Any, w: Waiter, reason: int) -> bool:
    if w.state == GRANTED:
        if reason == WOKEN or reason == TIMED_OUT:
            w.state = GONE
            core._q_count(WOKEN)
            return True
        w.state = GONE
        core._q_unreserve()  # the slot came too late, or the waiter gave up: pass it on
        drain(core)
    elif w.state == GONE:
        return False  # drain found its loop closed: it passed the slot on and counted it
    else:
        w.state = GONE
        core._q_leave()
        core._queue.forget(w)
    core._q_count(reason)
    return False


def _limits(core: Any) -> tuple[float, Optional[Deadline]]:
    """The wait's bound in seconds, and the current deadline if it is the earlier bound."""
    dl = current_var.get()
    wait_s: float = core._max_wait
    if dl is not None:
        left = dl.remaining_ns() / 1e9
        if left <= wait_s:
            return left, dl
    return wait_s, None


def expired_error(core: Any) -> DeadlineExceeded:
    core._q_count(REFUSED)
    return DeadlineExceeded("the deadline expired before a bulkhead slot was acquired")


def _refused(core: Any, w: Waiter, reason: int, start: int) -> BaseException:
    if reason == EXPIRED:
        return DeadlineExceeded("the deadline expired while waiting for a bulkhead slot")
    waited = max(0, core._now() - start) / 1e9
    return BulkheadFullError(core._name, core._cap(), waited)


def _acquired_without_waiting(core: Any) -> bool:
    """The part of an acquisition that never waits, shared by threads and tasks: an expired
    deadline raises, ``max_wait=0`` takes a free slot or raises ``BulkheadFullError``. False
    when the caller is to wait."""
    dl = current_var.get()
    if dl is not None and dl.expired():
        raise expired_error(core)
    if core._max_wait <= 0:
        if core.try_acquire():
            return True
        raise BulkheadFullError(core._name, core._cap(), 0.0)
    return False


def acquire(core: Any) -> None:
    """Blocking acquisition for ``with`` and ``call`` (their fast path covers only the case with
    no current deadline and a free slot). Waits up to ``max_wait`` and the current deadline."""
    if _acquired_without_waiting(core):
        return
    start = core._now()
    lock = threading.Lock()
    lock.acquire()
    w = enter(core, lock.release)
    if w is None:
        return
    timeout, dl = _limits(core)
    try:
        woke = lock.acquire(timeout=max(0.0, timeout))
    except BaseException as exc:
        cancel(core, w, exc)
        raise
    reason = WOKEN if woke else TIMED_OUT
    if dl is not None and dl.expired():
        reason = EXPIRED
    if not settle(core, w, reason):
        raise _refused(core, w, reason, start)


def _resolve(fut: asyncio.Future[bool], value: bool) -> None:
    if not fut.done():
        fut.set_result(value)


async def acquire_async(core: Any) -> None:
    """``acquire`` for a task: the wait is a future on the task's own loop."""
    if _acquired_without_waiting(core):
        return
    start = core._now()
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[bool] = loop.create_future()
    tid = threading.get_ident()

    def wake() -> None:
        if threading.get_ident() == tid:
            _resolve(fut, True)
        else:
            loop.call_soon_threadsafe(_resolve, fut, True)

    w = enter(core, wake)
    if w is None:
        return
    timeout, dl = _limits(core)
    handle = loop.call_later(max(0.0, timeout), _resolve, fut, False)
    try:
        woke = await fut
    except BaseException as exc:
        cancel(core, w, exc)
        raise
    finally:
        handle.cancel()
    reason = WOKEN if woke else TIMED_OUT
    if dl is not None and dl.expired():
        reason = EXPIRED
    if not settle(core, w, reason):
        raise _refused(core, w, reason, start)


# --- call paths ---------------------------------------------------------------------------------

# An open `with limiter:` block remembers when it started (for the RTT) in a per-context linked
# stack: threads and tasks enter the same limiter concurrently. An exit that finds no entry of
# its limiter (a generator closed from another context) releases with no sample.
_starts: contextvars.ContextVar[Optional[tuple[Any, int, Any]]] = contextvars.ContextVar(
    "fastbreaker_limiter_starts", default=None
)


def push_start(core: Any, start: int) -> None:
    _starts.set((core, start, _starts.get()))


def pop_start(core: Any) -> Optional[int]:
    node = _starts.get()
    kept: list[Any] = []
    while node is not None:
        if node[0] is core:
            rest = node[2]
            for c, s, _ in reversed(kept):
                rest = (c, s, rest)
            _starts.set(rest)
            return node[1]
        kept.append(node)
        node = node[2]
    return None


def call(core: Any, fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {fn!r}")
    if current_var.get() is not None or not core._try_admit():
        acquire(core)
    start = core._start_or_release()
    try:
        result = fn(*args, **kwargs)
    except BaseException as exc:
        core._done(start, exc)
        raise
    core._done(start, None)
    return result


async def call_async(
    core: Any, fn: Callable[..., Awaitable[T]], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> T:
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {fn!r}")
    if current_var.get() is not None or not core._try_admit():
        await acquire_async(core)
    start = core._start_or_release()
    try:
        result = await fn(*args, **kwargs)
    except BaseException as exc:
        core._done(start, exc)
        raise
    core._done(start, None)
    return result


def decorate(core: Any, fn: Any) -> Any:
    """``@bulkhead``: wrap a sync or async function (its signature and metadata are kept)."""
    if not callable(fn):
        raise TypeError(f"@bulkhead needs a callable, got {fn!r}")
    how = _calls.kind(fn)
    if how in ("gen", "asyncgen"):
        raise TypeError(
            f"@bulkhead cannot hold a slot across a generator's iteration ({fn!r}): "
            f"use `with bulkhead:` inside it"
        )
    if how == "async":

        @functools.wraps(fn)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            return await call_async(core, fn, args, kwargs)

        return async_wrapper

    core_call = core.call

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return core_call(fn, *args, **kwargs)

    return wrapper


def is_drop(core: Any, exc: Optional[BaseException]) -> Optional[bool]:
    """The sample of a call that ended with ``exc``: None (no sample: cancelled, interrupted),
    True (a drop: ``drop_on`` or ``DeadlineExceeded``), False (a plain round trip)."""
    if exc is None:
        return False
    if not isinstance(exc, Exception):
        return None
    return isinstance(exc, core._drop_on) or isinstance(exc, DeadlineExceeded)


def finite(x: float) -> bool:
    return not (math.isnan(x) or math.isinf(x))
