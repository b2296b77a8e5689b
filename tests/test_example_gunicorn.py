"""examples/gunicorn served by a real gunicorn (4 sync workers) in front of a real upstream.

The upstream is a ThreadingHTTPServer in this process that the test switches from healthy to
failing (500 for every request) and that counts what it received. The test proves that the
workers share one breaker through the SharedRegion: responses come from 4 distinct workers;
after 5 failures in total (wherever they happened) every worker rejects, the upstream having
received exactly those 5 failing requests (with a breaker per worker it would receive up to
20); /metrics reads the region's counters. Then SIGTERM: the master's on_exit hook unlinks
the region. It runs with and without ``preload_app``, on each core (the workers'
``FASTBREAKER_NO_EXTENSIONS``).

The client is http.client with ``Connection: close`` (no keep-alive connection pinning one
worker); gunicorn listens on a socket this test binds (``fd://``), so no port can be taken
between choosing it and gunicorn's bind. Every wait is bounded by a deadline.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

if os.name != "posix":
    pytest.skip(
        "SharedRegion needs POSIX shared memory (and gunicorn a POSIX host)",
        allow_module_level=True,
    )
pytest.importorskip(
    "gunicorn", reason="gunicorn is not installed (pip install gunicorn, or the test extra)"
)

import fastbreaker  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "gunicorn"
WORKERS = 4
FAILURE_THRESHOLD = 5  # app.py's
MAX_REJECTION_REQUESTS = 200
HEALTHY_LATENCY = 0.1  # the healthy upstream's answer time: concurrent requests overlap
DEADLINE = 15.0  # every wait on gunicorn is bounded by this
CORES = fastbreaker.testing.implementations()  # "c" (where compiled) and "python"

pytestmark = [
    pytest.mark.thread_unsafe(reason="runs gunicorn and an HTTP server"),
    pytest.mark.skipif(
        not (EXAMPLE / "app.py").is_file(), reason="examples/gunicorn is not here (not a checkout)"
    ),
]


class Upstream:
    """An HTTP server on 127.0.0.1: healthy (200 after HEALTHY_LATENCY) or failing (500 at
    once), counting the requests of each kind."""

    def __init__(self) -> None:
        self.failing = False
        self.healthy_requests = 0
        self.failing_requests = 0
        self._lock = threading.Lock()
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with upstream._lock:
                    failing = upstream.failing
                    if failing:
                        upstream.failing_requests += 1
                    else:
                        upstream.healthy_requests += 1
                if failing:
                    status, body = 500, b"upstream is failing\n"
                else:
                    time.sleep(HEALTHY_LATENCY)
                    status, body = 200, b"hello from upstream\n"
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def fail(self) -> None:
        with self._lock:
            self.failing = True

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(DEADLINE)


class Response:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    @property
    def pid(self) -> int:
        return int(self.headers["x-worker-pid"])


def get(port: int, path: str, timeout: float = 5.0) -> Response:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path, headers={"Connection": "close"})
        resp = conn.getresponse()
        body = resp.read()
        headers = {k.lower(): v for k, v in resp.getheaders()}
        return Response(resp.status, headers, body)
    finally:
        conn.close()


def unlink_if_left(name: str, core: str) -> None:
    try:
        region = CORES[core].SharedRegion(name, create=False)
    except FileNotFoundError:
        return
    try:
        region.unlink()
    except FileNotFoundError:
        pass
    region.close()


class Gunicorn:
    def __init__(self, proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.proc = proc
        self.port = port
        self.log = log

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-5000:]

    def wait_ready(self) -> None:
        """One request to /metrics: the socket is ours and listens already, so it waits in the
        kernel's backlog until a worker accepts it (no polling)."""
        try:
            status = get(self.port, "/metrics", timeout=DEADLINE).status
        except OSError as exc:
            pytest.fail(
                f"gunicorn did not answer ({exc}, exit {self.proc.poll()}):\n{self.output()}"
            )
        assert status == 200, self.output()


@pytest.fixture(params=list(CORES))
def core(request: pytest.FixtureRequest) -> str:
    """The core the workers use: "c" (compiled) or "python" (FASTBREAKER_NO_EXTENSIONS=1)."""
    name: str = request.param
    return name


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    server = Upstream()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def region_name(core: str) -> Iterator[str]:
    name = f"fbgu-{uuid.uuid4().hex[:12]}"
    try:
        yield name
    finally:
        unlink_if_left(name, core)  # only if the test failed before gunicorn's on_exit


