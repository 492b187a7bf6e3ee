"""A board's record read back (issue 31): the recorded claims of ``resacct/checks/gpu_record_steps.py`` and the
ceilings the ``--device`` commands take from a committed record's summary (``resacct/account/gpu/records/board_record.py``).

No board record is committed yet (no GPU lent since the recorder was written): these tests make a **synthetic**
one — a step the recorder's dry run recorded on this CPU (resacct's allocation recorder feeding the allocator
model over a real CPU step), relabelled as an H200's, with a board's ceilings written by hand. So they check the
plumbing and the rules (what is measured, what is predicted, what may calibrate what), not the model's accuracy.
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

from resacct.account.gpu.records import board_record
from resacct.account.gpu.timing.board_rates import board_rates
from resacct.account.gpu.answers.device_answer import calibration_text
from resacct.account.gpu.records.record import RECORD_FORMAT
from resacct.checks.gpu_record_steps import board_step_events, board_step_peak, board_step_replay, board_step_time
from resacct.cli import main
from resacct.errors import ResacctError
from resacct.facts.hardware import get_accelerator, peak_flops_per_sec
from resacct.measurement.memo import forget_shared_measurements

REPO = Path(__file__).resolve().parents[1]
STEP = "gpt2-small/fp32/math"
TWIN = "gpt2-small/fp32/math/again"
BOARD_CEILINGS = {"matmul": {"bf16": {"max_flops_per_sec": 7.0e14}, "fp32": {"max_flops_per_sec": 5.0e13}, "fp8": {"max_flops_per_sec": None}},
                  "copy": {"bandwidth_bytes_per_sec": 4.0e12}, "launch": {"per_launch_sec": 5e-6}}


#: every test here reads the one module fixture (dry_step): on one xdist worker, so it is made once a tier
pytestmark = pytest.mark.xdist_group("board-record-dry-step")


@pytest.fixture(scope="module")
def dry_step() -> dict[str, Any]:
    """One step recorded by the recorder's own code in its dry run (resacct's GPT, fp32, math attention: no transformers)."""
    sys.path.insert(0, str(REPO / "tools"))
    try:
        import gpu_record_step
    finally:
        sys.path.remove(str(REPO / "tools"))
    return gpu_record_step.record_step(STEP, True)


def _write(path: Path, record: dict[str, Any]) -> str:
    with gzip.open(path, "wt") as handle:
        json.dump(record, handle)
    return str(path)


@pytest.fixture
def board_record_file(tmp_path: Path, dry_step: dict[str, Any]) -> str:
    """The dry run's step relabelled as an H200's, beside a twin of it (host-bound time 20 ms) and a step that failed."""
    forget_shared_measurements()  # a record rewritten at the same path within a test's second: its predictions made afresh
    twin = dict(copy.deepcopy(dry_step), name=TWIN, step_time_sec={"median": 0.02, "all": [0.02]})
    record = {"format": RECORD_FORMAT, "when": "2026-12-01T09:00:00+00:00", "dry_run": False, "board": "NVIDIA H200", "torch": torch.__version__,
              "allocator_settings": {}, "steps": [copy.deepcopy(dry_step), twin, {"name": "mixtral/timeout", "error": "timeout"}],
              "ceilings": BOARD_CEILINGS, "library_probe": {}}
    return _write(tmp_path / "2026-12-01-h200-record.json.gz", record)


def test_the_replay_claim_reads_the_boards_peaks_and_replays_its_trace(board_record_file: str, dry_step: dict[str, Any]) -> None:
    for peak, field in (("allocated", "max_memory_allocated"), ("reserved", "max_memory_reserved")):
        outcome = board_step_replay(board_record_file, STEP, peak)
        assert outcome.measured == dry_step[field] and outcome.predicted == outcome.measured  # the model made this trace: it replays exactly
        assert outcome.quantities["replay_exact"] is True and outcome.quantities["segment_events"] >= 1
        assert outcome.quantities["board"] == "NVIDIA H200" and outcome.quantities["record_file"] == board_record_file


def test_a_replay_that_differs_from_the_board_is_seen(tmp_path: Path, dry_step: dict[str, Any]) -> None:
    """A trace whose allocations inside the measured window grew (as if the model's block sizes were wrong):
    the replayed peak is no longer the recorded one — the claim's law would fail."""
    step = copy.deepcopy(dry_step)
    window = step["window_start"]
    grown = next(index for index, row in enumerate(step["trace"]) if index >= window and row[0] == "alloc")
    step["trace"][grown][2] += 64 * 2**20  # 64 MiB more asked for: a segment of its own
    record = {"format": RECORD_FORMAT, "when": "2026-12-01T09:00:00+00:00", "dry_run": False, "board": "NVIDIA H200", "torch": torch.__version__,
              "allocator_settings": {}, "steps": [step], "ceilings": BOARD_CEILINGS}
    outcome = board_step_replay(_write(tmp_path / "grown-record.json.gz", record), STEP, "reserved")
    assert outcome.predicted > outcome.measured and outcome.quantities["replay_exact"] is False


def test_the_peak_claim_rebuilds_the_step_the_record_describes(board_record_file: str, dry_step: dict[str, Any], tmp_path: Path) -> None:
    """The prediction is the step rebuilt on meta from the record's own description (the config built, the batch):
    near what the CPU step held through the allocator model (CUDA's choices differ: foreach AdamW), and it moves
    with the batch the record says."""
    for peak, field in (("allocated", "max_memory_allocated"), ("reserved", "max_memory_reserved")):
        outcome = board_step_peak(board_record_file, STEP, peak)
        assert outcome.measured == dry_step[field]
        assert 0.9 < outcome.predicted / outcome.measured < 1.1, (peak, outcome)
    larger = copy.deepcopy(dry_step)
    larger["batch"] *= 8
    record = {"format": RECORD_FORMAT, "when": "2026-12-01T09:00:00+00:00", "dry_run": False, "board": "NVIDIA H200", "torch": torch.__version__,
              "allocator_settings": {}, "steps": [larger], "ceilings": BOARD_CEILINGS}
    assert board_step_peak(_write(tmp_path / "larger-record.json.gz", record), STEP, "allocated").predicted > \
        board_step_peak(board_record_file, STEP, "allocated").predicted


def test_the_events_claim_holds_only_where_every_event_is_predicted_in_order(board_record_file: str, dry_step: dict[str, Any],
                                                                            tmp_path: Path) -> None:
    """A board trace made of the prediction's own events holds (the board's count); one event missing, one more, or two
    swapped, and it does not — the law (``events_in_order`` equal to the board's count) fails, naming where."""
    dry = board_step_events(board_record_file, STEP)  # the CPU's kernels made this trace, the prediction is CUDA's: they part
    assert dry.measured == sum(row[0] in ("alloc", "free_completed") for row in dry_step["trace"][dry_step["window_start"]:])
    assert dry.predicted < dry.measured and dry.quantities["first_difference"].startswith("event ")
    from resacct.checks.gpu_record_steps import _prediction

    events = [[action, 0, size, 0] for action, size, _ in _prediction(board_record_file, STEP)[4]]
    swapped = [*events[:2], events[3], events[2], *events[4:]]
    assert events[2][:3] != events[3][:3]
    for name, trace, holds in (("same", events, True), ("missing", events[:5] + events[6:], False), ("extra", [*events, events[0]], False),
                               ("swapped", swapped, False)):
        step = dict(copy.deepcopy(dry_step), trace=trace, window_start=0)
        record = {"format": RECORD_FORMAT, "when": "2026-12-01T09:00:00+00:00", "dry_run": False, "board": "NVIDIA H200",
                  "torch": torch.__version__, "allocator_settings": {}, "steps": [step], "ceilings": BOARD_CEILINGS}
        outcome = board_step_events(_write(tmp_path / f"{name}-record.json.gz", record), STEP)
        assert (outcome.predicted == outcome.measured == len(trace)) is holds, (name, outcome)
        assert (outcome.quantities["first_difference"] is None) is holds, (name, outcome)


def test_the_time_claim_prices_the_steps_ops_by_the_records_own_ceilings(board_record_file: str, dry_step: dict[str, Any]) -> None:
    outcome = board_step_time(board_record_file, STEP)
    q = outcome.quantities
    assert outcome.measured == dry_step["step_time_sec"]["median"]
    assert q["matmul_format"] == "fp32" and q["matmul_flops_per_sec"] == 5.0e13 and q["bandwidth_bytes_per_sec"] == 4.0e12
    assert q["overhead_sec_per_op"] == 5e-6 and q["overhead_from"] == "the record's launch time"
    assert q["host_sec"] == pytest.approx(q["ops"] * 5e-6) and q["predicted_step_sec"] == max(q["gpu_sec"], q["host_sec"])
    peak = peak_flops_per_sec(get_accelerator("h200"), "fp32")
    assert q["predicted_mfu"] == pytest.approx(q["measured_mfu"] * outcome.measured / q["predicted_step_sec"]) and 0 < q["predicted_mfu"] < 5e13 / peak


def test_the_time_claim_calibrates_only_on_other_steps(board_record_file: str) -> None:
    """Calibrated on the twin (same step, 20 ms, host-bound on these ceilings): 20 ms ÷ its ops per op; the judged
    step may not calibrate itself."""
    calibrated = board_step_time(board_record_file, STEP, calibrate_on=[TWIN]).quantities
    assert calibrated["overhead_from"] == f"calibrated on {TWIN}"
    assert calibrated["overhead_sec_per_op"] == pytest.approx(0.02 / calibrated["ops"])
    assert calibrated["predicted_step_sec"] == pytest.approx(0.02)  # the twin has the same ops: its time, predicted back
    with pytest.raises(ResacctError, match="the step judged"):
        board_step_time(board_record_file, STEP, calibrate_on=[STEP, TWIN])


def test_records_that_cannot_be_claimed_on_are_refused_by_name(board_record_file: str, tmp_path: Path, dry_step: dict[str, Any]) -> None:
    with pytest.raises(ResacctError, match=r"no step 'gpt3'; expected one of gpt2-small/fp32/math, gpt2-small/fp32/math/again, mixtral/timeout"):
        board_step_replay(board_record_file, "gpt3", "reserved")
    with pytest.raises(ResacctError, match=r"step 'mixtral/timeout' was not recorded \(timeout\)"):
        board_step_peak(board_record_file, "mixtral/timeout", "reserved")
    with pytest.raises(ResacctError, match="peak 'total': expected one of allocated, reserved"):
        board_step_replay(board_record_file, STEP, "total")
    dry = {"format": RECORD_FORMAT, "when": "2026-12-01T09:00:00+00:00", "dry_run": True, "board": "dry run on a CPU (no board)",
           "torch": torch.__version__, "allocator_settings": {}, "steps": [dry_step], "ceilings": BOARD_CEILINGS}
    with pytest.raises(ResacctError, match="a dry run made on a CPU"):
        board_step_replay(_write(tmp_path / "dry-record.json.gz", dry), STEP, "reserved")
    whole = Path(board_record_file).read_bytes()
    truncated = tmp_path / "truncated-record.json.gz"
    truncated.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ResacctError, match=f"GPU record {truncated}: cannot be read"):
        board_step_replay(str(truncated), STEP, "reserved")
    no_ceilings = {key: value for key, value in json.loads(gzip.open(board_record_file, "rt").read()).items() if key != "ceilings"}
    with pytest.raises(ResacctError, match="not a whole record \\(no 'ceilings'\\)"):
        board_step_replay(_write(tmp_path / "partial-record.json.gz", no_ceilings), STEP, "reserved")


