"""The service of ``python -m fastbreaker overload``: an ASGI app of known capacity.

``/work`` takes one of ``FB_OVERLOAD_CAPACITY`` slots for ``FB_OVERLOAD_SERVICE_MS``
milliseconds, so the service answers at most capacity / service time requests per second. Like
most servers, it goes on with a request whose client has hung up. With ``FB_OVERLOAD_SHED=1``
the app is wrapped in ``fastbreaker.contrib.asgi.LoadSheddingMiddleware`` over a
``LoadShedder`` of the same capacity. Served by uvicorn: ``uvicorn --factory
fastbreaker.bench._overload_app:make_app``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


def make_app() -> App:
    """The app the environment describes (see the module docstring)."""
    capacity = int(os.environ.get("FB_OVERLOAD_CAPACITY", "4"))
    service = float(os.environ.get("FB_OVERLOAD_SERVICE_MS", "50")) / 1000.0
    slots: list[asyncio.Semaphore] = []  # made on the server's loop, at the first request

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if not slots:
            slots.append(asyncio.Semaphore(capacity))
        async with slots[0]:
            await asyncio.sleep(service)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    if os.environ.get("FB_OVERLOAD_SHED") != "1":
        return app
    import fastbreaker
    from fastbreaker.contrib.asgi import LoadSheddingMiddleware

    # a queue one service time deep: the clients' deadline leaves no room for a longer wait
    queue = int(os.environ.get("FB_OVERLOAD_MAX_QUEUE", str(capacity)))
    shedder = fastbreaker.LoadShedder(capacity, max_queue=queue, name="overload")
    return LoadSheddingMiddleware(app, shedder)
