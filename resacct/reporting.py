"""The claims report in the forms people read: Markdown, a single-file HTML page, the errata
(every refuted claim with the source's words and the measured truth), and the matrix of claim
status across torch versions (and devices) built from several ``report.json`` files.

>>> outcome_counts([{"outcome": "holds"}, {"outcome": "refuted"}])["holds"]
1
"""

from __future__ import annotations

import html
import json
from collections import Counter
from pathlib import Path
from typing import Any

from resacct.errors import ResacctError

__all__ = [
    "OUTCOMES",
    "outcome_counts",
    "load_report",
    "render_markdown",
    "render_html",
    "render_errata_markdown",
    "merge_reports",
    "render_matrix_markdown",
    "write_report_directory",
]

OUTCOMES = ("holds", "refuted", "skipped", "failed", "invalid")
_COLOURS = {"holds": "#1a7f37", "refuted": "#8250df", "skipped": "#9a6700", "failed": "#cf222e", "invalid": "#cf222e"}


def outcome_counts(records: list[dict[str, Any]]) -> Counter:
    return Counter(record["outcome"] for record in records)


def load_report(path: str | Path) -> dict[str, Any]:
    """A ``report.json`` written by ``resacct verify`` or ``pytest --claims-json``."""
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ResacctError(f"report {str(path)!r} does not exist") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ResacctError(f"report {str(path)!r} is not valid JSON: {error}") from None
    if not isinstance(document, dict) or not isinstance(document.get("claims"), list) or "environment" not in document:
        raise ResacctError(f"report {str(path)!r} is not a resacct report (expected keys 'environment' and 'claims')")
    return document


