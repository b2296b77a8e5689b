"""Type stub of the compiled first attempt of ``@fb.retry``; ``_retry_py`` is its twin."""

from typing import Any, Callable, final

from ._retry import Policy

@final
class RetryingCall:
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...
    def __get__(self, instance: object, owner: type | None = None, /) -> Any: ...

def first_attempt(policy: Policy, fn: Callable[..., Any]) -> Callable[..., Any]: ...
