"""What ``resacct verify`` prints: per-area counts, then only the claims that do not hold —
failed (and invalid) first, with the law's value, the prediction, the measurement, the inputs and
the YAML ``file:line``; then the refuted ones with their truth — within 100 columns.

>>> record = {"id": "matmul-2mkn", "area": "flops", "outcome": "refuted", "law": "2*m*k*n", "law_value": 120,
...           "measured": 60, "truth": "torch counts half", "path": "specs/flops.claims.yaml", "line": 3}
>>> print("\\n".join(claim_lines(record, width=60)))
  matmul-2mkn: 2*m*k*n = 120; measured 60
    torch counts half
"""

from __future__ import annotations

import textwrap
from collections import Counter
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
from resacct.reporting.evidence import MARKS_LEGEND, area_marks, evidence_by_area, evidence_counts, recorded_source, value_label

__all__ = ["DEFAULT_STATUSES", "render_summary", "claim_lines", "summary_line", "counts_lines", "evidence_lines"]

DEFAULT_STATUSES = ("failed", "invalid", "inconclusive", "refuted")
_SECTION_ORDER = ("failed", "invalid", "inconclusive", "refuted", "skipped", "holds")
_SECTION_TITLES = {
    "failed": "FAILED: the claim did not come out as its spec says",
    "invalid": "INVALID: the spec could not be loaded",
    "refuted": "REFUTED: the source says it, torch measures otherwise (the truth; whole in errata.md)",
    "inconclusive": "INCONCLUSIVE: timing claims this machine was too noisy to decide (RESACCT_REQUIRE_TIMING=1 fails them)",
    "skipped": "SKIPPED",
    "holds": "HOLDS",
}


def summary_line(document: dict[str, Any], width: int = 100) -> str:
    """``claims: 633 holds, …, 0 invalid  (torch 2.13.0+cpu, cpu: <model>)``, the model cut to fit ``width``."""
    totals = outcome_counts(document["claims"])
    environment = document.get("environment", {})
    counts = f"claims: {', '.join(f'{totals[name]} {name}' for name in OUTCOMES)}"
    where = f"  (torch {environment.get('torch', '?')}, {environment.get('device', '?')}: {environment.get('device_name', '?')})"
    if len(counts) + len(where) > width:
        where = f"  (torch {environment.get('torch', '?')})"
    return counts + where if len(counts) + len(where) <= width else counts


def counts_lines(records: list[dict[str, Any]], width: int = 100) -> list[str]:
    """The per-area table (holds, refuted, skipped, failed; inconclusive and invalid only when there are some), in
    two columns of areas when that fits ``width``, then the total."""
    by_area = counts_by_area(records)
    totals = outcome_counts(records)
    columns = [name for name in OUTCOMES if name not in ("invalid", "inconclusive") or totals[name]]
    name_width = max([len("total"), *(len(area) for area in by_area)])

    def row(name: str, counts: Counter | dict[str, str]) -> str:
        return name.ljust(name_width) + "".join(str(counts[column]).rjust(max(8, len(column) + 1)) for column in columns)

    header = row("area", {column: column for column in columns})
    rows = [row(area, counts) for area, counts in by_area.items()]
    total = row("total", totals)
    if len(rows) < 6 or 2 * len(header) + 4 > width:
        return [header, *rows, total]
    half = (len(rows) + 1) // 2
    left, right = rows[:half], rows[half:] + [""]
    return [f"{header}    {header}"] + [f"{a}    {b}".rstrip() for a, b in zip(left, right)] + [total]


_EVIDENCE_NAMES = {"measured": "measured", "published": "published", "arithmetic": "arithmetic only", "recorded": "recorded on a GPU", "unstated": "unstated"}


