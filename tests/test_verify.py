"""``resacct verify``: what it prints, the report directory (never lost to a partial or interrupted
run), the merge matrix, bad input."""

from __future__ import annotations

import base64
import json
import os
import shutil
from pathlib import Path

import pytest

from resacct.cli import main
from resacct.reporting import load_report, merge_reports, render_html, render_matrix_markdown

SPECS = Path(__file__).resolve().parents[1] / "resacct" / "specs"


def strict_json(text: str):
    """json.loads that refuses NaN and Infinity (Python's json accepts them by default)."""
    def refuse(name: str):
        raise ValueError(f"not strict JSON: {name}")

    return json.loads(text, parse_constant=refuse)


# Three storage claims (one forall, one that holds, one refuted) beside the packaged devices claims
# (one holds, three GPU-only): real checks, few examples, so each run takes about a second.
STORAGE = """\
area: storage
source: 004_1aa12c422fdb4fbd.txt — "3. Tensors in PyTorch – The Fundamentals"
claims:
  - id: strides-2d-row-major
    says: A contiguous rows×cols tensor skips cols elements to the next row and 1 to the next column.
    measure: tensors.strides
    forall: {d0: dim, d1: dim}
    examples: 5
    law: "[d1, 1]"

  - id: element-index-1-2-is-6
    says: In a 4×4 row-major matrix, element (1, 2) sits at index 1·4 + 2·1 = 6.
    measure: tensors.element_offset
    given: {rows: 4, cols: 4, row_fraction: 0.25, col_fraction: 0.5}
    law: "6"

  - id: three-indices-on-2d-is-view
    says: For x = torch.arange(6).view(2,3), y = x[:,1,:] is a view with the same storage.
    measure: tensors.index_is_view
    given: {expression: "x[:, 1, :]"}
    expect: {equals: true}
    status: refuted
    truth: x is 2-D, so x[:, 1, :] raises "IndexError too many indices for tensor of dimension 2"; x[:, 1] is the view meant.
"""


@pytest.fixture
def specs_dir(tmp_path: Path) -> Path:
    target = tmp_path / "specs"
    target.mkdir()
    (target / "storage.claims.yaml").write_text(STORAGE, encoding="utf-8")
    shutil.copy(SPECS / "devices.claims.yaml", target)
    return target


def verify(specs_dir: Path, report_dir: Path, *extra: str) -> int:
    return main(["verify", "--specs", str(specs_dir), "--report-dir", str(report_dir), "--no-roofline", "--no-timeline", *extra])


@pytest.mark.slow
def test_default_output_lists_only_what_does_not_hold(specs_dir, tmp_path, capsys):
    report_dir = tmp_path / "report"
    assert verify(specs_dir, report_dir) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("machine: ") and "bf16 matmul: " in lines[0]  # the kind of machine, first
    assert lines[1].split() == ["area", "holds", "refuted", "skipped", "failed"]
    assert lines[2].split() == ["devices", "1", "0", "4", "0"] and lines[3].split() == ["storage", "2", "1", "0", "0"]
    assert lines[5] == "evidence: 8 measured"  # what decides the claims: every check here ran torch
    assert "REFUTED (1)" in out
    assert "  three-indices-on-2d-is-view: equals True; measured IndexError: too many indices" in out
    assert "    x is 2-D, so x[:, 1, :] raises" in out  # its truth
    assert "strides-2d-row-major" not in out  # a claim that holds is not listed
    assert "  4 × needs a CUDA GPU" in out  # skipped claims are counted by reason
    assert "holds, 1 refuted, 4 skipped, 0 inconclusive, 0 failed, 0 invalid" in out
    assert max(len(line) for line in lines if not line.startswith("report: ")) <= 100  # the report line names a path
    document = load_report(report_dir / "report.json")
    assert {record["area"] for record in document["claims"]} == {"storage", "devices"}
    assert document["run"]["complete"] is True
    markdown = (report_dir / "report.md").read_text()
    assert "| three-indices-on-2d-is-view<br>`specs/storage.claims.yaml:17` |" in markdown
    assert "| storage | 2 | 1 | 0 | 0 | 0 | 0 | 3 | 0 | 0 |" in markdown  # outcomes, then measured, published, arithmetic
    assert " | measured | refuted | " in markdown  # each claim's evidence beside its status
    assert {record["evidence"] for record in document["claims"]} == {"measured"}
    assert document["evidence"]["total"] == {"measured": 8, "published": 0, "arithmetic": 0}
    assert document["evidence"]["by_area"]["storage"] == {"measured": 3, "published": 0, "arithmetic": 0}
    errata = (report_dir / "errata.md").read_text()
    assert "IndexError" in errata and "004_1aa12c422fdb4fbd.txt" in errata and "PARTIAL" not in errata
    assert "- **Evidence:** measured" in errata
    page = (report_dir / "report.html").read_text()
    assert page.startswith("<!doctype html>") and '<table class="claims">' in page and 'id="errata"' in page
    assert page.count('data-evidence="measured"') == 8


