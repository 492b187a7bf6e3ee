"""The claims report and the errata (every refuted claim, the source's words beside the measured
truth) as Markdown."""

from __future__ import annotations

from typing import Any

from resacct.reporting.documents import (
    OUTCOMES,
    counts_by_area,
    example_text,
    location_text,
    markdown_code,
    markdown_text,
    outcome_counts,
    replay_notice,
    run_notice,
    statement_text,
)
from resacct.reporting.evidence import (
    EVIDENCE_MEANINGS,
    evidence_by_area,
    evidence_cell,
    evidence_columns,
    evidence_counts,
    evidence_text,
    value_label,
)

__all__ = ["render_markdown", "render_errata_markdown", "environment_line", "machine_text", "by_area", "note_text", "evidence_legend"]


def environment_line(environment: dict[str, Any]) -> str:
    """torch, Python, the device, the machine profile the claims' ``when:`` were decided on, the date."""
    machine = machine_text(environment)
    return (f"torch {environment.get('torch', '?')} · Python {environment.get('python', '?')} · "
            f"{environment.get('device', '?')}: {environment.get('device_name', '?')} · "
            + (f"{machine} · " if machine else "")
            + f"hypothesis profile {environment.get('hypothesis_profile', '?')} · {environment.get('created', '')}")


def machine_text(environment: dict[str, Any]) -> str:
    """``ISA avx512 · bf16 matmul amx · 2 cores, 2 torch threads · load 1.9 → 2.0`` from a report's
    ``environment.machine`` ('' for a report written before resacct recorded it).

    >>> machine_text({"machine": {"cpu_isa": "avx2", "cpu_bf16_matmul": "converted", "onednn_max_isa": "AVX2", "physical_cores": 2,
    ...     "torch_threads": 1, "load_average_start": 0.5, "faked": []}, "load_average_end": 2.25})
    'ISA avx2 · bf16 matmul converted (ONEDNN_MAX_CPU_ISA=AVX2) · 2 cores, 1 torch threads · load 0.5 → 2.25'
    """
    machine = environment.get("machine")
    if not isinstance(machine, dict):
        return ""
    cap = f" (ONEDNN_MAX_CPU_ISA={machine['onednn_max_isa']})" if machine.get("onednn_max_isa") else ""
    faked = f" · FAKED: {', '.join(map(str, machine['faked']))}" if machine.get("faked") else ""
    return (f"ISA {machine.get('cpu_isa', '?')} · bf16 matmul {machine.get('cpu_bf16_matmul', '?')}{cap} · "
            f"{machine.get('physical_cores', '?')} cores, {machine.get('torch_threads', '?')} torch threads · "
            f"load {machine.get('load_average_start', '?')} → {environment.get('load_average_end', '?')}{faked}")


