"""Which core `import fastbreaker` picks."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import fastbreaker

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
    not fastbreaker.COMPILED,
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
    if expect == "compiled" and not fastbreaker.COMPILED:
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
            if f.endswith((".py", ".pyx", ".pxd", ".pxi")):
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


# What FASTBREAKER_NO_EXTENSIONS may say: every spelling, and what it selects.
TWIN_VALUES = ["1", "true", "yes", "on", "TRUE", " Yes ", "On"]
COMPILED_VALUES = ["", "0", "false", "no", "off", "False", " NO ", "OFF"]
BAD_VALUES = ["2", "maybe", "ture", "y", "-1", "1.0", "enable"]


def setup_py_no_extensions():
    """setup.py's copy of the rule, read from its source (setup.py cannot be imported: it runs
    the build)."""
    import ast

    import fastbreaker

    path = os.path.join(os.path.dirname(fastbreaker.__file__), "..", "..", "setup.py")
    if not os.path.exists(path):
        pytest.skip("setup.py is not beside this fastbreaker (an installed package)")
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    node = next(n for n in ast.parse(text).body if getattr(n, "name", None) == "no_extensions")
    namespace: dict = {}
    exec(compile(ast.Module(body=[node], type_ignores=[]), path, "exec"), namespace)
    return ast.get_source_segment(text, node), namespace["no_extensions"]


def test_the_rule_reads_every_spelling():
    from fastbreaker._select import no_extensions

    assert [no_extensions(v) for v in TWIN_VALUES] == [True] * len(TWIN_VALUES)
    assert [no_extensions(v) for v in COMPILED_VALUES] == [False] * len(COMPILED_VALUES)
    assert no_extensions(None) is False
    for value in BAD_VALUES:
        with pytest.raises(ValueError, match=r"FASTBREAKER_NO_EXTENSIONS must be 1, true, yes"):
            no_extensions(value)


def test_setup_py_follows_the_same_rule():
    import inspect

    from fastbreaker import _select

    text, setup_rule = setup_py_no_extensions()
    assert text == inspect.getsource(_select.no_extensions).rstrip()
    for value in [None, *TWIN_VALUES, *COMPILED_VALUES, *BAD_VALUES]:
        try:
            expected = _select.no_extensions(value)
        except ValueError as exc:
            with pytest.raises(ValueError) as got:
                setup_rule(value)
            assert str(got.value) == str(exc)
        else:
            assert setup_rule(value) is expected, value


@pytest.mark.parametrize(
    "value, expect",
    [("0", "compiled"), ("off", "compiled"), ("yes", "twin"), ("false", "compiled")],
)
def test_the_environment_variable_selects_by_its_value(value, expect):
    if expect == "compiled" and not fastbreaker.COMPILED:
        pytest.skip("needs the compiled core (a pure-Python build has no extension to select)")
    compiled, _, breaker_mod, _ = run({"FASTBREAKER_NO_EXTENSIONS": value})
    assert (compiled, breaker_mod) == (
        ("True", "fastbreaker._breaker_c")
        if expect == "compiled"
        else ("False", "fastbreaker._breaker_py")
    )


def test_an_unknown_value_is_an_error_naming_the_accepted_ones():
    import fastbreaker

    env = {k: v for k, v in os.environ.items() if k != "FASTBREAKER_NO_EXTENSIONS"}
    src = os.path.dirname(os.path.dirname(fastbreaker.__file__))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
    env["FASTBREAKER_NO_EXTENSIONS"] = "ture"
    out = subprocess.run(
        [sys.executable, "-c", "import fastbreaker"], env=env, capture_output=True, text=True
    )
    assert out.returncode != 0
    assert (
        "ValueError: FASTBREAKER_NO_EXTENSIONS must be 1, true, yes or on (the pure-Python twin) "
        "or 0, false, no, off or empty (the compiled core), got 'ture'"
    ) in out.stderr
