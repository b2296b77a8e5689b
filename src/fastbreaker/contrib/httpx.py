"""Per-host circuit breakers, with optional budgeted retries, as an httpx transport.

``BreakerTransport`` (sync) and ``AsyncBreakerTransport`` wrap any httpx transport. Each request
goes through the breaker of its key, by default its ``Origin`` (scheme, host, port), held in a
``fastbreaker.BreakerMap``; a request whose breaker rejects it raises
``CircuitOpenTransportError`` (both a ``fastbreaker.CircuitOpenError`` and an
``httpx.TransportError``) without touching the network::

    import httpx
    import fastbreaker as fb
    from fastbreaker.contrib.httpx import BreakerTransport, Retry

    transport = BreakerTransport(
        httpx.HTTPTransport(),
        breakers=fb.BreakerMap(failure_threshold=5, reset_timeout=30.0, max_keys=10_000),
        retry=Retry(attempts=3, budget=fb.RetryBudget(ratio=0.1)),
    )
    with httpx.Client(transport=transport, timeout=httpx.Timeout(2.0, connect=0.5)) as client:
        with fb.deadline(5.0):
            client.get("https://api.example.com/items")

One request, outside in: the current ``fastbreaker.deadline()`` (or ``Retry(deadline=...)``);
the key's breaker, which sees one outcome per request; the retries with their budget; the inner
transport, with httpx's timeouts cut to the time left before the deadline.

Outcomes (``default_is_failure``; replace it with ``is_failure``): connection errors, timeouts,
remote protocol and proxy errors, and responses 5xx and 429 are failures; every other response
(4xx included) is a success; any other exception is neutral (it releases a half-open probe and
counts as ``ignored``): the host neither answered nor failed. A failure response is reported at
once. A success is reported when its body has been read or the response closed, so that an error
while reading the body (a read timeout after the headers) is still a failure and slow-call
detection times the whole body; a streamed response that is never closed keeps its permit until
``probe_timeout`` reclaims it (httpx requires closing streamed responses anyway).

This module imports httpx; ``import fastbreaker`` does not import this module.
"""

from __future__ import annotations

import datetime
import email.utils
import math
import re
from collections.abc import AsyncIterator, Callable, Collection, Hashable, Iterator
from typing import Any, NamedTuple, Optional, Union, cast

try:
    import httpx
except ImportError as exc:  # pragma: no cover - tested in a subprocess
    raise ImportError(
        "fastbreaker.contrib.httpx needs httpx, which is not installed: "
        "pip install 'fastbreaker[httpx]'"
    ) from exc

try:
    from anyio import sleep as _async_sleep  # httpx depends on anyio: works under trio too
except ImportError:  # pragma: no cover
    from asyncio import sleep as _async_sleep

import fastbreaker

from .. import _retry
from .._calls import logger
from .._deadline import Deadline, current_deadline
from .._durations import Seconds, seconds_to_ns
from .._errors import CircuitOpenError, DeadlineExceeded, State
from .._options import OUT_FAILURE, OUT_NEUTRAL
from .._permit import is_breaker, permits, start_ns, timed_outcome
from .._priority import current_var as priority_var

__all__ = [
    "AsyncBreakerTransport",
    "BreakerTransport",
    "CircuitOpenTransportError",
    "IDEMPOTENT_METHODS",
    "Origin",
    "RETRY_STATUSES",
    "Retry",
    "default_is_failure",
    "origin",
]

# A header name is an RFC 9110 token: ASCII letters, digits and these marks.
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", re.ASCII)

Outcome = Union[httpx.Response, Exception]
"""What ``is_failure`` and ``on_retry`` receive: a response (body not read yet) or an error."""

Breakers = Union["fastbreaker.BreakerMap", "fastbreaker.CircuitBreaker"]

IDEMPOTENT_METHODS: frozenset[str] = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})
"""The methods ``Retry`` retries by default."""

RETRY_STATUSES: frozenset[int] = frozenset({429, 502, 503, 504})
"""The response statuses ``Retry`` retries by default (500 and 501 are rarely transient)."""

_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}
_FAILURE_ERRORS = (
    httpx.TimeoutException,
    httpx.NetworkError,
    httpx.RemoteProtocolError,
    httpx.ProxyError,
)


