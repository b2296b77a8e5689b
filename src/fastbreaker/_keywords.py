"""One error for a mistyped keyword argument, on both cores: it names what the user called.

``CircuitBreaker(failur_threshold=3)`` raises ``TypeError: CircuitBreaker() got an unexpected
keyword argument 'failur_threshold'; did you mean 'failure_threshold'?``. Constructors check in
``__new__`` (twins) or ``__cinit__`` (compiled), before ``__init__`` binds its arguments.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable, Collection, Mapping
from typing import Any, TypeVar

from ._options import class_signature

__all__ = ["check_keywords", "checks_keywords", "keyword_names"]

F = TypeVar("F", bound=Callable[..., Any])

_BY_NAME = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def keyword_names(signature: inspect.Signature) -> frozenset[str]:
    """The parameters of ``signature`` that may be passed by keyword."""
    return frozenset(n for n, p in signature.parameters.items() if p.kind in _BY_NAME)


def check_keywords(owner: str, kwargs: Mapping[str, object], accepted: Collection[str]) -> None:
    """TypeError naming ``owner`` (``"CircuitBreaker"``) for the first keyword of ``kwargs``
    not in ``accepted``, with the closest accepted name when one is near."""
    for name in kwargs:
        if name not in accepted:
            close = difflib.get_close_matches(name, sorted(accepted), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise TypeError(f"{owner}() got an unexpected keyword argument {name!r}{hint}")


def checks_keywords(target: F) -> F:
    """``target`` with ``check_keywords`` on the keywords it is called with.

    A class (pure Python) gets a ``__new__`` that checks first and a ``__signature__`` from its
    ``__init__`` (unless it has one); a function (one called when setting up, not per request:
    this adds a call) is wrapped. The accepted names come from ``inspect.signature``.
    """
    if isinstance(target, type):
        return _checks_class(target)  # type: ignore[return-value]
    fn = target
    accepted = keyword_names(inspect.signature(fn))
    owner = fn.__name__

    @functools.wraps(fn)
    def checked(*args: Any, **kwargs: Any) -> Any:
        if kwargs:
            check_keywords(owner, kwargs, accepted)
        return fn(*args, **kwargs)

    return checked  # type: ignore[return-value]


def _checks_class(cls: type) -> type:
    new: Any = cls.__new__
    plain = new is object.__new__  # which takes no arguments beyond the class
    if "__signature__" not in cls.__dict__:
        init = inspect.signature(cls.__init__)  # type: ignore[misc]
        cls.__signature__ = class_signature(init)  # type: ignore[attr-defined]
    accepted: frozenset[str] | None = None  # read from inspect.signature(cls) at first use

    def __new__(klass: type, *args: Any, **kwargs: Any) -> Any:
        nonlocal accepted
        if kwargs:
            if accepted is None:
                accepted = keyword_names(inspect.signature(cls))
            if not accepted.issuperset(kwargs):
                # a subclass may take more: judge by what was called
                check_keywords(klass.__name__, kwargs, keyword_names(inspect.signature(klass)))
        return new(klass) if plain else new(klass, *args, **kwargs)

    cls.__new__ = staticmethod(__new__)  # type: ignore[assignment]
    return cls
