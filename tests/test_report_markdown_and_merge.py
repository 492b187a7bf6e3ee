"""Hostile report.json files and spec text (issue 26): ``verify --merge`` refuses what is not a
report in one line (a ``run`` that is not an object, a claim id twice, a torch version that is not
text), and the Markdown reports show whatever a spec or a report holds as text — never as HTML, a
comment, an extra table cell or a broken row (report.html already escaped it)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from resacct.cli import main
from resacct.errors import ResacctError
from resacct.reporting import load_report, merge_reports, render_matrix_markdown
from resacct.reporting.markdown import render_errata_markdown, render_markdown

HOSTILE = ["<script>alert(1)</script>", "<img src=x onerror=alert(1)>", "<!-- hidden", "a | b | c", "two\nlines", "`code` [link](javascript:x)"]


def _report(**changes) -> dict:
    document = {"environment": {"torch": "2.13.0", "device": "cpu"},
                "claims": [{"id": "a", "area": "x", "says": "s", "outcome": "holds"}, {"id": "b", "area": "x", "says": "s", "outcome": "refuted"}]}
    document.update(changes)
    return document


def _hostile_report(text: str) -> dict:
    record = {"id": f"id {text}", "area": f"area {text}", "says": text, "outcome": "refuted", "truth": text, "source": text,
              "law": f"2*m {text}", "law_value": 3, "measured": text, "path": f"specs/{text}.claims.yaml", "line": 3,
              "inputs": {"m": text}, "message": text, "evidence": text}
    failed = dict(record, id=f"failed {text}", outcome="failed")
    return {"environment": {"torch": f"2.13.0 {text}", "device": text, "device_name": text, "python": text},
            "run": {"complete": False, "interrupted": False, "selection": {"areas": [text], "pattern": text}},
            "claims": [record, failed]}


def _write(tmp_path: Path, name: str, document) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(document), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("document, problem", [
    (_report(run=5), "'run' is a number (5); expected an object"),
    (_report(run={"complete": "yes"}), "'run.complete' is a string; expected true or false"),
    (_report(run={"selection": [1]}), "'run.selection' is a list"),
    (_report(run={"selection": {"areas": [3]}}), "'run.selection.areas' must be a list of area names"),
    (_report(environment={"torch": 2.4, "device": "cpu"}), "'environment.torch' is a number (2.4); expected a string"),
    (_report(environment={"torch": "2.4", "device": "cpu", "machine": []}), "'environment.machine' is a list"),
    (_report(claims=[{"id": "a", "area": "x", "outcome": "holds"}, {"id": "a", "area": "y", "outcome": "failed"}]),
     "claims[1] repeats the id 'a' of claims[0]; expected each claim once"),
])
def test_merge_refuses_what_is_not_a_report_in_one_line(tmp_path, capsys, document, problem):
    path = _write(tmp_path, "bad.json", document)
    with pytest.raises(ResacctError, match=re.escape(problem)):
        load_report(path)
    good = _write(tmp_path, "good.json", _report())
    assert main(["verify", "--merge", good, path, "--report-dir", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"resacct verify: error: report {path!r} is not a resacct report: ") and problem in err


def test_the_run_entries_verify_writes_pass_the_checks():
    merge_reports([_report(run={"complete": True, "interrupted": False, "selection": {"areas": [], "pattern": None}}),
                   _report(run={"complete": False, "interrupted": "Ctrl-C", "selection": {"areas": ["x"], "pattern": "a"}})])


def _unsafe(markdown: str) -> list[str]:
    """What a Markdown renderer would run or hide: raw HTML tags other than <br>, comments, links
    (outside code spans, whose text is shown as it is)."""
    markdown = re.sub(r"(?<![\\`])(`+)(?!`).*?(?<!`)\1(?!`)", "CODE", markdown)
    return re.findall(r"<(?!br>)[a-zA-Z!/]|(?<!\\)\[[^\]]*(?<!\\)\]\(", markdown)


def _table_rows_are_whole(markdown: str) -> None:
    rows = [line for line in markdown.splitlines() if line.startswith("|")]
    widths = {len(re.findall(r"(?<!\\)\|", line)) for line in rows if not line.startswith("|---")}
    header_widths = {len(re.findall(r"(?<!\\)\|", line)) for line in rows if line.startswith("|---")}
    assert rows and len(widths) <= 2 and widths <= header_widths | {max(widths)}, rows  # the counts table and the claims table


@pytest.mark.parametrize("text", HOSTILE)
def test_markdown_reports_show_spec_and_report_text_as_text(text):
    document = _hostile_report(text)
    for markdown in (render_markdown(document), render_errata_markdown(document)):
        assert not _unsafe(markdown), _unsafe(markdown)
        for line in markdown.splitlines():
            if line.startswith("|"):
                assert line.endswith("|")
    _table_rows_are_whole(render_markdown(document))
    claims_rows = [line for line in render_markdown(document).splitlines() if line.startswith("| id ") or line.startswith("| failed ")]
    assert len(claims_rows) == 2 and all(len(re.findall(r"(?<!\\)\|", row)) == 9 for row in claims_rows), claims_rows
    assert all(" | unstated | " in row for row in claims_rows)  # an evidence that is not a kind is never shown as given


def _claims_of_each_evidence() -> dict:
    claims = [{"id": f"c{index}", "area": area, "outcome": outcome, "evidence": evidence, "says": "s", "measured": 1, "truth": "t"}
              for index, (area, outcome, evidence) in enumerate([
                  ("napkin", "holds", "measured"), ("napkin", "refuted", "arithmetic"), ("napkin", "holds", "published"),
                  ("scale", "refuted", "published"), ("scale", "holds", "published")])]
    return {"environment": {"torch": "2.13.0", "device": "cpu"}, "claims": claims}


def test_report_md_counts_the_evidence_per_area_and_names_it_per_claim():
    markdown = render_markdown(_claims_of_each_evidence())
    assert "**3 holds, 2 refuted, 0 skipped, 0 inconclusive, 0 failed, 0 invalid** — evidence: 1 measured · 3 published · 1 arithmetic" in markdown
    assert "| area | holds | refuted | skipped | inconclusive | failed | invalid | measured | published | arithmetic |" in markdown
    assert "| napkin | 2 | 1 | 0 | 0 | 0 | 0 | 1 | 1 | 1 |" in markdown and "| scale | 1 | 1 | 0 | 0 | 0 | 0 | 0 | 2 | 0 |" in markdown
    assert "3 claims, by evidence: 1 measured · 1 published · 1 arithmetic." in markdown
    assert "| c1<br>`?:?` | s |  | — | 1 | arithmetic | refuted | t |" in markdown
    assert "**arithmetic**: resacct's own arithmetic over the inputs; nothing measured" in markdown
    _table_rows_are_whole(markdown)


def test_errata_say_what_refuted_each_claim():
    errata = render_errata_markdown(_claims_of_each_evidence())
    assert "2 statements of the lecture write-ups are false: 1 by a published figure, 1 by arithmetic (" in errata
    c1 = errata[errata.index("## c1"):errata.index("## c3")]
    assert "- **Computed:** 1" in c1 and "- **Evidence:** arithmetic" in c1
    assert "- **Published:** 1" in errata[errata.index("## c3"):] and "- **Evidence:** published" in errata[errata.index("## c3"):]


@pytest.mark.parametrize("text", HOSTILE)
def test_the_matrix_shows_ids_areas_and_columns_as_text(text):
    hostile = _hostile_report(text)
    matrix = merge_reports([hostile, _report()])
    markdown = render_matrix_markdown(matrix)
    assert not _unsafe(markdown), _unsafe(markdown)
    rows = [line for line in markdown.splitlines() if line.startswith("|")]
    assert len({len(re.findall(r"(?<!\\)\|", row)) for row in rows}) == 1, rows
    assert len(rows) == 2 + len(matrix["rows"])
