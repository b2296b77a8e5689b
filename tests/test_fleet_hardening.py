"""The fleet against hostile and unlucky Redis data, and the fleet rule (issue 26, items 7-10).

Real redis-server, several coordinators (instances) in one process; the breakers run on an
injected clock, the fleet on the server's. No sleeps: every step is a sync.
"""

from __future__ import annotations

import logging
import socket
import types
from collections.abc import Iterator
from typing import Any, Optional

import pytest

pytest.importorskip("redis")

from fleet_support import RedisServer  # noqa: E402

from fastbreaker import State  # noqa: E402
from fastbreaker.contrib.redis import FleetCoordinator  # noqa: E402
from fastbreaker.testing import FakeClock  # noqa: E402

OPTS = {"failure_threshold": 1000, "reset_timeout": 30.0, "window": 100, "min_calls": 8}


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    srv = RedisServer().start()
    yield srv
    srv.stop()


@pytest.fixture
def ns(server: RedisServer, request: pytest.FixtureRequest) -> str:
    return "h" + str(abs(hash(request.node.nodeid)))


class Node:
    """One instance: a map ``hosts``, a breaker ``pay``, a budget ``rpc``, a coordinator."""

    def __init__(
        self, fb: types.SimpleNamespace, server: RedisServer, ns: str, ident: str, **kw: Any
    ) -> None:
        clock: FakeClock = kw.pop("clock")
        opts = {**OPTS, **kw.pop("opts", {})}
        self.map = fb.BreakerMap(clock=clock, **opts)
        self.pay = fb.CircuitBreaker(name="pay", clock=clock, **opts)
        self.budget = fb.RetryBudget(ratio=0.1, capacity=10, clock=clock)
        kw.setdefault("sync_timeout", 5.0)  # a loaded machine: a sync may take over 0.2 s
        self.coord = FleetCoordinator(server.client(), namespace=ns, instance_id=ident, **kw)
        self.coord.add_map(self.map, "hosts")
        self.coord.add_breaker(self.pay)
        self.coord.add_budget(self.budget, "rpc")

    def fail(self, key: Optional[str], n: int) -> None:
        for _ in range(n):
            if key is None:
                if self.pay.allow():
                    self.pay.record_failure()
            elif self.map.allow(key):
                self.map.record_failure(key)

    def ok(self, key: str, n: int) -> None:
        for _ in range(n):
            assert self.map.allow(key)
            self.map.record_success(key)

    def sync(self) -> None:
        report = self.coord.sync_once()
        assert report.ok, report.error


def fleet(fb: Any, server: RedisServer, ns: str, clock: FakeClock, n: int, **kw: Any) -> list[Node]:
    return [Node(fb, server, ns, f"node{i}:{i}", clock=clock, **kw) for i in range(n)]


def record(server: RedisServer, ns: str, key: str, group: str = "m:hosts") -> Optional[list[int]]:
    raw = server.client().hget(f"{{{ns}:{group}}}:st", key)
    return None if raw is None else [int(x) for x in raw.split()]


def server_ms(server: RedisServer) -> int:
    sec, usec = server.client().time()
    return int(sec) * 1000 + int(usec) // 1000


# -- item 7: a malformed entry affects its own object only -------------------------------------
POISON = {
    "record": lambda r, ns: r.hset(f"{{{ns}:m:hosts}}:st", "db", "garbage"),
    "record-fields": lambda r, ns: r.hset(f"{{{ns}:m:hosts}}:st", "db", "1 2 3 4 5"),
    "bucket-field": lambda r, ns: r.hset(f"{{{ns}:m:hosts}}:b:db", "zzz", 1),
    "bucket-value": lambda r, ns: r.hset(f"{{{ns}:m:hosts}}:b:db", "s1", "abc"),
    "key-wrong-type": lambda r, ns: r.set(f"{{{ns}:m:hosts}}:b:db", "x"),
    "lease-wrong-type": lambda r, ns: r.set(f"{{{ns}:m:hosts}}:l:db", "x"),
    "version": lambda r, ns: r.set(f"{{{ns}:m:hosts}}:v", "notanumber"),
    "group-wrong-type": lambda r, ns: r.set(f"{{{ns}:m:hosts}}:st", "x"),
    "index-wrong-type": lambda r, ns: r.hset(f"{{{ns}:m:hosts}}:o", "a", "b"),
    "epoch-wrong-type": lambda r, ns: r.hset(f"{{{ns}:m:hosts}}:e", "a", "b"),
    "budget-pool": lambda r, ns: r.set(f"{{{ns}:r:rpc}}:p", "abc"),
    "budget-wrong-type": lambda r, ns: r.hset(f"{{{ns}:r:rpc}}:i", "a", "b"),
}
GROUP_WIDE = {"version", "group-wrong-type", "index-wrong-type", "epoch-wrong-type"}


