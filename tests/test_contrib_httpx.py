"""fastbreaker.contrib.httpx against real HTTP servers on 127.0.0.1 (no mocks).

Each "host" is a threaded ``http.server`` on its own port: one healthy, one answering 503, one
slow (it answers after the client's read timeout), one that stalls in the middle of its body,
and a closed port that refuses connections. Breakers get a FakeClock, so open periods pass
without sleeping; retries run inside ``instant_retries()`` unless a test needs real time.
"""

from __future__ import annotations

import asyncio
import collections
import datetime
import email.utils
import os
import pickle
import socket
import subprocess
import sys
import threading
import time
import types
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from fastbreaker import State, _retry
from fastbreaker.testing import instant_retries

httpx = pytest.importorskip("httpx")  # the optional extra: pip install 'fastbreaker[httpx]'

from fastbreaker.contrib.httpx import (  # noqa: E402
    AsyncBreakerTransport,
    BreakerTransport,
    CircuitOpenTransportError,
    Origin,
    Retry,
    default_is_failure,
    origin,
)

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")

READ_TIMEOUT = 0.1  # the client's read timeout; the slow hosts take longer than this
HOLD = 1.0  # how long a slow host holds a request at most (module teardown releases it)


# -- the hosts -----------------------------------------------------------------------------------
class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "_Server"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _handle(self) -> None:
        host = self.server.host
        host.hits.append((self.command, self.path))
        self.close_connection = True  # a request body we do not read never desyncs a connection
        if host.mode == "slow":
            host.release.wait(HOLD)
        status, headers = host.script.popleft() if host.script else (host.status(self.path), {})
        body = b"" if self.command == "HEAD" else f"{status} from {host.name}".encode()
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        if host.mode == "stall":
            self.send_header("Content-Length", str(len(body) + 100))
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()
            host.release.wait(HOLD)
            return
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = _handle


class _Server(ThreadingHTTPServer):
    host: "Host"

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that timed out and left: expected here


class Host:
    """One 'host': its own port on 127.0.0.1, a mode, a script of canned responses, its hits."""

    def __init__(self, name: str, mode: str) -> None:
        self.name = name
        self.initial_mode = mode
        self.mode = mode
        self.script: collections.deque[tuple[int, dict[str, str]]] = collections.deque()
        self.hits: list[tuple[str, str]] = []
        self.release = threading.Event()
        self.server = _Server(("127.0.0.1", 0), _Handler)
        self.server.host = self
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    def status(self, path: str) -> int:
        if self.mode == "503":
            return 503
        if path.startswith("/status/"):
            return int(path.split("/")[2])
        return 200

    def reset(self) -> None:
        self.mode = self.initial_mode
        self.script.clear()
        self.hits.clear()

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def _closed_port_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def _servers() -> Iterator[types.SimpleNamespace]:
    hosts = [Host("ok", "ok"), Host("failing", "503"), Host("slow", "slow"), Host("stall", "stall")]
    try:
        yield types.SimpleNamespace(**{h.name: h for h in hosts}, refused=_closed_port_url())
    finally:
        for h in hosts:
            h.stop()


@pytest.fixture
def hosts(_servers: types.SimpleNamespace) -> types.SimpleNamespace:
    for name in ("ok", "failing", "slow", "stall"):
        getattr(_servers, name).reset()
    return _servers


@pytest.fixture
def delays() -> Iterator[list[float]]:
    with instant_retries() as recorded:
        yield recorded


@pytest.fixture
def pin_jitter(monkeypatch: pytest.MonkeyPatch) -> Any:
    def pin(u: float) -> None:
        monkeypatch.setattr(_retry, "uniform", lambda: u)

    return pin


TIMEOUT = httpx.Timeout(2.0, read=READ_TIMEOUT)


def client_for(transport: httpx.BaseTransport) -> httpx.Client:
    return httpx.Client(transport=transport, timeout=TIMEOUT)


def key(url: str) -> Origin:
    return Origin.of(url)


class RecordingTransport(httpx.HTTPTransport):
    """The real transport, keeping every response it returned (to check they were closed)."""

    def __init__(self) -> None:
        super().__init__()
        self.responses: list[httpx.Response] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        self.responses.append(response)
        return response