# --- the commands: a committed record's summary calibrates --device BOARD ---------------------------------------------


def _summary(folder: Path, name: str, board: str, *, dry_run: bool = False, when: str = "2026-12-01T09:00:00+00:00") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-summary.json"
    path.write_text(json.dumps({"board": board, "when": when, "torch": "2.13.0+cu130", "dry_run": dry_run,
                                "ceilings": board_record.ceilings_in_brief(BOARD_CEILINGS),
                                "steps": [{"name": STEP, "status": "ok"}, {"name": TWIN, "status": "ok"}, {"name": "x", "status": "timeout"}]}))
    return path


@pytest.fixture
def committed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The folders committed and shipped summaries are read from, empty, in a temporary directory."""
    monkeypatch.setattr(board_record, "RECORDS_FOLDER", tmp_path / "docs-gpu")
    monkeypatch.setattr(board_record, "PACKAGED_RECORDS", tmp_path / "shipped")
    return tmp_path / "docs-gpu"


def test_a_committed_record_gives_its_board_its_measured_rates(committed: Path) -> None:
    h200, h100 = get_accelerator("h200"), get_accelerator("h100")
    before = board_rates(h200, "bf16")
    assert "no record for h200-sxm" in before.source
    _summary(committed, "2026-11-30-h200-record", "NVIDIA H200", when="2026-11-30T09:00:00+00:00")
    _summary(committed, "2026-12-01-h200-record", "NVIDIA H200")  # the newest of two calibrates
    _summary(committed, "2026-12-02-dry-record", "NVIDIA H200", dry_run=True, when="2026-12-02T09:00:00+00:00")  # a dry run calibrates nothing
    rates = board_rates(h200, "bf16")
    assert (rates.matmul_flops_per_sec, rates.bandwidth_bytes_per_sec, rates.overhead_sec_per_op) == (7.0e14, 4.0e12, 5e-6)
    assert "measured in record docs/gpu/2026-12-01-h200-record.json.gz (2026-12-01)" in rates.source
    fp16 = board_rates(h200, "fp16")  # a format the record did not measure: the datasheet's, saying so
    assert fp16.matmul_flops_per_sec == pytest.approx(0.7 * peak_flops_per_sec(h200, "fp16"))
    assert "record docs/gpu/2026-12-01-h200-record.json.gz measured no fp16 matmul" in fp16.source
    assert "docs/gpu/2026-12-01-h200-record.json.gz (NVIDIA H200, 2026-12-01, 2 steps)" in calibration_text(h200)
    assert "2026-11-26-h100-80gb-hbm3.json" in board_rates(h100, "bf16").source  # another board keeps its own record


def test_a_summary_that_is_not_the_recorders_is_refused_by_name(committed: Path) -> None:
    committed.mkdir(parents=True)
    (committed / "broken-record-summary.json").write_text('{"board": "NVIDIA H200", "when": "2026-12-01"}')
    with pytest.raises(ResacctError, match=r"GPU record summary .*broken-record-summary.json: not the recorder's summary \(KeyError"):
        board_rates(get_accelerator("h200"), "bf16")


@pytest.mark.slow  # 6.5 s in the quick tier (-n 2, session 25): the tier's 0.7 s rule (tests/quick_tier.py)
def test_account_and_fit_on_a_board_give_the_step_time_from_its_record(committed: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``account`` and ``fit`` with ``--device BOARD`` predict the board's step time (and MFU) from the ops of the CUDA pass,
    priced by the committed record's ceilings — where there is none, by the datasheet's, saying so."""
    pytest.importorskip("transformers")
    argv = ["fit", "--model", "tests.fixtures_hf_models:tiny_llama", "--seq", "16", "--max-batch", "4", "--device", "h200", "--json"]
    assert main(argv) == 0
    datasheet = json.loads(capsys.readouterr().out)["gpu"]
    assert datasheet["predicted_step_sec"] > 0 and "no record for h200-sxm" in datasheet["step_time_basis"]
    _summary(committed, "2026-12-01-h200-record", "NVIDIA H200")
    assert main(argv) == 0
    gpu = json.loads(capsys.readouterr().out)["gpu"]
    assert "measured in record docs/gpu/2026-12-01-h200-record.json.gz" in gpu["step_time_basis"]
    assert "fp32 matmul 50.0 TFLOP/s" in gpu["step_time_basis"] and "docs/gpu/2026-12-01-h200-record.json.gz" in gpu["calibration"]
    # no op runs faster than the record's matmul rate: the MFU stays under that rate's share of the datasheet peak
    assert 0 < gpu["predicted_mfu"] < 5.0e13 / peak_flops_per_sec(get_accelerator("h200"), "fp32")
    assert main(["account", "--hf-config", "gpt2", "--batch", "1", "--seq", "64", "--device", "h200"]) == 0
    text = capsys.readouterr().out
    assert "step time there (predicted):" in text and ", MFU 0." in text and "measured in record docs/gpu/2026-12-01-h200-record.json.gz" in text


