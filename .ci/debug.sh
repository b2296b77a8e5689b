#!/usr/bin/env bash
# The debug-build leg: the test suite once on a FASTBREAKER_DEBUG=1 build (Cython's bounds and
# zero-divisor checks on, NDEBUG undefined so C asserts are live), which also shows that every
# .pyx still compiles with cdivision off.
#
#   bash .ci/debug.sh      with the main venv active (it needs the test extra, Cython, setuptools)
#
# It builds in place in a copy of the checkout (default build/debug), so the checkout's own
# in-place build, which the other legs use, is never touched; PYTHONPATH puts the copy's src/
# first on sys.path, and a guard fails the session unless the debug build is what the tests import.
#
# The selection: the compiled core's leg of every test (FB_IMPLS=c: the pure twin runs no C, and
# .ci/run's tests and pure steps already ran it), without the slow step's full soak runs. .ci/check_debug_build.py proves the build is a debug one, and (as a control)
# that it tells the checkout's release build apart.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PYTHON:-python}
WORK=${FB_DEBUG_DIR:-$ROOT/build/debug}
rm -rf "$WORK"
mkdir -p "$WORK/copy" "$WORK/guard"
COPY=$WORK/copy

tar -c --exclude=./.git --exclude=./.venv --exclude=./build --exclude=./dist --exclude='*.egg-info' \
    --exclude=__pycache__ --exclude='*.so' --exclude='./src/fastbreaker/*.c' . | tar -x -C "$COPY"

echo "== debug build: FASTBREAKER_DEBUG=1 build_ext --inplace in $COPY =="
(cd "$COPY" && FASTBREAKER_DEBUG=1 "$PY" setup.py -q build_ext --inplace >"$WORK/build.log" 2>&1) ||
    { tail -n 40 "$WORK/build.log" >&2; exit 1; }
"$PY" .ci/check_debug_build.py "$COPY"
if [ -z "${FASTBREAKER_DEBUG:-}" ] && ls src/fastbreaker/_breaker_c.*.so >/dev/null 2>&1; then
    if "$PY" .ci/check_debug_build.py "$ROOT" >/dev/null; then
        echo "debug build: the check calls the checkout's release build a debug one too" >&2
        exit 1
    fi
    echo "debug build: control: the checkout's release build is told apart"
fi

cat >"$WORK/guard/fb_debug_guard.py" <<PY
import pytest

def pytest_sessionstart(session):
    # imported here, not at the top: by now pytest has set sys.path and loaded the conftests
    import fastbreaker._breaker_c as core
    if not core.__file__.startswith("$COPY/src/"):
        pytest.exit(f"debug build: the tests import {core.__file__}, not the debug build", 3)
PY

echo "== debug build: test suite =="
# test_ship's installed-package check is the one test this leg cannot pass by design: PYTHONPATH
# puts the debug build before site-packages (the guard above checks that it is what is imported).
(cd "$COPY" && FB_IMPLS=c PYTHONPATH="$WORK/guard:$COPY/src" \
    "$PY" -m pytest -q -p no:cacheprovider -p fb_debug_guard \
    --deselect tests/test_ship.py::test_the_suite_tests_the_installed_package)
echo "== debug build: passed =="
