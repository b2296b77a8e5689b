"""BreakerMap: one breaker per key, max_open_ratio, max_keys, callbacks, metrics, threads.

Every test takes the ``fb`` fixture, so it runs on the compiled map (``c``) and on the
pure-Python twin (``python``).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from fastbreaker import _map_steps
from fastbreaker.testing import FakeClock


def own_clock():
    """A clock of the test's own: pytest-run-parallel shares fixtures between its threads, and
    these tests move time."""
    return FakeClock(1_000_000_000_000)


def make(fb, clock, **kw):
    kw.setdefault("clock", clock)
    return fb.BreakerMap(**kw)


def fail(m, key, n=1):
    for _ in range(n):
        m.allow(key)
        m.record_failure(key)


def touch(m, key):
    """A complete call on ``key``: nothing left in flight."""
    assert m.allow(key)
    m.record_success(key)


def states(fb, m):
    return {key: m.get(key).state for key in m}


@pytest.fixture
def fast_switching():
    """Switch threads every few microseconds so that races have a chance to show."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(old)


# -- construction and bad input -------------------------------------------------------------------


@pytest.mark.parametrize("ratio", [0, 0.0, -0.5, 1.01, 2, float("nan")])
def test_bad_max_open_ratio_is_a_value_error_naming_it(fb, ratio):
    with pytest.raises(ValueError, match=r"max_open_ratio must be in \(0, 1\]"):
        fb.BreakerMap(max_open_ratio=ratio)


@pytest.mark.parametrize("ratio", ["0.5", None, True])
def test_max_open_ratio_of_wrong_type_is_a_type_error(fb, ratio):
    with pytest.raises(TypeError, match="max_open_ratio"):
        fb.BreakerMap(max_open_ratio=ratio)


@pytest.mark.parametrize("max_keys", [0, -1])
def test_bad_max_keys_is_a_value_error_naming_it(fb, max_keys):
    with pytest.raises(ValueError, match=r"max_keys must be in \[1, "):
        fb.BreakerMap(max_keys=max_keys)


@pytest.mark.parametrize("max_keys", [10.0, "10", True])
def test_max_keys_of_wrong_type_is_a_type_error(fb, max_keys):
    with pytest.raises(TypeError, match="max_keys"):
        fb.BreakerMap(max_keys=max_keys)


def test_breaker_options_are_validated_like_circuit_breaker(fb):
    with pytest.raises(ValueError, match="failure_threshold"):
        fb.BreakerMap(0)
    with pytest.raises(ValueError, match="reset_timeout"):
        fb.BreakerMap(5, -1)
    with pytest.raises(ValueError, match="failure_rate"):
        fb.BreakerMap(window=10, failure_rate=0)
    with pytest.raises(TypeError):
        fb.BreakerMap(name="x")  # a map's breakers are named after their keys
    with pytest.raises(TypeError):
        fb.BreakerMap(5, 30.0, 10)  # options after reset_timeout are keyword-only


@pytest.mark.parametrize(
    "op",
    [
        lambda m, k: m.allow(k),
        lambda m, k: m.record_success(k),
        lambda m, k: m.record_failure(k),
        lambda m, k: m[k],
        lambda m, k: m.call(k, int),
    ],
)
def test_unhashable_key_is_a_type_error_naming_it(fb, op):
    m = fb.BreakerMap()
    with pytest.raises(TypeError, match=r"key must be hashable.*\['h', 1\]"):
        op(m, ["h", 1])
    assert len(m) == 0
    with pytest.raises(TypeError):
        m.get(["h"])
    with pytest.raises(TypeError):
        ["h"] in m


# -- one breaker per key ------------------------------------------------------------------------------


def test_first_sight_creates_and_get_never_creates(fb):
    clock = own_clock()
    m = make(fb, clock)
    assert m.get("a") is None and "a" not in m and len(m) == 0
    assert m.allow("a") is True
    assert "a" in m and len(m) == 1 and list(m) == ["a"]
    b = m["a"]
    assert isinstance(b, fb.CircuitBreaker)
    assert m.get("a") is b and m["a"] is b
    assert b.name == "a"
    assert m[("db", "read")].name == "('db', 'read')"
    assert m[7].name == "7"
    assert list(m) == ["a", ("db", "read"), 7]  # creation order
    assert m.get("zzz") is None and len(m) == 3


