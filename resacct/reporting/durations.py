"""``resacct verify --durations``: where a run's time went — the slowest claims, each area's claims'
seconds (``run.seconds_by_area``) and CPU seconds (``run.cpu_seconds_by_area``), and each phase's wall
seconds (``run.phases``, :mod:`resacct.harness.phases`) — as report.json keeps them and as the
terminal prints them. A claim's wall seconds include what its neighbours took from it (the other
worker, the gloo ranks beside, a worker held at idle priority meanwhile); its CPU seconds are those of
the process that ran it (every thread; not the ranks or children it started)."""

from __future__ import annotations

import textwrap
from typing import Any

__all__ = ["COLUMNS", "cpu_seconds_by_area", "seconds_by_area", "slowest_claims", "durations_text"]

#: the terminal width every line fits, as the rest of verify's output
COLUMNS = 100


def seconds_by_area(claims: list[dict[str, Any]]) -> dict[str, float]:
    """Each area's claims' seconds summed (report.json's ``run.seconds_by_area``), slowest area first.

    >>> seconds_by_area([{"area": "a", "seconds": 0.5}, {"area": "b", "seconds": 2.0}, {"area": "a", "seconds": 0.25}])
    {'b': 2.0, 'a': 0.75}
    """
    return _by_area(claims, "seconds")


def cpu_seconds_by_area(claims: list[dict[str, Any]]) -> dict[str, float]:
    """Each area's claims' CPU seconds summed (report.json's ``run.cpu_seconds_by_area``), costliest first;
    a record without them (a report from before they were kept, a claim whose setup failed) counts 0.

    >>> cpu_seconds_by_area([{"area": "a", "cpu_seconds": 0.5}, {"area": "b"}, {"area": "a", "cpu_seconds": 0.25}])
    {'a': 0.75, 'b': 0.0}
    """
    return _by_area(claims, "cpu_seconds")


def _by_area(claims: list[dict[str, Any]], field: str) -> dict[str, float]:
    totals: dict[str, float] = {}
    for record in claims:
        totals[record["area"]] = totals.get(record["area"], 0.0) + float(record.get(field) or 0.0)
    return {area: round(total, 3) for area, total in sorted(totals.items(), key=lambda item: (-item[1], item[0]))}


def slowest_claims(claims: list[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    """The ``count`` slowest claims (0: all), each as area, id, seconds, CPU seconds (None where the
    record has none), outcome, file:line; slowest first."""
    ordered = sorted(claims, key=lambda r: (-float(r.get("seconds") or 0.0), r["area"], r["id"]))
    return [{"area": r["area"], "id": r["id"], "seconds": round(float(r.get("seconds") or 0.0), 3),
             "cpu_seconds": None if r.get("cpu_seconds") is None else round(float(r["cpu_seconds"]), 3), "outcome": r.get("outcome"),
             "where": f"{r.get('path')}:{r.get('line')}"} for r in (ordered if count == 0 else ordered[:count])]


def durations_text(document: dict[str, Any], count: int) -> str:
    """``--durations count``'s lines: the slowest claims, then by area, then by phase (when the report has phases)."""
    claims = document["claims"]
    total = sum(float(r.get("seconds") or 0.0) for r in claims)
    with_cpu = any(r.get("cpu_seconds") is not None for r in claims)
    total_cpu = f", {sum(float(r.get('cpu_seconds') or 0.0) for r in claims):.1f} CPU s" if with_cpu else ""
    lines = [f"slowest {'' if count == 0 else f'{min(count, len(claims))} '}claims of {len(claims)} "
             f"({total:.1f} s{total_cpu} in claims; {document['run']['seconds']:.1f} s the whole run):"]
    for r in slowest_claims(claims, count):  # every line fits the terminal's 100 columns, as the rest of verify's output
        cpu = "" if not with_cpu else "  (  —   CPU s)" if r["cpu_seconds"] is None else f"  ({r['cpu_seconds']:6.2f} CPU s)"
        name, detail = f"  {r['seconds']:8.3f} s{cpu}  {r['area']}::{r['id']}", f"({r['outcome']}, {r['where']})"
        indent = 14 + len(cpu)
        lines += [f"{name}  {detail}"] if len(name) + 2 + len(detail) <= COLUMNS else [name[:COLUMNS], f"{' ' * indent}{detail}"[:COLUMNS]]
    by_area = document["run"].get("seconds_by_area") or seconds_by_area(claims)
    lines += textwrap.wrap("by area: " + ", ".join(f"{area} {seconds:.1f} s" for area, seconds in by_area.items()),
                           width=COLUMNS, subsequent_indent="  ", break_on_hyphens=False)
    if with_cpu:
        cpu_by_area = document["run"].get("cpu_seconds_by_area") or cpu_seconds_by_area(claims)
        lines += textwrap.wrap("by area, CPU: " + ", ".join(f"{area} {seconds:.1f} s" for area, seconds in cpu_by_area.items()),
                               width=COLUMNS, subsequent_indent="  ", break_on_hyphens=False)
    phases, cpu = document["run"].get("phases") or {}, document["run"].get("phase_cpu_seconds") or {}
    if phases:  # a report from before phases were kept has none
        lines += textwrap.wrap("by phase: " + ", ".join(f"{phase} {seconds:.1f} s" + (f" ({cpu[phase]:.1f} CPU s)" if phase in cpu else "")
                                                     for phase, seconds in phases.items()),
                               width=COLUMNS, subsequent_indent="  ", break_on_hyphens=False)
    return "\n".join(lines)

