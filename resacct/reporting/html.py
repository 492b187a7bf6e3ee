"""The claims report as one self-contained HTML page: per-area counts, filters by status and area,
a search box, every claim linking to its YAML line, the errata, and the run's roofline embedded.

The filters live in the address's fragment (``report.html#status=failed,refuted&area=flops&q=gpt``),
so a filtered view can be shared, and a headless browser can load one.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any

from resacct.reporting.documents import (
    OUTCOMES,
    counts_by_area,
    example_text,
    format_value,
    location_text,
    outcome_counts,
    replay_notice,
    run_notice,
    statement_text,
)
from resacct.reporting.evidence import EVIDENCE_MEANINGS, evidence_by_area, evidence_columns, evidence_counts, evidence_of, recorded_source, value_label
from resacct.reporting.markdown import environment_line, note_text

__all__ = ["render_html"]

_COLOURS = {"holds": "#1a7f37", "refuted": "#8250df", "skipped": "#9a6700", "inconclusive": "#bc4c00", "failed": "#cf222e", "invalid": "#cf222e"}

_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, Segoe UI, sans-serif; margin: 2rem auto; max-width: 1400px; padding: 0 1rem; color: #1f2328; }
h1 { margin-bottom: .2rem } .env { color: #57606a; margin-bottom: 1rem }
.partial { background: #fff8c5; border: 1px solid #d4a72c; padding: .5rem .8rem; border-radius: .4rem; font-weight: 600; margin-bottom: 1rem }
.summary span { display: inline-block; margin-right: .6rem; padding: .15rem .6rem; border-radius: 1rem; color: white; font-weight: 600 }
table { border-collapse: collapse; width: 100%; margin: .5rem 0 1.5rem }
th, td { border: 1px solid #d0d7de; padding: .3rem .5rem; vertical-align: top; text-align: left; overflow-wrap: anywhere }
th { background: #f6f8fa } td.id, td.num { font-family: ui-monospace, monospace; font-size: 12px }
table.counts { width: auto } table.counts td { text-align: right } table.counts td:first-child { text-align: left }
table.claims { table-layout: fixed }
table.claims th:nth-child(1) { width: 16% } table.claims th:nth-child(2) { width: 24% } table.claims th:nth-child(3) { width: 20% }
table.claims th:nth-child(4), table.claims th:nth-child(5) { width: 9% } table.claims th:nth-child(6) { width: 22% }
.badge { color: white; border-radius: .3rem; padding: 0 .4rem; font-weight: 600 } .note { color: #57606a; font-size: 12px }
.filters { position: sticky; top: 0; background: white; padding: .5rem 0; border-bottom: 1px solid #d0d7de; z-index: 1 }
.filters label { margin-right: .7rem } .filters input[type=search] { width: 18rem }
tr[hidden] { display: none } img.roofline { max-width: 100%; border: 1px solid #d0d7de }
.evidence { display: inline-block; margin-left: .3rem; padding: 0 .35rem; border: 1px solid #d0d7de; border-radius: .3rem; font-size: 12px }
.evidence.published { background: #ddf4ff } .evidence.recorded { background: #dafbe1 } .evidence.arithmetic { background: #fff8c5 } .evidence.unstated { background: #ffebe9 }
table.counts td.kind { background: #f6f8fa } .evidence-summary { margin: .4rem 0 } .evidence-summary p { margin: .2rem 0 }
"""

_SCRIPT = """
(function () {
  const rows = Array.from(document.querySelectorAll("tr[data-outcome]"));
  const boxes = Array.from(document.querySelectorAll("input[name=status]"));
  const area = document.getElementById("area"), evidence = document.getElementById("evidence"), search = document.getElementById("search");
  function apply() {
    const wanted = new Set(boxes.filter(b => b.checked).map(b => b.value));
    const text = search.value.trim().toLowerCase();
    let shown = 0;
    for (const row of rows) {
      const visible = wanted.has(row.dataset.outcome) && (!area.value || row.dataset.area === area.value)
        && (!evidence.value || row.dataset.evidence === evidence.value)
        && (!text || row.textContent.toLowerCase().includes(text));
      row.hidden = !visible;
      if (visible) shown++;
    }
    document.getElementById("shown").textContent = shown;
    const state = new URLSearchParams({status: Array.from(wanted).join(","), area: area.value, evidence: evidence.value, q: search.value});
    try { history.replaceState(null, "", "#" + state.toString()); } catch (error) { /* file:// in some browsers */ }
  }
  function load() {
    const state = new URLSearchParams(location.hash.slice(1));
    if (state.has("status")) { const wanted = new Set(state.get("status").split(",")); boxes.forEach(b => b.checked = wanted.has(b.value)); }
    if (state.has("area")) area.value = state.get("area");
    if (state.has("evidence")) evidence.value = state.get("evidence");
    if (state.has("q")) search.value = state.get("q");
    apply();
  }
  boxes.forEach(b => b.addEventListener("change", apply));
  area.addEventListener("change", apply);
  evidence.addEventListener("change", apply);
  search.addEventListener("input", apply);
  window.addEventListener("hashchange", load);
  load();
})();
"""