def test_keyed_methods_drive_the_keys_breaker_only(fb):
    clock = own_clock()
    m = make(fb, clock, failure_threshold=2)
    key = ("api.example", "GET")
    fail(m, key, 2)
    assert m[key].state == fb.State.OPEN
    assert m.allow(key) is False
    assert m.allow("other") is True
    assert m["other"].state == fb.State.CLOSED
    assert m.open_keys() == [key]
    mk = m[key].metrics()
    assert (mk.permitted, mk.rejected, mk.failures, mk.opened) == (2, 1, 2, 1)


def test_record_success_with_elapsed_counts_slow_calls(fb):
    clock = own_clock()
    m = make(fb, clock, failure_threshold=2, slow_call_duration=0.5)
    m.allow("a")
    m.record_success("a", 0.75)
    m.allow("a")
    m.record_success("a", elapsed=0.75)
    assert m["a"].state == fb.State.OPEN  # consecutive mode: slow calls count as failures
    assert m["a"].metrics().slow_calls == 2


def test_call_and_with_block(fb):
    clock = own_clock()
    m = make(fb, clock, failure_threshold=1)

    def add(a, b, *, key=0):  # the map's own parameters are positional-only
        return a + b + key

    assert m.call("h", add, 1, 2, key=7) == 10
    with m["h"]:
        pass
    assert m["h"].metrics().successes == 2
    with pytest.raises(ZeroDivisionError):
        m.call("h", lambda: 1 / 0)
    with pytest.raises(fb.CircuitOpenError) as info:
        m.call("h", add, 1, 2)
    assert info.value.name == "h"
    with pytest.raises(fb.CircuitOpenError):
        with m["h"]:
            pass


@pytest.mark.thread_unsafe  # pytest-run-parallel cannot run coroutine tests
async def test_call_async(fb):
    clock = own_clock()
    m = make(fb, clock, failure_threshold=1)

    async def ok(x):
        await asyncio.sleep(0)
        return x * 2

    async def boom():
        raise OSError("down")

    assert await m.call_async("h", ok, 21) == 42
    with pytest.raises(OSError):
        await m.call_async("h", boom)
    with pytest.raises(fb.CircuitOpenError):
        await m.call_async("h", ok, 1)
    async with m["k"]:
        pass
    assert m["k"].metrics().successes == 1


def test_breakers_share_the_maps_clock_and_recover(fb):
    clock = own_clock()
    m = make(fb, clock, failure_threshold=1, reset_timeout=10)
    fail(m, "a")
    fail(m, "b")
    clock.advance(9.9)
    assert not m.allow("a")
    assert m["a"].retry_after == pytest.approx(0.1)
    clock.advance(0.1)
    assert m.allow("a")  # the probe
    assert m["a"].state == fb.State.HALF_OPEN
    m.record_success("a")
    assert m["a"].state == fb.State.CLOSED
    assert m.open_keys() == ["b"]


def test_iteration_is_a_snapshot(fb):
    m = fb.BreakerMap()
    for k in "abc":
        m.allow(k)
    for k in m:
        m.allow(k + "2")  # no "dictionary changed size during iteration"
    assert len(m) == 6


# -- the same as a standalone CircuitBreaker ----------------------------------------------------

KEYS = ["a", ("b", 1), 3]
OPS = st.one_of(
    st.tuples(
        st.sampled_from(
            [
                "allow",
                "success",
                "failure",
                "slow",
                "call_ok",
                "call_err",
                "call_ignored",
                "with_ok",
                "with_err",
                "trip",
                "isolate",
                "reset",
            ]
        ),
        st.sampled_from(KEYS),
    ),
    st.tuples(st.just("advance"), st.sampled_from([0.5, 1, 3, 6])),
)


class Ignored(Exception):
    pass