def evidence_lines(records: list[dict[str, Any]], width: int = 100) -> list[str]:
    """What decides the claims: the count of each evidence kind, then each area that is not
    measured only, with one letter per kind (``napkin 15m 3a``).

    >>> print("\\n".join(evidence_lines([{"area": "napkin", "evidence": "measured"}, {"area": "napkin", "evidence": "arithmetic"},
    ...                                    {"area": "flops", "evidence": "measured"}])))
    evidence: 2 measured · 1 arithmetic only
      napkin 1m 1a (m measured, p published, a arithmetic); the other area: measured only
    """
    if not records:
        return []
    totals = evidence_counts(records)
    head = "evidence: " + " · ".join(f"{totals[kind]} {name}" for kind, name in _EVIDENCE_NAMES.items() if totals[kind])
    by_area = evidence_by_area(records)
    mixed = {area: counts for area, counts in by_area.items() if set(counts) != {"measured"}}
    if not mixed or set(totals) == {"unstated"}:  # measured only, or a report from before resacct recorded evidence
        return _wrap(head, width, "  ", first="")
    legend = MARKS_LEGEND + (", r recorded" if totals["recorded"] else "") + (", u unstated" if totals["unstated"] else "")
    others = len(by_area) - len(mixed)
    rest = f"; the other {'area' if others == 1 else f'{others} areas'}: measured only" if others else ""
    areas = " · ".join(f"{area} {area_marks(counts)}" for area, counts in mixed.items()) + f" ({legend}){rest}"
    return _wrap(head, width, "  ", first="") + _wrap(areas, width, "  ")


def _wrap(text: str, width: int, indent: str, first: str | None = None) -> list[str]:
    return textwrap.wrap(text, width=width, initial_indent=first if first is not None else indent, subsequent_indent=indent,
                         break_on_hyphens=False, break_long_words=True) or [first or indent]


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _headline(record: dict[str, Any]) -> str:
    """The first line of a failure's message without the ``file:line:`` the block already shows."""
    message = (record.get("message") or "").strip()
    first = message.splitlines()[0] if message else ""
    return first.removeprefix(f"{location_text(record)}: ")


def claim_lines(record: dict[str, Any], width: int = 100, verbose: bool = False) -> list[str]:
    """The lines of one claim, by its outcome: a block for a failed or invalid claim (with its
    ``file:line``); for a refuted one, its law with the value and the measurement, then its truth
    (cut to one line unless ``verbose``); one line or two for the others."""
    outcome = record["outcome"]
    location = location_text(record)
    if outcome in {"failed", "invalid"}:
        lines = _wrap(f"{record['id']}  {location}", width, "      ", first="  ")
        message = (record.get("message") or "").strip()
        lines += _wrap(_headline(record), width, "      ", first="    ")
        if outcome == "failed" and "measured" in record:  # the check returned: law, prediction, measurement
            for name, value in (("law", statement_text(record) or "—"), ("predicted", format_value(record.get("predicted"))),
                                (value_label(record), format_value(record.get("measured")))):
                lines += _wrap(f"{name:<10} {value}", width, " " * 15, first="    ")
        example = example_text(record)
        if example:
            lines += _wrap(example, width, "      ", first="    ")
        if verbose and len(message.splitlines()) > 1:
            lines += ["    " + line for line in message.splitlines()[1:]]
        return lines
    if outcome == "inconclusive":
        reason = (record.get("message") or "").strip().removeprefix("inconclusive (noisy): ")
        return _wrap(f"{record['id']}  {location}", width, "      ", first="  ") + _wrap(reason, width, "      ", first="    ")
    if outcome == "skipped":
        reason = ((record.get("message") or "").strip().splitlines() or ["skipped"])[0]
        if verbose:
            return _wrap(f"{record['id']}  {location}", width, "      ", first="  ") + _wrap(reason, width, "      ", first="    ")
        return [_clip(f"  {record['id']}: {reason}", width)]
    statement = statement_text(record)
    measured = f"{value_label(record)} {format_value(record.get('measured'), None if verbose else 60)}"
    if verbose and recorded_source(record):  # which board, when, which file measured it
        measured += f" ({recorded_source(record)})"
    body = f"{record['id']}: {statement}; {measured}" if statement else f"{record['id']}: {measured}"
    if verbose or outcome != "refuted" or len(body) + 2 <= width:
        lines = _wrap(body, width, "      ", first="  ")
    else:  # one line: shorten the formula, never its value or the measurement
        lines = [_clip("  " + _shortened(record, measured, width - 2), width)]
    example = example_text(record)
    if verbose:
        lines += _wrap(f"at {location}" + (f"; {example}" if example else ""), width, "      ", first="    ")
    elif record.get("forall") and example:  # how many examples ran, and the one farthest from the law
        lines.append(_clip(f"    {example}", width))
    if outcome == "refuted":
        truth = record.get("truth") or ""
        return lines + (_wrap(f"truth: {truth}", width, "      ", first="    ") if verbose else [_clip(f"    {truth}", width)])
    return lines


