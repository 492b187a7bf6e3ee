#!/usr/bin/env bash
# The GPU tier: every `gpu` claim run for real on a lent GPU machine, then the whole suite of
# claims (`resacct verify`), then the step-time account of three GPTs on the GPU. docs/gpu.md
# says how to run it and what it writes; issue 25 says why.
#
#   bash tools/gpu_tier.sh             on the GPU machine (no network): install the carried wheels, run
#   bash tools/gpu_tier.sh --dry-run   on any CPU machine, in under a minute: the same steps checked
#                                       (wheels, imports, gpu claims collected, commands parse, $OUT layout)
#
# Before a device call, here: `bash tools/gpu_tier_wheels.sh` (fills .whl/, ignored by git), then
# one device `run` with carry [".whl"] and the command
#   bash tools/gpu_tier.sh
# with a timeout_s of 540 (every step below is bounded; together at most 470 s + install).
#
# Everything goes under $OUT (the device tool sets it; default: a new temporary folder). At most
# 8 files come back from a device call, no more than 2 folders down, so $OUT holds exactly:
#   gpu-tier.log      everything printed, step by step
#   summary.json      each step's name, exit status, seconds and status; the board; dry run or not
#   machine.json      the machine profile (`resacct machine --json`, else torch.cuda's properties)
#   gpu-claims.json   pytest --claims-json of every `gpu` claim, RESACCT_REQUIRE_GPU=1
#   report.json       `resacct verify`'s report of every claim (the GPU host's CPU claims too)
#   errata.md         `resacct verify`'s errata (refuted claims and their truth)
#   verify.tar.gz     the whole verify report folder (report.md, report.html, roofline.png, pytest.log)
#   step-time.json    `resacct account --device cuda --json` of three GPTs
# A step that fails does not stop the others; the exit status is 1 if any step failed.
#
# The allocator and step-time record (issue 31) is a separate device call, no wheels needed:
#   python3 tools/gpu_record.py        (timeout_s 570; its --dry-run is tests/test_gpu_record.py's)
set -uo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO"

DRY_RUN=0
case "${1:-}" in
    --dry-run) DRY_RUN=1 ;;
    "") ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "usage: bash tools/gpu_tier.sh [--dry-run]" >&2; exit 2 ;;
esac

OUT="${OUT:-$(mktemp -d)}"
WHEELS="${GPU_TIER_WHEELS:-$REPO/.whl}"   # the carried wheels (another folder: the dry run's test of a clone without them)
mkdir -p "$OUT"
LOG="$OUT/gpu-tier.log"
: > "$LOG"
WORK="$(mktemp -d)"   # scratch (the verify folder, the per-model JSON) outside $OUT: only 8 files come back
trap 'rm -rf "$WORK"' EXIT

# The Python that runs everything: the device image's python3 there; this checkout's .venv here.
if [ -z "${PYTHON:-}" ]; then
    if [ "$DRY_RUN" = 1 ] && [ -x "$REPO/.venv/bin/python" ]; then PYTHON="$REPO/.venv/bin/python"; else PYTHON="$(command -v python3)"; fi
fi
export PYTHONUNBUFFERED=1

say() { echo "$*" | tee -a "$LOG"; }

STEPS_JSON=""   # one JSON object per step, comma-separated
FAILED=0
FAILED_NAMES=""

# step NAME SECONDS COMMAND...: run it under `timeout`, its output to the screen and the log;
# record its exit status and time; a failure marks the run failed and goes on.
step() {
    local name="$1" limit="$2"; shift 2
    say ""
    say "== [$name] (at most ${limit} s): $*"
    local start end rc status
    start=$(date +%s.%N)
    # bash -c: `timeout` runs a program, and most steps are this script's (exported) functions
    timeout --kill-after=10 "$limit" bash -c '"$@"' bash "$@" 2>&1 | tee -a "$LOG"
    rc=${PIPESTATUS[0]}
    end=$(date +%s.%N)
    if [ "$rc" -eq 0 ]; then status=ok; elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then status=timeout; FAILED=1; else status=failed; FAILED=1; fi
    [ "$status" = ok ] || FAILED_NAMES="$FAILED_NAMES $name"
    local seconds; seconds=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
    say "== [$name] $status (exit $rc, ${seconds} s)"
    STEPS_JSON="${STEPS_JSON:+$STEPS_JSON,}{\"name\": \"$name\", \"exit\": $rc, \"seconds\": $seconds, \"status\": \"$status\"}"
    return 0
}