def apply(fb, target, op, keyed):
    """Run ``op`` on the breaker ``target`` (or through the map's keyed methods if ``keyed``)."""
    m, key = target if keyed else (None, None)
    b = target if not keyed else m[key]

    def boom():
        raise OSError("down")

    def ignored():
        raise Ignored()

    name = op[0]
    try:
        if name == "allow":
            return m.allow(key) if keyed else b.allow()
        if name in ("success", "slow"):
            elapsed = 1.0 if name == "slow" else None
            return m.record_success(key, elapsed) if keyed else b.record_success(elapsed)
        if name == "failure":
            return m.record_failure(key) if keyed else b.record_failure()
        if name.startswith("call"):
            fn = {"call_ok": int, "call_err": boom, "call_ignored": ignored}[name]
            return m.call(key, fn) if keyed else b.call(fn)
        if name.startswith("with"):
            with b:
                if name == "with_err":
                    raise OSError("down")
            return None
        return getattr(b, name)()  # trip / isolate / reset
    except (OSError, Ignored, fb.CircuitOpenError) as exc:
        return type(exc)


@pytest.mark.thread_unsafe  # hypothesis drives its own examples
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    window=st.sampled_from([0, 0, 3, 5]),
    threshold=st.integers(1, 3),
    min_calls=st.integers(1, 3),
    reset_timeout=st.sampled_from([0, 1, 5]),
    probes=st.integers(1, 2),
    successes=st.integers(1, 2),
    ops=st.lists(st.tuples(OPS, st.booleans()), max_size=60),
)
def test_a_key_behaves_exactly_like_a_standalone_breaker(
    fb, window, threshold, min_calls, reset_timeout, probes, successes, ops
):
    clock = FakeClock(1_000_000_000_000)
    options = dict(
        failure_threshold=threshold,
        reset_timeout=reset_timeout,
        window=window,
        min_calls=min_calls,
        half_open_max_calls=probes,
        success_threshold=successes,
        slow_call_duration=0.5,
        ignore=Ignored,
        clock=clock,
    )
    m = fb.BreakerMap(**options)
    alone = {}
    map_events, alone_events = [], []
    m.on_state_change(lambda key, old, new: map_events.append((key, old, new)))
    for op, keyed in ops:
        if op[0] == "advance":
            clock.advance(op[1])
            continue
        key = op[1]
        if key not in alone:
            alone[key] = fb.CircuitBreaker(**options, name=str(key))
            alone[key].on_state_change(
                lambda b, old, new, key=key: alone_events.append((key, old, new))
            )
        got = apply(fb, (m, key) if keyed else m[key], op, keyed)
        want = apply(fb, alone[key], op, False)
        assert got == want, op
        assert m[key].state == alone[key].state
        assert m[key].metrics() == alone[key].metrics()
        assert m[key].retry_after == alone[key].retry_after
    assert map_events == alone_events
    assert sorted(map(str, m)) == sorted(map(str, alone))
    assert sorted(map(str, m.open_keys())) == sorted(
        str(k) for k, b in alone.items() if b.state != fb.State.CLOSED
    )
    total = m.metrics()
    for name in (
        "permitted",
        "rejected",
        "successes",
        "failures",
        "slow_calls",
        "ignored",
        "stale",
        "opened",
    ):
        assert getattr(total, name) == sum(getattr(b.metrics(), name) for b in alone.values())


# -- state-change callbacks -------------------------------------------------------------------------


def test_on_state_change_gets_the_key(fb):
    clock = own_clock()
    m = make(fb, clock, failure_threshold=1, reset_timeout=1)
    seen = []

    @m.on_state_change
    def record(key, old, new):
        seen.append((key, old, new))

    assert record is not None  # returned, decorator-friendly
    key = ("db", 5432)
    fail(m, key)
    clock.advance(1)
    m.allow(key)
    m.record_success(key)
    S = fb.State
    assert seen == [
        (key, S.CLOSED, S.OPEN),
        (key, S.OPEN, S.HALF_OPEN),
        (key, S.HALF_OPEN, S.CLOSED),
    ]
    assert type(seen[0][0]) is tuple