# -- breakers per host ---------------------------------------------------------------------------
def _fail_once(client: httpx.Client, url: str) -> None:
    try:
        response = client.get(url)
    except (httpx.ConnectError, httpx.ReadTimeout):
        return
    assert response.status_code == 503


def test_failing_hosts_open_and_the_healthy_host_is_unaffected(fb, clock, hosts):
    m = fb.BreakerMap(failure_threshold=3, reset_timeout=30.0, clock=clock)
    failing = [hosts.failing.url, hosts.refused, hosts.slow.url]
    with client_for(BreakerTransport(breakers=m)) as client:
        for _ in range(3):
            for url in failing:
                _fail_once(client, url)
                assert client.get(hosts.ok.url).status_code == 200
        assert sorted(m.open_keys()) == sorted(key(u) for u in failing)
        hits = len(hosts.failing.hits), len(hosts.slow.hits)

        start = time.perf_counter()
        for url in failing:
            with pytest.raises(fb.CircuitOpenError) as info:
                client.get(url)
            err = info.value
            assert isinstance(err, CircuitOpenTransportError)
            assert isinstance(err, httpx.TransportError)
            assert err.key == key(url) and err.name == str(key(url))
            assert err.state == fb.State.OPEN and err.retry_after == 30.0
            assert err.request.url == httpx.URL(url)
        assert time.perf_counter() - start < READ_TIMEOUT  # nothing waited for the slow host
        assert (len(hosts.failing.hits), len(hosts.slow.hits)) == hits  # nothing was sent

        assert client.get(hosts.ok.url).status_code == 200
    healthy = m.get(key(hosts.ok.url)).metrics()
    assert healthy.state == fb.State.CLOSED
    assert (healthy.successes, healthy.failures, healthy.rejected) == (10, 0, 0)
    mm = m.metrics()
    assert (mm.keys, mm.open, mm.rejected, mm.failures) == (4, 3, 3, 9)


def test_recovery_after_the_open_period(fb, clock, hosts):
    m = fb.BreakerMap(failure_threshold=2, reset_timeout=30.0, clock=clock)
    changes: list[tuple[Any, Any, Any]] = []
    m.on_state_change(lambda k, old, new: changes.append((k, old.name, new.name)))
    with client_for(BreakerTransport(breakers=m)) as client:
        for _ in range(2):
            _fail_once(client, hosts.failing.url)
            _fail_once(client, hosts.refused)
        hosts.failing.mode = "ok"  # the 503 host recovers; the refused port stays closed
        clock.advance(29.9)
        for url in (hosts.failing.url, hosts.refused):
            with pytest.raises(fb.CircuitOpenError):
                client.get(url)
        clock.advance(0.1)
        assert client.get(hosts.failing.url).status_code == 200  # the probe
        with pytest.raises(httpx.ConnectError):
            client.get(hosts.refused)  # its probe fails: open again, for a fresh period
        assert m.get(key(hosts.failing.url)).state == fb.State.CLOSED
        assert m.open_keys() == [key(hosts.refused)]
        assert m.get(key(hosts.refused)).retry_after == 30.0
        assert client.get(hosts.failing.url).status_code == 200
    up, down = key(hosts.failing.url), key(hosts.refused)
    assert [c for c in changes if c[0] == up] == [
        (up, "CLOSED", "OPEN"),
        (up, "OPEN", "HALF_OPEN"),
        (up, "HALF_OPEN", "CLOSED"),
    ]
    assert [c for c in changes if c[0] == down] == [
        (down, "CLOSED", "OPEN"),
        (down, "OPEN", "HALF_OPEN"),
        (down, "HALF_OPEN", "OPEN"),
    ]


async def _afail_once(client: httpx.AsyncClient, url: str) -> None:
    try:
        response = await client.get(url)
    except (httpx.ConnectError, httpx.ReadTimeout):
        return
    assert response.status_code == 503