# --- the claims a committed record gets: tools/gpu_record.py --claims, decided by resacct verify ----------------------


@pytest.mark.slow  # a verify in its own process (~10 s): the generated YAML, loaded and decided as a shipped spec would be
def test_a_records_generated_claims_are_decided_by_verify(board_record_file: str, tmp_path: Path) -> None:
    """Five claims per recorded step (none for the step that failed), each decided — none skipped (on torch < 2.8 the
    predictions, which require 2.8, are; the replays are not): the replays hold (the model made this trace), the
    step-time claim is judged against the record's own ceilings."""
    from tests.record_claims import generated_claims, verified

    claims = generated_claims(board_record_file)
    assert claims.count("  - id: recorded-h200-") == 10 and "# mixtral/timeout: not recorded (timeout): no claims" in claims
    report = verified(claims, tmp_path, "a synthetic record (tests/test_board_record.py)")
    outcomes = {claim["id"]: claim["outcome"] for claim in report["claims"]}
    skipped = {claim for claim, outcome in outcomes.items() if outcome == "skipped"}
    if torch.__version__ < "2.8":  # the generated predictions require torch >= 2.8 (no meta kernels for the board's attention before)
        assert len(outcomes) == 10 and skipped == {claim for claim in outcomes if "replays-exactly" not in claim}, outcomes
    else:
        assert len(outcomes) == 10 and not skipped, outcomes
    assert outcomes["recorded-h200-gpt2-small-fp32-math-reserved-replays-exactly"] == "holds"
    assert outcomes["recorded-h200-gpt2-small-fp32-math-allocated-replays-exactly"] == "holds"
    assert all(claim["evidence"] == "recorded" for claim in report["claims"])
    assert all(claim["quantities"]["board"] == "NVIDIA H200" for claim in report["claims"] if claim["id"] not in skipped)


