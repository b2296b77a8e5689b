"""FleetCoordinator against a real redis-server (several coordinators in one process).

The fleet's time is the server's: where a fleet period has to pass, the tests use short periods
and poll for the condition with a bounded timeout, never a fixed sleep.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import types
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("redis")

from fleet_support import RedisServer, wait_until  # noqa: E402

import fastbreaker  # noqa: E402
from fastbreaker import State  # noqa: E402
from fastbreaker.contrib.redis import FleetCoordinator, FleetMetrics, SyncReport  # noqa: E402


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    srv = RedisServer().start()
    yield srv
    srv.stop()


@pytest.fixture
def ns(server: RedisServer, request: pytest.FixtureRequest) -> str:
    """A namespace of its own per test (no state leaks from one test to the next)."""
    return "t" + str(abs(hash(request.node.nodeid)))


#: The sync bound of tests about something else than a slow Redis: a loaded CI machine can take
#: longer than the default 0.2 s for a sync, which would fail a test that asserts it succeeded.
ROOMY = 5.0


def fleet(
    fb: types.SimpleNamespace, server: RedisServer, ns: str, n: int, **options: Any
) -> tuple[list[Any], list[FleetCoordinator]]:
    coord_opts = {
        k: options.pop(k) for k in ("min_instances", "fleet_window", "sync_timeout") if k in options
    }
    coord_opts.setdefault("sync_timeout", ROOMY)
    maps, coords = [], []
    for i in range(n):
        m = fb.BreakerMap(**{"failure_threshold": 1000, "reset_timeout": 30.0, **options})
        c = FleetCoordinator(server.client(), namespace=ns, instance_id=f"i{i}", **coord_opts)
        c.add_map(m, "hosts")
        maps.append(m)
        coords.append(c)
    return maps, coords


def outcomes(m: Any, key: str, ok: int = 0, failed: int = 0) -> None:
    for _ in range(ok):
        assert m.allow(key)
        m.record_success(key)
    for _ in range(failed):
        assert m.allow(key)
        m.record_failure(key)


def sync_all(coords: list[FleetCoordinator]) -> list[SyncReport]:
    reports = [c.sync_once() for c in coords]
    assert all(r.ok for r in reports), reports
    return reports


def fleet_counts(server: RedisServer, ns: str, key: str, group: str = "m:hosts") -> tuple[int, int]:
    raw = server.client().hgetall(f"{{{ns}:{group}}}:b:{key}")
    succ = sum(int(v) for f, v in raw.items() if f.startswith(b"s"))
    fail = sum(int(v) for f, v in raw.items() if f.startswith(b"f"))
    return succ, fail


# -- the fleet rule -----------------------------------------------------------------------------
def test_failures_everywhere_open_every_instance(
    fb: types.SimpleNamespace, server: RedisServer, ns: str
) -> None:
    maps, coords = fleet(fb, server, ns, 3, window=100, min_calls=12, reset_timeout=5.0)
    for m in maps:
        outcomes(m, "db", failed=5)  # 5 < min_calls: no instance opens on its own
        assert m["db"].state == State.CLOSED
    sync_all(coords)  # the third flush crosses the fleet's threshold (15 >= 12)
    assert [m["db"].state for m in maps] == [State.CLOSED, State.CLOSED, State.OPEN]
    sync_all(coords)  # the others learn it at their next sync
    assert all(m["db"].state == State.OPEN for m in maps)
    assert all(5.0 < m["db"].retry_after <= 5.0 + coords[0]._hold(maps[0]._options) for m in maps)


def test_one_sick_instance_is_diluted_and_opens_only_locally(
    fb: types.SimpleNamespace, server: RedisServer, ns: str
) -> None:
    maps, coords = fleet(fb, server, ns, 4, window=100, min_calls=20)
    for m in maps[1:]:
        outcomes(m, "db", ok=30)
    sync_all(coords[1:])
    outcomes(maps[0], "db", failed=20)  # the sick one opens its own breaker
    assert maps[0]["db"].state == State.OPEN
    for _ in range(2):
        sync_all(coords)
    assert maps[0]["db"].state == State.OPEN  # the fleet's CLOSED never closes it
    assert [m["db"].state for m in maps[1:]] == [State.CLOSED] * 3
    assert fleet_counts(server, ns, "db") == (90, 20)


def test_min_instances_needs_failures_from_that_many_instances(
    fb: types.SimpleNamespace, server: RedisServer, ns: str
) -> None:
    maps, coords = fleet(fb, server, ns, 3, window=1000, min_calls=10, min_instances=2)
    outcomes(maps[0], "db", failed=10)  # enough for the rule, but from one instance
    sync_all(coords)
    assert [m["db"].state for m in maps[1:]] == [State.CLOSED] * 2
    outcomes(maps[1], "db", failed=1)
    sync_all(coords)
    sync_all(coords)
    assert all(m["db"].state == State.OPEN for m in maps)


def test_standalone_breakers_are_matched_by_name(
    fb: types.SimpleNamespace, server: RedisServer, ns: str
) -> None:
    coords = [
        FleetCoordinator(
            server.client(), namespace=ns, instance_id=f"node{i}:1", sync_timeout=ROOMY
        )
        for i in range(2)
    ]
    breakers = [fb.CircuitBreaker(100, 30.0, name="pay", min_calls=4) for _ in range(2)]
    other = fb.CircuitBreaker(100, 30.0, name="other", min_calls=4)
    coords[0].add_breaker(breakers[0])
    coords[1].add_breaker(breakers[1])
    coords[1].add_breaker(other)
    for b in breakers:
        for _ in range(2):
            b.allow()
            b.record_failure()
    sync_all(coords)
    sync_all(coords)
    assert [b.state for b in breakers] == [State.OPEN, State.OPEN]
    assert other.state == State.CLOSED


def test_fleet_window_forgets_old_outcomes(
    fb: types.SimpleNamespace, server: RedisServer, ns: str
) -> None:
    maps, coords = fleet(fb, server, ns, 2, window=100, min_calls=6, fleet_window=0.2)
    outcomes(maps[0], "db", failed=4)
    sync_all(coords)
    # the count buckets expire with the window (server time): poll, bounded
    wait_until(lambda: fleet_counts(server, ns, "db") == (0, 0), 3.0, "the window to pass")
    outcomes(maps[1], "db", failed=4)  # 4 + 4 >= 6, but the first 4 are out of the window
    sync_all(coords)
    assert [m["db"].state for m in maps] == [State.CLOSED, State.CLOSED]


# -- fleet probes and recovery ----------------------------------------------------------------------
def test_recovery_runs_exactly_half_open_max_calls_probes_then_closes_everywhere(
    fb: types.SimpleNamespace, server: RedisServer, ns: str
) -> None:
    maps, coords = fleet(
        fb,
        server,
        ns,
        4,
        window=100,
        min_calls=8,
        reset_timeout=0.3,
        half_open_max_calls=2,
        success_threshold=2,
    )
    for m in maps:
        outcomes(m, "db", failed=2)
    sync_all(coords)
    sync_all(coords)
    assert all(m["db"].state == State.OPEN for m in maps)
    probes = 0

    def step() -> bool:
        nonlocal probes
        for m in maps:
            b = m["db"]
            if b.allow():
                probes += b.state != State.CLOSED
                b.record_success()
        sync_all(coords)
        return all(m["db"].state == State.CLOSED for m in maps)

    wait_until(step, 10.0, "the fleet to close")
    assert probes == 2


def test_a_failed_fleet_probe_reopens_the_fleet(
    fb: types.SimpleNamespace, server: RedisServer, ns: str
) -> None:
    maps, coords = fleet(fb, server, ns, 2, window=100, min_calls=4, reset_timeout=0.2)
    for m in maps:
        outcomes(m, "db", failed=2)
    sync_all(coords)
    sync_all(coords)

    def probe_failed() -> bool:
        for m in maps:
            if m.allow("db"):
                assert m["db"].state == State.HALF_OPEN
                m.record_failure("db")
                return True
        sync_all(coords)
        return False

    wait_until(probe_failed, 10.0, "a fleet probe")
    sync_all(coords)
    sync_all(coords)
    assert all(m["db"].state == State.OPEN for m in maps)
    assert all(m["db"].retry_after > 0.1 for m in maps)


def test_a_lease_whose_holder_died_expires(
    fb: types.SimpleNamespace, server: RedisServer, ns: str
) -> None:
    maps, coords = fleet(fb, server, ns, 2, window=100, min_calls=4, reset_timeout=0.2)
    for m in maps:
        outcomes(m, "db", failed=2)
    sync_all(coords)
    sync_all(coords)

    def leased(i: int) -> bool:
        maps[i].allow("db")  # a rejected call asks for a lease at the next sync
        coords[i].sync_once()
        return maps[i]["db"].state == State.HALF_OPEN

    wait_until(lambda: leased(0), 10.0, "instance 0 to hold the lease")
    assert not leased(1)  # the lease is taken
    # instance 0 "dies": it never probes nor syncs again; its lease expires with its round
    wait_until(lambda: leased(1), 10.0, "instance 1 to get the lease")


# -- fencing at the coordinator ---------------------------------------------------------------------
def test_reordered_and_duplicated_replies_never_move_backwards(
    fb: types.SimpleNamespace, server: RedisServer, ns: str
) -> None:
    maps, coords = fleet(fb, server, ns, 1, window=100, min_calls=4)
    c, m = coords[0], maps[0]
    outcomes(m, "db", ok=1)
    c.sync_once()
    group = next(iter(c._groups.values()))
    gen = 10**12
    assert c._apply(group, "db", 1, gen + 2, 1000, 0) == 1  # OPEN, generation gen + 2
    assert m["db"].state == State.OPEN
    assert c._apply(group, "db", 0, gen + 1, 0, 0) == 0  # older CLOSED arrives late
    assert c._apply(group, "db", 1, gen + 2, 1000, 0) == 0  # duplicate
    assert m["db"].state == State.OPEN
    assert c._apply(group, "db", 0, gen + 3, 0, 0) == 1
    assert m["db"].state == State.CLOSED


def test_an_apply_never_undoes_a_newer_local_transition(
    fb: types.SimpleNamespace, server: RedisServer, ns: str
) -> None:
    maps, coords = fleet(fb, server, ns, 1, window=10, min_calls=2)
    c, m = coords[0], maps[0]
    outcomes(m, "db", ok=1)
    c.sync_once()
    group = next(iter(c._groups.values()))
    outcomes(m, "db", failed=1)  # a local trip after the coordinator read the breaker
    assert c._apply(group, "db", 2, 10**12, 0, 1) == 0
    assert m["db"].state == State.OPEN
    assert c.metrics().stale_applies == 1


# -- Redis down, slow, back ---------------------------------------------------------------------------
def test_construct_add_and_sync_while_redis_is_down(fb: types.SimpleNamespace) -> None:
    import redis

    dead = redis.Redis(host="127.0.0.1", port=_closed_port(), socket_timeout=30)
    c = FleetCoordinator(dead, namespace="down", sync_timeout=0.2)
    b = c.add_breaker(fb.CircuitBreaker(name="pay"))
    events: list[tuple[str, Any]] = []
    c.on_event(lambda coord, event, error: events.append((event, error)))
    t0 = time.monotonic()
    report = c.sync_once()
    assert time.monotonic() - t0 < 0.2 + 0.1
    assert not report.ok and "Connection" in (report.error or "")
    c.sync_once()
    m = c.metrics()
    assert (m.syncs, m.fleet_sync_failures, m.fleet_degraded) == (2, 2, True)
    assert [e for e, _ in events] == ["degraded"]  # once per outage, not per failed sync
    assert b.allow()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class DelayProxy:
    """A TCP proxy to Redis that holds every reply ``delay`` seconds while ``delay`` is set."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.delay = 0.0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, replies: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if replies and self.delay:
                    threading.Event().wait(self.delay)  # the delay under test, not a state wait
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.close()
                except OSError:
                    pass

    def close(self) -> None:
        self.closed = True
        self.listener.close()


