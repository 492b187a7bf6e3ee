#!/usr/bin/env bash
# The cached venv of one tox env of the matrix (tox.ini), outside the repository, so a machine pays
# each torch download once (torch 2.4.1 from PyPI: a CUDA build, ~2.8 GB; 101 s + 53 s on this
# project's machine, 2026-11-28):
#
#   tools/matrix_venv.sh ENV            create it if absent (or if tox.ini's pins changed), print its path
#   tools/matrix_venv.sh --commands ENV print the env's tox commands, one a line, substituted
#
# The pins are tox.ini's own (`[testenv]` deps with the `ENV:` factor, or `[testenv:ENV]` deps), and
# the package is installed editable from this checkout with the extras tox.ini gives the env, so
# the venv is what `tox -e ENV` would build, without tox. Venvs live in
# ${RESACCT_VENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/resacct/venvs}/ENV; the install time goes to stderr.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"
CACHE="${RESACCT_VENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/resacct/venvs}"

# tox.ini → "extras<TAB>pin pin …<TAB>command<TAB>command …" for one env (configparser; no tox needed)
tox_env() {
    "$PYTHON" - "$REPO/tox.ini" "$1" "$REPO" <<'EOF'
import configparser, sys
path, env, repo = sys.argv[1:]
tox = configparser.ConfigParser(interpolation=None)
tox.read(path, encoding="utf-8")
if env not in [e.strip() for e in tox["tox"]["envlist"].split(",")] and f"testenv:{env}" not in tox:
    sys.exit(f"matrix_venv.sh: no env {env!r} in tox.ini; expected one of {tox['tox']['envlist']}")
own = tox[f"testenv:{env}"] if f"testenv:{env}" in tox else {}
base = tox["testenv"]
def lines(key):
    text = own.get(key, base.get(key, ""))
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        factor, colon, rest = line.partition(": ")
        if colon and " " not in factor and factor.replace("-", "").isalnum():
            if factor != env:
                continue
            line = rest.strip()
        out.append(line)
    return out
extras = ",".join(e.strip() for e in own.get("extras", base.get("extras", "")).replace("\n", ",").split(",") if e.strip())
subst = lambda s: s.replace("{posargs}", "").replace("{toxinidir}", repo).replace("{envname}", env)
print("\t".join([extras, " ".join(lines("deps")), *[subst(c) for c in lines("commands")]]))
EOF
}

if [ "${1:-}" = "--commands" ]; then
    line="$(tox_env "$2")"
    IFS=$'\t' read -r -a fields <<< "$line"
    printf '%s\n' "${fields[@]:2}"
    exit 0
fi
ENV="${1:?usage: tools/matrix_venv.sh [--commands] ENV}"
line="$(tox_env "$ENV")"
IFS=$'\t' read -r -a fields <<< "$line"
EXTRAS="${fields[0]}"
read -r -a PINS <<< "${fields[1]}"
VENV="$CACHE/$ENV"
STAMP="pins: ${PINS[*]} | extras: $EXTRAS | python: $("$PYTHON" --version 2>&1)"
if [ -x "$VENV/bin/python" ] && [ "$(cat "$VENV/.resacct-pins" 2>/dev/null)" = "$STAMP" ]; then
    # the editable install must point at this checkout (another checkout may have made the venv)
    if ! (cd / && "$VENV/bin/python" -c 'import resacct, sys; sys.exit(not resacct.__file__.startswith(sys.argv[1] + "/"))' "$REPO") 2>/dev/null; then
        "$VENV/bin/python" -m pip install --quiet --no-deps -e "$REPO" >&2
    fi
    echo "$VENV"
    exit 0
fi
rm -rf "$VENV"
mkdir -p "$CACHE"
start=$(date +%s)
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip >&2
"$VENV/bin/python" -m pip install --quiet "${PINS[@]}" -e "$REPO${EXTRAS:+[$EXTRAS]}" >&2
echo "$STAMP" > "$VENV/.resacct-pins"
echo "== $ENV: created $VENV in $(( $(date +%s) - start )) s (${PINS[*]}, extras $EXTRAS; cached for the next run)" >&2
echo "$VENV"
