"""The API a user meets: what ``dir(fastbreaker)`` lists and the types public functions return."""

from __future__ import annotations

import enum
import inspect
import typing
from collections.abc import Iterator
from typing import Any

import pytest

import fastbreaker


def test_dir_lists_the_public_names_only() -> None:
    names = dir(fastbreaker)
    assert set(fastbreaker.__all__) <= set(names)
    extra = {n for n in names if n not in fastbreaker.__all__}
    assert extra <= {"__all__", "__doc__", "__file__", "__name__", "__path__", "__spec__"} | {
        "__version__"
    }
    for hidden in ("os", "annotations", "TYPE_CHECKING", "_select", "_breaker_py"):
        assert hidden not in names
    assert names == sorted(names)


def _types_in(hint: Any) -> Iterator[type]:
    """The classes named anywhere in a type hint (``Callable[[X], Y[P, T]]`` gives X and Y)."""
    if isinstance(hint, list):
        for h in hint:
            yield from _types_in(h)
        return
    origin = typing.get_origin(hint)
    if isinstance(origin, type):
        yield origin
    elif isinstance(hint, type):
        yield hint
    for arg in typing.get_args(hint):
        yield from _types_in(arg)


def _returned_types() -> Iterator[tuple[str, type]]:
    twin = fastbreaker.testing.implementations()["python"]
    for name in fastbreaker.__all__:
        obj = getattr(twin, name)
        targets = [(name, obj)] if inspect.isfunction(obj) else []
        if inspect.isclass(obj):
            targets += [
                (f"{name}.{m}", f)
                for m, f in vars(obj).items()
                if not m.startswith("_") and inspect.isfunction(f)
            ]
        for qualname, fn in targets:
            hint = typing.get_type_hints(fn).get("return")
            for cls in _types_in(hint):
                yield qualname, cls


def test_the_types_public_functions_return_are_importable() -> None:
    # checked on the twins (the typed specification); fastbreaker.X is the same name on both
    twin = fastbreaker.testing.implementations()["python"]
    seen = dict(_returned_types())
    assert {"deadline", "priority", "retrying", "fallback", "BreakerMap.get"} <= set(seen)
    missing = sorted(
        f"{qualname} -> {cls.__module__}.{cls.__qualname__}"
        for qualname, cls in _returned_types()
        if cls.__module__.startswith("fastbreaker")
        and getattr(twin, cls.__name__, None) is not cls
        and not cls.__name__.startswith("_")
    )
    assert not missing, missing


def test_the_returned_objects_are_instances_of_the_exported_types(fb: Any) -> None:
    assert isinstance(fb.deadline(1.0), fb.DeadlineScope)
    assert isinstance(fb.priority("CRITICAL"), fb.PriorityScope)
    loop = fb.retrying(on=ValueError, attempts=1)
    assert isinstance(loop, fb.Retrying)
    for attempt in loop:
        assert isinstance(attempt, fb.Attempt)
        with attempt:
            pass
    wrapped = fb.fallback(lambda exc: 0)(lambda: 1)
    assert isinstance(wrapped, fb.Degraded)  # a runtime-checkable protocol
    assert wrapped() == 1 and wrapped.metrics().calls == 1


# Public callables that take keywords but do not check them, and why. A new public name must be
# checked or listed here.
NOT_CHECKED = {
    # per request: a check would add a Python call to each; Python's own error names them
    "deadline": "per request",
    "Deadline": "per request",
    "priority": "per request",
    # made by the library, not by users
    "Attempt": "made by retrying()",
    "Retrying": "made by retrying()",
    "DeadlineScope": "made by deadline()",
    "PriorityScope": "made by priority()",
    "BulkheadMetrics": "a snapshot",
    "FallbackMetrics": "a snapshot",
    "Latency": "a snapshot",
    "MapMetrics": "a snapshot",
    "Metrics": "a snapshot",
    "RateLimiterMapMetrics": "a snapshot",
    "RateLimiterMetrics": "a snapshot",
    "ShedderMetrics": "a snapshot",
}


def _keyword_params(obj: Any) -> list[str]:
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return []
    by_name = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [n for n, p in sig.parameters.items() if p.kind in by_name]


def _checked(fb: Any) -> list[tuple[str, Any, list[str]]]:
    out = []
    for name in fastbreaker.__all__:
        obj = getattr(fb, name)
        if not callable(obj) or name in NOT_CHECKED:
            continue
        if inspect.isclass(obj) and issubclass(obj, (BaseException, enum.Enum)):
            continue  # exceptions take no keywords; enums are looked up, not configured
        params = _keyword_params(obj)
        if params:
            out.append((name, obj, params))
    return out


def test_a_mistyped_keyword_names_what_was_called_and_the_near_miss(fb: Any) -> None:
    checked = _checked(fb)
    assert {n for n, _, _ in checked} >= {
        "CircuitBreaker",
        "BreakerMap",
        "RetryBudget",
        "Bulkhead",
        "AdaptiveLimiter",
        "LoadShedder",
        "RateLimiter",
        "RateLimiterMap",
        "Rate",
        "SharedRegion",
        "retry",
        "retrying",
        "fallback",
        "stale_on_error",
    }
    for name, obj, params in checked:
        for param in params:
            typo = param + "s" if not param.endswith("s") else param[:-1]
            with pytest.raises(TypeError) as err:
                obj(**{typo: 1})
            assert str(err.value) == (
                f"{name}() got an unexpected keyword argument {typo!r}; did you mean {param!r}?"
            )
        with pytest.raises(TypeError) as err:
            obj(zzzzzzzz=1)
        assert str(err.value) == f"{name}() got an unexpected keyword argument 'zzzzzzzz'"


def test_the_check_lets_every_accepted_keyword_through(fb: Any, clock: Any) -> None:
    # the constructors still work with keywords (the check runs before __init__ binds them)
    fb.CircuitBreaker(failure_threshold=3, reset_timeout=1.0, name="x", clock=clock)
    fb.BreakerMap(failure_threshold=3, max_keys=10, clock=clock)
    fb.RetryBudget(ratio=0.2, capacity=5.0, min_per_sec=0.0, clock=clock)
    fb.Bulkhead(max_concurrent=2, max_wait=0.0, max_waiting=1, name="b", clock=clock)
    fb.AdaptiveLimiter(initial_limit=5, min_limit=1, max_limit=10, clock=clock)
    fb.RateLimiter("1/s", name="r", clock=clock)
    fb.RateLimiterMap("1/s", max_keys=5, name="m", clock=clock)
    fb.LoadShedder(fb.Bulkhead(1), max_queue=2, clock=clock)
    fb.Rate(limit=1, per=1.0, burst=2)
    fb.retry(on=ValueError, attempts=2)
    with pytest.raises(
        TypeError, match=r"missing 1 required positional argument: 'max_concurrent'"
    ):
        fb.Bulkhead(max_wait=1.0)


def test_no_public_callable_is_left_unclassified(fb: Any) -> None:
    # every name in NOT_CHECKED still exists and takes keywords (else the entry is stale)
    for name in NOT_CHECKED:
        assert _keyword_params(getattr(fb, name)), name
