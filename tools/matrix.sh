#!/usr/bin/env bash
# docs/matrix.md and docs/matrix.json, written by a run (issue 32): every claim under each torch,
# `resacct verify` in each env's venv, merged with `resacct verify --merge`. Nothing in the output is
# typed by hand: dates, commit, versions and counts come from the run and its report.json files.
#
#   tools/matrix.sh [ENV ...]      default: torch24 torch26 torch27 torch28 torch29 torch210 torch211 torch212 main torch214
#
# ENV is a tox.ini env (its cached venv from tools/matrix_venv.sh, made if absent: each older torch
# is a ~2.8 GB download from PyPI, once per machine) or `main`: this checkout's .venv (CI's pins).
# Reports go to reports/matrix/<env>/; OUT=dir writes matrix.md/json there instead of docs/.
# REUSE=1 keeps the report.json an earlier run left in reports/matrix/<env>/ (its exit status is then
# read from its outcomes: 1 where a claim failed or was invalid) and runs only the envs without one.
set -uo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO"
ENVS=("$@")
DEFAULT_ENVS=(torch24 torch26 torch27 torch28 torch29 torch210 torch211 torch212 main torch214)
[ "${#ENVS[@]}" -gt 0 ] || ENVS=("${DEFAULT_ENVS[@]}")
OUT="${OUT:-$REPO/docs}"
WORK="$REPO/reports/matrix"
[ "${REUSE:-0}" = "1" ] || rm -rf "$WORK"
mkdir -p "$WORK" "$OUT"
MAIN_PY="$REPO/.venv/bin/python"

# the commit and the tracked changes beside it, when the runs start (the code they ran)
commit="$(git rev-parse --short HEAD)"
dirty="$(git status --porcelain --untracked-files=no -- . ':!docs/matrix.md' ':!docs/matrix.json' | wc -l | tr -d ' ')"  # its own outputs not counted
rows=()
for env in "${ENVS[@]}"; do
    if [ "$env" = "main" ]; then
        venv="$REPO/.venv"
    else
        venv="$(bash tools/matrix_venv.sh "$env")" || { echo "== $env: no venv; left out" >&2; continue; }
    fi
    if [ "${REUSE:-0}" = "1" ] && [ -f "$WORK/$env/report.json" ]; then
        echo "== $env: reusing $WORK/$env/report.json"
        code="$("$MAIN_PY" -c 'import json, sys; d = json.load(open(sys.argv[1])); print(int(any(c["outcome"] in ("failed", "invalid") for c in d["claims"])))' "$WORK/$env/report.json")"
        seconds="$("$MAIN_PY" -c 'import json, sys; print(round(json.load(open(sys.argv[1]))["run"]["seconds"]))' "$WORK/$env/report.json")"
    else
        echo "== $env: resacct verify ($venv)"
        start=$(date +%s)
        (cd "$WORK" && CI=true RESACCT_NO_CACHE=1 "$venv/bin/resacct" verify -q --no-roofline --report-dir "$WORK/$env" > "$WORK/$env.out" 2>&1)
        code=$?
        seconds=$(( $(date +%s) - start ))
        tail -n 2 "$WORK/$env.out"
    fi
    if [ ! -f "$WORK/$env/report.json" ]; then
        echo "== $env: no report.json (exit $code); left out" >&2
        continue
    fi
    transformers="$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("transformers"))' 2>/dev/null || echo none)"
    rows+=("$env	$code	$seconds	$transformers")
done
[ "${#rows[@]}" -gt 0 ] || { echo "matrix.sh: no env produced a report" >&2; exit 1; }

reports=()
for row in "${rows[@]}"; do reports+=("$WORK/${row%%	*}/report.json"); done
"$REPO/.venv/bin/resacct" verify -q --merge "${reports[@]}" --report-dir "$WORK/merged" || exit 1

printf '%s\n' "${rows[@]}" > "$WORK/rows.tsv"
"$MAIN_PY" - "$WORK" "$OUT" "$commit" "$dirty" "$*" "${DEFAULT_ENVS[*]}" <<'EOF'
import datetime, json, sys
from collections import Counter
from pathlib import Path

work, out, commit, dirty, argv, default_envs = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6].split()
rows = [line.rstrip("\n").split("\t") for line in (work / "rows.tsv").read_text(encoding="utf-8").splitlines() if line.strip()]
merged = (work / "merged" / "matrix.md").read_text(encoding="utf-8").split("\n", 2)[2]  # the table, without its title
matrix = json.loads((work / "merged" / "matrix.json").read_text(encoding="utf-8"))
now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
outcomes = ("holds", "refuted", "skipped", "inconclusive", "failed", "invalid")
lines = ["# The claims across torch versions", "",
         f"Written by `{('tools/matrix.sh ' + argv).strip()}` on {now}, at commit `{commit}`"
         + (f" (the working tree had {dirty} uncommitted tracked changes)" if dirty else "") + ": `resacct verify -q --no-roofline`"
         " in each env's venv (`tools/matrix_venv.sh`: tox.ini's pins, the hf and finetune extras; `main` is CI's `.venv`), "
         "then `resacct verify --merge` of their report.json files. Every figure below comes from those reports; "
         "rerun the script to refresh them, never edit them.", "",
         "| env | verified at | torch | transformers | python | machine | verify exit | claims | " + " | ".join(outcomes) + " | wall |",
         "|---|---|---|---|---|---|---|---|" + "---|" * len(outcomes) + "---|"]
