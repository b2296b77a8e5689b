#!/usr/bin/env bash
# Build the site and screenshot two pages as a reader's browser renders them, to check by eye
# that the navigation, the highlighted code and the benchmark picture are there.
#
#   bash docs/screenshot.sh [OUTDIR]      (default docs/_screenshots; needs Debian's chromium:
#                                          apt-get install chromium)
#
# Not part of CI: the strict build and the link check are (`bash .ci/run docs`).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-docs/_screenshots}
PY=${PYTHON:-python}
BROWSER=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$BROWSER" ]; then
    echo "no chromium (apt-get install chromium)" >&2
    exit 2
fi
"$PY" -m sphinx -W --keep-going -n -q -b html docs docs/_build/html
mkdir -p "$OUT"
shoot() {  # page, png, window size
    "$BROWSER" --headless --no-sandbox --disable-gpu --hide-scrollbars --force-device-scale-factor=1 \
        --window-size="$3" --screenshot="$OUT/$2" "file://$(pwd)/docs/_build/html/$1" 2>/dev/null
    echo "$OUT/$2"
}
shoot index.html home.png 1280,1600
shoot patterns/breaker.html pattern-breaker.png 1280,1600
shoot tutorial.html tutorial.png 1280,1200
shoot api/breaker.html api-breaker.png 1280,1200
