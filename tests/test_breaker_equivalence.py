"""The compiled core and the pure-Python twin are observably identical.

A hypothesis state machine builds one breaker per implementation with the same random options
and fake clocks, applies the same random operations to both (raw allow/record, permit-based
call outcomes that may arrive late, guarded calls through a ``failure_on`` predicate that may
raise, clock advances, a clock that returns garbage for a while, trip/reset/isolate) and
compares every decision and every error, the state, ``retry_after`` and the full metrics
snapshot after each step. The options cover the count window, the time window
(``window_seconds``), ``dry_run`` and the latency histogram.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import uuid

import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import fastbreaker
from fastbreaker import _breaker_py
from fastbreaker.testing import FakeClock

pytestmark = pytest.mark.skipif(not fastbreaker.COMPILED, reason="needs the compiled core")

OUTCOMES = st.sampled_from([0, 1, 2, 3, 4])  # success, slow, failure, neutral, timeout
BAD_READINGS = st.sampled_from([-1, 2**63, None, "1", 1.5, True])


class Boom(Exception):
    pass


class Other(Exception):
    pass


class Weird(Exception):
    """The predicate raises on it (a failure, logged)."""


def predicate(exc: BaseException) -> bool:
    if isinstance(exc, Weird):
        raise RuntimeError("the predicate itself fails")
    return isinstance(exc, (Boom, TimeoutError))


class HostileClock(FakeClock):
    """A fake clock that can return a reading the cores must refuse."""

    bad: object = None
    broken = False

    def __call__(self) -> int:
        if self.broken:
            return self.bad  # type: ignore[return-value]
        return super().__call__()


def outcome_of(fn):
    """The result of ``fn()``, or the type of what it raised: compared between the cores."""
    try:
        return ("ok", fn())
    except Exception as e:
        return ("raised", type(e).__name__)


class SameBehaviour(RuleBasedStateMachine):
    @initialize(
        window=st.sampled_from([0, 0, 1, 3, 5, 10]),
        window_seconds=st.sampled_from([None, None, 1, 3, 20]),
        window_buckets=st.sampled_from([1, 3, 10]),
        dry_run=st.booleans(),
        record_latency=st.booleans(),
        failure_threshold=st.integers(1, 5),
        min_calls=st.integers(1, 6),
        failure_rate=st.sampled_from([0.1, 0.3, 0.5, 0.7, 1.0]),
        slow=st.sampled_from([None, 0.5]),
        slow_rate=st.sampled_from([0.5, 1.0]),
        reset_timeout=st.sampled_from([0, 1, 5]),
        max_reset=st.sampled_from([None, 12, 40]),
        probes=st.integers(1, 3),
        successes=st.integers(1, 3),
        probe_timeout=st.sampled_from([None, 2, 7]),
        events=st.booleans(),
        use_predicate=st.booleans(),
        shared=st.booleans() if sys.platform != "win32" else st.just(False),
    )
    def build(
        self,
        window,
        window_seconds,
        window_buckets,
        dry_run,
        record_latency,
        failure_threshold,
        min_calls,
        failure_rate,
        slow,
        slow_rate,
        reset_timeout,
        max_reset,
        probes,
        successes,
        probe_timeout,
        events,
        use_predicate,
        shared,
    ):
        from fastbreaker import _breaker_c

        kw = dict(
            failure_threshold=failure_threshold,
            reset_timeout=reset_timeout,
            window=0 if window_seconds else window,
            window_seconds=window_seconds,
            window_buckets=window_buckets,
            dry_run=dry_run,
            record_latency=record_latency,
            latency_buckets=(0.2, 1.0) if record_latency and use_predicate else None,
            min_calls=min_calls,
            failure_rate=failure_rate,
            slow_call_duration=slow,
            slow_call_rate=slow_rate,
            half_open_max_calls=probes,
            success_threshold=successes,
            max_reset_timeout=max(max_reset, reset_timeout) if max_reset else None,
            probe_timeout=probe_timeout,
            failure_on=predicate if use_predicate else (Boom, Weird, TimeoutError),
        )
        self.clocks = [HostileClock(10**12), HostileClock(10**12)]
        self.regions = []
        if shared:
            # the same state machine with its state in a SharedRegion, on each core
            from fastbreaker._region import MIN_SIZE, region_class

            for core, clock in zip(("c", "python"), self.clocks):
                r = region_class(core)(f"fbeq-{uuid.uuid4().hex[:12]}", size=MIN_SIZE, clock=clock)
                r.unlink()  # this process's mapping stays until close()
                self.regions.append(r)
            self.breakers = [r.breaker("eq", **kw) for r in self.regions]
        else:
            self.breakers = [
                _breaker_c.CircuitBreaker(**kw, clock=self.clocks[0]),
                _breaker_py.CircuitBreaker(**kw, clock=self.clocks[1]),
            ]
        self.events = [[], []]
        if events:
            for b, log in zip(self.breakers, self.events):
                b.on_state_change(lambda br, o, n, log=log: log.append((o, n)))
        self.permits = []  # pairs of permits (c, python) of calls still running

    def both(self, fn):
        a, b = (outcome_of(lambda x=x: fn(x)) for x in self.breakers)
        assert a == b
        return a

    @rule(
        kind=st.sampled_from(["return", "Boom", "Other", "Weird", "Timeout"]),
        takes=st.sampled_from([0, 0.1, 0.7]),
    )
    def call(self, kind, takes):
        def fn(clock):
            if not clock.broken:
                clock.advance(takes)  # the call takes time on its own breaker's clock
            if kind != "return":
                raise {"Boom": Boom, "Other": Other, "Weird": Weird, "Timeout": TimeoutError}[
                    kind
                ]()
            return 1

        ra, rp = (
            outcome_of(lambda b=b, c=c: b.call(fn, c)) for b, c in zip(self.breakers, self.clocks)
        )
        assert ra == rp

    @rule(bad=BAD_READINGS)
    def clock_goes_bad(self, bad):
        for c in self.clocks:
            c.bad, c.broken = bad, True

    @rule()
    def clock_recovers(self):
        for c in self.clocks:
            c.broken = False

    @rule()
    def allow(self):
        self.both(lambda b: b.allow())

    @rule(elapsed=st.sampled_from([None, 0.1, 0.5, 2.0]))
    def record_success(self, elapsed):
        self.both(lambda b: b.record_success(elapsed))

    @rule()
    def record_failure(self):
        self.both(lambda b: b.record_failure())

    @rule()
    def start_call(self):
        def take(b):
            try:
                return b._permit_or_raise()
            except Exception as e:  # CircuitOpenError, or the clock's error
                return (type(e).__name__, getattr(e, "state", None), getattr(e, "retry_after", 0))

        a = take(self.breakers[0])
        p = take(self.breakers[1])
        assert (a if isinstance(a, tuple) else "ok") == (p if isinstance(p, tuple) else "ok")
        if not isinstance(a, tuple):
            self.permits.append((a, p))

    @rule(data=st.data(), outcome=OUTCOMES)
    def finish_call(self, data, outcome):
        if not self.permits:
            return
        i = data.draw(st.integers(0, len(self.permits) - 1))
        a, p = self.permits.pop(i)
        ra = outcome_of(lambda: self.breakers[0]._finish(a, outcome))
        rp = outcome_of(lambda: self.breakers[1]._finish(p, outcome))
        assert ra == rp

    @rule(seconds=st.sampled_from([0.1, 0.5, 1, 2, 5, 13]))
    def advance(self, seconds):
        for c in self.clocks:
            c.advance(seconds)

    @rule()
    def trip(self):
        self.both(lambda b: b.trip())

    @rule()
    def isolate(self):
        self.both(lambda b: b.isolate())

    @rule()
    def reset(self):
        self.both(lambda b: b.reset())

    def teardown(self):
        if getattr(self, "regions", None):
            self.breakers = []
            self.permits = []
            gc.collect()
            for r in self.regions:
                # a traceback kept by a logged error may still hold a breaker: its mapping then
                # stays until the process ends (the name is already unlinked, nothing leaks)
                with contextlib.suppress(BufferError):
                    r.close()

    @invariant()
    def identical(self):
        if not hasattr(self, "breakers"):
            return
        c, p = self.breakers
        assert c.state == p.state
        assert outcome_of(lambda: c.retry_after) == outcome_of(lambda: p.retry_after)
        assert c.metrics() == p.metrics()
        assert self.events[0] == self.events[1]


SameBehaviour.TestCase.settings = settings(
    max_examples=int(os.environ.get("FB_HYPOTHESIS_EXAMPLES", "60")),  # .ci/run slow: 400
    stateful_step_count=60,
    deadline=None,
)
test_same_behaviour = SameBehaviour.TestCase