async def test_async_hosts_open_isolate_and_recover(fb, clock, hosts):
    m = fb.BreakerMap(failure_threshold=3, reset_timeout=10.0, clock=clock)
    failing = [hosts.failing.url, hosts.refused, hosts.slow.url]
    transport = AsyncBreakerTransport(breakers=m)
    async with httpx.AsyncClient(transport=transport, timeout=TIMEOUT) as client:
        for _ in range(3):
            await asyncio.gather(*(_afail_once(client, u) for u in failing))
            assert (await client.get(hosts.ok.url)).status_code == 200
        assert sorted(m.open_keys()) == sorted(key(u) for u in failing)
        hits = len(hosts.failing.hits), len(hosts.slow.hits)
        for url in failing:
            with pytest.raises(CircuitOpenTransportError) as info:
                await client.get(url)
            assert info.value.key == key(url) and info.value.retry_after == 10.0
        assert (len(hosts.failing.hits), len(hosts.slow.hits)) == hits
        assert m.get(key(hosts.ok.url)).metrics().successes == 3

        hosts.failing.mode = "ok"
        clock.advance(10.0)
        assert (await client.get(hosts.failing.url)).status_code == 200
        with pytest.raises(httpx.ConnectError):
            await client.get(hosts.refused)
        with pytest.raises(httpx.ReadTimeout):
            await client.get(hosts.slow.url)
    assert sorted(m.open_keys()) == sorted([key(hosts.refused), key(hosts.slow.url)])
    assert m.get(key(hosts.failing.url)).state == fb.State.CLOSED


# -- classification ------------------------------------------------------------------------------
def test_4xx_is_a_success_and_429_a_failure(fb, clock, hosts):
    m = fb.BreakerMap(failure_threshold=3, clock=clock)
    with client_for(BreakerTransport(breakers=m)) as client:
        for code in (400, 401, 404, 409, 422) * 2:
            assert client.get(f"{hosts.ok.url}/status/{code}").status_code == code
        b = m[key(hosts.ok.url)]
        assert (b.metrics().successes, b.metrics().failures) == (10, 0)
        for _ in range(3):
            assert client.get(f"{hosts.ok.url}/status/429").status_code == 429
        assert b.state == fb.State.OPEN


def test_default_is_failure():
    request = httpx.Request("GET", "http://x")
    for code, failed in ((200, False), (404, False), (429, True), (500, True), (503, True)):
        assert default_is_failure(httpx.Response(code)) is failed
    assert default_is_failure(httpx.ConnectError("refused"))
    assert default_is_failure(httpx.ReadTimeout("slow"))
    assert default_is_failure(httpx.RemoteProtocolError("hung up"))
    assert not default_is_failure(httpx.UnsupportedProtocol("ftp"))
    assert not default_is_failure(ValueError("bug"))
    rejected = CircuitOpenTransportError("x", State.OPEN, 3.0)
    rejected.request = request
    assert not default_is_failure(rejected)


def test_custom_is_failure(fb, clock, hosts):
    seen: list[Any] = []

    def only_errors(outcome: Any) -> bool:
        seen.append(outcome)
        return isinstance(outcome, Exception)

    m = fb.BreakerMap(failure_threshold=2, clock=clock)
    with client_for(BreakerTransport(breakers=m, is_failure=only_errors)) as client:
        for _ in range(3):
            assert client.get(hosts.failing.url).status_code == 503
        assert m.get(key(hosts.failing.url)).state == fb.State.CLOSED
        for _ in range(2):
            with pytest.raises(httpx.ConnectError):
                client.get(hosts.refused)
    assert m.open_keys() == [key(hosts.refused)]
    assert [type(o).__name__ for o in seen] == ["Response"] * 3 + ["ConnectError"] * 2


def test_other_errors_are_neutral(fb, clock, hosts):
    m = fb.BreakerMap(failure_threshold=1, clock=clock)
    b = m[key(hosts.ok.url)]
    b.trip()
    clock.advance(30.0)
    with client_for(BreakerTransport(breakers=m, is_failure=lambda o: False)) as client:
        with pytest.raises(httpx.ConnectError):
            client.get(hosts.refused)  # not a failure by this classifier: neutral
        # A probe that ends in a neutral error releases its permit: the next probe may pass.
        client.get(hosts.ok.url)
    assert b.state == fb.State.CLOSED
    assert m.get(key(hosts.refused)).metrics().ignored == 1