@pytest.mark.slow
def test_a_failed_claim_shows_law_value_prediction_measurement_inputs_and_line(specs_dir, tmp_path, capsys):
    broken = specs_dir / "storage.claims.yaml"
    broken.write_text(broken.read_text().replace('law: "[d1, 1]"', 'law: "[d0, 1]"'))
    assert verify(specs_dir, tmp_path / "r") == 1
    out = capsys.readouterr().out
    block = out[out.index("FAILED (1)"):out.index("REFUTED (1)")].splitlines()
    assert block[1] == "  strides-2d-row-major  specs/storage.claims.yaml:4"
    assert block[2] == "    claim 'strides-2d-row-major' does not hold"
    record = next(r for r in load_report(tmp_path / "r" / "report.json")["claims"] if r["id"] == "strides-2d-row-major")
    d0, d1 = record["inputs"]["d0"], record["inputs"]["d1"]
    assert d0 != d1  # the failing example hypothesis settled on
    assert block[3].split() == ["law", "[d0,", "1]", "=", f"[{d0},", "1]"]
    assert block[4].split() == ["predicted", f"[{d1},", "1]"]
    assert block[5].split() == ["measured", f"[{d1},", "1]"]
    assert block[6].startswith("    failing example") and f"d0={d0}, d1={d1}" in block[6]
    assert record["example"] == "failing" and record["law_value"] == [d0, 1] and record["measured"] == [d1, 1]
    assert "—" not in "\n".join(block)
    assert "1 failed" in out


@pytest.mark.slow
def test_all_status_quiet_and_verbose_choose_what_is_printed(specs_dir, tmp_path, capsys):
    assert verify(specs_dir, tmp_path / "r", "--area", "devices", "--all") == 0
    out = capsys.readouterr().out
    assert "HOLDS (1)" in out and "  tensors-start-on-cpu: equals cpu; measured cpu" in out and "SKIPPED (4)" in out
    assert verify(specs_dir, tmp_path / "r", "--area", "devices", "--status", "skipped") == 0
    out = capsys.readouterr().out
    assert "SKIPPED (4)" in out and "HOLDS" not in out and "  to-cuda-moves: needs a CUDA GPU" in out
    assert verify(specs_dir, tmp_path / "r", "--area", "devices", "-q") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("claims: 1 holds, 0 refuted, 4 skipped") and out[1].startswith("report: ") and len(out) == 2


@pytest.mark.slow
def test_json_output_is_strict_json_with_every_claim(specs_dir, tmp_path, capsys):
    assert verify(specs_dir, tmp_path / "r", "--json") == 0
    fields = strict_json(capsys.readouterr().out)
    assert fields["counts"] == {"holds": 3, "refuted": 1, "skipped": 4, "inconclusive": 0, "failed": 0, "invalid": 0}
    assert fields["counts_by_area"]["devices"] == {"holds": 1, "refuted": 0, "skipped": 4, "inconclusive": 0, "failed": 0, "invalid": 0}
    evidence = fields["evidence"]  # what decides each claim, counted as report.json counts it
    assert evidence["total"] == {kind: sum(1 for record in fields["claims"] if record["evidence"] == kind) for kind in evidence["total"]}
    assert sum(evidence["by_area"]["devices"].values()) == 5
    assert fields["environment"]["machine"]["cpu_bf16_matmul"] in ("converted", "emulated", "avx512_bf16", "amx", "arm_bf16")
    assert len(fields["claims"]) == 8 and fields["complete"] is True and fields["notice"] is None
    forall = next(record for record in fields["claims"] if record["id"] == "strides-2d-row-major")
    assert forall["examples"] == 5 and forall["example"] == "worst" and forall["law_value"] == forall["measured"]
    assert verify(specs_dir, tmp_path / "r", "--json", "--status", "refuted") == 0
    assert [record["id"] for record in strict_json(capsys.readouterr().out)["claims"]] == ["three-indices-on-2d-is-view"]


