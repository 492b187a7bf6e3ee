"""Recorded claims (issue 31): the measurement is a committed GPU record, the prediction resacct's
code run now. A broken record value makes the claim fail; a missing or malformed record fails it
naming the file; every report names the board, the date and the record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from resacct.account.gpu.records.recorded import H100_RECORD, load_gpu_record, record_path
from resacct.errors import ResacctError
from resacct.harness.evaluate import ClaimFailure, evaluate_claim
from resacct.harness.loader import load_claims_file
from resacct.harness.registry import all_checks

REPO = Path(__file__).resolve().parents[1]
SPEC = REPO / "resacct" / "specs" / "gpu_recorded.claims.yaml"


def _claim(claim_id: str):  # type: ignore[no-untyped-def]
    return next(loaded for loaded in load_claims_file(SPEC).claims if loaded.id == claim_id)


def _broken_copy(tmp_path: Path, edit) -> str:  # type: ignore[no-untyped-def]
    record = json.loads(record_path(H100_RECORD).read_text())
    edit(record)
    path = tmp_path / "broken-record.json"
    path.write_text(json.dumps(record))
    return str(path)


def _set_measured(claim_id: str, value: object):  # type: ignore[no-untyped-def]
    def edit(record: dict) -> None:
        next(c for c in record["gpu_claims"] if c["id"] == claim_id)["measured"] = value
    return edit


@pytest.mark.slow  # 1.1 CPU s: every recorded claim run (resacct verify --area gpu_recorded runs them too) (measured with 5 agents on 2 cores)
def test_every_recorded_claim_runs_on_a_cpu_and_is_recorded_evidence() -> None:
    claims = load_claims_file(SPEC).claims
    assert len(claims) >= 15
    checks = all_checks()
    for loaded in claims:
        assert "gpu" not in loaded.claim.marks, loaded.id
        assert checks[loaded.claim.measure].evidence == "recorded", loaded.id
        assert record_path(loaded.claim.given["record"]).is_file(), loaded.id


def test_the_record_as_committed_decides_the_allocation_and_peak_claims() -> None:
    verdict = evaluate_claim(_claim("recorded-h100-gpt-tiny-forward-backward-peak"), dict(_claim("recorded-h100-gpt-tiny-forward-backward-peak").claim.given))
    assert verdict.measured == verdict.predicted == 56_240_128
    assert verdict.quantities["board"] == "NVIDIA H100 80GB HBM3" and verdict.quantities["record_file"] == H100_RECORD
    growth = evaluate_claim(_claim("recorded-h100-4000-bytes-round-to-4096"), dict(_claim("recorded-h100-4000-bytes-round-to-4096").claim.given))
    assert growth.measured == growth.predicted == growth.law_value == 4096


@pytest.mark.parametrize(("claim_id", "recorded_id", "broken"), [
    ("recorded-h100-two-32x32-float32-allocate-8192-bytes", "two-32x32-on-gpu-allocate-8192-bytes", 8704),
    ("recorded-h100-gpt-tiny-forward-backward-peak", "gpu-step-peak-predicted", 56_240_128 + 512),
])
def test_a_broken_record_value_makes_the_claim_fail(tmp_path: Path, claim_id: str, recorded_id: str, broken: int) -> None:
    loaded = _claim(claim_id)
    inputs = dict(loaded.claim.given, record=_broken_copy(tmp_path, _set_measured(recorded_id, broken)))
    with pytest.raises(ClaimFailure, match="does not hold|disagrees"):
        evaluate_claim(loaded, inputs)


@pytest.mark.slow  # 0.8 CPU s: a recorded step re-predicted (measured with 5 agents on 2 cores)
def test_a_broken_step_peak_beyond_one_percent_fails(tmp_path: Path) -> None:
    def edit(record: dict) -> None:
        record["step_time"]["gpt2-small"]["peak"][0]["measured_bytes"] = int(14_668_702_720 * 1.02)
    loaded = _claim("recorded-h100-gpt2-small-step-peak")
    with pytest.raises(ClaimFailure):
        evaluate_claim(loaded, dict(loaded.claim.given, record=_broken_copy(tmp_path, edit)))


def test_a_missing_or_malformed_record_fails_naming_the_file(tmp_path: Path) -> None:
    loaded = _claim("recorded-h100-one-float-takes-512-bytes")
    missing = str(tmp_path / "no-such-record.json")
    with pytest.raises(ResacctError, match="no-such-record.json: no such file"):
        evaluate_claim(loaded, dict(loaded.claim.given, record=missing))
    garbled = tmp_path / "garbled.json"
    garbled.write_text("{not json")
    with pytest.raises(ResacctError, match="garbled.json: not JSON"):
        evaluate_claim(loaded, dict(loaded.claim.given, record=str(garbled)))
    with pytest.raises(ResacctError, match="lecture-gpu-one-float-allocates-512-bytes.measured is 'five'"):
        evaluate_claim(loaded, dict(loaded.claim.given, record=_broken_copy(tmp_path, _set_measured("lecture-gpu-one-float-allocates-512-bytes", "five"))))
    with pytest.raises(ResacctError, match="no gpu_claims entry 'lecture-gpu-one-float-allocates-512-bytes'"):
        evaluate_claim(loaded, dict(loaded.claim.given, record=_broken_copy(tmp_path, lambda r: r["gpu_claims"].pop(
            next(i for i, c in enumerate(r["gpu_claims"]) if c["id"] == "lecture-gpu-one-float-allocates-512-bytes")))))
    with pytest.raises(ResacctError, match="board is None"):
        load_gpu_record(_broken_copy(tmp_path, lambda r: r.update(board=None)))


def test_reports_name_the_record_beside_a_recorded_claim() -> None:
    from resacct.reporting.evidence import evidence_columns, evidence_summary
    from resacct.reporting.markdown import render_errata_markdown, render_markdown
    from resacct.reporting.terminal import render_summary

    source = {"board": "NVIDIA H100 80GB HBM3", "recorded_on": "2026-11-26", "record_file": H100_RECORD}
    recorded = {"id": "r", "area": "gpu_recorded", "outcome": "refuted", "evidence": "recorded", "law": "36", "law_value": 36, "measured": 512,
                "truth": "512", "path": "specs/gpu_recorded.claims.yaml", "line": 3, "quantities": source}
    measured = {"id": "m", "area": "flops", "outcome": "holds", "evidence": "measured", "law": "1", "law_value": 1, "measured": 1,
                "path": "specs/flops.claims.yaml", "line": 3}
    assert evidence_columns([measured]) == ("measured", "published", "arithmetic")
    assert evidence_columns([measured, recorded]) == ("measured", "published", "arithmetic", "recorded")
    document = {"environment": {}, "claims": [measured, recorded]}
    named = f"recorded (NVIDIA H100 80GB HBM3, 2026-11-26, {H100_RECORD})"
    assert named in render_markdown(document) and named in render_errata_markdown(document)
    assert "| arithmetic | recorded |" in render_markdown(document)  # the per-area table's evidence columns
    assert evidence_summary(document["claims"])["total"]["recorded"] == 1
    summary = render_summary(document)
    assert "1 recorded on a GPU" in summary and "r recorded" in summary and "recorded 512" in summary


def test_step_time_is_calibrated_on_one_step_and_blind_to_the_judged_ones_time(tmp_path: Path) -> None:
    from resacct.account.gpu.timing.step_time import BoardRates, OpCost, calibrate_overhead, predict_step_seconds
    from resacct.checks.gpu_recorded import step_time

    ops = [OpCost("mm", 2 * 10**12, 10**6), OpCost("add", 0, 2 * 10**9)]
    prediction = predict_step_seconds(ops, BoardRates(10**12, 10**12, 0.001, ""))
    assert (prediction.gpu_sec, prediction.host_sec, prediction.step_sec, prediction.bound) == (2.002, 0.002, 2.002, "GPU (roofline per op)")
    with pytest.raises(ResacctError, match="not host-bound"):
        calibrate_overhead(ops, 10.0, 10**12, 10**12)
    assert calibrate_overhead(ops, 100.0, 10**12, 10**12) == 50.0
    with pytest.raises(ResacctError, match="is the step judged"):
        step_time(H100_RECORD, "gpt-tiny", step="gpt-tiny")
    committed = step_time(H100_RECORD, "gpt-tiny", step="gpt-small-cpu")

    def slower(record: dict) -> None:
        record["step_time"]["gpt-small-cpu"]["time"][0]["measured_sec"] = 0.0150
    changed = step_time(_broken_copy(tmp_path, slower), "gpt-tiny", step="gpt-small-cpu")
    assert changed.measured == 0.0150 and changed.quantities["predicted_step_sec"] == committed.quantities["predicted_step_sec"]
    # the refuted claim starts to hold on such a record, and then fails, as a refuted claim must
    loaded = _claim("recorded-h100-gpt-small-cpu-step-time-within-10-percent")
    with pytest.raises(ClaimFailure, match="marked refuted"):
        evaluate_claim(loaded, dict(loaded.claim.given, record=_broken_copy(tmp_path, slower)))


def test_a_broken_recorded_state_or_saved_bytes_fails_the_claim(tmp_path: Path) -> None:
    def edit(record: dict) -> None:
        step = record["step_time"]["gpt-tiny"]
        next(r for r in step["activations"] if r["quantity"].startswith("saved for backward"))["measured_bytes"] += 512
        next(r for r in step["training_state"] if r["quantity"].startswith("at optimizer step"))["measured_bytes"] -= 4
    broken = _broken_copy(tmp_path, edit)
    for claim_id in ("recorded-h100-gpt-tiny-saved-activations", "recorded-h100-gpt-tiny-training-state"):
        loaded = _claim(claim_id)
        assert evaluate_claim(loaded, dict(loaded.claim.given)).measured == evaluate_claim(loaded, dict(loaded.claim.given)).predicted
        with pytest.raises(ClaimFailure):
            evaluate_claim(loaded, dict(loaded.claim.given, record=broken))


def test_the_wheel_ships_the_same_record_and_reads_it_without_the_repository(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import resacct.account.gpu.records.recorded as recorded

    shipped = recorded.PACKAGED_RECORDS / Path(H100_RECORD).name
    assert shipped.read_bytes() == (REPO / H100_RECORD).read_bytes(), "resacct/specs/gpu_records/ must be a copy of docs/gpu/"
    monkeypatch.setattr(recorded, "REPOSITORY", tmp_path)  # an installed resacct: no docs/gpu/ beside it
    assert recorded.record_path(H100_RECORD) == shipped
    assert recorded.record_path("docs/gpu/no-such.json") == tmp_path / "docs/gpu/no-such.json"  # the error names what was asked
    from resacct.account.gpu.records.board_record import read_board_record

    h200 = "docs/gpu/2026-11-30-h200-record.json.gz"  # a board record (gzipped): its claims read the shipped copy too
    assert recorded.record_path(h200) == recorded.PACKAGED_RECORDS / Path(h200).name
    assert read_board_record(h200)["board"] == "NVIDIA H200"
