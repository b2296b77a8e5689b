"""fastbreaker.contrib.asgi.LoadSheddingMiddleware served by a real uvicorn on 127.0.0.1 and
called by a real httpx client, on both cores (the shedder's slots come from fb.Bulkhead).

The application's /work route holds its slot until the test opens a gate, so the test knows
exactly when the shedder is full; nothing waits on a timer.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
import threading
import tracemalloc
import types
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("starlette")
httpx = pytest.importorskip("httpx")

import uvicorn  # noqa: E402
from starlette.applications import Starlette  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import JSONResponse, PlainTextResponse  # noqa: E402
from starlette.routing import Route  # noqa: E402

import fastbreaker  # noqa: E402
import fastbreaker.testing  # noqa: E402
from fastbreaker.contrib.asgi import (  # noqa: E402
    LoadSheddingMiddleware,
    RateLimitMiddleware,
    parse_deadline,
)
from fastbreaker.contrib.httpx import AsyncBreakerTransport, BreakerTransport  # noqa: E402

TIMEOUT = 10.0  # every wait of the test on the server is bounded by this


class Gate:
    """The /work route: signals that it holds its slot, then waits for the test to open it."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.open = threading.Event()
        self.left = threading.Event()  # set once the middleware has given the slot back

    def reset(self) -> None:
        self.entered.clear()
        self.open.clear()
        self.left.clear()


