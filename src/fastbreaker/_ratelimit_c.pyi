"""Type stub of the compiled RateLimiter and RateLimiterMap; they mirror the twin in
``_ratelimit_py``."""

from ._ratelimit_py import (
    RateLimiter as RateLimiter,
    RateLimiterMap as RateLimiterMap,
    map_block_size as map_block_size,
    map_slot_read as map_slot_read,
    map_slot_reset as map_slot_reset,
    shared_init as shared_init,
    shared_size as shared_size,
)
