"""A board record's calibrated step-time model, fitted once on all its training steps and kept beside it (issue 31).

:mod:`~resacct.account.gpu.timing.step_time_calibrated` fits a model on recorded steps — per class of cuBLAS call a rate and a
time per call, the other kernels' factor on the copy bandwidth and time per kernel, the host's idle time per op — and
the record's ``recorded-…-step-time-calibrated`` claims judge it on steps it was not fitted on (11 of the H200 record's 13 since session 30
within 10 %, where the per-op roofline on the record's ceilings held 4). The commands (``account``, ``lora``, ``shard``,
``infer`` with ``--device BOARD``) price a traced step by the same model fitted on **every** training step of the
board's newest record (its dense ones, as the claims calibrate). Fitting traces each recorded step's whole process on meta (~15 CPU s for 13 steps), so it is done
once, when the record is committed — ``python tools/gpu_record.py --calibrate docs/gpu/<record>.json.gz`` writes
``docs/gpu/<record>-calibration.json`` (:mod:`~resacct.account.gpu.records.record_calibration_fit`; copied into
``resacct/specs/gpu_records/`` as the record is) — and read here by the commands: :func:`board_calibration`. ``tests/test_record_calibration.py`` fits it again with this checkout's torch and
compares. A board without a calibration of its own takes one of a board of its compute capability, moved to it by the
datasheets' bandwidth and peak ratios (:func:`moved_calibration`, since session 30: the H200's on an H100, judged on the
H100 record's steps); :func:`calibration_for` gives whichever applies.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from resacct.account.gpu.timing.calibrated_times import CalibratedTimes, MatmulFit
from resacct.errors import ResacctError

__all__ = ["CALIBRATION_FORMAT", "BoardCalibration", "calibration_file", "read_record_calibration", "board_calibration", "moved_calibration",
           "calibration_for"]

CALIBRATION_FORMAT = "resacct-gpu-calibration/1"


@dataclass(frozen=True)
class BoardCalibration:
    """A record's fitted model and where it came from."""

    times: CalibratedTimes
    record_file: str
    board: str
    when: str
    traced_with: str  # the torch (and transformers) the steps were traced with when it was fitted
    matmul_flops_per_sec: dict[str, float]  # the record's best matmul rate per format: a FLOP-bound op that is not a cuBLAS call

    moved_from: str | None = None  # the board it was fitted on, where moved to another (moved_calibration): how, in words

    def source(self) -> str:
        fitted = (f"a per-op model calibrated on the {len(self.times.calibrated_on)} dense training steps of record {self.record_file} "
                  f"({self.when[:10]}; fitted with {self.traced_with}; judged on held-out steps by its step-time-calibrated claims)")
        return fitted if self.moved_from is None else f"{fitted}, {self.moved_from}"


def calibration_file(record_file: str) -> Path:
    """Where the calibration of ``record_file`` lies: beside it (``…-record.json.gz`` → ``…-record-calibration.json``), or
    the copy resacct ships."""
    from resacct.account.gpu.records.recorded import record_path

    name = Path(record_file).name.removesuffix(".gz").removesuffix(".json") + "-calibration.json"
    return record_path(str(Path(record_file).with_name(name)))


