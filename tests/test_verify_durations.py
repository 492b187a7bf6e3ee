"""``resacct verify --durations``: every claim's seconds in report.json (from pytest's own report of
the claim), each area's total under ``run.seconds_by_area``, and the N slowest printed — a claim
that draws 300 examples ranks above one that evaluates once."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from resacct.cli import main
from resacct.reporting.durations import cpu_seconds_by_area, seconds_by_area, slowest_claims
from resacct.harness.phases import PhaseClock
from resacct.harness.workers import default_workers

SPECS = Path(__file__).resolve().parents[1] / "resacct" / "specs"

STORAGE = """\
area: storage
source: a test of resacct verify --durations
claims:
  - id: strides-drawn-300-times
    says: A contiguous rows×cols tensor skips cols elements to the next row and 1 to the next column.
    measure: tensors.strides
    forall: {d0: dim, d1: dim}
    examples: 300
    law: "[d1, 1]"

  - id: element-index-1-2-is-6
    says: In a 4×4 row-major matrix, element (1, 2) sits at index 1·4 + 2·1 = 6.
    measure: tensors.element_offset
    given: {rows: 4, cols: 4, row_fraction: 0.25, col_fraction: 0.5}
    law: "6"
"""


@pytest.fixture
def specs_dir(tmp_path: Path) -> Path:
    target = tmp_path / "specs"
    target.mkdir()
    (target / "storage.claims.yaml").write_text(STORAGE, encoding="utf-8")
    shutil.copy(SPECS / "devices.claims.yaml", target)
    return target


@pytest.mark.slow  # 2.15 s idle on 2026-11-28
def test_every_claim_has_its_seconds_and_the_slowest_are_printed(specs_dir, tmp_path, capsys):
    report_dir = tmp_path / "reports"
    assert main(["verify", "--specs", str(specs_dir), "--report-dir", str(report_dir), "--no-roofline", "--no-timeline", "--durations", "2"]) == 0
    out = capsys.readouterr().out
    document = json.loads((report_dir / "report.json").read_text(encoding="utf-8"))
    claims = document["claims"]
    assert len(claims) == 2 + 5 and all(isinstance(r["seconds"], float) and r["seconds"] >= 0 for r in claims)
    by_id = {r["id"]: r["seconds"] for r in claims}
    assert by_id["strides-drawn-300-times"] > by_id["element-index-1-2-is-6"]  # 300 examples against one evaluation
    assert sum(by_id.values()) <= document["run"]["seconds"]  # the claims run inside the run
    by_area = document["run"]["seconds_by_area"]
    assert set(by_area) == {"storage", "devices"}
    for area, seconds in by_area.items():
        assert seconds == pytest.approx(sum(r["seconds"] for r in claims if r["area"] == area), abs=2e-3)
    listed = [line for line in out.splitlines() if line.startswith("  ") and " s  " in line and "::" in line]
    assert len(listed) == 2 and "storage::strides-drawn-300-times" in listed[0], out
    assert "slowest 2 claims of 7" in out and "by area: storage" in out
    phases = document["run"]["phases"]  # 2 workers by default on a Linux machine with 2 cores, else every claim here
    expected = ["start", "claims in parallel", "claims alone", "claims report"] if default_workers() > 1 else ["start", "claims"]
    assert list(phases) == expected and all(seconds >= 0 for seconds in phases.values()), phases
    # no figures: the phases end with the claims (the run's seconds are rounded to 0.1, each phase's to 0.01)
    assert sum(phases.values()) <= document["run"]["seconds"] + 0.05 + 0.005 * len(phases)
    main_phase = "claims in parallel" if default_workers() > 1 else "claims"
    assert phases[main_phase] >= by_id["strides-drawn-300-times"] - 0.05  # the claim ran inside that phase
    cpu = document["run"]["phase_cpu_seconds"]
    assert list(cpu) == expected and all(seconds >= 0 for seconds in cpu.values()), cpu
    assert sum(cpu.values()) <= document["run"]["cpu_seconds"] + 0.1
    assert "by phase: start" in out and f"{main_phase} " in out and " CPU s)" in out
    # each claim's own CPU seconds: drawing 300 examples costs CPU, and no claim takes more CPU than its process had
    cpu_by_id = {r["id"]: r["cpu_seconds"] for r in claims}
    assert all(isinstance(value, float) and value >= 0 for value in cpu_by_id.values()), cpu_by_id
    assert cpu_by_id["strides-drawn-300-times"] > cpu_by_id["element-index-1-2-is-6"]
    assert sum(cpu_by_id.values()) <= document["run"]["cpu_seconds"] + 0.1
    assert document["run"]["cpu_seconds_by_area"]["storage"] == pytest.approx(
        sum(r["cpu_seconds"] for r in claims if r["area"] == "storage"), abs=2e-3)
    assert " CPU s)  storage::strides-drawn-300-times" in listed[0] and "by area, CPU: storage" in out


@pytest.mark.slow  # 1.96 s idle on 2026-11-28
def test_json_carries_the_slowest_and_zero_lists_every_claim(specs_dir, tmp_path, capsys):
    assert main(["verify", "--specs", str(specs_dir), "--report-dir", str(tmp_path / "r"), "--no-roofline", "--no-timeline",
                 "--durations", "0", "--json"]) == 0
    fields = json.loads(capsys.readouterr().out)
    slowest = fields["slowest"]
    assert len(slowest) == 7 and [r["seconds"] for r in slowest] == sorted((r["seconds"] for r in slowest), reverse=True)
    assert fields["run"]["seconds_by_area"].keys() == {"storage", "devices"}


@pytest.mark.slow  # 1.94 s idle on 2026-11-28
def test_without_the_flag_nothing_more_is_printed_but_report_json_keeps_the_seconds(specs_dir, tmp_path, capsys):
    assert main(["verify", "--specs", str(specs_dir), "--report-dir", str(tmp_path / "r"), "--no-roofline", "--no-timeline"]) == 0
    assert "slowest" not in capsys.readouterr().out
    document = json.loads((tmp_path / "r" / "report.json").read_text(encoding="utf-8"))
    assert all("seconds" in r for r in document["claims"]) and "seconds_by_area" in document["run"]


def test_the_helpers_order_and_sum():
    claims = [{"area": "a", "id": "x", "seconds": 0.5, "path": "a.yaml", "line": 3, "outcome": "holds"},
              {"area": "b", "id": "y", "seconds": 2.0, "path": "b.yaml", "line": 5, "outcome": "failed"},
              {"area": "a", "id": "z", "seconds": 0.25, "path": "a.yaml", "line": 9, "outcome": "holds"}]
    assert seconds_by_area(claims) == {"b": 2.0, "a": 0.75}
    assert [r["id"] for r in slowest_claims(claims, 2)] == ["y", "x"] and len(slowest_claims(claims, 0)) == 3
    assert slowest_claims(claims, 1)[0]["where"] == "b.yaml:5"
    assert slowest_claims(claims, 1)[0]["cpu_seconds"] is None  # a report from before CPU seconds were kept
    claims[0]["cpu_seconds"], claims[2]["cpu_seconds"] = 0.125, 0.5
    assert cpu_seconds_by_area(claims) == {"a": 0.625, "b": 0.0} and slowest_claims(claims, 0)[1]["cpu_seconds"] == 0.125


def test_a_claim_beside_a_busy_neighbour_shows_its_own_cpu_seconds():
    """The wall seconds of a claim on a worker held at idle priority are mostly waiting; the CPU
    seconds printed beside them are the claim's own (report.json's ``cpu_seconds``)."""
    from resacct.reporting.durations import durations_text as _durations_text

    claims = [{"area": "hf", "id": "waited", "seconds": 3.9, "cpu_seconds": 0.37, "outcome": "holds", "path": "h.yaml", "line": 8},
              {"area": "hf", "id": "old-record", "seconds": 0.2, "outcome": "holds", "path": "h.yaml", "line": 9}]
    lines = _durations_text({"claims": claims, "run": {"seconds": 40.0}}, 0).splitlines()
    assert lines[0] == "slowest claims of 2 (4.1 s, 0.4 CPU s in claims; 40.0 s the whole run):"
    assert lines[1].startswith("     3.900 s  (  0.37 CPU s)  hf::waited") and "(  —   CPU s)  hf::old-record" in lines[2]
    assert "by area, CPU: hf 0.4 s" in lines


def test_the_phase_clock_counts_each_phase_from_the_end_of_the_one_before():
    clock = PhaseClock(started=100.0)
    clock.mark("start", now=102.5)
    clock.mark("claims", now=130.0)
    clock.mark("figures", now=131.25)
    assert clock.phase_seconds() == {"start": 2.5, "claims": 27.5, "figures": 1.25}
    clock.mark("start", now=103.0)  # marked again: its last end, still before claims
    assert clock.phase_seconds() == {"start": 3.0, "claims": 27.0, "figures": 1.25}
    assert PhaseClock(started=5.0).phase_seconds() == {}
    clock = PhaseClock(started=0.0, started_cpu=1.0)
    clock.mark("start", now=2.0, cpu=3.5)
    clock.mark("claims", now=10.0, cpu=18.5)
    assert clock.phase_cpu_seconds() == {"start": 2.5, "claims": 15.0}  # 15 CPU s in 8 s: two cores nearly busy


@pytest.mark.slow  # one process: the phases of a run without workers
def test_one_process_has_a_claims_phase_and_figures(specs_dir, tmp_path):
    assert main(["verify", "--specs", str(specs_dir), "--report-dir", str(tmp_path / "r"), "--workers", "1", "--no-roofline", "-q"]) == 0
    document = json.loads((tmp_path / "r" / "report.json").read_text(encoding="utf-8"))
    phases = document["run"]["phases"]
    assert list(phases) == ["start", "claims", "figures"] and phases["figures"] > 0, phases  # step-timeline.png drawn


@pytest.mark.parametrize("value", ["-1", "many"])
def test_a_bad_count_is_one_line_exit_2(value, capsys):
    assert main(["verify", "--durations", value]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "expected a whole number ≥ 0" in err, err


def test_the_durations_lines_fit_100_columns():
    """Long claim ids and many areas (the shipped 36 areas' line was 554 characters) wrap or move
    their detail to the next line, as every other line verify prints fits 100 columns."""
    from resacct.reporting.durations import durations_text as _durations_text

    claims = [{"area": f"area{index:02d}", "id": "a-claim-id-long-enough-to-push-the-line-past-the-edge-" + "x" * index,
               "seconds": 1.0 + index, "outcome": "refuted", "path": "specs/peak_sharded.claims.yaml", "line": 125} for index in range(36)]
    text = _durations_text({"claims": claims, "run": {"seconds": 700.0}}, 10)
    lines = text.splitlines()
    assert all(len(line) <= 100 for line in lines), [line for line in lines if len(line) > 100]
    assert sum("::" in line for line in lines) == 10 and "(refuted, specs/peak_sharded.claims.yaml:125)" in text
    assert "area35 36.0 s" in text and "area00 1.0 s" in text  # every area kept, wrapped
