"""A board record's served models (issue 31; ``tools/gpu_record_serve.py``, ``resacct/checks/gpu_record_serving.py``):
what ``resacct infer --device`` predicts — the weights loaded, the first prefill with its KV cache kept, the prefill's
time and a generated token's — judged against a record. No board record is committed yet: as in
tests/test_board_record.py, a **synthetic** one — a served model the recorder's dry run recorded on this CPU,
relabelled as an H200's, with a board's ceilings written by hand: the plumbing and the rules, not the accuracy.
"""

from __future__ import annotations

import copy
import gzip
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from resacct.account.gpu.records.record import RECORD_FORMAT
from resacct.checks.gpu_record_serving import board_decode_time, board_prefill_peak, board_prefill_time
from resacct.checks.gpu_record_steps import board_step_replay
from resacct.errors import ResacctError
from resacct.measurement.memo import forget_shared_measurements

REPO = Path(__file__).resolve().parents[1]
SERVED = "hf-gpt2/fp32/serve"
CEILINGS = {"matmul": {"bf16": {"max_flops_per_sec": 7.0e14}, "fp32": {"max_flops_per_sec": 5.0e13}},
            "copy": {"bandwidth_bytes_per_sec": 4.0e12}, "launch": {"per_launch_sec": 5e-6}}


#: every test here reads the one module fixture (dry_served): on one xdist worker, so it is made once a tier
pytestmark = pytest.mark.xdist_group("board-record-dry-served")


@pytest.fixture(scope="module")
def dry_served() -> dict[str, Any]:
    """GPT-2 (tiny, fp32 weights) served by the recorder's own code in its dry run."""
    pytest.importorskip("transformers")
    sys.path.insert(0, str(REPO / "tools"))
    try:
        import gpu_record_serve
    finally:
        sys.path.remove(str(REPO / "tools"))
    return gpu_record_serve.record_serving(SERVED, True)


def _record(tmp_path: Path, served: dict[str, Any], name: str = "2026-12-01-h200-record.json.gz") -> str:
    forget_shared_measurements()  # a record rewritten at the same path: its predictions made afresh
    record = {"format": RECORD_FORMAT, "when": "2026-12-01T09:00:00+00:00", "dry_run": False, "board": "NVIDIA H200", "torch": torch.__version__,
              "allocator_settings": {}, "steps": [], "serving": [served, {"name": "mixtral/serve", "error": "timeout"}], "ceilings": CEILINGS,
              "library_probe": {}}
    path = tmp_path / name
    with gzip.open(path, "wt") as handle:
        json.dump(record, handle)
    return str(path)


def test_a_served_models_trace_replays_through_the_training_steps_check(tmp_path: Path, dry_served: dict[str, Any]) -> None:
    record = _record(tmp_path, dry_served)
    for peak, field in (("allocated", "max_memory_allocated"), ("reserved", "max_memory_reserved")):
        outcome = board_step_replay(record, SERVED, peak)
        assert outcome.measured == dry_served[field] and outcome.predicted == outcome.measured and outcome.quantities["replay_exact"]


def test_the_prefill_peak_is_infers_prediction_of_the_recorded_model(tmp_path: Path, dry_served: dict[str, Any]) -> None:
    """The served model rebuilt on meta from the record (its config, weights, batch, context, kernel): near what the CPU
    held through the allocator model (the board's memory-efficient kernel modelled, where the CPU ran its flash one),
    and larger for a longer context the record says."""
    record = _record(tmp_path, dry_served)
    for peak, field in (("allocated", "max_memory_allocated"), ("reserved", "max_memory_reserved")):
        outcome = board_prefill_peak(record, SERVED, peak)
        assert outcome.measured == dry_served[field] and 0.9 < outcome.predicted / outcome.measured < 1.1, (peak, outcome)
        assert outcome.quantities["board"] == "NVIDIA H200" and outcome.quantities["attention"]
    longer = dict(copy.deepcopy(dry_served), context=4 * dry_served["context"])
    assert board_prefill_peak(_record(tmp_path, longer, "longer-record.json.gz"), SERVED, "allocated").predicted > \
        board_prefill_peak(record, SERVED, "allocated").predicted


