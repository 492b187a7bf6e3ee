"""Recorded GPU truth replayed on any machine (issue 31): evidence ``recorded``.

Each check reads its **measurement** from a committed GPU record (``docs/gpu/*.json``, named by the
claim's ``record``: :mod:`resacct.account.gpu.records.recorded`) and makes its **prediction** now, with
resacct's code (the CUDA caching allocator model, :func:`predict_cuda_step_memory` over meta
tensors, the FLOP formulas, the datasheet table); the claim's law comes from the YAML. No ``gpu``
mark: they run on every CPU machine. A missing or malformed record fails the claim naming the file.
Every outcome names the board, the date and the record file (``board``, ``recorded_on``, ``record_file``).
``replay=record_contents``: ``resacct verify`` may replay a stored outcome on the same setup, its key holding the sha256 of
the record file too (a record may be named by an absolute path outside resacct's files, which the setup's fingerprint
does not hash; :mod:`resacct.harness.replay`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from resacct.account.gpu.allocator.cuda_allocator import CachingAllocatorModel
from resacct.account.gpu.tracing.cuda_step import predict_cuda_step_memory
from resacct.account.gpu.records.recorded import load_gpu_record, record_contents, record_source, recorded_step, recorded_value
from resacct.errors import ResacctError
from resacct.harness.registry import NotMeasurable, Outcome, check
from resacct.measurement.memo import shared_measurement

SOURCE = ("board", "recorded_on", "record_file")


def _gpt_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    from resacct.measurement.activation_checkpointing import gpt_loss

    return gpt_loss(model, *batch)


@check("gpu_recorded.allocation_growth", evidence="recorded", quantities=("allocator_model_bytes", *SOURCE), replay=record_contents)
def allocation_growth(record: str, claim: str, sizes_bytes: list[int]) -> Outcome:
    """The growth of ``memory_allocated()`` the record's ``claim`` measured on the board, beside the
    allocator model's growth for the same requests (``sizes_bytes``, one allocation each, in order)."""
    data = load_gpu_record(record)
    measured = recorded_value(record, data, "gpu_claims", claim)
    model = CachingAllocatorModel()
    for index, size in enumerate(sizes_bytes):
        model.malloc(index, int(size))
    grown = model.allocated_bytes
    return Outcome(measured=measured, predicted=grown, quantities={"allocator_model_bytes": grown, **record_source(record, data)})


def _predicted_step(config: tuple[tuple[str, Any], ...], batch: int, seq: int, optimizer: bool) -> tuple[int, int]:
    """(peak allocated above the start, peak reserved) that :func:`predict_cuda_step_memory` predicts for
    a GPT of ``config`` (its fields) on meta: forward and backward, and with ``optimizer`` CUDA's foreach
    AdamW step."""
    return _traced_cuda_step(config, batch, seq, optimizer)[:2]


@shared_measurement
def _traced_cuda_step(config: tuple[tuple[str, Any], ...], batch: int, seq: int, optimizer: bool) -> tuple[int, int, list]:
    """:func:`_predicted_step`'s peaks and, with ``optimizer``, the step's aten ops with their FLOPs and
    bytes (:func:`~resacct.account.gpu.timing.step_time.trace_step_ops`'s, for the step time), from one pass of
    the step: the step-peak and step-time claims of one recorded step trace it once (issue 34)."""
    from resacct.training.gpt import GPTConfig, build_gpt

    net = build_gpt(GPTConfig(**dict(config)), device="meta", seed=None)
    tokens = torch.zeros(batch, seq, dtype=torch.long)
    ops: list = []
    predicted = predict_cuda_step_memory(net, (tokens, tokens), _gpt_loss, *(() if optimizer else (None,)), ops=ops if optimizer else None)
    return predicted.peak_above_start_bytes, predicted.peak_reserved_bytes, ops


def _fields(config: Any) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(vars(config).items()))


@check("gpu_recorded.forward_backward_peak", evidence="recorded", quantities=("allocator_model_bytes", *SOURCE), replay=record_contents)
def forward_backward_peak(record: str, claim: str, model: str, batch: int, seq: int) -> Outcome:
    """``max_memory_allocated`` above the parameters over a float32 GPT forward + backward, as the
    record's ``claim`` measured it, beside :func:`predict_cuda_step_memory` (no optimizer) now."""
    from resacct.training.gpt import get_gpt_config

    data = load_gpu_record(record)
    measured = recorded_value(record, data, "gpu_claims", claim)
    predicted = _predicted_step(_fields(get_gpt_config(model)), batch, seq, False)[0]
    return Outcome(measured=measured, predicted=predicted, quantities={"allocator_model_bytes": predicted, **record_source(record, data)})