def default_is_failure(outcome: Outcome) -> bool:
    """The default classification of an ``outcome`` (a response or an exception): 5xx and 429
    responses, connection errors and timeouts fail.

    Failing errors are ``httpx.TimeoutException``, ``httpx.NetworkError`` (connect, read, write,
    close), ``httpx.RemoteProtocolError`` and ``httpx.ProxyError``. Any other response is a
    success (4xx: the host answered); any other exception is not a failure.
    """
    if isinstance(outcome, httpx.Response):
        return outcome.status_code >= 500 or outcome.status_code == 429
    return isinstance(outcome, _FAILURE_ERRORS) and not isinstance(outcome, CircuitOpenError)


Bulkheads = Union["fastbreaker.Bulkhead", "fastbreaker.AdaptiveLimiter", Callable[["Origin"], Any]]
"""What ``bulkhead=`` accepts: one ``Bulkhead``/``AdaptiveLimiter`` shared by every origin, or a
callable ``origin -> Bulkhead`` (one per host: keep them in a dict of your own)."""


def _bulkhead_lookup(bulkhead: object) -> Callable[[httpx.Request], Any]:
    if bulkhead is None:
        return lambda _request: None
    if callable(getattr(bulkhead, "_try_admit", None)):  # a Bulkhead or AdaptiveLimiter
        return lambda _request: bulkhead
    if callable(bulkhead):
        per_origin = bulkhead
        return lambda request: per_origin(Origin.of(request.url))
    raise TypeError(
        f"bulkhead must be a fastbreaker.Bulkhead or AdaptiveLimiter, or a callable "
        f"origin -> Bulkhead, got {bulkhead!r}"
    )


class Origin(NamedTuple):
    """The default breaker key: ``(scheme, host, port)``, shown as ``scheme://host:port``.

    It is a tuple (``("https", "api.example.com", 443)`` finds the same breaker) whose ``str``
    is the breaker's ``name`` and the ``key`` label in Prometheus.
    """

    scheme: str
    host: str
    port: Optional[int]

    @classmethod
    def of(cls, url: Union[httpx.URL, str]) -> "Origin":
        """The origin of ``url`` (an ``httpx.URL`` or a str; default ports made explicit).

        ``Origin.of("https://a.example/x") == ("https", "a.example", 443)``
        """
        url = httpx.URL(url)
        return cls(url.scheme, url.host, url.port or _DEFAULT_PORTS.get(url.scheme))

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}" + ("" if self.port is None else f":{self.port}")


def origin(request: httpx.Request) -> Origin:
    """The default ``key``: the request's ``Origin`` (default ports made explicit)."""
    return Origin.of(request.url)


class _TransportErrorBase(Exception):
    """Ends the ``__init__`` chain of ``CircuitOpenTransportError`` before httpx's classes.

    ``CircuitOpenError.__init__`` passes its arguments up the MRO, where httpx's
    ``RequestError(message, *, request)`` would not accept them; this class takes them as the
    exception's ``args`` and sets what ``httpx.HTTPError`` expects.
    """

    def __init__(self, *args: object) -> None:
        Exception.__init__(self, *args)
        self._request: Optional[httpx.Request] = None


class CircuitOpenTransportError(CircuitOpenError, _TransportErrorBase, httpx.TransportError):
    """A request rejected by its breaker: nothing was sent.

    A ``fastbreaker.CircuitOpenError`` (``name``, ``state``, ``retry_after``) that is also an
    ``httpx.TransportError``, so that code catching ``httpx.HTTPError`` keeps working; ``request``
    is the rejected request and ``key`` the breaker's key.
    """

    def __init__(self, name: Optional[str], state: State, retry_after: float) -> None:
        super().__init__(name, state, retry_after)
        self.key: Optional[Hashable] = None