def test_slow_redis_is_bounded_by_sync_timeout_and_never_double_counts(
    fb: types.SimpleNamespace, server: RedisServer, ns: str
) -> None:
    import redis
    from redis.backoff import ConstantBackoff
    from redis.retry import Retry

    proxy = DelayProxy(server.port)
    try:
        # the client's own settings would wait 30 s and retry 3 times: the sync does not
        client = redis.Redis(
            host="127.0.0.1",
            port=proxy.port,
            socket_timeout=30,
            retry=Retry(ConstantBackoff(1.0), 3),
        )
        m = fb.BreakerMap(1000, 30.0, window=100, min_calls=1000)
        c = FleetCoordinator(client, namespace=ns, sync_timeout=0.1)
        c.add_map(m, "hosts")
        outcomes(m, "db", ok=3, failed=1)
        assert c.sync_once().ok
        proxy.delay = 0.5
        outcomes(m, "db", ok=5)
        t0 = time.monotonic()
        report = c.sync_once()
        took = time.monotonic() - t0
        assert not report.ok and took < 0.1 + 0.05, (report, took)
        assert c.metrics().fleet_degraded
        # the script ran (only its reply was late): its counts are in Redis once
        wait_until(lambda: fleet_counts(server, ns, "db") == (8, 1), 5.0, "the late script")
        proxy.delay = 0.0
        outcomes(m, "db", ok=2, failed=2)
        assert c.sync_once().ok
        assert not c.metrics().fleet_degraded
        assert fleet_counts(server, ns, "db") == (10, 3)  # every count once, none twice
    finally:
        proxy.close()


