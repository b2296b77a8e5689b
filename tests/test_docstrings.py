"""Every public class, function, method and property has a docstring, and a callable's docstring
names each of its parameters (the API reference is generated from them).

Checked on the pure-Python twins, which are the specification and what the site documents:
``fastbreaker.__all__`` bound to the ``python`` core (``testing.implementations()``), and the
public submodules ``fastbreaker.testing``, ``fastbreaker.contrib.*`` and ``fastbreaker.compat.*``.
A class's parameters (those of its ``__init__``, or its fields for a named tuple or dataclass)
may be described in the class docstring or in ``__init__``'s.
"""

from __future__ import annotations

import enum
import importlib
import inspect
import re
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import fastbreaker

SUBMODULES = [
    "fastbreaker.testing",
    "fastbreaker.contrib.httpx",
    "fastbreaker.contrib.asgi",
    "fastbreaker.contrib.prometheus",
    "fastbreaker.contrib.otel",
    "fastbreaker.contrib.redis",
    "fastbreaker.contrib.limits",
    "fastbreaker.compat.pybreaker",
    "fastbreaker.compat.circuitbreaker",
]
#: what a module's docstring or the class docstring covers: protocol methods users do not call
SKIP_METHODS = {"__enter__", "__exit__", "__aenter__", "__aexit__", "__iter__", "__aiter__"}


def public_names(module: types.ModuleType) -> list[str]:
    names = getattr(module, "__all__", None)
    if names is None:  # compat.circuitbreaker mirrors a module that has no __all__
        names = [
            n
            for n, v in vars(module).items()
            if not n.startswith("_") and getattr(v, "__module__", None) == module.__name__
        ]
    return list(names)


def public_objects() -> Iterator[tuple[str, Any]]:
    twin = fastbreaker.testing.implementations()["python"]
    for name in fastbreaker.__all__:
        obj = getattr(twin, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            yield f"fastbreaker.{name}", obj
    for modname in SUBMODULES:
        try:
            module = importlib.import_module(modname)
        except ImportError:  # an optional dependency is missing: its tests skip too
            continue
        for name in public_names(module):
            obj = getattr(module, name)
            if inspect.isclass(obj) or inspect.isfunction(obj):
                yield f"{modname}.{name}", obj


def ours(obj: object) -> bool:
    return (getattr(obj, "__module__", None) or "").startswith("fastbreaker")


def parameters(fn: Callable[..., Any]) -> list[str]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    return [p for p in sig.parameters if p not in ("self", "cls")]


def missing(doc: str | None, names: list[str]) -> list[str]:
    if not doc or not doc.strip():
        return ["(no docstring)"]
    return [n for n in names if not re.search(rf"(?<![\w]){re.escape(n)}(?![\w])", doc)]


def class_parameters(cls: type) -> tuple[list[str], str]:
    """The parameters a class is made with, and the docstrings that may describe them."""
    fields = getattr(cls, "_fields", None) or list(getattr(cls, "__dataclass_fields__", {}))
    docs = inspect.getdoc(cls) or ""
    init = next((k.__dict__["__init__"] for k in cls.__mro__ if "__init__" in k.__dict__), None)
    if init is not None and inspect.isfunction(init) and ours(init):
        docs += "\n" + (init.__doc__ or "")
        return parameters(cls), docs
    if fields:
        return list(fields), docs
    return [], docs


def problems_of(qualname: str, obj: Any) -> Iterator[str]:
    if not inspect.isclass(obj):
        for name in missing(obj.__doc__, parameters(obj)):
            yield f"{qualname}: {name}"
        return
    if not (inspect.getdoc(obj) or "").strip():
        yield f"{qualname}: (no class docstring)"
    if issubclass(obj, (enum.Enum, BaseException)):
        params: list[str] = []
        docs = obj.__doc__ or ""
    else:
        params, docs = class_parameters(obj)
    for name in missing(docs, params):
        yield f"{qualname}(): {name}"
    seen: set[str] = set()
    for klass in obj.__mro__:
        if not ours(klass) or klass is object:
            continue
        for attr, value in vars(klass).items():
            if attr in seen or attr in SKIP_METHODS:
                continue
            seen.add(attr)
            if attr.startswith("_") and attr != "__call__":
                continue
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            if isinstance(value, property):
                if not (value.__doc__ or "").strip():
                    yield f"{qualname}.{attr}: (no docstring)"
            elif inspect.isfunction(value):
                for name in missing(value.__doc__, parameters(value)):
                    yield f"{qualname}.{attr}: {name}"


def test_every_public_object_is_documented() -> None:
    checked = dict(public_objects())
    assert "fastbreaker.CircuitBreaker" in checked and "fastbreaker.testing.FakeClock" in checked
    assert checked["fastbreaker.CircuitBreaker"].__module__ == "fastbreaker._breaker_py"
    problems = [p for qualname, obj in checked.items() for p in problems_of(qualname, obj)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    "doc, ok", [("Take ``fn`` and ``timeout``.", True), ("Take fn_x and timeouts.", False)]
)
def test_the_checker_matches_whole_names(doc: str, ok: bool) -> None:
    assert (missing(doc, ["fn", "timeout"]) == []) is ok
