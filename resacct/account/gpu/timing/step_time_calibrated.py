"""The GPU step time calibrated on a board's record (issue 31, part 3): fitted on some recorded steps, judged on others.

The per-op roofline of :mod:`~resacct.account.gpu.timing.step_time` prices every op at the record's best rates, and the H200
record (2026-11-30) shows where that fails (``benchmarks/board_op_times.py``): views are charged as if they moved their
tensors (none launches a kernel); a 16-bit matmul with a dimension that is not a multiple of 8 runs at 95–145 TFLOP/s
where aligned ones reach 630–930 (GPT-2's 50,257-token vocabulary: 7.9 of the 10.1 ms of its bf16 matmuls);
elementwise and foreach kernels reach 0.4–0.7 of the copy bandwidth. This model takes each of those from the record's
own per-op profile of the **calibration steps** (never the judged one):

- **matmuls** — per class (``fp32``; 16-bit ``aligned``: every leading dimension cuBLAS is given a multiple of 8 —
  a traced call knows its strides, a profile's row only its shapes; 16-bit ``unaligned``), a rate and a per-call time, ``t = FLOPs ÷ rate + t0``, least squares over the profile's rows of
  every cuBLAS call (their shapes give the FLOPs), each row weighted by its own time (relative error). A call is priced
  no faster than the roofline's memory roof — its operands' and output's bytes at the copy bandwidth —:
  ``t = max(FLOPs ÷ rate, bytes ÷ bandwidth) + t0`` (since session 30: a mixture of experts' ``batched_mm`` runs 512
  matrix-vector products and outer products per call, 2.1-4.3 GB each, that FLOPs alone priced at microseconds; on the
  H200 record its step went from 0.89 to 1.03 of the board's, the dense steps moved by ≤ 0.7 % — docs/gpu.md);
- **attention** — per fused kernel family (flash, memory-efficient) and precision (``fp32``, ``16-bit``), one rate: the
  calibration steps' traced attention FLOPs (torch's flop registry: a causal call counted whole) over their profile's
  attention kernels' device time (on the H200 record flash ran 285-316 TFLOP/s in every bf16 step, forward and backward
  alike, where the best matmul rate is 805; the fp32 efficient kernel ~49). A family and precision the calibration steps
  never ran (the H200 record has no 16-bit efficient step) is priced at the best matmul rate in its format, as every
  attention call was before session 27 — never at another precision's rate (keys ``family/precision`` since session 28;
  an older file's bare family names are not read as any precision's);
- **every other op that launches a kernel** — ``t = m · bytes ÷ copy bandwidth + k``: ``m`` and ``k`` fitted on the
  calibration steps' device time left once their matmuls are priced (the profile's busy time);
- **the host** — what the board spent idle between kernels, per traced op (the median over the calibration steps):
  the step is the kernels' time plus that.

Views launch nothing and cost nothing. Not modelled: a step that waits for the device mid-step (a mixture of experts
routed by ``nonzero``: the host stalls, the GPU idles far longer than per op) — such a step is judged and misses.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from typing import Any, no_type_check

import numpy as np

from resacct.account.gpu.timing.calibrated_times import CalibratedTimes, MatmulFit
from resacct.account.gpu.tracing.op_costs import OpCost
from resacct.errors import ResacctError

__all__ = ["MatmulFit", "CalibratedTimes", "matmul_class", "attention_class", "profile_matmul_rows", "calibrate_step_times", "predict_calibrated_seconds",
           "outside_calibration"]

#: the profile's dtype names of a 32-bit float (TF32 off, PyTorch's default: the fp32 class)
_FP32_NAMES = frozenset({"float", "float32", "Float"})


@no_type_check  # per op or block of a traced step (docs/suite_time.md, session 24)
def matmul_class(dtype: str, aligned: bool) -> str:
    """``fp32``, ``aligned`` (a 16-bit matmul whose leading dimensions are multiples of 8) or ``unaligned``."""
    if dtype in _FP32_NAMES:
        return "fp32"
    return "aligned" if aligned else "unaligned"


def profile_matmul_rows(step: dict[str, Any]) -> list[tuple[str, int, int, float]]:
    """A recorded step's cuBLAS calls from its profile (``ops``): (class, FLOPs of one call, calls, self device seconds)."""
    rows = []
    for row in step.get("ops") or []:
        name = row["name"].split("::")[-1]
        if name not in ("mm", "addmm", "bmm", "baddbmm") or not row.get("self_device_us"):
            continue
        shapes, dtypes = row["shapes"], row["dtypes"]
        left, right = (shapes[1], shapes[2]) if name in ("addmm", "baddbmm") else (shapes[0], shapes[1])
        dtype = dtypes[1] if name in ("addmm", "baddbmm") else dtypes[0]
        count = left[0] * left[1] if len(left) == 3 else left[0]
        flops = 2 * count * right[-1] * left[-1]
        # a profile keeps shapes, not strides: any dimension not a multiple of 8 counts as unaligned (true of a dense model's
        # odd vocabulary, every one of its three matmuls slow; not of a mixture of experts' tokens per expert: calibrate on dense steps)
        aligned = count % 8 == 0 and right[-1] % 8 == 0 and left[-1] % 8 == 0
        rows.append((matmul_class(str(dtype).removeprefix("c10::"), aligned), flops, int(row["calls"]), row["self_device_us"] * 1e-6))
    return rows


