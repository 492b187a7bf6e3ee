#!/usr/bin/env bash
# `resacct verify` on several kinds of machine that this one can behave like (issue 20):
#   native       as the machine is (every claim with --all-claims; .ci/run's test tiers already run every claim);
#   avx2-cap     ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2: a CPU without bf16/AVX-512 units
#                (a bf16-capable CPU then converts bf16 element by element, as an AVX2 one does);
#   one-thread   OMP_NUM_THREADS=1;
#   loaded       a busy loop on every core for the whole run (bounded by `timeout`).
# Each runs the claims whose outcome can depend on the machine (`--machine-dependent`: a `when:`
# condition, or timed here); every run must exit 0: a timing claim under load holds or
# is inconclusive, never failed. The reports are merged into one claims × machine-kinds matrix.
# Every kind measures every claim afresh (RESACCT_NO_CACHE=1: no measurement an earlier verify stored is replayed).
# The loaded kind runs only the timed claims (`-k resacct_timed`): a busy loop changes a time, not
# what a `when:` condition reads; of the runtime model's, only the step and optimizer times on the
# MLP (their gpt-tiny and Cruncher twins, and the per-op memory-bound claims, run the same timing
# harness at 2–3× the time: under load every round runs; ~55 s of CI's 10 minutes). RESACCT_KINDS picks kinds (default all four; .ci/run leaves out
# native, whose claims both test tiers have just run on this machine).
#   usage: bash tools/machine_kinds.sh [--all-claims] [RESACCT] [OUT_DIR]     (RESACCT default: .venv/bin/resacct)
set -uo pipefail
cd "$(dirname "$0")/.."
ALL=0
if [ "${1:-}" = "--all-claims" ]; then ALL=1; shift; fi
RESACCT="${1:-.venv/bin/resacct}"
OUT="${2:-$(mktemp -d)}"
mkdir -p "$OUT"
status=0

KINDS=" ${RESACCT_KINDS:-native avx2-cap one-thread loaded} "
for kind in $KINDS; do
    case "$kind" in native|avx2-cap|one-thread|loaded) ;;
        *) echo "machine_kinds.sh: RESACCT_KINDS names '$kind'; expected some of: native avx2-cap one-thread loaded" >&2; exit 2 ;;
    esac
done

run_kind() {  # name, then env assignments, then verify arguments after --
    local name="$1"; shift
    case "$KINDS" in *" $name "*) ;; *) echo "== $name: not run (RESACCT_KINDS)"; return 0 ;; esac
    local assignments=()
    while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do assignments+=("$1"); shift; done
    shift
    local began=$SECONDS
    env RESACCT_NO_CACHE=1 "${assignments[@]}" "$RESACCT" verify -q --no-roofline --no-timeline --report-dir "$OUT/$name" "$@" >"$OUT/$name.log" 2>&1
    local code=$?
    echo "== $name: exit $code in $((SECONDS - began)) s: $(grep '^claims:' "$OUT/$name.log" | tail -1)"
    if [ "$code" -ne 0 ]; then
        status=1
        tail -40 "$OUT/$name.log" >&2
    fi
}

if [ "$ALL" = 1 ]; then run_kind native RESACCT_KIND=native --; else run_kind native RESACCT_KIND=native -- --machine-dependent; fi
run_kind avx2-cap ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 -- --machine-dependent
run_kind one-thread OMP_NUM_THREADS=1 -- --machine-dependent

case "$KINDS" in *" loaded "*)
    cores="$(python3 -c 'import os; print(os.cpu_count() or 1)')"
    loaders=()
    for _ in $(seq "$cores"); do
        timeout 600 python3 -c 'while True: pass' &
        loaders+=("$!")
    done
    run_kind loaded RESACCT_KIND=loaded -- --machine-dependent -k "resacct_timed and not gpt-tiny and not cruncher and not memory-bound-in-a-step"
    kill "${loaders[@]}" 2>/dev/null
    wait "${loaders[@]}" 2>/dev/null
esac

reports=()
for name in native avx2-cap one-thread loaded; do
    [ -f "$OUT/$name/report.json" ] && reports+=("$OUT/$name/report.json")
    [ -f "$OUT/$name-partial/report.json" ] && reports+=("$OUT/$name-partial/report.json")
done
if [ "${#reports[@]}" -gt 1 ]; then
    "$RESACCT" verify -q --merge "${reports[@]}" --report-dir "$OUT/matrix" | tail -1
fi
exit "$status"
