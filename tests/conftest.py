"""One test suite, two implementations.

The ``fb`` fixture is the public API of ``fastbreaker`` bound to one core: ``c`` (the compiled
extension) or ``python`` (the pure-Python reference twin). Every behavioural test takes ``fb``
instead of importing ``fastbreaker`` directly, so it runs on both. With
``FASTBREAKER_NO_EXTENSIONS`` set, only the ``python`` leg runs; ``FB_IMPLS=c`` keeps only the
compiled leg (the debug-build and 3.13t legs of ``.ci/run``, which are about the C code).
"""

from __future__ import annotations

import os
import types

import pytest

import fastbreaker

NAMESPACES = fastbreaker.testing.implementations()
IMPLS = [i for i in NAMESPACES if i in os.environ.get("FB_IMPLS", "c,python").split(",")]


@pytest.fixture(params=IMPLS)
def fb(request: pytest.FixtureRequest) -> types.SimpleNamespace:
    """The fastbreaker API bound to one implementation (ids ``c`` and ``python``)."""
    return NAMESPACES[request.param]


@pytest.fixture
def clock() -> fastbreaker.testing.FakeClock:
    """A fake clock starting at 1,000 s (so that 'time 0' is never special)."""
    return fastbreaker.testing.FakeClock(1_000_000_000_000)
