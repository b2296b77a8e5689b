# The compiled core mirrors the pure-Python twin exactly: its types are the twin's.
from typing import final

from ._breaker_py import (
    CircuitBreaker as CircuitBreaker,
    Config as Config,
    Group as Group,
    Metrics as Metrics,
)

@final
class Block:
    """An open ``with`` block: internal, the compiled twin of ``_calls.Block``."""

    def __init__(self, breaker: object, permit: int, start: int, rest: object) -> None: ...
    @property
    def breaker(self) -> object: ...
    @property
    def permit(self) -> int: ...
    @property
    def start(self) -> int: ...
    @property
    def rest(self) -> object: ...
