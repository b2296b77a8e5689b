"""A real redis-server for the fleet tests: started from the binary on a free 127.0.0.1 port
(``.ci/run`` installs the Debian package ``redis-server``), stopped by the test that started it.
Without the binary the tests that need it skip, except in CI (``CI`` set), where they fail."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from typing import Optional

import pytest

BINARY = shutil.which("redis-server") or (
    "/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server") else None
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(condition, timeout: float, what: str, step: float = 0.005):  # type: ignore[no-untyped-def]
    """Poll ``condition`` until it returns a true value (returned) or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(step)


class RedisServer:
    """One redis-server process, no persistence; ``stop()``/``start()`` keep the port."""

    def __init__(self, port: Optional[int] = None) -> None:
        if BINARY is None:
            if os.environ.get("CI"):
                raise RuntimeError("redis-server is not installed (.ci/run installs it)")
            pytest.skip("redis-server is not installed (apt-get install redis-server)")
        self.port = port or free_port()
        self.dir = tempfile.mkdtemp(prefix="fb-redis-")
        self.proc: Optional[subprocess.Popen[bytes]] = None

    def start(self) -> "RedisServer":
        assert BINARY is not None
        self.proc = subprocess.Popen(
            [
                BINARY,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self.dir,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until(self._answers, 10.0, "redis-server to answer")
        return self

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    def client(self, **kwargs):  # type: ignore[no-untyped-def]
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, **kwargs)