write_summary() {
    "$PYTHON" - "$OUT" "$DRY_RUN" "[$STEPS_JSON]" <<'EOF' || echo '{"error": "could not write the summary"}' > "$1/summary.json"
import json, sys, datetime, pathlib
out, dry, steps = pathlib.Path(sys.argv[1]), sys.argv[2] == "1", json.loads(sys.argv[3])
board = None
machine = out / "machine.json"
if machine.exists():
    try:
        profile = json.loads(machine.read_text())
        if isinstance(profile, dict):  # `resacct machine --json` nests the profile under "machine"; the fallback has "cuda"
            board = (profile.get("machine") or profile).get("gpu_name") or (profile.get("cuda") or {}).get("name")
    except ValueError:
        pass
summary = {"dry_run": dry, "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "board": board,
           "steps": steps, "failed": [s["name"] for s in steps if s["status"] != "ok"],
           "files": sorted(p.name for p in out.iterdir() if p.is_file()) + ["summary.json"]}
(out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
EOF
}

# The machine profile: `resacct machine --json` where that command exists, else torch's own view.
MACHINE_FALLBACK='
import json, os, platform, sys, torch
p = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda_runtime": torch.version.cuda,
     "cpu_count": os.cpu_count(), "platform": platform.platform(), "cuda_available": torch.cuda.is_available()}
if torch.cuda.is_available():
    d = torch.cuda.get_device_properties(0)
    p["cuda"] = {"name": d.name, "capability": f"{d.major}.{d.minor}", "total_memory_bytes": d.total_memory,
                 "multi_processor_count": d.multi_processor_count, "l2_cache_bytes": getattr(d, "L2_cache_size", None),
                 "device_count": torch.cuda.device_count(), "tf32_matmul_allowed": torch.backends.cuda.matmul.allow_tf32}
    p["gpu_name"] = d.name
print(json.dumps(p, indent=1))
'
machine_profile() {
    if "$PYTHON" -m resacct machine --help >/dev/null 2>&1; then
        "$PYTHON" -m resacct machine --json > "$OUT/machine.json" || return 1
    else
        echo "(resacct machine is not there: torch.cuda's properties instead)"
        "$PYTHON" -c "$MACHINE_FALLBACK" > "$OUT/machine.json" || return 1
    fi
    cat "$OUT/machine.json"
}

# --------------------------------------------------------------------------------------------
# Wheels: what the device image lacks (tools/gpu_tier_wheels.sh --list) plus resacct's own.
missing_wheels() {
    local requirement name version file REQUIREMENTS
    mapfile -t REQUIREMENTS < <(bash "$REPO/tools/gpu_tier_wheels.sh" --list)
    for requirement in "${REQUIREMENTS[@]}"; do
        name="${requirement%%==*}"; version="${requirement##*==}"
        file="${name//-/_}-${version}-"
        compgen -G "$WHEELS/${file}*.whl" >/dev/null || echo "$requirement"
    done
    compgen -G "$WHEELS/resacct-*.whl" >/dev/null || echo "resacct (built from this checkout)"
}

check_wheels() {
    local missing; missing="$(missing_wheels | paste -sd' ' -)"
    if [ -z "$missing" ]; then
        echo "all $(bash "$REPO/tools/gpu_tier_wheels.sh" --list | wc -l) carried wheels and resacct's are in .whl/:"; ls "$WHEELS"
        return 0
    fi
    if [ "$DRY_RUN" = 1 ]; then
        echo "WARNING: $WHEELS lacks wheels (not needed on the CPU; a device run needs them); bash tools/gpu_tier_wheels.sh would fetch: $missing"
        return 0
    fi
    echo "ERROR: $WHEELS lacks $missing: run bash tools/gpu_tier_wheels.sh here and carry .whl" >&2
    return 1
}

