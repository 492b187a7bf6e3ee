"""A board's record (``resacct-gpu-record/1``, ``tools/gpu_record.py``) against torch's own tools (issue 31's anchors): per
recorded training step, the allocated peak, the reserved peak and the step time — predicted by resacct (the
``gpu_recorded`` claims' own code: ``board_step_peak``, ``board_step_time`` — the per-op roofline on the record's
ceilings — and ``board_step_time_calibrated`` — the model the ``--device`` commands print, calibrated on the record's
other steps as its claim is, ``tools/gpu_record_claims.py``'s folds, never on the judged step), by torch's MemTracker
(allocated only) and RuntimeEstimator (time only), and measured on the board — with each ratio predicted ÷ measured.
The table docs/gpu.md gives per recorded step is this script's output.

    .venv/bin/python benchmarks/board_record_anchors.py --record docs/gpu/<date>-<board>-record.json.gz
    .venv/bin/python benchmarks/board_record_anchors.py --record FILE --only gqa-llama/bf16/flash --json

How the anchors are run (what a user of them could run on a CPU-only machine; nothing of theirs is changed):

- **MemTracker** (``torch.distributed._tools.mem_tracker``): the step's model built as the recorder built it
  (:func:`~resacct.account.gpu.records.record_models.build_record_model`) under ``FakeTensorMode`` on **fake CPU tensors** (a
  CPU-only torch aborts on a fake ``cuda`` tensor autograd records: docs/gpu.md), the recipe's step (CPU autocast for an
  autocast recipe), AdamW foreach with its state made by one step first; its ``peak`` snapshot's total over the next
  step. The board's peak is absolute (``reset_peak_memory_stats`` before the step): so is this one. It sees no cuBLAS
  workspace and applies no CUDA rounding (it rounds ``cuda`` storages only), and gives no reserved memory.
- **RuntimeEstimator** (``torch.distributed._tools.runtime_estimator``, ``operator-level-cost-model``) over the same
  fake step; its device questions (``torch.cuda.is_available()``, ``get_device_tflops``, ``get_gpu_dram_gbps``) answered
  with the board's datasheet (resacct's table), the rest torch's own code.

A dry run's record is refused (``--allow-dry-run`` reads one, for a layout check of this script: tests/test_board_record_anchors.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _fake_step(entry: dict[str, Any]) -> tuple[Any, Any, Any, Any]:
    """(FakeTensorMode, run(), the model, its optimizer) — the recorded step on fake CPU tensors, the optimizer's state made;
    ``run()`` one more step. Built on meta (the recipe's dtype, peft's adapters), then given fake CPU storage in the
    module's order (:func:`~resacct.account.gpu.records.record_models.materialize_in_order`): a fake module cannot be cast in place."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from resacct.account.gpu.records.record_models import build_record_model, materialize_in_order
    from resacct.account.peak.recipes import recipe_step
    from resacct.facts.recipes import parse_recipe
    from resacct.measurement.memory_timeline import make_optimizer_state, run_training_step

    net, loss_fn = build_record_model(entry["family"], entry["model_config"], entry["attention"], entry.get("extra") or {}, tiny=False, device="meta")
    meta_tokens = torch.zeros(entry["batch"], entry["seq"], dtype=torch.long, device="meta")
    step = recipe_step(parse_recipe(entry["recipe"]), net, (meta_tokens, meta_tokens), loss_fn, "adamw")
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        model = materialize_in_order(step.model, "cpu")
        tokens = torch.zeros(entry["batch"], entry["seq"], dtype=torch.long)
        optimizer = step.make_optimizer([p for p in model.parameters() if p.requires_grad])
        for group in getattr(optimizer, "inner", optimizer).param_groups:
            group["foreach"] = True  # CUDA's choice (on CPU tensors torch would take the for-loop)
        make_optimizer_state(model, optimizer)
    return mode, lambda: run_training_step(model, (tokens, tokens), step.loss_fn, optimizer), model, optimizer


