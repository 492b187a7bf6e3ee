#!/usr/bin/env python3
"""The GPU recorder (issue 31): one device call records the truth every CPU run then replays.

On a GPU, for each step of :data:`MATRIX` (in its own fresh process, so the allocator's trace
starts from its first allocation; each bounded by ``--step-limit``), it records one steady training
step — what the CUDA caching allocator did (``torch.cuda.memory._record_memory_history(
context=None)`` + ``_snapshot()``, compacted by :func:`resacct.account.gpu.records.record.compact_snapshot`),
``max_memory_allocated`` / ``max_memory_reserved`` over that step, the step's time (median of 5,
CUDA-synchronised), and every aten op's time with its shapes and dtypes (``torch.profiler``); then for each
model of :data:`SERVING` what ``resacct infer --device`` predicts — its weights loaded, the first prefill with its KV
cache kept (the allocator's trace and peaks), the prefill's time and a generated token's (tools/gpu_record_serve.py) — then
the board's ceilings: the most matmul FLOP/s over a sweep of shapes for bf16, fp16, tf32, fp32 and
fp8 where the board has it (the MAMF method: the best of a sweep, not a datasheet), memory
bandwidth (a 1 GiB copy) and the launch overhead of a tiny kernel; first, in a fresh process, the
library probe (:func:`resacct.account.gpu.allocator.library_workspaces.probe_library_allocations`): what the
first ``mm``, the first ``Linear`` with a bias and the first backward allocate — the cuBLAS/cuBLASLt
workspaces the predictions take from PyTorch's source, unconfirmed until a record has it; then, in another, where a
transformers step's process's first allocations come from (their Python frames: tools/gpu_record_origins.py). Each step is replayed through
the allocator model at once, so the call's summary already says whether the model holds.

    python3 tools/gpu_record.py                  on the GPU machine: at most --budget seconds (540)
    python3 tools/gpu_record.py --dry-run        on any CPU: the same code on tiny shapes, CUDA calls
                                                 replaced (the trace comes from resacct's allocation
                                                 recorder and model: a layout check, not a record)
    python3 tools/gpu_record.py --replay FILE    on any CPU: replay a record's steps through the model,
                                                 one line each (exit 1 if one does not hold)
    python3 tools/gpu_record.py --compare FILE   on any CPU: predict each recorded step on meta tensors
                                                 (predict_cuda_step_memory) beside what the board did
    python3 tools/gpu_record.py --merge A B --out DIR   on any CPU: records of one board from several calls (a failed
                                                 step recorded again with --only) as one record, the last whole entry per step
    python3 tools/gpu_record.py --claims FILE    on any CPU: a board record's recorded claims, as YAML for
                                                 resacct/specs/gpu_recorded.claims.yaml (5 per step)

Writes under ``--out`` (default ``$OUT``), three files (a device call returns at most 8):
``gpu-record.json.gz`` (the record: docs/gpu.md describes its format), ``gpu-record-summary.json``
(per step: status, seconds, peaks, step time, the replay's verdict) and ``gpu-record.log``.
Models are built from configs only (no weights, no network). Exit status 1 if any step failed.

Its parts are modules beside it (this file is the driver and the bundle): ``gpu_record_matrix.py``
(the steps; their models built by resacct.account.gpu.records.record_models), ``gpu_record_step.py`` (one step recorded, in its own
process), ``gpu_record_serve.py`` (one served model: prefill and decode), ``gpu_record_ceilings.py`` (the MAMF sweep, bandwidth, launch overhead) and
``gpu_record_replay.py`` (``--replay``, ``--compare``), ``gpu_record_origins.py`` (the first allocations' frames); the library probe is library code,
:func:`resacct.account.gpu.allocator.library_workspaces.probe_library_allocations`, beside the workspaces it settles.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # its parts, beside it (imported as a module, tools/ may not be on the path)

import gpu_record_step  # noqa: E402
from gpu_record_ceilings import record_ceilings  # noqa: E402
import gpu_record_serve  # noqa: E402
from gpu_record_matrix import GQA_LLAMA, HF_GPT2, LLAMA_32_1B, MATRIX, MIXTRAL_SMALL, SERVING, TINY  # noqa: E402,F401  (re-exported)
from gpu_record_claims import claims_yaml  # noqa: E402
from gpu_record_replay import compare_record, predict_recorded_step, read_record, replay_record  # noqa: E402,F401
from gpu_record_step import MAX_TRACE_ENTRIES, TIMED_STEPS, TIMED_STEPS_DRY, op_times, record_step  # noqa: E402,F401


# ── the driver: each step in a fresh process, bounded; the bundle ────────────────────────────
def _board(dry: bool) -> dict[str, Any]:
    import platform

    import torch
    board: dict[str, Any] = {"torch": torch.__version__, "cuda_runtime": torch.version.cuda, "python": platform.python_version()}
    from importlib.metadata import PackageNotFoundError, version

    for package in ("transformers", "peft"):  # the models' own code: their ops (and so the allocations) change with it
        try:
            board[package] = version(package)
        except PackageNotFoundError:
            board[package] = None
    if not dry and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        board.update(board=props.name, capability=f"{props.major}.{props.minor}", total_memory_bytes=props.total_memory,
                     multi_processor_count=props.multi_processor_count)
    else:
        board["board"] = "dry run on a CPU (no board)"
    return board


def _repository_name(path: Path) -> str:
    """``path`` as the claims name a record: relative to the repository where it lies inside it, else absolute."""
    resolved = path.resolve()
    return str(resolved.relative_to(REPO)) if resolved.is_relative_to(REPO) else str(resolved)


def _child(args: list[str], limit_sec: float, env: dict[str, str], log: Any) -> tuple[dict[str, Any] | None, str]:
    """Run this script with ``args`` in a fresh process, at most ``limit_sec``; its JSON (last stdout line) and status."""
    command = [sys.executable, str(Path(__file__).resolve()), *args]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=limit_sec, env=env, cwd=REPO)
    except subprocess.TimeoutExpired as expired:
        log.write(f"  timeout after {limit_sec:.0f} s\n{(expired.stderr or b'')[-2000:]!r}\n")
        return None, "timeout"
    log.write(done.stderr[-4000:])
    if done.returncode != 0:
        return None, f"failed (exit {done.returncode}): {done.stderr.strip().splitlines()[-1][:300] if done.stderr.strip() else ''}"
    return json.loads(done.stdout.strip().splitlines()[-1]), "ok"


def _merge(paths: list[Path], out: Path | None) -> int:
    """``--merge``: the records at ``paths`` as one record and summary in ``out`` (gpu_record_merge.py); exit 2 if refused."""
    from gpu_record_merge import MergeRefused, write_merged

    if out is None:
        print("gpu_record.py: --merge needs --out (or $OUT): the folder to write the merged record into", file=sys.stderr)
        return 2
    try:
        summary = write_merged(paths, out)
    except MergeRefused as refused:
        print(f"gpu_record.py: {refused}", file=sys.stderr)
        return 2
    rows = summary["steps"] + summary["serving"]
    print(f"== gpu_record --merge: {sum(row['status'] == 'ok' for row in rows)} of {len(rows)} steps ok from {len(paths)} records, "
          f"in {out}" + (f"; not recorded: {', '.join(summary['failed'])}" if summary["failed"] else ""))
    return 0


def _calibrate(record: Path, out: Path | None) -> int:
    """``--calibrate``: the record's calibration file (its dense steps traced on meta, ~15 CPU s), written beside it or into ``out``."""
    from resacct.account.gpu.records.record_calibration_fit import write_record_calibration
    from resacct.errors import ResacctError

    if not record.is_file():
        print(f"gpu_record.py: --calibrate {record}: no such file; expected a committed board record (docs/gpu/…-record.json.gz)", file=sys.stderr)
        return 2
    try:
        path = write_record_calibration(_repository_name(record), out or record.resolve().parent,
                                        progress=lambda name: print(f"  tracing {name} on meta", file=sys.stderr, flush=True))
    except ResacctError as error:
        print(f"gpu_record.py: {error}", file=sys.stderr)
        return 2
    print(f"== gpu_record --calibrate: {path} (copy it into resacct/specs/gpu_records/ beside the record)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="on a CPU: tiny shapes, CUDA calls replaced (a layout check)")
    parser.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    parser.add_argument("--only", default="", help="comma-separated step names (default: every step of MATRIX)")
    parser.add_argument("--budget", type=float, default=540.0, help="seconds for everything (default 540)")
    parser.add_argument("--step-limit", type=float, default=75.0, help="seconds for one step's process (default 75)")
    parser.add_argument("--replay", type=Path, help="a record (.json or .json.gz) to replay through the allocator model")
    parser.add_argument("--compare", type=Path, help="a record whose steps to predict on meta tensors, beside the recorded peaks")
    parser.add_argument("--merge", type=Path, nargs="+", metavar="FILE",
                        help="records of one board from several device calls, oldest first: one record (and summary) into --out")
    parser.add_argument("--claims", type=Path, help="a committed board record (docs/gpu/…-record.json.gz): print its recorded claims as YAML")
    parser.add_argument("--diff", type=Path, metavar="RECORD", help="a record: each training step's allocator events, the board's beside the "
                        "prediction's with the op of each, where they part (--only to choose steps)")
    parser.add_argument("--calibrate", type=Path, metavar="RECORD", help="a committed board record: fit the step-time model the commands "
                        "price a step by on its dense steps, into --out (default: beside the record; resacct/account/gpu/records/record_calibration.py)")
    parser.add_argument("--wheels", type=Path, metavar="DIR", help="run the steps with these wheels (tools/gpu_record_wheels.py: "
                        "this machine's transformers, carried to the board)")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--ceilings", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--library", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--origins", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(record_step(args.one, args.dry_run), separators=(",", ":")))
        return 0
    if args.serve:
        print(json.dumps(gpu_record_serve.record_serving(args.serve, args.dry_run), separators=(",", ":")))
        return 0
    if args.replay:
        return replay_record(args.replay)
    if args.compare:
        return compare_record(args.compare)
    if args.merge:
        return _merge(args.merge, args.out)
    if args.diff:
        from gpu_record_diff import diff_record

        return diff_record(args.diff, [name for name in args.only.split(",") if name])
    if args.claims:
        record = read_record(args.claims)
        if record is None:
            return 2
        print(claims_yaml(_repository_name(args.claims), record), end="")
        return 0
    if args.calibrate:
        return _calibrate(args.calibrate, args.out)
    if args.ceilings:
        print(json.dumps(record_ceilings(args.dry_run, args.budget)))
        return 0
    if args.library:  # a fresh process: what the first matmuls allocate (cuBLAS/cuBLASLt workspaces)
        from resacct.account.gpu.allocator.library_workspaces import probe_library_allocations
        print(json.dumps(probe_library_allocations("cpu" if args.dry_run else gpu_record_step.CUDA_DEVICE, cuda=not args.dry_run)))
        return 0
    if args.origins:  # a fresh process: the first allocations of a transformers step's process, with their Python frames
        from gpu_record_origins import record_allocation_origins
        print(json.dumps(record_allocation_origins(args.dry_run)))
        return 0
    chosen = [name for name in args.only.split(",") if name]
    unknown = [name for name in chosen if name not in MATRIX and name not in SERVING]
    if unknown:
        print(f"gpu_record.py: unknown step {unknown[0]!r}; expected one of: {', '.join([*MATRIX, *SERVING])}", file=sys.stderr)
        return 2
    names = [name for name in chosen if name in MATRIX] if chosen else list(MATRIX)
    served = [name for name in chosen if name in SERVING] if chosen else list(SERVING)
    if args.out is None:
        print("gpu_record.py: no --out and no $OUT; expected a folder to write into", file=sys.stderr)
        return 2
    if args.wheels is not None and not args.wheels.is_dir():
        print(f"gpu_record.py: --wheels {args.wheels}: not a folder; expected the one tools/gpu_record_wheels.py --download filled", file=sys.stderr)
        return 2
    if not args.dry_run:
        import torch
        if not torch.cuda.is_available():
            print("gpu_record.py: torch.cuda.is_available() is False; on a CPU, run with --dry-run", file=sys.stderr)
            return 2
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")]))}
    wheels = None
    if args.wheels is not None:
        from gpu_record_wheels import install

        site, wheels = install(args.wheels, env)
        print(json.dumps({"wheels": wheels}), flush=True)
        if site is not None:  # every step's process, and the header's versions (importlib.metadata reads sys.path in order)
            env["PYTHONPATH"] = os.pathsep.join([site, env["PYTHONPATH"]])
            sys.path.insert(0, site)
    steps, summary, serving, serving_summary = [], [], [], []
    with open(args.out / "gpu-record.log", "w") as log:
        log.write("== library probe\n")
        library, library_status = _child(["--library"] + (["--dry-run"] if args.dry_run else []), 60, env, log)
        print(json.dumps({"library_probe": library_status, "stages": library and library["stages"]}), flush=True)
        log.write("== allocation origins\n")
        origins, origins_status = _child(["--origins"] + (["--dry-run"] if args.dry_run else []), 90, env, log)
        print(json.dumps({"allocation_origins": origins_status, "sizes": origins and [a["size"] for a in origins["allocations"]]}), flush=True)
        # the training steps, then the served models (infer's prefill and decode): each in a fresh process
        for flag, name, entries, rows in [("--one", name, steps, summary) for name in names] + [("--serve", name, serving, serving_summary) for name in served]:
            left = args.budget - 130 - (time.perf_counter() - started)  # 130 s kept for the ceilings and the bundle
            if left < 15:
                entries.append({"name": name, "error": "skipped: the budget was spent"})
                rows.append({"name": name, "status": "skipped"})
                continue
            step_env = dict(env)
            if flag == "--one" and MATRIX[name][6].get("expandable_segments"):
                step_env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
            log.write(f"== {name}\n")
            log.flush()
            begin = time.perf_counter()
            result, status = _child([flag, name] + (["--dry-run"] if args.dry_run else []), min(args.step_limit, left), step_env, log)
            seconds = round(time.perf_counter() - begin, 1)
            entries.append(result if result is not None else {"name": name, "error": status})
            row = {"name": name, "status": status, "seconds": seconds}
            if result is not None:
                row.update({key: result[key] for key in ("max_memory_allocated", "max_memory_reserved", "trace_complete")},
                           trace_entries=len(result["trace"]), replay=result["replay"])
                row.update({"step_time_sec": result["step_time_sec"]["median"]} if flag == "--one" else
                           {"prefill_sec": result["prefill_sec"]["median"], "decode_sec_per_token": result["decode_sec_per_token"]["median"],
                            "decode_forced_sec_per_token": result["decode_forced_sec_per_token"].get("median")})
            rows.append(row)
            print(json.dumps(row), flush=True)
            log.write(json.dumps(row) + "\n")
        left = args.budget - 10 - (time.perf_counter() - started)
        ceilings, status = _child(["--ceilings", "--budget", str(max(left - 20, 10))] + (["--dry-run"] if args.dry_run else []), max(left, 10), env, log)
        print(json.dumps({"ceilings": status}), flush=True)
    from resacct.account.gpu.records.board_record import ceilings_in_brief
    from resacct.account.gpu.records.record import RECORD_FORMAT
    record = {"format": RECORD_FORMAT, "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "dry_run": args.dry_run,
              **_board(args.dry_run), "allocator_settings": next((s["allocator_settings"] for s in steps if "allocator_settings" in s), {}),
              "steps": steps, "serving": serving, "ceilings": ceilings if ceilings is not None else {"error": status},
              "library_probe": library if library is not None else {"error": library_status},
              "allocation_origins": origins if origins is not None else {"error": origins_status}, **({"wheels": wheels} if wheels else {})}
    with gzip.open(args.out / "gpu-record.json.gz", "wt") as handle:
        handle.write(json.dumps(record, separators=(",", ":")))  # json.dumps takes the C encoder (json.dump never does)
    failed = ([row["name"] for row in summary + serving_summary if row["status"] != "ok"] + ([] if ceilings is not None else ["ceilings"])
              + ([] if library is not None else ["library probe"]))
    (args.out / "gpu-record-summary.json").write_text(json.dumps(
        {"board": record["board"], "when": record["when"], "torch": record["torch"], "capability": record.get("capability"),
         "total_memory_bytes": record.get("total_memory_bytes"), "dry_run": args.dry_run, "seconds": round(time.perf_counter() - started, 1),
         "ceilings": ceilings_in_brief(ceilings) if ceilings is not None else None,
         "steps": summary, "serving": serving_summary, "ceilings_status": status, "library_probe_status": library_status,
         "allocation_origins_status": origins_status, "failed": failed,
         "record_bytes": (args.out / "gpu-record.json.gz").stat().st_size}, indent=1) + "\n")
    rows = summary + serving_summary
    print(f"== gpu_record: {sum(row['status'] == 'ok' for row in rows)} of {len(rows)} steps ok, {time.perf_counter() - started:.0f} s, files in {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
