"""What the stall tests (test_region_stall) run in other processes: a child that takes a lock or
a claim of a SharedRegion, says so through a pipe, and then holds it until it is killed (the test
stops it with SIGSTOP meanwhile). Module-level so that ``spawn`` children can import them."""

from __future__ import annotations

import os
import signal
from typing import Any

from fastbreaker import _region


def region(core: str, name: str) -> _region.SharedRegion:
    return _region.region_class(core)(name, create=False)


def _hold(lock: Any, fd: int) -> None:
    with lock:
        os.write(fd, b"x")
        while True:
            signal.pause()


def hold_lock(core: str, name: str, what: str, conn: Any) -> None:
    """Take a lock of the region and hold it: ``what`` is "directory", "map" (a shared map's
    table), or, on the twin, "breaker", "budget" or "bulkhead" (their record locks)."""
    r = region(core, name)
    obj: Any = r  # kept alive while the lock is held (a twin's lock holds its object weakly)
    if what == "directory":
        lock: Any = r._seg.dir_lock
    elif what == "map":
        obj = r.breaker_map("m", capacity=4)
        lock = obj._table.lock
    elif what == "breaker":
        obj = r.breaker("up", failure_threshold=3)
        lock = obj._lock
    elif what == "budget":
        obj = r.retry_budget("rb")
        lock = obj._lock
    else:
        obj = r.bulkhead("bh", 2)
        lock = obj._lock
    _hold(lock, conn.fileno())
    del obj


def stall_in_trip(core: str, name: str, conn: Any) -> None:
    """Trip the shared breaker "up" and stop inside the transition: the compiled core with the
    state word claimed, the twin with its record lock held (the kill tests' hook)."""
    b = region(core, name).breaker("up", failure_threshold=3)
    if core == "c":
        from fastbreaker import _breaker_c as mod
    else:
        from fastbreaker import _breaker_py as mod  # type: ignore[no-redef]
    mod._test_stall_in_claim(conn.fileno())
    b.trip()
    raise AssertionError("the stalled transition returned")


def hammer(core: str, name: str, seconds: float, me: int, counts: Any, conn: Any) -> None:
    """Keys of a small shared map (evictions take its lock), a shared breaker's outcomes and
    now and then a reset(), for ``seconds``; ``counts[me]`` is the operations done so far."""
    import random
    import time

    from fastbreaker import SharedStateTimeout

    r = region(core, name)
    b = r.breaker("up", failure_threshold=3)
    m = r.breaker_map("m", capacity=4)
    rng = random.Random(me)
    os.write(conn.fileno(), b"x")
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        key = f"k{rng.randrange(16)}"
        if m.allow(key):
            m.record_failure(key) if rng.random() < 0.3 else m.record_success(key)
        if b.allow():
            b.record_failure() if rng.random() < 0.2 else b.record_success()
        if n % 50 == 0:
            try:
                b.reset()
            except SharedStateTimeout:
                pass
        n += 1
        counts[me] = n
