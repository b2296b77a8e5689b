"""Is the build in src/fastbreaker (of the checkout given) a FASTBREAKER_DEBUG=1 build?

    python .ci/check_debug_build.py CHECKOUT     exit 0: a debug build; 1: not (says why)

A debug build has C asserts live in every compiled module (NDEBUG undefined: the CPython headers'
own inline asserts then reference __assert_fail) and Cython's checks on, which shows in the
generated C: with cdivision off, C integer division checks for a zero divisor.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

MODULES = ["_breaker_c", "_budget_c", "_map_c", "bench/_floor_c"]  # paths under src/fastbreaker
DIVIDING = ["_breaker_c", "_budget_c"]  # the modules that divide C integers


def problems(core: pathlib.Path) -> list[str]:
    out = []
    for name in MODULES:
        built = sorted(core.glob(f"{name}.*.so"))
        if len(built) != 1:
            out.append(f"{name}: expected one built extension in {core}, found {len(built)}")
            continue
        symbols = subprocess.run(
            ["nm", "-D", "--undefined-only", str(built[0])],
            capture_output=True, text=True, check=True,
        ).stdout
        if "__assert_fail" not in symbols:
            out.append(f"{built[0].name}: no live C assert (was NDEBUG defined?)")
    for name in DIVIDING:
        c = core / f"{name}.c"
        if not c.is_file():
            out.append(f"{c}: no generated C")
        elif "ZeroDivisionError" not in c.read_text(encoding="utf-8", errors="replace"):
            out.append(f"{c.name}: no zero-divisor check (cdivision is on: a directive override?)")
    return out


def main() -> int:
    core = pathlib.Path(sys.argv[1]) / "src" / "fastbreaker"
    found = problems(core)
    for p in found:
        print(f"not a debug build: {p}")
    if not found:
        print(f"{core}: a debug build (C asserts live, cdivision off)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
