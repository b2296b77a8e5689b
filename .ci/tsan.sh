#!/usr/bin/env bash
# One ThreadSanitizer run of the stress tests on free-threaded CPython 3.13t.
#
#   bash .ci/tsan.sh        (also: bash .ci/run tsan)
#
# fastbreaker's extensions, and the test-time C API client the stress tests build, are compiled
# with -fsanitize=thread; the interpreter is not (a TSan-built CPython is a separate, slow build),
# so libtsan is preloaded and reports whose frames are all inside CPython are suppressed. TSan sees
# every access made by our instrumented code, which is what this run is about: the memory orders
# of the lock-free core under threads that really run in parallel (no GIL).
#
# Exit status: 0 when no report involves fastbreaker's code (reports inside CPython alone are
# counted and listed, not failed on); 1 otherwise. Like the free-threaded leg, a missing 3.13t
# interpreter is reported loudly and is not a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
# shellcheck source=freethreaded.sh
. .ci/freethreaded.sh
unset PYTHON_GIL

if ! PY=$(fb_get_python313t); then
    fb_loud "TSAN RUN SKIPPED: no CPython 3.13t could be obtained at $FB_PY313T_PREFIX."
    exit 0
fi
CC=${CC:-gcc}
TSAN_LIB=$("$CC" -print-file-name=libtsan.so)
if [ ! -e "$TSAN_LIB" ]; then
    fb_loud "TSAN RUN SKIPPED: $CC has no libtsan (Debian: apt-get install libtsan2)."
    exit 0
fi
TSAN_CFLAGS="-fsanitize=thread -g -O1 -fno-omit-frame-pointer"
WORK=${FB_TSAN_DIR:-$ROOT/build/tsan}
rm -rf "$WORK"
mkdir -p "$WORK/logs"

echo "== tsan: venv on $("$PY" -VV) =="
"$PY" -m venv "$WORK/venv"
VPY=$WORK/venv/bin/python
"$VPY" -m pip install -q -U pip
"$VPY" -m pip install -q --prefer-binary Cython setuptools pytest pytest-asyncio pytest-benchmark \
    pytest-xdist filelock

