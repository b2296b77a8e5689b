"""Type stub of the compiled RateLimiter and RateLimiterMap; they mirror the twin in
``_ratelimit_py``."""

from ._ratelimit_py import (
    RateLimiter as RateLimiter,
    RateLimiterMap as RateLimiterMap,
    shared_init as shared_init,
    shared_size as shared_size,
)
