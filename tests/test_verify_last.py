"""``resacct verify --last``: the last run's report listed as that run printed it, without running a
claim — the report is left as it was, the exit status is the run's, and the options that choose or
run claims are refused in one line."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from resacct.cli import main

SPECS = """\
area: storage
source: a test of resacct verify --last
claims:
  - id: element-index-1-2-is-6
    says: In a 4×4 row-major matrix, element (1, 2) sits at index 1·4 + 2·1 = 6.
    measure: tensors.element_offset
    given: {rows: 4, cols: 4, row_fraction: 0.25, col_fraction: 0.5}
    law: "6"

  - id: element-index-1-2-is-7-wrongly
    says: A law that is wrong, so that the run has a failed claim to list.
    measure: tensors.element_offset
    given: {rows: 4, cols: 4, row_fraction: 0.25, col_fraction: 0.5}
    law: "7"
"""


@pytest.fixture(scope="module")
def last_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A report folder written by one real run (one claim holds, one fails), kept read-only by the tests."""
    root = tmp_path_factory.mktemp("last")
    (root / "specs").mkdir()
    (root / "specs" / "storage.claims.yaml").write_text(SPECS, encoding="utf-8")
    reports = root / "reports"
    assert main(["verify", "--specs", str(root / "specs"), "--report-dir", str(reports), "--no-roofline", "--no-timeline", "--workers", "1", "-q"]) == 1
    return reports


def _copy(reports: Path, tmp_path: Path) -> Path:
    target = tmp_path / "reports"
    shutil.copytree(reports, target)
    return target


@pytest.mark.slow  # the module's one real run: ~1.5 s idle, 4.2 s at load 4
def test_it_lists_the_failed_claim_without_running_and_keeps_the_runs_exit_status(last_run, tmp_path, capsys):
    reports = _copy(last_run, tmp_path)
    before = (reports / "report.json").read_bytes()
    modified = (reports / "report.json").stat().st_mtime_ns
    assert main(["verify", "--last", "--report-dir", str(reports)]) == 1
    out = capsys.readouterr().out
    assert "element-index-1-2-is-7-wrongly" in out and "0 holds" not in out and "1 failed" in out, out
    assert "--last: nothing ran; this is the run of " in out
    assert (reports / "report.json").read_bytes() == before and (reports / "report.json").stat().st_mtime_ns == modified
    assert not (tmp_path / "reports-partial").exists()


@pytest.mark.slow  # the module's one real run: ~1.5 s idle, 4.2 s at load 4
def test_status_and_json_select_from_the_report(last_run, tmp_path, capsys):
    reports = _copy(last_run, tmp_path)
    assert main(["verify", "--last", "--report-dir", str(reports), "--json", "--status", "holds"]) == 1
    fields = json.loads(capsys.readouterr().out)
    document = json.loads((reports / "report.json").read_text(encoding="utf-8"))
    assert fields["counts"]["holds"] == 1 and fields["counts"]["failed"] == 1
    assert [record["id"] for record in fields["claims"]] == ["element-index-1-2-is-6"]
    assert fields["environment"]["created"] == document["environment"]["created"]


@pytest.mark.slow  # the module's one real run: ~1.5 s idle, 4.2 s at load 4
def test_durations_come_from_the_report(last_run, tmp_path, capsys):
    reports = _copy(last_run, tmp_path)
    assert main(["verify", "--last", "--report-dir", str(reports), "-q", "--durations", "1"]) == 1
    out = capsys.readouterr().out
    assert "slowest 1 claims of 2" in out and "by phase: start" in out, out


@pytest.mark.slow  # the module's one real run: ~1.5 s idle, 4.2 s at load 4
def test_a_newer_partial_run_is_pointed_at(last_run, tmp_path, capsys):
    reports = _copy(last_run, tmp_path)
    partial = tmp_path / "reports-partial"
    shutil.copytree(reports, partial)
    later = time.time() + 5
    os.utime(partial / "report.json", (later, later))
    main(["verify", "--last", "--report-dir", str(reports), "-q"])
    out = capsys.readouterr().out
    assert f"a newer partial run is in {partial}/" in out and f"--last --report-dir {partial}" in out, out


def test_no_report_is_one_line_exit_2(tmp_path, capsys):
    assert main(["verify", "--last", "--report-dir", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no report in" in err and "run `resacct verify` first" in err, err


@pytest.mark.parametrize("option", [["--area", "dtypes"], ["-k", "gpt"], ["--workers", "1"], ["--machine-dependent"], ["--no-roofline"]])
def test_options_that_run_claims_are_refused(option, tmp_path, capsys):
    assert main(["verify", "--last", "--report-dir", str(tmp_path), *option]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{option[0]} chooses or runs claims, and --last runs none" in err, err


def test_a_report_json_that_is_not_one_is_named(tmp_path, capsys):
    (tmp_path / "report.json").write_text('{"environment": {}, "claims": [', encoding="utf-8")
    assert main(["verify", "--last", "--report-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "report.json" in err and "cut short?" in err, err
