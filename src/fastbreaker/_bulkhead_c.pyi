"""Type stub of the compiled Bulkhead and AdaptiveLimiter; they mirror the twin in ``_bulkhead_py``."""

from ._bulkhead import BulkheadMetrics as BulkheadMetrics
from ._bulkhead_py import (
    AdaptiveLimiter as AdaptiveLimiter,
    Bulkhead as Bulkhead,
    shared_init as shared_init,
    shared_size as shared_size,
)

def _hammer(
    obj: Bulkhead | AdaptiveLimiter, rounds: int, rtt_ns: int, now: int
) -> tuple[int, int, int]: ...