def _recorded_gpt(record: str, data: dict[str, Any], step: str) -> tuple[dict[str, Any], nn.Module]:
    from resacct.training.gpt import GPTConfig, build_gpt

    entry = recorded_step(record, data, step)
    if (entry["recipe"], entry["optimizer"], entry["attention"]) != ("fp32", "adamw", "math"):
        raise ResacctError(f"GPU record {record}: step {step!r} is recipe {entry['recipe']!r}, optimizer {entry['optimizer']!r}, attention "
                           f"{entry['attention']!r}; this check replays fp32 AdamW math-attention steps only")
    try:
        config = GPTConfig(**entry["config"])
    except (TypeError, ValueError) as error:
        raise ResacctError(f"GPU record {record}: step {step!r} config {entry['config']!r} is not a GPT config ({error})") from None
    return entry, build_gpt(config, device="meta", seed=None)


@check("gpu_recorded.training_step_peak", evidence="recorded", quantities=("allocator_model_bytes", "reserved_model_bytes", *SOURCE), replay=record_contents)
def training_step_peak(record: str, step: str) -> Outcome:
    """The record's ``max_memory_allocated`` above the start over a steady GPT training step
    (forward, backward, AdamW; ``resacct account --device cuda``), beside
    :func:`predict_cuda_step_memory` with CUDA's foreach AdamW, built now from the record's config."""
    data = load_gpu_record(record)
    entry, net = _recorded_gpt(record, data, step)
    peak_bytes, reserved_bytes = _predicted_step(_fields(net.config), entry["batch"], entry["seq"], True)
    return Outcome(measured=entry["peak_bytes"], predicted=peak_bytes,
                   quantities={"allocator_model_bytes": peak_bytes, "reserved_model_bytes": reserved_bytes, **record_source(record, data)})


@check("gpu_recorded.step_flops", evidence="recorded", quantities=("formula_flops", *SOURCE), replay=record_contents)
def step_flops(record: str, step: str) -> Outcome:
    """FlopCounterMode's FLOPs of the recorded GPT step on the board, beside resacct's exact
    per-matmul formula (:func:`predict_gpt_step_flops`) for the record's config, batch and seq."""
    from resacct.formulas.gpt_flop_formulas import predict_gpt_step_flops
    from resacct.training.gpt import GPTConfig

    data = load_gpu_record(record)
    entry = recorded_step(record, data, step)
    predicted = predict_gpt_step_flops(GPTConfig(**entry["config"]), entry["batch"], entry["seq"]).step_flops
    return Outcome(measured=entry["step_flops"], predicted=predicted, quantities={"formula_flops": predicted, **record_source(record, data)})


@check("gpu_recorded.total_memory_bytes", evidence="recorded", quantities=("datasheet_memory_bytes", *SOURCE), replay=record_contents)
def total_memory_bytes(record: str, claim: str) -> Outcome:
    """``torch.cuda.get_device_properties(0).total_memory`` as the record's ``claim`` measured it;
    the board's datasheet memory from resacct's table (looked up now by the record's board name)."""
    from resacct.facts.hardware import accelerator_for_cuda_name

    data = load_gpu_record(record)
    measured = recorded_value(record, data, "gpu_claims", claim, "total_memory_bytes")
    board = accelerator_for_cuda_name(data["board"])
    if board is None:
        raise ResacctError(f"GPU record {record}: board {data['board']!r} is not in resacct's datasheet table; expected a known board")
    return Outcome(measured=measured, quantities={"datasheet_memory_bytes": board.memory_bytes, **record_source(record, data)})


@check("gpu_recorded.matmul_peak_fraction", evidence="recorded", quantities=("achieved_flops_per_sec", "datasheet_peak_flops_per_sec", *SOURCE), replay=record_contents)
def matmul_peak_fraction(record: str, claim: str, dtype: str) -> Outcome:
    """The matmul FLOP/s the record's ``claim`` achieved on the board ÷ the board's dense datasheet
    peak for ``dtype`` from resacct's table now (looked up by the record's board name)."""
    from resacct.facts.hardware import accelerator_for_cuda_name, peak_flops_per_sec

    data = load_gpu_record(record)
    measured = recorded_value(record, data, "gpu_claims", claim, "achieved_flops_per_sec")
    board = accelerator_for_cuda_name(data["board"])
    if board is None:
        raise ResacctError(f"GPU record {record}: board {data['board']!r} is not in resacct's datasheet table; expected a known board")
    peak = peak_flops_per_sec(board, dtype)
    return Outcome(measured=measured / peak, quantities={"achieved_flops_per_sec": measured, "datasheet_peak_flops_per_sec": peak, **record_source(record, data)})


