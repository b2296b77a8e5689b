"""Load shedding: ``LoadShedder``, a bounded, priority-aware queue in front of a concurrency limit.

Plain Python over either core's ``Bulkhead`` or ``AdaptiveLimiter`` (the *limit*). A request that
finds a free slot runs at once; otherwise it waits in the shedder's queue, which is judged by how
long requests wait (CoDel, RFC 8289), served FIFO while healthy and newest-first while congested
(adaptive LIFO, Facebook's "Fail at Scale"), shed from the lowest priority up, and bounded by each
request's deadline. Refusals raise ``LoadShedError`` with a ``reason`` and a ``retry_after`` hint.

The precise rules (slots, waiting, CoDel, priorities, ``retry_after``, shared limits) are in
docs/patterns/load-shedding.md, "How it works".
"""

from __future__ import annotations

import asyncio
import collections
import functools
import math
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Awaitable, NamedTuple, Optional, TypeVar, Union

from . import _bulkhead as _b, _bulkhead_py, _calls
from ._deadline import Deadline, current_var as _deadline_var
from ._durations import Seconds, check_clock, read_clock, seconds_to_ns
from ._errors import LoadShedError
from ._keywords import checks_keywords
from ._priority import current_var as _priority_var
from ._select import COMPILED
from ._settle_lock import SettleLock

# The admission fast path (``with shedder:`` while nobody waits) is the base class: compiled, or
# its twin (``_shed_py``, which documents the fields it shares with the queue below).
if TYPE_CHECKING or not COMPILED:
    from ._shed_py import ShedderCore
else:
    from ._shed_c import ShedderCore

__all__ = ["LoadShedder", "ShedderMetrics"]

T = TypeVar("T")

Limit = Union[int, _bulkhead_py.Bulkhead, _bulkhead_py.AdaptiveLimiter]

if COMPILED:
    from . import _bulkhead_c

    _BULKHEADS: tuple[type[Any], ...] = (_bulkhead_py.Bulkhead, _bulkhead_c.Bulkhead)
    _LIMITERS: tuple[type[Any], ...] = (_bulkhead_py.AdaptiveLimiter, _bulkhead_c.AdaptiveLimiter)
    _DEFAULT_BULKHEAD: type[Any] = _bulkhead_c.Bulkhead
else:
    _BULKHEADS = (_bulkhead_py.Bulkhead,)
    _LIMITERS = (_bulkhead_py.AdaptiveLimiter,)
    _DEFAULT_BULKHEAD = _bulkhead_py.Bulkhead

ORDERS = ("fifo", "lifo", "adaptive")
_FIFO, _LIFO, _ADAPTIVE = 0, 1, 2
_LEVELS = 4  # Priority.SHEDDABLE .. Priority.CRITICAL_PLUS

# waiter states (changed only under the shedder's lock)
_WAITING, _GRANTED, _SHED, _GONE = 0, 1, 2, 3
# how a wait ended, for _settle
_WOKEN, _TIMEOUT, _CANCELLED = 0, 1, 2

_dl_get = _deadline_var.get
_prio_get = _priority_var.get


class ShedderMetrics(NamedTuple):
    """A snapshot of a ``LoadShedder``'s counters (cumulative since creation) and state.

    Each request that is not cancelled ends counted once: ``admitted`` or one of the ``shed_*``
    (a waiter is counted when the shedder decides, even if it is cancelled before it learns it).
    Fields: ``admitted``, ``queued``, ``shed_queue_full``, ``shed_too_old``, ``shed_priority``,
    ``shed_deadline``, ``in_flight``, ``queue_len`` and ``congested``, each described below.
    """

    admitted: int
    """Requests that got a slot (at once or after waiting)."""
    queued: int
    """Requests that ever waited in the queue."""
    shed_queue_full: int
    """Refused: no slot and no room to wait."""
    shed_too_old: int
    """Dropped by CoDel while congested, or waited ``queue_timeout`` (or it is 0)."""
    shed_priority: int
    """Displaced by a more important request, or SHEDDABLE while congested."""
    shed_deadline: int
    """Their deadline passed before they could start."""
    in_flight: int
    """The limit's current number of held slots (including those of other users of it)."""
    queue_len: int
    """Requests waiting now."""
    congested: bool
    """CoDel's drop state (see the module docstring)."""


