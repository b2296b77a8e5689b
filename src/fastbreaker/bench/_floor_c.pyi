from collections.abc import Callable
from typing import Any, TypeVar, final

_T = TypeVar("_T")

@final
class Floor:
    """The cheapest possible method call on a Cython class (benchmark floor)."""

    def allow(self) -> bool: ...
    def record_success(self, elapsed: object = None) -> None: ...
    def call(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T: ...
