"""Deadlines: remaining time, the current deadline (contextvars), nesting never extends."""

from __future__ import annotations

import asyncio
import datetime
import math
import threading
import types

import pytest

from fastbreaker.testing import FakeClock


def fake_clock() -> FakeClock:
    """A clock of this test's own (the ``clock`` fixture would be shared by the threads of
    pytest-run-parallel, and these tests move time)."""
    return FakeClock(10**12)


def test_after_remaining_expired(fb: types.SimpleNamespace) -> None:
    clock = fake_clock()
    d = fb.Deadline.after(2.5, clock=clock)
    assert d.remaining() == 2.5
    assert not d.expired()
    clock.advance(1)
    assert d.remaining() == 1.5
    clock.advance(1.5)
    assert d.expired()
    assert d.remaining() == 0.0
    clock.advance(10)
    assert d.remaining() == 0.0  # never negative
    assert d.expired()


def test_after_accepts_timedelta_and_zero(fb: types.SimpleNamespace) -> None:
    clock = fake_clock()
    assert fb.Deadline.after(datetime.timedelta(milliseconds=250), clock=clock).remaining() == 0.25
    assert fb.Deadline.after(0, clock=clock).expired()


@pytest.mark.parametrize("bad", [-1, math.nan, math.inf])
def test_after_rejects_bad_durations(fb: types.SimpleNamespace, bad: float) -> None:
    with pytest.raises(ValueError, match="seconds"):
        fb.Deadline.after(bad)
    with pytest.raises(TypeError, match="seconds"):
        fb.Deadline.after("1")


def test_sub_leaves_a_reserve_and_never_goes_negative(fb: types.SimpleNamespace) -> None:
    clock = fake_clock()
    d = fb.Deadline.after(1, clock=clock)
    assert d.sub() == pytest.approx(0.95, abs=1e-12)
    assert d.sub(0.3) == pytest.approx(0.7, abs=1e-12)
    assert d.sub(datetime.timedelta(seconds=0.5)) == 0.5
    assert d.sub(2) == 0.0
    clock.advance(0.97)
    assert d.sub() == 0.0
    with pytest.raises(ValueError, match="reserve"):
        d.sub(-0.1)


def test_default_clock_is_monotonic(fb: types.SimpleNamespace) -> None:
    d = fb.Deadline.after(60)
    assert 59 < d.remaining() <= 60
    assert not d.expired()
    assert "Deadline(remaining=" in repr(d)


def test_current_deadline_is_set_inside_the_block_only(fb: types.SimpleNamespace) -> None:
    clock = fake_clock()
    assert fb.current_deadline() is None
    with fb.deadline(3, clock=clock) as d:
        assert fb.current_deadline() is d
        assert d.remaining() == 3.0
    assert fb.current_deadline() is None


def test_block_restores_the_previous_deadline_on_error(fb: types.SimpleNamespace) -> None:
    clock = fake_clock()
    with fb.deadline(3, clock=clock) as outer:
        with pytest.raises(KeyError):
            with fb.deadline(1, clock=clock):
                raise KeyError
        assert fb.current_deadline() is outer
    assert fb.current_deadline() is None


def test_nested_blocks_never_extend_an_outer_deadline(fb: types.SimpleNamespace) -> None:
    clock = fake_clock()
    with fb.deadline(1, clock=clock) as outer:
        with fb.deadline(5, clock=clock) as inner:
            assert inner is outer  # the earlier one wins
            assert fb.current_deadline().remaining() == 1.0
        with fb.deadline(0.25, clock=clock) as tighter:
            assert tighter is not outer
            assert fb.current_deadline().remaining() == 0.25
        assert fb.current_deadline() is outer


def test_nesting_across_clocks_compares_what_is_left(fb: types.SimpleNamespace) -> None:
    fake = FakeClock(0)
    with fb.deadline(3600) as real:  # monotonic clock
        with fb.deadline(10, clock=fake) as d:
            assert d is not real
        with fb.deadline(7200, clock=fake) as d:
            assert d is real


def test_deadline_block_takes_a_deadline_object(fb: types.SimpleNamespace) -> None:
    clock = fake_clock()
    d = fb.Deadline.after(2, clock=clock)
    clock.advance(1)  # the clock of a Deadline started when it was made
    with fb.deadline(d) as cur:
        assert cur is d
        assert cur.remaining() == 1.0


def test_deadline_clock_starts_when_the_block_is_entered(fb: types.SimpleNamespace) -> None:
    clock = fake_clock()
    scope = fb.deadline(2, clock=clock)
    clock.advance(5)
    with scope as d:
        assert d.remaining() == 2.0


def test_a_scope_cannot_be_entered_twice_at_once(fb: types.SimpleNamespace) -> None:
    clock = fake_clock()
    scope = fb.deadline(2, clock=clock)
    with scope:
        with pytest.raises(RuntimeError):
            with scope:
                pass
    with scope:  # reusable once left
        pass


def test_bad_arguments(fb: types.SimpleNamespace) -> None:
    with pytest.raises(ValueError, match="seconds"):
        fb.deadline(-1)
    with pytest.raises(TypeError):
        fb.deadline(None)
    with pytest.raises(TypeError, match="clock"):
        fb.deadline(1, clock=3)
    with pytest.raises(TypeError, match="clock"):
        fb.Deadline.after(1, clock=3)


@pytest.mark.thread_unsafe  # pytest-run-parallel cannot run coroutine tests
async def test_current_deadline_propagates_into_tasks(fb: types.SimpleNamespace) -> None:
    clock = fake_clock()

    async def read() -> object:
        await asyncio.sleep(0)
        return fb.current_deadline()

    with fb.deadline(2, clock=clock) as d:
        assert await asyncio.create_task(read()) is d
        assert await asyncio.gather(read(), read()) == [d, d]
    assert await asyncio.create_task(read()) is None


@pytest.mark.thread_unsafe
async def test_tasks_keep_their_own_deadlines(fb: types.SimpleNamespace) -> None:
    clock = fake_clock()

    async def worker(seconds: float) -> float:
        with fb.deadline(seconds, clock=clock):
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            return fb.current_deadline().remaining()

    assert await asyncio.gather(*(worker(s) for s in (1, 2, 3, 4))) == [1, 2, 3, 4]
    assert fb.current_deadline() is None


def test_threads_do_not_share_the_current_deadline(fb: types.SimpleNamespace) -> None:
    clock = fake_clock()
    seen: list[object] = []
    with fb.deadline(2, clock=clock):
        t = threading.Thread(target=lambda: seen.append(fb.current_deadline()))
        t.start()
        t.join()
    assert seen == [None]


def test_deadline_exceeded_is_a_breaker_error_and_a_timeout(fb: types.SimpleNamespace) -> None:
    assert issubclass(fb.DeadlineExceeded, fb.BreakerError)
    assert issubclass(fb.DeadlineExceeded, TimeoutError)
