"""Fitting a board record's calibrated step-time model (:mod:`~resacct.account.gpu.records.record_calibration`, which reads it):
``tools/gpu_record.py --calibrate`` runs it once when a record is committed. Kept apart from the reader so that the
commands' pricing (board_rates → record_calibration) does not import the record's step models (record_models → the
commands' answers → board_rates: a circle)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from resacct.account.gpu.records.record_calibration import CALIBRATION_FORMAT, calibration_file
from resacct.errors import ResacctError

__all__ = ["fit_record_calibration", "write_record_calibration"]


def fit_record_calibration(record_file: str, *, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Fit the model on every dense training step of ``record_file`` that has a profile (no mixture of experts: the
    claims' own rule, ``tools/gpu_record_claims.py``'s ``calibration_sets``), each traced on meta as the record's claims trace it (:func:`~resacct.account.gpu.records.record_models.predict_record_step`); the JSON document to keep."""
    import hashlib

    import torch

    from resacct.account.gpu.records.board_record import board_record_step, ceilings_in_brief, read_board_record
    from resacct.account.gpu.records.record_models import predict_step_of_record
    from resacct.account.gpu.records.recorded import record_path
    from resacct.account.gpu.timing.step_time_calibrated import calibrate_step_times
    from resacct.facts.hardware import peak_format
    from resacct.facts.recipes import parse_recipe

    data = read_board_record(record_file)
    if data.get("dry_run"):
        raise ResacctError(f"GPU record {record_file} is a dry run's (a layout check): expected a record made on a board")
    brief = ceilings_in_brief(data["ceilings"])
    rates, bandwidth = brief["matmul_flops_per_sec"], brief["copy_bandwidth_bytes_per_sec"]
    if not rates or not bandwidth:
        raise ResacctError(f"GPU record {record_file}: its ceilings lack a matmul rate or the copy bandwidth; expected the recorder's ceilings")
    steps = []
    for listed in data["steps"]:
        if "ops" not in listed or (listed.get("extra") or {}).get("experts"):  # dense steps only, as the claims calibrate (a mixture
            continue  # of experts' uneven tokens per expert make its profile's shapes mislead the matmul classes)
        entry = board_record_step(record_file, data, listed["name"])
        fmt = peak_format(parse_recipe(entry["recipe"]).computes_in)
        if fmt not in rates:
            continue
        if progress is not None:
            progress(entry["name"])
        ops: list[Any] = []
        predict_step_of_record(data, entry, ops=ops)
        steps.append((entry["name"], entry, ops, rates[fmt]))
    times = calibrate_step_times(steps, bandwidth_bytes_per_sec=bandwidth)
    traced_with = f"torch {torch.__version__}"
    try:
        import transformers

        traced_with += f", transformers {transformers.__version__}"
    except ImportError:
        pass
    return {"format": CALIBRATION_FORMAT, "record_file": record_file, "record_sha256": hashlib.sha256(record_path(record_file).read_bytes()).hexdigest(),
            "board": data["board"], "when": data["when"], "traced_with": traced_with, "calibrated_on": list(times.calibrated_on),
            "matmul": {name: {"flops_per_sec": fit.flops_per_sec, "sec_per_call": fit.sec_per_call} for name, fit in sorted(times.matmul.items())},
            "memory_factor": times.memory_factor, "sec_per_kernel": times.sec_per_kernel, "idle_sec_per_op": times.idle_sec_per_op,
            "bandwidth_bytes_per_sec": times.bandwidth_bytes_per_sec, "matmul_flops_per_sec": dict(sorted(rates.items())),
            "attention_flops_per_sec": dict(sorted(times.attention_flops_per_sec.items()))}


def write_record_calibration(record_file: str, out: Path, *, progress: Callable[[str], None] | None = None) -> Path:
    """Fit (:func:`fit_record_calibration`) and write the calibration of ``record_file`` into the folder ``out``."""
    document = fit_record_calibration(record_file, progress=progress)
    path = out / calibration_file(record_file).name
    path.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    return path
