"""The claims table printed at the end of a pytest run, and the JSON records behind it.

A claim's record keeps one example: the given inputs, or for a ``forall`` claim the *worst*
example (the largest relative deviation of the measurement from the law), or the failing one.

>>> relative_deviation(100, 114)
0.14
>>> record = {"expect": None}
>>> remember_example(record, {"law_value": 10, "measured": 10, "inputs": {"x": 1}}, failing=False)
>>> remember_example(record, {"law_value": 10, "measured": 12, "inputs": {"x": 2}}, failing=False)
>>> record["inputs"], record["deviation"]
({'x': 2}, 0.2)
"""

from __future__ import annotations

import math
import os
import platform
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

__all__ = [
    "OUTCOMES",
    "write_summary",
    "write_claims_json",
    "environment_fingerprint",
    "count_outcomes",
    "relative_deviation",
    "remember_example",
]

OUTCOMES = ("holds", "refuted", "skipped", "inconclusive", "failed", "invalid")


def count_outcomes(records: list[dict[str, Any]]) -> dict[str, Counter]:
    by_area: dict[str, Counter] = defaultdict(Counter)
    for record in records:
        by_area[record.get("area") or "?"][record["outcome"]] += 1
    return dict(sorted(by_area.items()))


def write_summary(terminal: Any, records: list[dict[str, Any]]) -> None:
    """Outcomes per area, then the evidence that decides them (measured, published, arithmetic:
    :mod:`resacct.reporting.evidence`), then the totals line."""
    from resacct.reporting.evidence import UNSTATED, evidence_by_area, evidence_columns, evidence_counts, evidence_text

    by_area = count_outcomes(records)
    evidence = evidence_by_area(records)
    totals: Counter = sum(by_area.values(), Counter())
    terminal.section("resacct claims", sep="=")
    width = max(len("total"), *(len(area) for area in by_area))

    columns = [kind for kind in evidence_columns(records) if kind != UNSTATED]  # recorded where some claim is

    def row(name: str, counts: Counter | dict[str, str], kinds: Counter | dict[str, str]) -> str:
        return "  ".join([name.ljust(width)] + [str(counts[outcome]).rjust(7) for outcome in OUTCOMES]
                         + [" "] + [str(kinds[kind]).rjust(len(kind)) for kind in columns])

    terminal.write_line(row("area", {name: name for name in OUTCOMES}, {kind: kind for kind in columns}))
    for area, counts in by_area.items():
        terminal.write_line(row(area, counts, evidence.get(area, Counter())))
    terminal.write_line(row("total", totals, evidence_counts(records)))
    terminal.write_line(f"claims: {', '.join(f'{totals[name]} {name}' for name in OUTCOMES)}")
    unstated = evidence_counts(records)[UNSTATED]
    if unstated:
        terminal.write_line(f"evidence: {evidence_text(evidence_counts(records))} (a check without @check(..., evidence=...), or a spec that did not load)")


def environment_fingerprint() -> dict[str, Any]:
    import datetime
    import os

    import torch

    from resacct import __version__
    from resacct.harness.pytest_settings import hypothesis_profile_name

    from resacct.measurement.machine_profile import load_average_now, this_machine

    machine = this_machine()
    device = "cpu"
    device_name = machine.cpu_model
    if machine.gpu:
        device = "cuda"
        device_name = machine.gpu_name
    return {
        "resacct": __version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "hypothesis_profile": hypothesis_profile_name(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": device,
        "device_name": device_name,
        "machine": machine.to_dict(),  # resacct.measurement.machine_profile: what a claim's `when:` is decided on
        "load_average_end": load_average_now(),
    }


def write_claims_json(path: str | Path, records: list[dict[str, Any]]) -> None:
    """Strict JSON (a NaN or an infinity is written as the string ``"nan"``/``"inf"``), written atomically."""
    from resacct.reporting.documents import strict_json_text

    from resacct.reporting.evidence import evidence_summary

    document = {"environment": environment_fingerprint(), "evidence": evidence_summary(records),
                "claims": sorted(records, key=lambda r: (r["area"], r["path"] or "", r["line"] or 0))}
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    temporary.write_text(strict_json_text(document, non_finite="string"), encoding="utf-8")
    temporary.replace(target)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def relative_deviation(expected: Any, measured: Any) -> float | None:
    """``|measured − expected| / |expected|`` for finite numbers (the largest over two equally long
    lists of them); 0 when they are equal; None when it is undefined (text, expected 0, NaN…)."""
    if isinstance(expected, (list, tuple)) and isinstance(measured, (list, tuple)):
        if len(expected) != len(measured) or not expected:
            return None
        deviations = [relative_deviation(e, m) for e, m in zip(expected, measured)]
        return None if any(d is None for d in deviations) else max(deviations)  # type: ignore[type-var]
    if not (_is_number(expected) and _is_number(measured)):
        return None
    if expected == measured:
        return 0.0
    try:
        if expected == 0 or not (math.isfinite(expected) and math.isfinite(measured)):
            return None
        return abs(measured - expected) / abs(expected)
    except OverflowError:  # an int beyond float range (a law such as 10**128*10**128*10**128)
        return None


def expected_value(record: dict[str, Any]) -> Any:
    """What the claim says the measurement is: the law's value, else ``expect.equals``/``approx``,
    else resacct's prediction (for ``at_least``/``at_most`` claims); None when there is nothing."""
    if record.get("law_value") is not None:
        return record["law_value"]
    expect = record.get("expect") or {}
    for key in ("equals", "approx"):
        if key in expect:
            return expect[key]
    return record.get("predicted")


def _rank(example: dict[str, Any], expect: dict[str, Any] | None) -> float:
    expected = expected_value({**example, "expect": expect})
    deviation = relative_deviation(expected, example.get("measured"))
    if deviation is not None:
        return deviation
    return 0.0 if expected is None or expected == example.get("measured") else math.inf


def remember_example(record: dict[str, Any], example: dict[str, Any], *, failing: bool) -> None:
    """Keep in ``record`` the example to show: the failing one, else the one that deviates most
    from what the claim says (the first of equals), and its ``deviation`` (None when undefined)."""
    kept_failing = record.get("example") == "failing"
    if not failing and kept_failing:
        return
    if not failing and "measured" in record and _rank(example, record.get("expect")) <= _rank(record, record.get("expect")):
        return
    record.update(example)
    record["deviation"] = relative_deviation(expected_value(record), record.get("measured"))
    record["example"] = "failing" if failing else ("worst" if record.get("forall") else "given")