@pytest.mark.slow
def test_a_partial_run_is_marked_partial_in_every_format(specs_dir, tmp_path, capsys):
    report_dir = tmp_path / "fresh"
    assert verify(specs_dir, report_dir, "--area", "devices", "-k", "cpu") == 0
    out = capsys.readouterr().out.split("\n", 1)[1]  # after the machine line
    assert out.startswith("PARTIAL REPORT (only area devices; only claims matching -k 'cpu'): 1 claims, not the full set")
    document = load_report(report_dir / "report.json")
    assert [record["id"] for record in document["claims"]] == ["tensors-start-on-cpu"]
    assert document["run"]["complete"] is False and document["run"]["selection"] == {"areas": ["devices"], "pattern": "cpu"}
    for name in ("report.md", "report.html", "errata.md"):
        assert "PARTIAL REPORT (only area devices; only claims matching -k &#x27;cpu&#x27;)" in (report_dir / name).read_text() \
            or "PARTIAL REPORT (only area devices; only claims matching -k 'cpu')" in (report_dir / name).read_text(), name


@pytest.fixture(scope="module")
def complete_report(tmp_path_factory) -> Path:
    """One complete run's report directory, made once for the tests that must not lose it."""
    base = tmp_path_factory.mktemp("complete")
    specs = base / "specs"
    specs.mkdir()
    (specs / "storage.claims.yaml").write_text(STORAGE, encoding="utf-8")
    shutil.copy(SPECS / "devices.claims.yaml", specs)
    assert verify(specs, base / "reports", "-q") == 0
    return base / "reports"


@pytest.fixture
def _complete_report(complete_report, capsys):
    """``_complete_report(specs_dir, report_dir)`` puts a copy of that complete report at ``report_dir``
    and returns its files' bytes, to compare with afterwards."""
    capsys.readouterr()

    def copy(specs_dir: Path, report_dir: Path) -> dict[str, bytes]:
        shutil.copytree(complete_report, report_dir)
        assert load_report(report_dir / "report.json")["run"]["complete"] is True
        return {path.name: path.read_bytes() for path in report_dir.iterdir()}

    return copy


@pytest.mark.slow
def test_a_k_run_leaves_the_complete_report_in_place(specs_dir, tmp_path, capsys, _complete_report):
    report_dir = tmp_path / "reports"
    before = _complete_report(specs_dir, report_dir)
    (report_dir / "notes.txt").write_text("mine")  # a file resacct did not write stays
    assert verify(specs_dir, report_dir, "-k", "cpu") == 0
    out = capsys.readouterr().out
    assert f"report: {tmp_path / 'reports-partial'}/" in out and "holds a complete report" in out
    assert {path.name: path.read_bytes() for path in report_dir.iterdir() if path.name != "notes.txt"} == before
    partial = load_report(tmp_path / "reports-partial" / "report.json")
    assert [record["id"] for record in partial["claims"]] == ["tensors-start-on-cpu"] and partial["run"]["complete"] is False
    assert verify(specs_dir, report_dir, "-q") == 0  # a complete run replaces the complete report
    assert load_report(report_dir / "report.json")["environment"]["created"] >= strict_json(before["report.json"])["environment"]["created"]
    assert (report_dir / "notes.txt").read_text() == "mine"
    assert not list(tmp_path.glob(".reports.*"))  # no temporary directory left behind


