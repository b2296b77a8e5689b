"""RetryBudget on both implementations: deposits, caps, lazy refill, validation, concurrency."""

from __future__ import annotations

import datetime
import math
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
import types
from pathlib import Path
from typing import Any

import pytest

import fastbreaker
from fastbreaker.testing import FakeClock

UNIT = 1_000_000  # fixed-point units per token (both implementations)


class CountingClock(FakeClock):
    """A FakeClock that counts how often it is read."""

    __slots__ = ("reads",)

    def __init__(self, start_ns: int) -> None:
        super().__init__(start_ns)
        self.reads = 0

    def __call__(self) -> int:
        self.reads += 1
        return super().__call__()


def fake_clock() -> FakeClock:
    """A clock of this test's own (the ``clock`` fixture would be shared by the threads of
    pytest-run-parallel, and these tests move time)."""
    return FakeClock(10**12)


def drain(budget: Any) -> int:
    taken = 0
    while budget.allow_retry():
        taken += 1
    return taken


def test_defaults_and_starts_full(fb: types.SimpleNamespace) -> None:
    clock = fake_clock()
    b = fb.RetryBudget(clock=clock)
    assert (b.ratio, b.capacity, b.min_per_sec) == (0.1, 100.0, 1.0)
    assert b.tokens == 100.0
    assert "RetryBudget(ratio=0.1, capacity=100.0, min_per_sec=1.0" in repr(b)


def test_allow_retry_takes_one_token_and_refuses_below_one(fb: types.SimpleNamespace) -> None:
    clock = fake_clock()
    b = fb.RetryBudget(ratio=0.5, capacity=3, min_per_sec=0, clock=clock)
    assert [b.allow_retry() for _ in range(4)] == [True, True, True, False]
    assert b.tokens == 0.0
    b.record_success()
    assert b.tokens == 0.5
    assert b.allow_retry() is False  # half a token is not a retry
    assert b.tokens == 0.5
    b.record_success()
    assert b.allow_retry() is True
    assert b.tokens == 0.0


def test_record_success_deposits_ratio_capped_at_capacity(fb: types.SimpleNamespace) -> None:
    clock = fake_clock()
    b = fb.RetryBudget(ratio=0.25, capacity=2, min_per_sec=0, clock=clock)
    drain(b)
    for expected in (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.0, 2.0):
        b.record_success()
        assert b.tokens == expected
    b2 = fb.RetryBudget(ratio=5, capacity=1.5, min_per_sec=0, clock=clock)
    drain(b2)
    b2.record_success()
    assert b2.tokens == 1.5


def test_record_success_never_reads_the_clock(fb: types.SimpleNamespace) -> None:
    clock = CountingClock(10**12)
    b = fb.RetryBudget(clock=clock)
    before = clock.reads
    for _ in range(100):
        b.record_success()
    assert clock.reads == before
    b.allow_retry()
    assert clock.reads == before + 1  # one read per public call on the retry path


def test_ratio_zero_deposits_nothing(fb: types.SimpleNamespace) -> None:
    clock = fake_clock()
    b = fb.RetryBudget(ratio=0, capacity=1, min_per_sec=0, clock=clock)
    drain(b)
    for _ in range(1000):
        b.record_success()
    assert b.tokens == 0.0
    assert b.allow_retry() is False


def test_lazy_refill_accrues_min_per_sec(fb: types.SimpleNamespace) -> None:
    clock = fake_clock()
    b = fb.RetryBudget(ratio=0, capacity=10, min_per_sec=2, clock=clock)
    assert drain(b) == 10
    clock.advance(0.25)
    assert b.tokens == 0.5
    assert b.allow_retry() is False
    clock.advance(0.25)
    assert b.allow_retry() is True
    assert b.tokens == 0.0
    clock.advance(datetime.timedelta(seconds=1.5))
    assert b.tokens == 3.0


