"""The RateLimiter C API (``fb_rate_try_acquire``) from nogil threads, and the negative control:
the same core built with a racy CAS must be caught (issue 29).

4 native threads (GIL released) hammer one two-rate limiter at the time of a shared fake clock
word that one of them advances. Per rate, with A requests admitted between clock readings ``t0``
and ``t1``: ``A*w*T <= tau + (t1 - t0)`` (never more than burst + d/T), and the TAT word is at
least ``t0 + A*w*T`` (every admitted charge is on the word: a lost update shows here). With the
clock held still, each word is exactly ``t0 + A*w*T``: no rate keeps a charge of a refused
request.

    FB_STRESS_SECONDS=5 python -m pytest -q -s tests/test_ratelimit_stress.py
"""

from __future__ import annotations

import os
import threading
import types
from typing import Any

import pytest

import capi_ext
import fastbreaker
from capi_ext import ratelimit_build
from fastbreaker.testing import FakeClock

THREADS = 4
SECONDS = float(os.environ.get("FB_STRESS_SECONDS", "0.5"))
RACY_ATTEMPTS = 4
START = 10**12

pytestmark = [
    pytest.mark.skipif(not fastbreaker.COMPILED, reason="the C API needs the compiled core"),
    pytest.mark.skipif(not capi_ext.have_compiler(), reason="no Cython or no C compiler"),
    pytest.mark.thread_unsafe(reason="starts its own threads"),
]

_built: dict[str, Any] = {}


def _cached(kind: str, factory: pytest.TempPathFactory) -> Any:
    if kind not in _built:
        dest = factory.mktemp(f"capi_ratelimit_{kind}")
        build = ratelimit_build.build_client if kind == "client" else ratelimit_build.build_racy
        try:
            _built[kind] = build(dest)
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


def _limiter(cls: Any) -> Any:
    # The loose rate is charged first; the tight one then refuses most requests, so refusals in
    # the second pass give a charge back under contention.
    return cls(
        fastbreaker.Rate(10**7, 1, burst=1000),
        fastbreaker.Rate(10**6, 1, burst=16),
        clock=FakeClock(START),
    )


def hammer(client: Any, lim: Any, weight: int, advance: bool, seconds: float) -> list[str]:
    """Run the threads; return the violations found (empty when the invariants hold)."""
    client.set_clock(START)
    results: list[tuple[int, int]] = []
    barrier = threading.Barrier(THREADS)

    def run(i: int) -> None:
        barrier.wait()
        results.append(client.hammer(lim, weight, advance and i == 0, 250, seconds))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    admitted = sum(got for _, got in results)
    t1 = client.get_clock()
    words = client.words(lim)
    out = []
    for r, tat in zip(lim.rates, words):
        charged = admitted * weight * r.interval_ns
        if charged > r.tolerance_ns + (t1 - START):
            out.append(f"{r}: {admitted} admitted over {t1 - START} ns exceeds burst + d/T")
        if tat < START + charged if advance else tat != START + charged:
            out.append(f"{r}: TAT {tat - START} ns after start, {charged} ns admitted")
    print(f"\n[ratelimit stress] advance={advance} requests={sum(n for n, _ in results)} "
          f"admitted={admitted} d={t1 - START} ns violations={out}")  # fmt: skip
    return out


@pytest.mark.parametrize("weight", [1, 3])
def test_multi_rate_limiter_is_exact_under_parallel_hammer(client: Any, weight: int) -> None:
    assert hammer(client, _limiter(fastbreaker.RateLimiter), weight, True, SECONDS) == []
    assert hammer(client, _limiter(fastbreaker.RateLimiter), weight, False, SECONDS / 5) == []


@pytest.mark.slow
def test_racy_rate_limiter_is_caught(racy: Any) -> None:
    found: list[str] = []
    for _ in range(RACY_ATTEMPTS):
        found = hammer(racy.client, _limiter(racy.RateLimiter), 1, True, SECONDS)
        if found:
            break
    assert found, "the racy rate limiter went undetected"


def test_c_api_entry_points(client: Any) -> None:
    clock = FakeClock(START)
    lim = fastbreaker.RateLimiter("2/s", "3/min", clock=clock)
    k = client.CONSTANTS
    assert client.try_acquire(lim, 1) == k["FB_RATE_NEED_CLOCK"]  # a Python clock: pass now
    assert client.try_acquire(lim, 3, START) == k["FB_RATE_BAD_WEIGHT"]  # above the burst (2)
    assert client.try_acquire(lim, 0, START) == k["FB_RATE_BAD_WEIGHT"]
    assert [client.try_acquire(lim, 1, START) for _ in range(3)] == [1, 1, 0]
    assert client.retry_after_ns(lim, 1, START) == lim._retry_after_ns(1) == 5 * 10**8
    assert lim.metrics() == fastbreaker.RateLimiterMetrics(2, 1, 2, 1, 0)
    real = fastbreaker.RateLimiter("1/h")  # the C clock: now = -1 reads CLOCK_MONOTONIC
    assert client.try_acquire(real, 1) == 1 and client.try_acquire(real, 1) == 0
    for bad in (
        object(),
        fastbreaker.RateLimiterMap("1/s"),
        fastbreaker._ratelimit_py.RateLimiter("1/s"),
    ):
        with pytest.raises(TypeError, match="compiled fastbreaker.RateLimiter"):
            client.try_acquire(bad, 1)