def memtracker_peak_bytes(entry: dict[str, Any]) -> int:
    """MemTracker's peak total over one steady step of ``entry`` (fake CPU tensors; see the module doc)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    mode, run, model, optimizer = _fake_step(entry)
    tracker = MemTracker()
    with mode:
        tracker.track_external(model, getattr(optimizer, "inner", optimizer))
        with tracker:
            tracker.reset_mod_stats()
            run()
        return int(sum(per_device["Total"] for per_device in tracker.get_tracker_snapshot("peak").values()))


def runtime_estimator_sec(entry: dict[str, Any], board: Any) -> float:
    """RuntimeEstimator's roofline of one steady step of ``entry``, ``board``'s datasheet as its device."""
    import torch
    import torch.utils._runtime_estimation as estimation
    from torch.distributed._tools.runtime_estimator import RuntimeEstimator

    from resacct.facts.hardware import peak_flops_per_sec

    def tflops(dtype: Any) -> float:
        return peak_flops_per_sec(board, dtype if dtype in (torch.float32, torch.bfloat16, torch.float16) else torch.float32) / 1e12

    mode, run, _, _ = _fake_step(entry)
    estimator = RuntimeEstimator()
    with mock.patch("torch.cuda.is_available", return_value=True), mock.patch("torch.cuda.is_current_stream_capturing", return_value=False), \
            mock.patch.object(estimation, "get_device_tflops", tflops), \
            mock.patch.object(estimation, "get_gpu_dram_gbps", lambda: board.memory_bandwidth_bytes_per_sec / 1e9), \
            mock.patch("builtins.print"), mode, estimator("operator-level-cost-model"):
        run()
    return float(estimator.total_runtime) / 1e3  # it counts milliseconds


def _anchor(tool: Any, *args: Any) -> tuple[Any, str | None]:
    """(``tool(*args)``, None), or (None, its error in one line) where torch's tool cannot run the step (MemTracker hooks
    every parameter: a frozen LoRA base refuses the hook) — an anchor's own limit, reported as such."""
    try:
        return tool(*args), None
    except Exception as error:  # noqa: BLE001 — any failure of the anchor is its result
        return None, f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0][:160]}"


