"""The committed GPU records (``docs/gpu/*.json``) read for replay on any machine: the evidence of
``recorded`` claims (:mod:`resacct.checks.gpu_recorded`).

A record is what a GPU run measured once (board, date, torch; per claim its measured value; per GPT
step its ``max_memory_allocated`` and step time): the **measurement** of a recorded claim comes from
it, the **prediction** from resacct code run now (the allocator model, :func:`predict_cuda_step_memory`),
the law from the claim's YAML. A record that is missing, is not JSON, or lacks the value a claim
reads is an error naming the file and the value — never a skip.

>>> record = load_gpu_record(H100_RECORD)
>>> record_source(H100_RECORD, record)["board"], recorded_value(H100_RECORD, record, "gpu_claims", "gpu-step-peak-predicted")
('NVIDIA H100 80GB HBM3', 56240128)
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from resacct.errors import ResacctError

__all__ = ["H100_RECORD", "RECORDS_BY_FAMILY", "REPOSITORY", "PACKAGED_RECORDS", "load_gpu_record", "record_source", "recorded_value", "recorded_step", "record_path",
           "record_contents"]

REPOSITORY = Path(__file__).resolve().parents[4]
PACKAGED_RECORDS = Path(__file__).resolve().parents[3] / "specs" / "gpu_records"  # the records a wheel ships (package data)
H100_RECORD = "docs/gpu/2026-11-26-h100-80gb-hbm3.json"
# The boards a round-three record calibrates, by the datasheet table's name, and what it verified (a board's newer
# record, resacct-gpu-record/1, is found by its summary: resacct.account.gpu.records.board_record.board_ceilings).
RECORDS_BY_FAMILY = {"h100-sxm": (H100_RECORD, "gpt-tiny fp32 forward + backward to the byte; three fp32 GPT training steps within 1 %")}


def record_path(name: str) -> Path:
    """``name`` as given (absolute), else relative to the repository (``docs/gpu/…``); an installed
    resacct (no repository) reads the copy it ships, ``resacct/specs/gpu_records/<file name>``."""
    path = Path(name)
    if path.is_absolute():
        return path
    shipped = PACKAGED_RECORDS / path.name
    return REPOSITORY / path if (REPOSITORY / path).is_file() or not shipped.is_file() else shipped


def record_contents(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """What a stored measurement of a recorded claim must also be keyed by (:mod:`resacct.harness.replay`): the sha256 of
    the record file its ``record`` names, wherever it lies (an absolute path outside resacct's files too); None where
    there is no such file (the check then fails, as it would without replay)."""
    path = record_path(str(inputs.get("record", "")))
    try:
        status = path.stat()
    except OSError:
        return {"record_sha256": None}
    return {"record_sha256": _digest(str(path), status.st_mtime_ns, status.st_size)}


@lru_cache(maxsize=8)
def _digest(path: str, mtime_ns: int, size: int) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


@lru_cache(maxsize=8)
def _read(path: str, mtime_ns: int) -> dict[str, Any]:
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError) as error:
        raise ResacctError(f"GPU record {path}: cannot be read ({error}); expected a committed record under docs/gpu/") from None
    except json.JSONDecodeError as error:
        raise ResacctError(f"GPU record {path}: not JSON ({error.msg} at line {error.lineno}); expected the recorder's JSON") from None
    if not isinstance(record, dict):
        raise ResacctError(f"GPU record {path}: a JSON {type(record).__name__}; expected an object with board, when and gpu_claims")
    for key in ("board", "when"):
        if not isinstance(record.get(key), str) or not record[key]:
            raise ResacctError(f"GPU record {path}: {key} is {record.get(key)!r}; expected a non-empty string")
    return record


def load_gpu_record(name: str) -> dict[str, Any]:
    """The record ``name`` (a path, relative to the repository unless absolute), read once per content."""
    path = record_path(name)
    if not path.is_file():
        raise ResacctError(f"GPU record {name}: no such file ({path}); expected a committed record under docs/gpu/")
    return _read(str(path), path.stat().st_mtime_ns)


def record_source(name: str, record: dict[str, Any]) -> dict[str, str]:
    """What a report names beside a recorded claim: the board, the date, the record file."""
    return {"board": record["board"], "recorded_on": record["when"], "record_file": name}


def _number(name: str, where: str, value: Any) -> float | int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ResacctError(f"GPU record {name}: {where} is {value!r}; expected a positive finite number")
    return value


def recorded_value(name: str, record: dict[str, Any], section: str, claim_id: str, quantity: str | None = None) -> float | int:
    """The measured value (or ``quantity``) of the recorded claim ``claim_id`` of ``section`` (``gpu_claims``)."""
    claims = record.get(section)
    if not isinstance(claims, list):
        raise ResacctError(f"GPU record {name}: {section} is {type(claims).__name__}; expected a list of recorded claims")
    found = [c for c in claims if isinstance(c, dict) and c.get("id") == claim_id]
    if not found:
        raise ResacctError(f"GPU record {name}: no {section} entry {claim_id!r}; expected one of {', '.join(str(c.get('id')) for c in claims if isinstance(c, dict))}")
    if quantity is None:
        return _number(name, f"{claim_id}.measured", found[0].get("measured"))
    return _number(name, f"{claim_id}.quantities.{quantity}", (found[0].get("quantities") or {}).get(quantity))


def recorded_step(name: str, record: dict[str, Any], step: str) -> dict[str, Any]:
    """The recorded GPT step ``step`` (``step_time``): its config, batch, seq, recipe, optimizer,
    measured ``max_memory_allocated`` above the start (``peak_bytes``), step seconds (``step_sec``)
    FlopCounterMode's step FLOPs (``step_flops``), what autograd saved for backward on the board
    (``saved_bytes``) and the training state at the optimizer step (``state_at_step_bytes``)."""
    steps = record.get("step_time")
    if not isinstance(steps, dict) or not isinstance(steps.get(step), dict):
        known = ", ".join(steps) if isinstance(steps, dict) else "none"
        raise ResacctError(f"GPU record {name}: no step_time entry {step!r}; expected one of {known}")
    entry = steps[step]

    def row(section: str, quantity_starts: str, field: str) -> float | int:
        rows = [r for r in entry.get(section) or [] if isinstance(r, dict) and str(r.get("quantity", "")).startswith(quantity_starts)]
        if not rows:
            raise ResacctError(f"GPU record {name}: step {step!r} has no {section} row {quantity_starts!r}")
        return _number(name, f"step_time.{step}.{section}[{quantity_starts}].{field}", rows[0].get(field))

    config = entry.get("config")
    if not isinstance(config, dict):
        raise ResacctError(f"GPU record {name}: step {step!r} config is {config!r}; expected the GPT's config as an object")
    for key in ("batch", "seq"):
        _number(name, f"step_time.{step}.{key}", entry.get(key))
    return {"config": config, "batch": entry["batch"], "seq": entry["seq"], "recipe": entry.get("recipe"), "optimizer": entry.get("optimizer"),
            "attention": entry.get("attention"), "peak_bytes": row("peak", "GPU step peak", "measured_bytes"),
            "step_sec": row("time", "step on cuda", "measured_sec"), "step_flops": row("flops", "step (exact", "measured_flops"),
            "saved_bytes": row("activations", "saved for backward", "measured_bytes"),
            "state_at_step_bytes": row("training_state", "at optimizer step", "measured_bytes")}
