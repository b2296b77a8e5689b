"""The C-level API: what a downstream Cython extension can cimport and call without the GIL.

``client`` is ``capi_ext/fb_capi_client.pyx`` compiled at test time against the installed package,
exactly as third-party code would be (``cimport fastbreaker._breaker_c``, headers from the package
folder). The C API keeps the Python API's rules (generations, probes, stale outcomes): these tests
drive it with explicit times and read the result back through the Python objects.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys
import types
from typing import Any

import pytest

import capi_ext
import fastbreaker

pytestmark = [
    pytest.mark.skipif(not fastbreaker.COMPILED, reason="the C API needs the compiled core"),
]
needs_cc = pytest.mark.skipif(not capi_ext.have_compiler(), reason="no Cython or no C compiler")

CLOSED, OPEN, HALF_OPEN, ISOLATED = 0, 1, 2, 3
SECOND = 10**9
T0 = 1_000 * SECOND


@pytest.fixture(scope="session")
def client(tmp_path_factory: pytest.TempPathFactory) -> types.ModuleType:
    return capi_ext.cached("client", tmp_path_factory)


@pytest.fixture
def C(client: Any) -> types.SimpleNamespace:
    return types.SimpleNamespace(**client.CONSTANTS)


def info(
    probe: bool = False, changed: bool = False, old: int = 0, new: int = 0, gen: int = 0
) -> tuple:
    return (probe, changed, old, new, gen)


# -- what ships ------------------------------------------------------------------------------------
def test_pxd_and_headers_ship_with_the_package() -> None:
    pkg = capi_ext.package_dir()
    for name in ("_breaker_c.pxd", "_budget_c.pxd", "_fb_breaker.h", "_fb_atomic.h"):
        assert (pkg / name).is_file(), f"{name} is missing from {pkg}"


def test_entry_points_are_noexcept_nogil_and_the_breaker_is_opaque() -> None:
    text = (capi_ext.package_dir() / "_breaker_c.pxd").read_text(encoding="utf-8")
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    decls = re.findall(r"^cdef [^\n]*?\b(fb_breaker_\w+)\(([^)]*)\)([^:\n]*)", code, flags=re.M)
    names = {name for name, _, _ in decls}
    assert {
        "fb_breaker_acquire",
        "fb_breaker_release",
        "fb_breaker_state",
        "fb_breaker_acquire_ex",
        "fb_breaker_release_ex",
        "fb_breaker_handle",
    } <= names
    for name, _, tail in decls:
        # these take Python objects and hold the GIL; every other entry point is nogil
        if name not in ("fb_breaker_handle", "fb_breaker_call", "fb_breaker_record"):
            assert "noexcept nogil" in tail, name
    # downstream code sees no field of the breaker: its layout may change between releases
    assert re.search(r"ctypedef struct fb_breaker_t:\s*\n\s*pass\b", code)


# -- the breaker through the C API ------------------------------------------------------------------
@needs_cc
def test_handle_accepts_only_compiled_breakers(client: Any) -> None:
    from fastbreaker import _breaker_py

    assert client.handle(fastbreaker.CircuitBreaker()) != 0
    for wrong in (None, object(), _breaker_py.CircuitBreaker(), fastbreaker.RetryBudget()):
        with pytest.raises(TypeError, match="compiled fastbreaker.CircuitBreaker"):
            client.handle(wrong)


@needs_cc
def test_closed_permits_and_outcomes_show_in_python_metrics(client: Any, C: Any) -> None:
    breaker = fastbreaker.CircuitBreaker(failure_threshold=3)
    permits = [client.acquire_ex(breaker)[0] for _ in range(4)]
    assert permits == [0, 0, 0, 0]  # generation 0, CLOSED
    assert client.acquire_ex(breaker) == (0, info())
    for outcome in (C.FB_SUCCESS, C.FB_SLOW, C.FB_FAILURE, C.FB_NEUTRAL):
        assert client.release(breaker, 0, outcome) == 0
    m = breaker.metrics()
    assert (m.permitted, m.successes, m.slow_calls, m.failures, m.ignored) == (5, 2, 1, 1, 1)
    assert m.consecutive_failures == 2  # in consecutive mode a slow call counts as a failure
    assert client.state(breaker) == CLOSED and breaker.state == fastbreaker.State.CLOSED


@needs_cc
def test_trip_probe_and_close_follow_the_generation_rules(client: Any, C: Any) -> None:
    clock = fastbreaker.testing.FakeClock(T0)
    breaker = fastbreaker.CircuitBreaker(failure_threshold=2, reset_timeout=1.0, clock=clock)
    fired: list[tuple[Any, Any]] = []
    breaker.on_state_change(lambda b, old, new: fired.append((old, new)))

    p1 = client.acquire(breaker, T0)
    p2 = client.acquire(breaker, T0)
    late = client.acquire(breaker, T0)
    assert client.release_ex(breaker, p1, C.FB_FAILURE, T0) == (0, info())
    # the failure that crosses the threshold makes the trip, and says so
    assert client.release_ex(breaker, p2, C.FB_FAILURE, T0) == (
        0,
        info(False, True, CLOSED, OPEN, 1),
    )
    assert breaker.state == fastbreaker.State.OPEN and client.state(breaker) == OPEN
    assert breaker.metrics().opened == 1

    assert client.acquire_ex(breaker, T0 + SECOND // 2) == (C.FB_REJECTED, info())
    # the open period is over: the first caller becomes the probe of generation 2
    probe, got = client.acquire_ex(breaker, T0 + SECOND)
    assert (probe, got) == (2, info(True, True, OPEN, HALF_OPEN, 2))
    assert client.acquire_ex(breaker, T0 + SECOND) == (
        C.FB_REJECTED,
        info(),
    )  # half_open_max_calls=1
    # an outcome from generation 0 is stale: counted, and changes nothing
    assert client.release_ex(breaker, late, C.FB_FAILURE, T0 + SECOND) == (0, info())
    assert breaker.metrics().stale == 1 and client.state(breaker) == HALF_OPEN
    assert client.release_ex(breaker, probe, C.FB_SUCCESS, T0 + SECOND) == (
        0,
        info(False, True, HALF_OPEN, CLOSED, 3),
    )
    assert client.acquire_ex(breaker, T0 + SECOND) == (3, info())
    m = breaker.metrics()
    assert (m.permitted, m.rejected, m.failures, m.successes, m.stale) == (5, 2, 2, 1, 1)
    # the C API does not run Python callbacks (documented): nothing fired
    assert fired == []


@needs_cc
def test_probe_rules_match_the_python_api(client: Any, C: Any) -> None:
    clock = fastbreaker.testing.FakeClock(T0)
    breaker = fastbreaker.CircuitBreaker(
        failure_threshold=1,
        reset_timeout=1.0,
        half_open_max_calls=2,
        success_threshold=2,
        probe_timeout=5.0,
        clock=clock,
    )
    breaker.trip()  # at T0, through the Python API
    now = T0 + SECOND
    a, got_a = client.acquire_ex(breaker, now)
    b, got_b = client.acquire_ex(breaker, now)
    assert got_a == info(True, True, OPEN, HALF_OPEN, 2) and got_b == info(
        True, False, HALF_OPEN, HALF_OPEN, 2
    )
    assert a == b == 2
    assert client.acquire(breaker, now) == C.FB_REJECTED
    # a neutral outcome gives the probe slot back without counting
    assert client.release_ex(breaker, a, C.FB_NEUTRAL, now) == (0, info())
    c = client.acquire(breaker, now)
    assert c == 2
    # a success below success_threshold frees its slot; the second success closes
    assert client.release_ex(breaker, b, C.FB_SUCCESS, now) == (0, info())
    assert client.release_ex(breaker, c, C.FB_SUCCESS, now) == (
        0,
        info(False, True, HALF_OPEN, CLOSED, 3),
    )
    m = breaker.metrics()
    assert (m.ignored, m.successes, m.state) == (1, 2, fastbreaker.State.CLOSED)


@needs_cc
def test_a_failed_probe_reopens_and_a_lost_probe_is_reclaimed(client: Any, C: Any) -> None:
    clock = fastbreaker.testing.FakeClock(T0)
    breaker = fastbreaker.CircuitBreaker(
        failure_threshold=1, reset_timeout=1.0, probe_timeout=2.0, clock=clock
    )
    breaker.trip()
    probe = client.acquire(breaker, T0 + SECOND)
    assert client.release_ex(breaker, probe, C.FB_FAILURE, T0 + SECOND) == (
        0,
        info(False, True, HALF_OPEN, OPEN, 3),
    )
    lost = client.acquire(breaker, T0 + 2 * SECOND)  # never reported back
    assert lost == 4 and client.state(breaker) == HALF_OPEN
    # after probe_timeout the next caller reclaims it: every outstanding probe counts as failed
    assert client.acquire_ex(breaker, T0 + 4 * SECOND) == (
        C.FB_REJECTED,
        info(False, True, HALF_OPEN, OPEN, 5),
    )
    assert breaker.metrics().opened == 3
    assert client.release(breaker, lost, C.FB_SUCCESS, T0 + 4 * SECOND) == 0
    assert breaker.metrics().stale == 1 and client.state(breaker) == OPEN


@needs_cc
def test_a_python_clock_needs_the_callers_time(client: Any, C: Any) -> None:
    clock = fastbreaker.testing.FakeClock(T0)
    breaker = fastbreaker.CircuitBreaker(failure_threshold=1, reset_timeout=1.0, clock=clock)
    p = client.acquire(breaker, -1)  # CLOSED never needs the time
    assert p == 0
    assert client.release_ex(breaker, p, C.FB_FAILURE, -1) == (C.FB_NEED_CLOCK, info())
    assert breaker.metrics().failures == 0  # nothing recorded
    assert client.release(breaker, p, C.FB_FAILURE, T0) == 0
    assert client.acquire(breaker, -1) == C.FB_NEED_CLOCK
    # the C clock is read only when the breaker has no Python clock
    own = fastbreaker.CircuitBreaker(failure_threshold=1, reset_timeout=60)
    client.release(own, client.acquire(own), C.FB_FAILURE)
    assert client.acquire(own) == C.FB_REJECTED and own.retry_after > 59


@needs_cc
def test_acquire_closed_admits_only_in_closed_and_never_moves_the_state(
    client: Any, C: Any
) -> None:
    clock = fastbreaker.testing.FakeClock(T0)
    breaker = fastbreaker.CircuitBreaker(failure_threshold=1, reset_timeout=1.0, clock=clock)
    assert client.acquire_closed(breaker) == 0
    breaker.trip()
    clock.advance(10)  # the open period is long over: a probe could pass, but not through here
    assert client.acquire_closed(breaker) == C.FB_REJECTED
    assert client.state(breaker) == OPEN
    assert breaker.allow() and client.state(breaker) == HALF_OPEN  # the full path makes the probe
    m = breaker.metrics()
    # its refusal is not a rejection: the caller is expected to go on to the full path
    assert (m.permitted, m.rejected) == (2, 0)


@needs_cc
def test_unknown_outcome_counts_as_failure_and_isolation_rejects(client: Any, C: Any) -> None:
    breaker = fastbreaker.CircuitBreaker(failure_threshold=10)
    client.release(breaker, client.acquire(breaker), 99)
    assert breaker.metrics().failures == 1
    breaker.isolate()
    assert client.acquire(breaker) == C.FB_REJECTED and client.state(breaker) == ISOLATED


# -- the retry budget through the C API -------------------------------------------------------------
@needs_cc
def test_budget_handle_accepts_only_compiled_budgets(client: Any) -> None:
    from fastbreaker import _budget_py

    for wrong in (None, object(), _budget_py.RetryBudget(), fastbreaker.CircuitBreaker()):
        with pytest.raises(TypeError, match="compiled fastbreaker.RetryBudget"):
            client.budget_take(wrong)


@needs_cc
def test_budget_take_and_deposit(client: Any) -> None:
    budget = fastbreaker.RetryBudget(ratio=0.5, capacity=2.0, min_per_sec=0.0)
    assert [client.budget_take(budget) for _ in range(3)] == [1, 1, 0]
    client.budget_deposit(budget, 2)
    assert budget.tokens == 1.0
    assert client.budget_take(budget) == 1 and client.budget_take(budget) == 0
    client.budget_deposit(budget, 10)
    assert budget.tokens == 2.0  # capped at capacity


@needs_cc
def test_budget_accrual_uses_the_given_time(client: Any) -> None:
    clock = fastbreaker.testing.FakeClock(T0)
    budget = fastbreaker.RetryBudget(ratio=0.0, capacity=5.0, min_per_sec=1.0, clock=clock)
    assert sum(client.budget_take(budget, T0) for _ in range(6)) == 5
    assert client.budget_take(budget, -1) == 0  # a Python clock cannot be read without the GIL
    assert client.budget_take(budget, T0 + SECOND) == 1  # one second: one token
    assert client.budget_take(budget, T0 + SECOND) == 0


# -- the cost of the entry points (printed; figures come from benchmarks, not asserted) ------------
@needs_cc
def test_entry_point_cost_loop_runs(client: Any) -> None:
    costs = client.bench(
        fastbreaker.CircuitBreaker(), fastbreaker.RetryBudget(capacity=1e9), 200_000
    )
    print("\n[C API ns per call]", {k: round(v, 2) for k, v in costs.items() if k != "sink"})
    assert all(v > 0 for k, v in costs.items() if k != "sink")


# -- the atomics header on every compiler at hand ---------------------------------------------------
CHECK_C = pathlib.Path(capi_ext.__file__).with_name("atomics_check.c")


def _compile_and_run(cmd: list[str], exe: pathlib.Path) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout + out.stderr


@pytest.mark.parametrize("cc", ["gcc", "clang"])
@pytest.mark.parametrize("std", ["c99", "c11"])
@pytest.mark.parametrize("racy", [False, True], ids=["atomic", "racy"])
def test_atomics_header_compiles_strictly(
    cc: str, std: str, racy: bool, tmp_path: pathlib.Path
) -> None:
    if shutil.which(cc) is None:
        pytest.skip(f"{cc} is not installed")
    if os.name == "nt":
        pytest.skip("Windows: the platform-compiler test below covers MSVC")
    exe = tmp_path / "atomics_check"
    cmd = [
        cc,
        f"-std={std}",
        "-pedantic",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-O2",
        f"-I{capi_ext.package_dir()}",
        str(CHECK_C),
        "-o",
        str(exe),
    ]
    if racy:
        cmd.insert(1, "-DFB_RACY_FOR_TESTS=1")
    try:
        _compile_and_run(cmd, exe)
    except subprocess.CalledProcessError as exc:
        pytest.fail(f"{' '.join(cmd)}\n{exc.stdout}\n{exc.stderr}")


@needs_cc
def test_atomics_header_with_the_platform_compiler(tmp_path: pathlib.Path) -> None:
    """The compiler that builds extensions here (MSVC on Windows) compiles and runs the check."""
    try:
        from setuptools._distutils.ccompiler import new_compiler
        from setuptools._distutils.sysconfig import customize_compiler
    except ImportError:  # pragma: no cover - older setuptools
        from distutils.ccompiler import new_compiler  # type: ignore[no-redef]
        from distutils.sysconfig import customize_compiler  # type: ignore[no-redef]

    compiler = new_compiler()
    customize_compiler(compiler)
    objs = compiler.compile(
        [str(CHECK_C)], output_dir=str(tmp_path), include_dirs=[str(capi_ext.package_dir())]
    )
    compiler.link_executable(objs, "atomics_check", output_dir=str(tmp_path))
    exe = tmp_path / ("atomics_check.exe" if os.name == "nt" else "atomics_check")
    out = subprocess.run([str(exe)], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout + out.stderr


# -- free-threaded builds --------------------------------------------------------------------------
@needs_cc
@pytest.mark.skipif(not getattr(sys, "_is_gil_enabled", None), reason="needs CPython 3.13+")
def test_importing_everything_keeps_the_gil_disabled(client: Any) -> None:
    import sysconfig

    if not sysconfig.get_config_var("Py_GIL_DISABLED"):
        pytest.skip("not a free-threaded build")
    code = (
        "import sys, fastbreaker, fastbreaker._breaker_c, fastbreaker._budget_c, fastbreaker.bench._floor_c\n"
        f"sys.path.insert(0, {str(pathlib.Path(client.__file__).parent)!r})\n"
        "import fb_capi_client\n"
        "print(sys._is_gil_enabled())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHON_GIL"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False", out.stdout + out.stderr
    assert "GIL" not in out.stderr, out.stderr  # no "enabling the GIL" warning from any module
