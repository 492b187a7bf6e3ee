"""``resacct verify --durations``: where a run's time went — the slowest claims, each area's claims'
seconds (``run.seconds_by_area``) and each phase's wall seconds (``run.phases``,
:mod:`resacct.harness.phases`) — as report.json keeps them and as the terminal prints them."""

from __future__ import annotations

import textwrap
from typing import Any

__all__ = ["COLUMNS", "seconds_by_area", "slowest_claims", "durations_text"]

#: the terminal width every line fits, as the rest of verify's output
COLUMNS = 100


def seconds_by_area(claims: list[dict[str, Any]]) -> dict[str, float]:
    """Each area's claims' seconds summed (report.json's ``run.seconds_by_area``), slowest area first.

    >>> seconds_by_area([{"area": "a", "seconds": 0.5}, {"area": "b", "seconds": 2.0}, {"area": "a", "seconds": 0.25}])
    {'b': 2.0, 'a': 0.75}
    """
    totals: dict[str, float] = {}
    for record in claims:
        totals[record["area"]] = totals.get(record["area"], 0.0) + float(record.get("seconds") or 0.0)
    return {area: round(total, 3) for area, total in sorted(totals.items(), key=lambda item: (-item[1], item[0]))}


def slowest_claims(claims: list[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    """The ``count`` slowest claims (0: all), each as area, id, seconds, outcome, file:line; slowest first."""
    ordered = sorted(claims, key=lambda r: (-float(r.get("seconds") or 0.0), r["area"], r["id"]))
    return [{"area": r["area"], "id": r["id"], "seconds": round(float(r.get("seconds") or 0.0), 3), "outcome": r.get("outcome"),
             "where": f"{r.get('path')}:{r.get('line')}"} for r in (ordered if count == 0 else ordered[:count])]


def durations_text(document: dict[str, Any], count: int) -> str:
    """``--durations count``'s lines: the slowest claims, then by area, then by phase (when the report has phases)."""
    claims = document["claims"]
    total = sum(float(r.get("seconds") or 0.0) for r in claims)
    lines = [f"slowest {'' if count == 0 else f'{min(count, len(claims))} '}claims of {len(claims)} "
             f"({total:.1f} s in claims; {document['run']['seconds']:.1f} s the whole run):"]
    for r in slowest_claims(claims, count):  # every line fits the terminal's 100 columns, as the rest of verify's output
        name, detail = f"  {r['seconds']:8.3f} s  {r['area']}::{r['id']}", f"({r['outcome']}, {r['where']})"
        lines += [f"{name}  {detail}"] if len(name) + 2 + len(detail) <= COLUMNS else [name[:COLUMNS], f"{' ' * 14}{detail}"[:COLUMNS]]
    by_area = document["run"].get("seconds_by_area") or seconds_by_area(claims)
    lines += textwrap.wrap("by area: " + ", ".join(f"{area} {seconds:.1f} s" for area, seconds in by_area.items()),
                           width=COLUMNS, subsequent_indent="  ", break_on_hyphens=False)
    phases, cpu = document["run"].get("phases") or {}, document["run"].get("phase_cpu_seconds") or {}
    if phases:  # a report from before phases were kept has none
        lines += textwrap.wrap("by phase: " + ", ".join(f"{phase} {seconds:.1f} s" + (f" ({cpu[phase]:.1f} CPU s)" if phase in cpu else "")
                                                     for phase, seconds in phases.items()),
                               width=COLUMNS, subsequent_indent="  ", break_on_hyphens=False)
    return "\n".join(lines)