def _badge(outcome: str) -> str:
    return f'<span class="badge" style="background:{_COLOURS[outcome]}">{html.escape(outcome)}</span>'


def _spec_link(record: dict[str, Any], rootdir: str | None) -> str:
    text = html.escape(location_text(record))
    if not rootdir or not record.get("path"):
        return text
    target = Path(rootdir) / record["path"]
    if not target.is_absolute():
        return text
    return f'<a href="{html.escape(target.as_uri())}" title="open the claims file (the claim is at line {record.get("line")})">{text}</a>'


def _counts_table(records: list[dict[str, Any]]) -> list[str]:
    """Outcomes per area, then the evidence deciding them (each count links to its claims)."""
    escape = html.escape
    everything = ",".join(OUTCOMES)
    kinds = evidence_columns(records)
    evidence = evidence_by_area(records)
    parts = ['<table class="counts"><thead><tr><th>area</th>' + "".join(f"<th>{name}</th>" for name in OUTCOMES)
             + "".join(f'<th title="{escape(EVIDENCE_MEANINGS.get(kind, "no evidence declared"))}">{kind}</th>' for kind in kinds)
             + "</tr></thead><tbody>"]
    for area, counts in counts_by_area(records).items():
        cells = "".join(f'<td><a href="#status={name}&amp;area={escape(area)}">{counts[name]}</a></td>' if counts[name] else "<td>0</td>"
                        for name in OUTCOMES)
        cells += "".join(f'<td class="kind"><a href="#status={everything}&amp;area={escape(area)}&amp;evidence={kind}">{evidence[area][kind]}</a></td>'
                         if evidence[area][kind] else '<td class="kind">0</td>' for kind in kinds)
        parts.append(f'<tr><td><a href="#status={everything}&amp;area={escape(area)}">{escape(area)}</a></td>{cells}</tr>')
    totals, kind_totals = outcome_counts(records), evidence_counts(records)
    parts.append("<tr><th>total</th>" + "".join(f"<th>{totals[name]}</th>" for name in OUTCOMES)
                 + "".join(f"<th>{kind_totals[kind]}</th>" for kind in kinds) + "</tr></tbody></table>")
    return parts


def _evidence_tag(record: dict[str, Any]) -> str:
    kind = evidence_of(record)
    meaning = EVIDENCE_MEANINGS.get(kind, "no evidence declared for this claim's check")
    source = recorded_source(record)
    named = f'<div class="note">{html.escape(source)}</div>' if source else ""
    if record.get("replayed_from"):  # judged on the measurement an earlier verify made on this setup
        named += f'<div class="note">replayed: measured {html.escape(str(record["replayed_from"]))}</div>'
    return f'<span class="evidence {kind}" title="{html.escape(meaning)}">{kind}</span>{named}'


def _value_note(record: dict[str, Any]) -> str:
    """Under a value that no torch run measured: ``computed`` (arithmetic) or ``published``."""
    label = value_label(record)
    return f'<div class="note">{label}</div>' if label != "measured" else ""


def _evidence_legend() -> str:
    return ('<p class="note">Evidence, what decides a claim: '
            + "; ".join(f"<b>{kind}</b>: {html.escape(meaning)}" for kind, meaning in EVIDENCE_MEANINGS.items()) + ".</p>")


def _filters(records: list[dict[str, Any]]) -> str:
    escape = html.escape
    counts = outcome_counts(records)
    boxes = "".join(f'<label><input type="checkbox" name="status" value="{name}" checked> {name} ({counts[name]})</label>' for name in OUTCOMES)
    areas = "".join(f'<option value="{escape(area)}">{escape(area)}</option>' for area in counts_by_area(records))
    kind_counts = evidence_counts(records)
    kinds = "".join(f'<option value="{kind}">{kind} ({kind_counts[kind]})</option>' for kind in evidence_columns(records))
    return (f'<div class="filters">{boxes}<label>area <select id="area"><option value="">all areas</option>{areas}</select></label>'
            f'<label>evidence <select id="evidence"><option value="">any evidence</option>{kinds}</select></label>'
            f'<label>search <input type="search" id="search" placeholder="id, words, law, truth…"></label>'
            f'showing <span id="shown">{len(records)}</span> of {len(records)}</div>')


