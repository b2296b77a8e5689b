"""BreakerMap: one circuit breaker per key (a host, or host + operation), bounded, no threads.

The selector: ``BreakerMap`` is the compiled map (``_map_c.pyx``) when ``import fastbreaker``
picked the compiled core, else the pure-Python twin (``_map_py.py``, the specification).
``map_class(core)`` gives the map bound to one breaker core module (the test suite runs every
test on both).
"""

from __future__ import annotations

import types
from typing import TYPE_CHECKING

from ._map_steps import MapMetrics
from ._select import COMPILED

__all__ = ["BreakerMap", "MapMetrics", "map_class"]


def map_class(core: types.ModuleType) -> type:
    """The BreakerMap class whose breakers come from ``core`` (``_breaker_c`` or ``_breaker_py``)."""
    if core.__name__ == f"{__package__}._breaker_c":
        from ._map_c import BreakerMap as compiled  # missing on CPython: an error, not a slowdown

        return compiled
    if core.__name__ == f"{__package__}._breaker_py":
        from ._map_py import BreakerMap as twin

        return twin
    raise TypeError(f"core must be fastbreaker._breaker_c or fastbreaker._breaker_py, got {core!r}")


if TYPE_CHECKING or not COMPILED:
    from ._map_py import BreakerMap
else:
    from ._map_c import BreakerMap
