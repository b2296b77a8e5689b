"""Both cores driven step by step with the same operations; every observable must agree.

Waiters are modelled deterministically by driving the shared queue API directly: ``enter`` with
a wake-up that only records, then ``settle`` with the reason the wait ended (woken, timed out,
deadline, cancelled). Each step compares admissions, ``in_flight``, ``waiting``, the limit, the
waiters' states and the metrics, and checks the invariants of the issue (never above the limit,
no newcomer barges, nobody waits while a slot is free, counts balance at quiescence).
"""

from __future__ import annotations

from typing import Any

from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import fastbreaker
from fastbreaker import _bulkhead as B
from fastbreaker.testing import FakeClock

IMPLS = fastbreaker.testing.implementations()


class Side:
    """One core, its clock, and what the test holds on it."""

    def __init__(self, ns: Any, kind: str, args: dict[str, Any]) -> None:
        self.clock = FakeClock(10**12)
        cls = ns.Bulkhead if kind == "bulkhead" else ns.AdaptiveLimiter
        self.obj = cls(**args, clock=self.clock)
        self.held = 0  # slots the test holds (it may release them)
        self.waiters: list[B.Waiter] = []
        self.woken: list[int] = []

    def snapshot(self) -> tuple[Any, ...]:
        o = self.obj
        limit = o.limit if hasattr(o, "limit") else None
        return (
            o.in_flight,
            o.waiting,
            o.max_concurrent,
            limit,
            o.metrics(),
            self.held,
            [w.state for w in self.waiters],
            list(self.woken),
        )


def outcome(fn: Any) -> Any:
    try:
        return ("ok", fn())
    except BaseException as exc:  # noqa: BLE001
        return ("err", type(exc).__name__)


class Lockstep(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.sides: list[Side] = []

    @initialize(
        kind=st.sampled_from(["bulkhead", "aimd", "gradient"]),
        cap=st.integers(1, 5),
        max_waiting=st.integers(0, 4),
    )
    def setup(self, kind: str, cap: int, max_waiting: int) -> None:
        if kind == "bulkhead":
            args: dict[str, Any] = {"max_concurrent": cap}
        else:
            args = {
                "initial_limit": float(cap) + 0.5,
                "min_limit": 1,
                "max_limit": 8,
                "algorithm": kind,
                "rtt_threshold": 0.1,
                "backoff": 0.7,
            }
        args.update(max_wait=60.0, max_waiting=max_waiting)
        self.kind = kind
        self.sides = [
            Side(ns, "bulkhead" if kind == "bulkhead" else "limiter", args) for ns in IMPLS.values()
        ]

    def each(self, fn: Any) -> Any:
        results = [outcome(lambda s=s: fn(s)) for s in self.sides]
        assert all(r == results[0] for r in results), results
        return results[0]

    @rule()
    def try_acquire(self) -> None:
        def step(s: Side) -> bool:
            got = s.obj.try_acquire()
            if got:
                assert s.obj.waiting == 0, "a newcomer barged past a waiter"
                s.held += 1
            return bool(got)

        self.each(step)

    @rule(rtt=st.one_of(st.none(), st.integers(0, 300)), dropped=st.booleans())
    def release(self, rtt: Any, dropped: bool) -> None:
        def step(s: Side) -> None:
            if s.obj.__class__.__name__ == "Bulkhead":
                s.obj.release()
            else:
                s.obj.release(None if rtt is None else rtt / 1000, dropped=dropped)
            s.held -= 1

        if self.sides[0].held == 0:
            if self.sides[0].obj.in_flight == 0:
                self.each(lambda s: s.obj.release())  # must raise and change nothing
        else:
            self.each(step)

    @rule()
    def arrive(self) -> None:
        def step(s: Side) -> str:
            n = len(s.waiters)
            w = B.enter(s.obj, lambda: s.woken.append(n))
            if w is None:
                s.held += 1
                return "admitted"
            s.waiters.append(w)
            return "queued"

        self.each(step)

    @precondition(lambda self: self.sides and self.sides[0].waiters)
    @rule(data=st.data(), reason=st.sampled_from([B.WOKEN, B.TIMED_OUT, B.EXPIRED, B.CANCELLED]))
    def end_wait(self, data: st.DataObject, reason: int) -> None:
        live = [i for i, w in enumerate(self.sides[0].waiters) if w.state != B.GONE]
        if not live:
            return
        i = data.draw(st.sampled_from(live))
        if reason == B.WOKEN and self.sides[0].waiters[i].state != B.GRANTED:
            reason = B.TIMED_OUT  # only a granted waiter is woken

        def step(s: Side) -> bool:
            got = B.settle(s.obj, s.waiters[i], reason)
            if got:
                s.held += 1
            return got

        self.each(step)

    @rule(seconds=st.sampled_from([0.0, 0.001, 0.05, 0.2]))
    def advance(self, seconds: float) -> None:
        for s in self.sides:
            s.clock.advance(seconds)

    @invariant()
    def agree(self) -> None:
        if not self.sides:
            return
        snaps = [s.snapshot() for s in self.sides]
        assert all(x == snaps[0] for x in snaps), snaps
        s = self.sides[0]
        o = s.obj
        granted = sum(1 for w in s.waiters if w.state == B.GRANTED)
        assert o.in_flight == s.held + granted
        assert o.waiting == sum(1 for w in s.waiters if w.state == B.WAITING)
        if self.kind == "bulkhead":
            assert o.in_flight <= o.max_concurrent
        if o.waiting:
            assert o.in_flight >= o.max_concurrent, "someone waits while a slot is free"
        m = o.metrics()
        assert m.peak_in_flight >= o.in_flight

    def teardown(self) -> None:
        # Quiescence: every waiter ends, every slot is released; counts balance.
        for s in self.sides:
            for w in s.waiters:
                if w.state != B.GONE:
                    if B.settle(s.obj, w, B.WOKEN if w.state == B.GRANTED else B.CANCELLED):
                        s.held += 1
            while s.held:
                s.obj.release()
                s.held -= 1
            m = s.obj.metrics()
            assert (m.in_flight, m.waiting) == (0, 0)
        snaps = [s.snapshot() for s in self.sides]
        assert all(x == snaps[0] for x in snaps), snaps


Lockstep.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
test_lockstep = Lockstep.TestCase