@no_type_check  # per op or block of a traced step (docs/suite_time.md, session 24)
def _matmul_sec(fits: dict[str, MatmulFit], op: OpCost, fallback_flops_per_sec: float, bandwidth_bytes_per_sec: float) -> float:
    """A cuBLAS call's seconds by its class's fit (the fallback rate where its class has none), never under its bytes at
    the copy bandwidth (the roofline's memory roof: a batch of matrix-vector products moves far more than it computes)."""
    *_, dtype, aligned = op.matmul  # type: ignore[misc]
    fit = fits.get(matmul_class(dtype, aligned))
    moving = op.bytes / bandwidth_bytes_per_sec
    if fit is None:
        return max(op.flops / fallback_flops_per_sec, moving)
    return max(op.flops / fit.flops_per_sec, moving) + fit.sec_per_call


def _fit_matmuls(rows: Iterable[tuple[str, int, int, float]]) -> dict[str, MatmulFit]:
    fits = {}
    by_class: dict[str, list[tuple[int, int, float]]] = {}
    for name, flops, calls, seconds in rows:
        by_class.setdefault(name, []).append((flops, calls, seconds))
    for name, samples in by_class.items():
        weights = np.array([calls / seconds for _, calls, seconds in samples])  # per call: t / calls, weighted by its inverse
        design = np.array([[flops, 1.0] for flops, _, _ in samples]) * weights[:, None]
        (slope, intercept), *_ = np.linalg.lstsq(design, np.ones(len(samples)), rcond=None)
        if len(samples) >= 2 and slope > 0:
            fits[name] = MatmulFit(float(1.0 / slope), max(float(intercept), 0.0))  # Python floats: a report carries them
    return fits


#: the fused attention kernels' families: the traced (meta) ops that run each, and the profile rows of its kernels
_ATTENTION_FAMILIES = {
    "flash": (("aten._scaled_dot_product_flash_attention.default", "aten._scaled_dot_product_flash_attention_backward.default"),
              ("aten::_flash_attention_forward", "aten::_flash_attention_backward")),
    "efficient": (("aten._scaled_dot_product_efficient_attention.default", "aten._scaled_dot_product_efficient_attention_backward.default"),
                  ("aten::_efficient_attention_forward", "aten::_efficient_attention_backward")),
}
_ATTENTION_OP_FAMILY = {op: family for family, (ops, _) in _ATTENTION_FAMILIES.items() for op in ops}


@no_type_check  # per op of a traced step
def attention_class(family: str, dtype: str | None) -> str:
    """``flash/16-bit``, ``efficient/fp32`` …: a fused attention call's rate key, by its kernel family and its dtype's
    precision (a traced op's ``torch`` name or a profile row's ``c10::`` one)."""
    name = (dtype or "").removeprefix("torch.").removeprefix("c10::")
    return f"{family}/{'fp32' if name in _FP32_NAMES else '16-bit'}"


def _attention_rates(steps: list[tuple[str, dict[str, Any], Sequence[OpCost], float]]) -> dict[str, float]:
    """Per family and precision, the calibration steps' traced attention FLOPs over their profile's attention kernel seconds."""
    flops: dict[str, float] = {}
    seconds: dict[str, float] = {}
    for _, entry, ops, _ in steps:
        for op in ops:
            if (family := _ATTENTION_OP_FAMILY.get(op.op)) is not None:
                key = attention_class(family, op.dtype)
                flops[key] = flops.get(key, 0.0) + op.flops
        for row in entry.get("ops") or []:
            for family, (_, kernels) in _ATTENTION_FAMILIES.items():
                if row["name"] in kernels and row.get("self_device_us"):
                    key = attention_class(family, (row.get("dtypes") or [None])[0])
                    seconds[key] = seconds.get(key, 0.0) + row["self_device_us"] * 1e-6
    return {key: flops[key] / seconds[key] for key in sorted(flops) if flops[key] > 0 and seconds.get(key, 0.0) > 0}