install_wheels() {
    local site=/tmp/resacct-site
    # Each carried wheel; no index (there is no network there); no deps (the image has the rest).
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
        $(ls "$WHEELS"/*.whl | grep -v '/resacct-') || return 1
    # resacct itself, without dependencies: built from this tree (never stale), else the carried wheel.
    PYTHONPATH="$site" "$PYTHON" -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --upgrade --target "$site" "$REPO" \
        || "$PYTHON" -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target "$site" "$WHEELS"/resacct-*.whl || return 1
    "$PYTHON" -m pip list --path "$site" 2>/dev/null
}

IMPORTS='
import importlib
names = ["torch", "numpy", "einops", "jaxtyping", "beartype", "pytest", "hypothesis", "yaml", "regex", "packaging",
         "pydantic", "pydantic_core", "rich", "matplotlib", "xdist", "resacct", "pytest_resacct"]
for name in names:
    version = getattr(importlib.import_module(name), "__version__", "")
    print(name.ljust(15), version)
import resacct.harness.plugin, resacct.checks, resacct.cli
'
check_imports() { "$PYTHON" -c "$IMPORTS"; }

collect_gpu_claims() {
    local listing count
    listing="$("$PYTHON" -m pytest -p no:cacheprovider --collect-only -q -m gpu resacct/specs 2>&1)" || { echo "$listing"; return 1; }
    count="$(grep -c '::' <<<"$listing")"
    grep '::' <<<"$listing"
    echo "gpu claims collected: $count"
    [ "$count" -gt 0 ]
}

parse_commands() {
    "$PYTHON" -m resacct verify --help >/dev/null || { echo "resacct verify --help failed"; return 1; }
    "$PYTHON" -m resacct account --help > "$WORK/account-help.txt" || { echo "resacct account --help failed"; return 1; }
    grep -q -- "--device NAME" "$WORK/account-help.txt" && grep -q "cpu or cuda" "$WORK/account-help.txt" \
        || { echo "resacct account has no --device cuda"; return 1; }
    grep -q -- "--gpu-required" <("$PYTHON" -m resacct verify --help) || { echo "resacct verify has no --gpu-required"; return 1; }
    if "$PYTHON" -m resacct machine --help >/dev/null 2>&1; then echo "resacct machine: present"; else echo "resacct machine: absent (the profile falls back to torch.cuda)"; fi
    echo "resacct verify --help, resacct account --help (--device cuda): parse"
}

run_gpu_claims() {
    RESACCT_REQUIRE_GPU=1 "$PYTHON" -m pytest -p no:cacheprovider -q -rs -m gpu resacct/specs --claims-json "$OUT/gpu-claims.json"
}

run_verify() {
    local rc
    "$PYTHON" -m resacct verify --gpu-required --report-dir "$WORK/verify" --workers 14 -q
    rc=$?
    for file in report.json errata.md; do [ -f "$WORK/verify/$file" ] && cp "$WORK/verify/$file" "$OUT/"; done
    [ -d "$WORK/verify" ] && tar -czf "$OUT/verify.tar.gz" -C "$WORK" verify
    return "$rc"
}

# The step-time account of three GPTs on the GPU: measured step time, MFU against the board's
# datasheet peak and the GPU step peak. resacct's per-op step-time model (runtime_model) runs on
# the CPU only: on cuda `resacct account` leaves the predicted step time empty (docs/gpu.md).
ACCOUNT_MODELS=("gpt-tiny --batch 8" "gpt-small-cpu --batch 8" "gpt2-small --batch 8 --seq 1024")
run_account() {
    local spec="$1" name; name="${spec%% *}"
    # shellcheck disable=SC2086
    "$PYTHON" -m resacct account --model $spec --device cuda --measure --json > "$WORK/account-$name.json" || return 1
    "$PYTHON" - "$WORK/account-$name.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
for row in d["time"] + d["peak"]:
    print(f'{d["model"]:14} {row["quantity"]:42} predicted {row.get("predicted_sec", row.get("predicted_bytes"))!s:24} measured {row.get("measured_sec", row.get("measured_bytes", row.get("measured_flops_per_sec", row.get("measured"))))!s:24} {row["note"]}')
EOF
}
collect_account_json() {
    "$PYTHON" - "$OUT/step-time.json" "$WORK"/account-*.json <<'EOF'
import json, sys, pathlib
runs = {}
for path in sys.argv[2:]:
    try:
        runs[pathlib.Path(path).stem.removeprefix("account-")] = json.loads(pathlib.Path(path).read_text())
    except ValueError as error:
        runs[pathlib.Path(path).stem] = {"error": str(error)}
pathlib.Path(sys.argv[1]).write_text(json.dumps(runs, indent=1) + "\n")
EOF
}

export REPO WHEELS OUT LOG WORK PYTHON DRY_RUN MACHINE_FALLBACK IMPORTS
export -f say check_imports machine_profile missing_wheels check_wheels install_wheels collect_gpu_claims parse_commands run_gpu_claims run_verify run_account

# --------------------------------------------------------------------------------------------
say "== resacct GPU tier $([ "$DRY_RUN" = 1 ] && echo '(dry run)') in $REPO, OUT=$OUT, python $PYTHON"
if [ "$DRY_RUN" = 1 ]; then
    step wheels 10 check_wheels
    step imports 60 check_imports
    step machine 30 machine_profile
    step collect-gpu-claims 60 collect_gpu_claims
    step commands 60 parse_commands
    say "== what a real run would run: gpu claims (RESACCT_REQUIRE_GPU=1, --claims-json), resacct verify --gpu-required --workers 14, resacct account --device cuda --measure --json for: ${ACCOUNT_MODELS[*]}"
else
    step wheels 10 check_wheels
    step install 40 install_wheels
    export PYTHONPATH="/tmp/resacct-site${PYTHONPATH:+:$PYTHONPATH}" PATH="/tmp/resacct-site/bin:$PATH"
    step imports 30 check_imports
    step machine 20 machine_profile
    step gpu-claims 60 run_gpu_claims
    step verify 260 run_verify   # 181 s with 14 workers on the H100 (2026-11-26)
    for spec in "${ACCOUNT_MODELS[@]}"; do
        step "account-${spec%% *}" 30 run_account "$spec"
    done
    collect_account_json
fi
write_summary
say ""
say "== files in $OUT: $(cd "$OUT" && ls | paste -sd' ' -)"
if [ "$FAILED" = 0 ]; then say "== GPU tier: every step ok"; else say "== GPU tier: FAILED steps:$FAILED_NAMES"; fi
exit "$FAILED"
