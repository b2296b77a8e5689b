"""Bounded Redis operations for ``compat.pybreaker.CircuitRedisStorage``.

pybreaker's storage puts a few Redis round trips on every call; a Redis that is down or stopped
must not stall the caller. Every operation runs on a client made from the user's connection
settings with a socket timeout of ``timeout`` seconds (connect and read) and no client-side
retries; after a failed operation Redis is left alone for ``PAUSE`` seconds (reads give the
fallback, writes are lost), so one call meets at most one timeout; one line is logged when an
outage begins and one when Redis answers again.
"""

from __future__ import annotations

import importlib
import logging
import math
import threading
import time
from typing import Any, Callable, TypeVar

T = TypeVar("T")

#: Seconds Redis is left alone after a failed operation.
PAUSE = 1.0


def check_timeout(value: object) -> float:
    """``value`` as seconds in (0, 60], or a clear error naming ``timeout``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"timeout must be a number of seconds, got {value!r}")
    v = float(value)
    if math.isnan(v) or not 0.0 < v <= 60.0:
        raise ValueError(f"timeout must be in (0, 60] seconds, got {value!r}")
    return v


def bounded_client(client: Any, timeout: float) -> Any:
    """A client with ``client``'s connection settings, ``timeout`` on connect and read, and no
    retries; ``client`` itself when it is not a redis-py/valkey socket client (an in-memory
    fake, a cluster client), which is then used as given."""
    pool = getattr(client, "connection_pool", None)
    cls = getattr(pool, "connection_class", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    top = getattr(cls, "__module__", "").split(".")[0]
    if top not in ("redis", "valkey") or not isinstance(kwargs, dict):
        return client
    lib = importlib.import_module(top)
    retry = importlib.import_module(f"{top}.retry").Retry
    no_backoff = importlib.import_module(f"{top}.backoff").NoBackoff
    kwargs = dict(kwargs)
    kwargs.pop("retry_on_timeout", None)
    kwargs.pop("retry_on_error", None)
    kwargs.update(
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=retry(no_backoff(), 0),
        health_check_interval=0,
    )
    return type(client)(connection_pool=lib.ConnectionPool(connection_class=cls, **kwargs))


class BoundedRedis:
    """Runs a storage's operations on ``client`` (see the module docstring)."""

    def __init__(self, client: Any, timeout: float, log: logging.Logger) -> None:
        self.client = bounded_client(client, timeout)
        self._log = log
        self._errors = _errors()
        self._resume = 0.0  # monotonic time before which Redis is left alone
        self._down = False
        self._lock = threading.Lock()

    def run(self, op: Callable[[Any], T], default: T) -> T:
        """``op(client)``, or ``default`` when Redis fails now or failed less than PAUSE ago."""
        if self._resume and time.monotonic() < self._resume:
            return default
        try:
            result = op(self.client)
        except self._errors as exc:
            with self._lock:
                self._resume = time.monotonic() + PAUSE
                first, self._down = not self._down, True
            if first:
                self._log.warning(
                    "Redis unavailable (%s: %s): fallback state, writes lost, until it answers",
                    type(exc).__name__,
                    exc,
                )
            return default
        if self._down:
            with self._lock:
                was, self._down, self._resume = self._down, False, 0.0
            if was:
                self._log.warning("Redis answers again")
        return result


def _errors() -> tuple[type[BaseException], ...]:
    found: list[type[BaseException]] = [OSError]
    for module, name in (("redis.exceptions", "RedisError"), ("valkey.exceptions", "ValkeyError")):
        try:
            found.append(getattr(importlib.import_module(module), name))
        except ImportError:
            pass
    return tuple(found)
