"""One random sequence of operations through two LoadShedders, one over each core's Bulkhead
(the compiled one and the pure twin; two twins when the compiled core is not in use): every
decision and every metric must agree at every step.

Waiters are driven step by step through the shedder's waiting protocol (``_arrive`` with a
wake-up that only records, then ``_settle`` with how the wait ended), as
``test_bulkhead_hypothesis`` drives the bulkhead's queue, so no thread, loop or real time is
involved: the FakeClock alone moves CoDel, ``queue_timeout`` and deadlines.
"""

from __future__ import annotations

from typing import Any, Optional

from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import fastbreaker
from fastbreaker import _bulkhead_py, _select, _shed
from fastbreaker._deadline import Deadline
from fastbreaker.testing import FakeClock

if _select.COMPILED:
    from fastbreaker import _bulkhead_c

    CORES: tuple[Any, Any] = (_bulkhead_c.Bulkhead, _bulkhead_py.Bulkhead)
else:
    CORES = (_bulkhead_py.Bulkhead, _bulkhead_py.Bulkhead)


class Side:
    def __init__(self, bulkhead: Any, cap: int, opts: dict[str, Any]) -> None:
        self.clock = FakeClock(10**12)
        self.bh = bulkhead(cap)
        self.s = fastbreaker.LoadShedder(self.bh, clock=self.clock, **opts)
        self.held = 0
        self.waiters: list[Any] = []
        self.woken: list[int] = []

    def snapshot(self) -> tuple[Any, ...]:
        return (
            self.s.metrics(),
            self.bh.in_flight,
            self.held,
            [w.state for w in self.waiters],
            list(self.woken),
        )


def outcome(fn: Any) -> Any:
    try:
        return ("ok", fn())
    except fastbreaker.LoadShedError as exc:
        return ("shed", exc.reason, exc.retry_after)
    except BaseException as exc:  # noqa: BLE001
        return ("err", type(exc).__name__, str(exc))


class Lockstep(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.sides: list[Side] = []

    @initialize(
        cap=st.integers(1, 3),
        max_queue=st.integers(0, 5),
        order=st.sampled_from(_shed.ORDERS),
        queue_timeout=st.sampled_from([0.0, 0.05, 0.3, 5.0]),
        codel=st.sampled_from([(0.005, 0.1), (0.02, 0.05)]),
    )
    def setup(self, cap: int, max_queue: int, order: str, queue_timeout: float, codel: Any) -> None:
        opts = {
            "max_queue": max_queue,
            "order": order,
            "queue_timeout": queue_timeout,
            "codel_target": codel[0],
            "codel_interval": codel[1],
        }
        self.cap = cap
        self.max_queue = max_queue
        self.sides = [Side(core, cap, opts) for core in CORES]

    def each(self, fn: Any) -> Any:
        results = [outcome(lambda s=s: fn(s)) for s in self.sides]
        assert all(r == results[0] for r in results), results
        return results[0]

    @rule(level=st.integers(0, 3), dl=st.one_of(st.none(), st.sampled_from([0.0, 0.01, 0.2])))
    def arrive(self, level: int, dl: Optional[float]) -> None:
        def step(s: Side) -> str:
            n = len(s.waiters)
            d = None if dl is None else Deadline(s.clock() + int(dl * 1e9), clock=s.clock)
            w = s.s._arrive(level, d, lambda: s.woken.append(n))
            if w is None:
                s.held += 1
                return "admitted"
            s.waiters.append(w)
            return "queued"

        self.each(step)

    @rule()
    def release(self) -> None:
        if self.sides and self.sides[0].held:

            def step(s: Side) -> None:
                s.held -= 1
                s.s.__exit__(None, None, None)

            self.each(step)

    @rule(seconds=st.sampled_from([0.001, 0.004, 0.03, 0.06, 0.12, 0.5]))
    def advance(self, seconds: float) -> None:
        for s in self.sides:
            s.clock.advance(seconds)

    @precondition(lambda self: self.sides and self.sides[0].waiters)
    @rule(data=st.data(), how=st.sampled_from([_shed._WOKEN, _shed._TIMEOUT, _shed._CANCELLED]))
    def end_wait(self, data: st.DataObject, how: int) -> None:
        live = [i for i, w in enumerate(self.sides[0].waiters) if w.state != _shed._GONE]
        if not live:
            return
        i = data.draw(st.sampled_from(live))
        if how == _shed._WOKEN and self.sides[0].waiters[i].state == _shed._WAITING:
            how = _shed._TIMEOUT  # only a woken waiter reports a wake-up

        def step(s: Side) -> bool:
            got = s.s._settle(s.waiters[i], how)
            if got:
                s.held += 1
            return got

        self.each(step)

    @invariant()
    def agree(self) -> None:
        if not self.sides:
            return
        snaps = [s.snapshot() for s in self.sides]
        assert all(x == snaps[0] for x in snaps), snaps
        s = self.sides[0]
        m = s.s.metrics()
        granted = sum(1 for w in s.waiters if w.state == _shed._GRANTED)
        waiting = sum(1 for w in s.waiters if w.state == _shed._WAITING)
        assert m.in_flight == s.held + granted <= self.cap
        assert m.queue_len == waiting <= self.max_queue
        if waiting:
            assert m.in_flight == self.cap, "someone waits while a slot is free"

    def teardown(self) -> None:
        for s in self.sides:
            for w in s.waiters:
                if w.state not in (_shed._GONE,):
                    try:
                        if s.s._settle(w, _shed._CANCELLED):
                            s.held += 1
                    except fastbreaker.LoadShedError:
                        pass
            while s.held:
                s.held -= 1
                s.s.__exit__(None, None, None)
            m = s.s.metrics()
            assert (m.in_flight, m.queue_len) == (0, 0)
        snaps = [s.snapshot() for s in self.sides]
        assert all(x == snaps[0] for x in snaps), snaps


Lockstep.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
test_lockstep = Lockstep.TestCase
