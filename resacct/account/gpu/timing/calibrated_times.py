"""The calibrated step-time model's fitted numbers (:mod:`~resacct.account.gpu.timing.step_time_calibrated` fits and applies
them): plain data, importable without torch — a calibration file is read (``record_calibration``) where no step is traced,
as ``resacct devices NAME`` does to say what prices a board's step."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["MatmulFit", "CalibratedTimes"]


@dataclass(frozen=True)
class MatmulFit:
    """One class of cuBLAS call: ``t = max(FLOPs ÷ flops_per_sec, bytes ÷ bandwidth) + sec_per_call``."""

    flops_per_sec: float
    sec_per_call: float


@dataclass(frozen=True)
class CalibratedTimes:
    """What the calibration steps gave: the matmul classes' fits, the other kernels' bandwidth factor and per-kernel
    seconds, the host's idle seconds per op, and where each came from."""

    matmul: dict[str, MatmulFit]
    memory_factor: float  # × bytes ÷ the copy bandwidth
    sec_per_kernel: float
    idle_sec_per_op: float
    bandwidth_bytes_per_sec: float
    calibrated_on: tuple[str, ...]
    attention_flops_per_sec: dict[str, float] = field(default_factory=dict)  # per fused kernel family and precision (attention_class)
