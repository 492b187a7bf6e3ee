#!/usr/bin/env bash
# Install resacct from a wheel into a fresh venv outside the repository, then run the packaged
# claims from an empty directory: what a user who runs `pip install resacct` gets.
#
#   bash tools/fresh_venv_install.sh [WORKDIR]      (default: a new mktemp -d; removed unless KEEP=1)
#
# Prints the wheel's size, the install time, `resacct verify`'s claim counts and
# `pytest --pyargs resacct`' summary lines. Uses constraints/ci.txt (the CPU build of torch).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"
WORK="${1:-$(mktemp -d)}"
mkdir -p "$WORK/wheel" "$WORK/run"
[ "${KEEP:-0}" = 1 ] || [ -n "${1:-}" ] || trap 'rm -rf "$WORK"' EXIT

echo "== building the wheel"
"$PYTHON" -m pip wheel --quiet --no-deps --no-build-isolation -w "$WORK/wheel" "$REPO" 2>/dev/null \
  || "$PYTHON" -m pip wheel --quiet --no-deps -w "$WORK/wheel" "$REPO"
WHEEL="$(ls "$WORK"/wheel/resacct-*.whl)"
ls -l "$WHEEL"

echo "== fresh venv + install (timed)"
"$PYTHON" -m venv "$WORK/venv"
start=$(date +%s.%N)
"$WORK/venv/bin/python" -m pip install --quiet -c "$REPO/constraints/ci.txt" "$WHEEL"
end=$(date +%s.%N)
printf '== install took %.1f s: %s -m pip install -c constraints/ci.txt %s\n' "$(echo "$end - $start" | bc)" "$WORK/venv/bin/python" "$(basename "$WHEEL")"
cd "$WORK/run"   # an empty folder: nothing of the checkout on sys.path
"$WORK/venv/bin/python" -c 'import resacct, torch; print("== resacct from", resacct.__file__, "| torch", torch.__version__)'
echo "== resacct verify (from $PWD, no specs here)"
set +e
"$WORK/venv/bin/resacct" verify --report-dir "$WORK/run/reports" -q > verify.out 2>&1
status=$?
set -e
tail -n 15 verify.out
echo "== resacct verify exit status: $status"
echo "== pytest --pyargs resacct"
set +e
"$WORK/venv/bin/python" -m pytest --pyargs resacct -q -p no:cacheprovider > pyargs.out 2>&1
pyargs_status=$?
set -e
grep -E "^claims:|passed|failed" pyargs.out | tail -n 2
echo "== pytest --pyargs exit status: $pyargs_status"
# A host project sees no warnings from resacct's claims and gets no .hypothesis/ folder (issue 21).
warnings="$(grep -cE "Warning" pyargs.out || true)"
echo "== lines naming a warning in pytest --pyargs' output: $warnings"
leftover=0
if [ -e "$WORK/run/.hypothesis" ]; then echo "== a .hypothesis/ folder was left in $WORK/run" >&2; leftover=1; fi
[ "$status" -eq 0 ] && [ "$pyargs_status" -eq 0 ] && [ "$warnings" -eq 0 ] && [ "$leftover" -eq 0 ]