def make_app(gate: Gate) -> Starlette:
    async def work(request: Request) -> PlainTextResponse:
        gate.entered.set()
        await asyncio.to_thread(gate.open.wait, TIMEOUT)
        return PlainTextResponse("done")

    async def echo(request: Request) -> JSONResponse:
        dl = fastbreaker.current_deadline()
        return JSONResponse(
            {
                "priority": fastbreaker.current_priority().name,
                "remaining": None if dl is None else dl.remaining(),
                "headers": {k: v for k, v in request.headers.items() if k.startswith("x-")},
            }
        )

    async def health(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    return Starlette(
        routes=[
            Route("/work", work),
            Route("/echo", echo),
            Route("/health", health),
            Route("/health/deep", health),
            Route("/healthz", health),
        ]
    )


@contextlib.contextmanager
def serve(app: Any) -> Iterator[str]:
    """Serve ``app`` with uvicorn on 127.0.0.1 (a free port) until the block ends."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    # Listening before uvicorn starts: a request made before its loop runs waits in the kernel's
    # backlog and is served once it does, so nothing has to wait for the startup.
    sock.listen(128)
    config = uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(TIMEOUT)
        sock.close()


@pytest.fixture
def site(fb: types.SimpleNamespace) -> Iterator[types.SimpleNamespace]:
    gate = Gate()
    shedder = fb.LoadShedder(fb.Bulkhead(1), max_queue=0, name="api")
    shedding = LoadSheddingMiddleware(make_app(gate), shedder)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        # The client can read the response before the middleware returns (and releases the
        # slot): the test waits for this event, set after it has returned.
        await shedding(scope, receive, send)
        if scope.get("path") == "/work":
            gate.left.set()

    with serve(app) as url:
        yield types.SimpleNamespace(url=url, gate=gate, shedder=shedder)
    gate.open.set()


def hold_the_slot(site: types.SimpleNamespace) -> tuple[threading.Thread, list[Any]]:
    """Send a /work request in a thread and return once it holds the shedder's only slot."""
    got: list[Any] = []
    site.gate.reset()

    def run() -> None:
        got.append(httpx.get(site.url + "/work", timeout=TIMEOUT))

    t = threading.Thread(target=run)
    t.start()
    assert site.gate.entered.wait(TIMEOUT)
    return t, got


def test_a_full_shedder_answers_503_with_retry_after_and_never_runs_the_app(site: Any) -> None:
    t, got = hold_the_slot(site)
    try:
        r = httpx.get(site.url + "/echo", timeout=TIMEOUT)
        assert r.status_code == 503
        assert r.headers["x-load-shed"] == "queue_full"
        assert int(r.headers["retry-after"]) >= 1  # whole seconds, rounded up
        assert "load shed (queue_full)" in r.text
        assert "priority" not in r.text  # the echo route never ran
    finally:
        site.gate.open.set()
        t.join(TIMEOUT)
    assert got[0].status_code == 200 and got[0].text == "done"
    assert site.gate.left.wait(TIMEOUT)
    m = site.shedder.metrics()
    assert (m.admitted, m.shed_queue_full, m.in_flight, m.queue_len) == (1, 1, 0, 0)
    # the slot is free again: the next request runs
    assert httpx.get(site.url + "/echo", timeout=TIMEOUT).status_code == 200


def test_health_and_ready_paths_bypass_a_full_shedder(site: Any) -> None:
    t, _ = hold_the_slot(site)
    try:
        assert httpx.get(site.url + "/health", timeout=TIMEOUT).status_code == 200
        assert httpx.get(site.url + "/health/deep", timeout=TIMEOUT).status_code == 200
        # only the path and what is below it: /healthz is another path, and it is shed
        assert httpx.get(site.url + "/healthz", timeout=TIMEOUT).status_code == 503
    finally:
        site.gate.open.set()
        t.join(TIMEOUT)
    assert site.shedder.metrics().admitted == 1


def test_the_request_runs_under_the_callers_priority_and_deadline(site: Any) -> None:
    r = httpx.get(
        site.url + "/echo",
        headers={"x-priority": "sheddable-plus", "x-request-timeout": "2.5"},
        timeout=TIMEOUT,
    )
    assert r.status_code == 200
    body = r.json()
    assert body["priority"] == "SHEDDABLE_PLUS"
    assert 0.0 < body["remaining"] <= 2.5
    r = httpx.get(site.url + "/echo", headers={"x-priority": "0"}, timeout=TIMEOUT)
    assert r.json()["priority"] == "SHEDDABLE" and r.json()["remaining"] is None


def test_bad_hints_are_ignored_not_failed(site: Any) -> None:
    for headers in (
        {"x-priority": "urgent"},
        {"x-priority": "7"},
        {"x-request-timeout": "soon"},
        {"x-request-timeout": "-1"},
        {"x-request-timeout": "nan"},
    ):
        r = httpx.get(site.url + "/echo", headers=headers, timeout=TIMEOUT)
        assert r.status_code == 200, headers
        assert r.json()["priority"] == "CRITICAL" and r.json()["remaining"] is None


def test_a_request_whose_caller_has_no_time_left_is_shed_as_deadline(site: Any) -> None:
    r = httpx.get(site.url + "/echo", headers={"x-request-timeout": "0"}, timeout=TIMEOUT)
    assert r.status_code == 503
    assert r.headers["x-load-shed"] == "deadline"
    assert site.shedder.metrics().shed_deadline == 1


def test_the_httpx_transport_sends_priority_and_deadline_downstream(site: Any) -> None:
    client = httpx.Client(transport=BreakerTransport(), timeout=TIMEOUT)
    with client, fastbreaker.priority(fastbreaker.Priority.SHEDDABLE), fastbreaker.deadline(4.0):
        body = client.get(site.url + "/echo").json()
    assert body["priority"] == "SHEDDABLE"
    assert 0.0 < body["remaining"] <= 4.0
    assert 0.0 < float(body["headers"]["x-request-timeout"]) <= 4.0
    # nothing set: nothing sent, and the server sees its defaults
    with httpx.Client(transport=BreakerTransport(), timeout=TIMEOUT) as client:
        body = client.get(site.url + "/echo").json()
    assert body["headers"] == {} and body["priority"] == "CRITICAL"
    # a header the request sets itself is kept; None sends nothing
    transport = BreakerTransport(priority_header=None, deadline_header=None)
    with httpx.Client(transport=transport, timeout=TIMEOUT) as client:
        with fastbreaker.priority(fastbreaker.Priority.SHEDDABLE), fastbreaker.deadline(4.0):
            body = client.get(site.url + "/echo", headers={"x-priority": "CRITICAL_PLUS"}).json()
    assert body["headers"] == {"x-priority": "CRITICAL_PLUS"}
    assert body["priority"] == "CRITICAL_PLUS" and body["remaining"] is None


async def test_the_async_transport_sends_them_too(site: Any) -> None:
    async with httpx.AsyncClient(transport=AsyncBreakerTransport(), timeout=TIMEOUT) as client:
        with fastbreaker.priority("critical_plus"), fastbreaker.deadline(3.0):
            r = await client.get(site.url + "/echo")
    body = r.json()
    assert body["priority"] == "CRITICAL_PLUS"
    assert 0.0 < body["remaining"] <= 3.0


def test_bad_arguments_name_the_parameter(fb: types.SimpleNamespace) -> None:
    shedder = fb.LoadShedder(1)
    app = make_app(Gate())
    with pytest.raises(TypeError, match="app must be"):
        LoadSheddingMiddleware(42, shedder)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="shedder must"):
        LoadSheddingMiddleware(app, object())
    with pytest.raises(TypeError, match="priority_header"):
        LoadSheddingMiddleware(app, shedder, priority_header="")
    with pytest.raises(TypeError, match="deadline_header"):
        LoadSheddingMiddleware(app, shedder, deadline_header=None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="exempt"):
        LoadSheddingMiddleware(app, shedder, exempt="/health")
    with pytest.raises(ValueError, match="exempt"):
        LoadSheddingMiddleware(app, shedder, exempt=("health",))
    with pytest.raises(TypeError, match="priority_header"):
        BreakerTransport(priority_header=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="x-request-timeout"):
        parse_deadline("inf")