def test_a_read_error_after_the_headers_is_a_failure(fb, clock, hosts):
    m = fb.BreakerMap(failure_threshold=1, clock=clock)
    with client_for(BreakerTransport(breakers=m)) as client:
        with pytest.raises(httpx.ReadTimeout):
            client.get(hosts.stall.url)  # 200 and its headers arrive, then the body stalls
    b = m.get(key(hosts.stall.url))
    assert b.state == fb.State.OPEN
    assert (b.metrics().successes, b.metrics().failures) == (0, 1)


def test_success_is_reported_when_the_body_is_done(fb, clock, hosts):
    m = fb.BreakerMap(clock=clock)
    with client_for(BreakerTransport(breakers=m)) as client:
        with client.stream("GET", hosts.ok.url) as response:
            assert response.status_code == 200
            b = m.get(key(hosts.ok.url))
            assert (b.metrics().permitted, b.metrics().successes) == (1, 0)
        assert b.metrics().successes == 1  # closed without reading: still a success
        with client.stream("GET", hosts.ok.url) as response:
            assert response.read() == b"200 from ok"
            assert b.metrics().successes == 2
    assert b.metrics().successes == 2  # reported once


async def test_async_read_error_after_headers_and_deferred_success(fb, clock, hosts):
    m = fb.BreakerMap(failure_threshold=1, clock=clock)
    async with httpx.AsyncClient(transport=AsyncBreakerTransport(breakers=m), timeout=TIMEOUT) as c:
        with pytest.raises(httpx.ReadTimeout):
            await c.get(hosts.stall.url)
        async with c.stream("GET", hosts.ok.url) as response:
            assert m.get(key(hosts.ok.url)).metrics().successes == 0
            assert await response.aread() == b"200 from ok"
    assert m.get(key(hosts.stall.url)).state == fb.State.OPEN
    assert m.get(key(hosts.ok.url)).metrics().successes == 1


def test_slow_calls_are_timed_to_the_end_of_the_body(fb, clock, hosts):
    m = fb.BreakerMap(failure_threshold=1, slow_call_duration=1.0, clock=clock)
    with client_for(BreakerTransport(breakers=m)) as client:
        with client.stream("GET", hosts.ok.url) as response:
            clock.advance(1.5)  # the body takes long to arrive
            response.read()
    b = m.get(key(hosts.ok.url))
    assert b.metrics().slow_calls == 1
    assert b.state == fb.State.OPEN  # consecutive mode: a slow call counts as a failure


# -- keys and breakers ---------------------------------------------------------------------------
def test_origin_keys():
    assert Origin.of("https://api.example.com/x?y=1") == ("https", "api.example.com", 443)
    assert Origin.of("http://api.example.com") == ("http", "api.example.com", 80)
    assert str(Origin.of("http://127.0.0.1:8080/a")) == "http://127.0.0.1:8080"
    assert str(Origin.of("http://[::1]:8080/")) == "http://[::1]:8080"
    assert origin(httpx.Request("GET", "https://a.example:8443/p")) == ("https", "a.example", 8443)


def test_one_breaker_per_origin_named_by_it(fb, clock, hosts):
    m = fb.BreakerMap(clock=clock)
    with client_for(BreakerTransport(breakers=m)) as client:
        client.get(hosts.ok.url + "/a")
        client.get(hosts.ok.url + "/b?c=d")
        client.get(hosts.failing.url)
    assert len(m) == 2
    assert m[key(hosts.ok.url)].name == hosts.ok.url
    assert m[("http", "127.0.0.1", int(hosts.ok.url.rsplit(":", 1)[1]))].metrics().successes == 2