def test_refill_is_capped_and_full_time_is_not_banked(fb: types.SimpleNamespace) -> None:
    clock = fake_clock()
    b = fb.RetryBudget(ratio=0, capacity=5, min_per_sec=1, clock=clock)
    clock.advance(3600)
    assert b.tokens == 5.0  # capped, although an hour accrued
    assert b.allow_retry() is True
    assert b.tokens == 4.0  # the hour spent full was not banked
    clock.advance(0.5)
    assert b.tokens == 4.5


def test_huge_elapsed_time_does_not_overflow(fb: types.SimpleNamespace) -> None:
    clock = FakeClock(0)
    b = fb.RetryBudget(ratio=0, capacity=10**12, min_per_sec=10**6, clock=clock)
    for _ in range(1000):
        b.allow_retry()
    clock.advance(2**62 / 1e9)  # ~146 years
    assert b.tokens == 1e12
    assert b.allow_retry() is True
    clock.advance(0.5)
    assert b.tokens == 1e12  # 999,999,999,999 + 500,000, capped


def test_sub_microsecond_rest_is_credited_later_not_lost(fb: types.SimpleNamespace) -> None:
    clock = fake_clock()
    # 1 token/s is 1 unit per microsecond. 1000 reads 999 ns apart: 999,000 ns elapsed in all.
    b = fb.RetryBudget(ratio=0, capacity=1, min_per_sec=1, clock=clock)
    drain(b)
    for _ in range(1000):
        clock.advance(999e-9)
        b.tokens  # noqa: B018 (reading refills)
    assert b.tokens == 999 / UNIT


def test_clock_going_backwards_credits_nothing(fb: types.SimpleNamespace) -> None:
    now = [5_000_000_000]
    b = fb.RetryBudget(ratio=0, capacity=3, min_per_sec=1, clock=lambda: now[0])
    drain(b)
    now[0] -= 2_000_000_000
    assert b.tokens == 0.0
    now[0] += 2_500_000_000  # 0.5 s after the refill time
    assert b.tokens == 0.5


def test_fractional_options_round_to_fixed_point(fb: types.SimpleNamespace) -> None:
    clock = fake_clock()
    b = fb.RetryBudget(ratio=1e-7, capacity=1.0000004, min_per_sec=1e-7, clock=clock)
    assert b.ratio == 0.0
    assert b.capacity == 1.0
    assert b.min_per_sec == 0.0
    b = fb.RetryBudget(ratio=0.3333333333, capacity=7.5, min_per_sec=0.0000015, clock=clock)
    assert (b.ratio, b.capacity, b.min_per_sec) == (0.333333, 7.5, 0.000002)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"ratio": -0.1}, "ratio"),
        ({"ratio": math.nan}, "ratio"),
        ({"ratio": math.inf}, "ratio"),
        ({"capacity": 0.99}, "capacity"),
        ({"capacity": 0}, "capacity"),
        ({"capacity": math.nan}, "capacity"),
        ({"capacity": 1e13}, "capacity"),
        ({"min_per_sec": -1}, "min_per_sec"),
        ({"min_per_sec": math.inf}, "min_per_sec"),
        ({"min_per_sec": 1e7}, "min_per_sec"),
    ],
)
def test_bad_options_raise_value_error_naming_the_option(
    fb: types.SimpleNamespace, kwargs: dict[str, float], name: str
) -> None:
    with pytest.raises(ValueError, match=rf"^{name} must be in \["):
        fb.RetryBudget(**kwargs)


@pytest.mark.parametrize("kwargs", [{"ratio": "1"}, {"capacity": True}, {"min_per_sec": None}])
def test_bad_option_types_raise_type_error(
    fb: types.SimpleNamespace, kwargs: dict[str, object]
) -> None:
    with pytest.raises(TypeError, match=next(iter(kwargs))):
        fb.RetryBudget(**kwargs)