_STEP_TIME_QUANTITIES = ("predicted_step_sec", "gpu_sec", "host_sec", "ops", "matmul_flops_per_sec", "bandwidth_bytes_per_sec",
                         "overhead_sec_per_op", "predicted_mfu", "measured_mfu", "calibrated_on", *SOURCE)


def _gpt_ops(config: dict[str, Any], batch: int, seq: int) -> list:
    """The aten ops of a steady fp32 GPT training step with CUDA's foreach AdamW, traced on meta (shared
    with the step-peak claims of the same step: :func:`_traced_cuda_step`)."""
    from resacct.training.gpt import GPTConfig

    return _traced_cuda_step(_fields(GPTConfig(**config)), batch, seq, True)[2]  # the same key as the step peak's (every field)


def _judged_gpt_step(record: str, data: dict[str, Any], check_name: str, step: str | None, claim: str | None, model: str | None,
                     batch: int | None, seq: int | None) -> tuple[list, float]:
    """(the traced ops, the board's median seconds) of the judged fp32 GPT step: ``step`` of the record's step_time, or the
    ``claim`` of its gpu_claims for ``model``, ``batch`` × ``seq``."""
    from resacct.training.gpt import get_gpt_config

    if step is not None:
        judged = recorded_step(record, data, step)
        return _gpt_ops(judged["config"], judged["batch"], judged["seq"]), judged["step_sec"]
    if claim is None or model is None or batch is None or seq is None:
        raise ResacctError(f"{check_name}: give step, or claim with model, batch and seq")
    config = {key: value for key, value in vars(get_gpt_config(model)).items() if key != "attention"}
    return _gpt_ops(config, batch, seq), recorded_value(record, data, "gpu_claims", claim, "step_sec")


@check("gpu_recorded.step_time", evidence="recorded", quantities=_STEP_TIME_QUANTITIES, replay=record_contents)
def step_time(record: str, calibrate_on: str, step: str | None = None, claim: str | None = None, model: str | None = None,
              batch: int | None = None, seq: int | None = None) -> Outcome:
    """A recorded fp32 GPT training step's median seconds on the board (``step`` of the record's
    step_time, or the ``claim`` of its gpu_claims for ``model``, ``batch`` × ``seq``), beside the step
    time predicted now (:mod:`resacct.account.gpu.timing.step_time`): the matmul rate is the record's fp32
    matmul measurement, the bandwidth the datasheet's × 0.8, the per-op overhead calibrated on the
    record's step ``calibrate_on`` (never the judged one)."""
    from resacct.account.gpu.timing.step_time import BANDWIDTH_EFFICIENCY, BoardRates, calibrate_overhead, predict_step_seconds
    from resacct.facts.hardware import accelerator_for_cuda_name, peak_flops_per_sec

    if calibrate_on in (step, model):
        raise ResacctError(f"calibrate_on {calibrate_on!r} is the step judged; expected another recorded step")
    data = load_gpu_record(record)
    board = accelerator_for_cuda_name(data["board"])
    if board is None:
        raise ResacctError(f"GPU record {record}: board {data['board']!r} is not in resacct's datasheet table; expected a known board")
    matmul = recorded_value(record, data, "gpu_claims", "fp32-matmul-mfu-good-h100", "achieved_flops_per_sec")
    bandwidth = board.memory_bandwidth_bytes_per_sec * BANDWIDTH_EFFICIENCY
    calibration = recorded_step(record, data, calibrate_on)
    overhead = calibrate_overhead(_gpt_ops(calibration["config"], calibration["batch"], calibration["seq"]), calibration["step_sec"], matmul, bandwidth)
    ops, measured = _judged_gpt_step(record, data, "step_time", step, claim, model, batch, seq)
    predicted = predict_step_seconds(ops, BoardRates(matmul, bandwidth, overhead, f"calibrated on {calibrate_on}"))
    peak = peak_flops_per_sec(board, "fp32")
    return Outcome(measured=measured, quantities={
        "predicted_step_sec": predicted.step_sec, "gpu_sec": predicted.gpu_sec, "host_sec": predicted.host_sec, "ops": predicted.ops,
        "matmul_flops_per_sec": matmul, "bandwidth_bytes_per_sec": bandwidth, "overhead_sec_per_op": overhead,
        "predicted_mfu": predicted.flops / predicted.step_sec / peak, "measured_mfu": predicted.flops / measured / peak,
        "calibrated_on": calibrate_on, **record_source(record, data)})