def test_custom_key(fb, clock, hosts):
    m = fb.BreakerMap(failure_threshold=1, clock=clock)
    by_path = BreakerTransport(breakers=m, key=lambda r: (r.url.host, r.url.path.split("/")[1]))
    with client_for(by_path) as client:
        assert client.get(hosts.ok.url + "/status/500").status_code == 500
        assert client.get(hosts.ok.url + "/fine").status_code == 200
        with pytest.raises(fb.CircuitOpenError):
            client.get(hosts.ok.url + "/status/200")
    assert m.open_keys() == [("127.0.0.1", "status")]


def test_a_single_breaker_guards_every_host(fb, clock, hosts):
    b = fb.CircuitBreaker(failure_threshold=2, clock=clock)
    transport = BreakerTransport(breakers=b)
    assert transport.breakers is b
    with client_for(transport) as client:
        client.get(hosts.failing.url)
        client.get(hosts.failing.url)
        with pytest.raises(fb.CircuitOpenError):
            client.get(hosts.ok.url)
    assert hosts.ok.hits == []


def test_default_breakers_are_a_bounded_map(hosts):
    import fastbreaker

    transport = BreakerTransport()
    assert isinstance(transport.breakers, fastbreaker.BreakerMap)
    assert repr(transport.breakers).endswith("max_keys=10000>")
    with httpx.Client(transport=transport) as client:
        assert client.get(hosts.ok.url).status_code == 200
    assert key(hosts.ok.url) in transport.breakers


def test_threads_share_one_transport(fb, clock, hosts):
    m = fb.BreakerMap(clock=clock)
    errors: list[BaseException] = []
    # Not a test of timeouts: a generous read timeout, so that 6 threads on a loaded machine (or
    # a free-threaded build) never see the 0.1 s one meant for the slow hosts.
    with httpx.Client(transport=BreakerTransport(breakers=m), timeout=10.0) as client:

        def work() -> None:
            try:
                for _ in range(20):
                    assert client.get(hosts.ok.url).status_code == 200
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=work) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
    assert errors == []
    mm = m.metrics()
    assert (mm.permitted, mm.successes, mm.failures, mm.stale) == (120, 120, 0, 0)


# -- retries -------------------------------------------------------------------------------------
def test_get_is_retried_until_it_succeeds(fb, clock, hosts, delays, pin_jitter):
    pin_jitter(0.5)
    hosts.ok.script.extend([(503, {}), (502, {})])
    m = fb.BreakerMap(failure_threshold=1, clock=clock)
    budget = fb.RetryBudget(ratio=0.5, capacity=10, min_per_sec=0)
    inner = RecordingTransport()
    transport = BreakerTransport(
        inner, breakers=m, retry=Retry(attempts=3, base=0.1, cap=1.0, budget=budget)
    )
    with client_for(transport) as client:
        response = client.get(hosts.ok.url)
    assert response.status_code == 200
    assert len(hosts.ok.hits) == 3
    assert delays == [0.05, 0.1]  # full jitter, pinned at half of min(cap, base * 2**n)
    assert [r.is_closed for r in inner.responses] == [True, True, True]  # retried ones first
    assert budget.tokens == 8.5  # two retries taken, one success deposited
    b = m.get(key(hosts.ok.url))
    mt = b.metrics()  # one outcome per request: the breaker sits outside the retries
    assert (mt.permitted, mt.successes, mt.failures, b.state) == (1, 1, 0, fb.State.CLOSED)


def test_the_last_response_is_returned_when_attempts_run_out(fb, clock, hosts, delays):
    m = fb.BreakerMap(clock=clock)
    with client_for(BreakerTransport(breakers=m, retry=Retry(attempts=3))) as client:
        response = client.get(hosts.failing.url)
    assert response.status_code == 503 and response.text == "503 from failing"
    assert len(hosts.failing.hits) == 3 and len(delays) == 2
    assert m.get(key(hosts.failing.url)).metrics().failures == 1


def test_retry_after_seconds_replaces_the_jitter(fb, clock, hosts, delays):
    hosts.ok.script.append((503, {"Retry-After": "1"}))
    seen: list[tuple[int, int, float]] = []
    retry = Retry(on_retry=lambda n, outcome, delay: seen.append((n, outcome.status_code, delay)))
    with client_for(BreakerTransport(breakers=fb.BreakerMap(clock=clock), retry=retry)) as client:
        assert client.get(hosts.ok.url).status_code == 200
    assert delays == [1.0]
    assert seen == [(1, 503, 1.0)]


