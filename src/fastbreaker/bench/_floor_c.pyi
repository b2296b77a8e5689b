from typing import Any, Callable, TypeVar

T = TypeVar("T")

class Floor:
    """The cheapest possible method call on a Cython class (benchmark floor)."""

    def allow(self) -> bool: ...
    def record_success(self, elapsed: object = None) -> None: ...
    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T: ...
