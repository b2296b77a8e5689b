"""SharedRegion rate limiters (issue 29): one limit for every process of a host, both cores.

Time is a ``SharedClock`` moved by the test; nothing sleeps.
"""

from __future__ import annotations

import multiprocessing
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import ratelimit_region_support as rrs
import region_support as rs

pytestmark = [
    pytest.mark.skipif(sys.platform == "win32", reason="SharedRegion is POSIX only"),
    pytest.mark.thread_unsafe(reason="starts processes and maps named segments"),
]


@pytest.fixture
def name() -> Iterator[str]:
    n = "fbt-" + uuid.uuid4().hex[:12]
    yield n
    try:
        import _posixshmem  # type: ignore[import-not-found]

        _posixshmem.shm_unlink("/" + n)
    except FileNotFoundError:
        pass


@pytest.fixture
def shared_clock() -> Iterator[rs.SharedClock]:
    c = rs.SharedClock()
    yield c
    c.close()


def test_attachments_share_one_limit(fb: Any, name: str, shared_clock: rs.SharedClock) -> None:
    a = fb.SharedRegion(name, clock=shared_clock)
    b = rs.region(fb.impl, name, shared_clock)
    la, lb = a.rate_limiter("api", "2/s", "3/min"), b.rate_limiter("api", "2/s", "3/min")
    assert la.name == "api" and la.rates == (fb.Rate(2, 1), fb.Rate(3, 60))
    assert la.try_acquire() and lb.try_acquire() and not la.try_acquire()
    assert lb.retry_after() == 0.5
    shared_clock.advance(0.5)
    assert lb.try_acquire() and not la.try_acquire()  # the 3/min rate is spent in both
    with pytest.raises(ValueError, match="rates"):
        a.rate_limiter("api", "2/s")
    a.retry_budget("x")
    with pytest.raises(ValueError, match="not a rate_limiter"):
        a.rate_limiter("x", "1/s")
    assert a.objects()["api"] == "rate_limiter"


def test_four_processes_get_exactly_the_burst(
    fb: Any, name: str, shared_clock: rs.SharedClock
) -> None:
    # Fork children hammer one two-rate limiter at a fixed shared time: together they get the
    # tight rate's burst exactly (no lost update, no refusal charged); after 10 intervals, 10 more.
    region = fb.SharedRegion(name, clock=shared_clock)
    lim = region.rate_limiter("api", *rrs.RATES)
    ctx = multiprocessing.get_context("fork")

    def round_() -> int:
        q = ctx.Queue()
        procs = [
            ctx.Process(target=rrs.hammer, args=(fb.impl, name, shared_clock, 300, q))
            for _ in range(4)
        ]
        for p in procs:
            p.start()
        got = sum(q.get(timeout=60) for _ in procs)
        for p in procs:
            p.join(60)
            assert p.exitcode == 0
        return got

    assert round_() == 60
    shared_clock.advance(10 * 60)  # the 60/h rate: 10 intervals of 60 s
    assert round_() == 10
    assert not lim.try_acquire()
