"""Optional integrations with third-party libraries, one module each.

Nothing here is imported by ``import fastbreaker``: each module imports its library when it is
itself imported, and says which extra to install when the library is missing.

- ``fastbreaker.contrib.httpx``: ``BreakerTransport`` and ``AsyncBreakerTransport``, per-host
  breakers (and optional budgeted retries) around any httpx transport
  (``pip install 'fastbreaker[httpx]'``).
- ``fastbreaker.contrib.prometheus``: ``BreakerCollector``, which exports breakers, maps and
  retry budgets at scrape time (``pip install 'fastbreaker[prometheus]'``).
- ``fastbreaker.contrib.otel``: ``instrument(meter, ...)``, OpenTelemetry observable instruments
  for breakers, maps, retry budgets and bulkheads, read only at collection time
  (``pip install 'fastbreaker[otel]'``).
- ``fastbreaker.contrib.asgi``: ``LoadSheddingMiddleware``, a ``LoadShedder`` in front of an ASGI
  application: 503 with ``Retry-After``, priorities and deadlines from the caller's headers,
  health paths exempt (``pip install 'fastbreaker[asgi]'`` to serve it).
- ``fastbreaker.contrib.redis``: ``FleetCoordinator``, local-first coordination of breakers,
  maps and retry budgets across processes through Redis (``pip install 'fastbreaker[redis]'``).
"""
