#!/usr/bin/env bash
# The wheel leg (bash .ci/run wheel): what a stranger installs, built and tested as they get it.
#
#   1. python -m build: the sdist, then a wheel built from that sdist (build's default), in an
#      isolated environment: a release build, without debug information (setup.py: -g0);
#   2. twine check --strict on both; auditwheel show on the wheel (Linux: the manylinux tag it
#      qualifies for); the wheel's size and its extensions' sizes; no .debug_info section;
#   3. the test suite against the installed wheel: a fresh venv with the wheel and its test
#      extra, tests/ and pyproject.toml copied to a folder where src/ is not importable, and no C
#      compiler on PATH (the tests that build test-time extensions skip: no compiler). Both cores;
#      the whole `bash .ci/run` sets FB_WHEEL_IMPLS=c (the compiled core's leg of every test):
#      its tests and pure legs already ran the twin's leg, and a file missing from the wheel
#      fails the session at import (tests/conftest.py imports both cores) either way.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PYTHON:-python}
WORK=${FB_WHEEL_DIR:-$ROOT/build/wheel}
rm -rf "$WORK"
mkdir -p "$WORK"

echo "== wheel: python -m build (the sdist, then a wheel from the sdist) =="
"$PY" -m build --outdir "$WORK/dist" . >"$WORK/build.log" 2>&1 || { tail -n 40 "$WORK/build.log" >&2; exit 1; }
SDIST=$(ls "$WORK"/dist/*.tar.gz)
WHEEL=$(ls "$WORK"/dist/*.whl)
"$PY" -m twine check --strict "$SDIST" "$WHEEL"

echo "== wheel: size and contents =="
"$PY" - "$WHEEL" "$SDIST" <<'PY'
import os, sys, zipfile
wheel, sdist = sys.argv[1:]
print(f"wheel {os.path.basename(wheel)}: {os.path.getsize(wheel) / 1e6:.2f} MB")
print(f"sdist {os.path.basename(sdist)}: {os.path.getsize(sdist) / 1e6:.2f} MB")
with zipfile.ZipFile(wheel) as z:
    so = [i for i in z.infolist() if i.filename.endswith((".so", ".pyd"))]
    names = set(z.namelist())
for i in so:
    print(f"  {i.filename}: {i.file_size / 1e3:.0f} kB ({i.compress_size / 1e3:.0f} kB compressed)")
print(f"  extensions: {sum(i.file_size for i in so) / 1e6:.2f} MB uncompressed")
for needed in ("fastbreaker/py.typed", "fastbreaker/_breaker_c.pxd", "fastbreaker/_fb_atomic.h",
               "fastbreaker/_breaker_state_c.pxi"):  # the .pyx and its include files ship
    assert needed in names, f"{needed} is missing from the wheel"
assert not any(n.endswith(".c") for n in names), "generated C in the wheel"
PY
if [ "$(uname -s)" = Linux ]; then
    "$PY" -m auditwheel show "$WHEEL"
    mkdir -p "$WORK/so"
    (cd "$WORK/so" && "$PY" -m zipfile -e "$WHEEL" .)
    if find "$WORK/so" -name '*.so' -exec readelf -S {} \; | grep -q '\.debug_info'; then
        echo "wheel: an extension carries debug information (.debug_info)" >&2
        exit 1
    fi
    echo "wheel: no extension carries .debug_info"
fi

# PATH without a C compiler or linker: symlinks to every other program on PATH.
NOCC=$WORK/bin-without-compiler
mkdir -p "$NOCC"
IFS=: read -ra dirs <<<"$PATH"
for dir in "${dirs[@]}"; do
    for prog in "$dir"/*; do
        name=${prog##*/}
        case "$name" in
            cc | c++ | cpp | gcc* | g++* | clang* | tcc | ld | ld.* | *-gcc* | *-g++* | *-ld | *-ld.*) continue ;;
        esac
        [ -x "$prog" ] && [ ! -e "$NOCC/$name" ] && ln -s "$prog" "$NOCC/$name"
    done
done
if PATH=$NOCC command -v cc gcc clang >/dev/null 2>&1; then
    echo "wheel: a compiler is still on the test PATH" >&2
    exit 1
fi

echo "== wheel: the test suite against the installed wheel (fresh venv, no src/, no compiler) =="
VENV=$WORK/venv
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q -U pip
"$VENV/bin/python" -m pip install -q "$WHEEL[test]"
RUN=$WORK/run
mkdir -p "$RUN"
cp -r tests pyproject.toml "$RUN/"
find "$RUN" -name __pycache__ -prune -exec rm -rf {} +
(
    cd "$RUN"
    export PATH="$VENV/bin:$NOCC"
    unset PYTHONPATH
    "$VENV/bin/python" -c '
import fastbreaker, sys
assert "site-packages" in fastbreaker.__file__, fastbreaker.__file__
assert fastbreaker.COMPILED, "the wheel does not use its compiled core"
print("testing", fastbreaker.__file__, "compiled:", fastbreaker.COMPILED)
'
    FB_IMPLS=${FB_WHEEL_IMPLS:-c,python} "$VENV/bin/python" -m pytest -q -p no:cacheprovider
)
echo "== wheel: passed =="