def read_record_calibration(path: Path) -> BoardCalibration:
    """A calibration file read back whole; a malformed one is an error naming the file and what it lacks."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        if document.get("format") != CALIBRATION_FORMAT:
            raise ValueError(f"format {document.get('format')!r}, expected {CALIBRATION_FORMAT!r}")
        times = CalibratedTimes({name: MatmulFit(float(fit["flops_per_sec"]), float(fit["sec_per_call"])) for name, fit in document["matmul"].items()},
                                float(document["memory_factor"]), float(document["sec_per_kernel"]), float(document["idle_sec_per_op"]),
                                float(document["bandwidth_bytes_per_sec"]), tuple(document["calibrated_on"]),
                                {family: float(rate) for family, rate in (document.get("attention_flops_per_sec") or {}).items()})
        return BoardCalibration(times, str(document["record_file"]), str(document["board"]), str(document["when"]), str(document["traced_with"]),
                                {name: float(rate) for name, rate in document["matmul_flops_per_sec"].items()})
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise ResacctError(f"GPU record calibration {path}: cannot be read ({error}); expected tools/gpu_record.py --calibrate's JSON") from None


def board_calibration(board: Any) -> BoardCalibration | None:
    """The calibration beside ``board``'s newest committed record (:func:`~resacct.account.gpu.records.board_record.board_ceilings`),
    or None where that record has none."""
    from resacct.account.gpu.records.board_record import board_ceilings

    ceilings = board_ceilings(board)
    if ceilings is None:
        return None
    path = calibration_file(ceilings.record_file)
    return _read_cached(str(path), path.stat().st_mtime_ns) if path.is_file() else None


@lru_cache(maxsize=4)
def _read_cached(path: str, mtime_ns: int) -> BoardCalibration:
    return read_record_calibration(Path(path))


def calibration_for(board: Any) -> BoardCalibration | None:
    """The calibration that prices a step on ``board``: its own record's (:func:`board_calibration`), else one of a board of
    the same compute capability moved to it (:func:`moved_calibration`), else None."""
    return board_calibration(board) or moved_calibration(board)


def moved_calibration(board: Any) -> BoardCalibration | None:
    """A calibration fitted on another board of ``board``'s compute capability (the same kernels: an H200's for an H100),
    moved to ``board`` by the datasheets' ratios: the copy bandwidth (the other kernels' and the matmuls' memory roof) by
    the memory bandwidths', each matmul class's and attention family's rate — and the record's best rates — by the dense
    peaks' in its format (fp32; bf16 for the 16-bit classes); the per-call, per-kernel and host times as fitted (the host
    is another machine's: a host-bound step's time is the least sure). None where ``board`` has a calibration of its
    own, no compute capability, or no calibrated board shares it. Judged on the H100 record's GPU-bound steps by the
    ``recorded-h100-…-step-time-moved-from-h200`` claims (docs/gpu.md)."""
    from dataclasses import replace

    from resacct.account.gpu.records.board_record import committed_board_ceilings
    from resacct.facts.hardware import get_accelerator

    capability = getattr(board, "compute_capability", None)
    if capability is None or board_calibration(board) is not None:
        return None
    for ceilings in reversed(committed_board_ceilings()):  # the newest first
        source = get_accelerator(ceilings.accelerator)
        if source.name == board.name or source.compute_capability != capability:
            continue
        fitted = board_calibration(source)
        if fitted is None:
            continue

        ratios = {fmt: _peak_ratio(board, source, fmt) for fmt in ("fp32", "bf16", "fp16")}
        sixteen = ratios["bf16"] if ratios["bf16"] is not None else ratios["fp16"]
        if ratios["fp32"] is None or sixteen is None:  # a table without the peaks to move by (neither bf16 nor fp16 on one side)
            continue

        def class_ratio(name: str) -> float:  # a matmul class's or attention key's: fp32, else the 16-bit classes'
            return ratios["fp32"] if name == "fp32" or name.endswith("/fp32") else sixteen  # type: ignore[return-value]

        bandwidth_ratio = board.memory_bandwidth_bytes_per_sec / source.memory_bandwidth_bytes_per_sec
        times = fitted.times
        moved = replace(times, bandwidth_bytes_per_sec=times.bandwidth_bytes_per_sec * bandwidth_ratio,
                        matmul={name: MatmulFit(fit.flops_per_sec * class_ratio(name), fit.sec_per_call) for name, fit in times.matmul.items()},
                        attention_flops_per_sec={key: rate * class_ratio(key) for key, rate in times.attention_flops_per_sec.items()})
        rates = {fmt: rate * ratio for fmt, rate in fitted.matmul_flops_per_sec.items() if (ratio := _peak_ratio(board, source, fmt)) is not None}
        how = (f"moved from {source.name} to {board.name} (compute capability {capability[0]}.{capability[1]} both) by the datasheets: bandwidth × "
               f"{bandwidth_ratio:.3g}, 16-bit rates × {sixteen:.3g}, fp32 × {ratios['fp32']:.3g}; its host times as fitted there (a record of "
               f"the board judges the move: `resacct verify -k moved-from`)")
        return replace(fitted, times=moved, matmul_flops_per_sec=rates, moved_from=how)
    return None


def _peak_ratio(board: Any, source: Any, fmt: str) -> float | None:
    """``board``'s dense peak in ``fmt`` over ``source``'s (datasheet table), or None where either has none."""
    from resacct.facts.hardware import peak_flops_per_sec

    try:
        return peak_flops_per_sec(board, fmt) / peak_flops_per_sec(source, fmt)
    except ResacctError:
        return None
