"""A board's record (``resacct-gpu-record/1``, ``tools/gpu_record.py``) read back: for the recorded
claims (:mod:`resacct.checks.gpu_record_steps`) the whole record, for the commands its summary.

A record is committed as two files (docs/gpu.md, "Running the recorder"):

- ``docs/gpu/<date>-<board>-record.json.gz`` — every step's allocator trace, peaks, time and ops, and
  the board's ceilings: what the recorded claims replay and predict (:func:`read_board_record`);
- ``docs/gpu/<date>-<board>-record-summary.json`` — a few hundred bytes: the board, the date, per step
  its status and peaks, and the ceilings in brief (:func:`ceilings_in_brief`: the most matmul FLOP/s per
  format, the copy bandwidth, a launch's seconds). ``resacct fit/lora/shard --device BOARD`` read only
  this (:func:`board_ceilings`), never the megabytes beside it; a shipped copy lies in
  ``resacct/specs/gpu_records/`` for an installed resacct.

A dry run's record (``dry_run: true``, made on a CPU) is a layout check: it calibrates nothing and no
claim may rest on it (:func:`read_board_record` refuses it unless asked, for tests).

>>> brief = ceilings_in_brief({"matmul": {"bf16": {"max_flops_per_sec": 7.1e14}, "fp8": {"max_flops_per_sec": None}},
...                            "copy": {"bandwidth_bytes_per_sec": 3.9e12}, "launch": {"per_launch_sec": 4.5e-6}})
>>> brief
{'matmul_flops_per_sec': {'bf16': 710000000000000.0}, 'copy_bandwidth_bytes_per_sec': 3900000000000.0, 'launch_sec': 4.5e-06}
"""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from resacct.account.gpu.records.recorded import PACKAGED_RECORDS, REPOSITORY, record_path
from resacct.errors import ResacctError

__all__ = ["SUMMARY_SUFFIX", "BoardCeilings", "read_board_record", "board_record_step", "ceilings_in_brief", "board_ceilings",
           "committed_board_ceilings", "summary_name_of"]

SUMMARY_SUFFIX = "-summary.json"
RECORDS_FOLDER = REPOSITORY / "docs" / "gpu"


def summary_name_of(record_name: str) -> str:
    """The summary committed beside a record: ``…-record.json.gz`` → ``…-record-summary.json``."""
    stem = record_name.removesuffix(".gz").removesuffix(".json")
    return stem + SUMMARY_SUFFIX


@lru_cache(maxsize=4)
def _read(path: str, mtime_ns: int) -> dict[str, Any]:
    from resacct.account.gpu.records.record import check_record_layout

    try:
        opener: Any = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt") as handle:
            record = json.load(handle)
    except (OSError, EOFError, UnicodeDecodeError) as error:
        raise ResacctError(f"GPU record {path}: cannot be read ({error}); expected the recorder's .json.gz, whole") from None
    except json.JSONDecodeError as error:
        raise ResacctError(f"GPU record {path}: not JSON ({error.msg} at line {error.lineno}); expected the recorder's JSON") from None
    if not isinstance(record, dict):
        raise ResacctError(f"GPU record {path}: a JSON {type(record).__name__}; expected the recorder's object")
    problems = check_record_layout(record)
    if problems:
        raise ResacctError(f"GPU record {path}: not a whole record ({problems[0]}); expected tools/gpu_record.py's layout")
    return record


def read_board_record(name: str, *, allow_dry_run: bool = False) -> dict[str, Any]:
    """The record ``name`` (``docs/gpu/…-record.json.gz``, relative to the repository unless absolute),
    its layout checked, read once per content. A dry run's record is refused unless ``allow_dry_run``."""
    path = record_path(name)
    if not path.is_file():
        raise ResacctError(f"GPU record {name}: no such file ({path}); expected a committed record under docs/gpu/")
    record = _read(str(path), path.stat().st_mtime_ns)
    if record.get("dry_run") and not allow_dry_run:
        raise ResacctError(f"GPU record {name}: a dry run made on a CPU ({record['board']}); expected a record made on a board")
    return record


