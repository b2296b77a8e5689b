"""fastbreaker: circuit breakers and retry budgets whose hot path is lock-free C.

``import fastbreaker as fb`` gives the compiled core on CPython and the pure-Python reference
twin when ``FASTBREAKER_NO_EXTENSIONS`` is set (or on other interpreters). ``fb.COMPILED`` says
which one is in use. A missing extension on CPython is an error, never a silent slowdown.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ._errors import (
    BreakerError,
    BulkheadFullError,
    CircuitOpenError,
    DeadlineExceeded,
    LoadShedError,
    RateLimitedError,
    SharedStateTimeout,
    State,
)
from ._select import COMPILED

if TYPE_CHECKING or not COMPILED:
    from ._breaker_py import CircuitBreaker, Metrics
    from ._budget_py import RetryBudget
    from ._bulkhead_py import AdaptiveLimiter, Bulkhead
    from ._ratelimit_py import RateLimiter, RateLimiterMap
else:
    from ._breaker_c import CircuitBreaker, Metrics
    from ._budget_c import RetryBudget
    from ._bulkhead_c import AdaptiveLimiter, Bulkhead
    from ._ratelimit_c import RateLimiter, RateLimiterMap

from . import testing
from ._bulkhead import BulkheadMetrics
from ._deadline import Deadline, DeadlineScope, current_deadline, deadline
from ._fallback import Degraded, FallbackMetrics, fallback, stale_on_error
from ._map import BreakerMap, MapMetrics
from ._metrics import Latency
from ._priority import Priority, PriorityScope, current_priority, priority
from ._ratelimit import Rate, RateLimiterMapMetrics, RateLimiterMetrics
from ._region import default_class as _region_default
from ._retry import Attempt, Retrying, retry, retrying
from ._shed import LoadShedder, ShedderMetrics
from ._version import __version__ as __version__

if TYPE_CHECKING:
    from ._region import SharedRegion
else:
    SharedRegion = _region_default()


def get_include() -> str:
    """The folder with fastbreaker's ``.pxd`` files and C headers: pass it as ``include_dirs``
    when building an extension that cimports fastbreaker."""
    return os.path.dirname(os.path.abspath(__file__))


__all__ = [
    "COMPILED",
    "AdaptiveLimiter",
    "Attempt",
    "BreakerError",
    "BreakerMap",
    "Bulkhead",
    "BulkheadFullError",
    "BulkheadMetrics",
    "CircuitBreaker",
    "CircuitOpenError",
    "Deadline",
    "DeadlineExceeded",
    "DeadlineScope",
    "Degraded",
    "FallbackMetrics",
    "Latency",
    "LoadShedError",
    "LoadShedder",
    "MapMetrics",
    "Metrics",
    "Priority",
    "PriorityScope",
    "Rate",
    "RateLimitedError",
    "RateLimiter",
    "RateLimiterMap",
    "RateLimiterMapMetrics",
    "RateLimiterMetrics",
    "RetryBudget",
    "Retrying",
    "ShedderMetrics",
    "SharedRegion",
    "SharedStateTimeout",
    "State",
    "current_deadline",
    "current_priority",
    "deadline",
    "fallback",
    "get_include",
    "priority",
    "retry",
    "retrying",
    "stale_on_error",
    "testing",
]

#: What ``dir(fastbreaker)`` shows besides the public names (no imports or typing helpers).
_DUNDERS = ("__all__", "__doc__", "__file__", "__name__", "__path__", "__spec__", "__version__")


def __dir__() -> list[str]:
    return sorted((*__all__, *_DUNDERS))