echo "== tsan: build fastbreaker with $TSAN_CFLAGS =="
# From a copy of the sources: build/ and the in-place .so files of other legs are never reused.
mkdir -p "$WORK/src"
cp -r setup.py pyproject.toml README.md src "$WORK/src/"
rm -f "$WORK"/src/src/fastbreaker/*.so "$WORK"/src/src/fastbreaker/*.c
CFLAGS="$TSAN_CFLAGS" LDFLAGS="-fsanitize=thread" \
    "$VPY" -m pip install -q --no-build-isolation --no-deps "$WORK/src"
SO=$(LD_PRELOAD=$TSAN_LIB "$VPY" -c 'import fastbreaker._breaker_c as m; print(m.__file__)')
# (Not `nm | grep -q`: under pipefail, grep -q's early exit makes nm die of SIGPIPE on a large
# symbol table, and the pipeline fails although the symbol is there.)
if ! grep -q __tsan_func_entry <(nm -D "$SO"); then
    echo "tsan: $SO is not instrumented" >&2
    exit 1
fi

# Known false positives of this setup, not races of ours:
# - reports entirely inside the uninstrumented interpreter;
# - 3.13t allocates objects with its own mimalloc, which TSan cannot see (PYTHONMALLOC=malloc is
#   refused there): when memory freed by one thread is reused by another, the first writes of a
#   Cython object's constructor look like a race with the previous object's destructor.
# - BreakerMap._owner (the thread creating or evicting keys) is read and written only with the
#   map's lock held (_map_steps._new), a Python RLock: its synchronisation happens inside the
#   uninstrumented interpreter, where TSan cannot see it.
cat >"$WORK/suppressions.txt" <<'EOF'
called_from_lib:libpython3.13t.so.1.0
race:__pyx_tp_new_
race:__pyx_tp_dealloc_
race:__pyx_memoryview___pyx_pf_15View_dot_MemoryView_10memoryview___cinit__
race:__pyx_pf_11fastbreaker_6_map_c_10BreakerMap_6_owner_*
EOF

# The tests must import the instrumented build installed above, never the source tree (the
# project sets no pythonpath), and a plugin fails the session before any test runs unless the
# imported fastbreaker._breaker_c is $SO. One process (-n 0): the hammers start their own threads.
cat >"$WORK/fb_tsan_guard.py" <<PY
import pytest

def pytest_sessionstart(session):
    # imported here, not at the top: by now pytest has set sys.path and loaded the conftests
    import fastbreaker._breaker_c as core
    if core.__file__ != "$SO":
        pytest.exit(f"tsan: the tests import {core.__file__}, not the instrumented $SO", 3)
    print("tsan: the tests import the instrumented", core.__file__)
PY

echo "== tsan: stress tests (C-level hammers and the Python API from threads) =="
set +e
PYTHONPATH="$WORK" LD_PRELOAD=$TSAN_LIB \
TSAN_OPTIONS="suppressions=$WORK/suppressions.txt halt_on_error=0 report_signal_unsafe=0 log_path=$WORK/logs/tsan" \
FB_TEST_CFLAGS="$TSAN_CFLAGS" FB_TEST_LDFLAGS="-fsanitize=thread" FB_STRESS_SECONDS=${FB_STRESS_SECONDS:-1.5} \
    "$VPY" -m pytest -q -s -p no:cacheprovider -n 0 -p fb_tsan_guard \
    tests/test_stress.py -k "not racy"
status=$?
set -e

echo "== tsan: self-check: a deliberate data race in the test client must be reported =="
LD_PRELOAD=$TSAN_LIB \
TSAN_OPTIONS="suppressions=$WORK/suppressions.txt halt_on_error=0 report_signal_unsafe=0 log_path=$WORK/selfcheck" \
FB_TEST_CFLAGS="$TSAN_CFLAGS" FB_TEST_LDFLAGS="-fsanitize=thread" \
    "$VPY" - "$WORK/selfcheck-build" <<'PY' || true  # TSan exits 66 after a report
import array, pathlib, sys, threading
sys.path.insert(0, "tests")
import capi_ext
client = capi_ext.build_client(pathlib.Path(sys.argv[1]))
counter = array.array("q", [0])
threads = [threading.Thread(target=client.plain_increments, args=(counter, 200_000)) for _ in range(2)]
for t in threads:
    t.start()
for t in threads:
    t.join()
PY
if ! grep -A8 "WARNING: ThreadSanitizer: data race" "$WORK"/selfcheck.* 2>/dev/null | grep -c plain_increments >/dev/null; then
    echo "tsan: the deliberate race was not reported: this TSan setup sees nothing" >&2
    exit 1
fi
echo "tsan: the deliberate race was reported (TSan is live)"

reports=$(cat "$WORK"/logs/tsan.* 2>/dev/null | grep -c "WARNING: ThreadSanitizer" || true)
ours=0
for f in "$WORK"/logs/tsan.*; do
    [ -e "$f" ] || continue
    # one report per block; ours when any frame is in our modules or headers
    ours=$((ours + $(awk '/WARNING: ThreadSanitizer/{if (b) n++; b=0} /_breaker_c|_budget_c|_map_c|_floor_c|fb_capi_client|_fb_atomic\.h/{b=1} END{if (b) n++; print n+0}' "$f")))
done
echo "== tsan: $reports report(s) in all, $ours involving fastbreaker code (logs: $WORK/logs) =="
if [ "$reports" -gt 0 ]; then
    cat "$WORK"/logs/tsan.* | grep -A12 "WARNING: ThreadSanitizer" | head -n 120
fi
if [ "$status" -ne 0 ]; then
    echo "tsan: the stress tests failed under TSan (pytest exit $status)" >&2
    exit 1
fi
if [ "$ours" -gt 0 ]; then
    echo "tsan: data races in fastbreaker code" >&2
    exit 1
fi
echo "== tsan: no data race in fastbreaker code =="
