"""benchmarks/board_op_times.py: a board record's per-op device times beside resacct's per-op roofline (issue 31: the
step-time model fixed op by op against a board, docs/gpu.md's views caveat). No board record holds device times yet: a
step and a served model the recorder's dry run recorded on this CPU, relabelled as an H200's, each op given a made-up
self device time — the plumbing and the sums, not the numbers."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from resacct.checks.gpu_record_steps import predicted_step_ops
from resacct.measurement.memo import forget_shared_measurements
from tests.record_claims import script_module, synthetic_record

STEP, SERVED = "gpt2-small/fp32/math", "hf-gpt2/fp32/serve"
CEILINGS = {"matmul": {"fp32": {"max_flops_per_sec": 5.0e13}}, "copy": {"bandwidth_bytes_per_sec": 4.0e12}, "launch": {"per_launch_sec": 5e-6}}
SELF_US = 2.5  # each recorded call's made-up kernel time


def _timed(ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**op, "self_device_us": SELF_US * op["calls"]} for op in ops]


@pytest.fixture(scope="module")
def record_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    pytest.importorskip("transformers")
    step = script_module("gpu_record_step").record_step(STEP, True)
    served = script_module("gpu_record_serve").record_serving(SERVED, True)
    step["ops"] = _timed(step["ops"])
    served["ops"], served["decode_ops"] = _timed(served["ops"]), _timed(served["decode_ops"])
    path = tmp_path_factory.mktemp("op-times") / "2026-12-01-h200-record.json.gz"
    return synthetic_record(path, steps=[step, {"name": "mixtral/timeout", "error": "timeout"}], ceilings=CEILINGS, serving=[served])


def test_each_step_and_served_forward_is_compared_op_by_op(record_file: str) -> None:
    forget_shared_measurements()
    op_times = script_module("board_op_times")
    record, results = op_times.entries(record_file, only=None, allow_dry_run=False)
    assert [(r["entry"], r["forward"]) for r in results] == [(STEP, "step"), (SERVED, "prefill"), (SERVED, "decode")]
    step = results[0]
    ops, fmt = predicted_step_ops(record_file, STEP)  # the time claim's own trace
    assert fmt == "fp32" and sum(row["traced_calls"] for row in step["rows"]) == len(ops)
    assert step["predicted_gpu_sec"] == pytest.approx(sum(max(op.flops / 5.0e13, op.bytes / 4.0e12) for op in ops))
    recorded = record["steps"][0]["ops"]
    assert sum(row["board_calls"] for row in step["rows"]) == sum(op["calls"] for op in recorded)
    assert step["board_busy_sec"] == pytest.approx(SELF_US * 1e-6 * sum(op["calls"] for op in recorded))
    assert step["measured_sec"] == record["steps"][0]["step_time_sec"]["median"]
    rows = {row["op"]: row for row in step["rows"]}
    assert rows["t"]["view"] and not rows["mm"]["view"] and rows["mm"]["traced_calls"] > 0 and rows["mm"]["board_calls"] > 0
    assert step["predicted_views_sec"] == pytest.approx(sum(row["predicted_sec"] for row in step["rows"] if row["view"]))
    decode = results[2]
    assert sum(row["board_calls"] for row in decode["rows"]) == sum(op["calls"] for op in record["serving"][0]["decode_ops"])


def test_names_match_without_their_overload() -> None:
    op_times = script_module("board_op_times")
    assert op_times.op_name("aten.mm.default") == op_times.op_name("aten::mm") == "mm"
    assert op_times.op_name("aten._scaled_dot_product_flash_attention.default") == "_scaled_dot_product_flash_attention"
    assert op_times.is_view("aten.t.default") and op_times.is_view("aten._unsafe_view.default") and not op_times.is_view("aten.addmm.default")
    assert not op_times.is_view("aten.no_such_op.default")


def test_the_table_prints_and_a_dry_run_is_refused(tmp_path: Path, record_file: str, capsys: pytest.CaptureFixture[str]) -> None:
    op_times = script_module("board_op_times")
    assert op_times.main(["--record", record_file, "--only", STEP, "--top", "5"]) == 0
    out = capsys.readouterr().out
    assert f"{STEP} (step): model GPU" in out and "board busy" in out and out.count("\n  ") >= 6
    dry = json.loads(gzip.open(record_file, "rt").read()) | {"dry_run": True, "board": "dry run on a CPU (no board)"}
    path = tmp_path / "dry-record.json.gz"
    with gzip.open(path, "wt") as handle:
        json.dump(dry, handle)
    assert op_times.main(["--record", str(path)]) == 2
    assert "dry run" in capsys.readouterr().err