def test_retry_after_http_date(fb, clock, hosts, delays):
    when = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=3)
    hosts.ok.script.append((429, {"Retry-After": email.utils.format_datetime(when, usegmt=True)}))
    with client_for(BreakerTransport(breakers=fb.BreakerMap(clock=clock), retry=Retry())) as c:
        assert c.get(hosts.ok.url).status_code == 200
    assert len(delays) == 1 and 1.0 < delays[0] <= 3.0


def test_retry_after_past_the_deadline_returns_the_response(fb, clock, hosts, delays):
    hosts.ok.script.append((503, {"Retry-After": "5"}))
    with client_for(BreakerTransport(breakers=fb.BreakerMap(clock=clock), retry=Retry())) as c:
        with fb.deadline(2.0):
            response = c.get(hosts.ok.url)
    assert response.status_code == 503 and response.headers["Retry-After"] == "5"
    assert len(hosts.ok.hits) == 1 and delays == []


def test_retry_after_longer_than_max_retry_after_is_not_waited(fb, clock, hosts, delays):
    hosts.ok.script.append((503, {"Retry-After": "30"}))
    retry = Retry(max_retry_after=10.0)
    with client_for(BreakerTransport(breakers=fb.BreakerMap(clock=clock), retry=retry)) as c:
        assert c.get(hosts.ok.url).status_code == 503
    assert len(hosts.ok.hits) == 1 and delays == []


@pytest.mark.parametrize("method", ["GET", "HEAD", "OPTIONS", "PUT", "DELETE"])
def test_idempotent_methods_are_retried(fb, clock, hosts, delays, method):
    hosts.ok.script.append((503, {}))
    with client_for(BreakerTransport(breakers=fb.BreakerMap(clock=clock), retry=Retry())) as c:
        assert c.request(method, hosts.ok.url, content=b"x" if method == "PUT" else None).is_success
    assert [h[0] for h in hosts.ok.hits] == [method, method]


@pytest.mark.parametrize("method", ["POST", "PATCH"])
def test_other_methods_are_not_retried(fb, clock, hosts, delays, method):
    hosts.ok.script.append((503, {}))
    with client_for(BreakerTransport(breakers=fb.BreakerMap(clock=clock), retry=Retry())) as c:
        assert c.request(method, hosts.ok.url, content=b"x").status_code == 503
    assert len(hosts.ok.hits) == 1 and delays == []


def test_a_streamed_body_is_not_retried(fb, clock, hosts, delays):
    hosts.ok.script.append((503, {}))
    with client_for(BreakerTransport(breakers=fb.BreakerMap(clock=clock), retry=Retry())) as c:
        assert c.put(hosts.ok.url, content=iter([b"a", b"b"])).status_code == 503
    assert len(hosts.ok.hits) == 1 and delays == []


def test_500_is_a_failure_but_not_retried_by_default(fb, clock, hosts, delays):
    m = fb.BreakerMap(failure_threshold=1, clock=clock)
    with client_for(BreakerTransport(breakers=m, retry=Retry())) as c:
        assert c.get(hosts.ok.url + "/status/500").status_code == 500
    assert len(hosts.ok.hits) == 1 and delays == []
    assert m.open_keys() == [key(hosts.ok.url)]


def test_connection_errors_are_retried_then_raised(fb, clock, hosts, delays):
    budget = fb.RetryBudget(ratio=0.1, capacity=5, min_per_sec=0)
    m = fb.BreakerMap(failure_threshold=2, clock=clock)
    with client_for(BreakerTransport(breakers=m, retry=Retry(attempts=3, budget=budget))) as c:
        with pytest.raises(httpx.ConnectError):
            c.get(hosts.refused)
    assert len(delays) == 2 and budget.tokens == 3.0
    b = m.get(key(hosts.refused))
    assert (b.metrics().failures, b.state) == (1, fb.State.CLOSED)  # one outcome, not three