def test_killed_redis_local_operation_goes_on_and_restart_converges(
    fb: types.SimpleNamespace, ns: str
) -> None:
    srv = RedisServer().start()
    try:
        maps, coords = fleet(fb, srv, ns, 2, window=100, min_calls=20, sync_timeout=0.1)
        for m in maps:
            outcomes(m, "db", ok=2)
        sync_all(coords)
        srv.stop()
        for m in maps:
            t0 = time.monotonic()
            outcomes(m, "db", ok=3, failed=3)
            assert time.monotonic() - t0 < 0.1  # calls never wait for Redis
        for c in coords:
            t0 = time.monotonic()
            assert not c.sync_once().ok
            assert time.monotonic() - t0 < 0.1 + 0.05
        srv.start()  # same port, no data: counts of the outage were dropped, not replayed
        outcomes(maps[0], "db", ok=1)
        sync_all(coords)
        assert fleet_counts(srv, ns, "db") == (1, 0)
        assert not any(c.metrics().fleet_degraded for c in coords)
        for m in maps:
            outcomes(m, "db", failed=10)  # not enough for either instance alone
        sync_all(coords)
        sync_all(coords)
        assert all(m["db"].state == State.OPEN for m in maps)
    finally:
        srv.stop()


def test_held_open_breaker_falls_back_to_local_recovery_when_syncs_stop(
    fb: types.SimpleNamespace, server: RedisServer, ns: str, clock: Any
) -> None:
    maps, coords = fleet(fb, server, ns, 1, window=100, min_calls=2, reset_timeout=1.0, clock=clock)
    outcomes(maps[0], "db", failed=2)
    # min_calls 2 also trips it locally; the fleet then holds it
    coords[0].sync_once()
    b = maps[0]["db"]
    assert b.state == State.OPEN
    hold = coords[0]._hold(maps[0]._options)
    assert b.retry_after <= 1.0 + hold
    clock.advance(1.0 + hold)  # no sync any more: the breaker recovers on its own
    assert b.allow() and b.state == State.HALF_OPEN