class _Waiter:
    """One queued request: its state, how to wake it, its priority, arrival time and deadline."""

    __slots__ = ("state", "wake", "level", "enq", "dl", "reason", "hint")

    def __init__(
        self, wake: Callable[[], None], level: int, enq: int, dl: Optional[Deadline]
    ) -> None:
        self.state = _WAITING
        self.wake = wake
        self.level = level
        self.enq = enq
        self.dl = dl
        self.reason = ""
        self.hint = 0.0


def _expired(dl: Optional[Deadline]) -> bool:
    return dl is not None and dl.remaining_ns() <= 0


def _resolve(fut: asyncio.Future[bool], value: bool) -> None:
    if not fut.done():
        fut.set_result(value)


def _check_limit(limit: object) -> Any:
    if isinstance(limit, _BULKHEADS) or isinstance(limit, _LIMITERS):
        return limit
    if isinstance(limit, int) and not isinstance(limit, bool):
        if not 1 <= limit <= _b.MAX_CONCURRENT:
            raise ValueError(
                f"limit must be an int in [1, {_b.MAX_CONCURRENT}], a Bulkhead or an "
                f"AdaptiveLimiter, got {limit!r}"
            )
        return None  # built last, once every other option is valid
    raise TypeError(
        f"limit must be an int in [1, {_b.MAX_CONCURRENT}], a Bulkhead or an AdaptiveLimiter, "
        f"got {limit!r}"
    )