class Retry:
    """The retry policy of a breaker transport: full-jitter backoff under a retry budget.

    ``attempts`` counts every try, the first included. Only requests whose method is in
    ``methods`` (idempotent ones by default) and whose body is in memory (a streamed body cannot
    be replayed) are retried, and only after a failure: an error that ``is_failure`` counts as a
    failure (a connection error, a timeout) or a response whose status is in ``statuses``. A
    rejected request (``CircuitOpenError``) is never retried.

    Before retry ``n`` (``n = 0`` first) the transport waits uniformly in
    ``[0, min(cap, base * 2**n)]`` seconds, or the response's ``Retry-After`` (seconds or an HTTP
    date) when it has one. Each retry must then pass, in order, the deadline (the current
    ``fastbreaker.deadline()`` and ``deadline``, seconds per request, the earlier winning: the
    wait must end before it), and take a token from ``budget`` (by default a new
    ``fastbreaker.RetryBudget()`` owned by this policy; every request that ends in a success
    deposits into it). When a retry is refused the last outcome stands: the last response is
    returned, or the last error raised (``fastbreaker.DeadlineExceeded`` chained from it when the
    deadline refused). A ``Retry-After`` longer than ``max_retry_after`` seconds ends the retries
    too. A response that is retried is closed first. ``on_retry(attempt, outcome, delay)`` runs
    before each wait.

    Time spent waiting is skipped (and recorded) inside ``fastbreaker.testing.instant_retries()``.
    """

    __slots__ = ("_policy", "_methods", "_statuses", "_max_retry_after", "_max_retry_after_ns")

    def __init__(
        self,
        attempts: int = 3,
        *,
        base: Seconds = 0.05,
        cap: Seconds = 2.0,
        budget: Optional[_retry.Budget] = None,
        deadline: Union[Seconds, Deadline, None] = None,
        methods: Collection[str] = IDEMPOTENT_METHODS,
        statuses: Collection[int] = RETRY_STATUSES,
        max_retry_after: Seconds = 10.0,
        on_retry: Optional[Callable[[int, Outcome, float], object]] = None,
    ) -> None:
        if budget is None:
            budget = fastbreaker.RetryBudget()
        self._policy = _retry.Policy(Exception, attempts, base, cap, budget, deadline, on_retry)
        if isinstance(methods, str) or not all(isinstance(m, str) for m in methods):
            raise TypeError(f"methods must be a collection of method names, got {methods!r}")
        self._methods = frozenset(m.upper() for m in methods)
        if not all(
            isinstance(s, int) and not isinstance(s, bool) and 100 <= s <= 599 for s in statuses
        ):
            raise TypeError(
                f"statuses must be a collection of ints in [100, 599], got {statuses!r}"
            )
        self._statuses = frozenset(statuses)
        self._max_retry_after_ns = seconds_to_ns(max_retry_after, "max_retry_after")
        self._max_retry_after = self._max_retry_after_ns / 1e9

    @property
    def attempts(self) -> int:
        """Tries per request, the first included."""
        return self._policy.attempts

    @property
    def budget(self) -> _retry.Budget:
        """The retry budget every retry takes a token from (export it to Prometheus)."""
        assert self._policy.budget is not None
        return self._policy.budget

    @property
    def methods(self) -> frozenset[str]:
        """The methods that are retried."""
        return self._methods

    @property
    def statuses(self) -> frozenset[int]:
        """The response statuses that are retried."""
        return self._statuses

    @property
    def max_retry_after(self) -> float:
        """The longest ``Retry-After`` (seconds) that is waited for."""
        return self._max_retry_after

    def __repr__(self) -> str:
        return (
            f"Retry(attempts={self.attempts}, methods={sorted(self._methods)}, "
            f"statuses={sorted(self._statuses)}, budget={self.budget!r})"
        )

    # -- used by the transports ----------------------------------------------------------------
    def _applies(self, request: httpx.Request) -> bool:
        return request.method in self._methods and isinstance(request.stream, httpx.ByteStream)

    def _response_delay(
        self, attempt: int, response: httpx.Response, dl: Optional[Deadline]
    ) -> Optional[float]:
        """Attempt ``attempt`` returned ``response``: the wait before the next one, or None."""
        policy = self._policy
        if response.status_code not in self._statuses or attempt >= policy.attempts:
            return None
        hint = _retry_after(response)
        if hint is None:
            # Looked up on _retry at each call, so that tests pinning its draw pin ours too.
            u = _retry.uniform()
            delay = _retry.jitter(attempt - 1, policy.base_ns, policy.cap_ns, u)
        elif hint * 1e9 > self._max_retry_after_ns:
            return None
        else:
            delay = hint
        if dl is not None and delay * 1e9 >= dl.remaining_ns():
            return None
        assert policy.budget is not None
        if not policy.budget.allow_retry():
            return None
        if policy.on_retry is not None:
            policy.on_retry(attempt, response, delay)  # type: ignore[arg-type]
        return delay


