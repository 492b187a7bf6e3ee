"""The claims report as data: reading and checking a ``report.json``, strict JSON, how a value or
a claim's statement is written, whether a report is partial, and the claims × environments matrix.

>>> outcome_counts([{"outcome": "holds"}, {"outcome": "refuted"}])["holds"]
1
>>> statement_text({"law": "2*m*k*n", "law_value": 120})
'2*m*k*n = 120'
>>> strict_json_text({"x": float("inf")}, non_finite="null", indent=None)
'{"x": null}\\n'
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from pathlib import Path
from typing import Any, Literal

from resacct.errors import ResacctError
from resacct.training.input_files import read_regular_file

__all__ = [
    "OUTCOMES",
    "outcome_counts",
    "counts_by_area",
    "json_safe",
    "strict_json_text",
    "load_report",
    "format_value",
    "statement_text",
    "example_text",
    "location_text",
    "replay_notice",
    "run_notice",
    "is_complete",
    "merge_reports",
    "render_matrix_markdown",
    "markdown_text",
    "markdown_code",
]

OUTCOMES = ("holds", "refuted", "skipped", "inconclusive", "failed", "invalid")


def outcome_counts(records: list[dict[str, Any]]) -> Counter:
    return Counter(record["outcome"] for record in records)


def counts_by_area(records: list[dict[str, Any]]) -> dict[str, Counter]:
    """``{area: Counter(outcome)}``, areas sorted."""
    areas: dict[str, Counter] = {}
    for record in records:
        areas.setdefault(record.get("area") or "?", Counter())[record["outcome"]] += 1
    return dict(sorted(areas.items()))


def json_safe(value: Any, non_finite: Literal["null", "string"] = "null") -> Any:
    """A copy of ``value`` that strict JSON can hold: a NaN or an infinity becomes ``None``
    (``non_finite="null"``, the CLI's ``--json``) or the string ``"nan"``/``"inf"``/``"-inf"``
    (``"string"``, a claim record, whose values may be text anyway)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None if non_finite == "null" else repr(value)
    if isinstance(value, dict):
        return {str(key): json_safe(element, non_finite) for key, element in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(element, non_finite) for element in value]
    return value


def strict_json_text(value: Any, non_finite: Literal["null", "string"] = "null", indent: int | None = 2) -> str:
    """``json.dumps`` that never writes NaN/Infinity (see :func:`json_safe`), ending in a newline."""
    return json.dumps(json_safe(value, non_finite), indent=indent, allow_nan=False, default=repr) + "\n"


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"it holds {name}, which strict JSON does not allow")


MAX_REPORT_BYTES = 256 * 1024 * 1024
"""A report.json of every claim is about 1 MB; a larger file is refused before it is read."""


def load_report(path: str | Path) -> dict[str, Any]:
    """A ``report.json`` written by ``resacct verify`` or ``pytest --claims-json``, checked:
    a file that is not one says so in one line naming the file (a :class:`ResacctError`)."""
    where = f"report {str(path)!r}"
    # a FIFO or a device (/dev/zero) is refused, not read; a file over the cap is not read at all
    raw = read_regular_file(path, where, max_bytes=MAX_REPORT_BYTES, directory_hint="; give the report.json inside it")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ResacctError(f"{where} is not UTF-8 text, so not a report.json") from None
    try:
        document = json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as error:
        stripped = text.strip()
        cut_short = stripped[:1] in {"{", "["} and stripped[-1:] not in {"}", "]"}
        hint = " (cut short?)" if cut_short else ""
        raise ResacctError(f"{where} is not valid JSON{hint}: {error.msg} (line {error.lineno}, column {error.colno})") from None
    except (ValueError, RecursionError) as error:
        raise ResacctError(f"{where} is not valid JSON: {error}") from None
    problem = _report_problem(document)
    if problem:
        raise ResacctError(f"{where} is not a resacct report: {problem}")
    return document