def _kernel_parts(ops: Sequence[OpCost], matmul_fits: dict[str, MatmulFit], fallback: float, bandwidth: float,
                  attention: dict[str, float] | None = None) -> tuple[float, float, int]:
    """(matmul and FLOP-bound seconds, other kernels' bytes ÷ bandwidth, other kernels) of a traced step."""
    compute = memory = 0.0
    kernels = 0
    attention = attention or {}
    for op in ops:
        if not op.kernel:
            continue
        if op.matmul is not None:
            compute += _matmul_sec(matmul_fits, op, fallback, bandwidth)
        elif op.op in _ATTENTION_OP_FAMILY and (rate := attention.get(attention_class(_ATTENTION_OP_FAMILY[op.op], op.dtype))) is not None:
            compute += op.flops / rate
        elif op.flops and op.flops / fallback >= op.bytes / bandwidth:  # attention and the like: FLOP-bound at the best rate
            compute += op.flops / fallback
        else:
            memory += op.bytes / bandwidth
            kernels += 1
    return compute, memory, kernels


def calibrate_step_times(steps: list[tuple[str, dict[str, Any], Sequence[OpCost], float]], *, bandwidth_bytes_per_sec: float) -> CalibratedTimes:
    """Fit the model on ``steps``: each (name, its record entry — profile and median step time —, its traced ops, the record's
    best matmul rate in its format: the price of a FLOP-bound op that is not a cuBLAS call, flash attention's kernels)."""
    if len(steps) < 2:
        raise ResacctError(f"calibration on {len(steps)} step(s): expected at least two recorded steps (two parameters are fitted on them)")
    matmul = _fit_matmuls(row for _, entry, _, _ in steps for row in profile_matmul_rows(entry))
    attention = _attention_rates(steps)
    design, target, idle = [], [], []
    for _, entry, ops, fallback in steps:
        busy = sum(row["self_device_us"] for row in entry["ops"]) * 1e-6
        compute, memory, kernels = _kernel_parts(ops, matmul, fallback, bandwidth_bytes_per_sec, attention)
        design.append([memory / busy, kernels / busy])
        target.append((busy - compute) / busy)
        idle.append((entry["step_time_sec"]["median"] - busy) / len(ops))
    (factor, per_kernel), *_ = np.linalg.lstsq(np.array(design), np.array(target), rcond=None)
    return CalibratedTimes(matmul, max(float(factor), 0.0), max(float(per_kernel), 0.0), max(float(statistics.median(idle)), 0.0),
                           bandwidth_bytes_per_sec, tuple(name for name, *_ in steps), {family: float(rate) for family, rate in attention.items()})


def predict_calibrated_seconds(ops: Sequence[OpCost], times: CalibratedTimes, *, fallback_flops_per_sec: float) -> tuple[float, float]:
    """(the kernels' seconds, the step's seconds: the kernels plus the host's idle per op) of a traced step."""
    compute, memory, kernels = _kernel_parts(ops, times.matmul, fallback_flops_per_sec, times.bandwidth_bytes_per_sec, times.attention_flops_per_sec)
    gpu = compute + times.memory_factor * memory + times.sec_per_kernel * kernels
    return float(gpu), float(gpu + times.idle_sec_per_op * len(ops))


#: traced ops the calibration's dense steps never run, and what the model does with them: a command's answer says so
#: (the H200 record's mixture-of-experts steps, judged by their step-time-calibrated claims, are where it is tested)
_OUTSIDE_CALIBRATION = {
    "_grouped_mm": ("grouped GEMM calls", "experts grouped by expert; priced at the best matmul rate: no dense step ran one"),
    "nonzero": ("ops that wait for the device", "a routing's nonzero: the host stalls; not modelled"),
    "is_nonzero": ("ops that wait for the device", "a routing's nonzero: the host stalls; not modelled"),
}


def outside_calibration(ops: Iterable[OpCost], *, experts: bool = False) -> list[str]:
    """What of a traced step lies outside the calibration steps' kind, as ``"grouped GEMM calls ×24 (…)"`` lines (none
    for a dense step): the model prices such ops, but no step it was fitted on had them. ``experts``: the step is a
    mixture of experts (its routing and experts traced as other ops: transformers' fallback runs a matmul per expert)."""
    counts: dict[tuple[str, str], int] = {}
    for op in ops:
        name = op.op.split(".")[1] if op.op.startswith("aten.") else op.op
        if (what := _OUTSIDE_CALIBRATION.get(name)) is not None:
            counts[what] = counts.get(what, 0) + 1
    lines = [f"{noun} ×{count:,} ({note})" for (noun, note), count in counts.items()]
    if experts and not lines:
        lines.append("a mixture of experts' routing and experts (the model was fitted on dense steps only)")
    return lines