def _shortened(record: dict[str, Any], measured: str, room: int) -> str:
    """``id: <formula cut> = value; measured m`` in ``room`` characters where that can be done."""
    law, value = record.get("law"), record.get("law_value")
    full = statement_text(record)
    if not law or value is None or full == law:
        return f"{record['id']}: {full}; {measured}"
    tail = f" = {format_value(value)}; {measured}"
    space = room - len(record["id"]) - 2 - len(tail)
    return f"{record['id']}: {_clip(law, max(space, 12))}{tail}"


def _skip_reasons(records: list[dict[str, Any]], width: int) -> list[str]:
    reasons = Counter(((record.get("message") or "").strip().splitlines() or ["(no reason given)"])[0]
                      for record in records if record["outcome"] == "skipped")
    return [_clip(f"  {count} × {reason}", width) for reason, count in reasons.most_common()]


def render_summary(document: dict[str, Any], *, statuses: tuple[str, ...] = DEFAULT_STATUSES, width: int = 100,
                   verbose: bool = False, max_lines: int | None = 145) -> str:
    """The text ``resacct verify`` prints (the report files hold everything).

    With the default statuses, when listing every refuted claim on two lines would pass
    ``max_lines``, each refuted claim gets one line (its id and its truth); ``--status refuted``
    lists them in full."""
    lines = _summary(document, statuses, width, verbose, compact_refuted=False)
    if max_lines is not None and len(lines) > max_lines and statuses == DEFAULT_STATUSES and not verbose:
        lines = _summary(document, statuses, width, verbose, compact_refuted=True)
        if len(lines) > max_lines:  # still too long: list as many refuted claims as fit, then say how many more
            refuted = sum(record["outcome"] == "refuted" for record in document["claims"])
            room = max(refuted - (len(lines) - max_lines) - 1, 0)
            lines = _summary(document, statuses, width, verbose, compact_refuted=True, refuted_limit=room)
    return "\n".join(lines)


def _summary(document: dict[str, Any], statuses: tuple[str, ...], width: int, verbose: bool, compact_refuted: bool,
             refuted_limit: int | None = None) -> list[str]:
    records = document["claims"]
    lines = []
    notice = run_notice(document)
    if notice:
        lines += _wrap(notice, width, "  ", first="") + [""]
    lines += counts_lines(records, width) + evidence_lines(records, width)
    replayed = replay_notice(document)
    if replayed:
        lines += _wrap(replayed, width, "  ", first="")
    for outcome in _SECTION_ORDER:
        chosen = [record for record in records if record["outcome"] == outcome]
        if outcome not in statuses or not chosen:
            continue
        title, _, explanation = _SECTION_TITLES[outcome].partition(": ")
        if outcome == "refuted" and compact_refuted:
            explanation = "one line each, the truth (verify --last --status refuted: law, value, measurement)"
        lines += ["", f"{title} ({len(chosen)})" + (f": {explanation}" if explanation else "")]
        shown = chosen if outcome != "refuted" or refuted_limit is None else chosen[:refuted_limit]
        for record in shown:
            if outcome == "refuted" and compact_refuted:
                lines.append(_clip(f"  {record['id']}: {record.get('truth') or ''}", width))
            else:
                lines += claim_lines(record, width, verbose)
        if len(shown) < len(chosen):
            lines.append(_clip(f"  … and {len(chosen) - len(shown)} more refuted: resacct verify --last --status refuted, or errata.md", width))
    if "skipped" not in statuses and any(record["outcome"] == "skipped" for record in records):
        lines += ["", "skipped, by reason (verify --last --status skipped lists them):", *_skip_reasons(records, width)]
    lines += ["", summary_line(document, width)]
    return lines