@checks_keywords
class LoadShedder(ShedderCore):
    """Admit requests to a concurrency limit, queue a bounded number, and shed the rest early.

    ``with shedder:``, ``async with shedder:``, ``shedder.call(fn, ...)``,
    ``await shedder.call_async(fn, ...)`` and ``@shedder`` run the code holding a slot of the
    limit, or raise ``LoadShedError`` (``reason``: ``"queue_full"``, ``"too_old"``,
    ``"priority"``, ``"deadline"``; ``retry_after``: a hint in seconds). See the module
    docstring of ``fastbreaker._shed`` for CoDel, the orders, priorities and deadlines.

    Args:
        limit: the concurrency limit: an int (a new ``Bulkhead`` of that many slots), a
            ``Bulkhead`` or an ``AdaptiveLimiter`` (which then receives each call's RTT).
        max_queue: the most requests that may wait (an int >= 0; 0: never wait).
        queue_timeout: seconds a request may wait while healthy (>= 0; 0: never wait).
        codel_target: CoDel's target sojourn time in seconds (> 0, < ``codel_interval``).
        codel_interval: CoDel's interval in seconds (> 0).
        order: ``"fifo"``, ``"lifo"`` or ``"adaptive"`` (FIFO while healthy, LIFO while
            congested).
        name: shown in errors (a str or None).
        clock: a zero-argument callable returning int nanoseconds (such as
            ``fastbreaker.testing.FakeClock``) for sojourn times and ``queue_timeout``; the
            monotonic clock by default.
    """

    __slots__ = (
        "_limit",
        "_timed",
        "_acq",
        "_lock",
        "_levels",
        "_level_live",
        "_first_above",
        "_dropping",
        "_drop_next",
        "_count",
        "_lastcount",
        "_max_queue",
        "_qt",
        "_target",
        "_interval",
        "_order",
        "_name",
        "_clock",
        "_queued",
        "_shed_full",
        "_shed_old",
        "_shed_prio",
        "_shed_dl",
        "__weakref__",
    )

    def __init__(
        self,
        limit: Limit,
        *,
        max_queue: int = 100,
        queue_timeout: Seconds = 1.0,
        codel_target: Seconds = 0.005,
        codel_interval: Seconds = 0.1,
        order: str = "adaptive",
        name: Optional[str] = None,
        clock: Optional[Callable[[], int]] = None,
    ) -> None:
        # Validate everything first: a refused option leaves nothing half-built.
        if name is not None and not isinstance(name, str):
            raise TypeError(f"name must be a str or None, got {name!r}")
        check_clock(clock)
        lim = _check_limit(limit)
        mq = _b._count(max_queue, "max_queue", 0, _b.MAX_CONCURRENT)
        qt = seconds_to_ns(queue_timeout, "queue_timeout")
        target = seconds_to_ns(codel_target, "codel_target", positive=True)
        interval = seconds_to_ns(codel_interval, "codel_interval", positive=True)
        if target >= interval:
            raise ValueError(
                f"codel_target must be < codel_interval ({codel_interval!r}), got {codel_target!r}"
            )
        if not isinstance(order, str):
            raise TypeError(f"order must be one of {ORDERS}, got {order!r}")
        if order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
        if lim is None:
            lim = _DEFAULT_BULKHEAD(limit, name=name, clock=clock)
        self._limit: Any = lim
        self._timed = isinstance(lim, _LIMITERS)
        self._acq: Callable[[], bool] = lim._try_admit
        self._rel = lim.release
        self._try = self._try_timed if self._timed else self._acq
        self._lock = SettleLock()
        self._levels: tuple[collections.deque[_Waiter], ...] = tuple(
            collections.deque() for _ in range(_LEVELS)
        )
        self._level_live = [0] * _LEVELS
        self._live = 0
        self._idle = not self._timed
        self._first_above: Optional[int] = None
        self._dropping = False
        self._drop_next = 0
        self._count = 0
        self._lastcount = 0
        self._max_queue = mq
        self._qt = qt
        self._target = target
        self._interval = interval
        self._order = ORDERS.index(order)
        self._name = name
        self._clock: Callable[[], int] = time.monotonic_ns if clock is None else clock
        self._admitted = 0
        self._queued = 0
        self._shed_full = self._shed_old = self._shed_prio = self._shed_dl = 0

    # -- public -------------------------------------------------------------------------------

    @property
    def limit(self) -> Any:
        """The ``Bulkhead`` or ``AdaptiveLimiter`` this shedder admits to."""
        return self._limit

    @property
    def name(self) -> Optional[str]:
        """The name given at construction (shown in errors), or None."""
        return self._name

    def metrics(self) -> ShedderMetrics:
        """A snapshot of the counters and state (see ``ShedderMetrics``)."""
        with self._lock:
            return ShedderMetrics(
                self._admitted,
                self._queued,
                self._shed_full,
                self._shed_old,
                self._shed_prio,
                self._shed_dl,
                self._limit.in_flight,
                self._live,
                self._dropping,
            )

    # ``with shedder:`` is ShedderCore's __enter__/__exit__ (the fast path, compiled), which
    # calls _acquire() and _exit_slow() below when the queue is involved.

    async def __aenter__(self) -> LoadShedder:
        if self._live == 0 and _dl_get() is None and self._try():
            self._admit_one()
            return self
        await self._acquire_async()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, tb)

    def call(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` holding a slot, or raise ``LoadShedError``.

        Args:
            fn: the function to call.
            *args: its positional arguments.
            **kwargs: its keyword arguments.
        """
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {fn!r}")
        with self:
            return fn(*args, **kwargs)

    async def call_async(self, fn: Callable[..., Awaitable[T]], /, *args: Any, **kwargs: Any) -> T:
        """Await ``fn(*args, **kwargs)`` holding a slot, or raise ``LoadShedError``.

        Args:
            fn: the coroutine function to call.
            *args: its positional arguments.
            **kwargs: its keyword arguments.
        """
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {fn!r}")
        async with self:
            return await fn(*args, **kwargs)

    def __call__(self, fn: Any) -> Any:
        """``@shedder``: guard a sync or async function (its signature and metadata are kept).

        Args:
            fn: the function to guard (not a generator: use ``with shedder:`` inside it).
        """
        if not callable(fn):
            raise TypeError(f"@shedder needs a callable, got {fn!r}")
        how = _calls.kind(fn)
        if how in ("gen", "asyncgen"):
            raise TypeError(
                f"@shedder cannot hold a slot across a generator's iteration ({fn!r}): "
                f"use `with shedder:` inside it"
            )
        if how == "async":

            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                async with self:
                    return await fn(*args, **kwargs)

            return async_wrapper

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self:
                return fn(*args, **kwargs)

        return wrapper

    def __repr__(self) -> str:
        return (
            f"LoadShedder(limit={self._limit!r}, max_queue={self._max_queue}, "
            f"order={ORDERS[self._order]!r}, name={self._name!r}, queue_len={self._live}, "
            f"congested={self._dropping})"
        )

    def __copy__(self) -> object:
        raise TypeError("LoadShedder objects cannot be copied or pickled: create a new one")

    def __deepcopy__(self, memo: object) -> object:
        raise TypeError("LoadShedder objects cannot be copied or pickled: create a new one")

    def __reduce_ex__(self, protocol: object) -> str | tuple[Any, ...]:
        raise TypeError("LoadShedder objects cannot be copied or pickled: create a new one")

    # -- admission and release helpers ---------------------------------------------------------

    def _now(self) -> int:
        return read_clock(self._clock)

    def _try_timed(self) -> bool:
        """The fast admission over an AdaptiveLimiter: a slot, then the RTT's start."""
        if self._acq():
            self._start()
            return True
        return False

    def _start(self) -> None:
        """Remember when this call started, on the limiter's clock (AdaptiveLimiter only)."""
        try:
            start = self._limit._start_or_release()  # releases the slot if the clock fails
        except BaseException:
            self._kick()
            raise
        _b.push_start(self, start)

    def _exit_slow(self, exc: Optional[BaseException]) -> None:
        if self._timed:
            start = _b.pop_start(self)
            if start is None:
                self._rel()  # exited in another context: no sample
            else:
                self._limit._done(start, exc)  # the limiter's own sample-and-release
            if self._live or self._first_above is not None or self._dropping:
                self._kick()  # read after the release: a waiter that queued meanwhile is seen
            return
        # An exit may run from the finalizer of a task collected under the lock: never wait
        # for it there (see _settle_lock); the same for _kick and a waiter's cancellation.
        self._lock.run_or_defer(self._hand_on)

    def _hand_on(self) -> None:
        self._drain(True)
        self._update_idle()

    def _kick(self) -> None:
        """A slot was freed outside the lock: under it, hand free slots to the queue, or note the
        empty queue for CoDel."""
        self._lock.run_or_defer(self._kick_locked)

    def _kick_locked(self) -> None:
        if self._live:
            self._drain(False)
        else:
            self._queue_empty()
        self._update_idle()

    def _update_idle(self) -> None:
        self._idle = (
            not self._timed and self._live == 0 and self._first_above is None and not self._dropping
        )

    def _queue_empty(self) -> None:
        # RFC 8289's dequeue of an empty queue: not above target, and out of drop state.
        self._first_above = None
        self._dropping = False

    # -- the queue (every method below runs under self._lock) ----------------------------------

    def _drain(self, have: bool) -> None:
        """Hand free slots to waiters, CoDel deciding at each handover. ``have``: the caller
        holds a slot to hand over (it is released if nobody takes it)."""
        now = -1
        while True:
            if not have:
                if self._live == 0 or not self._acq():
                    return
                have = True
            if now < 0:
                try:
                    now = self._now()
                except BaseException:
                    self._rel()  # the clock failed: nobody can be handed the slot held now
                    raise
            w = self._dequeue(now)
            if w is None:
                self._rel()
                return
            if _expired(w.dl):
                self._verdict(w, "deadline", now, removed=True)
                continue
            self._level_live[w.level] -= 1
            self._live -= 1
            w.state = _GRANTED
            try:
                w.wake()
            except BaseException:
                w.state = _GONE  # its event loop is closed: nobody can take this slot
                continue
            have = False

    def _oldest(self) -> Optional[_Waiter]:
        best: Optional[_Waiter] = None
        for d in self._levels:
            while d and d[0].state != _WAITING:
                d.popleft()
            if d and (best is None or d[0].enq < best.enq):
                best = d[0]
        return best

    def _judge(self, now: int) -> bool:
        """RFC 8289 ``dodequeue``'s judgement of the head: True when ``ok_to_drop``."""
        head = self._oldest()
        if head is None or now - head.enq < self._target:
            self._first_above = None
            return False
        if self._first_above is None:
            self._first_above = now + self._interval
            return False
        return now >= self._first_above

    def _control_law(self, t: int) -> int:
        return t + int(self._interval / math.sqrt(self._count))

    def _dequeue(self, now: int) -> Optional[_Waiter]:
        """RFC 8289 ``dequeue`` at a handover: drops per the control law, then the pick."""
        ok = self._judge(now)
        if self._live == 0:
            self._dropping = False
            return None
        if self._dropping:
            if not ok:
                self._dropping = False
            while self._dropping and now >= self._drop_next:
                self._drop(now)
                self._count += 1
                ok = self._judge(now)
                if not ok:
                    self._dropping = False
                else:
                    self._drop_next = self._control_law(self._drop_next)
        elif ok:
            self._drop(now)
            self._judge(now)
            self._dropping = True
            delta = self._count - self._lastcount
            self._count = 1
            if delta > 1 and now - self._drop_next < 16 * self._interval:
                self._count = delta
            self._drop_next = self._control_law(now)
            self._lastcount = self._count
        if self._live == 0:
            return None
        return self._pick()

    def _drop(self, now: int) -> None:
        """CoDel's drop: the lowest-priority waiter at or above the target, oldest first."""
        limit = now - self._target
        for d in self._levels:
            while d and d[0].state != _WAITING:
                d.popleft()
            if d and d[0].enq <= limit:
                self._verdict(d.popleft(), "too_old", now, removed=True)
                return
        head = self._oldest()  # unreachable: ok_to_drop means the head is above the target
        if head is not None:
            self._verdict(head, "too_old", now)

    def _pick(self) -> _Waiter:
        """The next waiter to serve, taken off its deque (still counted live): the highest
        priority present, FIFO or LIFO within it."""
        lifo = self._order == _LIFO or (self._order == _ADAPTIVE and self._dropping)
        for lv in range(_LEVELS - 1, -1, -1):
            if self._level_live[lv]:
                d = self._levels[lv]
                while True:
                    w = d.pop() if lifo else d.popleft()
                    if w.state == _WAITING:
                        return w
        raise AssertionError("a live waiter was counted but not queued")

    def _verdict(self, w: _Waiter, reason: str, now: int, removed: bool = False) -> None:
        """Shed the waiting ``w`` with ``reason`` and wake it to learn it (``removed``: it was
        taken off its deque already)."""
        self._level_live[w.level] -= 1
        self._live -= 1
        w.state = _SHED
        w.reason = reason
        w.hint = self._hint(now)
        self._count_shed(reason)
        if not removed:
            self._tidy(w.level)
        try:
            w.wake()
        except BaseException:
            w.state = _GONE  # its event loop is closed: nobody to tell

    def _count_shed(self, reason: str) -> None:
        if reason == "queue_full":
            self._shed_full += 1
        elif reason == "too_old":
            self._shed_old += 1
        elif reason == "priority":
            self._shed_prio += 1
        else:
            self._shed_dl += 1

    def _tidy(self, level: int) -> None:
        """Drop dead entries at the ends of a level's deque; compact it when they dominate."""
        d = self._levels[level]
        while d and d[-1].state != _WAITING:
            d.pop()
        while d and d[0].state != _WAITING:
            d.popleft()
        if len(d) > 2 * self._level_live[level] + 16:
            keep = [x for x in d if x.state == _WAITING]
            d.clear()
            d.extend(keep)

    def _leave(self, w: _Waiter) -> None:
        self._level_live[w.level] -= 1
        self._live -= 1
        w.state = _GONE
        self._tidy(w.level)

    def _hint(self, now: int) -> float:
        if self._dropping:
            return self._interval / 1e9
        head = self._oldest()
        age = 0 if head is None else max(0, now - head.enq)
        hi = max(self._target, self._qt)
        return min(max(age, self._target), hi) / 1e9

    def _refuse(self, reason: str, now: int) -> LoadShedError:
        self._count_shed(reason)
        return LoadShedError(self._name, reason, self._hint(now))

    # -- the waiting protocol (shared by threads and tasks, and driven step by step in tests) --

    def _arrive(
        self, level: int, dl: Optional[Deadline], wake: Callable[[], None]
    ) -> Optional[_Waiter]:
        """The slow path of an arrival: admitted (None), queued (the waiter, woken by ``wake``),
        or refused (``LoadShedError``)."""
        if _expired(dl):
            now = self._now()
            with self._lock:
                raise self._refuse("deadline", now)
        now = self._now()
        with self._lock:
            self._drain(False)  # free slots go to those already waiting
            if self._live == 0 and self._acq():
                self._admit_one()
                return None
            if self._max_queue == 0:
                raise self._refuse("queue_full", now)
            if self._qt == 0:
                raise self._refuse("too_old", now)
            if self._dropping and level == 0:
                raise self._refuse("priority", now)
            if self._live >= self._max_queue and not self._displace(level, now):
                raise self._refuse("queue_full", now)
            w = _Waiter(wake, level, now, dl)
            self._levels[level].append(w)
            self._level_live[level] += 1
            self._live += 1
            self._queued += 1
            self._idle = False
            try:
                self._drain(False)  # a slot freed by a fast release that missed this waiter
            except BaseException:  # the clock failed: this arrival does not stay queued
                self._abort(w)
                raise
            if w.state == _GRANTED:
                w.state = _GONE
                self._admit_one()
                self._update_idle()
                return None
            self._update_idle()
            if w.state == _SHED:  # cannot happen (it is the newest, with a deadline left)
                w.state = _GONE
                raise LoadShedError(self._name, w.reason, w.hint)
            return w

    def _displace(self, level: int, now: int) -> bool:
        """Shed the least important, most recent waiter below ``level``; False if none."""
        for lv in range(level):
            if self._level_live[lv]:
                d = self._levels[lv]
                while True:
                    v = d.pop()
                    if v.state == _WAITING:
                        self._verdict(v, "priority", now, removed=True)
                        return True
        return False

    def _wait_s(self, w: _Waiter) -> float:
        """Seconds the waiter may wait before it must re-check (see the module docstring)."""
        left = min(w.enq + self._qt - self._now(), self._interval)
        dl = w.dl
        if dl is not None:
            left = min(left, dl.remaining_ns())
        return max(0, left) / 1e9

    def _abort(self, w: _Waiter) -> None:
        """Under the lock: ``w`` leaves at once (its arrival failed), passing on a slot."""
        if w.state == _WAITING:
            self._leave(w)
        elif w.state == _GRANTED:
            w.state = _GONE
            self._rel()
        self._update_idle()

    def _cancel(self, w: _Waiter, exc: BaseException) -> None:
        """``w`` gives up: ``_settle(w, _CANCELLED)``, but never waiting for the lock when this
        thread holds it (the finalizer of a task collected under it), nor for another thread
        on a task's own cleanup (``GeneratorExit``); see ``_settle_lock``."""
        self._lock.run_or_defer(
            functools.partial(self._settle_locked, w, _CANCELLED),
            not isinstance(exc, GeneratorExit),
        )

    def _settle(self, w: _Waiter, how: int) -> bool:
        """End (or continue) ``w``'s wait: True if it holds a slot now, False to wait again (or,
        for ``_CANCELLED``, to re-raise); ``LoadShedError`` if it was shed."""
        with self._lock:
            return self._settle_locked(w, how)

    def _settle_locked(self, w: _Waiter, how: int) -> bool:
        if w.state == _WAITING:
            if how == _CANCELLED:
                self._leave(w)
                self._update_idle()
                return False
            self._drain(False)  # a slot freed outside the shedder (see the docstring)
        if w.state == _GRANTED:
            w.state = _GONE
            if how != _CANCELLED and not _expired(w.dl):
                self._admit_one()
                return True
            self._drain(True)  # given up, or the slot came too late: pass it on
            self._update_idle()
            if how == _CANCELLED:
                return False
            raise self._refuse("deadline", self._now())
        if w.state == _SHED:
            w.state = _GONE
            self._update_idle()
            if how == _CANCELLED:
                return False
            raise LoadShedError(self._name, w.reason, w.hint)
        if w.state == _GONE:
            return False
        now = self._now()
        if _expired(w.dl):
            self._leave(w)
            self._update_idle()
            raise self._refuse("deadline", now)
        if now - w.enq >= self._qt:
            self._leave(w)
            self._update_idle()
            raise self._refuse("too_old", now)
        return False

    def _acquire(self) -> None:
        """The slow path of ``with``: wait on a lock of this thread's own."""
        lock = threading.Lock()
        lock.acquire()
        w = self._arrive(int(_prio_get()), _dl_get(), lock.release)
        if w is not None:
            while True:
                try:
                    woke = lock.acquire(timeout=self._wait_s(w))
                    if self._settle(w, _WOKEN if woke else _TIMEOUT):
                        break
                except BaseException as exc:  # interrupted, shed, or a clock failed
                    self._cancel(w, exc)
                    raise
        if self._timed:
            self._start()

    async def _acquire_async(self) -> None:
        """The slow path of ``async with``: await a future of this task's own loop."""
        loop = asyncio.get_running_loop()
        cell = [loop.create_future()]
        tid = threading.get_ident()

        def wake() -> None:
            if threading.get_ident() == tid:
                _resolve(cell[0], True)
            else:
                loop.call_soon_threadsafe(_resolve, cell[0], True)

        w = self._arrive(int(_prio_get()), _dl_get(), wake)
        if w is not None:
            while True:
                fut = cell[0]
                handle: Optional[asyncio.TimerHandle] = None
                try:
                    handle = loop.call_later(self._wait_s(w), _resolve, fut, False)
                    woke = await fut
                    handle.cancel()
                    if not woke:
                        # before settling: a wake after settle decides to wait again finds it
                        cell[0] = loop.create_future()
                    if self._settle(w, _WOKEN if woke else _TIMEOUT):
                        break
                except BaseException as exc:  # cancelled, shed, collected, or a clock failed
                    if handle is not None:
                        handle.cancel()
                    self._cancel(w, exc)
                    raise
        if self._timed:
            self._start()