def _retry_after(response: httpx.Response) -> Optional[float]:
    """Seconds from ``Retry-After`` (delay-seconds or an HTTP date), >= 0; None if absent/bad."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=datetime.timezone.utc)
        # The one place where wall time is right: the server gave a wall-clock date.
        seconds = (when - datetime.datetime.now(datetime.timezone.utc)).total_seconds()
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


class _Report:
    """Reports the outcome of one admitted request to its breaker, exactly once."""

    __slots__ = ("_breaker", "_finish", "_permit", "_start", "_done")

    def __init__(self, breaker: Any, permit: int) -> None:
        self._breaker = breaker
        self._finish = permits(breaker).finish
        self._permit = permit
        self._start = start_ns(breaker)
        self._done = False

    def finish(self, outcome: int) -> None:
        if not self._done:
            self._done = True
            self._finish(self._permit, outcome)

    def success(self) -> None:
        if not self._done:
            self.finish(timed_outcome(self._breaker, self._start))


class _Core:
    """What the sync and async transports share: keys, admission, classification, deadlines."""

    __slots__ = ("breakers", "lookup", "key", "is_failure", "retry", "headers")

    def __init__(
        self,
        breakers: Optional[Breakers],
        key: Optional[Callable[[httpx.Request], Hashable]],
        is_failure: Optional[Callable[[Outcome], bool]],
        retry: Optional[Retry],
        priority_header: Optional[str] = "x-priority",
        deadline_header: Optional[str] = "x-request-timeout",
    ) -> None:
        if breakers is None:
            breakers = fastbreaker.BreakerMap(max_keys=10_000)
        if callable(getattr(breakers, "open_keys", None)):
            self.lookup: Callable[[Hashable], Any] = cast(Any, breakers).__getitem__
        elif is_breaker(breakers):
            single = breakers
            self.lookup = lambda _key: single
        else:
            raise TypeError(
                f"breakers must be a fastbreaker.BreakerMap or a CircuitBreaker, got {breakers!r}"
            )
        self.breakers = breakers
        if key is not None and not callable(key):
            raise TypeError(f"key must be a callable request -> hashable key, got {key!r}")
        self.key = origin if key is None else key
        if is_failure is not None and not callable(is_failure):
            raise TypeError(f"is_failure must be a callable outcome -> bool, got {is_failure!r}")
        self.is_failure = default_is_failure if is_failure is None else is_failure
        if retry is not None and not isinstance(retry, Retry):
            raise TypeError(f"retry must be a fastbreaker.contrib.httpx.Retry, got {retry!r}")
        self.retry = retry
        for name, value in (
            ("priority_header", priority_header),
            ("deadline_header", deadline_header),
        ):
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise TypeError(f"{name} must be a header name (str) or None, got {value!r}")
            if value is not None and not _TOKEN.fullmatch(value):
                raise ValueError(
                    f"{name} must be a header name of ASCII letters, digits and "
                    f"!#$%&'*+-.^_`|~ only, got {value!r}"
                )
        self.headers = (priority_header, deadline_header)

    def admit(self, request: httpx.Request) -> _Report:
        key = self.key(request)
        breaker = self.lookup(key)
        try:
            permit = permits(breaker).admit()
        except CircuitOpenError as err:
            rejected = CircuitOpenTransportError(err.name, err.state, err.retry_after)
            rejected.key = key
            rejected.request = request
            raise rejected from None
        return _Report(breaker, permit)

    def deadline(self) -> Optional[Deadline]:
        return self.retry._policy.start() if self.retry is not None else current_deadline()

    def retries(self, request: httpx.Request) -> bool:
        return self.retry is not None and self.retry._applies(request)

    def prepare(
        self,
        request: httpx.Request,
        dl: Optional[Deadline],
        attempt: int,
        last: Optional[BaseException],
        timeouts: Any,
    ) -> None:
        """Before an attempt: refuse it past the deadline, else cut httpx's timeouts to it; send
        the current priority and the time left downstream (unless the request sets them)."""
        priority_header, deadline_header = self.headers
        if priority_header is not None and priority_header not in request.headers:
            prio = priority_var.get(None)  # only one set explicitly: CRITICAL is the default
            if prio is not None:
                request.headers[priority_header] = prio.name
        if dl is None:
            return
        if dl.expired():
            raise _retry.expired(attempt, last)
        left = dl.remaining()
        if deadline_header is not None and (attempt > 1 or deadline_header not in request.headers):
            request.headers[deadline_header] = f"{max(left, 0.0):.3f}"
        given = timeouts if isinstance(timeouts, dict) else {}
        cut = {}
        for name in ("connect", "read", "write", "pool"):
            value = given.get(name)
            cut[name] = left if value is None else min(value, left)
        request.extensions = {**request.extensions, "timeout": cut}

    def error_delay(self, attempt: int, exc: Exception, dl: Optional[Deadline]) -> Optional[float]:
        """Attempt ``attempt`` raised ``exc``: the wait before the next one, or None to raise."""
        if isinstance(exc, CircuitOpenError) or not self.is_failure(exc):
            return None
        assert self.retry is not None
        return self.retry._policy.after_failure(attempt, exc, dl)

    def response_delay(
        self, attempt: int, response: httpx.Response, dl: Optional[Deadline]
    ) -> Optional[float]:
        assert self.retry is not None
        return self.retry._response_delay(attempt, response, dl)

    def settle(self, report: _Report, response: httpx.Response, stream_type: type) -> None:
        """Classify the final response: failures now, successes when the body is done."""
        if self.is_failure(response):
            report.finish(OUT_FAILURE)
            return
        if self.retry is not None:
            self.retry.budget.record_success()
        stream = response.stream
        if isinstance(stream, httpx.ByteStream) or not isinstance(
            stream, (httpx.SyncByteStream, httpx.AsyncByteStream)
        ):
            report.success()  # in memory already: nothing can fail any more
        else:
            response.stream = stream_type(stream, report, self)

    def error_outcome(self, exc: BaseException) -> int:
        """The breaker outcome of an exception that ends a request."""
        if isinstance(exc, DeadlineExceeded) and exc.__cause__ is not None:
            exc = exc.__cause__  # the deadline refused a retry of this error
        if not isinstance(exc, Exception) or isinstance(exc, (CircuitOpenError, DeadlineExceeded)):
            return OUT_NEUTRAL
        try:
            failed = self.is_failure(exc)
        except Exception:  # we are raising exc already: log the classifier's own error
            logger.exception("fastbreaker: is_failure(%r) raised", exc)
            return OUT_NEUTRAL
        return OUT_FAILURE if failed else OUT_NEUTRAL


class _SyncReportingStream(httpx.SyncByteStream):
    """A response body that reports the request's success when closed, or its read error."""

    def __init__(self, inner: httpx.SyncByteStream, report: _Report, core: _Core) -> None:
        self._inner = inner
        self._report = report
        self._core = core

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from self._inner
        except GeneratorExit:  # the reader stopped early: close() reports
            raise
        except BaseException as exc:
            self._report.finish(self._core.error_outcome(exc))
            raise

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            self._report.success()


