"""One test suite, two implementations.

The ``fb`` fixture is the public API of ``fastbreaker`` bound to one core: ``c`` (the compiled
extension) or ``python`` (the pure-Python reference twin). Every behavioural test takes ``fb``
instead of importing ``fastbreaker`` directly, so it runs on both. With
``FASTBREAKER_NO_EXTENSIONS`` set, only the ``python`` leg runs.
"""

from __future__ import annotations

import os
import types

import pytest

import fastbreaker
from fastbreaker import _breaker_py, _budget_py, _map

IMPLS = ["python"] if os.environ.get("FASTBREAKER_NO_EXTENSIONS") else ["c", "python"]


def _namespace(name: str) -> types.SimpleNamespace:
    ns = types.SimpleNamespace(**{k: getattr(fastbreaker, k) for k in fastbreaker.__all__})
    if name == "c":
        from fastbreaker import _breaker_c, _budget_c

        breaker_mod, budget_mod = _breaker_c, _budget_c
    else:
        breaker_mod, budget_mod = _breaker_py, _budget_py
    ns.impl = name
    ns.CircuitBreaker = breaker_mod.CircuitBreaker
    ns.Metrics = breaker_mod.Metrics
    ns.RetryBudget = budget_mod.RetryBudget
    ns.BreakerMap = _map.map_class(breaker_mod)
    return ns


NAMESPACES = {name: _namespace(name) for name in IMPLS}


@pytest.fixture(params=IMPLS)
def fb(request: pytest.FixtureRequest) -> types.SimpleNamespace:
    """The fastbreaker API bound to one implementation (ids ``c`` and ``python``)."""
    return NAMESPACES[request.param]


@pytest.fixture
def clock() -> fastbreaker.testing.FakeClock:
    """A fake clock starting at 1,000 s (so that 'time 0' is never special)."""
    return fastbreaker.testing.FakeClock(1_000_000_000_000)
