"""The Bulkhead/AdaptiveLimiter C API under real parallelism (native threads, GIL released), and
the negative control: the same core built with a racy CAS must be caught.

    FB_STRESS_SECONDS=5 python -m pytest -q -s tests/test_bulkhead_stress.py
"""

from __future__ import annotations

import os
import threading
import time
import types
from typing import Any

import pytest

import capi_ext
import fastbreaker
from capi_ext import bulkhead_build
from fastbreaker.testing import FakeClock


def _yield_cpu() -> None:
    """Let other threads run (no timed sleep: nothing waits for a duration)."""
    if hasattr(os, "sched_yield"):
        os.sched_yield()


THREADS = 4
SECONDS = float(os.environ.get("FB_STRESS_SECONDS", "1.0"))
RACY_ATTEMPTS = 4

pytestmark = [
    pytest.mark.skipif(not fastbreaker.COMPILED, reason="the C API needs the compiled core"),
    pytest.mark.skipif(not capi_ext.have_compiler(), reason="no Cython or no C compiler"),
    pytest.mark.thread_unsafe(reason="starts its own threads"),
]

_built: dict[str, Any] = {}


def _cached(kind: str, factory: pytest.TempPathFactory) -> Any:
    if kind not in _built:
        try:
            _built[kind] = capi_ext.cached_build(
                f"bulkhead-{kind}",
                bulkhead_build.build_client if kind == "client" else bulkhead_build.build_racy,
            )
        except BaseException as exc:  # noqa: BLE001
            _built[kind] = exc
    if isinstance(_built[kind], BaseException):
        raise _built[kind]
    return _built[kind]


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> types.ModuleType:
    return _cached("client", tmp_path_factory)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def racy(tmp_path_factory: pytest.TempPathFactory) -> types.SimpleNamespace:
    return _cached("racy", tmp_path_factory)  # type: ignore[no-any-return]


def hammer(client: Any, obj: Any, cap: int, limiter: bool, seconds: float) -> dict[str, int]:
    totals = {"admitted": 0, "violations": 0, "errors": 0, "high": 0, "rounds": 0}
    lock = threading.Lock()
    start = threading.Barrier(THREADS)
    stop = time.monotonic() + seconds

    def run() -> None:
        start.wait()
        while time.monotonic() < stop:
            got, bad, errors, high = client.hammer(obj, 20_000, cap, limiter, 1_000, 10**12)
            with lock:
                totals["admitted"] += got
                totals["violations"] += bad
                totals["errors"] += errors
                totals["high"] = max(totals["high"], high)
                totals["rounds"] += 20_000

    threads = [threading.Thread(target=run) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return totals


@pytest.mark.parametrize("cap", [1, 3])
def test_bulkhead_capacity_is_exact_under_parallel_hammer(client: Any, cap: int) -> None:
    bh = fastbreaker.Bulkhead(cap)
    r = hammer(client, bh, cap, False, SECONDS)
    m = bh.metrics()
    print(f"\n[stress bulkhead cap={cap}] {r} {m}")
    assert r["violations"] == 0 and r["errors"] == 0 and r["high"] <= cap
    assert (m.in_flight, m.waiting) == (0, 0)
    assert m.admitted == r["admitted"] and m.admitted + m.rejected == r["rounds"]
    assert m.peak_in_flight <= cap


def test_limiter_under_parallel_hammer(client: Any) -> None:
    clock = FakeClock(10**12)
    lim = fastbreaker.AdaptiveLimiter(4, min_limit=2, max_limit=6, rtt_threshold=5e-6, clock=clock)
    r = hammer(client, lim, 6, True, SECONDS)
    m = lim.metrics()
    print(f"\n[stress limiter] {r} {m} limit={lim.limit}")
    assert r["violations"] == 0 and r["errors"] == 0 and r["high"] <= 6
    assert (m.in_flight, m.waiting) == (0, 0) and m.admitted == r["admitted"]
    assert 2 <= lim.limit <= 6


def test_handles_check_the_type(client: Any) -> None:
    with pytest.raises(TypeError):
        client.handle_ok(fastbreaker.AdaptiveLimiter(), False)
    with pytest.raises(TypeError):
        client.handle_ok(fastbreaker.Bulkhead(1), True)
    with pytest.raises(TypeError):
        client.handle_ok(fastbreaker._bulkhead_py.Bulkhead(1), False)
    assert client.handle_ok(fastbreaker.Bulkhead(1), False)
    bh = fastbreaker.Bulkhead(1)
    assert client.release_nothing(bh) == -1 and bh.metrics().in_flight == 0


def test_nogil_release_hands_the_slot_to_a_waiting_thread(client: Any) -> None:
    bh = fastbreaker.Bulkhead(1, max_wait=30.0)
    assert bh.try_acquire()
    got = threading.Event()

    def waiter() -> None:
        with bh:
            got.set()

    t = threading.Thread(target=waiter)
    t.start()
    end = time.monotonic() + 10
    while bh.waiting == 0 and time.monotonic() < end:
        _yield_cpu()
    assert client.release_nothing(bh) == 0  # the nogil release takes the GIL to hand over
    t.join(10)
    assert got.is_set() and bh.metrics().in_flight == 0


@pytest.mark.slow  # a racy control: needs both cores to itself (`.ci/run slow`)
def test_racy_bulkhead_is_caught(racy: Any) -> None:
    found: list[dict[str, int]] = []
    for _ in range(RACY_ATTEMPTS):
        bh = racy.Bulkhead(1)
        r = hammer(racy.client, bh, 1, False, 1.0)
        r["in_flight_left"] = bh.in_flight
        found.append(r)
        if r["violations"] or r["in_flight_left"] or r["errors"]:
            break
    print(f"\n[stress bulkhead racy] {found[-1]}")
    last = found[-1]
    assert last["violations"] or last["in_flight_left"] or last["errors"], (
        f"the racy core went undetected: {found}"
    )