def test_claims_are_not_written_for_a_dry_run_or_an_unknown_board(tmp_path: Path, dry_step: dict[str, Any]) -> None:
    sys.path.insert(0, str(REPO / "tools"))
    try:
        from gpu_record_claims import claims_yaml
    finally:
        sys.path.remove(str(REPO / "tools"))
    record = {"when": "2026-12-01T09:00:00+00:00", "dry_run": True, "board": "NVIDIA H200", "steps": [dry_step]}
    with pytest.raises(SystemExit, match="a dry run's record is a layout check"):
        claims_yaml("docs/gpu/x.json.gz", record)
    with pytest.raises(SystemExit, match="board 'NVIDIA Q9000' is not in resacct's datasheet table"):
        claims_yaml("docs/gpu/x.json.gz", dict(record, dry_run=False, board="NVIDIA Q9000"))


def test_generated_claim_ids_are_valid_and_distinct_for_every_step_and_board() -> None:
    """Every step and served model the recorder knows, on the longest board tag: ids within the schema's 80 characters
    (a long step name cut and given its hash), matching its pattern, none twice."""
    import re

    from resacct.harness.schema import CLAIM_ID_PATTERN, Claim

    sys.path.insert(0, str(REPO / "tools"))
    try:
        from gpu_record_claims import KINDS, SERVING_KINDS, claim_id, slug
        from gpu_record_matrix import MATRIX, SERVING
    finally:
        sys.path.remove(str(REPO / "tools"))
    from resacct.facts.hardware import accelerators

    tags = {slug(board.name.removesuffix("-sxm")) for board in accelerators().values()}
    longest = max(tags, key=len)
    ids = [claim_id(longest, name, kind[0]) for name in [*MATRIX, "x" * 200] for kind in KINDS]
    ids += [claim_id(longest, name, kind[0]) for name in SERVING for kind in SERVING_KINDS]
    assert len(set(ids)) == len(ids)
    (longest_allowed,) = [rule.max_length for rule in Claim.model_fields["id"].metadata if hasattr(rule, "max_length")]
    assert all(len(claim) <= longest_allowed and re.match(CLAIM_ID_PATTERN, claim) for claim in ids), \
        [claim for claim in ids if len(claim) > 80]


