"""The fenced entry point of fleet state, ``CircuitBreaker._fleet``, on both cores.

It is how ``fastbreaker.contrib.redis.FleetCoordinator`` moves a local breaker: only forward in
fleet generation, never over a newer local transition, never out of ISOLATED.
"""

from __future__ import annotations

import types

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

import fastbreaker
from fastbreaker import State
from fastbreaker.testing import FakeClock

NAMESPACES = fastbreaker.testing.implementations()

CLOSED, OPEN, HALF_OPEN = 0, 1, 2


def test_read_only_with_fleet_gen_zero(fb: types.SimpleNamespace, clock: FakeClock) -> None:
    b = fb.CircuitBreaker(2, 10.0, clock=clock)
    b.allow()
    b.record_success()
    b.allow()
    b.record_failure()
    b.allow()
    b.record_failure()  # trips: local generation 1
    b.allow()  # rejected
    assert b._fleet(0, -1, CLOSED, 0.0, 0) == (False, 1, 1, 1, 2, 1)
    assert b.state == State.OPEN


def test_open_sets_the_remaining_time_on_the_local_clock(
    fb: types.SimpleNamespace, clock: FakeClock
) -> None:
    b = fb.CircuitBreaker(5, 30.0, clock=clock)
    events: list[tuple[State, State]] = []
    b.on_state_change(lambda br, old, new: events.append((old, new)))
    applied, gen, state, *_ = b._fleet(10, 0, OPEN, 2.5, 0)
    assert (applied, gen, state) == (True, 1, OPEN)
    assert b.retry_after == pytest.approx(2.5)
    assert events == [(State.CLOSED, State.OPEN)]
    # already OPEN: only the end of the open period moves, no transition, no event
    assert b._fleet(11, 1, OPEN, 7.0, 0)[:3] == (True, 1, OPEN)
    assert b.retry_after == pytest.approx(7.0)
    assert b.metrics().opened == 1 and len(events) == 1
    clock.advance(7.0)
    assert b.allow()  # lazy recovery at the fleet's time: the first local probe
    assert b.state == State.HALF_OPEN


def test_open_seconds_count_the_fleet_episode_from_its_start(
    fb: types.SimpleNamespace, clock: FakeClock
) -> None:
    """A fleet OPEN shifts the open period's start to end it at the fleet's time; the episode
    counted in open_seconds_total still begins when the breaker opened, whatever the shift."""
    b = fb.CircuitBreaker(5, 30.0, clock=clock)
    clock.advance(100.0)
    assert b._fleet(1, -1, OPEN, 2.5, 0)[0]
    clock.advance(2.0)
    assert b.metrics().open_seconds_total == pytest.approx(2.0)
    assert b._fleet(2, -1, OPEN, 50.0, 0)[0]  # longer than reset_timeout: start in the future
    clock.advance(1.0)
    assert b.metrics().open_seconds_total == pytest.approx(3.0)
    assert b._fleet(3, -1, CLOSED, 0.0, 0)[0]  # the fleet closes it: the episode ends now
    clock.advance(5.0)
    assert b.metrics().open_seconds_total == pytest.approx(3.0)
    b.trip()
    clock.advance(4.0)
    b.reset()
    assert b.metrics().open_seconds_total == pytest.approx(7.0)


def test_half_open_admits_only_the_leased_probes(
    fb: types.SimpleNamespace, clock: FakeClock
) -> None:
    b = fb.CircuitBreaker(5, 30.0, half_open_max_calls=3, clock=clock)
    assert b._fleet(1, 0, HALF_OPEN, 0.0, 2)[:3] == (True, 1, HALF_OPEN)
    assert [b.allow() for _ in range(4)] == [True, True, False, False]
    b.record_success()  # success_threshold 1: closes
    assert b.state == State.CLOSED


def test_half_open_without_probes_rejects(fb: types.SimpleNamespace, clock: FakeClock) -> None:
    b = fb.CircuitBreaker(5, 30.0, half_open_max_calls=2, clock=clock)
    b._fleet(1, -1, HALF_OPEN, 0.0, 0)
    assert not b.allow()


def test_closed_resets_backoff_and_window(fb: types.SimpleNamespace, clock: FakeClock) -> None:
    b = fb.CircuitBreaker(2, 1.0, max_reset_timeout=8.0, clock=clock)
    b.trip()
    assert b._fleet(3, -1, CLOSED, 0.0, 0)[:3] == (True, 2, CLOSED)
    assert b.metrics().consecutive_failures == 0
    # closing a CLOSED breaker changes nothing but the fleet generation
    assert b._fleet(4, -1, CLOSED, 0.0, 0)[:3] == (True, 2, CLOSED)


def test_old_and_duplicate_generations_are_ignored(
    fb: types.SimpleNamespace, clock: FakeClock
) -> None:
    b = fb.CircuitBreaker(5, 30.0, clock=clock)
    assert b._fleet(5, -1, OPEN, 3.0, 0)[0]
    assert not b._fleet(5, -1, CLOSED, 0.0, 0)[0]  # duplicate
    assert not b._fleet(4, -1, CLOSED, 0.0, 0)[0]  # reordered: older
    assert b.state == State.OPEN


def test_never_undoes_a_newer_local_transition(fb: types.SimpleNamespace, clock: FakeClock) -> None:
    b = fb.CircuitBreaker(1, 30.0, clock=clock)
    seen = b._fleet(0, -1, CLOSED, 0.0, 0)[1]
    b.allow()
    b.record_failure()  # local trip after the coordinator read the breaker
    applied, gen, state, *_ = b._fleet(9, seen, CLOSED, 0.0, 0)
    assert (applied, gen, state) == (False, 1, OPEN)
    # the refused generation was not recorded: a fresh read may apply it
    assert b._fleet(9, gen, CLOSED, 0.0, 0)[:3] == (True, 2, CLOSED)