@pytest.fixture(params=[False, True], ids=["load-in-worker", "preload_app"])
def gunicorn(
    request: pytest.FixtureRequest, core: str, upstream: Upstream, region_name: str, tmp_path: Path
) -> Iterator[Gunicorn]:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    proc: subprocess.Popen[bytes] | None = None
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        port = listener.getsockname()[1]
        package_root = str(Path(fastbreaker.__file__).resolve().parent.parent)
        env = dict(os.environ)
        env.pop("GUNICORN_CMD_ARGS", None)
        env.pop("FASTBREAKER_NO_EXTENSIONS", None)
        if core == "python":
            env["FASTBREAKER_NO_EXTENSIONS"] = "1"
        env.update(
            UPSTREAM=upstream.url,
            FB_REGION=region_name,
            GUNICORN_BIND=f"fd://{listener.fileno()}",
            GUNICORN_PRELOAD="1" if request.param else "0",
            # the fastbreaker this test imported, in the workers too
            PYTHONPATH=os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")])),
            # gunicorn >= 25.1 opens a control socket in $XDG_RUNTIME_DIR (else ~/.gunicorn)
            XDG_RUNTIME_DIR=str(tmp_path),
            NO_PROXY="127.0.0.1,localhost",
            no_proxy="127.0.0.1,localhost",
        )
        log = tmp_path / "gunicorn.log"
        cmd = [sys.executable, "-m", "gunicorn", "-c", "gunicorn.conf.py", "app:app"]
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                cmd,
                cwd=EXAMPLE,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                pass_fds=(listener.fileno(),),
                start_new_session=True,  # its own process group, for the teardown below
            )
        server = Gunicorn(proc, port, log)
        server.wait_ready()
        yield server
    finally:
        listener.close()
        if proc is not None and proc.poll() is None:  # the test failed before stopping it
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(DEADLINE)


def test_workers_share_one_breaker(
    gunicorn: Gunicorn, core: str, upstream: Upstream, region_name: str
) -> None:
    port = gunicorn.port
    breaker_name = f"upstream:{upstream.url.removeprefix('http://')}"
    region_path = f"/dev/shm/{region_name}"

    # 1. Healthy: rounds of WORKERS concurrent requests (each holds its sync worker for
    # HEALTHY_LATENCY) until every worker has answered.
    pids: set[int] = set()
    successes = 0
    with ThreadPoolExecutor(WORKERS) as pool:
        for _ in range(20):
            for resp in pool.map(lambda _: get(port, "/fetch"), range(WORKERS)):
                assert resp.status == 200, resp.body
                assert resp.body == b"hello from upstream\n"
                assert resp.headers["x-breaker-state"] == "CLOSED"
                pids.add(resp.pid)
                successes += 1
            if len(pids) == WORKERS:
                break
    assert len(pids) == WORKERS, f"only workers {pids} answered:\n{gunicorn.output()}"
    assert upstream.healthy_requests == successes
    if sys.platform.startswith("linux"):
        assert os.path.exists(region_path)
    # The region holds the one breaker, made by the workers' core (another core is a ValueError).
    region = CORES[core].SharedRegion(region_name, create=False)
    try:
        assert region.objects() == {breaker_name: "breaker"}
    finally:
        region.close()

    # 2. Failing: one request at a time. The first FAILURE_THRESHOLD are 502 (wherever they
    # land), then the shared breaker is open and every worker answers 503 at once.
    upstream.fail()
    statuses: list[int] = []
    rejected_by: set[int] = set()
    for _ in range(MAX_REJECTION_REQUESTS):
        resp = get(port, "/fetch")
        statuses.append(resp.status)
        assert resp.pid in pids
        if resp.status == 503:
            rejected_by.add(resp.pid)
            assert int(resp.headers["retry-after"]) >= 1
            assert resp.headers["x-breaker-state"] == "OPEN"
            if rejected_by == pids:
                break
    failures = statuses[:FAILURE_THRESHOLD]
    assert failures == [502] * FAILURE_THRESHOLD, statuses
    assert set(statuses[FAILURE_THRESHOLD:]) == {503}, statuses
    assert upstream.failing_requests == FAILURE_THRESHOLD
    assert rejected_by == pids, (
        f"after {len(statuses)} requests only workers {rejected_by} of {pids} rejected"
    )
    rejections = statuses.count(503)

    resp = get(port, "/metrics")
    assert resp.status == 200
    assert resp.headers["x-breaker-state"] == "OPEN"
    metrics = json.loads(resp.body)
    assert metrics["breaker"] == breaker_name
    assert metrics["state"] == "OPEN"
    assert metrics["failures"] == FAILURE_THRESHOLD
    assert metrics["rejected"] == rejections
    assert metrics["successes"] == successes
    assert metrics["permitted"] == successes + FAILURE_THRESHOLD
    assert metrics["opened"] == 1

    # 3. SIGTERM: the workers stop, then the master's on_exit unlinks the region.
    gunicorn.proc.send_signal(signal.SIGTERM)
    try:
        code = gunicorn.proc.wait(DEADLINE)
    except subprocess.TimeoutExpired:
        pytest.fail(f"gunicorn did not stop within {DEADLINE} s:\n{gunicorn.output()}")
    assert code == 0, gunicorn.output()
    with pytest.raises(FileNotFoundError):
        fastbreaker.SharedRegion(region_name, create=False)
    if sys.platform.startswith("linux"):
        assert not os.path.exists(region_path)
