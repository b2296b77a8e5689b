"""Which core `import fastbreaker` picks."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

CODE = (
    "import fastbreaker as fb; "
    "print(fb.COMPILED, type(fb.CircuitBreaker).__module__, fb.CircuitBreaker.__module__, "
    "fb.RetryBudget.__module__)"
)
# What the test suite and every other module see: they must agree with `import fastbreaker`.
CODE_ALL = (
    "import fastbreaker as fb, fastbreaker.testing as t, sys; "
    "print(fb.COMPILED, fb.CircuitBreaker.__module__, fb.RetryBudget.__module__, "
    "fb.BreakerMap.__module__, ','.join(t.implementations()), "
    "any(m.endswith('_c') for m in sys.modules if m.startswith('fastbreaker.')))"
)
# An interpreter other than CPython, simulated: platform reports PyPy before fastbreaker loads.
NOT_CPYTHON = "import platform; platform.python_implementation = lambda: 'PyPy'; "


def run(env_extra, code=CODE):
    import fastbreaker

    env = {k: v for k, v in os.environ.items() if k != "FASTBREAKER_NO_EXTENSIONS"}
    # the same fastbreaker this test session imports (installed or from src/)
    src = os.path.dirname(os.path.dirname(fastbreaker.__file__))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
    env.update(env_extra)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


@pytest.mark.skipif(
    platform.python_implementation() != "CPython"
    or bool(os.environ.get("FASTBREAKER_NO_EXTENSIONS")),
    reason="the compiled core is the default on CPython builds with extensions",
)
def test_plain_import_uses_compiled_core():
    compiled, _, breaker_mod, budget_mod = run({})
    assert compiled == "True"
    assert breaker_mod == "fastbreaker._breaker_c"
    assert budget_mod == "fastbreaker._budget_c"


def test_env_var_selects_pure_python_twin():
    compiled, _, breaker_mod, budget_mod = run({"FASTBREAKER_NO_EXTENSIONS": "1"})
    assert compiled == "False"
    assert breaker_mod == "fastbreaker._breaker_py"
    assert budget_mod == "fastbreaker._budget_py"


@pytest.mark.parametrize(
    "env, prefix, expect",
    [
        ({}, "", "compiled"),
        ({"FASTBREAKER_NO_EXTENSIONS": "1"}, "", "twin"),
        ({}, NOT_CPYTHON, "twin"),
    ],
    ids=["default", "env-var", "not-cpython"],
)
def test_every_place_agrees_on_the_core(env, prefix, expect):
    if expect == "compiled" and (
        platform.python_implementation() != "CPython" or os.environ.get("FASTBREAKER_NO_EXTENSIONS")
    ):
        pytest.skip("the compiled core is the default on CPython builds with extensions")
    compiled, breaker_mod, budget_mod, map_mod, impls, any_c = run(env, prefix + CODE_ALL)
    if expect == "compiled":
        assert (compiled, impls, any_c) == ("True", "c,python", "True")
        assert (breaker_mod, budget_mod, map_mod) == (
            "fastbreaker._breaker_c",
            "fastbreaker._budget_c",
            "fastbreaker._map_c",
        )
    else:
        # the twin everywhere, the test helpers included, and no compiled module even imported
        assert (compiled, impls, any_c) == ("False", "python", "False")
        assert (breaker_mod, budget_mod, map_mod) == (
            "fastbreaker._breaker_py",
            "fastbreaker._budget_py",
            "fastbreaker._map_py",
        )


def test_the_environment_variable_is_read_in_one_module():
    import fastbreaker

    pkg = os.path.dirname(fastbreaker.__file__)
    readers = []
    for root, _, files in os.walk(pkg):
        for f in files:
            if f.endswith((".py", ".pyx", ".pxd")):
                path = os.path.join(root, f)
                with open(path, encoding="utf-8") as fh:
                    text = fh.read()
                if "os.environ" in text and "FASTBREAKER_NO_EXTENSIONS" in text:
                    readers.append(os.path.relpath(path, pkg))
                if "python_implementation()" in text and '== "CPython"' in text:
                    readers.append(os.path.relpath(path, pkg))
    assert sorted(set(readers)) == ["_select.py"]


def test_public_names(fb):
    assert [s.name for s in fb.State] == ["CLOSED", "OPEN", "HALF_OPEN", "ISOLATED"]
    assert issubclass(fb.State, int)
    assert issubclass(fb.CircuitOpenError, fb.BreakerError)
    assert issubclass(fb.BreakerError, Exception)
    assert issubclass(fb.DeadlineExceeded, fb.BreakerError)
    assert issubclass(fb.DeadlineExceeded, TimeoutError)