def test_a_step_resacct_cannot_predict_gets_its_replay_claims_only(dry_step: dict[str, Any]) -> None:
    sys.path.insert(0, str(REPO / "tools"))
    try:
        from gpu_record_claims import claims_yaml
    finally:
        sys.path.remove(str(REPO / "tools"))
    broken = dict(copy.deepcopy(dry_step), name="gpt2-small/odd", model_config={"n_layers": 2, "no_such_field": 1})
    record = {"when": "2026-12-01T09:00:00+00:00", "dry_run": False, "board": "NVIDIA H200", "steps": [dry_step, broken]}
    text = claims_yaml("docs/gpu/x.json.gz", record)
    assert text.count("- id: recorded-h200-gpt2-small-fp32-math-") == 5
    assert "# gpt2-small/odd: resacct cannot predict it on meta tensors (ResacctError: recorded step of resacct's GPT" in text
    assert [line.split("odd-")[1] for line in text.splitlines() if "- id: recorded-h200-gpt2-small-odd-" in line] == \
        ["allocated-replays-exactly", "reserved-replays-exactly"]


def test_the_quick_tier_keeps_the_replays_and_one_steps_predicted_peaks(dry_step: dict[str, Any]) -> None:
    """Every claim that traces a recorded process on meta is marked slow, but the peaks of the steps the generator keeps
    quick (gqa-llama/fp32/math: CUDA's composites); a replay is never slow."""
    sys.path.insert(0, str(REPO / "tools"))
    try:
        from gpu_record_claims import QUICK_PREDICTED_STEPS, claims_yaml
    finally:
        sys.path.remove(str(REPO / "tools"))
    quick = dict(copy.deepcopy(dry_step), name=QUICK_PREDICTED_STEPS[0])
    text = claims_yaml("docs/gpu/x.json.gz", {"when": "2026-12-01T09:00:00+00:00", "dry_run": False, "board": "NVIDIA H200", "steps": [dry_step, quick]})
    slow = {}
    for block in text.split("  - id: ")[1:]:
        slow[block.split("\n", 1)[0]] = "    marks: [slow]" in block
    assert slow and all(not marked for claim, marked in slow.items() if claim.endswith("-replays-exactly"))
    assert all(marked for claim, marked in slow.items() if claim.startswith("recorded-h200-gpt2-small-fp32-math-") and not claim.endswith("-replays-exactly"))
    assert {claim.rsplit("-math-", 1)[1]: marked for claim, marked in slow.items() if claim.startswith("recorded-h200-gqa-llama-fp32-math-")} == {
        "allocated-replays-exactly": False, "reserved-replays-exactly": False, "allocated-peak-predicted": False, "reserved-peak-predicted": False,
        "step-time-predicted": True}
