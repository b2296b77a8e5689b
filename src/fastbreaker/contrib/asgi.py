"""Load shedding for an ASGI application: refuse what the service cannot finish, and say so.

    from fastbreaker.contrib.asgi import LoadSheddingMiddleware

    shedder = fastbreaker.LoadShedder(64, max_queue=256)
    app = LoadSheddingMiddleware(app, shedder)

Every HTTP request outside ``exempt`` goes through ``async with shedder:``. A request the shedder
refuses gets ``503 Service Unavailable`` with ``Retry-After`` (the shedder's hint, in whole
seconds, rounded up) and never reaches the application. The request runs under the caller's
priority and deadline, read from two headers:

* ``x-priority``: a ``fastbreaker.Priority`` name (``SHEDDABLE``, ``critical-plus``, any case)
  or its integer value (0..3);
* ``x-request-timeout``: the seconds the caller has left, as a decimal number (``0.250``).

So the shedder drops the least important requests first and never starts one whose caller has
already given up, and the code under the request sees ``fastbreaker.current_priority()`` and
``fastbreaker.current_deadline()``. ``fastbreaker.contrib.httpx``'s transports send both headers
downstream, so priority and deadline travel along the call chain. A header that does not parse is
ignored (logged at DEBUG on the ``fastbreaker`` logger): a client cannot make a request fail by
sending a bad hint, only lose the hint.

Health and readiness paths (``exempt``, by default ``/health`` and ``/ready``, each matching the
path itself and anything below it) bypass the shedder: a health check that sheds turns a partial
outage into a full one, as the orchestrator then restarts a service that is merely busy.

``RateLimitMiddleware(app, limiter_map)`` admits each HTTP request through a
``fastbreaker.RateLimiterMap`` keyed by the client's address: a refusal is ``429 Too Many
Requests`` with ``Retry-After`` and the IETF ``RateLimit-Policy`` / ``RateLimit`` headers.

Both middlewares are plain ASGI 3 (no framework needed); lifespan and websocket scopes pass
through. Starlette, uvicorn and anyio are in the ``asgi`` extra, for serving and testing.
"""

from __future__ import annotations

import math
import re
from collections.abc import Awaitable, Callable, Collection, Hashable, Iterable, MutableMapping
from fractions import Fraction
from typing import Any, Optional

from .._calls import logger
from .._deadline import deadline
from .._errors import LoadShedError
from .._priority import Priority, priority

