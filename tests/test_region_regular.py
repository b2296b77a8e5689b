"""The regular breaker tests, run again through shared breakers (SharedRegion), on both cores.

Every ``fb.CircuitBreaker(...)`` of the imported test modules makes a breaker in a fresh region
(unlinked at once: only this process maps it) with the test's clock as the region's clock. The
tests that cannot apply to a shared breaker are listed in ``NOT_APPLICABLE`` with the reason.
"""

from __future__ import annotations

import contextlib
import gc
import sys
import types
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from test_breaker import *  # noqa: F403
from test_breaker_metrics import *  # noqa: F403
from test_breaker_window import *  # noqa: F403
from test_calls import *  # noqa: F403

import fastbreaker

NOT_APPLICABLE = {
    "test_name": "a shared breaker always has a name (its key in the region)",
}
for _test in NOT_APPLICABLE:
    del globals()[_test]

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SharedRegion is POSIX only")

NAMESPACES = fastbreaker.testing.implementations()


def _shared_namespace(ns: types.SimpleNamespace) -> types.SimpleNamespace:
    out = types.SimpleNamespace(**vars(ns))

    def CircuitBreaker(*args: Any, name: Any = None, clock: Any = None, **options: Any) -> Any:
        if name is not None and not isinstance(name, str):
            raise TypeError(f"name must be a str or None, got {name!r}")
        region = ns.SharedRegion(f"fbrg-{uuid.uuid4().hex[:12]}", size=1 << 18, clock=clock)
        region.unlink()  # this process's mapping stays until the test ends
        out.regions.append(region)
        return region.breaker(name or "shared", *args, **options)

    out.CircuitBreaker = CircuitBreaker
    out.impl = ns.impl
    out.regions = []
    return out


SHARED = {f"{impl}-shared": _shared_namespace(ns) for impl, ns in NAMESPACES.items()}


@pytest.fixture(params=list(SHARED))
def fb(request: pytest.FixtureRequest) -> Iterator[types.SimpleNamespace]:
    """The API of one core whose ``CircuitBreaker(...)`` makes a shared breaker."""
    ns = SHARED[request.param]
    yield ns
    gc.collect()
    while ns.regions:
        region = ns.regions.pop()
        with contextlib.suppress(BufferError):  # a test's traceback may keep a breaker
            region.close()