def at_the_second_claim(monkeypatch, interrupt) -> None:  # type: ignore[no-untyped-def]
    """Call ``interrupt()`` when a process starts judging its second claim (the Ctrl-C tests' moment).

    Counted by claim id, not by call: a ``forall`` claim is judged once per example, and counting
    calls interrupted storage's forall claim at its second example, before any claim had finished
    in that worker, so whether the partial report held a claim depended on the other worker's pace."""
    import resacct.harness.plugin as plugin

    judged: set[str] = set()
    real_evaluate = plugin.evaluate_claim

    def judge(claim, *args, **kwargs):  # type: ignore[no-untyped-def]
        first_time = claim.claim.id not in judged
        judged.add(claim.claim.id)
        if first_time and len(judged) == 2:
            interrupt()
        return real_evaluate(claim, *args, **kwargs)

    monkeypatch.setattr(plugin, "evaluate_claim", judge)


@pytest.mark.slow
def test_ctrl_c_inside_the_run_leaves_the_complete_report_in_place(specs_dir, tmp_path, capsys, monkeypatch, _complete_report):
    report_dir = tmp_path / "reports"
    before = _complete_report(specs_dir, report_dir)

    def interrupt() -> None:
        raise KeyboardInterrupt

    at_the_second_claim(monkeypatch, interrupt)
    assert verify(specs_dir, report_dir) == 130
    captured = capsys.readouterr()
    assert "interrupted" in captured.err
    assert {path.name: path.read_bytes() for path in report_dir.iterdir()} == before
    partial = load_report(tmp_path / "reports-partial" / "report.json")
    assert partial["run"]["interrupted"] == "Ctrl-C" and 0 < len(partial["claims"]) < 7
    assert "PARTIAL REPORT (interrupted (Ctrl-C))" in (tmp_path / "reports-partial" / "report.md").read_text()
    assert not list(tmp_path.glob(".reports.*"))


@pytest.mark.slow
def test_the_report_directory_is_untouched_while_claims_run(specs_dir, tmp_path, monkeypatch, capsys, _complete_report):
    """A second run sharing the directory cannot delete the first one's report.json mid-run."""
    import resacct.harness.plugin as plugin

    report_dir = tmp_path / "reports"
    before = _complete_report(specs_dir, report_dir)
    seen = tmp_path / "seen.txt"  # a file: the claims run in forked workers
    real_evaluate = plugin.evaluate_claim

    def looking(*args, **kwargs):
        with seen.open("a") as file:
            file.write("same\n" if {path.name: path.read_bytes() for path in report_dir.iterdir()} == before else "changed\n")
        return real_evaluate(*args, **kwargs)

    monkeypatch.setattr(plugin, "evaluate_claim", looking)
    assert verify(specs_dir, report_dir, "-q") == 0
    assert set(seen.read_text().split()) == {"same"}


