"""A fleet of 4 real processes (tests/fleet_worker.py), each with its own BreakerMap and
FleetCoordinator, and one real redis-server.

Time is real here (processes and a server): every wait polls a condition with a bounded timeout.
Each test runs with the workers on the compiled core and on the pure-Python twin.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("redis")

from fleet_support import RedisServer, wait_until  # noqa: E402

import fastbreaker  # noqa: E402

WORKER = str(Path(__file__).with_name("fleet_worker.py"))
INTERVAL = 0.3
SYNC_TIMEOUT = 0.15
OPEN = 1
IMPLS = ["c", "python"] if fastbreaker.COMPILED else ["python"]


class Worker:
    def __init__(self, port: int, ns: str, idx: int, impl: str, options: dict[str, Any]) -> None:
        env = dict(os.environ)
        if impl == "python":
            env["FASTBREAKER_NO_EXTENSIONS"] = "1"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                WORKER,
                str(port),
                ns,
                f"w{idx}",
                str(INTERVAL),
                str(SYNC_TIMEOUT),
                json.dumps(options),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def send(self, op: str, **kwargs: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"op": op, **kwargs}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"worker exited with {self.proc.poll()}"
        return json.loads(line)  # type: ignore[no-any-return]

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send("quit")
            except (AssertionError, OSError):
                pass
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@pytest.fixture
def server() -> Iterator[RedisServer]:
    srv = RedisServer().start()
    yield srv
    srv.stop()


def start_fleet(server: RedisServer, impl: str, n: int = 4, **options: Any) -> list[Worker]:
    opts = {"failure_threshold": 1000, "reset_timeout": 30.0, "window": 100, "min_calls": 20}
    opts.update(options)
    ns = f"p{os.getpid()}{time.monotonic_ns()}"
    return [Worker(server.port, ns, i, impl, opts) for i in range(n)]


def states(workers: list[Worker], key: str) -> list[int]:
    return [w.send("state", key=key)["state"] for w in workers]


def synced(workers: list[Worker], more: int) -> Any:
    """A condition: every worker made ``more`` successful syncs after this call."""
    base = [w.send("stats")["ok_syncs"] for w in workers]
    return lambda: all(w.send("stats")["ok_syncs"] >= b + more for w, b in zip(workers, base))


@pytest.mark.parametrize("impl", IMPLS)
def test_failing_everywhere_opens_every_instance_within_two_sync_intervals(
    server: RedisServer, impl: str
) -> None:
    workers = start_fleet(server, impl)
    try:
        wait_until(synced(workers, 1), 20.0, "the workers to sync")
        # 6 failures each: under the local min_calls (20), over the fleet's (24 >= 20)
        last = max(w.send("calls", key="db", fail=6)["last"] for w in workers)
        assert OPEN not in states(workers, "db")  # no instance opened on its own
        wait_until(lambda: states(workers, "db") == [OPEN] * 4, 10.0, "every instance OPEN")
        opened = [w.send("state", key="db")["opened"] for w in workers]
        # two intervals, plus the syncs' own time and scheduling on a loaded 2-CPU machine
        assert max(opened) - last <= 2 * INTERVAL + 2 * SYNC_TIMEOUT, (opened, last)
    finally:
        for w in workers:
            w.close()


@pytest.mark.parametrize("impl", IMPLS)
def test_failing_for_one_instance_opens_it_there_only(server: RedisServer, impl: str) -> None:
    workers = start_fleet(server, impl)
    try:
        for w in workers[1:]:
            w.send("calls", key="db", ok=30)
        wait_until(synced(workers, 2), 20.0, "the healthy counts to be flushed")
        workers[0].send("calls", key="db", fail=20)  # the poisoned instance: 20 of 110
        assert states(workers, "db")[0] == OPEN
        wait_until(synced(workers, 3), 20.0, "three more syncs everywhere")
        assert states(workers, "db") == [OPEN, 0, 0, 0]
    finally:
        for w in workers:
            w.close()


@pytest.mark.parametrize("impl", IMPLS)
def test_recovery_runs_exactly_half_open_max_calls_fleet_probes(
    server: RedisServer, impl: str
) -> None:
    workers = start_fleet(
        server, impl, reset_timeout=1.0, half_open_max_calls=2, success_threshold=2
    )
    try:
        wait_until(synced(workers, 1), 20.0, "the workers to sync")
        for w in workers:
            w.send("calls", key="db", fail=6)
        wait_until(lambda: states(workers, "db") == [OPEN] * 4, 10.0, "every instance OPEN")
        for w in workers:
            w.send("traffic", key="db", period=0.005)  # the dependency is healthy again
        wait_until(lambda: states(workers, "db") == [0] * 4, 20.0, "every instance CLOSED")
        results = [w.send("stop_traffic") for w in workers]
        assert sum(r["probes"] for r in results) == 2, results
    finally:
        for w in workers:
            w.close()


@pytest.mark.slow  # a soak across processes: Redis killed and restarted mid-run
@pytest.mark.parametrize("impl", IMPLS)
def test_chaos_redis_killed_and_restarted(server: RedisServer, impl: str) -> None:
    server.require_restart()
    workers = start_fleet(server, impl)
    try:
        wait_until(synced(workers, 1), 20.0, "the workers to sync")
        for w in workers:
            w.send("traffic", key="db", period=0.002)
        wait_until(synced(workers, 2), 20.0, "syncs under traffic")
        server.stop()  # Redis dies mid-run
        wait_until(
            lambda: all(w.send("stats")["degraded"] for w in workers), 10.0, "degraded everywhere"
        )
        calls_before = [w.send("stats") for w in workers]
        wait_until(
            lambda: all(
                w.send("stats")["failed_syncs"] >= s["failed_syncs"] + 3
                for w, s in zip(workers, calls_before)
            ),
            10.0,
            "three failed syncs each",
        )
        results = [w.send("stop_traffic") for w in workers]
        assert all(r["calls"] > 0 for r in results)  # local operation went on
        assert max(r["max_call"] for r in results) < SYNC_TIMEOUT  # no call waited for Redis
        assert max(w.send("stats")["max_sync"] for w in workers) < SYNC_TIMEOUT + 0.1
        server.start()  # same port, empty
        wait_until(lambda: not any(w.send("stats")["degraded"] for w in workers), 10.0, "recovered")
        wait_until(synced(workers, 1), 10.0, "one more sync everywhere")
        client = server.client()
        tag = next(k for k in client.keys("*:b:db"))

        def total() -> int:
            return sum(int(v) for v in client.hgetall(tag).values())

        leftover = total()
        outage_calls = sum(r["calls"] for r in results)
        assert leftover <= outage_calls  # never more than was made: nothing delivered twice
        for w in workers:
            w.send("calls", key="db", ok=25)
        wait_until(synced(workers, 2), 10.0, "the new counts to be flushed")
        assert total() == leftover + 100  # converged: each count exactly once
        for w in workers:
            w.send("calls", key="db2", fail=6)  # together over the rule, each under its own
        wait_until(lambda: states(workers, "db2") == [OPEN] * 4, 10.0, "converged: OPEN everywhere")
    finally:
        for w in workers:
            w.close()
