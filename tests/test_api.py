"""The API a user meets: what ``dir(fastbreaker)`` lists and the types public functions return."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Iterator
from typing import Any

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