_MOVED_QUANTITIES = ("predicted_step_sec", "kernels_sec", "ops", "calibration", "measured_mfu", *SOURCE)


@check("gpu_recorded.step_time_moved", evidence="recorded", quantities=_MOVED_QUANTITIES, replay=record_contents)
def step_time_moved(record: str, step: str | None = None, claim: str | None = None, model: str | None = None, batch: int | None = None,
                    seq: int | None = None) -> Outcome:
    """A recorded fp32 GPT training step's median seconds on the board (``step`` of the record's step_time, or the
    ``claim`` of its gpu_claims for ``model``, ``batch`` × ``seq``), beside the time the ``--device`` commands print for
    that board when its own record carries no calibration: the model calibrated on another board of its compute
    capability, moved to it by the datasheets' ratios
    (:func:`~resacct.account.gpu.records.record_calibration.moved_calibration`) — a second board's judgement of a
    model fitted on the first."""
    from resacct.account.gpu.records.record_calibration import moved_calibration
    from resacct.account.gpu.timing.step_time_calibrated import predict_calibrated_seconds
    from resacct.facts.hardware import accelerator_for_cuda_name, peak_flops_per_sec

    data = load_gpu_record(record)
    board = accelerator_for_cuda_name(data["board"])
    if board is None:
        raise ResacctError(f"GPU record {record}: board {data['board']!r} is not in resacct's datasheet table; expected a known board")
    calibration = moved_calibration(board)
    if calibration is None:
        raise NotMeasurable(f"no calibration of another board with {board.name}'s compute capability is committed (or {board.name} has its own)")
    ops, measured = _judged_gpt_step(record, data, "step_time_moved", step, claim, model, batch, seq)
    kernels, predicted = predict_calibrated_seconds(ops, calibration.times, fallback_flops_per_sec=calibration.matmul_flops_per_sec["fp32"])
    return Outcome(measured=measured, quantities={
        "predicted_step_sec": predicted, "kernels_sec": kernels, "ops": len(ops), "calibration": calibration.source(),
        "measured_mfu": sum(op.flops for op in ops) / measured / peak_flops_per_sec(board, "fp32"), **record_source(record, data)})


@check("gpu_recorded.saved_activation_bytes", evidence="recorded", quantities=("formula_bytes", *SOURCE), replay=record_contents)
def saved_activation_bytes(record: str, step: str) -> Outcome:
    """The bytes autograd saved for backward over the recorded GPT step's forward on the board
    (saved_tensors_hooks, by storage, on cuda), beside resacct's activation formula
    (:func:`gpt_saved_terms`, float32, math attention, ``device_type="cuda"``) for the record's config."""
    from resacct.formulas.gpt_activation_formulas import gpt_saved_terms
    from resacct.training.gpt import GPTConfig

    data = load_gpu_record(record)
    entry = recorded_step(record, data, step)
    if entry["recipe"] != "fp32" or entry["attention"] != "math":
        raise ResacctError(f"GPU record {record}: step {step!r} is {entry['recipe']!r} with {entry['attention']!r} attention; expected fp32 math")
    terms = gpt_saved_terms(GPTConfig(**entry["config"]), entry["batch"], entry["seq"], element_bytes=4, attention="math", device_type="cuda")
    predicted = sum(term.bytes for term in terms)
    return Outcome(measured=entry["saved_bytes"], predicted=predicted, quantities={"formula_bytes": predicted, **record_source(record, data)})


@check("gpu_recorded.training_state_bytes", evidence="recorded", quantities=("formula_bytes", *SOURCE), replay=record_contents)
def training_state_bytes(record: str, step: str) -> Outcome:
    """The training state at the recorded step's optimizer step on the board (parameters, gradients,
    AdamW's moments and step counters), beside :func:`predict_state_bytes` for the record's GPT now."""
    from resacct.account.load.trainable import predict_state_bytes

    data = load_gpu_record(record)
    entry, net = _recorded_gpt(record, data, step)
    predicted = predict_state_bytes(net, "fp32", "adamw", "at_step")
    return Outcome(measured=entry["state_at_step_bytes"], predicted=predicted, quantities={"formula_bytes": predicted, **record_source(record, data)})
