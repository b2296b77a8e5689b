"""gunicorn settings for the shared-breaker example: ``gunicorn -c gunicorn.conf.py app:app``.

The master creates the SharedRegion before it forks any worker (``on_starting``) and removes
its name when it exits (``on_exit``). The workers attach to it by name (``create=False``, in
app.py) on their first request: they inherit the master's mapping through fork, and the region
outlives every worker that gunicorn restarts (``max_requests``, a timed-out worker, a TTOU/TTIN).

Environment: ``GUNICORN_BIND`` (default ``127.0.0.1:8000``; ``fd://N`` works too),
``FB_REGION`` (the region's name, the same one app.py reads), ``GUNICORN_PRELOAD=1`` to import
app.py in the master before the fork (the example works either way: app.py opens nothing at
import time).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import fastbreaker

bind = [os.environ.get("GUNICORN_BIND", "127.0.0.1:8000")]
workers = 4
# One request at a time per worker process (the sync worker), so that "4 workers" means four
# processes sharing the breakers.
worker_class = "sync"
preload_app = os.environ.get("GUNICORN_PRELOAD", "") == "1"
# The upstream call times out after 2 s; a worker busy far longer than that is stuck.
timeout = 30
graceful_timeout = 10

REGION_NAME = os.environ.get("FB_REGION", "fastbreaker-gunicorn-example")
REGION_SIZE = 1 << 20  # 1 MiB: a region holds at most 255 objects, a breaker takes < 1 KiB


def on_starting(server: Any) -> None:
    """In the master, before the listeners and the first fork: create the region.

    With ``create=True`` a segment of that name left by a master killed with SIGKILL (which runs
    no on_exit) is attached to, with its breakers' state; ``rm /dev/shm/<FB_REGION>`` starts
    clean. With ``preload_app`` this runs after app.py was imported, which is why app.py
    attaches lazily.
    """
    region = fastbreaker.SharedRegion(REGION_NAME, size=REGION_SIZE, create=True)
    # Kept on the arbiter: this module is executed again on a SIGHUP reload, the arbiter is not.
    server.fb_region = region
    server.log.info("fastbreaker: shared region %r ready (%d bytes)", region.name, region.size)


def on_exit(server: Any) -> None:
    """In the master, after every worker has stopped: remove the region's name."""
    region = getattr(server, "fb_region", None)
    if region is None:
        return
    with contextlib.suppress(FileNotFoundError):  # someone removed it already
        region.unlink()
    region.close()
    server.log.info("fastbreaker: shared region %r unlinked", region.name)