@pytest.mark.slow
def test_the_roofline_belongs_to_the_same_run(specs_dir, tmp_path, capsys, monkeypatch):
    import resacct.cli.verify as verify_command

    def drawn_quickly(directory: Path) -> Path:  # measuring and drawing are tested in test_perf.py
        target = directory / "roofline.png"
        target.write_bytes(b"\x89PNG\r\n\x1a\n" + b"this run's roofline")
        return target

    def timeline_drawn_quickly(directory: Path) -> Path:  # drawn for real in test_the_step_timeline_is_drawn_for_real
        target = directory / "step-timeline.png"
        target.write_bytes(b"\x89PNG\r\n\x1a\n" + b"this run's step")
        return target

    monkeypatch.setattr(verify_command, "_write_roofline", drawn_quickly)
    monkeypatch.setattr(verify_command, "_write_step_timeline", timeline_drawn_quickly)
    report_dir = tmp_path / "reports"
    assert main(["verify", "--specs", str(specs_dir), "--area", "devices", "--report-dir", str(report_dir), "-q"]) == 0
    page = (report_dir / "report.html").read_text()
    assert (report_dir / "roofline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    encoded = base64.b64encode((report_dir / "roofline.png").read_bytes()).decode()
    assert f'<img class="roofline" alt="measured roofline" src="data:image/png;base64,{encoded}">' in page
    timeline = base64.b64encode((report_dir / "step-timeline.png").read_bytes()).decode()
    assert f'src="data:image/png;base64,{timeline}">' in page and '<a href="#step-timeline">' in page
    assert verify(specs_dir, report_dir, "--area", "devices", "-q") == 0  # partial: no complete report there to protect
    assert not (report_dir / "roofline.png").exists()  # an older run's roofline does not pass for this one's
    assert not (report_dir / "step-timeline.png").exists()  # nor its step timeline


@pytest.mark.slow
def test_the_step_timeline_is_drawn_for_real(tmp_path):
    """Issue 22: the memory timeline in the HTML report — the reference step predicted on fake
    tensors and measured by the CPU allocator in the same call, their peaks equal."""
    from resacct.account.render import timeline_plot

    calls = []
    real_write = timeline_plot.write_timeline_png

    def recording(path, predicted, measured, *, title):
        calls.append((predicted.peak_bytes, measured.peak_bytes, title))
        real_write(path, predicted, measured, title=title)

    timeline_plot.write_timeline_png = recording
    try:
        path = timeline_plot.write_reference_step_timeline_png(tmp_path / "step-timeline.png")
    finally:
        timeline_plot.write_timeline_png = real_write
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    ((predicted, measured, title),) = calls
    assert predicted == measured and "equal to the byte" in title


@pytest.mark.slow
def test_gpu_required_turns_gpu_skips_into_failures(specs_dir, tmp_path, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert verify(specs_dir, tmp_path / "r", "--area", "devices", "--gpu-required", "--quiet") == 1
    assert "4 failed" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--area", "dtypez"], "unknown area 'dtypez'; did you mean 'dtypes'?"),
        (["--specs", "/nonexistent"], "specs folder '/nonexistent' does not exist"),
        (["--merge", "/nonexistent.json"], "report '/nonexistent.json' does not exist"),
        (["--workers", "-1"], "--workers must be 1 or more (1: every claim in this process), got -1"),
        (["--workers", "0"], "--workers must be 1 or more (1: every claim in this process), got 0"),
        (["--workers", "two"], "--workers 'two': expected a whole number of processes"),
        (["--workers", "100000"], "--workers 100000: this machine has"),
        (["--status", "fine"], "argument --status: invalid choice: 'fine'"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(arguments, message, capsys):
    arguments = arguments if "--specs" in arguments or "--merge" in arguments else ["--specs", str(SPECS), *arguments]
    assert main(["verify", *arguments]) == 2
    error = capsys.readouterr().err
    assert message in error and len(error.strip().splitlines()) == 1 and "Traceback" not in error


def test_verify_draws_the_fixed_examples_unless_told_to_explore(monkeypatch, capsys):
    """``resacct verify``'s forall claims draw the derandomised ``ci`` examples (a repeatable verdict, replayed by the next
    run); ``--explore`` the ``dev`` profile's new ones; ``RESACCT_HYPOTHESIS_PROFILE`` chooses where set; a contradiction or
    an unknown profile is a one-line error before any claim runs; the variable is restored after the run."""
    from resacct.harness.pytest_settings import HYPOTHESIS_PROFILE_VARIABLE, examples_repeat, hypothesis_profile_name, verify_examples_profile

    monkeypatch.delenv(HYPOTHESIS_PROFILE_VARIABLE, raising=False)
    monkeypatch.delenv("CI", raising=False)
    assert hypothesis_profile_name() == "dev"  # a pytest run's rule, outside verify
    with verify_examples_profile(explore=False):
        assert hypothesis_profile_name() == "ci" and examples_repeat()
    assert HYPOTHESIS_PROFILE_VARIABLE not in os.environ
    with verify_examples_profile(explore=True):
        assert hypothesis_profile_name() == "dev" and not examples_repeat()
    monkeypatch.setenv(HYPOTHESIS_PROFILE_VARIABLE, "dev")
    with verify_examples_profile(explore=False):
        assert hypothesis_profile_name() == "dev"  # the user's choice stands
    assert os.environ[HYPOTHESIS_PROFILE_VARIABLE] == "dev"
    for value, message in (("ci", "--explore draws new examples (the dev profile), but RESACCT_HYPOTHESIS_PROFILE='ci' asks for fixed"),
                           ("banana", "RESACCT_HYPOTHESIS_PROFILE='banana': expected one of ['ci', 'dev'] (or unset)")):
        monkeypatch.setenv(HYPOTHESIS_PROFILE_VARIABLE, value)
        assert main(["verify", "--specs", str(SPECS), "--explore", "--area", "dtypes"]) == 2
        error = capsys.readouterr().err
        assert message in error and len(error.strip().splitlines()) == 1 and "Traceback" not in error
    assert main(["verify", "--last", "--explore"]) == 2
    assert "--explore chooses or runs claims, and --last runs none" in capsys.readouterr().err


@pytest.mark.slow
def test_no_claim_matching_k_is_one_line(specs_dir, tmp_path, capsys):
    assert verify(specs_dir, tmp_path / "r", "-k", "no_such_claim_anywhere") == 2
    assert capsys.readouterr().err.strip() == "resacct verify: error: no claim matches -k 'no_such_claim_anywhere'"
    assert not (tmp_path / "r").exists() and not list(tmp_path.glob(".r.*"))


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
    strict_json((tmp_path / "m" / "matrix.json").read_text())


def test_html_escapes_what_it_shows():
    document = _report("2.13.0", "holds")
    document["claims"][0]["says"] = "<script>alert(1)</script>"
    page = render_html(document)
    assert "<script>alert" not in page and "&lt;script&gt;" in page


def test_docstring_examples_of_the_report_modules():
    import doctest

    import resacct.harness.report
    import resacct.reporting.documents
    import resacct.reporting.evidence
    import resacct.reporting.terminal

    for module in (resacct.harness.report, resacct.reporting.documents, resacct.reporting.evidence, resacct.reporting.terminal):
        failed, attempted = doctest.testmod(module)
        assert attempted > 0 and failed == 0, module.__name__


def test_the_default_output_for_the_shipped_claims_fits_100_columns_and_150_lines():
    """The bar of issue 11, on every claim shipped today: each claim becomes a record as the plugin
    writes it (refuted ones with their truth, GPU ones skipped), with 12-digit values (the widest
    the real run prints), and the default output must stay within 100 columns and 150 lines."""
    import yaml

    from resacct.harness.registry import get_check
    from resacct.reporting.terminal import render_summary

    records = []
    for path in sorted(SPECS.glob("*.claims.yaml")):
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        for line, spec in enumerate(data["claims"], start=1):  # the line is not printed for these outcomes
            outcome = "skipped" if "gpu" in (spec.get("marks") or []) else spec.get("status", "holds")
            records.append({
                "id": spec["id"], "area": data["area"], "path": f"specs/{path.name}", "line": line, "outcome": outcome,
                "evidence": get_check(spec["measure"]).evidence,
                "says": spec["says"], "law": None if spec.get("law") is None else str(spec["law"]),
                "law_value": None if spec.get("law") is None else 764558180352,
                "forall": spec.get("forall") or {}, "expect": spec.get("expect"), "truth": spec.get("truth"),
                "measured": 874944921600, "inputs": spec.get("given") or {}, "examples": 40,
                "message": "needs a CUDA GPU; torch 2.13.0+cpu sees none (torch.cuda.is_available() is False)" if outcome == "skipped" else None,
            })
    document = {"environment": {"torch": "2.13.0+cpu", "device": "cpu", "device_name": "AMD EPYC"}, "claims": records}
    lines = render_summary(document).splitlines()
    refuted = sum(record["outcome"] == "refuted" for record in records)
    assert refuted >= 50 and any(line.startswith(f"REFUTED ({refuted})") for line in lines)
    listed = [record for record in records if record["outcome"] == "refuted" and any(line.startswith(f"  {record['id']}: ") for line in lines)]
    assert all(any(record["truth"][:20] in line for line in lines) for record in listed)  # each listed one with its truth
    more = [line for line in lines if line.startswith("  … and ")]
    assert len(listed) == refuted or more == [f"  … and {refuted - len(listed)} more refuted: resacct verify --last --status refuted, or errata.md"]
    assert max(len(line) for line in lines) <= 100
    assert len(lines) < 150, f"{len(lines)} lines for {len(records)} claims ({refuted} refuted)"
    evidence = lines.index(next(line for line in lines if line.startswith("evidence: ")))
    assert lines[evidence - 1].startswith("total ") and " published · " in lines[evidence] and "arithmetic only" in lines[evidence]
    assert "napkin " in " ".join(lines[evidence + 1:evidence + 5]) and "other " in " ".join(lines[evidence + 1:evidence + 5])


def test_the_evidence_of_each_claim_is_counted_per_area_and_names_its_value():
    """Issue 26: a reader sees what decides each claim — counted per area under the table, and a
    claim decided by resacct's arithmetic shows a *computed* value, not a *measured* one."""
    from resacct.reporting.terminal import claim_lines, render_summary

    def record(claim_id: str, area: str, evidence: str | None, outcome: str = "holds") -> dict:
        return {"id": claim_id, "area": area, "outcome": outcome, "evidence": evidence, "law": "4.377e22", "law_value": 4.377e22,
                "measured": 8.755e22, "truth": "the sparse peak", "path": f"specs/{area}.claims.yaml", "line": 3}

    records = [record("a", "flops", "measured"), record("b", "flops", "measured"), record("c", "napkin", "measured"),
               record("d", "napkin", "published"), record("e", "napkin", "arithmetic", "refuted"), record("f", "scale", None)]
    lines = render_summary({"environment": {}, "claims": records}).splitlines()
    start = lines.index("evidence: 3 measured · 1 published · 1 arithmetic only · 1 unstated")
    assert lines[start - 1].startswith("total ")
    assert lines[start + 1] == "  napkin 1m 1p 1a · scale 1u (m measured, p published, a arithmetic, u unstated); the other area:"
    assert lines[start + 2] == "  measured only"
    assert claim_lines(records[4], verbose=True)[0] == "  e: 4.377e22; computed 8.755e+22"
    assert claim_lines(dict(records[4], evidence="published"))[0] == "  e: 4.377e22; published 8.755e+22"
    assert claim_lines(records[0])[0] == "  a: 4.377e22; measured 8.755e+22"
    only_measured = render_summary({"environment": {}, "claims": records[:3]}).splitlines()
    assert "evidence: 3 measured" in only_measured and not any(line.startswith("  flops ") for line in only_measured)


def test_many_refuted_claims_get_one_line_each_to_keep_the_default_short():
    from resacct.reporting.terminal import render_summary

    records = [{"id": f"claim-{index}", "area": "x", "outcome": "refuted", "law": "2*n", "law_value": 2 * index, "measured": index,
                "truth": "the source doubles it", "path": "specs/x.claims.yaml", "line": index} for index in range(1, 101)]
    document = {"environment": {}, "claims": records}
    short = render_summary(document).splitlines()
    assert len(short) < 150 and "  claim-7: the source doubles it" in short
    assert "REFUTED (100): one line each, the truth (verify --last --status refuted: law, value, measurement)" in short
    full = render_summary(document, statuses=("refuted",)).splitlines()
    assert "  claim-7: 2*n = 14; measured 7" in full and "    the source doubles it" in full and len(full) > 200


def test_more_refuted_claims_than_lines_are_counted_not_cut_silently():
    from resacct.reporting.terminal import render_summary

    records = [{"id": f"claim-{index}", "area": "x", "outcome": "refuted", "law": "2*n", "law_value": 2 * index, "measured": index,
                "truth": "the source doubles it", "path": "specs/x.claims.yaml", "line": index} for index in range(1, 301)]
    records.append({"id": "broken", "area": "x", "outcome": "failed", "law": "n", "law_value": 1, "measured": 2,
                    "message": "does not hold", "path": "specs/x.claims.yaml", "line": 999})
    lines = render_summary({"environment": {}, "claims": records}).splitlines()
    assert len(lines) <= 145 and any(line.startswith("  broken") for line in lines)  # a failure is never the one cut
    listed = [line for line in lines if line.startswith("  claim-")]
    assert 100 < len(listed) < 300 and listed[0] == "  claim-1: the source doubles it"
    assert f"  … and {300 - len(listed)} more refuted: resacct verify --last --status refuted, or errata.md" in lines


@pytest.mark.slow
def test_a_closed_stdout_pipe_loses_no_report(specs_dir, tmp_path, monkeypatch, capsys, _complete_report):
    """`resacct verify | head -1`: the reader leaves before the output ends. The report was
    published before printing began, so it is complete; a partial run still goes beside it."""
    import io
    import os
    import sys

    report_dir = tmp_path / "reports"
    before = _complete_report(specs_dir, report_dir)
    spare = os.open(os.devnull, os.O_WRONLY)

    class ClosedPipe(io.TextIOBase):
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

        def fileno(self) -> int:
            return spare

    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    assert verify(specs_dir, report_dir, "-k", "cpu") == 0
    assert verify(specs_dir, report_dir) == 0
    monkeypatch.undo()
    os.close(spare)
    assert {path.name for path in report_dir.iterdir()} == set(before)
    assert load_report(report_dir / "report.json")["run"]["complete"] is True
    assert load_report(tmp_path / "reports-partial" / "report.json")["run"]["complete"] is False


@pytest.mark.slow
def test_a_check_that_raises_is_one_failed_block_and_v_adds_the_traceback(tmp_path, capsys):
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "storage.claims.yaml").write_text(
        "area: storage\nsource: test\nclaims:\n  - id: negative-dimension\n    says: a (-1, 2) tensor has strides [2, 1].\n"
        "    measure: tensors.strides\n    given: {d0: -1, d1: 2}\n    law: \"[d1, 1]\"\n", encoding="utf-8")
    assert verify(specs, tmp_path / "r") == 1
    out = capsys.readouterr().out
    block = out[out.index("FAILED (1)"):out.index("claims: ")].strip().splitlines()
    assert block[1] == "  negative-dimension  specs/storage.claims.yaml:4"
    assert "raised RuntimeError: Trying to create tensor" in block[2] and "d0=-1, d1=2" in " ".join(block)
    assert "—" not in out and "Traceback" not in out and len(block) <= 5  # nothing was measured: no empty rows
    assert verify(specs, tmp_path / "r", "-v") == 1
    verbose = capsys.readouterr().out
    assert "E   RuntimeError: Trying to create tensor with negative dimension" in verbose  # the traceback's last frame


def test_output_to_a_pipe_is_100_columns_unless_columns_says_otherwise(monkeypatch):
    """xdist workers and CI logs have no terminal: the width must not depend on what fd 1 once was."""
    from resacct.cli.verify import output_width_columns

    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setattr("shutil.get_terminal_size", lambda fallback=(80, 24): __import__("os").terminal_size((80, 24)))
    assert output_width_columns() == 100  # pytest captures stdout: not a terminal
    monkeypatch.setenv("COLUMNS", "72")
    monkeypatch.setattr("shutil.get_terminal_size", lambda fallback=(80, 24): __import__("os").terminal_size((72, 24)))
    assert output_width_columns() == 72
    monkeypatch.setenv("COLUMNS", "20")
    monkeypatch.setattr("shutil.get_terminal_size", lambda fallback=(80, 24): __import__("os").terminal_size((20, 24)))
    assert output_width_columns() == 60


@pytest.mark.slow
@pytest.mark.parametrize("where", ["repository", "elsewhere"])
def test_the_readme_main_command_runs_the_shipped_claims_from_the_checkout(where: str, tmp_path: Path) -> None:
    """`resacct verify` as the README types it, in this checkout (whose root conftest.py and
    pytest.ini belong to the test suite and must not leak into the run) and from another folder."""
    import subprocess
    import sys

    repository = SPECS.parents[1]
    completed = subprocess.run(
        [sys.executable, "-m", "resacct", "verify", "-q", "--no-roofline", "--no-timeline", "--report-dir", str(tmp_path / "reports"),
         "-k", "bytes-numel-times-element-size"],
        cwd=repository if where == "repository" else tmp_path, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "claims: 1 holds, 0 refuted, 0 skipped, 0 inconclusive, 0 failed, 0 invalid" in completed.stdout