def test_the_budget_bounds_retries(fb, clock, hosts, delays):
    budget = fb.RetryBudget(ratio=0.0, capacity=1, min_per_sec=0)
    retry = Retry(attempts=5, budget=budget)
    assert retry.budget is budget
    hosts.ok.script.extend([(503, {}), (503, {}), (503, {})])
    with client_for(BreakerTransport(breakers=fb.BreakerMap(clock=clock), retry=retry)) as c:
        assert c.get(hosts.ok.url).status_code == 503  # one retry (the only token), then 503
        assert c.get(hosts.ok.url).status_code == 503  # no token left: no retry
    assert len(hosts.ok.hits) == 3 and len(delays) == 1


def test_the_deadline_refuses_a_retry_of_an_error(fb, clock, hosts, delays, pin_jitter):
    pin_jitter(0.99)
    m = fb.BreakerMap(failure_threshold=1, clock=clock)
    retry = Retry(attempts=3, base=1.0, cap=1.0)
    with client_for(BreakerTransport(breakers=m, retry=retry)) as c:
        with fb.deadline(0.5), pytest.raises(fb.DeadlineExceeded) as info:
            c.get(hosts.refused)
    assert isinstance(info.value.__cause__, httpx.ConnectError)
    assert delays == []
    assert m.open_keys() == [key(hosts.refused)]  # the connection error still counts


def test_a_per_request_deadline_in_retry(fb, clock, hosts, delays, pin_jitter):
    pin_jitter(0.99)
    retry = Retry(attempts=3, base=1.0, cap=1.0, deadline=0.5)
    with client_for(BreakerTransport(breakers=fb.BreakerMap(clock=clock), retry=retry)) as c:
        assert c.get(hosts.failing.url).status_code == 503  # the jittered wait would not fit
    assert len(hosts.failing.hits) == 1 and delays == []


def test_a_rejected_request_is_never_retried(fb, clock, hosts, delays):
    m = fb.BreakerMap(clock=clock)
    m[key(hosts.ok.url)].trip()
    with client_for(BreakerTransport(breakers=m, retry=Retry())) as c:
        with pytest.raises(fb.CircuitOpenError):
            c.get(hosts.ok.url)
    assert hosts.ok.hits == [] and delays == []


def test_a_rejection_from_an_inner_breaker_is_not_retried(fb, clock, hosts, delays):
    inner_map = fb.BreakerMap(clock=clock)
    inner_map[key(hosts.ok.url)].trip()
    outer_map = fb.BreakerMap(clock=clock)
    inner = BreakerTransport(breakers=inner_map)
    with client_for(BreakerTransport(inner, breakers=outer_map, retry=Retry())) as c:
        with pytest.raises(CircuitOpenTransportError):
            c.get(hosts.ok.url)
    assert hosts.ok.hits == [] and delays == []
    outer = outer_map.get(key(hosts.ok.url)).metrics()
    assert (outer.failures, outer.ignored) == (0, 1)  # neutral for the outer breaker


async def test_async_retries(fb, clock, hosts, delays, pin_jitter):
    pin_jitter(0.5)
    hosts.ok.script.extend([(503, {}), (429, {"Retry-After": "2"})])
    m = fb.BreakerMap(clock=clock)
    transport = AsyncBreakerTransport(breakers=m, retry=Retry(attempts=3, base=0.2, cap=1.0))
    async with httpx.AsyncClient(transport=transport, timeout=TIMEOUT) as client:
        assert (await client.get(hosts.ok.url)).status_code == 200
        assert (await client.post(hosts.failing.url)).status_code == 503
        with pytest.raises(httpx.ConnectError):
            await client.get(hosts.refused)
    assert delays == [0.1, 2.0, 0.1, 0.2]
    assert len(hosts.ok.hits) == 3 and len(hosts.failing.hits) == 1
    assert m.get(key(hosts.ok.url)).metrics().successes == 1


# -- deadlines -----------------------------------------------------------------------------------
def test_an_expired_deadline_sends_nothing(fb, clock, hosts):
    m = fb.BreakerMap(clock=clock)
    with client_for(BreakerTransport(breakers=m)) as c:
        with fb.deadline(0), pytest.raises(fb.DeadlineExceeded):
            c.get(hosts.ok.url)
    assert hosts.ok.hits == []
    assert m.get(key(hosts.ok.url)).metrics().ignored == 1  # neutral: the host did nothing


