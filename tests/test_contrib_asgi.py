"""fastbreaker.contrib.asgi.LoadSheddingMiddleware served by a real uvicorn on 127.0.0.1 and
called by a real httpx client, on both cores (the shedder's slots come from fb.Bulkhead).

The application's /work route holds its slot until the test opens a gate, so the test knows
exactly when the shedder is full; nothing waits on a timer.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
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
from fastbreaker.contrib.asgi import LoadSheddingMiddleware, parse_deadline  # noqa: E402
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