# -- running ---------------------------------------------------------------------------------------
def test_run_in_thread_syncs_until_stopped(
    fb: types.SimpleNamespace, server: RedisServer, ns: str
) -> None:
    maps, coords = fleet(fb, server, ns, 2, window=100, min_calls=4)
    handles = [c.run_in_thread(interval=0.02) for c in coords]
    try:
        for m in maps:
            outcomes(m, "db", failed=2)
        wait_until(lambda: all(m["db"].state == State.OPEN for m in maps), 5.0, "fleet open")
    finally:
        for h in handles:
            h.stop()
    assert not any(h.running for h in handles)
    syncs = coords[0].metrics().syncs
    assert coords[0].metrics().syncs == syncs


async def test_run_with_an_asyncio_client(
    fb: types.SimpleNamespace, server: RedisServer, ns: str
) -> None:
    import redis.asyncio

    maps = [fb.BreakerMap(1000, 30.0, window=100, min_calls=4) for _ in range(2)]
    coords = []
    for i, m in enumerate(maps):
        client = redis.asyncio.Redis(host="127.0.0.1", port=server.port)
        c = FleetCoordinator(client, namespace=ns, instance_id=f"a{i}", sync_timeout=ROOMY)
        c.add_map(m, "hosts")
        coords.append(c)
    with pytest.raises(TypeError, match="asyncio"):
        coords[0].sync_once()
    with pytest.raises(TypeError, match="asyncio"):
        coords[0].run_in_thread()
    tasks = [asyncio.create_task(c.run(interval=0.02)) for c in coords]
    try:
        for m in maps:
            outcomes(m, "db", failed=2)
        for _ in range(500):
            if all(m["db"].state == State.OPEN for m in maps):
                break
            await asyncio.sleep(0.01)
        assert all(m["db"].state == State.OPEN for m in maps)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# -- API --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "exc", "word"),
    [
        ({"namespace": ""}, TypeError, "namespace"),
        ({"namespace": "a{b"}, ValueError, "namespace"),
        ({"namespace": "n", "sync_timeout": 0}, ValueError, "sync_timeout"),
        ({"namespace": "n", "sync_timeout": "1"}, TypeError, "sync_timeout"),
        ({"namespace": "n", "min_instances": 0}, ValueError, "min_instances"),
        ({"namespace": "n", "min_instances": 1.5}, TypeError, "min_instances"),
        ({"namespace": "n", "fleet_window": -1}, ValueError, "fleet_window"),
        ({"namespace": "n", "instance_id": "x}"}, ValueError, "instance_id"),
    ],
)
def test_bad_arguments(kwargs: dict[str, Any], exc: type[Exception], word: str) -> None:
    with pytest.raises(exc, match=word):
        FleetCoordinator(object(), **kwargs)