@pytest.mark.thread_unsafe  # caplog is per test, not per thread
def test_a_raising_callback_is_logged_and_the_others_still_run(fb, caplog):
    clock = own_clock()
    m = make(fb, clock, failure_threshold=1)
    seen = []

    def bad(key, old, new):
        raise RuntimeError("callback bug")

    m.on_state_change(bad)
    m.on_state_change(lambda key, old, new: seen.append(key))
    with caplog.at_level(logging.ERROR, logger="fastbreaker"):
        fail(m, "a")
    assert seen == ["a"]
    assert m["a"].state == fb.State.OPEN
    assert "callback bug" in caplog.text


def test_on_state_change_rejects_non_callables(fb):
    with pytest.raises(TypeError, match="callback must be callable"):
        fb.BreakerMap().on_state_change(42)


def test_breaker_callbacks_and_map_callbacks_both_fire(fb):
    clock = own_clock()
    m = make(fb, clock, failure_threshold=1)
    per_breaker, per_map = [], []
    m.on_state_change(lambda key, old, new: per_map.append(key))
    m["a"].on_state_change(lambda b, old, new: per_breaker.append(b.name))
    fail(m, "a")
    fail(m, "b")
    assert per_breaker == ["a"]  # a breaker's own callback stays its own
    assert per_map == ["a", "b"]


# -- max_open_ratio --------------------------------------------------------------------------------------


@pytest.mark.parametrize("ratio, keys, allowed", [(0.29, 100, 29), (0.57, 100, 57), (0.01, 10, 1)])
def test_max_open_ratio_bounds_automatic_trips_exactly(fb, ratio, keys, allowed):
    clock = own_clock()
    # 0.29 * 100 == 28.999999999999996 and 0.57 * 100 == 56.99999999999999 in floats
    m = make(fb, clock, failure_threshold=2, max_open_ratio=ratio)
    for i in range(keys):
        m.allow(i)
    for i in range(keys):
        fail(m, i, 2)
    mm = m.metrics()
    assert (mm.open, mm.suppressed_trips, mm.keys) == (allowed, keys - allowed, keys)
    assert len(m.open_keys()) == allowed
    suppressed = m[keys - 1]
    assert suppressed.state == fb.State.CLOSED
    assert suppressed.metrics().consecutive_failures == 2  # its failures stay recorded
    fail(m, keys - 1)  # still over the bound: refused again, and counted again
    assert suppressed.state == fb.State.CLOSED
    assert m.metrics().suppressed_trips == keys - allowed + 1


def test_default_ratio_never_suppresses(fb):
    clock = own_clock()
    m = make(fb, clock, failure_threshold=1)
    for k in "abcd":
        fail(m, k)
    mm = m.metrics()
    assert (mm.open, mm.suppressed_trips) == (4, 0)


def test_manual_trip_and_isolate_are_never_suppressed(fb):
    clock = own_clock()
    m = make(fb, clock, failure_threshold=1, max_open_ratio=0.25)
    for k in "abcd":
        m.allow(k)  # 4 keys: bound 1
    fail(m, "a")
    fail(m, "b")
    assert m["b"].state == fb.State.CLOSED
    m["b"].trip()
    m["c"].isolate()
    assert states(fb, m) == {
        "a": fb.State.OPEN,
        "b": fb.State.OPEN,
        "c": fb.State.ISOLATED,
        "d": fb.State.CLOSED,
    }
    mm = m.metrics()
    assert (mm.open, mm.isolated, mm.suppressed_trips) == (2, 1, 1)
    fail(m, "d")
    assert m["d"].state == fb.State.CLOSED


def test_half_open_counts_toward_the_bound_and_its_retrip_is_not_suppressed(fb):
    clock = own_clock()
    m = make(fb, clock, failure_threshold=1, reset_timeout=1, max_open_ratio=0.5)
    for k in "ab":
        m.allow(k)  # bound 1
    fail(m, "a")
    clock.advance(1)
    assert m.allow("a")
    assert m["a"].state == fb.State.HALF_OPEN
    fail(m, "b")  # a HALF_OPEN breaker holds the only place
    assert m["b"].state == fb.State.CLOSED
    m.record_failure("a")  # the probe fails: re-trip from HALF_OPEN, never suppressed
    assert m["a"].state == fb.State.OPEN
    assert m["a"].metrics().opened == 2
    clock.advance(2)
    assert m.allow("a")
    m.record_success("a")  # a closes: its place is free again
    fail(m, "b")
    assert m["b"].state == fb.State.OPEN
    mm = m.metrics()
    assert (mm.open, mm.half_open, mm.suppressed_trips) == (1, 0, 1)