def test_bad_clocks(fb: types.SimpleNamespace) -> None:
    with pytest.raises(TypeError, match="clock"):
        fb.RetryBudget(clock=5)
    with pytest.raises(TypeError):
        fb.RetryBudget(clock=lambda: 1.5)
    with pytest.raises(
        ValueError, match=r"clock must return an int of nanoseconds in \[0, 2\*\*63 - 1\]"
    ):
        fb.RetryBudget(clock=lambda: -1)
    now = [10]
    b = fb.RetryBudget(clock=lambda: now[0])
    now[0] = -5
    with pytest.raises(ValueError):
        b.allow_retry()
    with pytest.raises(ValueError):
        b.tokens  # noqa: B018


def test_options_are_positional_or_keyword_and_clock_keyword_only(
    fb: types.SimpleNamespace,
) -> None:
    clock = fake_clock()
    b = fb.RetryBudget(0.5, 4, 0, clock=clock)
    assert (b.ratio, b.capacity, b.min_per_sec) == (0.5, 4.0, 0.0)
    with pytest.raises(TypeError):
        fb.RetryBudget(0.5, 4, 0, clock)


def _until_monotonic_passes(ns: int) -> None:
    """Spin until CLOCK_MONOTONIC has moved by ``ns`` (only for tests of the default clock)."""
    end = time.monotonic_ns() + ns
    while time.monotonic_ns() < end:
        pass


def test_default_clock_is_monotonic(fb: types.SimpleNamespace) -> None:
    b = fb.RetryBudget(ratio=0, capacity=1, min_per_sec=10**6)  # one token per microsecond
    assert b.allow_retry() is True
    _until_monotonic_passes(1_000_000)  # the real clock is what is under test here
    assert b.allow_retry() is True
    assert b.tokens <= 1.0


def test_implementations_agree_on_a_scripted_run(fb: types.SimpleNamespace) -> None:
    # The same script on the other implementation gives the same numbers (hypothesis does the
    # general case in test_budget_hypothesis.py); here they are spelled out.
    clock = FakeClock(0)
    b = fb.RetryBudget(ratio=0.3, capacity=2.5, min_per_sec=0.7, clock=clock)
    seen: list[object] = []
    for step in range(40):
        if step % 3 == 0:
            b.record_success()
        seen.append(b.allow_retry())
        clock.advance(0.123457)
        seen.append(b.tokens)
    # 0.7 tokens/s x 123,457 us = 86,419.9 units, floored: 86,419 per step.
    assert seen[:6] == [True, 1.586419, True, 0.672838, False, 0.759257]
    assert seen[-2:] == [False, 0.85676]
    assert sum(1 for s in seen if s is True) == 9


def test_threads_conserve_tokens(fb: types.SimpleNamespace) -> None:
    clock = fake_clock()
    # min_per_sec=0 and a fake clock: deposits - withdrawals == change, exactly.
    b = fb.RetryBudget(ratio=0.1, capacity=100_000, min_per_sec=0, clock=clock)
    for _ in range(50_000):
        b.allow_retry()
    start = b.tokens
    assert start == 50_000.0
    threads, per_thread = 8, 5_000
    taken = [0] * threads
    barrier = threading.Barrier(threads)

    def work(i: int) -> None:
        barrier.wait()
        for k in range(per_thread):
            b.record_success()
            if k % 3 == 0 and b.allow_retry():
                taken[i] += 1

    pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    deposits = threads * per_thread * 100_000  # units
    assert round(b.tokens * UNIT) == start * UNIT + deposits - sum(taken) * UNIT
    assert sum(taken) == threads * len(range(0, per_thread, 3))  # never short of tokens


# --- C only: the nogil entry points, hammered by threads that really run in parallel ---------


def _c_module() -> Any:
    if not fastbreaker.COMPILED:
        pytest.skip("pure-Python build")
    from fastbreaker import _budget_c

    return _budget_c


