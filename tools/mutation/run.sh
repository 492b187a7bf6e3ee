#!/usr/bin/env bash
# Mutation testing of one resacct formula module with mutmut (see docs/mutation.md).
#
#   tools/mutation/run.sh MODULE [mutmut run args...]     e.g.  tools/mutation/run.sh formulas/flops
#
# MODULE is one of the names in tools/mutation/modules.txt, a path under resacct/ without .py (facts/dtypes
# measurement/tensors formulas/flops measurement/flop_tracing formulas/napkin measurement/memory training/optim
# training/optim_updates formulas/sharding formulas/validation formulas/hf_formulas formulas/hf_activation_formulas).
# Names of mutants after MODULE re-run just those (with KEEP=1: the others keep their results). The script
#   1. installs mutmut (pinned below) into the project venv if it is missing;
#   2. copies the project (resacct/ with its specs/, tests/, pytest.ini, conftest.py, pytest_resacct.py) into
#      a scratch directory, $RESACCT_MUTATION_WORKDIR/MODULE (default /tmp/resacct-mutation/MODULE),
#      and writes a setup.cfg [mutmut] section there: the project's pyproject.toml is not touched
#      and mutmut's mutants/ folder never appears in the checkout;
#   3. runs `mutmut run` there with the module's test selection from modules.txt, CI=true
#      (derandomised hypothesis profile) and one torch thread per worker;
#   4. prints killed / survived / timeout / no-tests counts, the kill rate
#      killed / (killed + survived) with timeouts counted as killed, and every survivor's diff.
#
# Environment: RESACCT_MUTATION_WORKDIR (scratch root), MUTMUT_MAX_CHILDREN (default: number of
# CPUs), KEEP=1 to reuse a previous scratch copy's results (only mutants whose function changed
# are re-run; the source is re-synced first). Never part of the normal test suite or CI: too slow.
set -euo pipefail

MUTMUT_VERSION="3.8.1"
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
HERE="$REPO/tools/mutation"
VENV="${VENV:-$REPO/.venv}"
PY="$VENV/bin/python"

if [ $# -lt 1 ]; then
    echo "usage: $0 MODULE [mutmut run args...]; MODULE is one of:" >&2
    grep -v '^#' "$HERE/modules.txt" | awk 'NF {print "  " $1}' >&2
    exit 2
fi
MODULE="$1"; shift
LINE="$(grep -v '^#' "$HERE/modules.txt" | awk -v m="$MODULE" '$1 == m' || true)"
if [ -z "$LINE" ]; then
    echo "unknown module '$MODULE'; expected one of: $(grep -v '^#' "$HERE/modules.txt" | awk 'NF {printf "%s ", $1}')" >&2
    exit 2
fi

if ! "$PY" -c "import mutmut, sys; sys.exit(0 if mutmut.__version__ == '$MUTMUT_VERSION' else 1)" 2>/dev/null; then
    echo "== installing mutmut==$MUTMUT_VERSION into $VENV"
    "$PY" -m pip install --quiet "mutmut==$MUTMUT_VERSION"
fi

WORK="${RESACCT_MUTATION_WORKDIR:-/tmp/resacct-mutation}/$MODULE"
if [ "${KEEP:-0}" != "1" ]; then
    rm -rf "$WORK"
fi
mkdir -p "$WORK"
# Fresh copy of the sources (mutmut compares these with mutants/ to decide what to re-run).
for item in resacct tests; do
    rm -rf "${WORK:?}/$item"
    cp -a "$REPO/$item" "$WORK/$item"
done
find "$WORK" -name __pycache__ -type d -prune -exec rm -rf {} +
cp -a "$REPO/pytest.ini" "$REPO/conftest.py" "$REPO/pytest_resacct.py" "$WORK/"
# The root conftest installs jaxtyping's hook and refuses a process where resacct is already
# imported; pytest re-executes it on each of mutmut's in-process runs. mutmut_typed.py installs the
# hook once through it, then RESACCT_MUTATION_HOOK=1 makes the scratch copy skip the guard and the
# second install (see mutmut_typed.py). The checkout's conftest.py is not touched.
"$PY" - "$WORK/conftest.py" <<'PATCH'
import sys
path = sys.argv[1]
text = open(path, encoding="utf-8").read()
skip = ' and os.environ.get("RESACCT_MUTATION_HOOK") != "1"'
for line in ("if _already_imported:", 'if os.environ.get("RESACCT_TYPECHECK", "1") != "0":'):
    if text.count(line) != 1:
        sys.exit(f"run.sh: cannot patch {path}: expected the line {line!r} once (the root conftest changed?)")
    text = text.replace(line, line[:-1] + skip + ":")
open(path, "w", encoding="utf-8").write(text)
PATCH

# The module's tests: only those that exist in this checkout.
TESTS=()
for t in $(echo "$LINE" | cut -d' ' -f2- ); do
    if [ -e "$REPO/$t" ]; then TESTS+=("$t"); fi
done

{
    echo "[mutmut]"
    echo "source_paths = resacct"
    echo "only_mutate = resacct/$MODULE.py"
    echo "also_copy ="
    for f in pytest.ini conftest.py pytest_resacct.py; do echo "    $f"; done
    echo "pytest_add_cli_args ="
    for a in -o addopts= -p no:cacheprovider --no-claims-summary; do echo "    $a"; done
    echo "pytest_add_cli_args_test_selection ="
    for t in "${TESTS[@]}"; do echo "    $t"; done
    echo "use_git_change_detection = false"
} > "$WORK/setup.cfg"

export CI=true OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE=1
cd "$WORK"
echo "== mutmut $MUTMUT_VERSION on resacct/$MODULE.py in $WORK"
echo "== tests: ${TESTS[*]}"
START=$(date +%s)
"$PY" "$HERE/mutmut_typed.py" run --max-children "${MUTMUT_MAX_CHILDREN:-$(nproc)}" "$@" || true
END=$(date +%s)
"$PY" "$HERE/mutmut_typed.py" export-cicd-stats >/dev/null
"$PY" "$HERE/summary.py" "$MODULE" "$((END - START))" "$MUTMUT_VERSION"