def test_add_checks_names_and_duplicates(fb: types.SimpleNamespace) -> None:
    c = FleetCoordinator(object(), namespace="n")
    with pytest.raises(ValueError, match="name"):
        c.add_breaker(fb.CircuitBreaker())
    c.add_breaker(fb.CircuitBreaker(name="a"))
    with pytest.raises(ValueError, match="already"):
        c.add_breaker(fb.CircuitBreaker(name="a"))
    with pytest.raises(TypeError, match="BreakerMap"):
        c.add_map(object())  # type: ignore[arg-type]
    c.add_map(fb.BreakerMap(), "a")  # a map and a breaker may share a name
    assert isinstance(c.metrics(), FleetMetrics)


def test_cluster_batches_are_grouped_by_slot(fb: types.SimpleNamespace) -> None:
    from redis.crc import key_slot

    c = FleetCoordinator(object(), namespace="n")
    c._cluster = True
    for i in range(20):
        c.add_breaker(fb.CircuitBreaker(name=f"b{i}"))
    c.add_map(fb.BreakerMap(), "hosts")
    batches = c._batches(c._prepare())
    slots = [{key_slot(item[0].tag.encode()) for item in batch} for batch in batches]
    assert all(len(s) == 1 for s in slots)
    assert sum(len(b) for b in batches) == 21
    assert len({next(iter(s)) for s in slots}) == len(batches)