@pytest.mark.parametrize("name", ["x-prio€", "x-priö", "x prio", "x:prio", "x-pr\x00io", "(x)"])
def test_a_header_name_that_is_not_a_token_names_the_parameter(
    fb: types.SimpleNamespace, name: str
) -> None:
    shedder = fb.LoadShedder(1)
    app = make_app(Gate())
    with pytest.raises(ValueError, match="priority_header must be a header name of ASCII"):
        LoadSheddingMiddleware(app, shedder, priority_header=name)
    with pytest.raises(ValueError, match="deadline_header must be a header name of ASCII"):
        LoadSheddingMiddleware(app, shedder, deadline_header=name)
    with pytest.raises(ValueError, match="priority_header must be a header name of ASCII"):
        BreakerTransport(priority_header=name)


# -- RateLimitMiddleware: a fake clock, so the quota moves only when the test says --------------
class Counted:
    """An application that counts the requests it really serves."""

    def __init__(self) -> None:
        self.served = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.served += 1
        await PlainTextResponse("ok", headers={"x-app": "yes"})(scope, receive, send)


def cost(scope: Any) -> int:
    """The weight: the request's x-cost header, 1 without it."""
    return int(dict(scope["headers"]).get(b"x-cost", b"1"))


@pytest.fixture
def limited(fb: types.SimpleNamespace) -> Iterator[types.SimpleNamespace]:
    clock = fastbreaker.testing.FakeClock(10**12)
    limits = fb.RateLimiterMap("5/s", name="api", clock=clock)  # burst 5, T = 0.2 s
    app = Counted()
    with serve(RateLimitMiddleware(app, limits, weight=cost)) as url:
        yield types.SimpleNamespace(url=url, clock=clock, limits=limits, app=app)


