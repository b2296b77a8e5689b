"""``bulkhead=`` on the httpx transports (both cores): shared or per origin, outside the breaker."""

from __future__ import annotations

import types

import httpx
import pytest

from fastbreaker.contrib.httpx import AsyncBreakerTransport, BreakerTransport, Origin


def test_shared_bulkhead_is_outside_the_breaker(fb: types.SimpleNamespace) -> None:
    bh = fb.Bulkhead(1)
    breaker = fb.CircuitBreaker(failure_threshold=1)
    seen: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(bh.in_flight)
        return httpx.Response(200)

    transport = BreakerTransport(httpx.MockTransport(handler), breakers=breaker, bulkhead=bh)
    with httpx.Client(transport=transport) as client:
        assert client.get("https://a.example/").status_code == 200
        with bh:  # every slot taken: refused before the breaker and the network
            with pytest.raises(fb.BulkheadFullError):
                client.get("https://a.example/")
    assert seen == [1] and bh.in_flight == 0
    assert breaker.state == fb.State.CLOSED and breaker.metrics().permitted == 1


def test_one_bulkhead_per_origin(fb: types.SimpleNamespace) -> None:
    per_host: dict[Origin, object] = {}

    def bulkhead_for(origin: Origin) -> object:
        return per_host.setdefault(origin, fb.Bulkhead(1, name=str(origin)))

    transport = BreakerTransport(
        httpx.MockTransport(lambda r: httpx.Response(204)), bulkhead=bulkhead_for
    )
    with httpx.Client(transport=transport) as client:
        client.get("https://a.example/")
        client.get("http://b.example:8080/")
    assert sorted(map(str, per_host)) == ["http://b.example:8080", "https://a.example:443"]
    with pytest.raises(TypeError, match="bulkhead"):
        BreakerTransport(httpx.MockTransport(lambda r: httpx.Response(200)), bulkhead=3)


async def test_async_transport_with_a_limiter(fb: types.SimpleNamespace) -> None:
    lim = fb.AdaptiveLimiter(4, min_limit=1)

    async def handler(request: httpx.Request) -> httpx.Response:
        assert lim.in_flight == 1
        return httpx.Response(200)

    transport = AsyncBreakerTransport(httpx.MockTransport(handler), bulkhead=lim)
    async with httpx.AsyncClient(transport=transport) as client:
        assert (await client.get("https://a.example/")).status_code == 200
    m = lim.metrics()
    assert (m.admitted, m.in_flight) == (1, 0)