class _AsyncReportingStream(httpx.AsyncByteStream):
    """The async twin of ``_SyncReportingStream``."""

    def __init__(self, inner: httpx.AsyncByteStream, report: _Report, core: _Core) -> None:
        self._inner = inner
        self._report = report
        self._core = core

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._inner:
                yield chunk
        except GeneratorExit:
            raise
        except BaseException as exc:
            self._report.finish(self._core.error_outcome(exc))
            raise

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            self._report.success()


class BreakerTransport(httpx.BaseTransport):
    """An httpx transport that sends each request through the breaker of its key.

    ``transport``: the transport to wrap, by default a new ``httpx.HTTPTransport()``. Pass
    your own to configure TLS, HTTP/2, limits or proxies: an ``httpx.Client`` applies its own
    settings only to the transport it creates itself.

    ``breakers``: a ``fastbreaker.BreakerMap`` holding one breaker per key (by default
    ``BreakerMap(max_keys=10_000)``: 5 consecutive failures open a host for 30 s), or a single
    ``CircuitBreaker`` shared by every request. ``key(request)``: the breaker key, by default
    ``origin`` (the request's scheme, host and port). ``is_failure(outcome)``: the
    classification, by default ``default_is_failure``. ``retry``: a ``Retry`` policy, or
    ``None`` for no retries. A rejected request raises ``CircuitOpenTransportError``.
    ``bulkhead``: a ``fastbreaker.Bulkhead`` or ``AdaptiveLimiter`` shared by every origin, or a
    callable ``origin -> Bulkhead`` (one per host), applied outside the breaker: a full bulkhead
    raises ``fastbreaker.BulkheadFullError`` without reaching the breaker or the network. The slot
    covers sending the request and receiving the response headers (retries included), not the
    reading of a streamed body.

    A current ``fastbreaker.deadline()`` (or ``Retry(deadline=...)``) bounds every request:
    httpx's timeouts are cut to the time left, and a request whose deadline has passed raises
    ``fastbreaker.DeadlineExceeded`` without being sent (neutral for the breaker). The time left
    goes downstream in ``deadline_header`` (seconds, ``x-request-timeout``) and a priority set
    with ``fastbreaker.priority()`` in ``priority_header`` (its name, ``x-priority``), the
    headers ``fastbreaker.contrib.asgi.LoadSheddingMiddleware`` reads; None sends neither, and a
    header the request sets itself is kept. Safe to
    share between threads: all per-request state is local to the request.
    """

    def __init__(
        self,
        transport: Optional[httpx.BaseTransport] = None,
        *,
        breakers: Optional[Breakers] = None,
        key: Optional[Callable[[httpx.Request], Hashable]] = None,
        is_failure: Optional[Callable[[Outcome], bool]] = None,
        retry: Optional[Retry] = None,
        bulkhead: Optional[Bulkheads] = None,
        priority_header: Optional[str] = "x-priority",
        deadline_header: Optional[str] = "x-request-timeout",
    ) -> None:
        if transport is None:
            transport = httpx.HTTPTransport()
        elif not callable(getattr(transport, "handle_request", None)):
            raise TypeError(f"transport must be an httpx.BaseTransport, got {transport!r}")
        self._core = _Core(breakers, key, is_failure, retry, priority_header, deadline_header)
        self._bulkhead = _bulkhead_lookup(bulkhead)
        self._transport = transport

    @property
    def breakers(self) -> Breakers:
        """The ``BreakerMap`` (or single breaker) that guards the requests."""
        return self._core.breakers

    @property
    def retry(self) -> Optional[Retry]:
        """The retry policy, or None."""
        return self._core.retry

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` through its breaker (and the retries); see the class docstring."""
        bulkhead = self._bulkhead(request)
        if bulkhead is None:
            return self._handle(request)
        with bulkhead:  # outside the breaker: a full bulkhead never reaches it
            return self._handle(request)

    def _handle(self, request: httpx.Request) -> httpx.Response:
        core = self._core
        report = core.admit(request)
        try:
            response = self._send(request)
            core.settle(report, response, _SyncReportingStream)
        except BaseException as exc:
            report.finish(core.error_outcome(exc))
            raise
        return response

    def _send(self, request: httpx.Request) -> httpx.Response:
        core = self._core
        dl = core.deadline()
        timeouts = request.extensions.get("timeout")
        if not core.retries(request):
            core.prepare(request, dl, 1, None, timeouts)
            return self._transport.handle_request(request)
        attempt = 1
        last: Optional[Exception] = None  # the error that the next attempt retries
        while True:
            core.prepare(request, dl, attempt, last, timeouts)
            try:
                response = self._transport.handle_request(request)
            except Exception as exc:
                delay = core.error_delay(attempt, exc, dl)
                if delay is None:
                    raise
                last = exc
            else:
                delay = core.response_delay(attempt, response, dl)
                if delay is None:
                    return response
                response.close()
                last = None
            _retry.sleep(delay)
            attempt += 1

    def close(self) -> None:
        """Close the wrapped transport."""
        self._transport.close()


class AsyncBreakerTransport(httpx.AsyncBaseTransport):
    """The async twin of ``BreakerTransport`` (asyncio or trio, through anyio).

    ``transport``: the transport to wrap, by default a new ``httpx.AsyncHTTPTransport()``. Pass
    your own to configure TLS, HTTP/2, limits or proxies: an ``httpx.AsyncClient`` applies its own
    settings only to the transport it creates itself.

    ``breakers``: a ``fastbreaker.BreakerMap`` holding one breaker per key (by default
    ``BreakerMap(max_keys=10_000)``: 5 consecutive failures open a host for 30 s), or a single
    ``CircuitBreaker`` shared by every request. ``key(request)``: the breaker key, by default
    ``origin`` (the request's scheme, host and port). ``is_failure(outcome)``: the
    classification, by default ``default_is_failure``. ``retry``: a ``Retry`` policy, or
    ``None`` for no retries. A rejected request raises ``CircuitOpenTransportError``.
    ``bulkhead``: as for ``BreakerTransport`` (one ``Bulkhead`` or ``AdaptiveLimiter`` for every
    origin, or a callable ``origin -> Bulkhead``), applied outside the breaker.

    A current ``fastbreaker.deadline()`` (or ``Retry(deadline=...)``) bounds every request:
    httpx's timeouts are cut to the time left, and a request whose deadline has passed raises
    ``fastbreaker.DeadlineExceeded`` without being sent (neutral for the breaker). The time left
    goes downstream in ``deadline_header`` (seconds, ``x-request-timeout``) and a priority set
    with ``fastbreaker.priority()`` in ``priority_header`` (its name, ``x-priority``), the
    headers ``fastbreaker.contrib.asgi.LoadSheddingMiddleware`` reads; None sends neither, and a
    header the request sets itself is kept. Safe to
    share between tasks: all per-request state is local to the request.
    """

    def __init__(
        self,
        transport: Optional[httpx.AsyncBaseTransport] = None,
        *,
        breakers: Optional[Breakers] = None,
        key: Optional[Callable[[httpx.Request], Hashable]] = None,
        is_failure: Optional[Callable[[Outcome], bool]] = None,
        retry: Optional[Retry] = None,
        bulkhead: Optional[Bulkheads] = None,
        priority_header: Optional[str] = "x-priority",
        deadline_header: Optional[str] = "x-request-timeout",
    ) -> None:
        if transport is None:
            transport = httpx.AsyncHTTPTransport()
        elif not callable(getattr(transport, "handle_async_request", None)):
            raise TypeError(f"transport must be an httpx.AsyncBaseTransport, got {transport!r}")
        self._core = _Core(breakers, key, is_failure, retry, priority_header, deadline_header)
        self._bulkhead = _bulkhead_lookup(bulkhead)
        self._transport = transport

    @property
    def breakers(self) -> Breakers:
        """The ``BreakerMap`` (or single breaker) that guards the requests."""
        return self._core.breakers

    @property
    def retry(self) -> Optional[Retry]:
        """The retry policy, or None."""
        return self._core.retry

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` through its breaker (and the retries); see the class docstring."""
        bulkhead = self._bulkhead(request)
        if bulkhead is None:
            return await self._handle(request)
        async with bulkhead:  # outside the breaker: a full bulkhead never reaches it
            return await self._handle(request)

    async def _handle(self, request: httpx.Request) -> httpx.Response:
        core = self._core
        report = core.admit(request)
        try:
            response = await self._send(request)
            core.settle(report, response, _AsyncReportingStream)
        except BaseException as exc:
            report.finish(core.error_outcome(exc))
            raise
        return response

    async def _send(self, request: httpx.Request) -> httpx.Response:
        core = self._core
        dl = core.deadline()
        timeouts = request.extensions.get("timeout")
        if not core.retries(request):
            core.prepare(request, dl, 1, None, timeouts)
            return await self._transport.handle_async_request(request)
        attempt = 1
        last: Optional[Exception] = None  # the error that the next attempt retries
        while True:
            core.prepare(request, dl, attempt, last, timeouts)
            try:
                response = await self._transport.handle_async_request(request)
            except Exception as exc:
                delay = core.error_delay(attempt, exc, dl)
                if delay is None:
                    raise
                last = exc
            else:
                delay = core.response_delay(attempt, response, dl)
                if delay is None:
                    return response
                await response.aclose()
                last = None
            await _sleep_async(delay)
            attempt += 1

    async def aclose(self) -> None:
        """Close the wrapped transport."""
        await self._transport.aclose()


async def _sleep_async(delay: float) -> None:
    # Like fastbreaker's own async retries, but through anyio so that trio works too.
    if _retry.skip_sleep(delay):
        delay = 0.0
    await _async_sleep(delay)