def test_the_deadline_cuts_httpx_timeouts(fb, hosts):
    m = fb.BreakerMap()
    with httpx.Client(transport=BreakerTransport(breakers=m), timeout=10.0) as c:
        start = time.perf_counter()
        with fb.deadline(0.15), pytest.raises(httpx.ReadTimeout):
            c.get(hosts.slow.url)  # the host holds the request for up to HOLD seconds
        assert time.perf_counter() - start < 0.15 + 0.5


async def test_the_deadline_cuts_httpx_timeouts_async(fb, hosts):
    transport = AsyncBreakerTransport(breakers=fb.BreakerMap())
    async with httpx.AsyncClient(transport=transport, timeout=10.0) as c:
        start = time.perf_counter()
        with fb.deadline(0.15), pytest.raises(httpx.ReadTimeout):
            await c.get(hosts.slow.url)
        assert time.perf_counter() - start < 0.15 + 0.5


# -- construction, errors, imports ---------------------------------------------------------------
def test_invalid_arguments(fb):
    with pytest.raises(TypeError, match="breakers"):
        BreakerTransport(breakers=object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="retry"):
        BreakerTransport(retry=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="key"):
        BreakerTransport(key="host")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="is_failure"):
        AsyncBreakerTransport(is_failure=True)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="transport"):
        BreakerTransport(httpx.AsyncHTTPTransport())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="attempts"):
        Retry(attempts=0)
    with pytest.raises(TypeError, match="methods"):
        Retry(methods="GET")
    with pytest.raises(TypeError, match="statuses"):
        Retry(statuses=[503, 600])
    with pytest.raises(ValueError, match="max_retry_after"):
        Retry(max_retry_after=-1)
    with pytest.raises(TypeError, match="budget"):
        Retry(budget=object())  # type: ignore[arg-type]
    assert Retry(methods=["get", "post"]).methods == {"GET", "POST"}
    import fastbreaker

    default = Retry()
    assert isinstance(default.budget, fastbreaker.RetryBudget)  # a safe default: retries budgeted
    assert default.budget is not Retry().budget


def test_the_rejection_error_pickles():
    err = CircuitOpenTransportError("http://h:1", State.OPEN, 2.5)
    again = pickle.loads(pickle.dumps(err))
    assert isinstance(again, CircuitOpenTransportError)
    assert (again.name, again.state, again.retry_after) == ("http://h:1", State.OPEN, 2.5)
    assert str(again) == str(err) == "circuit 'http://h:1' is OPEN: retry after 2.500s"


def _run(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )


def test_importing_fastbreaker_does_not_import_httpx():
    out = _run(
        "import sys, fastbreaker\n"
        "assert 'httpx' not in sys.modules, 'httpx'\n"
        "assert 'fastbreaker.contrib' not in sys.modules, 'contrib'\n"
    )
    assert out.returncode == 0, out.stderr


def test_a_clear_error_without_httpx():
    out = _run(
        "import sys\n"
        "sys.modules['httpx'] = None  # as if it were not installed\n"
        "try:\n"
        "    import fastbreaker.contrib.httpx\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    assert out.returncode == 0, out.stderr
    assert "pip install 'fastbreaker[httpx]'" in out.stdout


def test_dry_run_map_sends_every_request(fb, clock, hosts):
    m = fb.BreakerMap(failure_threshold=2, reset_timeout=30.0, clock=clock, dry_run=True)
    with client_for(BreakerTransport(breakers=m)) as client:
        for _ in range(4):
            assert client.get(hosts.failing.url).status_code == 503
    assert len(hosts.failing.hits) >= 4  # nothing was refused
    breaker = m.get(key(hosts.failing.url))
    mm = breaker.metrics()
    assert breaker.state == fb.State.OPEN
    assert (mm.would_reject, mm.rejected, mm.stale, mm.failures) == (2, 0, 2, 2)
