"""The fast path of ``LoadShedder`` (``_shed``): ``with shedder:`` while nobody waits.

``ShedderCore`` is the base of ``_shed.LoadShedder``; this pure-Python twin is its specification,
``_shed_c`` the compiled one. Everything else of the shedder (the queue, CoDel, priorities,
deadlines, the async paths) is the plain Python of ``_shed``, which keeps these fields:

* ``_try``: the admission (a bound ``_try_admit`` of the limit, or the shedder's timed variant);
  ``_rel``: the limit's ``release``;
* ``_live``: requests waiting in the shedder's queue (changed under the shedder's lock);
* ``_idle``: True while nothing but the limit is involved in a release (nobody waits, CoDel is
  idle, the limit takes no RTT samples);
* ``_admitted``: the admissions counted so far (``_admit_one()`` adds one).

An entry admits at once when nobody waits, no deadline is set and the limit has a slot: one
admission call, no lock, no clock read; otherwise it is ``_acquire()``, the queue. An exit while
``_idle`` releases the slot and re-reads ``_idle``: a request that queued meanwhile is handed the
slot by ``_kick()``; otherwise it is ``_exit_slow(exc)``.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, Callable, Optional

from ._deadline import current_var as _deadline_var

__all__ = ["ShedderCore"]

_dl_get = _deadline_var.get


class ShedderCore:
    """The admission fast path of ``LoadShedder`` (internal: see the module docstring)."""

    __slots__ = ("_try", "_rel", "_live", "_idle", "_admitted")

    _try: Callable[[], bool]
    _rel: Callable[[], None]
    _live: int
    _idle: bool
    _admitted: int

    def _acquire(self) -> None:
        raise NotImplementedError  # _shed.LoadShedder: the queue

    def _kick(self) -> None:
        raise NotImplementedError

    def _exit_slow(self, exc: Optional[BaseException]) -> None:
        raise NotImplementedError

    def _admit_one(self) -> None:
        """Count one admission."""
        self._admitted += 1

    def __enter__(self) -> Any:
        if self._live == 0 and _dl_get() is None and self._try():
            self._admitted += 1
            return self
        self._acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._idle:
            self._rel()
            if not self._idle:
                self._kick()  # someone queued meanwhile: the slot just freed is theirs
            return
        self._exit_slow(exc)