def test_exactly_the_burst_is_admitted_then_429_with_headers(limited: Any) -> None:
    got = [httpx.get(limited.url + "/", timeout=TIMEOUT) for _ in range(8)]
    assert [r.status_code for r in got] == [200] * 5 + [429] * 3
    assert limited.app.served == 5  # a refused request never reaches the application
    for i, r in enumerate(got[:5]):
        assert r.text == "ok" and r.headers["x-app"] == "yes"
        assert r.headers["ratelimit-policy"] == '"api";q=5;w=1'
        assert r.headers["ratelimit"] == f'"api";r={4 - i};t=1'
    for r in got[5:]:
        assert r.headers["retry-after"] == "1"  # 0.2 s, rounded up to whole seconds
        assert r.headers["ratelimit-policy"] == '"api";q=5;w=1'
        assert r.headers["ratelimit"] == '"api";r=0;t=1'
        assert "rate limited" in r.text and "x-app" not in r.headers
    m = limited.limits.metrics()
    assert (m.keys, m.admitted, m.rejected) == (1, 5, 3)
    limited.clock.advance(0.4)  # two units back
    codes = [httpx.get(limited.url + "/", timeout=TIMEOUT).status_code for _ in range(3)]
    assert codes == [200, 200, 429]
    limited.clock.advance(60)  # idle: the whole burst again
    r = httpx.get(limited.url + "/", timeout=TIMEOUT)
    assert r.status_code == 200 and r.headers["ratelimit"] == '"api";r=4;t=1'


def test_a_second_client_address_has_its_own_quota(limited: Any) -> None:
    for _ in range(5):
        assert httpx.get(limited.url + "/", timeout=TIMEOUT).status_code == 200
    assert httpx.get(limited.url + "/", timeout=TIMEOUT).status_code == 429
    other = httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2"), timeout=TIMEOUT)
    with other:
        r = other.get(limited.url + "/")
    assert r.status_code == 200 and r.headers["ratelimit"] == '"api";r=4;t=1'
    assert "127.0.0.2" in limited.limits and "127.0.0.1" in limited.limits
    assert len(limited.limits) == 2


def test_the_weight_callable_is_honoured(limited: Any) -> None:
    r = httpx.get(limited.url + "/", headers={"x-cost": "3"}, timeout=TIMEOUT)
    assert r.status_code == 200 and r.headers["ratelimit"] == '"api";r=2;t=1'
    r = httpx.get(limited.url + "/", headers={"x-cost": "3"}, timeout=TIMEOUT)
    assert r.status_code == 429  # 2 left: 3 do not pass, and nothing is charged
    assert r.headers["retry-after"] == "1" and r.headers["ratelimit"] == '"api";r=2;t=1'
    assert limited.limits.retry_after("127.0.0.1", 3) == pytest.approx(0.2)
    r = httpx.get(limited.url + "/", headers={"x-cost": "2"}, timeout=TIMEOUT)
    assert r.status_code == 200 and r.headers["ratelimit"] == '"api";r=0;t=1'
    limited.clock.advance(3.0)
    r = httpx.get(limited.url + "/", headers={"x-cost": "5"}, timeout=TIMEOUT)
    assert r.headers["ratelimit"] == '"api";r=0;t=1'
    assert limited.app.served == 3