@pytest.mark.parametrize("form", sorted(POISON))
def test_a_malformed_entry_is_skipped_and_the_others_still_sync(
    fb: types.SimpleNamespace,
    server: RedisServer,
    ns: str,
    clock: FakeClock,
    form: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    nodes = fleet(fb, server, ns, clock, 2)
    POISON[form](server.client(), ns)
    caplog.set_level(logging.WARNING, logger="fastbreaker.fleet")
    for node in nodes:
        node.fail("db", 5)
        node.fail("api", 5)  # 10 >= min_calls from 2 nodes: the fleet opens "api"
        node.fail(None, 5)  # and the standalone breaker "pay"
    for _ in range(3):
        for node in nodes:
            node.sync()
    for node in nodes:
        assert node.pay.state == State.OPEN and node.pay.retry_after > 30.0  # held by the fleet
        if form not in GROUP_WIDE:
            assert node.map["api"].state == State.OPEN and node.map["api"].retry_after > 30.0
        if not form.startswith("budget"):
            assert node.map["db"].state == State.CLOSED  # skipped, never applied
        m = node.coord.metrics()
        assert m.malformed >= 1 and m.fleet_sync_failures == 0
    logged = [r for r in caplog.records if "malformed" in r.getMessage()]
    assert len(logged) == 2  # once per coordinator, not per sync


# -- item 8: bounds on what is accepted; reset() and a fleet reset win --------------------------
@pytest.mark.parametrize(
    "gen", ["10" * 15, str(2**63 + 5), "-5", "ahead", "9.5e3"], ids=lambda g: g[:8]
)
def test_a_forged_generation_is_refused_on_both_cores(
    fb: types.SimpleNamespace, server: RedisServer, ns: str, clock: FakeClock, gen: str
) -> None:
    nodes = fleet(fb, server, ns, clock, 2)
    now = server_ms(server)
    if gen == "ahead":
        gen = str(now + 3_600_000)  # a plausible number, an hour past the server's clock
    far = now + 10_000_000_000  # 115 days
    server.client().hset(f"{{{ns}:m:hosts}}:st", "db", f"1 {gen} {far} 0")
    server.client().zadd(f"{{{ns}:m:hosts}}:o", {"db": 1})
    nodes[0].ok("db", 1)
    for node in nodes:
        node.sync()  # never raises, counts the record as malformed
        assert node.map["db"].state == State.CLOSED
        assert node.coord.metrics().malformed >= 1


def test_a_forged_open_period_is_cut_to_the_breakers_longest(
    fb: types.SimpleNamespace, server: RedisServer, ns: str, clock: FakeClock
) -> None:
    nodes = fleet(fb, server, ns, clock, 2, opts={"max_reset_timeout": 120.0})
    now = server_ms(server)
    server.client().hset(f"{{{ns}:m:hosts}}:st", "db", f"1 {now} {now + 10_000_000_000} 0")
    server.client().zadd(f"{{{ns}:m:hosts}}:o", {"db": 1})
    for node in nodes:
        node.ok("db", 1)
        node.sync()
        b = node.map["db"]
        hold = node.coord._hold(node.map._options)
        assert b.state == State.OPEN and b.retry_after <= 120.0 + hold
    # reset() wins over the fleet generation it already applied
    nodes[0].map["db"].reset()
    nodes[0].sync()
    assert nodes[0].map["db"].state == State.CLOSED
    # an explicit fleet reset closes it everywhere (and replaces the record)
    nodes[0].coord.reset("hosts", "db")
    nodes[0].sync()
    assert record(server, ns, "db") is None
    nodes[1].sync()
    assert nodes[1].map["db"].state == State.CLOSED


def test_a_fleet_reset_replaces_a_malformed_record(
    fb: types.SimpleNamespace, server: RedisServer, ns: str, clock: FakeClock
) -> None:
    nodes = fleet(fb, server, ns, clock, 2)
    server.client().hset(f"{{{ns}:b:pay}}:st", "pay", "1 99999999999999999999 0 0")
    nodes[0].coord.reset("pay")
    nodes[0].sync()
    assert record(server, ns, "pay", "b:pay") is None
    for node in nodes:
        node.fail(None, 5)
    for _ in range(2):
        for node in nodes:
            node.sync()
    assert all(n.pay.state == State.OPEN and n.pay.retry_after > 30.0 for n in nodes)
    with pytest.raises(ValueError, match="no map named 'nope'"):
        nodes[0].coord.reset("nope", "db")


def test_reset_clears_a_fence_pushed_far_ahead(fb: types.SimpleNamespace, clock: FakeClock) -> None:
    b = fb.CircuitBreaker(5, 30.0, clock=clock)
    assert b._fleet(2**62, -1, 1, 5.0, 0)[0]
    b.reset()
    assert b._fleet(7, -1, 1, 5.0, 0)[0]  # without the reset, 7 < 2**62 would be refused
    assert b.state == State.OPEN


@pytest.mark.parametrize("period", ["over", "running"])
def test_after_redis_loses_its_data_a_generation_behind_is_applied(
    fb: types.SimpleNamespace, server: RedisServer, ns: str, clock: FakeClock, period: str
) -> None:
    """A server that lost its data and whose clock is behind issues generations below those
    applied before: they are news all the same (counted in data_losses), never ignored. With
    the period "running", the record is never rewritten (the version stays 0)."""
    nodes = fleet(fb, server, ns, clock, 2)
    ahead = server_ms(server) + 300_000  # a generation from a server whose clock ran ahead
    until = 0 if period == "over" else server_ms(server) + 60_000
    server.client().hset(f"{{{ns}:m:hosts}}:st", "db", f"1 {ahead} {until} 0")
    server.client().zadd(f"{{{ns}:m:hosts}}:o", {"db": 1})
    for node in nodes:
        node.ok("db", 1)
        node.sync()  # OPEN (or HALF_OPEN, generation ahead + 1, once its period is over)
        assert node.map["db"].state == State.OPEN
        node.map["db"].reset()
    server.client().flushall()  # the server loses its data
    for node in nodes:
        node.fail("db", 5)
    for _ in range(2):
        for node in nodes:
            node.sync()
    assert record(server, ns, "db")[1] < ahead  # type: ignore[index]
    for node in nodes:
        assert node.map["db"].state == State.OPEN and node.map["db"].retry_after > 30.0
        assert node.coord.metrics().data_losses == 2  # the map and the breaker "pay"


# -- item 9: one sick node cannot open the fleet -------------------------------------------------
def test_one_node_failing_at_4x_the_rate_of_three_healthy_ones_opens_only_itself(
    fb: types.SimpleNamespace, server: RedisServer, ns: str, clock: FakeClock
) -> None:
    nodes = fleet(fb, server, ns, clock, 4)  # the default min_instances
    for _ in range(3):
        for node in nodes[1:]:
            node.ok("db", 2)
        nodes[0].fail("db", 8)  # 4x the calls: 8 of 14 outcomes fail, >= min_calls
        for node in nodes:
            node.sync()
    assert nodes[0].map["db"].state == State.OPEN  # its own breaker protects it
    assert [n.map["db"].state for n in nodes[1:]] == [State.CLOSED] * 3
    assert record(server, ns, "db") is None


def test_a_crash_looping_node_counts_once(
    fb: types.SimpleNamespace, server: RedisServer, ns: str, clock: FakeClock
) -> None:
    healthy = Node(fb, server, ns, "web2:1:aa", clock=clock)
    healthy.ok("db", 1)
    healthy.sync()
    for restart in range(4):  # the same host, a new pid and suffix at every restart
        node = Node(fb, server, ns, f"web1:{100 + restart}:{restart:02x}", clock=clock)
        node.fail("db", 6)
        node.sync()
        healthy.sync()
    assert healthy.map["db"].state == State.CLOSED
    assert record(server, ns, "db") is None


def test_the_default_identity_is_the_host(
    fb: types.SimpleNamespace, server: RedisServer, ns: str
) -> None:
    """Two processes of one host are one node: together they cannot open the fleet; with
    another host, they can."""
    clock = FakeClock(1_000_000_000_000)
    maps = [fb.BreakerMap(clock=clock, **OPTS) for _ in range(3)]
    coords = [FleetCoordinator(server.client(), namespace=ns, sync_timeout=5.0) for _ in range(2)]
    coords.append(
        FleetCoordinator(server.client(), namespace=ns, instance_id="elsewhere", sync_timeout=5.0)
    )
    assert coords[0].instance_id.split(":")[0] == socket.gethostname()
    for m, c in zip(maps, coords):
        c.add_map(m, "hosts")
    for m, c in zip(maps[:2], coords[:2]):
        for _ in range(5):
            m.allow("db")
            m.record_failure("db")
        assert c.sync_once().ok
    assert record(server, ns, "db") is None  # 10 failures >= min_calls, but from one node
    for _ in range(5):
        maps[2].allow("db")
        maps[2].record_failure("db")
    assert coords[2].sync_once().ok
    assert record(server, ns, "db") is not None and record(server, ns, "db")[0] == 1  # type: ignore[index]


# -- item 10: the fleet converges on local verdicts, whatever the window holds -----------------
LOCAL = {"window": 10, "min_calls": 5}  # a local breaker trips after 5-10 failures


def test_an_outage_every_node_sees_opens_the_fleet_within_two_syncs(
    fb: types.SimpleNamespace, server: RedisServer, ns: str, clock: FakeClock
) -> None:
    nodes = fleet(fb, server, ns, clock, 4, opts=LOCAL)
    for node in nodes:
        node.ok("db", 60)  # a window full of successes
        node.sync()
    for node in nodes:
        node.fail("db", 10)  # each trips locally, then rejects: no more failures reported
        assert node.map["db"].state == State.OPEN
    for round_ in range(2):
        for node in nodes:
            node.sync()
        if round_ == 0:
            assert record(server, ns, "db") is not None  # the fleet opened in the first round
    rec = record(server, ns, "db")
    assert rec is not None and rec[0] == 1
    assert all(n.map["db"].retry_after > 30.0 for n in nodes)  # all held by the fleet


@pytest.mark.parametrize("min_instances", [1, 2])
def test_an_outage_one_node_sees_never_opens_the_others(
    fb: types.SimpleNamespace, server: RedisServer, ns: str, clock: FakeClock, min_instances: int
) -> None:
    nodes = fleet(fb, server, ns, clock, 4, opts=LOCAL, min_instances=min_instances)
    for node in nodes:
        node.ok("db", 20)
        node.sync()
    nodes[0].fail("db", 10)
    assert nodes[0].map["db"].state == State.OPEN
    for _ in range(4):
        nodes[0].fail("db", 3)  # rejected locally
        for node in nodes:
            node.sync()
    assert record(server, ns, "db") is None
    assert [n.map["db"].state for n in nodes[1:]] == [State.CLOSED] * 3


def test_sync_once_never_raises(
    fb: types.SimpleNamespace,
    server: RedisServer,
    ns: str,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whatever fails while a reply is applied, the sync is counted as failed, not raised."""
    node = fleet(fb, server, ns, clock, 1)[0]
    node.ok("db", 1)

    def broken(*args: Any) -> int:
        raise OverflowError("Python int too large to convert to C int64_t")

    monkeypatch.setattr(node.coord, "_apply", broken)
    report = node.coord.sync_once()
    assert not report.ok and "OverflowError" in (report.error or "")
    m = node.coord.metrics()
    assert m.fleet_sync_failures == 1 and m.fleet_degraded
