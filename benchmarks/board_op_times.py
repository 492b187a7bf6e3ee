"""A board record's per-op device times beside resacct's per-op roofline (issue 31, part 3): where the step-time model
is wrong, op by op. For each recorded training step (and each served model's prefill and decode forward), the aten ops
resacct traces on meta — priced as ``board_step_time`` prices them, per op the longer of FLOPs ÷ the record's matmul
rate in the step's format and bytes ÷ its copy bandwidth — grouped by op name beside the board's profile of the same
step: calls and the **self** device time of each op's own kernels (an op's children's kernels are theirs), summed over
every shape. A view (``t``, ``view``, ``expand`` …) launches no kernel: its row shows what the model charges for it.

    .venv/bin/python benchmarks/board_op_times.py --record docs/gpu/<date>-<board>-record.json.gz
    .venv/bin/python benchmarks/board_op_times.py --record FILE --only gqa-llama/bf16/flash --top 30 --json

Per step it prints the totals first: the model's GPU seconds (Σ per op) and its views' share of them, the board's
busy time (Σ self device time over every op) and its measured step time (median; the gap is the host's). Names are
matched without the overload (``aten.mm.default`` and ``aten::mm`` are ``mm``); a composite op the profiler shows
(``aten::linear``) has no kernel of its own, its ``t`` and ``addmm`` do. A dry run's record (no device times) is
refused; ``--allow-dry-run`` reads one for a layout check (tests/test_board_op_times.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def op_name(name: str) -> str:
    """``aten.mm.default`` / ``aten::mm`` → ``mm``."""
    return name.split("::", 1)[1] if "::" in name else name.split(".")[1] if name.count(".") >= 1 else name


def is_view(name: str) -> bool:
    """Whether the aten op (``aten.t.default``) returns a view of its input: no kernel, no bytes moved."""
    import torch

    namespace, _, rest = name.partition(".")
    packet, _, overload = rest.partition(".")
    try:
        return bool(getattr(getattr(getattr(torch.ops, namespace), packet), overload or "default").is_view) or packet == "_unsafe_view"
    except (AttributeError, RuntimeError):
        return False


def compare_ops(predicted_ops: list[Any], recorded_ops: list[dict[str, Any]], rates: tuple[float, float]) -> dict[str, Any]:
    """Per op name: the traced calls and their roofline seconds (``rates``: matmul FLOP/s, bandwidth B/s) beside the
    recorded calls and self device seconds; and the totals."""
    matmul, bandwidth = rates
    rows: dict[str, dict[str, Any]] = defaultdict(lambda: {"traced_calls": 0, "predicted_sec": 0.0, "board_calls": 0, "board_self_sec": 0.0,
                                                           "view": False})
    views_sec = 0.0
    for op in predicted_ops:
        row = rows[op_name(op.op)]
        seconds = max(op.flops / matmul, op.bytes / bandwidth)
        row["traced_calls"] += 1
        row["predicted_sec"] += seconds
        if is_view(op.op):
            row["view"] = True
            views_sec += seconds
    for recorded in recorded_ops:
        row = rows[op_name(recorded["name"])]
        row["board_calls"] += recorded["calls"]
        row["board_self_sec"] += recorded["self_device_us"] * 1e-6
    predicted = sum(row["predicted_sec"] for row in rows.values())
    board = sum(row["board_self_sec"] for row in rows.values())
    table = [{"op": name, **row, "ratio": row["predicted_sec"] / row["board_self_sec"] if row["board_self_sec"] else None}
             for name, row in rows.items()]
    table.sort(key=lambda row: -max(row["predicted_sec"], row["board_self_sec"]))
    return {"predicted_gpu_sec": predicted, "predicted_views_sec": views_sec, "board_busy_sec": board, "rows": table}


def entries(record_name: str, *, only: list[str] | None, allow_dry_run: bool) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The record and, per recorded step and served forward, its comparison (:func:`compare_ops`)."""
    from resacct.account.gpu.records import board_record
    from resacct.account.gpu.records.record_models import predict_record_serving
    from resacct.checks import gpu_record_steps
    from resacct.facts.hardware import peak_format

    record = board_record.read_board_record(record_name, allow_dry_run=allow_dry_run)
    read = board_record.read_board_record
    results = []
    original = gpu_record_steps.read_board_record
    gpu_record_steps.read_board_record = lambda name, allow_dry_run=allow_dry_run: read(name, allow_dry_run=allow_dry_run)  # type: ignore[assignment]
    try:
        for entry in record.get("steps", []):
            if "error" in entry or (only and entry["name"] not in only):
                continue
            ops, fmt = gpu_record_steps.predicted_step_ops(record_name, entry["name"])
            rates = gpu_record_steps.record_rates(record_name, record, fmt)[:2]
            results.append({"entry": entry["name"], "forward": "step", "measured_sec": entry["step_time_sec"]["median"],
                            **compare_ops(ops, entry.get("ops") or [], rates)})
        for entry in record.get("serving", []):
            if "error" in entry or (only and entry["name"] not in only):
                continue
            served = predict_record_serving(entry, dry_run=False, capability=record.get("capability"))
            rates = gpu_record_steps.record_rates(record_name, record, peak_format(entry["weights"]))[:2]
            results.append({"entry": entry["name"], "forward": "prefill", "measured_sec": entry["prefill_sec"]["median"],
                            **compare_ops(served.ops, entry.get("ops") or [], rates)})
            results.append({"entry": entry["name"], "forward": "decode", "measured_sec": entry["decode_sec_per_token"]["median"],
                            **compare_ops(served.decode_ops, entry.get("decode_ops") or [], rates)})
    finally:
        gpu_record_steps.read_board_record = original  # type: ignore[assignment]
    return record, results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--record", required=True, help="a committed board record (docs/gpu/…-record.json.gz)")
    parser.add_argument("--only", action="append", default=None, metavar="ENTRY", help="a recorded step's or served model's name (repeatable)")
    parser.add_argument("--top", type=int, default=15, help="op names shown per entry, the costliest first (default 15)")
    parser.add_argument("--json", action="store_true", help="print every row as JSON")
    parser.add_argument("--allow-dry-run", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.top < 1:
        parser.error(f"--top {args.top}: expected at least 1")
    from resacct.errors import ResacctError

    try:
        record, results = entries(args.record, only=args.only, allow_dry_run=args.allow_dry_run)
    except ResacctError as error:
        print(f"board_op_times.py: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"record": args.record, "board": record["board"], "entries": results}, indent=1))
        return 0
    print(f"record: {args.record} ({record['board']}, torch {record['torch']}, {record['when'][:10]}); ratio = predicted ÷ the board's self time")
    for result in results:
        views = result["predicted_views_sec"] / result["predicted_gpu_sec"] if result["predicted_gpu_sec"] else 0.0
        print(f"\n{result['entry']} ({result['forward']}): model GPU {result['predicted_gpu_sec'] * 1e3:.3f} ms (views {views:.0%} of it); "
              f"board busy {result['board_busy_sec'] * 1e3:.3f} ms; measured {result['measured_sec'] * 1e3:.3f} ms")
        print(f"  {'op':40} {'traced':>7} {'board':>7} {'predicted ms':>13} {'board ms':>10} {'ratio':>7}")
        for row in result["rows"][:args.top]:
            ratio = "—" if row["ratio"] is None else f"{row['ratio']:.2f}"
            print(f"  {row['op'] + (' (view)' if row['view'] else ''):40} {row['traced_calls']:>7} {row['board_calls']:>7} "
                  f"{row['predicted_sec'] * 1e3:>13.4f} {row['board_self_sec'] * 1e3:>10.4f} {ratio:>7}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
