"""The compiled BreakerMap and its pure-Python twin are observably identical.

A hypothesis state machine builds one map per core with the same random options (``max_keys``
small enough to force eviction, ``max_open_ratio`` small enough to suppress trips) and fake
clocks, applies the same random operations to both (raw allow/record on several keys, guarded
calls, calls still in flight while other keys churn and evict, ``trip``/``reset``/``isolate``
through ``m[key]``, clock advances) and compares every decision, the held keys in order, each
key's state, ``retry_after`` and metrics, the map's callbacks and ``MapMetrics`` after each step.

Raising ``failure_on`` predicates are left out: what a raising predicate does is the call
paths' business (issue 11 item 4), not the map's.
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
from fastbreaker import _breaker_py, _map
from fastbreaker.testing import FakeClock

pytestmark = pytest.mark.skipif(not fastbreaker.COMPILED, reason="needs the compiled core")

KEYS = st.sampled_from(["a", "b", "c", "d", "e", None, ("h", 1)])
OTHER_KEYS = st.lists(st.sampled_from(["a", "b", "c", "d", "e", "f", "g", 7]), max_size=8)
# what a guarded call does: return, raise a failure, raise an ignored error, be slow
CALL_OUTCOMES = st.sampled_from(["ok", "fail", "ignored", "slow"])
OUTCOMES = st.sampled_from([0, 1, 2, 3])  # success, slow, failure, neutral


class Ignored(Exception):
    pass


def _str_key(key: object) -> str:
    return key if isinstance(key, str) else repr(key)


class StrKeys:
    """A shared map (str/bytes keys only) seen through this test's keys (repr of the others)."""

    def __init__(self, m, capacity):
        self.m = m
        self._max_keys = capacity
        self._group = m._group

    def allow(self, key):
        return self.m.allow(_str_key(key))

    def record_success(self, key, elapsed=None):
        return self.m.record_success(_str_key(key), elapsed)

    def record_failure(self, key):
        return self.m.record_failure(_str_key(key))

    def call(self, key, fn, *args, **kwargs):
        return self.m.call(_str_key(key), fn, *args, **kwargs)

    def __getitem__(self, key):
        return self.m[_str_key(key)]

    def get(self, key):
        return self.m.get(_str_key(key))

    def __contains__(self, key):
        return _str_key(key) in self.m

    def __iter__(self):
        return iter(self.m)

    def __len__(self):
        return len(self.m)

    def metrics(self):
        return self.m.metrics()

    def open_keys(self):
        return self.m.open_keys()

    def on_state_change(self, callback):
        return self.m.on_state_change(callback)