def _claim_row(record: dict[str, Any], rootdir: str | None) -> str:
    escape = html.escape
    example = example_text(record)
    return (f'<tr data-outcome="{escape(record["outcome"])}" data-area="{escape(record["area"])}" data-evidence="{evidence_of(record)}">'
            f'<td class="id">{escape(record["id"])}<div class="note">{_spec_link(record, rootdir)}</div></td>'
            f'<td>{escape(record.get("says") or "")}<div class="note">{escape(record.get("source") or "")}</div></td>'
            f'<td class="num">{escape(statement_text(record))}<div class="note">{escape(example)}</div></td>'
            f'<td class="num">{escape(format_value(record.get("predicted")))}</td>'
            f'<td class="num">{escape(format_value(record.get("measured")))}{_value_note(record)}</td>'
            f'<td>{_badge(record["outcome"])}{_evidence_tag(record)}<div class="note">{escape(note_text(record))}</div></td></tr>')


def render_html(document: dict[str, Any], roofline_png: bytes | None = None, timeline_png: bytes | None = None) -> str:
    """One self-contained page (no network, no files beside it): the roofline and the step's memory
    timeline, when given, are inlined."""
    records = sorted(document["claims"], key=lambda r: (r["area"], r.get("path") or "", r.get("line") or 0))
    counts = outcome_counts(records)
    rootdir = (document.get("run") or {}).get("rootdir")
    escape = html.escape
    notice = run_notice(document)
    parts = ["<!doctype html>", '<html lang="en"><head><meta charset="utf-8">', "<title>resacct claims report</title>",
             f"<style>{_CSS}</style></head><body>", "<h1>resacct claims report</h1>",
             f'<div class="partial">{escape(notice)}</div>' if notice else "",
             f'<div class="env">{escape(replayed)}</div>' if (replayed := replay_notice(document)) else "",
             f'<div class="env">{escape(environment_line(document["environment"]))}</div><div class="summary">']
    parts += [f'<span style="background:{_COLOURS[name]}">{counts[name]} {name}</span>' for name in OUTCOMES]
    kind_counts = evidence_counts(records)
    parts.append('</div><div class="evidence-summary">evidence: ' + " · ".join(
        f"{kind_counts[kind]} {_evidence_tag({'evidence': kind})}" for kind in evidence_columns(records)) + _evidence_legend())
    parts.append('</div><nav><a href="#claims">claims</a> · <a href="#errata">errata</a>'
                 + (' · <a href="#roofline">roofline</a>' if roofline_png else "")
                 + (' · <a href="#step-timeline">a step\'s memory</a>' if timeline_png else "") + "</nav>")
    parts += _counts_table(records)
    parts.append(f'<h2 id="claims">Claims</h2>{_filters(records)}<table class="claims"><thead><tr><th>claim</th><th>says</th>'
                 "<th>law = value / expect</th><th>predicted</th><th>measured</th><th>status, evidence</th></tr></thead><tbody>")
    parts += [_claim_row(record, rootdir) for record in records]
    parts.append("</tbody></table>")
    refuted = [record for record in records if record["outcome"] == "refuted"]
    parts.append(f'<h2 id="errata">Errata ({len(refuted)})</h2><table class="errata"><thead><tr><th>claim</th><th>the source says</th>'
                 "<th>measured</th><th>truth</th></tr></thead><tbody>")
    for record in refuted:
        parts.append(f'<tr><td class="id">{escape(record["id"])}<div class="note">{_spec_link(record, rootdir)}</div></td>'
                     f'<td>{escape(record.get("says") or "")}<div class="note">{escape(record.get("source") or "")}</div></td>'
                     f'<td class="num">{escape(format_value(record.get("measured")))}{_value_note(record)}</td>'
                     f'<td>{_evidence_tag(record)} {escape(record.get("truth") or "")}</td></tr>')
    parts.append("</tbody></table>")
    if roofline_png:
        encoded = base64.b64encode(roofline_png).decode("ascii")
        parts.append(f'<h2 id="roofline">This machine\'s roofline (measured in the same run)</h2>'
                     f'<img class="roofline" alt="measured roofline" src="data:image/png;base64,{encoded}">')
    if timeline_png:
        encoded = base64.b64encode(timeline_png).decode("ascii")
        parts.append('<h2 id="step-timeline">A training step\'s memory: predicted beside measured (the same run)</h2>'
                     f'<img class="roofline" alt="memory over one training step, predicted and measured" src="data:image/png;base64,{encoded}">')
    parts.append(f"<script>{_SCRIPT}</script></body></html>")
    return "\n".join(part for part in parts if part)
