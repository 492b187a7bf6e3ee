"""What decides each claim, counted: its **evidence** — ``measured`` (PyTorch ran it), ``published``
(a figure as a paper or a datasheet prints it), ``arithmetic`` (resacct's own arithmetic over
the inputs, nothing measured) or ``recorded`` (a committed GPU record measured it once; its board,
date and file are named beside the claim: :func:`recorded_source`). A claim's record carries the evidence its check declares
(``@check(..., evidence=...)``, :mod:`resacct.harness.registry`); a record without one (a spec
that could not be loaded, a report written before resacct recorded it) is ``unstated``.

>>> records = [{"area": "napkin", "evidence": "measured"}, {"area": "napkin", "evidence": "arithmetic"},
...            {"area": "flops", "evidence": "measured"}]
>>> evidence_text(evidence_counts(records))
'2 measured · 1 arithmetic'
>>> evidence_summary(records)["by_area"]["napkin"]
{'measured': 1, 'published': 0, 'arithmetic': 1}
>>> area_marks(evidence_by_area(records)["napkin"])
'1m 1a'
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from resacct.harness.registry import EVIDENCE_KINDS, EVIDENCE_MEANINGS

__all__ = [
    "EVIDENCE_KINDS",
    "EVIDENCE_MEANINGS",
    "UNSTATED",
    "evidence_of",
    "evidence_counts",
    "evidence_by_area",
    "evidence_columns",
    "evidence_text",
    "evidence_summary",
    "area_marks",
    "value_label",
    "recorded_source",
    "evidence_cell",
    "MARKS_LEGEND",
]

UNSTATED = "unstated"
_MARKS = {"measured": "m", "published": "p", "arithmetic": "a", "recorded": "r", UNSTATED: "u"}
MARKS_LEGEND = "m measured, p published, a arithmetic"
_VALUE_LABELS = {"measured": "measured", "published": "published", "arithmetic": "computed", "recorded": "recorded", UNSTATED: "measured"}
_ALWAYS = ("measured", "published", "arithmetic")  # the columns every report shows; recorded and unstated where some claim is


def evidence_of(record: dict[str, Any]) -> str:
    """The record's evidence kind, or ``unstated`` (none, or a value that is not a kind)."""
    kind = record.get("evidence")
    return kind if isinstance(kind, str) and kind in EVIDENCE_KINDS else UNSTATED


def evidence_counts(records: list[dict[str, Any]]) -> Counter:
    return Counter(evidence_of(record) for record in records)


def evidence_by_area(records: list[dict[str, Any]]) -> dict[str, Counter]:
    """``{area: Counter(evidence)}``, areas sorted (as :func:`resacct.reporting.documents.counts_by_area`)."""
    areas: dict[str, Counter] = {}
    for record in records:
        areas.setdefault(record.get("area") or "?", Counter())[evidence_of(record)] += 1
    return dict(sorted(areas.items()))


def evidence_columns(records: list[dict[str, Any]]) -> tuple[str, ...]:
    """Measured, published and arithmetic; ``recorded`` and ``unstated`` when some record is."""
    present = {evidence_of(record) for record in records}
    return _ALWAYS + tuple(kind for kind in (*EVIDENCE_KINDS, UNSTATED) if kind not in _ALWAYS and kind in present)


def evidence_text(counts: Counter) -> str:
    """``12 measured · 3 published · 5 arithmetic``: the kinds that occur, in that order."""
    return " · ".join(f"{counts[kind]} {kind}" for kind in (*EVIDENCE_KINDS, UNSTATED) if counts[kind]) or "no claims"


def area_marks(counts: Counter) -> str:
    """``3m 19p 5a``: an area's counts with one letter per kind (:data:`MARKS_LEGEND`; ``u`` unstated)."""
    return " ".join(f"{counts[kind]}{_MARKS[kind]}" for kind in (*EVIDENCE_KINDS, UNSTATED) if counts[kind])


def value_label(record: dict[str, Any]) -> str:
    """What the check's value is called beside a claim: ``measured``, ``published`` or ``computed``."""
    return _VALUE_LABELS[evidence_of(record)]


def recorded_source(record: dict[str, Any]) -> str | None:
    """``NVIDIA H100 80GB HBM3, 2026-11-26, docs/gpu/….json``: the GPU record a ``recorded`` claim
    replays (its outcome's quantities ``board``, ``recorded_on``, ``record_file``); None for other kinds.

    >>> recorded_source({"evidence": "recorded", "quantities": {"board": "B", "recorded_on": "2026-11-26", "record_file": "docs/gpu/r.json"}})
    'B, 2026-11-26, docs/gpu/r.json'
    """
    if evidence_of(record) != "recorded":
        return None
    quantities = record.get("quantities") or {}
    named = [quantities.get(key) for key in ("board", "recorded_on", "record_file")]
    given = record.get("given") or {}
    return ", ".join(str(part) for part in named if part) or (f"record {given['record']}" if given.get("record") else "record not named")


def evidence_cell(record: dict[str, Any]) -> str:
    """The evidence column of a claim: its kind, for ``recorded`` the record it replays, and when the measurement judged
    was made by an earlier verify on this setup (``replayed_from``: resacct.harness.replay).

    >>> evidence_cell({"evidence": "measured", "replayed_from": "2026-11-29T18:03:11+00:00"})
    'measured (replayed: measured 2026-11-29T18:03:11+00:00)'
    """
    source = recorded_source(record)
    replayed = f" (replayed: measured {record['replayed_from']})" if record.get("replayed_from") else ""
    return evidence_of(record) + (f" ({source})" if source else "") + replayed


def evidence_summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The counts a ``report.json`` keeps beside its claims: the meaning of each kind, the total and per area."""
    columns = evidence_columns(records)
    total = evidence_counts(records)
    return {
        "kinds": dict(EVIDENCE_MEANINGS),
        "total": {kind: total[kind] for kind in columns},
        "by_area": {area: {kind: counts[kind] for kind in columns} for area, counts in evidence_by_area(records).items()},
    }
