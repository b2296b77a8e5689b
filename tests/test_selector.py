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


def run(env_extra):
    import fastbreaker

    env = {k: v for k, v in os.environ.items() if k != "FASTBREAKER_NO_EXTENSIONS"}
    # the same fastbreaker this test session imports (installed or from src/)
    src = os.path.dirname(os.path.dirname(fastbreaker.__file__))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
    env.update(env_extra)
    out = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


@pytest.mark.skipif(
    platform.python_implementation() != "CPython" or bool(os.environ.get("FASTBREAKER_NO_EXTENSIONS")),
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


def test_public_names(fb):
    assert [s.name for s in fb.State] == ["CLOSED", "OPEN", "HALF_OPEN", "ISOLATED"]
    assert issubclass(fb.State, int)
    assert issubclass(fb.CircuitOpenError, fb.BreakerError)
    assert issubclass(fb.BreakerError, Exception)
    assert issubclass(fb.DeadlineExceeded, fb.BreakerError)
    assert issubclass(fb.DeadlineExceeded, TimeoutError)