class SameMaps(RuleBasedStateMachine):
    @initialize(
        window=st.sampled_from([0, 0, 3, 5]),
        failure_threshold=st.integers(1, 3),
        min_calls=st.integers(1, 4),
        reset_timeout=st.sampled_from([0, 1, 5]),
        probes=st.integers(1, 2),
        successes=st.integers(1, 2),
        probe_timeout=st.sampled_from([None, 2]),
        slow=st.sampled_from([None, 0.5]),
        max_keys=st.sampled_from([1, 2, 3, 4, None]),
        ratio=st.sampled_from([0.2, 0.5, 1.0]),
        events=st.booleans(),
        shared=st.booleans() if sys.platform != "win32" else st.just(False),
    )
    def build(
        self,
        window,
        failure_threshold,
        min_calls,
        reset_timeout,
        probes,
        successes,
        probe_timeout,
        slow,
        max_keys,
        ratio,
        events,
        shared,
    ):
        from fastbreaker import _breaker_c

        kw = dict(
            failure_threshold=failure_threshold,
            reset_timeout=reset_timeout,
            window=window,
            min_calls=min_calls,
            failure_rate=0.5,
            slow_call_duration=slow,
            half_open_max_calls=probes,
            success_threshold=successes,
            probe_timeout=probe_timeout,
            ignore=(Ignored,),
            max_keys=max_keys,
            max_open_ratio=ratio,
        )
        self.clocks = [FakeClock(10**12), FakeClock(10**12)]
        self.regions = []
        if shared:
            # the same operations on a shared map (SharedRegion) of each core
            from fastbreaker._region import region_class

            capacity = kw.pop("max_keys") or 8
            self.maps = []
            for core, clock in zip(("c", "python"), self.clocks):
                r = region_class(core)(f"fbmeq-{uuid.uuid4().hex[:12]}", size=1 << 18, clock=clock)
                r.unlink()  # this process's mapping stays until close()
                self.regions.append(r)
                self.maps.append(StrKeys(r.breaker_map("m", capacity=capacity, **kw), capacity))
        else:
            self.maps = [
                _map.map_class(core)(**kw, clock=clock)
                for core, clock in zip((_breaker_c, _breaker_py), self.clocks)
            ]
        self.events = [[], []]
        if events:
            for m, log in zip(self.maps, self.events):
                m.on_state_change(lambda key, o, n, log=log: log.append((key, o, n)))
        self.inflight = []  # (breaker_c, permit_c, breaker_py, permit_py) of running calls

    def both(self, fn):
        a, b = (fn(i, m) for i, m in enumerate(self.maps))
        assert a == b
        return a

    def guarded(self, i, m, key, outcome, others=()):
        """``m.call(key, fn)``: fn touches ``others`` (evicting keys meanwhile), then ends."""
        clock = self.clocks[i]

        def fn():
            for k in others:
                try:
                    m.call(k, lambda: None)
                except Exception as e:
                    touched.append(type(e).__name__)
            if outcome == "slow":
                clock.advance(1)
            if outcome == "fail":
                raise ValueError
            if outcome == "ignored":
                raise Ignored
            return "ok"

        touched = []
        try:
            result = m.call(key, fn)
        except Exception as e:
            result = (type(e).__name__, getattr(e, "state", None), getattr(e, "name", None))
        return result, touched

    @rule(key=KEYS)
    def allow(self, key):
        self.both(lambda i, m: m.allow(key))

    @rule(key=KEYS, elapsed=st.sampled_from([None, 0.1, 2.0]))
    def record_success(self, key, elapsed):
        self.both(lambda i, m: m.record_success(key, elapsed))

    @rule(key=KEYS)
    def record_failure(self, key):
        self.both(lambda i, m: m.record_failure(key))

    @rule(key=KEYS, outcome=CALL_OUTCOMES)
    def call(self, key, outcome):
        self.both(lambda i, m: self.guarded(i, m, key, outcome))

    @rule(key=KEYS, outcome=CALL_OUTCOMES, others=OTHER_KEYS)
    def call_while_others_churn(self, key, outcome, others):
        self.both(lambda i, m: self.guarded(i, m, key, outcome, others))

    @rule(key=KEYS)
    def start_call(self, key):
        """A call admitted now that reports later (``with m[key]:`` split in two)."""

        def take(i, m):
            b = m[key]
            try:
                return b, b._permit_or_raise()
            except Exception as e:  # CircuitOpenError
                return b, (type(e).__name__, e.state, e.name, e.retry_after)

        (bc, pc), (bp, pp) = (take(i, m) for i, m in enumerate(self.maps))
        assert (pc if isinstance(pc, tuple) else "ok") == (pp if isinstance(pp, tuple) else "ok")
        if not isinstance(pc, tuple):
            self.inflight.append((bc, pc, bp, pp))

    @rule(data=st.data(), outcome=OUTCOMES)
    def finish_call(self, data, outcome):
        if not self.inflight:
            return
        bc, pc, bp, pp = self.inflight.pop(data.draw(st.integers(0, len(self.inflight) - 1)))
        bc._finish(pc, outcome)
        bp._finish(pp, outcome)

    @rule(key=KEYS, action=st.sampled_from(["trip", "reset", "isolate"]))
    def manual(self, key, action):
        self.both(lambda i, m: getattr(m[key], action)())

    @rule(key=KEYS)
    def get(self, key):
        self.both(lambda i, m: (m.get(key) is None, key in m))

    @rule(seconds=st.sampled_from([0.5, 1, 2, 5]))
    def advance(self, seconds):
        for c in self.clocks:
            c.advance(seconds)

    def teardown(self):
        if getattr(self, "regions", None):
            self.maps, self.inflight = [], []
            gc.collect()
            for r in self.regions:
                with contextlib.suppress(BufferError):  # a kept traceback may hold a breaker
                    r.close()

    @invariant()
    def identical(self):
        if not hasattr(self, "maps"):
            return
        c, p = self.maps
        assert list(c) == list(p)
        assert len(c) == len(p)
        for key in list(c):
            bc, bp = c.get(key), p.get(key)
            assert bc.state == bp.state, key
            assert bc.name == bp.name == str(key)
            assert bc.retry_after == bp.retry_after, key
            assert bc.metrics() == bp.metrics(), key
        assert c.metrics() == p.metrics()
        assert c.open_keys() == p.open_keys()
        assert (c._group.open, c._group.size) == (p._group.open, p._group.size)
        assert c._group.open == len(c.open_keys())
        assert self.events[0] == self.events[1]
        # every call admitted by a held or dropped breaker has reported, or is still running
        for m in self.maps:
            mm = m.metrics()
            assert mm.keys <= (m._max_keys or mm.keys)


SameMaps.TestCase.settings = settings(
    max_examples=int(os.environ.get("FB_HYPOTHESIS_EXAMPLES", "60")),  # .ci/run slow: 400
    stateful_step_count=50,
    deadline=None,
)
test_same_map_behaviour = SameMaps.TestCase
