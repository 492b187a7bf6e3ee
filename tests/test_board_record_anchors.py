"""benchmarks/board_record_anchors.py: a board record's steps beside torch's MemTracker and RuntimeEstimator (issue 31's
anchors; docs/gpu.md's table per recorded step is its output). No board record is committed yet: a step the recorder's
dry run recorded on this CPU, relabelled as an H200's (as tests/test_board_record.py does) — the plumbing, not the numbers."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from resacct.checks.gpu_record_steps import board_step_peak, board_step_time
from resacct.measurement.memo import forget_shared_measurements
from tests.record_claims import script_module, synthetic_record

STEP = "gpt2-small/fp32/math"
CEILINGS = {"matmul": {"fp32": {"max_flops_per_sec": 5.0e13}}, "copy": {"bandwidth_bytes_per_sec": 4.0e12}, "launch": {"per_launch_sec": 5e-6}}


def _has(module: str) -> bool:
    """Whether ``module`` imports here (torch 2.6 ships runtime_estimator, which imports a module it lacks)."""
    import importlib

    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


@pytest.fixture(scope="module")
def record_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    step = script_module("gpu_record_step").record_step(STEP, True)
    failed = {"name": "mixtral/timeout", "error": "timeout"}
    return synthetic_record(tmp_path_factory.mktemp("anchors") / "2026-12-01-h200-record.json.gz", steps=[step, failed], ceilings=CEILINGS)


def test_each_recorded_step_gets_resacct_memtracker_and_runtime_estimator_beside_the_board(record_file: str) -> None:
    forget_shared_measurements()
    anchors = script_module("board_record_anchors")
    record, rows = anchors.step_rows(record_file)
    (row,) = rows  # the step that failed on the board has no row
    entry = record["steps"][0]
    assert (row["recorded_allocated_bytes"], row["recorded_reserved_bytes"]) == (entry["max_memory_allocated"], entry["max_memory_reserved"])
    assert row["resacct_allocated_bytes"] == board_step_peak(record_file, STEP, "allocated").predicted  # the claims' own prediction
    assert row["resacct_step_sec"] == board_step_time(record_file, STEP).quantities["predicted_step_sec"]
    assert row["resacct_error"] is None
    if _has("torch.distributed._tools.mem_tracker"):
        # MemTracker's absolute peak of the same step on fake CPU tensors: what the model holds, a little less than CUDA's rounded blocks
        assert row["memtracker_error"] is None and 0.8 < row["memtracker_allocated_ratio"] < 1.2
    else:  # an older torch (2.4) has no MemTracker: the row says so, and the table goes on
        assert row["memtracker_allocated_bytes"] is None and "No module named 'torch.distributed._tools.mem_tracker'" in row["memtracker_error"]
    if _has("torch.distributed._tools.runtime_estimator") and _has("torch.utils._runtime_estimation"):  # 2.6 has the first only
        assert row["runtime_estimator_error"] is None and row["runtime_estimator_step_sec"] > 0
    else:
        assert row["runtime_estimator_step_sec"] is None and "ModuleNotFoundError" in row["runtime_estimator_error"]
    assert row["resacct_time_ratio"] == pytest.approx(row["resacct_step_sec"] / entry["step_time_sec"]["median"])
    # one dense step: nothing to calibrate on but itself, so no calibrated time — said, not guessed
    assert row["calibrated_step_sec"] is None and row["calibrated_error"] == "too few dense steps in the record to calibrate on others"


@pytest.mark.slow  # the H200 record's step and its calibration fold traced on meta, and both anchors run on it (~15 s)
@pytest.mark.skipif(not _has("transformers"), reason="the H200 record's steps are transformers models")
def test_the_calibrated_column_is_the_claims_held_out_prediction() -> None:
    """The calibrated time beside the board is what the step's ``…-step-time-calibrated`` claim judges: the same
    calibration steps (the claim's ``calibrate_on``), never the judged one."""
    import torch
    import yaml

    if torch.__version__ < "2.8":
        pytest.skip("the H200 record's predictions need flash's meta kernel (torch >= 2.8)")
    from resacct.checks.gpu_record_steps import board_step_time_calibrated

    record = "docs/gpu/2026-11-30-h200-record.json.gz"
    step = "gqa-llama/bf16/flash"
    spec = yaml.safe_load((Path(__file__).resolve().parents[1] / "resacct" / "specs" / "gpu_recorded.claims.yaml").read_text(encoding="utf-8"))
    (claim,) = [c for c in spec["claims"] if c["id"] == "recorded-h200-gqa-llama-bf16-flash-step-time-calibrated"]
    _, (row,) = script_module("board_record_anchors").step_rows(record, only=[step])
    assert row["calibrated_on"] == claim["given"]["calibrate_on"] and step not in row["calibrated_on"]
    assert row["calibrated_step_sec"] == board_step_time_calibrated(record, step, claim["given"]["calibrate_on"]).quantities["predicted_step_sec"]
    assert row["calibrated_time_ratio"] == pytest.approx(row["calibrated_step_sec"] / row["recorded_step_sec"])


def test_a_dry_run_is_refused_in_one_line_unless_asked(tmp_path: Path, record_file: str, capsys: pytest.CaptureFixture[str]) -> None:
    anchors = script_module("board_record_anchors")
    dry = json.loads(gzip.open(record_file, "rt").read()) | {"dry_run": True, "board": "dry run on a CPU (no board)"}
    path = tmp_path / "dry-record.json.gz"
    with gzip.open(path, "wt") as handle:
        json.dump(dry, handle)
    assert anchors.main(["--record", str(path)]) == 2
    assert capsys.readouterr().err.startswith(f"board_record_anchors.py: GPU record {path}: a dry run made on a CPU")
    assert anchors.main(["--record", str(path), "--allow-dry-run", "--json"]) == 0
    assert [row["step"] for row in json.loads(capsys.readouterr().out)["rows"]] == [STEP]