def hammer_conserves(
    mod: Any, threads: int = 4, deposits: int = 20_000, ratio_units: int = 100_000
) -> tuple[int, int]:
    """Deposits, takes and refills from ``threads`` parallel nogil loops; returns (expected
    final units, actual final units). Equal when every CAS is atomic."""
    clock = FakeClock(0)
    # 1 token/s = 1 unit per microsecond: the refill has no rounding, so the books balance exactly.
    b = mod.RetryBudget(ratio=ratio_units / UNIT, capacity=10_000, min_per_sec=1, clock=clock)
    for _ in range(10_000):
        b.allow_retry()  # empty the bucket (the clock stands still)
    assert b.tokens == 0.0
    takes, step = 6_000, 97  # ns between the takes of one thread
    results = [0] * threads
    barrier = threading.Barrier(threads)

    def work(i: int) -> None:
        barrier.wait()
        results[i] = mod._hammer(b, deposits, takes, 0, step)

    pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    accrued = ((takes - 1) * step) // 1000  # units: every microsecond credited once
    expected = threads * deposits * ratio_units + accrued - sum(results) * UNIT
    # Deposits (8,000 tokens) + accrual stay below capacity: no cap, so nothing may be lost.
    return expected, round(b.tokens * UNIT)


def test_c_hammer_conserves_tokens() -> None:
    mod = _c_module()
    for _ in range(3):
        expected, actual = hammer_conserves(mod)
        assert actual == expected


def test_c_entry_point_without_now_reads_the_c_clock_only_when_it_owns_it() -> None:
    mod = _c_module()
    clock = FakeClock(10**12)
    b = mod.RetryBudget(ratio=0, capacity=1, min_per_sec=10**6, clock=clock)
    assert b.allow_retry() is True
    clock.advance(1)
    # A Python clock cannot be read without the GIL: now < 0 means no accrual.
    assert mod._hammer(b, 0, 1, -1, 0) == 0
    assert mod._hammer(b, 0, 1, clock(), 0) == 1
    c = mod.RetryBudget(ratio=0, capacity=1, min_per_sec=10**6)  # CLOCK_MONOTONIC
    assert c.allow_retry() is True
    _until_monotonic_passes(1_000_000)
    assert mod._hammer(c, 0, 1, -1, 0) == 1


def _build_racy(tmp: Path) -> Any:
    """Compile _budget_c with FB_RACY_FOR_TESTS (a CAS that is not atomic) into ``tmp``."""
    src = Path(__file__).resolve().parents[1] / "src" / "fastbreaker"
    pkg = tmp / "fastbreaker"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name in ("_budget_c.pyx", "_budget_c.pxd", "_fb_atomic.h"):
        shutil.copy(src / name, pkg / name)
    (tmp / "setup.py").write_text(
        "from setuptools import Extension, setup\n"
        "from Cython.Build import cythonize\n"
        "ext = Extension('fastbreaker._budget_c', ['fastbreaker/_budget_c.pyx'],\n"
        "    include_dirs=['fastbreaker'], define_macros=[('FB_RACY_FOR_TESTS', '1')])\n"
        "setup(ext_modules=cythonize([ext], quiet=True))\n"
    )
    subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
        cwd=tmp,
        check=True,
        capture_output=True,
    )
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "fastbreaker._budget_c", pkg / f"_budget_c{suffix}"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)  # not put in sys.modules
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow  # a racy control: needs both cores to itself (`.ci/run slow`)
@pytest.mark.thread_unsafe  # it compiles an extension; its hammer runs its own threads
def test_c_hammer_catches_a_racy_core(tmp_path: Path) -> None:
    """The negative control: with a broken CAS the same hammer must see tokens created or lost."""
    _c_module()
    if (os.cpu_count() or 1) < 2:
        pytest.skip("needs two cores to race")
    if shutil.which(sysconfig.get_config_var("CC").split()[0]) is None:
        pytest.skip("no C compiler")
    racy = _build_racy(tmp_path)
    for _ in range(20):
        # long loops (400k deposits per thread, 8,000 tokens in all) so that the threads overlap
        expected, actual = hammer_conserves(racy, deposits=400_000, ratio_units=5_000)
        if actual != expected:
            return
    pytest.fail("the hammer test did not detect the racy compare-and-swap")