async def asgi(app: Any, scope: dict[str, Any]) -> list[dict[str, Any]]:
    """Run one ASGI call in process and return what it sent."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: Any) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent


def http(client: Any = ("10.0.0.1", 5000)) -> dict[str, Any]:
    return {"type": "http", "method": "GET", "path": "/", "headers": [], "client": client}


@pytest.mark.parametrize(
    ("rates", "policy", "limit"),
    [(("3/250ms",), '"p";q=12;w=1', '"p";r=2;t=1'),
     (("1/h",), '"p";q=1;w=3600', '"p";r=0;t=3600'),
     (("600/min", "10/s"), '"p-0";q=600;w=60, "p-1";q=10;w=1', '"p-1";r=9;t=1')],
)  # fmt: skip
async def test_policy_and_ratelimit_headers(
    fb: types.SimpleNamespace, rates: tuple[str, ...], policy: str, limit: str
) -> None:
    clock = fastbreaker.testing.FakeClock(10**12)
    mw = RateLimitMiddleware(Counted(), fb.RateLimiterMap(*rates, name="p", clock=clock))
    headers = dict((await asgi(mw, http()))[0]["headers"])
    assert headers[b"ratelimit-policy"] == policy.encode()
    assert headers[b"ratelimit"] == limit.encode()


async def test_a_rate_slower_than_one_a_second_and_odd_names(fb: types.SimpleNamespace) -> None:
    clock = fastbreaker.testing.FakeClock(10**12)
    limits = fb.RateLimiterMap(fb.Rate(0.5, 1, burst=1), name='a "b"\\c', clock=clock)
    headers = dict((await asgi(RateLimitMiddleware(Counted(), limits), http()))[0]["headers"])
    assert headers[b"ratelimit-policy"] == b'"a \\"b\\"\\\\c";q=1;w=2'
    default = RateLimitMiddleware(Counted(), fb.RateLimiterMap("2/s", clock=clock))
    headers = dict((await asgi(default, http()))[0]["headers"])
    assert headers[b"ratelimit"] == b'"default";r=1;t=1'


async def test_other_scopes_pass_through_and_no_client_is_one_key(
    fb: types.SimpleNamespace,
) -> None:
    clock = fastbreaker.testing.FakeClock(10**12)
    limits = fb.RateLimiterMap("1/s", clock=clock)
    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["type"])

    mw = RateLimitMiddleware(app, limits)
    for kind in ("lifespan", "websocket", "lifespan"):
        assert await asgi(mw, {"type": kind}) == []
    assert seen == ["lifespan", "websocket", "lifespan"]
    assert limits.metrics().admitted == 0 and len(limits) == 0
    await asgi(mw, http(client=None))  # a Unix socket: no address
    sent = await asgi(mw, http(client=None))
    assert sent[0]["status"] == 429 and None in limits
    assert seen[-1] == "http" and len(seen) == 4


def test_rate_limit_bad_arguments_name_the_parameter(fb: types.SimpleNamespace) -> None:
    limits = fb.RateLimiterMap("1/s")
    app = Counted()
    with pytest.raises(TypeError, match="app must be"):
        RateLimitMiddleware(42, limits)  # type: ignore[arg-type]
    for bad in (object(), fb.RateLimiter("1/s"), None):
        with pytest.raises(TypeError, match="limiter_map must be a fastbreaker.RateLimiterMap"):
            RateLimitMiddleware(app, bad)
    with pytest.raises(TypeError, match="key must be a callable"):
        RateLimitMiddleware(app, limits, key="client")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="weight must be a callable"):
        RateLimitMiddleware(app, limits, weight=2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="limiter_map.name must be printable ASCII"):
        RateLimitMiddleware(app, fb.RateLimiterMap("1/s", name="api€"))


async def test_the_rate_limited_path_keeps_memory_flat(fb: types.SimpleNamespace) -> None:
    # Many clients through a small map, admitted and refused: the middleware keeps nothing per
    # request, and the map never holds more than max_keys keys.
    clock = fastbreaker.testing.FakeClock(10**12)
    limits = fb.RateLimiterMap("2/s", max_keys=50, clock=clock)
    mw = RateLimitMiddleware(Counted(), limits)

    async def burst(start: int, n: int) -> None:
        for i in range(start, start + n):
            client = (f"10.0.{i % 200 // 100}.{i % 100}", 1)
            for _ in range(3):  # a burst of 2: the third is refused
                await asgi(mw, http(client=client))
            clock.advance(0.001)

    await burst(0, 300)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        await burst(300, 1000)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(limits) <= 50
    m = limits.metrics()
    assert m.admitted > 0 and m.rejected > 0 and m.evicted > 0
    assert grown < 20_000, grown