summary = []
for env, code, seconds, transformers in rows:
    report = json.loads((work / env / "report.json").read_text(encoding="utf-8"))
    counts = Counter(claim["outcome"] for claim in report["claims"])
    environment = report["environment"]
    machine = f"{environment.get('device_name', '?')}, {environment.get('cpu_count', '?')} cores, load {environment.get('machine', {}).get('load_average_start', '?')}"
    lines.append(f"| {env} | {environment.get('created', '?')} | {environment['torch']} | {transformers} | {environment['python']} | {machine} | {code} | {len(report['claims'])} | "
                 + " | ".join(str(counts.get(o, 0)) for o in outcomes) + f" | {seconds} s |")
    summary.append({"env": env, "torch": environment["torch"], "transformers": transformers, "python": environment["python"],
                    "verify_exit": int(code), "seconds": int(seconds), "claims": len(report["claims"]), **{o: counts.get(o, 0) for o in outcomes}})
left_out = [env for env in default_envs if env not in {row[0] for row in rows}]
if left_out:
    lines += ["", f"Not in this run (no row above): {', '.join(left_out)}, of the script's default envs; "
              "`tools/matrix.sh` with no argument runs them all."]
lines += ["", "Timings are wall seconds on a shared machine (the load average is the report's): noisy. The commit is the one "
          "checked out when the script started; an env's report made earlier (REUSE=1) says when in its own column.", "",
          "## What differs between versions and how it is handled", "",
          "- **transformers 5.x needs torch>=2.6** (its `torch` extra): under an older torch it imports but disables PyTorch. "
          "resacct reads that from the installed distribution (`resacct/measurement/torch_limits.py`): every HF, finetune, "
          "inference and HF-plan claim skips naming both versions, every `--hf-config` command refuses in one line.",
          "- **torch 2.4** has no `_KinetoEvent.end_ns` (resacct uses start + duration), no public "
          "`create_selective_checkpoint_contexts` (the selective-checkpointing peak claim skips naming it), no public FSDP2 "
          "(the sharding claims skip: the engine import fails), cannot checkpoint meta tensors (`requires_torch: \">=2.6\"`), "
          "and its `weights_only` unpickler refuses `complex` (a checkpoint holding one is refused before it is written).",
          "- **FSDP2 on CPU tensors (torch 2.6)**: its collectives call `torch.cpu.Stream.record_event`, which 2.6 lacks (2.7.1 "
          "has it: the FSDP2 claims hold there): every FSDP2 launch failed there with \"'Stream' object has no attribute 'record_event'\" (13 sharding claims, "
          "measured 2026-11-30, the ZeRO-1 ones with them: one launch measures both). `resacct/checks/sharding_runs.py` "
          "(`fsdp2_cpu_gap`) leaves FSDP2's pieces out of the launch there: its claims skip saying why, ZeroRedundancyOptimizer's "
          "are measured.",
          "- **gloo teardown (torch < 2.8)**: `destroy_process_group()` could deadlock with the GIL held; "
          "`resacct/measurement/distributed.py` drops each group's backend last (see its docstring).",
          "- **FSDP2 parity on 2.8**: its gloo `reduce_scatter_tensor` sums where FSDP2 asks for AVG "
          "(`fsdp2-trains-like-one-process-*`: `requires_torch: \">=2.9\"`; with the floor lifted, 2026-11-30, 2.8.0 ends "
          "1.2e-5 / 1.8e-5 from one process on 2 / 4 ranks, over the 1e-5 bound, and 2.9.1, 2.10, 2.11 and 2.12.1 end 3.0e-8 / "
          "9.3e-8, as 2.13).",
          "- **Meta broadcasts under the fake process group (torch <= 2.10)**: `c10d::broadcast_` has no Meta kernel there, and "
          "ZeroRedundancyOptimizer's step broadcasts. `resacct/measurement/fake_group_broadcast.py` probes once and, where torch "
          "cannot, lets a meta broadcast return as the fake group's does (it writes nothing): the 10 ZeRO-paper claims (a 7.5B "
          "state on meta, up to 64 fake ranks) are measured from 2.6 on (they skipped on 2.10 and older before 2026-11-30); on "
          "2.13 the stand-in gives torch's own figures (tests/test_sharding_distributed.py).",
          "- **FSDP2 with a bf16 `MixedPrecisionPolicy` on CPU tensors** fails before 2.12 (\"Found dtype Float but expected "
          "BFloat16\", 2.7.1 to 2.11): `fsdp2-bf16-compute-keeps-fp32-shards-4-ranks` skips naming it; 2.12.1 holds it.",
          "- **The per-rank step peaks on gloo ranks (peak_sharded)** are exact from 2.7.1 (measured 2026-11-30 on 2.7.1 to "
          "2.14.1): gloo's buffers are named under FSDP2's pre-2.13 collective names (`all_gather_into_tensor` / "
          "`reduce_scatter_tensor`), the fake group's collectives that 2.10 and older cannot run on fake tensors return as on "
          "2.11, and before 2.9 gloo sums for AVG (12 bytes less). 2.12.1's FSDP2 peaks with no layer gathered (both layers' "
          "reduce-scatter inputs live): its own refuted claim, the 4 that describe the other peak skipped there. On 2.6 neither "
          "engine runs as traced (FSDP2 cannot step CPU tensors, DDP has no `init_sync`): `resacct shard` refuses in one line.",
          "- **The CPU sdpa kernel for grouped-query attention** (fewer key/value heads, transformers' `enable_gqa`): torch 2.8 "
          "runs it by the math kernel (its CPU flash kernel wants equal heads: the s² scores are kept, k and v at every query head), "
          "2.9.1, 2.10, 2.11, 2.12.1, 2.13 and 2.14.1 by the flash kernel; equal heads run flash on all, 2.4.1 included (measured 2026-11-28 and 2026-11-30). "
          "`resacct/measurement/sdpa_choice.py` runs a tiny sdpa once to see which, and the HF activation formulas follow it "
          "(the tiny Llama's 173,636 saved bytes on 2.8 against 161,860 by flash). The laws written for the flash kernel "
          "(`hf-llama-gqa-sdpa-cpu-layer-activations`, `lora-step-backward-flops-frozen-base`, `lora-saved-activations-q-v-bf16`, "
          "`lora-saved-activations-all-linear-any-shape`) carry `requires_torch: \">=2.9\"` (with the floor lifted, 2026-11-30: "
          "they fail on 2.8.0 and hold on 2.9.1, 2.10, 2.11 and 2.12.1).",
          "- **torch 2.4 and 2.5** print a DeprecationWarning when `torch.distributed.optim` is imported (their own "
          "`simplefilter(\"always\")`), and torch up to 2.8 makes a `tmp*` folder at that import: the ranks' forkserver "
          "imports it through `resacct/measurement/quiet_distributed_optim.py`, which catches the one and removes the other "
          "(a Ctrl-C'd `resacct shard` printed the warning and left the folder on 2.4.1).",
          "- **The GPU host's 4 HF failures (torch 2.11 + transformers 5.17) were transformers', not torch's**: torch 2.13 "
          "with transformers 5.17 measures the same numbers (the tiny Llama's step 14,156,032 FLOPs against the law's "
          "14,155,776), and the torch211 row below (transformers 5.24) holds them. Before transformers 5.19 "
          "`LlamaRotaryEmbedding` computes `inv_freq ⊗ positions` as a batched matmul, which FlopCounterMode counts "
          "(head_dim/2 · seq · 2 = 256 FLOPs, once, no gradient); 5.19 made it a broadcast product. Before 5.18 "
          "`batched_mm_experts_forward` clamps the expert ids out of place, and the index op saves that copy "
          "(8·T·k bytes more a layer: 21,084 against 21,068 B at one token). Those claims carry "
          "`requires_transformers: \">=5.19\"` (`hf-llama-gqa-step-flops`, `hf-mistral-step-flops`, "
          "`hf-mixtral-step-flops`) and `\">=5.18\"` (`hf-mixtral-sdpa-meta-layer-activations`): older transformers skip "
          "them naming both versions. resacct's declared floor is transformers 5.23 (pyproject; tox's hf-floor env).",
          "- Not measured here: torch 2.5 (a ~3 GB CUDA download into a cached venv, not made) and 2.15.0 (on PyPI; this "
          "machine's pip is capped at 2.14.1); torch 2.6 "
          "is the oldest transformers 5.x runs on (the HF claims' floor torch), 2.11 the GPU host's version.",
          "- Rows marked ⚠ change status between the envs; `—`: no outcome for the claim in that env's report.", "",
          "## Claims × envs", "", merged]
(out / "matrix.md").write_text("\n".join(lines).rstrip("\n") + "\n", encoding="utf-8")
(out / "matrix.json").write_text(json.dumps({"written": now, "commit": commit, "uncommitted_tracked_changes": dirty, "envs": summary, **matrix},
                                            indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
print(f"== wrote {out / 'matrix.md'} and {out / 'matrix.json'}: {len(matrix['rows'])} claims × {len(rows)} envs")
EOF
