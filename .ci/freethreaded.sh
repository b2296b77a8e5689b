#!/usr/bin/env bash
# The free-threaded leg: fastbreaker built for CPython 3.13t, imported without turning the GIL back
# on, the test suite, then the thread tests under pytest-run-parallel (several threads per test).
#
#   bash .ci/freethreaded.sh
#
# The interpreter lives at a fixed prefix (FB_PY313T_PREFIX, default /opt/python313t) and is
# reused when present; otherwise it is built there with get-python313t.sh, found beside the
# checkout in ../shared/tools/ or named by FB_GET_PYTHON313T (about 4-6 minutes on 2 cores). If it cannot be obtained, the leg says so loudly and exits 0 so that the
# rest of CI still runs. Everything after that is a real check: a failure fails the leg.
#
# .ci/tsan.sh sources this file for fb_get_python313t.
set -euo pipefail

FB_PY313T_PREFIX=${FB_PY313T_PREFIX:-/opt/python313t}

fb_loud() {
    printf '\n%s\n!!! %s\n%s\n\n' "$(printf '!%.0s' {1..100})" "$*" "$(printf '!%.0s' {1..100})" >&2
}

fb_is_python313t() {
    [ -x "$1" ] && "$1" -c 'import sys, sysconfig; assert sys.version_info[:2] == (3, 13); assert sysconfig.get_config_var("Py_GIL_DISABLED") == 1; assert not sys._is_gil_enabled()' 2>/dev/null
}

# Print the path of a free-threaded 3.13 interpreter (reused, or built at the prefix); return 1
# if none can be had.
fb_get_python313t() {
    local py="$FB_PY313T_PREFIX/bin/python3.13t" script top log
    if fb_is_python313t "$py"; then
        echo "$py"
        return 0
    fi
    top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
    script=${FB_GET_PYTHON313T:-$top/../shared/tools/get-python313t.sh}
    if [ ! -f "$script" ]; then
        echo "no $FB_PY313T_PREFIX/bin/python3.13t, and no $script to build one (set FB_GET_PYTHON313T)" >&2
        return 1
    fi
    log=$(mktemp)
    echo "building CPython 3.13t into $FB_PY313T_PREFIX with $script (a few minutes; log: $log)" >&2
    if ! bash "$script" "$FB_PY313T_PREFIX" >"$log" 2>&1; then
        tail -n 30 "$log" >&2
        return 1
    fi
    if fb_is_python313t "$py"; then
        echo "$py"
        return 0
    fi
    echo "the build finished but $py is not a free-threaded 3.13" >&2
    return 1
}

fb_freethreaded_main() {
    cd "$(dirname "${BASH_SOURCE[0]}")/.."
    unset PYTHON_GIL  # never force the GIL off: the modules themselves must say they are safe
    local root py venv
    root=$(pwd)
    if ! py=$(fb_get_python313t); then
        fb_loud "FREE-THREADED LEG SKIPPED: no CPython 3.13t could be obtained at $FB_PY313T_PREFIX (see above). Nothing was tested without the GIL."
        return 0
    fi
    echo "== 3.13t: $("$py" -VV) =="
    venv=${FB_FT_VENV:-$root/build/venv-313t}
    rm -rf "$venv"
    "$py" -m venv "$venv"
    "$venv/bin/python" -m pip install -q -U pip
    # The project's test, bench and integration extras minus the tools whose dependencies build
    # with Rust (no 3.13t wheels; their tests skip), plus pytest-run-parallel. --prefer-binary:
    # some tools' newest releases have no 3.13t wheel where an older pure-Python one will do.
    "$venv/bin/python" - "$root/pyproject.toml" >"$venv/test-requirements.txt" <<'PY'
import re, sys, tomllib
extras = tomllib.load(open(sys.argv[1], "rb"))["project"]["optional-dependencies"]
reqs = {r for k in ("test", "bench", "httpx", "prometheus") for r in extras.get(k, [])}
skip = {"mypy", "check-jsonschema"}  # Rust-built dependencies without 3.13t wheels
print("\n".join(sorted(r for r in reqs if re.split(r"[<>=!~\[; ]", r)[0].lower() not in skip)))
print("pytest-run-parallel")
PY
    if ! "$venv/bin/python" -m pip install -q --prefer-binary -r "$venv/test-requirements.txt"; then
        fb_loud "3.13t: some optional test dependencies do not install; using the minimal set"
        "$venv/bin/python" -m pip install -q --prefer-binary Cython setuptools pytest \
            pytest-asyncio pytest-benchmark pytest-run-parallel pytest-xdist filelock hypothesis
    fi

    echo "== 3.13t: build and install fastbreaker =="
    "$venv/bin/python" -m pip install -q --no-build-isolation --no-deps -e "$root"

    echo "== 3.13t: importing fastbreaker keeps the GIL disabled =="
    (cd /tmp && "$venv/bin/python" -W error -c '
import sys, sysconfig
assert sysconfig.get_config_var("Py_GIL_DISABLED") == 1
import fastbreaker, fastbreaker._breaker_c, fastbreaker._budget_c, fastbreaker.bench._floor_c
assert fastbreaker.COMPILED, "the compiled core is not in use"
assert not sys._is_gil_enabled(), "importing fastbreaker re-enabled the GIL"
print("GIL enabled after import:", sys._is_gil_enabled(), "- compiled core:", fastbreaker.__file__)
')

    # The selection: the compiled core's leg of every test (FB_IMPLS=c): what 3.13t adds is the C
    # core without a GIL; the pure twin on a free-threaded build runs in the GitHub 3.14t jobs.
    echo "== 3.13t: test suite, compiled core =="
    (cd "$root" && FB_IMPLS=c "$venv/bin/python" -m pytest -q -p no:cacheprovider)

    echo "== 3.13t: thread tests under pytest-run-parallel (4 threads per test) =="
    (cd "$root" && "$venv/bin/python" -m pytest -q -p no:cacheprovider -n 0 --parallel-threads=4 \
        --iterations=3 "tests/test_stress.py::TestPythonAPIUnderThreads")
    echo "== 3.13t: free-threaded leg passed =="
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    fb_freethreaded_main "$@"
fi