def test_isolated_is_never_touched(fb: types.SimpleNamespace, clock: FakeClock) -> None:
    b = fb.CircuitBreaker(5, 30.0, clock=clock)
    b.isolate()
    for state in (CLOSED, OPEN, HALF_OPEN):
        assert not b._fleet(7 + state, -1, state, 1.0, 1)[0]
    assert b.state == State.ISOLATED


@pytest.mark.parametrize(
    ("args", "word"),
    [
        ((1, -1, 3, 0.0, 0), "state"),
        ((1, -1, -1, 0.0, 0), "state"),
        ((1, -1, OPEN, -1.0, 0), "seconds"),
        ((1, -1, OPEN, float("nan"), 0), "seconds"),
        ((1, -1, OPEN, 1e9, 0), "seconds"),
        ((1, -1, HALF_OPEN, 0.0, 2), "probes"),
        ((1, -1, HALF_OPEN, 0.0, -1), "probes"),
    ],
)
def test_bad_arguments(fb: types.SimpleNamespace, args: tuple[object, ...], word: str) -> None:
    b = fb.CircuitBreaker(5, 30.0)
    with pytest.raises(ValueError, match=word):
        b._fleet(*args)
    assert b._fleet(0, -1, CLOSED, 0.0, 0)[:3] == (False, 0, CLOSED)


def test_a_map_breaker_counts_in_its_group(fb: types.SimpleNamespace, clock: FakeClock) -> None:
    m = fb.BreakerMap(5, 30.0, clock=clock)
    m.allow("a")
    m["a"]._fleet(1, -1, OPEN, 1.0, 0)
    assert m.open_keys() == ["a"]
    m["a"]._fleet(2, -1, CLOSED, 0.0, 0)
    assert m.open_keys() == []


# -- fencing, driven by hypothesis on both cores ---------------------------------------------------
applies = st.tuples(
    st.integers(1, 12),  # fleet generation
    st.sampled_from([CLOSED, OPEN, HALF_OPEN]),
    st.floats(0.0, 5.0),
    st.integers(0, 2),
)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("apply"), applies, st.booleans()),
        st.tuples(st.just("local"), st.sampled_from(["ok", "fail", "trip", "tick"])),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_reordered_and_duplicated_applies_never_move_backwards(
    script: list[tuple[object, ...]],
) -> None:
    """Replies arrive in any order, some twice: the fleet generation applied only grows, an
    apply that moved the breaker carries a generation above every earlier one, a stale
    ``local_gen`` never changes anything, and both cores agree step by step."""
    runs = []
    for ns in NAMESPACES.values():
        clock = FakeClock(10**12)
        b = ns.CircuitBreaker(3, 1.0, half_open_max_calls=2, clock=clock)
        seen_gen, top, trace = 0, 0, []
        for op in script:
            if op[0] == "apply":
                (fleet_gen, state, seconds, probes), fresh = op[1], op[2]  # type: ignore[misc]
                before = b._fleet(0, -1, CLOSED, 0.0, 0)
                local = before[1] if fresh else seen_gen
                result = b._fleet(fleet_gen, local, state, seconds, probes)
                if result[0]:
                    assert fleet_gen > top
                    top = fleet_gen
                else:
                    assert result[1:3] == before[1:3]
                if local != before[1]:
                    assert not result[0]
                seen_gen = result[1]
                trace.append((result, b.state, b.retry_after))
            else:
                kind = op[1]
                if kind == "tick":
                    clock.advance(0.6)
                elif kind == "trip":
                    b.trip()
                elif b.allow():
                    b.record_success() if kind == "ok" else b.record_failure()
                trace.append((b.state, b.metrics()))
        runs.append(trace)
    assert all(run == runs[0] for run in runs)


def test_the_entry_point_is_on_both_cores() -> None:
    assert hasattr(fastbreaker.CircuitBreaker, "_fleet")


# -- the budget's entry point --------------------------------------------------------------------
def test_budget_fleet_adds_clamped_units(fb: types.SimpleNamespace, clock: FakeClock) -> None:
    from fastbreaker._options import TOKEN_UNIT as U

    b = fb.RetryBudget(ratio=0.5, capacity=10, min_per_sec=1, clock=clock)
    assert b._fleet(0) == 10 * U
    assert b._fleet(-4 * U) == 6 * U and b.tokens == 6.0
    assert b._fleet(-100 * U) == 0
    clock.advance(2.0)
    assert b._fleet(0) == 2 * U  # the lazy refill runs first
    assert b._fleet(100 * U) == 10 * U
    with pytest.raises(ValueError, match="delta"):
        b._fleet(2**63 - 1)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.integers(-30, 30), st.sampled_from(["ok", "retry", "tick"]))))
def test_budget_fleet_is_the_same_on_both_cores(script: list[object]) -> None:
    from fastbreaker._options import TOKEN_UNIT as U

    runs = []
    for ns in NAMESPACES.values():
        clock = FakeClock(10**12)
        b = ns.RetryBudget(ratio=0.25, capacity=5, min_per_sec=0.5, clock=clock)
        trace: list[object] = []
        for op in script:
            if op == "ok":
                b.record_success()
            elif op == "retry":
                trace.append(b.allow_retry())
            elif op == "tick":
                clock.advance(0.7)
            else:
                trace.append(b._fleet(int(op) * U // 4))  # type: ignore[call-overload]
        runs.append(trace)
    assert all(run == runs[0] for run in runs)
