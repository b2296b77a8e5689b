"""What the SharedRegion tests run in other processes, and a clock all of them share.

The functions here are module-level so that ``spawn`` children can import them; each takes the
core's name (``"c"`` or ``"python"``) and attaches to the region by name, as a worker would.
"""

from __future__ import annotations

import os
import signal
import struct
import uuid
from multiprocessing import shared_memory
from typing import Any

from fastbreaker import _region


class SharedClock:
    """A fake monotonic clock whose time is an int64 in its own shared-memory block, so every
    process that holds it (pickled to spawned children by name) reads the same time."""

    def __init__(self, name: str | None = None, start_ns: int = 1_000_000_000_000) -> None:
        create = name is None
        self.name = name or "fbclock-" + uuid.uuid4().hex[:10]
        self._shm = shared_memory.SharedMemory(self.name, create=create, size=8 if create else 0)
        _region._untrack(self._shm)
        self._owner = create
        if create:
            self.set(start_ns)

    def __call__(self) -> int:
        return int(struct.unpack_from("<q", self._shm.buf, 0)[0])

    def set(self, ns: int) -> None:
        struct.pack_into("<q", self._shm.buf, 0, ns)

    def advance(self, seconds: float) -> int:
        now = self() + int(seconds * 1e9)
        self.set(now)
        return now

    def __reduce__(self) -> Any:
        return (SharedClock, (self.name,))

    def close(self) -> None:
        self._shm.close()
        if self._owner:
            import _posixshmem  # type: ignore[import-not-found]

            _posixshmem.shm_unlink("/" + self.name)


def region(core: str, name: str, clock: Any = None) -> _region.SharedRegion:
    return _region.region_class(core)(name, create=False, clock=clock)


def trip(core: str, name: str, clock: Any, q: Any) -> None:
    """Fail the shared breaker "up" to its threshold; report what this process saw."""
    b = region(core, name, clock).breaker("up", failure_threshold=3)
    for _ in range(3):
        assert b.allow()
        b.record_failure()
    q.put((os.getpid(), b.state.name))


def observe(core: str, name: str, clock: Any, q: Any) -> None:
    """Report the shared breaker's state and one allow() (no other call before it)."""
    b = region(core, name, clock).breaker("up", failure_threshold=3)
    q.put((b.state.name, b.allow(), b.metrics().rejected))


def hammer_calls(core: str, name: str, clock: Any, n: int, seed: int, q: Any) -> None:
    """n calls with an outcome each: every 7th a failure, every 11th neutral (an ignored
    error, through call()), the rest successes."""
    b = region(core, name, clock).breaker("hot", failure_threshold=1_000_000, ignore=(KeyError,))
    admitted = 0
    for i in range(n):
        k = i + seed
        if k % 7 and k % 11 == 0:
            try:
                b.call(_ignored)
            except KeyError:
                admitted += 1
            continue
        if b.allow():
            admitted += 1
            if k % 7 == 0:
                b.record_failure()
            else:
                b.record_success()
    q.put(admitted)


def _ignored() -> None:
    raise KeyError("neutral")


def deposit_budget(core: str, name: str, clock: Any, deposits: int, q: Any) -> None:
    b = region(core, name, clock).retry_budget("rb", ratio=0.5, capacity=50, min_per_sec=0)
    for _ in range(deposits):
        b.record_success()
    q.put(deposits)


def take_all(core: str, name: str, clock: Any, takes: int, q: Any) -> None:
    b = region(core, name, clock).retry_budget("rb", ratio=0.5, capacity=50, min_per_sec=0)
    q.put(sum(b.allow_retry() for _ in range(takes)))


def hold_slots(core: str, name: str, clock: Any, n: int, q: Any) -> None:
    """Take n slots of the shared bulkhead, report, and wait to be killed."""
    bh = region(core, name, clock).bulkhead("bh", 4)
    q.put((os.getpid(), [bh.try_acquire() for _ in range(n)]))
    while True:
        signal.pause()


def stall_in_transition(core: str, name: str, clock: Any, conn: Any) -> None:
    """Arm the kill hook, then trip: the transition writes a byte to ``conn``'s pipe and never
    returns."""
    fd = conn.fileno()
    b = region(core, name, clock).breaker("up", failure_threshold=3)
    if core == "c":
        from fastbreaker import _breaker_c as mod
    else:
        from fastbreaker import _breaker_py as mod  # type: ignore[no-redef]
    mod._test_stall_in_claim(fd)
    b.trip()
    raise AssertionError("the stalled transition returned")


def hammer_c(client: Any, breaker: Any, seconds: float, conn: Any) -> None:
    """The C-level stress hammer (tests/test_stress.py) in this process, one thread; the log
    goes back through ``conn``, trimmed to what was written."""
    import test_stress

    logs: list[Any] = []

    def keep(client: Any, breaker: Any, found: list[Any]) -> Any:
        logs.extend(found)
        return None

    real = test_stress.check_breaker
    test_stress.check_breaker = keep  # type: ignore[assignment]
    try:
        test_stress.hammer_breaker(client, breaker, seconds, threads=1)
    finally:
        test_stress.check_breaker = real
    res, claims, probes, samples = logs[0]
    conn.send(
        (
            res,
            claims[: 4 * res["n_claims"]],
            probes[: res["n_probes"]],
            samples[: 2 * res["n_samples"]],
        )
    )
    conn.close()


def map_fail(core: str, name: str, clock: Any, key: Any, n: int, ratio: float, q: Any) -> None:
    """n failures for ``key`` of the shared map "hosts"; report the key's state."""
    m = region(core, name, clock).breaker_map(
        "hosts", capacity=8, failure_threshold=2, max_open_ratio=ratio
    )
    for _ in range(n):
        if m.allow(key):
            m.record_failure(key)
    q.put(m[key].state.name)


def map_look(core: str, name: str, clock: Any, q: Any) -> None:
    """What another process sees of the shared map "hosts"."""
    m = region(core, name, clock).breaker_map("hosts", capacity=8, failure_threshold=2)
    q.put((sorted(map(repr, m)), len(m), m.allow("a"), sorted(m.open_keys())))


def map_fill(core: str, name: str, clock: Any, keys: list[str], capacity: int, q: Any) -> None:
    """One success for each key (a new key past the capacity evicts)."""
    m = region(core, name, clock).breaker_map("hosts", capacity=capacity, failure_threshold=2)
    for key in keys:
        assert m.allow(key)
        m.record_success(key)
    q.put(m.metrics().evicted)


def take_probe(core: str, name: str, clock: Any, q: Any) -> None:
    """Take the half-open probe of the shared breaker "up", report, and wait to be killed."""
    b = region(core, name, clock).breaker(
        "up", failure_threshold=1, reset_timeout=10, probe_timeout=5
    )
    q.put(b.allow())
    while True:
        signal.pause()


def same_home(n: int, capacity: int, start: int = 0, prefix: str = "host-") -> list[str]:
    """``n`` keys whose probe paths in a shared table of ``capacity`` slots all start at one
    slot: inserted in order, each later key's lookup passes over the slots of the earlier ones."""
    from fastbreaker import _region_map

    by_home: dict[int, list[str]] = {}
    i = start
    while True:
        key = f"{prefix}{i}"
        home = _region_map.key_hash(_region_map.encode_key(key)) % capacity
        keys = by_home.setdefault(home, [])
        keys.append(key)
        if len(keys) == n:
            return keys
        i += 1
