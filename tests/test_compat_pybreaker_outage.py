"""compat ``CircuitRedisStorage`` with Redis killed or stopped (issue 26, item 11).

A real redis-server; a default redis-py client (its own retries and no socket timeout). Every
call must return within the storage's ``timeout`` (asserted at 2x), with one log line per
outage, not per call.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Iterator

import pytest

pytest.importorskip("redis")

from fleet_support import RedisServer, wait_until  # noqa: E402

from fastbreaker.compat import pybreaker  # noqa: E402

TIMEOUT = 0.2
CALLS = 6


@pytest.fixture
def server() -> Iterator[RedisServer]:
    srv = RedisServer().start()
    yield srv
    if srv.proc is not None:
        os.kill(srv.proc.pid, signal.SIGCONT)
    srv.stop()


def slowest_call(breaker: pybreaker.CircuitBreaker) -> float:
    worst = 0.0
    for i in range(CALLS):
        t0 = time.monotonic()
        if i % 2:
            with pytest.raises(ValueError):
                breaker.call(_fail)
        else:
            assert breaker.call(lambda: 42) == 42
        worst = max(worst, time.monotonic() - t0)
    return worst


def _fail() -> None:
    raise ValueError("the call fails")


def outage_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "fastbreaker.compat.pybreaker"]


@pytest.mark.parametrize("how", ["killed", "stopped"])
def test_every_call_is_bounded_and_an_outage_logs_one_line(
    server: RedisServer, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="fastbreaker.compat.pybreaker")
    storage = pybreaker.CircuitRedisStorage("closed", server.client(), timeout=TIMEOUT)
    breaker = pybreaker.CircuitBreaker(fail_max=100, state_storage=storage)
    assert breaker.call(lambda: 1) == 1
    assert server.proc is not None
    if how == "killed":
        server.stop()
    else:
        os.kill(server.proc.pid, signal.SIGSTOP)
    assert slowest_call(breaker) < 2 * TIMEOUT
    lines = outage_lines(caplog)
    assert len(lines) == 1 and "Redis unavailable" in lines[0], lines
    assert not any(r.exc_info for r in caplog.records)  # no tracebacks
    if how == "killed":
        server.start()
    else:
        os.kill(server.proc.pid, signal.SIGCONT)

    def answers() -> bool:  # Redis is tried again a second after the last failure
        breaker.call(lambda: 1)
        return len(outage_lines(caplog)) == 2

    wait_until(answers, 5.0, "Redis to answer again", step=0.05)
    assert outage_lines(caplog)[1] == "Redis answers again"
    assert storage.counter == 0 and storage.state == "closed"


def test_the_default_timeout_is_well_under_a_second(server: RedisServer) -> None:
    import inspect

    default = inspect.signature(pybreaker.CircuitRedisStorage).parameters["timeout"].default
    assert 0 < default <= 0.5
    storage = pybreaker.CircuitRedisStorage("closed", server.client())
    pool = storage._io.client.connection_pool
    assert pool.connection_kwargs["socket_timeout"] == default
    assert pool.connection_kwargs["retry"].get_retries() == 0  # no client-side retries


@pytest.mark.parametrize(
    ("timeout", "exc"), [(0, ValueError), (-1.0, ValueError), (61, ValueError), ("1", TypeError)]
)
def test_a_bad_timeout_is_refused(timeout: object, exc: type[Exception]) -> None:
    with pytest.raises(exc, match=r"timeout must be .*\(0, 60\]|timeout must be a number"):
        pybreaker.CircuitRedisStorage("closed", object(), timeout=timeout)  # type: ignore[arg-type]
