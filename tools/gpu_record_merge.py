"""tools/gpu_record.py's ``--merge A B … --out DIR`` (issue 31): one record of one board from several device calls.

A device call may leave steps failed (a kernel the board refused, a step out of memory) that a second call, with the
matrix corrected, records with ``--only``. The merge keeps, per step and per served model, the **last** source that
recorded it whole (an entry without ``error``), in :data:`MATRIX`'s (:data:`SERVING`'s) order; a step no source recorded
whole keeps its last error only while the matrix still names it (a renamed or reshaped step's failure is history, kept
in ``merged_from``). The ceilings, the library probe and the allocation origins are the first source's that has them; ``merged_from`` keeps, per
source, when it ran, what each of its steps came to (status, the error's message) and its ceilings in brief — three
sweeps of one board, side by side. Sources of different boards, torches, capabilities or allocator settings, or a dry
run beside a board's, are refused: one record is one machine.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from gpu_record_matrix import MATRIX, SERVING

#: what every source must share with the first (one record is one machine, one torch, one allocator)
SAME_MACHINE_FIELDS = ("format", "board", "torch", "cuda_runtime", "capability", "total_memory_bytes", "dry_run")


class MergeRefused(ValueError):
    """Sources that are not one machine's, or no source: the message names the field and both values."""


def _ordered(entries_by_name: dict[str, dict[str, Any]], order: list[str]) -> list[dict[str, Any]]:
    known = [entries_by_name[name] for name in order if name in entries_by_name]
    return known + [entry for name, entry in entries_by_name.items() if name not in order]


def _merge_entries(sources: list[dict[str, Any]], field: str, current: dict[str, Any]) -> list[dict[str, Any]]:
    """Per name, the last whole entry of ``field`` over the sources; else the last error, if ``current`` names it."""
    whole: dict[str, dict[str, Any]] = {}
    failed: dict[str, dict[str, Any]] = {}
    for source in sources:
        for entry in source.get(field, []):
            (failed if "error" in entry else whole)[entry["name"]] = entry
    chosen = dict(whole)
    chosen.update({name: entry for name, entry in failed.items() if name not in whole and name in current})
    return _ordered(chosen, list(current))


def _history(source: dict[str, Any]) -> dict[str, Any]:
    from resacct.account.gpu.records.board_record import ceilings_in_brief

    ceilings = source.get("ceilings") or {}
    return {"when": source.get("when"),
            "steps": {entry["name"]: entry.get("error", "ok") for entry in source.get("steps", []) + source.get("serving", [])},
            "ceilings": ceilings_in_brief(ceilings) if ceilings and "error" not in ceilings else None}


def merge_records(sources: list[dict[str, Any]]) -> dict[str, Any]:
    """One record from ``sources`` (read records, oldest first): see the module's docstring."""
    if not sources:
        raise MergeRefused("no record to merge; expected at least one --merge FILE")
    first = sources[0]
    for index, source in enumerate(sources[1:], start=2):
        for field in (*SAME_MACHINE_FIELDS, "allocator_settings"):
            if source.get(field) != first.get(field):
                raise MergeRefused(f"record {index} has {field} {source.get(field)!r}, the first {first.get(field)!r}; "
                                   "expected records of one machine, one torch and one allocator setting")
    with_ceilings = next((s for s in sources if s.get("ceilings") and "error" not in s["ceilings"]), first)
    with_probe = next((s for s in sources if s.get("library_probe") and "error" not in s["library_probe"]), first)
    with_origins = next((s for s in sources if s.get("allocation_origins") and "error" not in s["allocation_origins"]), first)
    return {**first, "steps": _merge_entries(sources, "steps", MATRIX), "serving": _merge_entries(sources, "serving", SERVING),
            "ceilings": with_ceilings.get("ceilings"), "library_probe": with_probe.get("library_probe"),
            **({"allocation_origins": with_origins["allocation_origins"]} if "allocation_origins" in with_origins else {}),
            "merged_from": [_history(source) for source in sources]}


def _summary_row(entry: dict[str, Any], summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """The source summary's row for ``entry`` (the row of the run that recorded it), newest source first."""
    for summary in reversed(summaries):
        for row in summary.get("steps", []) + summary.get("serving", []):
            if row["name"] == entry["name"] and (row["status"] == "ok") == ("error" not in entry):
                return row
    return {"name": entry["name"], "status": entry.get("error", "ok")}


def merged_summary(record: dict[str, Any], summaries: list[dict[str, Any]], record_bytes: int) -> dict[str, Any]:
    """The summary of a merged record, as ``gpu_record.py`` writes one, its rows the sources' own."""
    from resacct.account.gpu.records.board_record import ceilings_in_brief

    steps = [_summary_row(entry, summaries) for entry in record["steps"]]
    serving = [_summary_row(entry, summaries) for entry in record["serving"]]
    failed = [row["name"] for row in steps + serving if row["status"] != "ok"]
    ceilings = record.get("ceilings")
    return {"board": record["board"], "when": record["when"], "torch": record["torch"], "capability": record.get("capability"),
            "total_memory_bytes": record.get("total_memory_bytes"), "dry_run": record["dry_run"],
            "seconds": round(sum(summary.get("seconds", 0) for summary in summaries), 1),
            "ceilings": ceilings_in_brief(ceilings) if ceilings and "error" not in ceilings else None,
            "steps": steps, "serving": serving, "ceilings_status": "ok" if ceilings and "error" not in ceilings else "failed",
            "library_probe_status": "ok" if "error" not in (record.get("library_probe") or {"error": ""}) else "failed",
            "failed": failed, "merged_from": [source["when"] for source in record["merged_from"]], "record_bytes": record_bytes}


def write_merged(paths: list[Path], out: Path) -> dict[str, Any]:
    """Merge the records at ``paths`` (each with its ``…-summary.json`` or ``gpu-record-summary.json`` beside it, if any)
    into ``out``/gpu-record.json.gz and ``out``/gpu-record-summary.json; the merged summary."""
    from gpu_record_replay import read_record

    sources, summaries = [], []
    for path in paths:
        record = read_record(path)
        if record is None:
            raise MergeRefused(f"{path} is not a whole record (the line above says why)")
        sources.append(record)
        for beside in (path.parent / "gpu-record-summary.json", path.with_name(path.name.replace(".json.gz", "-summary.json"))):
            if beside.is_file() and beside != path:
                summaries.append(json.loads(beside.read_text()))
                break
    merged = merge_records(sources)
    out.mkdir(parents=True, exist_ok=True)
    with gzip.open(out / "gpu-record.json.gz", "wt") as handle:
        handle.write(json.dumps(merged, separators=(",", ":")))  # json.dump encodes in Python: 5 of 8 s on a 13-step record
    summary = merged_summary(merged, summaries, (out / "gpu-record.json.gz").stat().st_size)
    (out / "gpu-record-summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary
