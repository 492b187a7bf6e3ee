#!/usr/bin/env bash
# The wheels the GPU tier carries to a lent GPU machine (tools/gpu_tier.sh installs them there,
# with no network): what resacct needs that the device image lacks, plus resacct's own wheel.
#
#   bash tools/gpu_tier_wheels.sh            download into .whl/ (ignored by git) and build resacct's wheel
#   bash tools/gpu_tier_wheels.sh --list     print the pinned requirements, one a line, and exit
#
# Why these: every entry of pyproject.toml's [project.dependencies] was checked against the
# package list of the device image ("Python packages already there" in the device tool's
# KINDS.md, read 2026-11-17): torch, numpy, einops, jaxtyping, pytest, hypothesis, pyyaml, regex,
# packaging, rich and matplotlib are there (and jaxtyping's wadler-lindig, pytest-xdist for
# `resacct verify --workers`); beartype and pydantic are not, nor pydantic's own needs
# pydantic-core, annotated-types and typing-inspection. typing-extensions is there, at a version
# nobody has read: pydantic-core 2.50 needs a recent one, so it travels too (it is backwards
# compatible, so shadowing the image's copy is harmless). The pins are the versions of this
# checkout's .venv (the CI constraints' environment), so the device runs what CI ran.
# The device machine runs CPython 3.12 on x86-64 Linux: pydantic-core, the only compiled one,
# is fetched for exactly that (cp312, manylinux); the others are pure Python.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"

REQUIREMENTS=(
    "beartype==0.23.1"
    "pydantic==2.14.4"
    "pydantic-core==2.50.5"
    "annotated-types==0.8.0"
    "typing-inspection==0.4.5"
    "typing-extensions==4.16.0"
)

if [ "${1:-}" = "--list" ]; then
    printf '%s\n' "${REQUIREMENTS[@]}"
    exit 0
fi

PYTHON="${PYTHON:-$REPO/.venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON="$(command -v python3)"
DEST="$REPO/.whl"
mkdir -p "$DEST"
rm -f "$DEST"/resacct-*.whl   # one version of each: two stop the install there

echo "== downloading ${#REQUIREMENTS[@]} wheels for CPython 3.12 manylinux x86_64 into .whl/"
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$DEST" "${REQUIREMENTS[@]}"

echo "== building resacct's own wheel into .whl/"
"$PYTHON" -m pip wheel --quiet --no-deps --no-build-isolation -w "$DEST" "$REPO" 2>/dev/null \
    || "$PYTHON" -m pip wheel --quiet --no-deps -w "$DEST" "$REPO"

ls -l "$DEST"
du -sh "$DEST"
