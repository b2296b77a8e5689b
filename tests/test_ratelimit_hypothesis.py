"""Property tests of the GCRA limiter (issue 29): exactness on both cores, and both cores agreeing
step by step. Fake clock, exact ns; no sleeps."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import fastbreaker
from fastbreaker import _ratelimit_py
from fastbreaker.testing import FakeClock

SHARED_FIXTURE = [HealthCheck.function_scoped_fixture]

rate_args = st.tuples(
    st.integers(1, 50),  # limit
    st.one_of(st.sampled_from([1, 60, 0.001]), st.floats(1e-6, 100)),  # per (s)
    st.one_of(st.none(), st.integers(1, 60)),  # burst
)
steps = st.one_of(st.integers(0, 3), st.integers(0, 10**6), st.integers(0, 2 * 10**9))


def _rate(fb: Any, args: tuple[int, float, int | None]) -> Any:
    limit, per, burst = args
    return fb.Rate(limit, per, burst=burst)


@given(args=rate_args, script=st.lists(st.tuples(steps, st.integers(1, 60)), max_size=80))
@settings(max_examples=150, deadline=None, suppress_health_check=SHARED_FIXTURE)
def test_any_interval_admits_at_most_burst_plus_d_over_t(
    fb: Any, args: tuple[int, float, int | None], script: list[tuple[int, int]]
) -> None:
    r = _rate(fb, args)
    clock = FakeClock(10**12)
    lim = fb.RateLimiter(r, clock=clock)
    burst = r.tolerance_ns // r.interval_ns
    bound = args[0] if args[2] is None else args[2]
    per_ns = round(args[1] * 1e9)
    admitted: list[tuple[int, int]] = []
    for step, w in script:
        clock._ns += step
        w = min(w, burst)
        if lim.try_acquire(w):
            admitted.append((clock(), w))
    for i, (ti, _) in enumerate(admitted):
        units = 0
        for tj, w in admitted[i:]:
            units += w
            # units admitted in [ti, tj] <= burst + d / T (d = tj - ti), T = per / limit exactly
            assert units <= bound + Fraction(tj - ti) * args[0] / per_ns


@given(
    args=rate_args, start=st.integers(0, 10**15), weights=st.lists(st.integers(1, 60), max_size=60)
)
@settings(max_examples=100, deadline=None, suppress_health_check=SHARED_FIXTURE)
def test_requests_spaced_at_their_cost_are_all_admitted(
    fb: Any, args: tuple[int, float, int | None], start: int, weights: list[int]
) -> None:
    r = _rate(fb, args)
    burst = r.tolerance_ns // r.interval_ns
    second = fb.Rate(args[0] * 2, args[1], burst=2 * burst)  # looser: both must admit
    clock = FakeClock(start)
    lim = fb.RateLimiter(r, second, clock=clock)
    for w in weights:
        w = min(w, burst)
        assert lim.try_acquire(w)
        clock._ns += w * r.interval_ns  # the request's own cost: never refused


@given(
    args=st.lists(rate_args, min_size=1, max_size=3),
    script=st.lists(st.tuples(steps, st.integers(1, 60)), max_size=40),
)
@settings(max_examples=100, deadline=None, suppress_health_check=SHARED_FIXTURE)
def test_retry_after_is_exact(
    fb: Any, args: list[tuple[int, float, int | None]], script: list[tuple[int, int]]
) -> None:
    rates = [_rate(fb, a) for a in args]
    clock = FakeClock(10**12)
    lim = fb.RateLimiter(*rates, clock=clock)
    burst = min(r.tolerance_ns // r.interval_ns for r in rates)
    for step, w in script:
        clock._ns += step
        w = min(w, burst)
        wait = lim._retry_after_ns(w)
        assert lim.retry_after(w) == wait / 1e9
        if wait:
            clock._ns += wait - 1
            assert not lim.try_acquire(w)  # just before: refused (and charges nothing)
            assert lim._retry_after_ns(w) == 1
            clock._ns += 1
        assert lim.try_acquire(w)  # at it: admitted


ops = st.lists(
    st.one_of(
        st.tuples(st.just("try"), st.integers(0, 4), st.integers(1, 8)),
        st.tuples(st.just("wait"), st.integers(0, 4), st.integers(1, 8)),
        st.tuples(st.just("refund"), st.integers(0, 4), st.integers(1, 8)),
        st.tuples(st.just("advance"), st.just(0), steps),
        st.tuples(st.just("metrics"), st.just(0), st.just(0)),
    ),
    max_size=80,
)


def _step(lim: Any, m: Any, clock: FakeClock, op: str, key: int, arg: int) -> object:
    if op == "advance":
        clock._ns += arg
        return None
    if op == "metrics":
        return lim.metrics(), m.metrics(), sorted(k for k in range(5) if k in m), len(m)
    if op == "try":
        return lim.try_acquire(arg), m.try_acquire(key, arg)
    if op == "wait":
        return lim._retry_after_ns(arg), m._retry_after_ns(key, arg)
    lim.refund(arg)
    m.refund(key, arg)
    return None


@pytest.mark.skipif(not fastbreaker.COMPILED, reason="pure build")
@given(
    args=st.lists(rate_args, min_size=1, max_size=3),
    max_keys=st.integers(1, 5),
    start=st.integers(0, 10**15),
    script=ops,
)
@settings(max_examples=200, deadline=None)
def test_both_cores_agree_step_by_step(
    args: list[tuple[int, float, int | None]],
    max_keys: int,
    start: int,
    script: list[tuple[str, int, int]],
) -> None:
    from fastbreaker import _ratelimit_c
    from fastbreaker._ratelimit import Rate

    rates = [Rate(*a[:2], burst=a[2]) for a in args]
    burst = min(r.tolerance_ns // r.interval_ns for r in rates)
    clocks = FakeClock(start), FakeClock(start)
    cores = [
        (mod.RateLimiter(*rates, clock=c), mod.RateLimiterMap(*rates, max_keys=max_keys, clock=c))
        for mod, c in zip((_ratelimit_c, _ratelimit_py), clocks)
    ]
    for op, key, arg in script:
        if op in ("try", "wait", "refund"):
            arg = min(arg, burst)
        got = [_step(lim, m, c, op, key, arg) for (lim, m), c in zip(cores, clocks)]
        assert got[0] == got[1], (op, key, arg)
