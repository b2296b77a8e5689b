"""``inspect.signature()`` and ``help()`` work for every public name, the same on both cores.

A cdef class gets no signature from Cython (``embedsignature``, set in ``setup.py``, covers its
methods): each compiled class carries a ``__signature__`` built from the parameters written
once beside its twin, and the tests below keep it equal to the twin's.
"""

from __future__ import annotations

import importlib
import inspect
import pydoc
import types
from typing import Any

import pytest

import fastbreaker

IMPLS = fastbreaker.testing.implementations()


def public_callables(ns: types.SimpleNamespace) -> list[tuple[str, Any]]:
    return [(n, getattr(ns, n)) for n in fastbreaker.__all__ if callable(getattr(ns, n))]


def test_every_public_callable_has_a_signature(fb: types.SimpleNamespace) -> None:
    names = []
    for name, obj in public_callables(fb):
        sig = inspect.signature(obj)  # ValueError for a class without one
        names.append(name)
        if name != "Degraded":  # a Protocol: never constructed
            # what __new__ or __cinit__ take is not what a user passes
            assert [p.kind for p in sig.parameters.values()] != [
                inspect.Parameter.VAR_POSITIONAL,
                inspect.Parameter.VAR_KEYWORD,
            ], name
    assert {"Bulkhead", "RateLimiter", "CircuitOpenError", "retry", "Attempt"} <= set(names)


@pytest.mark.skipif("c" not in IMPLS, reason="the compiled core is not in use")
def test_compiled_signatures_equal_the_twins() -> None:
    twin = dict(public_callables(IMPLS["python"]))
    differ = {}
    for name, obj in public_callables(IMPLS["c"]):
        ours, theirs = inspect.signature(obj), inspect.signature(twin[name])
        if ours != theirs:  # names, kinds, defaults, annotations, return annotation
            differ[name] = (str(ours), str(theirs))
    assert not differ, differ


def test_a_twin_class_signature_is_its_init() -> None:
    # the parameters written for the compiled classes cannot drift from the twins' code
    checked = []
    for name, cls in public_callables(IMPLS["python"]):
        init = vars(cls).get("__init__")
        if not inspect.isclass(cls) or not inspect.isfunction(init):
            continue
        params = list(inspect.signature(init).parameters.values())[1:]
        if [p.kind for p in params] == [
            inspect.Parameter.VAR_POSITIONAL,
            inspect.Parameter.VAR_KEYWORD,
        ]:
            continue  # CircuitBreaker, BreakerMap: the options' signature, from BreakerOptions
        assert list(inspect.signature(cls).parameters.values()) == params, name
        checked.append(name)
    assert {"Bulkhead", "AdaptiveLimiter", "RateLimiter", "RateLimiterMap", "RetryBudget"} <= set(
        checked
    )


def test_exceptions_show_the_arguments_they_keep(fb: types.SimpleNamespace) -> None:
    sig = inspect.signature(fb.CircuitOpenError)
    assert list(sig.parameters) == ["name", "state", "retry_after"]
    assert {p.kind for p in sig.parameters.values()} == {inspect.Parameter.POSITIONAL_ONLY}
    err = fb.CircuitOpenError(*sig.bind("db", fb.State.OPEN, 1.5).args)
    assert (err.name, err.retry_after) == ("db", 1.5)
    assert str(inspect.signature(fb.DeadlineExceeded)) == "(*args: 'object')"


# Compiled methods: signatures from embedsignature (the CPython text-signature format).
METHODS = [
    ("fastbreaker._breaker_c", "CircuitBreaker", "allow", ["self"]),
    ("fastbreaker._breaker_c", "CircuitBreaker", "record_success", ["self", "elapsed"]),
    ("fastbreaker._budget_c", "RetryBudget", "allow_retry", ["self"]),
    ("fastbreaker._map_c", "BreakerMap", "allow", ["self", "key"]),
]
compiled_only = pytest.mark.skipif("c" not in IMPLS, reason="checks the compiled classes")


def _cls(module: str, name: str) -> Any:
    return getattr(importlib.import_module(module), name)


@compiled_only
@pytest.mark.parametrize(("module", "name", "method", "params"), METHODS)
def test_compiled_methods_have_signatures(
    module: str, name: str, method: str, params: list[str]
) -> None:
    sig = inspect.signature(getattr(_cls(module, name), method))
    assert list(sig.parameters) == params


@compiled_only
@pytest.mark.parametrize("module, name", sorted({(m, n) for m, n, _, _ in METHODS}))
def test_help_shows_the_class_and_its_method_signatures(module: str, name: str) -> None:
    text = pydoc.render_doc(_cls(module, name), renderer=pydoc.plaintext)
    assert f"class {name}" in text
    doc = inspect.getdoc(_cls(module, name))
    assert doc and doc.splitlines()[0] in text
    assert "(self, /" in text  # method signatures from embedsignature, not "(...)"
