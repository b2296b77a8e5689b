"""``SettleLock``: the queue lock of ``Bulkhead`` and ``LoadShedder``, safe from finalizers.

A task that waits for a slot, or holds one, on an event loop that is then closed with the task
still pending is collected later by the cyclic GC, and its cleanup (leave the queue, release the
slot) runs as a finalizer. The GC runs at any allocation, including while the same thread holds
the queue lock (in a handoff, a user clock read, a metrics snapshot): taking a non-reentrant lock
there deadlocks the thread on itself, and every other user of the queue with it. A reentrant
lock would be no better: the finalizer would change the queue in the middle of a change.

So the lock knows which thread holds it, and ``run_or_defer(fn)`` run by that thread (which is
then inside a locked section, below it on its own stack) does not wait: it queues ``fn``, and the
section runs it just before it releases the lock, when its own change is complete. Another
thread waits its turn as usual, except a task's own cleanup (``wait=False``, what a finalizer
runs): it never waits, even for another thread (which may wait for a lock this thread holds),
and if the lock is taken it queues ``fn`` for the holder, which runs it before it releases (or
right after, if it was queued as the holder was releasing). The counts are exact whenever the
lock is free.
"""

from __future__ import annotations

import collections
import threading
from types import TracebackType
from typing import Callable, Optional

__all__ = ["SettleLock"]

_get_ident = threading.get_ident


class SettleLock:
    """A non-reentrant lock used as ``with lock:``, plus ``run_or_defer`` for finalizers."""

    __slots__ = ("_lock", "_owner", "_later")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner = 0
        self._later: collections.deque[Callable[[], object]] = collections.deque()

    def __enter__(self) -> None:
        self._lock.acquire()
        self._owner = _get_ident()

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        try:
            if self._later:
                self._run_later()
        finally:
            self._owner = 0
            self._lock.release()
        if self._later:  # queued by another thread as this one was releasing
            self._run_later_if_free()

    def _run_later_if_free(self) -> None:
        while self._later and self._lock.acquire(False):
            self._owner = _get_ident()
            try:
                self._run_later()
            finally:
                self._owner = 0
                self._lock.release()

    def _run_later(self) -> None:
        # Each deferred step runs even if an earlier one raised; the first error is re-raised.
        first: Optional[BaseException] = None
        later = self._later
        while later:
            fn = later.popleft()
            try:
                fn()
            except BaseException as exc:
                if first is None:
                    first = exc
        if first is not None:
            raise first

    def run_or_defer(self, fn: Callable[[], object], wait: bool = True) -> bool:
        """Run ``fn()`` under the lock and return True; or, when this thread holds the lock
        already (a finalizer run inside a locked section), or another thread does and ``wait``
        is False, queue it to run when the holder releases the lock, and return False."""
        if self._owner == _get_ident():
            self._later.append(fn)
            return False
        if wait:
            self._lock.acquire()
        elif not self._lock.acquire(False):
            self._later.append(fn)
            self._run_later_if_free()  # the holder may have released meanwhile
            return False
        self._owner = _get_ident()
        try:
            fn()
        finally:
            self.__exit__(None, None, None)
        return True