def test_isolated_counts_toward_the_bound(fb):
    clock = own_clock()
    m = make(fb, clock, failure_threshold=1, max_open_ratio=0.5)
    for k in "ab":
        m.allow(k)
    m["a"].isolate()
    fail(m, "b")
    assert m["b"].state == fb.State.CLOSED
    m["a"].reset()
    fail(m, "b")
    assert m["b"].state == fb.State.OPEN


def test_window_mode_trips_are_bounded_too(fb):
    clock = own_clock()
    m = make(fb, clock, window=4, min_calls=2, failure_rate=0.5, max_open_ratio=0.5)
    for k in "ab":
        m.allow(k)
    fail(m, "a", 2)
    fail(m, "b", 2)
    assert (m["a"].state, m["b"].state) == (fb.State.OPEN, fb.State.CLOSED)
    assert m["b"].metrics().failure_rate == 1.0
    assert m.metrics().suppressed_trips == 1


# -- max_keys --------------------------------------------------------------------------------------------------


def test_idle_breakers_are_dropped_first_oldest_first(fb):
    clock = own_clock()
    m = make(fb, clock, failure_threshold=5, max_keys=3)
    for k in "abc":
        touch(m, k)
    fail(m, "a")  # a carries information: one consecutive failure
    touch(m, "d")
    assert list(m) == ["a", "c", "d"]  # b was the oldest idle one
    touch(m, "e")
    touch(m, "f")
    assert list(m) == ["a", "e", "f"]
    assert len(m) == 3 and m.metrics().evicted == 3
    assert m["a"].metrics().consecutive_failures == 1


def test_then_the_oldest_closed_breakers_are_dropped(fb):
    clock = own_clock()
    m = make(fb, clock, failure_threshold=5, max_keys=3)
    for k in "abc":
        fail(m, k)
    m.allow("d")
    assert list(m) == ["b", "c", "d"]
    assert m.metrics().evicted == 1


def test_a_success_makes_a_breaker_idle_again(fb):
    clock = own_clock()
    m = make(fb, clock, failure_threshold=5, max_keys=2)
    fail(m, "a")
    fail(m, "b")
    m.allow("a")
    m.record_success("a")  # consecutive failures back to 0
    m.allow("c")
    assert list(m) == ["b", "c"]


def test_window_failures_and_slow_calls_are_information(fb):
    clock = own_clock()
    m = make(fb, clock, window=10, min_calls=5, slow_call_duration=0.5, max_keys=3)
    fail(m, "a")
    m.allow("a")
    m.record_success("a")  # consecutive failures 0, but a failure is in the window
    m.allow("b")
    m.record_success("b", 1.0)  # a slow call is in the window
    m.allow("c")
    m.record_success("c")
    assert m["a"].metrics().consecutive_failures == 0
    m.allow("d")
    assert list(m) == ["a", "b", "d"]


def test_open_half_open_and_isolated_are_never_dropped(fb):
    clock = own_clock()
    m = make(fb, clock, failure_threshold=1, reset_timeout=1, max_keys=3)
    fail(m, "a")
    fail(m, "b")
    clock.advance(1)
    assert m.allow("b")  # HALF_OPEN
    m["c"].isolate()
    fail(m, "x")
    mm = m.metrics()
    assert (mm.keys, mm.open, mm.half_open, mm.isolated, mm.evicted) == (3, 1, 1, 1, 0)
    assert list(m) == ["a", "b", "c"]