def by_area(records: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    areas: dict[str, list[dict[str, Any]]] = {}
    for record in sorted(records, key=lambda r: (r["area"], r.get("path") or "", r.get("line") or 0)):
        areas.setdefault(record["area"], []).append(record)
    return areas


def note_text(record: dict[str, Any]) -> str:
    """The truth of a refuted claim; the message of a skipped, failed or invalid one (whole)."""
    if record["outcome"] == "refuted":
        return record.get("truth") or ""
    if record["outcome"] in {"skipped", "inconclusive", "failed", "invalid"}:
        return (record.get("message") or "").strip()
    return ""


def _cell(text: Any) -> str:
    """A table cell: whatever a spec or a report.json holds is shown as text, never as HTML or Markdown."""
    return markdown_text(text)


def _line(text: Any) -> str:
    """Text for a heading or a list item: inert, on one line."""
    return markdown_text(text, newline=" ")


def _banner(document: dict[str, Any]) -> list[str]:
    notice = run_notice(document)
    replayed = replay_notice(document)
    return ([f"> **{_line(notice)}**", ""] if notice else []) + ([f"> {_line(replayed)}", ""] if replayed else [])


def evidence_legend() -> str:
    """One sentence: what each evidence kind means (every report says it where it counts them)."""
    return "Evidence, what decides a claim: " + "; ".join(f"**{kind}**: {meaning}" for kind, meaning in EVIDENCE_MEANINGS.items()) + "."


def render_markdown(document: dict[str, Any]) -> str:
    records = document["claims"]
    counts = outcome_counts(records)
    kinds = evidence_columns(records)
    evidence = evidence_by_area(records)
    lines = ["# resacct claims report", "", *_banner(document), _line(environment_line(document["environment"])), "",
             f"**{', '.join(f'{counts[name]} {name}' for name in OUTCOMES)}** — evidence: {evidence_text(evidence_counts(records))}", "",
             evidence_legend(), "",
             "| area | " + " | ".join(OUTCOMES + kinds) + " |", "|---|" + "---:|" * (len(OUTCOMES) + len(kinds))]
    lines += [f"| {_cell(area)} | " + " | ".join([str(area_counts[name]) for name in OUTCOMES] + [str(evidence[area][kind]) for kind in kinds]) + " |"
              for area, area_counts in counts_by_area(records).items()]
    lines.append("")
    for area, area_records in by_area(records).items():
        lines += [f"## {_line(area)}", "", f"{len(area_records)} claim{'' if len(area_records) == 1 else 's'}, by evidence: {evidence_text(evidence_counts(area_records))}.", "",
                  "| claim | says | law = value / expect | predicted | measured | evidence | status | note |",
                  "|---|---|---|---|---|---|---|---|"]
        for record in area_records:
            claim = f"{_cell(record['id'])}<br>{markdown_code(location_text(record), in_table=True)}"
            example = example_text(record)
            statement = _cell(statement_text(record)) + (f"<br>{_cell(example)}" if example else "")
            lines.append("| " + " | ".join([claim, _cell(record.get("says")), statement] + [_cell(cell) for cell in (
                record.get("predicted"), record.get("measured"), evidence_cell(record), record["outcome"], note_text(record))]) + " |")
        lines.append("")
    return "\n".join(lines)


_REFUTED_BY = {"measured": "by measurement", "published": "by a published figure", "arithmetic": "by arithmetic",
               "recorded": "by a recorded GPU measurement", "unstated": "by evidence not stated"}


def _refuted_by(refuted: list[dict[str, Any]]) -> str:
    """``: 100 by measurement, 5 by arithmetic`` (what decided the refuted claims)."""
    counts = evidence_counts(refuted)
    return (": " + ", ".join(f"{counts[kind]} {words}" for kind, words in _REFUTED_BY.items() if counts[kind])) if refuted else ""


def render_errata_markdown(document: dict[str, Any]) -> str:
    refuted = [record for record in document["claims"] if record["outcome"] == "refuted"]
    lines = ["# Errata: what the sources get wrong, measured", "", *_banner(document),
             f"{len(refuted)} statements of the lecture write-ups are false{_refuted_by(refuted)} "
             f"({_line(environment_line(document['environment']))}). Each stays in the specs as a refuted claim: "
             "if it ever became true, its item would fail.", "", evidence_legend(), ""]
    for record in sorted(refuted, key=lambda r: (r.get("source") or "", r["id"])):
        example = example_text(record)
        lines += [f"## {_line(record['id'])}", "", f"- **Source:** {_line(record.get('source'))}", f"- **Says:** {_line(record.get('says'))}",
                  f"- **Law / expectation:** {markdown_code(statement_text(record))}" if record.get("law")
                  else f"- **Expectation:** {_line(statement_text(record))}",
                  f"- **{value_label(record).capitalize()}:** {_line(record.get('measured'))}" + (f" ({_line(example)})" if example else ""),
                  f"- **Evidence:** {_line(evidence_cell(record))}",
                  f"- **Truth:** {_line(record.get('truth'))}", f"- **Spec:** {markdown_code(location_text(record))}", ""]
    return "\n".join(lines)