def test_the_library_starts_no_thread(
    fb: types.SimpleNamespace, server: RedisServer, ns: str
) -> None:
    before = set(threading.enumerate())
    maps, coords = fleet(fb, server, ns, 1)
    coords[0].sync_once()
    assert set(threading.enumerate()) - before == set()


def test_public_names() -> None:
    import fastbreaker.contrib.redis as mod

    assert {"FleetCoordinator", "FleetMetrics", "SyncReport"} <= set(mod.__all__)
    assert fastbreaker.CircuitBreaker is not None


# -- the fleet-wide retry budget ------------------------------------------------------------------
def test_retry_budget_is_reconciled_across_the_fleet(
    fb: types.SimpleNamespace, server: RedisServer, ns: str, clock: Any
) -> None:
    budgets = [fb.RetryBudget(ratio=0.1, capacity=10, min_per_sec=0, clock=clock) for _ in range(2)]
    coords = [
        FleetCoordinator(server.client(), namespace=ns, instance_id=f"r{i}", sync_timeout=ROOMY)
        for i in range(2)
    ]
    for c, b in zip(coords, budgets):
        c.add_budget(b, "rpc")
    sync_all(coords)  # both join: a pool of 2 x 10 tokens
    assert [b.tokens for b in budgets] == [10.0, 10.0]
    assert sum(budgets[0].allow_retry() for _ in range(12)) == 10
    sync_all(coords)
    sync_all(coords)
    # the fleet spent 10 of its 20: each instance now holds half of the rest
    assert [b.tokens for b in budgets] == [5.0, 5.0]
    for _ in range(20):
        budgets[1].record_success()  # +2 tokens, deposited by instance 1 only
    sync_all(coords)
    sync_all(coords)
    assert [b.tokens for b in budgets] == [6.0, 6.0]
    taken = sum(b.allow_retry() for b in budgets for _ in range(10))
    assert taken == 12
    sync_all(coords)
    # the overshoot between syncs: instance 0 synced before instance 1 reported its spending,
    # so it holds a share of tokens that instance 1 already spent; its next sync takes it back
    assert [b.tokens for b in budgets] == [3.0, 0.0]
    sync_all(coords)
    assert [b.tokens for b in budgets] == [0.0, 0.0]


def test_a_failed_sync_drops_the_budget_change_once(
    fb: types.SimpleNamespace, server: RedisServer, ns: str, clock: Any
) -> None:
    budget = fb.RetryBudget(ratio=0.1, capacity=10, min_per_sec=0, clock=clock)
    c = FleetCoordinator(server.client(), namespace=ns, sync_timeout=ROOMY)
    c.add_budget(budget, "rpc")
    assert c.sync_once().ok
    budget.allow_retry()
    c._conns[None] = _Broken()
    assert not c.sync_once().ok
    del c._conns[None]
    assert c.sync_once().ok
    assert budget.tokens == 10.0  # the spent token was not charged to the fleet, nor twice


class _Broken:
    def connect(self) -> None:
        raise ConnectionError("down")

    def disconnect(self) -> None:
        pass

    socket_timeout = socket_connect_timeout = None


# -- a long-running coordinator keeps its memory flat ---------------------------------------------
def test_syncs_keep_memory_flat(fb: types.SimpleNamespace, server: RedisServer, ns: str) -> None:
    from test_memory_growth import check_flat, measure_growth

    m = fb.BreakerMap(1000, 30.0, window=20, min_calls=10, max_keys=64)
    budget = fb.RetryBudget()
    coord = FleetCoordinator(server.client(), namespace=ns, sync_timeout=ROOMY)
    coord.add_map(m, "hosts")
    coord.add_budget(budget)
    n = [0]

    def step() -> None:
        key = f"host-{n[0]}"  # a new key each step: the map evicts, the coordinator forgets
        n[0] += 1
        m.allow(key)
        m.record_success(key)
        budget.allow_retry()
        assert coord.sync_once().ok

    small, large = 300, 1_500
    check_flat(measure_growth(step, small), measure_growth(step, large), small, large)