def test_a_new_key_in_a_map_full_of_open_breakers_is_untracked(fb):
    clock = own_clock()
    # Documented: every held breaker is OPEN/HALF_OPEN/ISOLATED, so none may be dropped; a new
    # key gets a fresh CLOSED breaker that the map does not hold.
    m = make(fb, clock, failure_threshold=1, max_keys=2)
    seen = []
    m.on_state_change(lambda key, old, new: seen.append(key))
    fail(m, "a")
    fail(m, "b")
    assert m.allow("new") is True  # admitted: nothing is known about it
    assert "new" not in m and len(m) == 2
    m.record_failure("new")
    assert m.allow("new") is True  # nothing is remembered
    b = m["new"]
    assert b.name == "new" and b.state == fb.State.CLOSED
    b.allow()
    b.record_failure()
    assert b.state == fb.State.OPEN  # the object itself works, outside the map
    mm = m.metrics()
    assert (mm.keys, mm.open, mm.untracked, mm.evicted) == (2, 2, 4, 0)
    assert mm.permitted == 2 and mm.failures == 2  # untracked calls are not in the totals
    assert seen == ["a", "b"]
    m["a"].reset()
    m.allow("new")  # room again: a is idle now
    assert list(m) == ["b", "new"]


def test_a_dropped_breaker_keeps_working_but_no_longer_affects_the_map(fb):
    clock = own_clock()
    m = make(fb, clock, failure_threshold=1, max_keys=1, max_open_ratio=0.5)
    seen = []
    m.on_state_change(lambda key, old, new: seen.append(key))
    old = m["a"]
    old.allow()
    old.record_success()
    m.allow("b")  # a is dropped
    assert "a" not in m and m.get("a") is None
    old.allow()
    old.record_failure()
    assert old.state == fb.State.OPEN  # it works
    assert seen == []  # no map callback
    assert m.open_keys() == [] and m.metrics().open == 0
    fail(m, "b")  # and it takes no share of max_open_ratio (bound 1)
    assert m["b"].state == fb.State.OPEN
    assert seen == ["b"]
    mm = m.metrics()
    # totals: a counted up to its drop (1 permitted, 1 success), b's own calls
    assert (mm.permitted, mm.successes, mm.failures, mm.evicted) == (3, 1, 1, 1)
    assert m["a"] is not old and m["a"].metrics().permitted == 0  # a new key again


def test_a_dropped_breaker_keeps_its_own_callbacks(fb):
    clock = own_clock()
    m = make(fb, clock, failure_threshold=1, max_keys=1)
    mine, maps = [], []
    m.on_state_change(lambda key, old, new: maps.append(key))
    b = m["a"]
    b.on_state_change(lambda br, old, new: mine.append(new))
    m.allow("b")  # drops a
    b.allow()
    b.record_failure()
    assert mine == [fb.State.OPEN]
    assert maps == []


def test_a_breaker_that_left_closed_before_the_drop_is_kept(fb):
    clock = own_clock()
    # The drop re-checks the state atomically: a breaker that tripped after the scan stays.
    m = make(fb, clock, failure_threshold=1, max_keys=5, max_open_ratio=1.0)
    for k in "abc":
        m.allow(k)
    fail(m, "a")
    _map_steps._drop(m, "a", m["a"])
    assert "a" in m and m.metrics().evicted == 0 and m.metrics().open == 1
    assert list(m) == ["b", "c", "a"]
    m["a"].reset()
    assert m.metrics().open == 0 and m.open_keys() == []


def test_room_is_made_in_batches_for_large_maps(fb):
    clock = own_clock()
    m = make(fb, clock, max_keys=128)  # room for 128 // 64 = 2 keys at once
    for i in range(128):
        m.allow(i)
    m.allow(128)
    assert len(m) == 127 and list(m)[:2] == [2, 3]
    m.allow(129)
    assert len(m) == 128 and m.metrics().evicted == 2
    for i in range(130, 1130):
        m.allow(i)
        assert len(m) <= 128


EVICTION_OPS = st.tuples(
    st.sampled_from(["allow", "success", "failure", "slow", "trip", "isolate", "reset", "advance"]),
    st.integers(0, 9),
)


