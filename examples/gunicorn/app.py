"""A tiny WSGI app whose gunicorn workers share one circuit breaker per upstream host.

The breakers live in a ``fastbreaker.SharedRegion`` (a named POSIX shared-memory segment) that
the gunicorn master creates in ``on_starting`` and unlinks in ``on_exit`` (see gunicorn.conf.py).
Every worker asks the region for ``upstream:<host>`` and gets a ``CircuitBreaker`` whose state
is the host's: five failures in total, in whichever workers, open it for all of them.

Environment:

``UPSTREAM``
    the base URL of the upstream, e.g. ``http://127.0.0.1:8081`` (``/fetch`` GETs it).
``UPSTREAM_HOSTS``
    optional, comma-separated ``host[:port]`` that ``/fetch?host=`` may name besides UPSTREAM's
    own (same scheme and path as UPSTREAM). Only these: a region holds at most 255 objects and
    never frees one, so the breaker names must not come from clients (nor should an open proxy).
``FB_REGION``
    the region's name (the same as in gunicorn.conf.py).

Routes:

``GET /fetch[?host=H]``
    GET the upstream through the host's breaker: 200 with its body, 502 when it fails (HTTP
    error, refused connection, timeout), 503 with ``Retry-After`` when the breaker rejects.
``GET /metrics[?host=H]``
    the breaker's counters as JSON: the region's, summed over every worker.

Every response carries ``X-Worker-Pid`` and ``X-Breaker-State``.
"""

from __future__ import annotations

import json
import math
import os
import threading
import urllib.request
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

import fastbreaker

UPSTREAM = os.environ.get("UPSTREAM", "http://127.0.0.1:8081")
REGION_NAME = os.environ.get("FB_REGION", "fastbreaker-gunicorn-example")
FAILURE_THRESHOLD = 5
RESET_TIMEOUT = 60.0
# A probe cannot take longer than UPSTREAM_TIMEOUT: one still out after 5 s was lost (its worker
# died) and counts as failed, instead of holding the probe for reset_timeout (the default).
PROBE_TIMEOUT = 5.0
UPSTREAM_TIMEOUT = 2.0

_upstream = urlsplit(UPSTREAM)
DEFAULT_HOST = _upstream.netloc
ALLOWED_HOSTS = {DEFAULT_HOST} | {
    h.strip() for h in os.environ.get("UPSTREAM_HOSTS", "").split(",") if h.strip()
}

StartResponse = Callable[..., Any]

# Per process: the region and this worker's handle on each host's breaker. Nothing is opened at
# import time, so that the app also works with preload_app = True, where gunicorn imports it in
# the master before on_starting has created the region.
# (fastbreaker.SharedRegion is the class of the core in use, assigned at import: type checkers
# do not take it as an annotation, hence Any.)
_region: Any = None
_breakers: dict[str, fastbreaker.CircuitBreaker] = {}
_lock = threading.Lock()  # for threaded workers (gthread): one attach, one breaker per host


def _get_region() -> Any:
    global _region
    if _region is None:
        try:
            # create=False: the gunicorn master owns the segment (on_starting makes it, on_exit
            # unlinks it). A worker that created it would leave a segment no one unlinks.
            _region = fastbreaker.SharedRegion(REGION_NAME, create=False)
        except FileNotFoundError:
            raise RuntimeError(
                f"no shared region {REGION_NAME!r}: run gunicorn with -c gunicorn.conf.py, "
                "whose on_starting hook creates it"
            ) from None
    return _region


def breaker_for(host: str) -> fastbreaker.CircuitBreaker:
    """This process's handle on the host's breaker (its state is the region's)."""
    breaker = _breakers.get(host)
    if breaker is None:
        with _lock:
            breaker = _breakers.get(host)
            if breaker is None:
                breaker = _get_region().breaker(
                    f"upstream:{host}",
                    failure_threshold=FAILURE_THRESHOLD,
                    reset_timeout=RESET_TIMEOUT,
                    probe_timeout=PROBE_TIMEOUT,
                )
                _breakers[host] = breaker
    return breaker


def _fetch(url: str) -> tuple[str, bytes]:
    # urlopen raises HTTPError for 4xx/5xx and URLError (or TimeoutError) when the connection
    # fails; the body is read inside the breaker, so a connection dropped mid-body fails too.
    with urllib.request.urlopen(url, timeout=UPSTREAM_TIMEOUT) as resp:
        body: bytes = resp.read()
        return resp.headers.get("Content-Type", "application/octet-stream"), body


def _respond(
    start_response: StartResponse,
    status: str,
    body: bytes,
    breaker: fastbreaker.CircuitBreaker,
    content_type: str = "text/plain; charset=utf-8",
    extra: Iterable[tuple[str, str]] = (),
) -> list[bytes]:
    headers = [
        ("Content-Type", content_type),
        ("Content-Length", str(len(body))),
        ("X-Worker-Pid", str(os.getpid())),
        ("X-Breaker-State", breaker.state.name),
        *extra,
    ]
    start_response(status, headers)
    return [body]


def app(environ: dict[str, Any], start_response: StartResponse) -> list[bytes]:
    path = environ.get("PATH_INFO", "/")
    query = parse_qs(environ.get("QUERY_STRING", ""))
    host = query.get("host", [DEFAULT_HOST])[0]
    if host not in ALLOWED_HOSTS:
        msg = f"unknown host {host!r}: allowed are {sorted(ALLOWED_HOSTS)}\n".encode()
        return _respond(start_response, "400 Bad Request", msg, breaker_for(DEFAULT_HOST))
    breaker = breaker_for(host)
    method = environ.get("REQUEST_METHOD", "GET")
    if method != "GET" and path in ("/fetch", "/metrics"):
        return _respond(
            start_response,
            "405 Method Not Allowed",
            b"GET only\n",
            breaker,
            extra=[("Allow", "GET")],
        )

    if path == "/fetch":
        url = urlunsplit((_upstream.scheme, host, _upstream.path or "/", "", ""))
        try:
            content_type, body = breaker.call(_fetch, url)
        except fastbreaker.CircuitOpenError as exc:
            wait = exc.retry_after
            retry_after = max(1, math.ceil(wait)) if math.isfinite(wait) else int(RESET_TIMEOUT)
            msg = f"circuit for {host} is {exc.state.name}: retry in {retry_after} s\n".encode()
            return _respond(
                start_response,
                "503 Service Unavailable",
                msg,
                breaker,
                extra=[("Retry-After", str(retry_after))],
            )
        except Exception as exc:
            # Whatever the call raised (urllib's HTTPError for a 4xx/5xx, URLError for a refused
            # connection, TimeoutError, a malformed response): the breaker counted a failure.
            return _respond(
                start_response,
                "502 Bad Gateway",
                f"upstream {host} failed: {exc}\n".encode(),
                breaker,
            )
        return _respond(start_response, "200 OK", body, breaker, content_type)

    if path == "/metrics":
        m = breaker.metrics()
        doc = {
            "breaker": breaker.name,
            "state": m.state.name,
            "permitted": m.permitted,
            "rejected": m.rejected,
            "failures": m.failures,
            "successes": m.successes,
            "opened": m.opened,
            "consecutive_failures": m.consecutive_failures,
        }
        body = (json.dumps(doc) + "\n").encode()
        return _respond(start_response, "200 OK", body, breaker, "application/json")

    return _respond(start_response, "404 Not Found", b"try /fetch or /metrics\n", breaker)