__all__ = [
    "LoadSheddingMiddleware",
    "RateLimitMiddleware",
    "client_address",
    "parse_deadline",
    "parse_priority",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: The deadline a header may carry at most (seconds): a larger one is not a hint, it is a typo.
MAX_DEADLINE_SECONDS = 86_400.0


def parse_priority(value: str) -> Priority:
    """The ``Priority`` that ``value``, an ``x-priority`` header, names: a name or 0..3
    (``ValueError`` if it names none)."""
    return Priority.parse(value)


def parse_deadline(value: str) -> float:
    """The seconds that ``value``, an ``x-request-timeout`` header, holds: a finite decimal
    number >= 0 and at most ``MAX_DEADLINE_SECONDS`` (``ValueError`` otherwise)."""
    seconds = float(value.strip())
    if not (0.0 <= seconds <= MAX_DEADLINE_SECONDS):
        raise ValueError(
            f"x-request-timeout must be in [0, {MAX_DEADLINE_SECONDS:g}], got {value!r}"
        )
    return seconds


# A header name is an RFC 9110 token: ASCII letters, digits and these marks.
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", re.ASCII)


def _header_name(value: object, param: str) -> bytes:
    if not isinstance(value, str) or not value or value != value.strip():
        raise TypeError(f"{param} must be a non-empty header name (str), got {value!r}")
    if not _TOKEN.fullmatch(value):
        raise ValueError(
            f"{param} must be a header name of ASCII letters, digits and "
            f"!#$%&'*+-.^_`|~ only, got {value!r}"
        )
    return value.lower().encode("ascii")


def _exempt_paths(exempt: object) -> tuple[str, ...]:
    if isinstance(exempt, str) or not isinstance(exempt, Iterable):
        raise TypeError(f"exempt must be a collection of paths, got {exempt!r}")
    paths = tuple(exempt)
    for p in paths:
        if not isinstance(p, str) or not p.startswith("/"):
            raise ValueError(f"exempt paths must be str starting with '/', got {p!r}")
    return tuple(p.rstrip("/") or "/" for p in paths)


class LoadSheddingMiddleware:
    """ASGI middleware that admits each HTTP request through ``shedder`` (see the module).

    Args:
        app: the ASGI 3 application to protect.
        shedder: a ``fastbreaker.LoadShedder`` (anything with ``async with`` that raises
            ``fastbreaker.LoadShedError`` works).
        priority_header: the request header holding the caller's priority.
        deadline_header: the request header holding the caller's remaining seconds.
        exempt: paths that bypass the shedder (each with everything below it).
    """

    def __init__(
        self,
        app: ASGIApp,
        shedder: Any,
        *,
        priority_header: str = "x-priority",
        deadline_header: str = "x-request-timeout",
        exempt: Collection[str] = ("/health", "/ready"),
    ) -> None:
        if not callable(app):
            raise TypeError(f"app must be an ASGI application (callable), got {app!r}")
        if not (hasattr(shedder, "__aenter__") and hasattr(shedder, "__aexit__")):
            raise TypeError(f"shedder must support `async with` (a LoadShedder), got {shedder!r}")
        self.app = app
        self.shedder = shedder
        self._priority_header = _header_name(priority_header, "priority_header")
        self._deadline_header = _header_name(deadline_header, "deadline_header")
        self.exempt = _exempt_paths(exempt)

    def _is_exempt(self, path: str) -> bool:
        return any(path == p or path.startswith(p + "/") or p == "/" for p in self.exempt)

    def _hints(self, scope: Scope) -> tuple[Optional[Priority], Optional[float]]:
        prio: Optional[Priority] = None
        seconds: Optional[float] = None
        for name, value in scope.get("headers") or ():
            name = bytes(name).lower()
            if name == self._priority_header:
                text = bytes(value).decode("latin-1")
                try:
                    prio = parse_priority(text)
                except (TypeError, ValueError) as exc:
                    logger.debug("ignoring a bad %s header %r: %s", name.decode(), text, exc)
            elif name == self._deadline_header:
                text = bytes(value).decode("latin-1")
                try:
                    seconds = parse_deadline(text)
                except ValueError as exc:
                    logger.debug("ignoring a bad %s header %r: %s", name.decode(), text, exc)
        return prio, seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI entry point: serve one connection (``scope``, ``receive``, ``send``); HTTP
        requests outside the exempt paths run under the shedder, anything else goes straight
        to the app."""
        if scope.get("type") != "http" or self._is_exempt(scope.get("path") or "/"):
            await self.app(scope, receive, send)
            return
        prio, seconds = self._hints(scope)
        if prio is not None and seconds is not None:
            with priority(prio), deadline(seconds):
                await self._admit(scope, receive, send)
        elif prio is not None:
            with priority(prio):
                await self._admit(scope, receive, send)
        elif seconds is not None:
            with deadline(seconds):
                await self._admit(scope, receive, send)
        else:
            await self._admit(scope, receive, send)

    async def _admit(self, scope: Scope, receive: Receive, send: Send) -> None:
        entered = False
        try:
            async with self.shedder:
                entered = True
                await self.app(scope, receive, send)
        except LoadShedError as exc:
            if entered:
                raise  # raised by the application (a shedder further in): not this refusal
            await _refuse(send, exc)


async def _refuse(send: Send, exc: LoadShedError) -> None:
    retry_after = exc.retry_after
    seconds = max(1, math.ceil(retry_after)) if math.isfinite(retry_after) else 1
    text = f"503 Service Unavailable: load shed ({exc.reason})\n"
    await _refusal(send, 503, text, seconds, [(b"x-load-shed", exc.reason.encode())])


async def _refusal(
    send: Send, status: int, text: str, retry_after: int, extra: list[tuple[bytes, bytes]]
) -> None:
    """Send a plain-text refusal with ``Retry-After`` (whole seconds) and ``extra`` headers."""
    body = text.encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                (b"retry-after", str(retry_after).encode()),
                *extra,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


# -- rate limits ---------------------------------------------------------------------------------
def client_address(scope: Scope) -> Hashable:
    """``RateLimitMiddleware``'s default key: the client's address (``scope["client"][0]``),
    or None when the server gives none (a Unix socket): such requests share one key."""
    client = scope.get("client")
    return client[0] if client else None


def _one(scope: Scope) -> int:
    return 1


def _sf_string(text: str, param: str) -> str:
    # An RFC 8941 String: printable ASCII, with backslash and double quote escaped.
    if not all(" " <= ch <= "~" for ch in text):
        raise ValueError(
            f"{param} must be printable ASCII to name a RateLimit policy, got {text!r}"
        )
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _quota(rate: Any) -> tuple[int, int]:
    """``(q, w)`` for ``RateLimit-Policy``: ``rate`` as whole units per whole seconds."""
    per_second = Fraction(rate.limit) / Fraction(round(rate.per * 1e9), 10**9)
    window = max(1, math.ceil(rate.per))
    if per_second * window < 1:  # slower than 1 unit a second: the window one unit takes
        window = math.ceil(1 / per_second)
    return math.floor(per_second * window), window


class RateLimitMiddleware:
    """ASGI middleware that admits each HTTP request through ``limiter_map``, a
    ``fastbreaker.RateLimiterMap``: ``limiter_map.try_acquire(key(scope), weight(scope))``.

    A refused request never reaches the application: it gets ``429 Too Many Requests`` with
    ``Retry-After`` (whole seconds, rounded up, at least 1) and the ``RateLimit-Policy`` and
    ``RateLimit`` headers of draft-ietf-httpapi-ratelimit-headers-10 (structured fields:
    ``RateLimit-Policy: "default";q=100;w=60`` for each rate, ``RateLimit: "default";r=0;t=5``,
    ``r`` the units the key may spend now, ``t`` the whole seconds until its quota is full
    again). Admitted responses carry both headers too (the state right after the admission),
    so a client can slow down before it is refused. The policies are named after the map
    (``name``, else ``"default"``; ``"name-0"``, ``"name-1"``, ... with several rates, and
    ``RateLimit`` then reports what all the rates together allow under the name of the one
    with the smallest burst). Lifespan and websocket scopes pass through.

    Args:
        app: the ASGI 3 application to protect.
        limiter_map: a ``fastbreaker.RateLimiterMap``.
        key: ``key(scope)`` -> the hashable key to limit by; default the client's address
            (``client_address``).
        weight: ``weight(scope)`` -> the units the request costs (an int in [1, the smallest
            burst]; anything else is the map's ``TypeError``/``ValueError``); default 1.
    """

    def __init__(
        self,
        app: ASGIApp,
        limiter_map: Any,
        *,
        key: Optional[Callable[[Scope], Hashable]] = None,
        weight: Optional[Callable[[Scope], int]] = None,
    ) -> None:
        if not callable(app):
            raise TypeError(f"app must be an ASGI application (callable), got {app!r}")
        if not all(
            callable(getattr(limiter_map, m, None)) for m in ("try_acquire", "retry_after")
        ) or not isinstance(getattr(limiter_map, "max_keys", None), int):
            raise TypeError(
                f"limiter_map must be a fastbreaker.RateLimiterMap, got {limiter_map!r}"
            )
        if key is not None and not callable(key):
            raise TypeError(f"key must be a callable(scope) -> hashable or None, got {key!r}")
        if weight is not None and not callable(weight):
            raise TypeError(f"weight must be a callable(scope) -> int or None, got {weight!r}")
        self.app = app
        self.limiter_map = limiter_map
        self.key = key or client_address
        self.weight = weight or _one
        rates = tuple(limiter_map.rates)
        base = limiter_map.name or "default"
        names = [base] if len(rates) == 1 else [f"{base}-{i}" for i in range(len(rates))]
        ids = [_sf_string(n, "limiter_map.name") for n in names]
        policies = []
        for sf_id, rate in zip(ids, rates):
            q, w = _quota(rate)
            policies.append(f"{sf_id};q={q};w={w}")
        self._policy = ", ".join(policies).encode("ascii")
        # the most units one request may take: the smallest burst
        bursts = [r.tolerance_ns // r.interval_ns for r in rates]
        self._max_units = min(bursts)
        self._id = ids[bursts.index(self._max_units)]

    def _state(self, key: Hashable) -> tuple[int, float]:
        """``(r, t)``: the units ``key`` may spend now (a binary search over ``retry_after``,
        which is monotonic in the weight) and the seconds until its quota is full."""
        retry_after = self.limiter_map.retry_after
        lo, hi = 0, self._max_units
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if retry_after(key, mid) > 0.0:
                hi = mid - 1
            else:
                lo = mid
        return lo, retry_after(key, self._max_units)

    def _headers(self, key: Hashable) -> list[tuple[bytes, bytes]]:
        r, t = self._state(key)
        value = f"{self._id};r={r};t={math.ceil(t)}".encode("ascii")
        return [(b"ratelimit-policy", self._policy), (b"ratelimit", value)]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI entry point: serve one connection (``scope``, ``receive``, ``send``); an
        HTTP request is admitted by the map or refused with 429, anything else goes straight
        to the app."""
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        key = self.key(scope)
        weight = self.weight(scope)
        if not self.limiter_map.try_acquire(key, weight):
            wait = self.limiter_map.retry_after(key, weight)
            await _refusal(
                send,
                429,
                "429 Too Many Requests: rate limited\n",
                max(1, math.ceil(wait)),
                self._headers(key),
            )
            return
        extra = self._headers(key)

        async def send_with_headers(message: Message) -> None:
            if message.get("type") == "http.response.start":
                message = dict(message)
                message["headers"] = [*message.get("headers", ()), *extra]
            await send(message)

        await self.app(scope, receive, send_with_headers)