def _type_name(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(type(value), "a number")


def _report_problem(document: Any) -> str | None:
    """What makes ``document`` not a report, or None."""
    if not isinstance(document, dict):
        return f"the top level is {_type_name(document)}; expected an object with keys 'environment' and 'claims'"
    missing = [key for key in ("environment", "claims") if key not in document]
    if missing:
        return f"missing key {missing[0]!r} (expected keys 'environment' and 'claims')"
    if not isinstance(document["environment"], dict):
        return f"'environment' is {_type_name(document['environment'])}; expected an object"
    if not isinstance(document["claims"], list):
        return f"'claims' is {_type_name(document['claims'])}; expected a list of claim records"
    problem = _environment_problem(document["environment"]) or _run_problem(document.get("run", {}))
    if problem:
        return problem
    first_index: dict[str, int] = {}
    for index, record in enumerate(document["claims"]):
        if not isinstance(record, dict):
            return f"claims[{index}] is {_type_name(record)}; expected an object"
        for key in ("id", "area", "outcome"):
            if not isinstance(record.get(key), str):
                found = "missing" if key not in record else f"{_type_name(record[key])}"
                return f"claims[{index}] key {key!r} is {found}; expected a string"
        if record["outcome"] not in OUTCOMES:
            return f"claims[{index}] ({record['id']!r}) has outcome {record['outcome']!r}; expected one of {', '.join(OUTCOMES)}"
        if record["id"] in first_index:
            return f"claims[{index}] repeats the id {record['id']!r} of claims[{first_index[record['id']]}]; expected each claim once"
        first_index[record["id"]] = index
    return None


def _environment_problem(environment: dict[str, Any]) -> str | None:
    """The fields a merge names its columns by must be text (a number as a torch version is refused)."""
    for key in ("torch", "device"):
        if key in environment and not isinstance(environment[key], str):
            return f"'environment.{key}' is {_type_name(environment[key])} ({environment[key]!r}); expected a string such as '2.4.1'"[:300]
    machine = environment.get("machine")
    if machine is not None and not isinstance(machine, dict):
        return f"'environment.machine' is {_type_name(machine)}; expected an object"
    if isinstance(machine, dict) and not isinstance(machine.get("cpu_bf16_matmul", ""), (str, type(None))):
        return f"'environment.machine.cpu_bf16_matmul' is {_type_name(machine['cpu_bf16_matmul'])}; expected a string"
    return None


def _run_problem(run: Any) -> str | None:
    """``run`` (absent in reports of older versions) as :func:`run_notice` reads it."""
    if run is None:
        return None
    if not isinstance(run, dict):
        return f"'run' is {_type_name(run)} ({run!r}); expected an object (complete, interrupted, selection …)"[:300]
    if not isinstance(run.get("complete", True), bool):
        return f"'run.complete' is {_type_name(run['complete'])}; expected true or false"
    if not isinstance(run.get("interrupted", False), (bool, str)):
        return f"'run.interrupted' is {_type_name(run['interrupted'])}; expected false or a string such as 'Ctrl-C'"
    selection = run.get("selection", {})
    if selection is not None and not isinstance(selection, dict):
        return f"'run.selection' is {_type_name(selection)}; expected an object with 'areas' and 'pattern'"
    if isinstance(selection, dict):
        areas, pattern = selection.get("areas") or [], selection.get("pattern")
        if not isinstance(areas, list) or not all(isinstance(area, str) for area in areas):
            return "'run.selection.areas' must be a list of area names (strings)"
        if pattern is not None and not isinstance(pattern, str):
            return f"'run.selection.pattern' is {_type_name(pattern)}; expected a string or null"
    return None


def format_value(value: Any, limit: int | None = None) -> str:
    """How a value reads in every report: ``—`` for none, 6 significant digits for a float or a
    large integer, text as is; cut to ``limit`` characters with ``…`` when given."""
    if value is None:
        text = "—"
    elif isinstance(value, bool):
        text = str(value)
    elif isinstance(value, int):
        text = str(value) if abs(value) < 10**12 else _large_int_text(value)
    elif isinstance(value, float):
        text = f"{value:.6g}"
    elif isinstance(value, (list, tuple)):
        text = "[" + ", ".join(format_value(element) for element in value) + "]"
    elif isinstance(value, dict):
        text = ", ".join(f"{key}={format_value(element)}" for key, element in value.items())
    else:
        text = str(value)
    if limit is not None and len(text) > limit:
        text = text[: limit - 1] + "…"
    return text


def _large_int_text(value: int) -> str:
    """``1.23457e+14`` for an integer of 13 or more digits, as ``:.6g`` writes it, also beyond a
    float's range (``1e+384`` from ``10**128*10**128*10**128``) where ``:.6g`` raises."""
    try:
        return f"{value:.6g}"
    except OverflowError:
        pass
    magnitude = abs(value)
    exponent = int(math.log10(magnitude))
    while 10**exponent > magnitude:
        exponent -= 1
    while 10 ** (exponent + 1) <= magnitude:
        exponent += 1
    leading = (magnitude * 10**5 + 10**exponent // 2) // 10**exponent  # six digits, rounded
    if leading >= 10**6:
        leading, exponent = leading // 10, exponent + 1
    digits = str(leading).rstrip("0")
    mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    return f"{'-' if value < 0 else ''}{mantissa}e+{exponent}"


def _is_literal(law: str) -> bool:
    try:
        float(law)
    except ValueError:
        return False
    return True


def statement_text(record: dict[str, Any]) -> str:
    """The claim's law *with its value* (``2*m*k*n = 120``), or its expectation (``at_least 0.5``)."""
    parts = []
    law = record.get("law")
    if law:
        value = record.get("law_value")
        parts.append(law if value is None or _is_literal(law) else f"{law} = {format_value(value)}")
    for key, expected in (record.get("expect") or {}).items():
        if key == "raises" and isinstance(expected, dict):
            expected = expected.get("type", "") + (f" matching {expected['match']!r}" if expected.get("match") else "")
        parts.append(f"{key} {format_value(expected)}")
    return "; ".join(parts)


def example_text(record: dict[str, Any], limit: int | None = None) -> str:
    """Which inputs the shown values belong to: ``worst of 40 examples (+14.4% off): m=3, k=4``,
    ``failing example: …`` or ``inputs: …``; empty when the claim has none."""
    inputs = format_value(record.get("inputs"), limit) if record.get("inputs") else ""
    deviation = record.get("deviation")
    off = f", {deviation:.3g}× off" if isinstance(deviation, float) and deviation >= 10 else (
        f", {100 * deviation:.3g}% off" if isinstance(deviation, (int, float)) and deviation > 0 else "")
    if record.get("example") == "failing":
        return f"failing example{off}: {inputs}" if inputs else ""
    if record.get("forall"):
        if deviation == 0:
            return f"{record.get('examples', '?')} examples, every one exact; the first: {inputs}"
        return f"worst of {record.get('examples', '?')} examples{off}: {inputs}"
    return f"inputs: {inputs}" if inputs else ""


def location_text(record: dict[str, Any]) -> str:
    """``specs/flops.claims.yaml:12`` (the file as pytest names it, and the claim's line)."""
    return f"{record.get('path') or '?'}:{record.get('line') or '?'}"


def run_notice(document: dict[str, Any]) -> str | None:
    """One sentence when the report is not of a complete run (a selection, or interrupted); else None."""
    run = document.get("run") or {}
    reasons = []
    if run.get("interrupted"):
        reasons.append(f"interrupted ({run['interrupted']})" if isinstance(run["interrupted"], str) else "interrupted")
    selection = run.get("selection") or {}
    if selection.get("areas"):
        reasons.append("only area " + ", ".join(selection["areas"]))
    if selection.get("pattern"):
        reasons.append(f"only claims matching -k {selection['pattern']!r}")
    if not reasons and run.get("complete", True):
        return None
    count = len(document.get("claims") or [])
    return f"PARTIAL REPORT ({'; '.join(reasons) or 'not every claim ran'}): {count} claims, not the full set"


def replay_notice(document: dict[str, Any]) -> str | None:
    """One sentence when claims of the report were judged on measurements an earlier ``resacct verify`` stored on this
    same setup (:mod:`resacct.harness.replay`); else None."""
    replayed = sorted(record["replayed_from"] for record in document.get("claims") or [] if record.get("replayed_from"))
    if not replayed:
        return None
    when = replayed[0] if replayed[0] == replayed[-1] else f"{replayed[0]} to {replayed[-1]}"
    return (f"{len(replayed)} of {len(document['claims'])} claims were judged on the measurements an earlier run made on this same setup "
            f"(resacct's source, packages, machine, settings; measured {when} UTC): `resacct verify --no-cache` measures every one afresh")


def is_complete(document: dict[str, Any]) -> bool:
    """True for the report of a full, uninterrupted run (one without a ``run`` entry counts as complete)."""
    return run_notice(document) is None


def _column_name(environment: dict[str, Any]) -> str:
    """``torch 2.13.0 · cpu``, with the bf16 matmul kind where the report recorded its machine
    (``torch 2.13.0 · cpu · bf16 amx``): the same torch on two kinds of CPU is two columns."""
    machine = environment.get("machine")
    kind = f" · bf16 {machine['cpu_bf16_matmul']}" if isinstance(machine, dict) and machine.get("cpu_bf16_matmul") else ""
    return f"torch {environment.get('torch', '?')} · {environment.get('device', '?')}{kind}"


NOT_RUN = "not run"
"""A matrix cell for a claim a partial report (``--area``, ``-k``, Ctrl-C) did not run: no outcome,
and no change of status."""


def merge_reports(documents: list[dict[str, Any]]) -> dict[str, Any]:
    """Claims × environments (torch version, device, CPU bf16 kind): ``{"columns": [...], "partial":
    [the columns of partial reports], "rows": [{"id", "area", "says", "outcomes": {column: outcome},
    "changes"}]}``. A claim a partial report did not run changes nothing; one a complete report
    lacks (not in that version's claims) is a change."""
    if not documents:
        raise ResacctError("--merge needs at least one report.json")
    columns: list[str] = []
    partial: list[str] = []
    rows: dict[str, dict[str, Any]] = {}
    for document in documents:
        column = _column_name(document["environment"])
        complete = is_complete(document)
        if not complete:
            column += " (partial)"
        base, suffix = column, 2
        while column in columns:
            column = f"{base} ({suffix})"
            suffix += 1
        columns.append(column)
        if not complete:
            partial.append(column)
        for record in document["claims"]:
            row = rows.setdefault(record["id"], {"id": record["id"], "area": record["area"], "says": record.get("says", ""), "outcomes": {}})
            row["outcomes"][column] = record["outcome"]
    ordered = sorted(rows.values(), key=lambda row: (row["area"], row["id"]))
    for row in ordered:
        seen = {row["outcomes"].get(column, "absent") for column in columns if column in row["outcomes"] or column not in partial}
        row["changes"] = len(seen) > 1
    return {"columns": columns, "partial": partial, "rows": ordered}


def matrix_cell(matrix: dict[str, Any], row: dict[str, Any], column: str) -> str:
    """A row's outcome in ``column``: the outcome, :data:`NOT_RUN` in a partial report's column, or
    ``—`` (the claim is not in that report's claims)."""
    if column in row["outcomes"]:
        return str(row["outcomes"][column])
    return NOT_RUN if column in matrix.get("partial", ()) else "—"


_MARKDOWN_ESCAPES = {"\\": "\\\\", "&": "&amp;", "<": "&lt;", ">": "&gt;", "|": "\\|", "[": "\\[", "]": "\\]", "`": "\\`",
                     "\r": "", "\n": "<br>"}


def markdown_text(value: Any, *, newline: str = "<br>") -> str:
    """``value`` as it reads (:func:`format_value`), inert in Markdown: no HTML (``<script>``, ``<img
    onerror>``, ``<!--`` become text), no table cell break (``|``), no link or code span, and
    each newline ``newline`` (``<br>`` in a table cell, a space in a heading or a list item).

    >>> markdown_text("<img src=x onerror=alert(1)> | a\\nb")
    '&lt;img src=x onerror=alert(1)&gt; \\\\| a<br>b'
    """
    escapes = {**_MARKDOWN_ESCAPES, "\n": newline}
    return "".join(escapes.get(character, character) for character in format_value(value))


def markdown_code(value: Any, *, in_table: bool = False) -> str:
    """``value`` as an inline code span that its own backticks cannot close, on one line."""
    text = " ".join(format_value(value).split())
    longest = max((len(run) for run in re.findall("`+", text)), default=0)
    fence = "`" * (longest + 1)
    if in_table:
        text = text.replace("|", "\\|")
    padded = f" {text} " if text.startswith("`") or text.endswith("`") else text
    return f"{fence}{padded}{fence}"


def render_matrix_markdown(matrix: dict[str, Any]) -> str:
    columns = matrix["columns"]
    changed = [row for row in matrix["rows"] if row["changes"]]
    lines = ["# Claims across environments (torch version · device · CPU bf16 kind)", "",
             f"{len(matrix['rows'])} claims × {len(columns)} environments; {len(changed)} change status between them (marked ⚠"
             + ("; a claim a partial report did not run changes nothing" if matrix.get("partial") else "") + ").", "",
             "| area | claim | " + " | ".join(map(markdown_text, columns)) + " |", "|---|---|" + "---|" * len(columns)]
    for row in matrix["rows"]:
        marker = " ⚠" if row["changes"] else ""
        cells = [markdown_text(matrix_cell(matrix, row, column)) for column in columns]
        lines.append(f"| {markdown_text(row['area'])} | {markdown_text(row['id'])}{marker} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
