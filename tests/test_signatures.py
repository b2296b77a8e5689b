"""The compiled classes document themselves: ``help()`` and ``inspect.signature()`` work on them.

Signatures come from ``embedsignature`` (set in ``setup.py``, in the CPython text-signature
format), so that ``help(fb.CircuitBreaker.call)`` shows the arguments of a compiled method.
"""

from __future__ import annotations

import importlib
import inspect
import pydoc
from typing import Any

import pytest

import fastbreaker

pytestmark = pytest.mark.skipif(not fastbreaker.COMPILED, reason="checks the compiled classes")

# (module, class, a method and its parameters as inspect reports them)
CLASSES = [
    ("fastbreaker._breaker_c", "CircuitBreaker", "allow", ["self"]),
    ("fastbreaker._breaker_c", "CircuitBreaker", "record_success", ["self", "elapsed"]),
    ("fastbreaker._budget_c", "RetryBudget", "allow_retry", ["self"]),
    ("fastbreaker._map_c", "BreakerMap", "allow", ["self", "key"]),
]


def _cls(module: str, name: str) -> Any:
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize(("module", "name", "method", "params"), CLASSES)
def test_compiled_methods_have_signatures(
    module: str, name: str, method: str, params: list[str]
) -> None:
    sig = inspect.signature(getattr(_cls(module, name), method))
    assert list(sig.parameters) == params


@pytest.mark.parametrize("module, name", sorted({(m, n) for m, n, _, _ in CLASSES}))
def test_help_shows_the_class_and_its_method_signatures(module: str, name: str) -> None:
    text = pydoc.render_doc(_cls(module, name), renderer=pydoc.plaintext)
    assert f"class {name}" in text
    doc = inspect.getdoc(_cls(module, name))
    assert doc and doc.splitlines()[0] in text
    assert "(self, /" in text  # method signatures from embedsignature, not "(...)"


# A cdef class's constructor signature cannot be embedded by Cython: inspect reads it from a
# `__signature__` class attribute, built from BreakerOptions (where the options are written once).
@pytest.mark.parametrize("module, name", sorted({(m, n) for m, n, _, _ in CLASSES}))
def test_compiled_class_signature(module: str, name: str) -> None:
    sig = inspect.signature(_cls(module, name))
    assert sig.parameters
    twin = {
        "CircuitBreaker": "fastbreaker._breaker_py",
        "BreakerMap": "fastbreaker._map_py",
        "RetryBudget": "fastbreaker._budget_py",
    }[name]
    # the same parameters, defaults and kinds as the twin's constructor
    assert [(p.name, p.kind, p.default) for p in sig.parameters.values()] == [
        (p.name, p.kind, p.default) for p in inspect.signature(_cls(twin, name)).parameters.values()
    ]
