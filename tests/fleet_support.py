"""A real redis-server for the fleet tests.

- With the ``redis-server`` binary (``.ci/run install`` installs the Debian package where it can):
  a server of its own per test, on a free 127.0.0.1 port, stopped by the test that started it.
- Else with ``FB_REDIS_URL`` (``redis://127.0.0.1:PORT``; the GitHub Linux jobs' service
  container): that server, shared (every test uses its own namespace); a test that must kill and
  restart Redis skips there (``require_restart``).
- Else the tests skip with the reason, unless ``FB_REQUIRE_REDIS`` is set (the Linux CI jobs and
  ``bash .ci/run``), where a missing server is a failure rather than a silent skip.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse
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


def _external_port() -> Optional[int]:
    url = os.environ.get("FB_REDIS_URL")
    if not url:
        return None
    parsed = urllib.parse.urlsplit(url)
    if parsed.hostname not in ("127.0.0.1", "localhost") or parsed.port is None:
        raise ValueError(f"FB_REDIS_URL must be redis://127.0.0.1:PORT, got {url!r}")
    return parsed.port


class RedisServer:
    """One redis-server process, no persistence; ``stop()``/``start()`` keep the port. Or the
    shared server of ``FB_REDIS_URL`` (``external``), which is never stopped."""

    def __init__(self, port: Optional[int] = None) -> None:
        external = _external_port() if BINARY is None else None
        if BINARY is None and external is None:
            reason = "no redis-server binary and no FB_REDIS_URL (apt-get install redis-server)"
            if os.environ.get("FB_REQUIRE_REDIS"):
                raise RuntimeError(f"FB_REQUIRE_REDIS is set, but {reason}")
            pytest.skip(reason)
        self.external = external is not None
        self.port = external or port or free_port()
        self.dir = tempfile.mkdtemp(prefix="fb-redis-")
        self.proc: Optional[subprocess.Popen[bytes]] = None

    def require_restart(self) -> None:
        """Skip the calling test unless this server can be killed and restarted."""
        if self.external:
            pytest.skip("kills and restarts Redis: needs a local redis-server binary")

    def start(self) -> "RedisServer":
        if self.external:
            wait_until(self._answers, 10.0, "the FB_REDIS_URL server to answer")
            return self
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