def _value(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _statement(record: dict[str, Any]) -> str:
    statement = record.get("law") or ", ".join(f"{k} {v}" for k, v in (record.get("expect") or {}).items())
    if record.get("forall"):
        statement += f" — for all {', '.join(record['forall'])} ({record.get('examples', 0)} examples)"
    return statement


def _note(record: dict[str, Any]) -> str:
    if record["outcome"] == "refuted":
        return record.get("truth") or ""
    if record["outcome"] in {"skipped", "failed", "invalid"}:
        return (record.get("message") or "").strip().splitlines()[0] if record.get("message") else ""
    return ""


def _by_area(records: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    areas: dict[str, list[dict[str, Any]]] = {}
    for record in sorted(records, key=lambda r: (r["area"], r.get("path") or "", r.get("line") or 0)):
        areas.setdefault(record["area"], []).append(record)
    return areas


def _environment_line(environment: dict[str, Any]) -> str:
    return (f"torch {environment.get('torch', '?')} · Python {environment.get('python', '?')} · "
            f"{environment.get('device', '?')}: {environment.get('device_name', '?')} · "
            f"hypothesis profile {environment.get('hypothesis_profile', '?')} · {environment.get('created', '')}")


def _summary_line(records: list[dict[str, Any]]) -> str:
    counts = outcome_counts(records)
    return ", ".join(f"{counts[name]} {name}" for name in OUTCOMES)


def _md_cell(text: Any) -> str:
    return _value(text).replace("|", "\\|").replace("\n", " ")


def render_markdown(document: dict[str, Any]) -> str:
    records = document["claims"]
    lines = ["# resacct claims report", "", _environment_line(document["environment"]), "", f"**{_summary_line(records)}**", ""]
    for area, area_records in _by_area(records).items():
        lines += [f"## {area}", "", "| claim | says | law / expect | predicted | measured | status | note |", "|---|---|---|---|---|---|---|"]
        for record in area_records:
            lines.append("| " + " | ".join(_md_cell(cell) for cell in (
                record["id"], record.get("says"), _statement(record), record.get("predicted"), record.get("measured"),
                record["outcome"], _note(record))) + " |")
        lines.append("")
    return "\n".join(lines)


def render_errata_markdown(document: dict[str, Any]) -> str:
    refuted = [record for record in document["claims"] if record["outcome"] == "refuted"]
    lines = ["# Errata: what the sources get wrong, measured", "",
             f"{len(refuted)} statements of the lecture write-ups are false by measurement "
             f"({_environment_line(document['environment'])}). Each stays in the specs as a refuted claim: "
             "if it ever became true, its item would fail.", ""]
    for record in sorted(refuted, key=lambda r: (r.get("source") or "", r["id"])):
        lines += [f"## {record['id']}", "", f"- **Source:** {record.get('source')}", f"- **Says:** {record.get('says')}",
                  f"- **Law / expectation:** `{_statement(record)}` → {_value(record.get('law_value'))}" if record.get("law") else f"- **Expectation:** {_statement(record)}",
                  f"- **Measured:** {_value(record.get('measured'))}", f"- **Truth:** {record.get('truth')}",
                  f"- **Spec:** `{record.get('path')}:{record.get('line')}`", ""]
    return "\n".join(lines)


_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, Segoe UI, sans-serif; margin: 2rem auto; max-width: 1400px; color: #1f2328; }
h1 { margin-bottom: .2rem } .env { color: #57606a; margin-bottom: 1rem }
.summary span { display: inline-block; margin-right: .6rem; padding: .15rem .6rem; border-radius: 1rem; color: white; font-weight: 600 }
table { border-collapse: collapse; width: 100%; margin: .5rem 0 1.5rem; table-layout: fixed }
th, td { border: 1px solid #d0d7de; padding: .3rem .5rem; vertical-align: top; text-align: left; overflow-wrap: anywhere }
th { background: #f6f8fa } td.id, td.num { font-family: ui-monospace, monospace; font-size: 12px }
table.claims th:nth-child(1) { width: 18% } table.claims th:nth-child(2) { width: 30% } table.claims th:nth-child(3) { width: 18% }
table.claims th:nth-child(4), table.claims th:nth-child(5) { width: 9% } table.claims th:nth-child(6) { width: 16% }
.badge { color: white; border-radius: .3rem; padding: 0 .4rem; font-weight: 600 } .note { color: #57606a; font-size: 12px }
nav a { margin-right: .8rem }
"""


def _badge(outcome: str) -> str:
    return f'<span class="badge" style="background:{_COLOURS[outcome]}">{html.escape(outcome)}</span>'


def render_html(document: dict[str, Any]) -> str:
    """One self-contained page: summary, one table per area, then the errata."""
    records = document["claims"]
    counts = outcome_counts(records)
    escape = html.escape
    parts = ["<!doctype html>", '<html lang="en"><head><meta charset="utf-8">', "<title>resacct claims report</title>",
             f"<style>{_CSS}</style></head><body>", "<h1>resacct claims report</h1>",
             f'<div class="env">{escape(_environment_line(document["environment"]))}</div>', '<div class="summary">']
    parts += [f'<span style="background:{_COLOURS[name]}">{counts[name]} {name}</span>' for name in OUTCOMES]
    areas = _by_area(records)
    parts.append("</div><nav>" + "".join(f'<a href="#{escape(area)}">{escape(area)}</a>' for area in areas) + '<a href="#errata">errata</a></nav>')
    for area, area_records in areas.items():
        parts.append(f'<h2 id="{escape(area)}">{escape(area)}</h2><table class="claims"><thead><tr><th>claim</th><th>says</th>'
                     "<th>law / expect</th><th>predicted</th><th>measured</th><th>status</th></tr></thead><tbody>")
        for record in area_records:
            note = _note(record)
            parts.append(
                f'<tr data-outcome="{record["outcome"]}"><td class="id" title="{escape(str(record.get("path")))}:{record.get("line")}">{escape(record["id"])}</td>'
                f'<td>{escape(record.get("says") or "")}<div class="note">{escape(record.get("source") or "")}</div></td>'
                f'<td class="num">{escape(_statement(record))}</td><td class="num">{escape(_value(record.get("predicted")))}</td>'
                f'<td class="num">{escape(_value(record.get("measured")))}</td>'
                f'<td>{_badge(record["outcome"])}<div class="note">{escape(note)}</div></td></tr>')
        parts.append("</tbody></table>")
    refuted = [record for record in records if record["outcome"] == "refuted"]
    parts.append(f'<h2 id="errata">Errata ({len(refuted)})</h2><table class="errata"><thead><tr><th>claim</th><th>the source says</th>'
                 "<th>measured</th><th>truth</th></tr></thead><tbody>")
    for record in refuted:
        parts.append(f'<tr><td class="id">{escape(record["id"])}</td><td>{escape(record.get("says") or "")}<div class="note">{escape(record.get("source") or "")}</div></td>'
                     f'<td class="num">{escape(_value(record.get("measured")))}</td><td>{escape(record.get("truth") or "")}</td></tr>')
    parts.append("</tbody></table></body></html>")
    return "\n".join(parts)


def _column_name(environment: dict[str, Any]) -> str:
    return f"torch {environment.get('torch', '?')} · {environment.get('device', '?')}"


def merge_reports(documents: list[dict[str, Any]]) -> dict[str, Any]:
    """Claims × environments: ``{"columns": [...], "rows": [{"id", "area", "says", "outcomes": {column: outcome}, "changes"}]}``."""
    if not documents:
        raise ResacctError("--merge needs at least one report.json")
    columns: list[str] = []
    rows: dict[str, dict[str, Any]] = {}
    for document in documents:
        column = _column_name(document["environment"])
        suffix = 2
        while column in columns:
            column = f"{_column_name(document['environment'])} ({suffix})"
            suffix += 1
        columns.append(column)
        for record in document["claims"]:
            row = rows.setdefault(record["id"], {"id": record["id"], "area": record["area"], "says": record.get("says", ""), "outcomes": {}})
            row["outcomes"][column] = record["outcome"]
    ordered = sorted(rows.values(), key=lambda row: (row["area"], row["id"]))
    for row in ordered:
        seen = {row["outcomes"].get(column, "absent") for column in columns}
        row["changes"] = len(seen) > 1
    return {"columns": columns, "rows": ordered}


def render_matrix_markdown(matrix: dict[str, Any]) -> str:
    columns = matrix["columns"]
    changed = [row for row in matrix["rows"] if row["changes"]]
    lines = ["# Claims across torch versions", "",
             f"{len(matrix['rows'])} claims × {len(columns)} environments; {len(changed)} change status between them (marked ⚠).", "",
             "| area | claim | " + " | ".join(columns) + " |", "|---|---|" + "---|" * len(columns)]
    for row in matrix["rows"]:
        marker = " ⚠" if row["changes"] else ""
        cells = [row["outcomes"].get(column, "—") for column in columns]
        lines.append(f"| {row['area']} | {row['id']}{marker} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_report_directory(document: dict[str, Any], directory: Path) -> dict[str, Path]:
    """Write report.json, report.md, report.html and errata.md into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    written = {
        "json": directory / "report.json",
        "markdown": directory / "report.md",
        "html": directory / "report.html",
        "errata": directory / "errata.md",
    }
    written["json"].write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    written["markdown"].write_text(render_markdown(document), encoding="utf-8")
    written["html"].write_text(render_html(document), encoding="utf-8")
    written["errata"].write_text(render_errata_markdown(document), encoding="utf-8")
    return written
