"""``resacct verify``: the claims table, the report directory, the merge matrix, bad input."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from resacct.cli import main
from resacct.reporting import load_report, merge_reports, render_html, render_matrix_markdown

SPECS = Path(__file__).resolve().parents[1] / "resacct" / "specs"


@pytest.fixture
def specs_dir(tmp_path: Path) -> Path:
    target = tmp_path / "specs"
    target.mkdir()
    shutil.copy(SPECS / "storage.claims.yaml", target)
    shutil.copy(SPECS / "devices.claims.yaml", target)
    return target


def test_verify_prints_the_table_and_writes_the_report(specs_dir, tmp_path, capsys):
    report_dir = tmp_path / "report"
    assert main(["verify", "--specs", str(specs_dir), "--report-dir", str(report_dir)]) == 0
    out = capsys.readouterr().out
    assert "three-indices-on-2d-is-view" in out and "refuted" in out
    assert "needs a CUDA GPU" in out  # skipped GPU claims say why
    assert "holds, 1 refuted, 3 skipped, 0 failed, 0 invalid" in out
    document = load_report(report_dir / "report.json")
    assert {record["area"] for record in document["claims"]} == {"storage", "devices"}
    assert document["environment"]["torch"]
    markdown = (report_dir / "report.md").read_text()
    assert "| three-indices-on-2d-is-view |" in markdown
    errata = (report_dir / "errata.md").read_text()
    assert "IndexError" in errata and "004_1aa12c422fdb4fbd.txt" in errata
    page = (report_dir / "report.html").read_text()
    assert page.startswith("<!doctype html>") and '<table class="claims">' in page and 'id="errata"' in page


def test_verify_exits_1_when_a_claim_fails(specs_dir, tmp_path, capsys):
    broken = specs_dir / "storage.claims.yaml"
    broken.write_text(broken.read_text().replace('law: "[d1, 1]"', 'law: "[d0, 1]"'))
    assert main(["verify", "--specs", str(specs_dir), "--report-dir", str(tmp_path / "r"), "--quiet"]) == 1
    assert "1 failed" in capsys.readouterr().out


def test_filters_by_area_and_pattern(specs_dir, tmp_path, capsys):
    assert main(["verify", "--specs", str(specs_dir), "--area", "devices", "-k", "cpu", "--report-dir", str(tmp_path / "r"), "--quiet"]) == 0
    document = load_report(tmp_path / "r" / "report.json")
    assert [record["id"] for record in document["claims"]] == ["tensors-start-on-cpu"]


def test_gpu_required_turns_gpu_skips_into_failures(specs_dir, tmp_path, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code = main(["verify", "--specs", str(specs_dir), "--area", "devices", "--gpu-required", "--report-dir", str(tmp_path / "r"), "--quiet"])
    assert code == 1
    assert "3 failed" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--area", "dtypez"], "unknown area 'dtypez'; did you mean 'dtypes'?"),
        (["--specs", "/nonexistent"], "specs folder '/nonexistent' does not exist"),
        (["--merge", "/nonexistent.json"], "report '/nonexistent.json' does not exist"),
        (["--workers", "-1"], "--workers must be 0 or more, got -1"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(arguments, message, capsys):
    arguments = arguments if "--specs" in arguments or "--merge" in arguments else ["--specs", str(SPECS), *arguments]
    assert main(["verify", *arguments]) == 2
    error = capsys.readouterr().err
    assert message in error and len(error.strip().splitlines()) == 1 and "Traceback" not in error


def _report(torch_version: str, outcome: str) -> dict:
    return {"environment": {"torch": torch_version, "device": "cpu"},
            "claims": [{"id": "a", "area": "x", "says": "s", "outcome": outcome}, {"id": "b", "area": "x", "says": "s", "outcome": "holds"}]}


def test_merge_marks_claims_whose_status_changes():
    matrix = merge_reports([_report("2.4.1", "skipped"), _report("2.13.0", "holds")])
    assert matrix["columns"] == ["torch 2.4.1 · cpu", "torch 2.13.0 · cpu"]
    changes = {row["id"]: row["changes"] for row in matrix["rows"]}
    assert changes == {"a": True, "b": False}
    assert "| x | a ⚠ | skipped | holds |" in render_matrix_markdown(matrix)


def test_merge_command_writes_the_matrix(tmp_path, capsys):
    paths = []
    for version, outcome in (("2.4.1", "skipped"), ("2.13.0", "holds")):
        path = tmp_path / f"{version}.json"
        path.write_text(json.dumps(_report(version, outcome)))
        paths.append(str(path))
    assert main(["verify", "--merge", *paths, "--report-dir", str(tmp_path / "m")]) == 0
    assert "1 change status" in capsys.readouterr().out
    assert "a ⚠" in (tmp_path / "m" / "matrix.md").read_text()


def test_a_foreign_json_is_refused(tmp_path, capsys):
    path = tmp_path / "other.json"
    path.write_text('{"hello": 1}')
    assert main(["verify", "--merge", str(path)]) == 2
    assert "is not a resacct report" in capsys.readouterr().err


def test_html_escapes_what_it_shows():
    document = _report("2.13.0", "holds")
    document["claims"][0]["says"] = "<script>alert(1)</script>"
    page = render_html(document)
    assert "<script>alert" not in page and "&lt;script&gt;" in page


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on this machine (Debian: apt-get install chromium)")
def test_html_report_renders_in_a_headless_browser(specs_dir, tmp_path, capsys):
    """Chromium loads the page and its DOM has the claims tables with every claim as a row."""
    report_dir = tmp_path / "report"
    main(["verify", "--specs", str(specs_dir), "--report-dir", str(report_dir), "--quiet"])
    records = load_report(report_dir / "report.json")["claims"]
    dom = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", (report_dir / "report.html").as_uri()],
        capture_output=True, text=True, timeout=120,
    ).stdout
    assert dom.count('<table class="claims">') == 2
    assert dom.count("<tr data-outcome=") == len(records)
