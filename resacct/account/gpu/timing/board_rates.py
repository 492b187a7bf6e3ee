"""A board's rates for the GPU step time (:mod:`resacct.account.gpu.timing.step_time`): the most matmul FLOP/s in the
step's format, the memory bandwidth, the host's seconds per op — measured where a committed record has the board,
else the datasheet's — and a :class:`~resacct.account.gpu.answers.device_answer.GpuStepAnswer` given its step time.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from typing import Any

from resacct.errors import ResacctError

__all__ = ["TIMED_FORMATS", "board_rates", "step_seconds", "with_step_time", "with_decode_time"]

TIMED_FORMATS = ("fp32", "bf16", "fp16")  # the formats a step's matmuls are timed in (facts.hardware.peak_format's names)
_H100_CALIBRATION_STEP = "gpt-tiny"  # the record's host-bound step: the per-op overhead (docs/gpu.md, "Step time")


def with_step_time(answer: Any, ops: list[Any], board: Any, fmt: str) -> Any:
    """``answer`` (a :class:`~resacct.account.gpu.answers.device_answer.GpuStepAnswer`) with the step time of ``ops`` (the same
    pass's aten ops) on ``board``, its matmuls in ``fmt`` (:func:`step_seconds`); where the board has no peak in ``fmt``
    (a V100 has no bf16) the peaks stand and the reason takes the time's place. MFU: the ops' FLOPs ÷ that time ÷ the
    datasheet's dense peak in ``fmt``."""
    try:
        step_sec, detail = step_seconds(ops, board, fmt, experts=answer.experts is not None)
    except ResacctError as error:
        return replace(answer, step_time_basis=str(error))
    from resacct.facts.hardware import peak_flops_per_sec

    try:
        peak: float | None = peak_flops_per_sec(board, fmt)
    except ResacctError:  # a record measured a format the datasheet table gives no peak for: the time stands, no MFU
        peak = None
    flops = sum(op.flops for op in ops)
    return replace(answer, step_sec=step_sec, mfu=flops / step_sec / peak if peak and step_sec > 0 else None, step_time_basis="; ".join(detail),
                   step_time_detail=detail)


def step_seconds(ops: list[Any], board: Any, fmt: str, *, experts: bool = False) -> tuple[float, tuple[str, ...]]:
    """The predicted seconds of a traced step's ``ops`` on ``board`` (matmuls in ``fmt``) and what they rest on, as the
    lines a command prints under its time (``--json``'s ``step_time_basis``: them joined by "; "): where the
    board's newest record carries a calibration, or a board of its compute capability does (moved to it by the
    datasheets' ratios: :func:`~resacct.account.gpu.records.record_calibration.calibration_for`), the
    per-op model fitted on its dense steps — its matmuls per class, its other kernels' bandwidth factor and time per
    kernel, the host's idle time per op — with the per-op roofline on the record's ceilings beside it; else that
    roofline (:func:`board_rates`: the record's ceilings, else the datasheet's). ResacctError: no rate in ``fmt``.
    Under the calibrated model, a line for each kind of op no calibration step ran, or for a mixture of experts
    (``experts``) — :func:`~resacct.account.gpu.timing.step_time_calibrated.outside_calibration`."""
    from resacct.account.gpu.records.record_calibration import calibration_for
    from resacct.account.gpu.timing.step_time import predict_step_seconds
    from resacct.account.gpu.timing.step_time_calibrated import outside_calibration, predict_calibrated_seconds

    rates = board_rates(board, fmt)
    roofline = predict_step_seconds(ops, rates)
    calibration = calibration_for(board)
    if calibration is None:
        return roofline.step_sec, (f"by the per-op roofline over {roofline.ops:,} ops, bound by the {roofline.bound}", f"rates: {rates.source}")
    fallback = calibration.matmul_flops_per_sec.get(fmt, rates.matmul_flops_per_sec)
    kernels_sec, step_sec = predict_calibrated_seconds(ops, calibration.times, fallback_flops_per_sec=fallback)
    outside = tuple(f"outside what it was fitted on: {what} — the record's mixture-of-experts steps test the model there: `resacct verify "
                    f"--area gpu_recorded -k mixtral-small` (docs/gpu.md)" for what in outside_calibration(ops, experts=experts))
    return step_sec, (f"= the kernels {kernels_sec * 1e3:.3g} ms + the host's idle {calibration.times.idle_sec_per_op * 1e6:.2g} µs × {len(ops):,} ops",
                      f"by {calibration.source()}", *outside,
                      f"beside it, the per-op roofline on the record's ceilings: {roofline.step_sec * 1e3:.3g} ms, bound by the {roofline.bound}; "
                      f"{rates.source}")


def with_decode_time(answer: Any, decode_ops: list[Any], board: Any, fmt: str, *, read_bytes: int) -> Any:
    """``answer`` (infer's prefill on ``board``) with one generated token's predicted time
    (:func:`~resacct.account.gpu.timing.step_time.predict_decode_seconds`: the weights and the KV cache, ``read_bytes``, read
    once; the traced decode forward's FLOPs and its ops on the host), and what the board's record measured of served models'
    tokens in ``fmt`` (:func:`~resacct.account.gpu.records.recorded_serving.recorded_decode_line`). Where the board has no
    rate in ``fmt``: unchanged."""
    from resacct.account.gpu.timing.step_time import predict_decode_seconds

    try:
        rates = board_rates(board, fmt)
    except ResacctError:
        return answer
    from resacct.account.gpu.records.recorded_serving import recorded_decode_line

    decode = predict_decode_seconds(decode_ops, rates, read_bytes=read_bytes)
    detail = (f"bound by the {decode.bound}, the longest of: reads the weights and the KV cache, {read_bytes:,} bytes, "
              f"{decode.memory_sec * 1e3:.3g} ms; its {decode.ops:,} ops on the host, {decode.host_sec * 1e3:.3g} ms; its FLOPs, "
              f"{decode.compute_sec * 1e3:.3g} ms", "a forward of one token a sequence, traced on meta; eager PyTorch, no CUDA graphs",
              f"rates: {rates.source}")
    return replace(answer, decode_sec_per_token=decode.token_sec, decode_recorded=recorded_decode_line(board, fmt), decode_basis="; ".join(detail),
                   decode_detail=detail)


def board_rates(board: Any, fmt: str) -> Any:
    """The :class:`~resacct.account.gpu.timing.step_time.BoardRates` of ``board`` for a step whose matmuls run in ``fmt``
    (``fp32``, ``bf16`` or ``fp16``). A board with a committed record (:func:`~resacct.account.gpu.records.board_record.board_ceilings`,
    the newest): its measured ceilings — the most matmul FLOP/s in ``fmt`` over the recorder's sweep (fp32 with TF32 off),
    the copy bandwidth, a kernel launch's seconds per op. Else the H100 record of round three: its measured fp32/bf16
    matmul rates and the per-op host overhead calibrated on its gpt-tiny step; elsewhere — and for fp16, which it did
    not measure — the datasheet's dense peak × 0.7 and the same overhead (the host, not the board, issues the ops).
    Bandwidth there: the datasheet × 0.8 (assumed). A board without a peak in ``fmt`` (a V100 has no bf16): ResacctError."""
    from resacct.account.gpu.records.board_record import board_ceilings
    from resacct.account.gpu.records.recorded import H100_RECORD, RECORDS_BY_FAMILY, load_gpu_record, recorded_step, recorded_value
    from resacct.account.gpu.timing.step_time import BANDWIDTH_EFFICIENCY, DATASHEET_MATMUL_EFFICIENCY, BoardRates
    from resacct.facts.hardware import get_accelerator, peak_flops_per_sec

    if fmt not in TIMED_FORMATS:
        raise ResacctError(f"format {fmt!r}: expected one of {', '.join(TIMED_FORMATS)}")
    measured = board_ceilings(board)
    if measured is not None and fmt in measured.matmul_flops_per_sec and measured.copy_bandwidth_bytes_per_sec and measured.launch_sec:
        rate = measured.matmul_flops_per_sec[fmt]
        return BoardRates(rate, measured.copy_bandwidth_bytes_per_sec, measured.launch_sec,
                          f"measured in record {measured.record_file} ({measured.when[:10]}): {fmt} matmul {rate / 1e12:.1f} TFLOP/s (the most "
                          f"over its sweep), copy {measured.copy_bandwidth_bytes_per_sec / 1e12:.2f} TB/s, {measured.launch_sec * 1e6:.1f} µs "
                          "per op (a kernel launch)")
    record = load_gpu_record(H100_RECORD)
    h100 = get_accelerator("h100-sxm")
    fp32_rate = recorded_value(H100_RECORD, record, "gpu_claims", "fp32-matmul-mfu-good-h100", "achieved_flops_per_sec")
    calibration = recorded_step(H100_RECORD, record, _H100_CALIBRATION_STEP)
    overhead = _calibrated_overhead(tuple(sorted(calibration["config"].items())), calibration["batch"], calibration["seq"], calibration["step_sec"],
                                    fp32_rate, h100.memory_bandwidth_bytes_per_sec * BANDWIDTH_EFFICIENCY)
    bandwidth = board.memory_bandwidth_bytes_per_sec * BANDWIDTH_EFFICIENCY
    if board.name in RECORDS_BY_FAMILY and fmt in ("fp32", "bf16"):
        claim = "fp32-matmul-mfu-good-h100" if fmt == "fp32" else "bf16-matmul-mfu-above-half-h100"
        rate = recorded_value(H100_RECORD, record, "gpu_claims", claim, "achieved_flops_per_sec")
        source = (f"{fmt} matmul {rate / 1e12:.1f} TFLOP/s measured in record {H100_RECORD}; bandwidth {BANDWIDTH_EFFICIENCY} × datasheet "
                  f"(assumed); {overhead * 1e6:.1f} µs per op calibrated on its {_H100_CALIBRATION_STEP} step")
    else:
        peak = peak_flops_per_sec(board, fmt)
        rate = peak * DATASHEET_MATMUL_EFFICIENCY
        recorded = (f"record {measured.record_file} measured no {fmt} matmul" if measured is not None
                    else "its record measured no fp16 matmul" if board.name in RECORDS_BY_FAMILY else f"no record for {board.name}")
        source = (f"{recorded}: {fmt} matmul {DATASHEET_MATMUL_EFFICIENCY} × the datasheet's {peak / 1e12:g} TFLOP/s, bandwidth "
                  f"{BANDWIDTH_EFFICIENCY} × the datasheet's, {overhead * 1e6:.1f} µs per op from the H100 record's {_H100_CALIBRATION_STEP} step")
    return BoardRates(rate, bandwidth, overhead, source)


@lru_cache(maxsize=2)
def _calibrated_overhead(config: tuple, batch: int, seq: int, step_sec: float, matmul_flops_per_sec: float, bandwidth_bytes_per_sec: float) -> float:
    from resacct.account.gpu.timing.step_time import calibrate_overhead

    return calibrate_overhead(_gpt_ops(dict(config), batch, seq), step_sec, matmul_flops_per_sec, bandwidth_bytes_per_sec)


def _gpt_ops(config: dict[str, Any], batch: int, seq: int) -> list:
    import torch

    from resacct.account.gpu.timing.step_time import trace_step_ops
    from resacct.measurement.activation_checkpointing import gpt_loss
    from resacct.training.gpt import GPTConfig, build_gpt

    tokens = torch.zeros(batch, seq, dtype=torch.long)
    return trace_step_ops(build_gpt(GPTConfig(**config), device="meta", seed=None), (tokens, tokens), lambda m, b: gpt_loss(m, *b))