def board_record_step(name: str, record: dict[str, Any], step: str) -> dict[str, Any]:
    """The recorded step called ``step`` — a training step, or a serving entry (``serving``: weights, a prefill, decoded
    tokens); a step the board failed (``error``) or a name not recorded: ResacctError."""
    entries = [*record["steps"], *record.get("serving", [])]
    found = [entry for entry in entries if entry.get("name") == step]
    if not found:
        known = ", ".join(str(entry.get("name")) for entry in entries)
        raise ResacctError(f"GPU record {name}: no step {step!r}; expected one of {known}")
    if "error" in found[0]:
        raise ResacctError(f"GPU record {name}: step {step!r} was not recorded ({found[0]['error']}); expected a recorded step")
    return found[0]


def _positive(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0 else None


def ceilings_in_brief(ceilings: dict[str, Any]) -> dict[str, Any]:
    """A record's ``ceilings`` as its summary keeps them: the most matmul FLOP/s per format measured (a
    format the board refused left out), the copy bandwidth and one launch's seconds (None where not measured)."""
    matmul = {fmt: rate for fmt, entry in (ceilings.get("matmul") or {}).items()
              if isinstance(entry, dict) and (rate := _positive(entry.get("max_flops_per_sec"))) is not None}
    return {"matmul_flops_per_sec": matmul, "copy_bandwidth_bytes_per_sec": _positive((ceilings.get("copy") or {}).get("bandwidth_bytes_per_sec")),
            "launch_sec": _positive((ceilings.get("launch") or {}).get("per_launch_sec"))}


@dataclass(frozen=True)
class BoardCeilings:
    """What a committed record measured of its board, from its summary: the datasheet table's name of the
    board (``accelerator``), the record's file, when, and the ceilings in brief."""

    accelerator: str
    record_file: str
    when: str
    cuda_name: str
    matmul_flops_per_sec: dict[str, float]
    copy_bandwidth_bytes_per_sec: float | None
    launch_sec: float | None
    steps_recorded: int


def _summary_files() -> list[Path]:
    """Every committed summary: the repository's, else the copies an installed resacct ships (by file name, the repository's first)."""
    found: dict[str, Path] = {}
    for folder in (RECORDS_FOLDER, PACKAGED_RECORDS):
        for path in sorted(folder.glob(f"*{SUMMARY_SUFFIX}")) if folder.is_dir() else []:
            found.setdefault(path.name, path)
    return list(found.values())


def _ceilings_of_summary(path: Path) -> BoardCeilings | None:
    """A summary's :class:`BoardCeilings`; None for a dry run's or a board resacct's table does not know.
    A summary that is not the recorder's: ResacctError naming the file."""
    from resacct.facts.hardware import accelerator_for_cuda_name

    try:
        summary = json.loads(path.read_text())
        if summary.get("dry_run"):
            return None
        brief = summary["ceilings"]
        board = accelerator_for_cuda_name(summary["board"])
        ok = sum(1 for row in summary["steps"] if row.get("status") == "ok")
        record = summary_record_name(path)
        return None if board is None else BoardCeilings(board.name, record, str(summary["when"]), summary["board"],
                                                        dict(brief["matmul_flops_per_sec"]), brief["copy_bandwidth_bytes_per_sec"],
                                                        brief["launch_sec"], ok)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise ResacctError(f"GPU record summary {path}: not the recorder's summary ({type(error).__name__}: {error}); "
                           "expected tools/gpu_record.py's gpu-record-summary.json, committed beside its record") from None


def summary_record_name(path: Path) -> str:
    """The record a summary stands beside, as the claims name it: ``docs/gpu/<stem>.json.gz``."""
    return f"docs/gpu/{path.name.removesuffix(SUMMARY_SUFFIX)}.json.gz"


def committed_board_ceilings() -> list[BoardCeilings]:
    """Every committed board record's ceilings (dry runs and boards not in the table left out), oldest first."""
    found = [ceilings for path in _summary_files() if (ceilings := _ceilings_of_summary(path)) is not None]
    return sorted(found, key=lambda ceilings: ceilings.when)


def board_ceilings(board: Any) -> BoardCeilings | None:
    """The newest committed record's ceilings for ``board`` (an :class:`~resacct.facts.hardware.Accelerator`), or None."""
    found = [ceilings for ceilings in committed_board_ceilings() if ceilings.accelerator == board.name]
    return found[-1] if found else None