@pytest.mark.thread_unsafe  # hypothesis drives its own examples
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    max_keys=st.sampled_from([1, 2, 4]),
    window=st.sampled_from([0, 4]),
    ops=st.lists(EVICTION_OPS, max_size=80),
)
def test_eviction_follows_the_documented_order(fb, max_keys, window, ops):
    # A model of the eviction rule, checked before every operation on a key not held.
    clock = FakeClock(1_000_000_000_000)
    m = fb.BreakerMap(
        failure_threshold=2,
        reset_timeout=2,
        window=window,
        min_calls=2,
        slow_call_duration=0.5,
        max_keys=max_keys,
        clock=clock,
    )
    evicted = untracked = 0
    for name, key in ops:
        if name == "advance":
            clock.advance(1)
            continue
        held = list(m)
        expected = held
        if key not in held:
            if len(held) < max_keys:
                expected = held + [key]
            else:
                snap = {k: m.get(k).metrics() for k in held}
                closed = [k for k in held if snap[k].state == fb.State.CLOSED]
                busy = [k for k in closed if _map_steps._in_flight(snap[k])]
                closed = [k for k in closed if k not in busy]
                idle = [k for k in closed if _map_steps._carries_no_information(snap[k])]
                victims = (idle + [k for k in closed if k not in idle] + busy)[:1]
                if victims:
                    expected = [k for k in held if k not in victims] + [key]
                    evicted += 1
                else:
                    untracked += 1
        if name in ("trip", "isolate", "reset"):
            getattr(m[key], name)()
        elif name == "allow":
            m.allow(key)
        elif name == "failure":
            m.record_failure(key)
        else:
            m.record_success(key, 1.0 if name == "slow" else None)
        assert list(m) == expected
        mm = m.metrics()
        assert (mm.evicted, mm.untracked) == (evicted, untracked)
        assert m._group.size == len(m) and m._group.open == mm.open + mm.half_open + mm.isolated


def test_totals_are_cumulative_and_include_dropped_breakers(fb):
    clock = own_clock()
    m = make(fb, clock, failure_threshold=3, max_keys=4)
    for i in range(50):
        m.allow(i)
        m.record_success(i)
        if i % 5 == 0:
            m.allow(i)
            m.record_failure(i)
    mm = m.metrics()
    assert mm.keys == 4 and mm.evicted == 46
    assert (mm.permitted, mm.successes, mm.failures) == (60, 50, 10)


def test_the_map_counts_keys_for_the_bound(fb):
    clock = own_clock()
    m = make(fb, clock, failure_threshold=1, max_keys=4, max_open_ratio=0.5)
    for i in range(10):
        m.allow(i)
    assert m._group.size == len(m) == 4  # dropped breakers leave the group
    fail(m, 8)
    fail(m, 9)
    fail(m, 7)
    assert m.metrics().open == 2  # floor(0.5 * 4)


# -- no threads, ever ----------------------------------------------------------------------------------


@pytest.mark.thread_unsafe  # it counts the process's threads
def test_no_threads_timers_or_tasks(fb):
    clock = own_clock()
    before = threading.enumerate()
    m = make(fb, clock, failure_threshold=1, reset_timeout=1, max_keys=3, window=0)
    for i in range(10):
        fail(m, i)
        m.allow(i)
    clock.advance(5)
    for k in list(m):
        m.allow(k)
        m.record_success(k)
    m.metrics()
    m.open_keys()

    async def ok():
        return 1

    asyncio.run(m.call_async("z", ok))
    assert threading.enumerate() == before


# -- threads ---------------------------------------------------------------------------------------------------


def run_threads(n, target):
    errors = []
    barrier = threading.Barrier(n)

    def body(i):
        try:
            barrier.wait()
            target(i)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


@pytest.mark.thread_unsafe  # it runs its own threads
def test_threads_conserve_every_outcome(fb, fast_switching):
    m = fb.BreakerMap(failure_threshold=10**9, window=0)
    n, rounds = 4, 2000

    def work(i):
        for r in range(rounds):
            for key in ("shared", f"own-{i}", f"pair-{i % 2}"):
                assert m.allow(key)
                if r % 3:
                    m.record_success(key)
                else:
                    m.record_failure(key)

    run_threads(n, work)
    mm = m.metrics()
    calls = n * rounds * 3
    assert mm.keys == 1 + n + 2
    assert mm.permitted == calls
    assert mm.successes + mm.failures == calls
    assert mm.failures == n * 3 * len(range(0, rounds, 3))
    assert m["shared"].metrics().permitted == n * rounds
    assert m["pair-0"].metrics().permitted == (n // 2) * rounds


@pytest.mark.thread_unsafe  # it runs its own threads
def test_threads_never_create_two_breakers_for_one_key(fb, fast_switching):
    m = fb.BreakerMap()
    n, keys = 4, [f"host-{i}" for i in range(300)]
    got = [[] for _ in range(n)]

    def work(i):
        for k in keys:
            got[i].append(m[k] if i % 2 else (m.allow(k), m.get(k))[1])

    run_threads(n, work)
    for j in range(len(keys)):
        assert len({id(got[i][j]) for i in range(n)}) == 1
    assert len(m) == len(keys) == m._group.size
    assert m.metrics().permitted == (n // 2) * len(keys)


@pytest.mark.thread_unsafe  # it runs its own threads
def test_threads_never_exceed_max_keys_and_keep_the_counts_right(fb, fast_switching):
    m = fb.BreakerMap(failure_threshold=2, reset_timeout=0, max_keys=40, max_open_ratio=0.5)
    n, rounds = 4, 600
    sizes = []

    def work(i):
        for r in range(rounds):
            key = f"k-{(r * 7 + i * 13) % 90}"
            if m.allow(key):
                if (r + i) % 4 == 0:
                    m.record_failure(key)
                else:
                    m.record_success(key)
            if r % 50 == 0:
                m[f"k-{r % 90}"].reset()
            sizes.append(len(m))

    run_threads(n, work)
    assert max(sizes) <= 40
    held = [m.get(k) for k in m]
    assert len(held) == len(m) <= 40
    # the core's counters for the bound agree with the breakers actually held
    assert m._group.size == len(m)
    assert m._group.open == sum(b.state != fb.State.CLOSED for b in held)
    mm = m.metrics()
    assert mm.evicted > 0
    assert mm.keys + mm.evicted + mm.untracked >= 90 - 40


def test_detach_swaps_the_config_only_of_closed_breakers(fb):
    clock = own_clock()
    m = make(fb, clock, failure_threshold=1, max_open_ratio=0.5)
    for k in "abcd":
        m.allow(k)
    fail(m, "a")
    m["b"].isolate()
    for k in "ab":
        assert m._detach(m[k], m._config, m._detached) is False
        assert m[k]._config is m._config
    assert m._detach(m["c"], m._config, m._detached) is True
    assert m["c"]._config is m._detached
    m["d"].on_state_change(lambda b, old, new: None)  # a private config, still in the group
    private = m["d"]._config
    assert m._detach(m["d"], m._config, m._detached) is True
    detached = m["d"]._config
    assert detached is not private and detached is not m._detached
    assert detached.group is None and detached.hook is None
    assert len(detached.listeners) == 1


@pytest.mark.thread_unsafe  # it runs its own threads
def test_threads_evicting_while_tripping_keep_the_open_count_exact(fb, fast_switching):
    # Eviction races with trips of the breakers it drops (threads hold them, as `with m[key]:`
    # does): a trip that slipped in between the eviction's state check and its config swap
    # would leave the group's count of non-CLOSED breakers off forever.
    m = fb.BreakerMap(failure_threshold=1, reset_timeout=0, max_keys=6)
    n, rounds = 4, 3000

    def work(i):
        for r in range(rounds):
            b = m[(r * 5 + i * 3) % 12]
            for j in range(3):
                if b.allow():
                    if (r + i + j) % 3:
                        b.record_success()
                    else:
                        b.record_failure()

    run_threads(n, work)
    held = [m.get(k) for k in m]
    assert len(held) <= 6 and m._group.size == len(held)
    assert m._group.open == sum(b.state != fb.State.CLOSED for b in held)
    assert m.metrics().evicted > 0