def test_the_prefill_and_decode_times_are_priced_by_the_records_own_ceilings(tmp_path: Path, dry_served: dict[str, Any]) -> None:
    record = _record(tmp_path, dry_served)
    prefill = board_prefill_time(record, SERVED)
    q = prefill.quantities
    assert prefill.measured == dry_served["prefill_sec"]["median"]
    assert (q["matmul_flops_per_sec"], q["bandwidth_bytes_per_sec"], q["overhead_sec_per_op"]) == (5.0e13, 4.0e12, 5e-6)  # fp32 weights: fp32's rate
    assert q["host_sec"] == pytest.approx(q["ops"] * 5e-6) and q["predicted_prefill_sec"] == max(q["gpu_sec"], q["host_sec"]) > 0
    decode = board_decode_time(record, SERVED)
    d = decode.quantities
    assert decode.measured == dry_served["decode_sec_per_token"]["median"] and d["tokens_timed"] == dry_served["new_tokens"]
    # what a token reads, predicted on meta, is what the CPU model held: its weights and the cache its prefill returned
    assert d["read_bytes"] == dry_served["weight_bytes"] + dry_served["kv_cache_bytes"]
    # the next token's own forward (tests/test_decode_trace.py), not the prefill's: its ops on the host, its FLOPs
    assert d["memory_sec"] == pytest.approx(d["read_bytes"] / 4.0e12) and d["host_sec"] == pytest.approx(d["ops"] * 5e-6) and d["ops"] > 0
    assert d["predicted_token_sec"] == max(d["memory_sec"], d["compute_sec"], d["host_sec"]) and d["bound"].startswith("host")


def test_a_served_entry_that_failed_or_is_not_there_is_refused_by_name(tmp_path: Path, dry_served: dict[str, Any]) -> None:
    record = _record(tmp_path, dry_served)
    with pytest.raises(ResacctError, match=r"no step 'llama/serve'; expected one of hf-gpt2/fp32/serve, mixtral/serve"):
        board_decode_time(record, "llama/serve")
    with pytest.raises(ResacctError, match=r"step 'mixtral/serve' was not recorded \(timeout\)"):
        board_prefill_peak(record, "mixtral/serve", "reserved")
    broken = copy.deepcopy(dry_served)
    del broken["decode_sec_per_token"]
    with pytest.raises(ResacctError, match="not a whole record \\(serving hf-gpt2/fp32/serve: no 'decode_sec_per_token'\\)"):
        board_decode_time(_record(tmp_path, broken, "broken-record.json.gz"), SERVED)


@pytest.mark.slow  # a verify in its own process (~10 s)
def test_a_served_models_generated_claims_are_decided_by_verify(tmp_path: Path, dry_served: dict[str, Any]) -> None:
    """Six claims per served model (none for the one that failed), each decided by resacct verify, none skipped."""
    from tests.record_claims import generated_claims, verified

    claims = generated_claims(_record(tmp_path, dry_served))
    assert claims.count("  - id: recorded-h200-hf-gpt2-fp32-serve-") == 6 and "# mixtral/serve: not recorded (timeout): no claims" in claims
    report = verified(claims, tmp_path, "a synthetic record (tests/test_board_record_serving.py)")
    outcomes = {claim["id"]: claim["outcome"] for claim in report["claims"]}
    assert len(outcomes) == 6 and "skipped" not in outcomes.values() and "invalid" not in outcomes.values(), outcomes
    assert outcomes["recorded-h200-hf-gpt2-fp32-serve-reserved-replays-exactly"] == "holds"
    assert outcomes["recorded-h200-hf-gpt2-fp32-serve-allocated-replays-exactly"] == "holds"


def test_the_gpu_modules_examples_run() -> None:
    """The docstring examples of the step time (a decode's bound), the record models and the board record."""
    import doctest

    from resacct.account.gpu.records import board_record, record_models
    from resacct.account.gpu.timing import step_time

    for module in (step_time, record_models, board_record):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0, module.__name__


def test_the_calibrated_prefill_claim_needs_the_records_calibration_file(tmp_path: Path) -> None:
    """``gpu_recorded.board_prefill_time_calibrated`` prices by the calibration beside the record: without one, a one-line
    error naming the file it wanted (tools/gpu_record.py --claims leaves the claim out until --calibrate wrote it)."""
    import shutil

    from resacct.checks.gpu_record_serving import board_prefill_time_calibrated
    from resacct.errors import ResacctError

    record = tmp_path / "2026-11-30-h200-record.json.gz"
    shutil.copy(Path(__file__).resolve().parents[1] / "docs" / "gpu" / record.name, record)
    with pytest.raises(ResacctError, match="has no calibration beside it \\(2026-11-30-h200-record-calibration.json\\); expected tools/gpu_record.py --calibrate"):
        board_prefill_time_calibrated(str(record), "hf-gpt2/fp32/serve")
