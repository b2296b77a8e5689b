# The compiled core mirrors the pure-Python twin exactly: its types are the twin's.
from typing import final

from ._breaker_py import (
    CircuitBreaker as CircuitBreaker,
    Config as Config,
    Group as Group,
    Metrics as Metrics,
    shared_group_init as shared_group_init,
    shared_group_size as shared_group_size,
    shared_init as shared_init,
    shared_size as shared_size,
)

@final
class WithStack:
    """The open ``with`` blocks of one context: internal."""

    @property
    def open_blocks(self) -> int: ...

def open_with_blocks(breaker: object) -> int:
    """How many ``with`` blocks of ``breaker`` are open in every context (for tests)."""