def step_rows(record_name: str, *, only: list[str] | None = None, allow_dry_run: bool = False) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The record and one row per recorded training step (or those named in ``only``)."""
    from resacct.account.gpu.records import board_record
    from resacct.checks.gpu_record_steps import board_step_peak, board_step_time
    from resacct.errors import ResacctError
    from resacct.facts.hardware import accelerator_for_cuda_name

    record = board_record.read_board_record(record_name, allow_dry_run=allow_dry_run)
    board = accelerator_for_cuda_name(record["board"])
    if board is None and record.get("dry_run") and allow_dry_run:  # a layout check on a CPU's record: the H100's datasheet stands in
        from resacct.facts.hardware import get_accelerator

        board = get_accelerator("h100")
    if board is None:
        raise ResacctError(f"GPU record {record_name}: board {record['board']!r} is not in resacct's datasheet table; expected a board it has")
    rows = []
    from resacct.checks import gpu_record_steps

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    from gpu_record_claims import calibration_sets

    folds = calibration_sets(record["steps"])

    read = board_record.read_board_record  # the claims' code reads the record as a claim would: a dry run only when asked here
    with mock.patch.object(gpu_record_steps, "read_board_record", lambda name, allow_dry_run=allow_dry_run: read(name, allow_dry_run=allow_dry_run)):
        for entry in record["steps"]:
            if "error" in entry or (only and entry["name"] not in only):
                continue
            name = entry["name"]
            predicted, predicted_error = _anchor(lambda: (*(board_step_peak(record_name, name, peak).predicted for peak in ("allocated", "reserved")),
                                                          board_step_time(record_name, name).quantities["predicted_step_sec"]))
            calibrated, calibrated_error = (_anchor(lambda: gpu_record_steps.board_step_time_calibrated(record_name, name, folds[name]).quantities[
                "predicted_step_sec"]) if name in folds else (None, "too few dense steps in the record to calibrate on others"))
            tracked, tracked_error = _anchor(memtracker_peak_bytes, entry)
            estimated, estimated_error = _anchor(runtime_estimator_sec, entry, board)
            allocated, reserved, seconds = predicted if predicted is not None else (None, None, None)
            measured = {"allocated": entry["max_memory_allocated"], "reserved": entry["max_memory_reserved"], "time": entry["step_time_sec"]["median"]}

            def ratio(value: Any, of: str) -> float | None:
                return None if value is None else value / measured[of]

            rows.append({
                "step": name, "recorded_allocated_bytes": measured["allocated"], "recorded_reserved_bytes": measured["reserved"],
                "recorded_step_sec": measured["time"], "resacct_allocated_bytes": allocated, "resacct_reserved_bytes": reserved,
                "resacct_step_sec": seconds, "resacct_error": predicted_error, "calibrated_step_sec": calibrated,
                "calibrated_on": folds.get(name), "calibrated_error": calibrated_error, "memtracker_allocated_bytes": tracked,
                "memtracker_error": tracked_error, "runtime_estimator_step_sec": estimated, "runtime_estimator_error": estimated_error,
                "resacct_allocated_ratio": ratio(allocated, "allocated"), "memtracker_allocated_ratio": ratio(tracked, "allocated"),
                "resacct_reserved_ratio": ratio(reserved, "reserved"), "resacct_time_ratio": ratio(seconds, "time"),
                "calibrated_time_ratio": ratio(calibrated, "time"),
                "runtime_estimator_time_ratio": ratio(estimated, "time")})
    return record, rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--record", required=True, help="a committed board record (docs/gpu/…-record.json.gz)")
    parser.add_argument("--only", action="append", default=None, metavar="STEP", help="a recorded step's name (repeatable; default: every step)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--allow-dry-run", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    import torch

    from resacct.errors import ResacctError

    try:
        record, rows = step_rows(args.record, only=args.only, allow_dry_run=args.allow_dry_run)
    except ResacctError as error:
        print(f"board_record_anchors.py: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"record": args.record, "board": record["board"], "rows": rows}, indent=1))
        return 0
    print(f"record: {args.record} ({record['board']}, torch {record['torch']}, {record['when'][:10]}); this run: torch {torch.__version__}")
    print("ratio = predicted ÷ measured on the board")
    def shown(value: Any, form: str) -> str:
        return "—" if value is None else format(value, form)

    print(f"\n{'step':46} {'allocated: resacct':>18} {'ratio':>6} {'MemTracker':>14} {'ratio':>6} {'recorded':>14}  "
          f"{'reserved: resacct':>17} {'ratio':>6} {'recorded':>14}")
    for row in rows:
        print(f"{row['step']:46} {shown(row['resacct_allocated_bytes'], ','):>18} {shown(row['resacct_allocated_ratio'], '.3f'):>6} "
              f"{shown(row['memtracker_allocated_bytes'], ','):>14} {shown(row['memtracker_allocated_ratio'], '.3f'):>6} "
              f"{row['recorded_allocated_bytes']:>14,}  {shown(row['resacct_reserved_bytes'], ','):>17} {shown(row['resacct_reserved_ratio'], '.3f'):>6} "
              f"{row['recorded_reserved_bytes']:>14,}")
    print(f"\n{'step':46} {'time: roofline ms':>17} {'ratio':>6} {'calibrated ms':>13} {'ratio':>6} {'RuntimeEstimator ms':>19} {'ratio':>6} "
          f"{'recorded ms':>12}")
    def ms(seconds: float | None) -> float | None:
        return None if seconds is None else seconds * 1e3

    for row in rows:
        print(f"{row['step']:46} {shown(ms(row['resacct_step_sec']), '.3f'):>17} {shown(row['resacct_time_ratio'], '.3f'):>6} "
              f"{shown(ms(row['calibrated_step_sec']), '.3f'):>13} {shown(row['calibrated_time_ratio'], '.3f'):>6} "
              f"{shown(ms(row['runtime_estimator_step_sec']), '.3f'):>19} {shown(row['runtime_estimator_time_ratio'], '.3f'):>6} "
              f"{row['recorded_step_sec'] * 1e3:>12.3f}")
    within = {key: sum(1 for row in rows if row[key] is not None and abs(row[key] - 1) <= 0.10)
              for key in ("resacct_time_ratio", "calibrated_time_ratio", "runtime_estimator_time_ratio")}
    print(f"within 10 % of the board: roofline {within['resacct_time_ratio']}, calibrated (held out) {within['calibrated_time_ratio']}, "
          f"RuntimeEstimator {within['runtime_estimator_time_ratio']} of {len(rows)}")
    for row in rows:
        for tool, key in (("resacct", "resacct"), ("resacct's calibrated model", "calibrated"), ("MemTracker", "memtracker"),
                          ("RuntimeEstimator", "runtime_estimator")):
            if row[f"{key}_error"]:
                print(f"  {tool} could not predict {row['step']}: {row[f'{key}_error']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
