"""Measuring napkin math from independent ground truth.

Napkin math is arithmetic, so its "measurement" is the same arithmetic done from facts that do
not come from the formula under test:

- FLOPs per token per parameter: counted by ``FlopCounterMode`` over a real forward + backward
  of a linear layer whose input needs a gradient (a hidden layer of any deep network): 6.
- seconds in a day or a week: ``datetime.timedelta``;
- peaks and HBM capacity: the datasheet table, read raw;
- bytes per parameter of a training recipe: storages of real parameters, gradients and AdamW
  state after one real optimizer step.

resacct's napkin functions are the predictions.
"""

from __future__ import annotations

import functools
from datetime import timedelta

import torch
from jaxtyping import Shaped
from torch.utils.flop_counter import FlopCounterMode

from resacct.checks.hardware import raw_memory_bytes, raw_peak_flops_per_sec
from resacct.errors import UnknownNameError
from resacct.facts.hardware import get_accelerator, peak_flops_per_sec
from resacct.harness.registry import Outcome, check
from resacct.formulas.napkin import (
    SECONDS_PER_DAY,
    cluster_flops,
    compare_to_thresholds,
    flops_per_day,
    max_parameters,
    training_days,
    training_flops,
)

Number = float | int


@functools.cache
def measured_flops_per_token_per_parameter() -> float:
    """Forward + backward FLOPs of ``x @ w`` (x: tokens × d_in, needing its gradient; w: d_in ×
    d_out) per token per weight, counted by FlopCounterMode: 2 forward + 2 (∂w) + 2 (∂x)."""
    tokens, d_in, d_out = 8, 32, 16
    x = torch.randn(tokens, d_in, requires_grad=True)
    w = torch.randn(d_in, d_out, requires_grad=True)
    with FlopCounterMode(display=False) as counter:
        (x @ w).sum().backward()
    return counter.get_total_flops() / (tokens * w.numel())


def seconds_in(**duration: Number) -> float:
    """Seconds of a duration given as ``timedelta`` keywords (``days=1``, ``weeks=2``)."""
    return timedelta(**duration).total_seconds()


def _storage_bytes(tensors: list[Shaped[torch.Tensor, "..."]]) -> int:
    return sum(tensor.untyped_storage().nbytes() for tensor in tensors)


def _adam_state(optimizer: torch.optim.Optimizer, parameters: list[Shaped[torch.Tensor, "..."]]) -> list[torch.Tensor]:
    """AdamW's per-parameter state tensors (first and second moments), not its scalar step."""
    return [value for p in parameters for value in optimizer.state[p].values() if torch.is_tensor(value) and value.shape == p.shape]


def _fp32_adamw_tensors() -> tuple[list[torch.Tensor], int]:
    model = torch.nn.Linear(16, 8)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 16)).sum().backward()
    optimizer.step()
    parameters = list(model.parameters())
    held = parameters + [p.grad for p in parameters] + _adam_state(optimizer, parameters)
    return held, sum(p.numel() for p in parameters)


def _bf16_mixed_adamw_tensors() -> tuple[list[torch.Tensor], int]:
    """bf16 weights and gradients for compute, fp32 master weights and AdamW moments for the
    update (the fp32 copy of each gradient exists only during the step)."""
    model = torch.nn.Linear(16, 8).to(torch.bfloat16)
    working = list(model.parameters())
    master = [p.detach().float().clone().requires_grad_(True) for p in working]
    optimizer = torch.optim.AdamW(master)
    model(torch.randn(4, 16, dtype=torch.bfloat16)).sum().backward()
    for fp32, bf16 in zip(master, working):
        fp32.grad = bf16.grad.float()
    optimizer.step()
    for fp32, bf16 in zip(master, working):
        fp32.grad = None
        with torch.no_grad():
            bf16.copy_(fp32)
    held = working + [p.grad for p in working] + master + _adam_state(optimizer, master)
    return held, sum(p.numel() for p in working)


_RECIPES = {"fp32_adamw": _fp32_adamw_tensors, "bf16_mixed_adamw": _bf16_mixed_adamw_tensors}


def measured_bytes_per_parameter(recipe: str) -> float:
    """Bytes held per parameter after one real AdamW step under ``recipe`` (activations excluded)."""
    if recipe not in _RECIPES:
        raise UnknownNameError("training recipe", recipe, list(_RECIPES))
    held, parameters = _RECIPES[recipe]()
    return _storage_bytes(held) / parameters


@check("napkin.flops_per_token_per_parameter", evidence="measured")
def flops_per_token_per_parameter() -> Outcome:
    """Training FLOPs per token per parameter, counted by FlopCounterMode (forward + backward)."""
    from resacct.formulas.napkin import TRAINING_FLOPS_PER_TOKEN_PER_PARAMETER

    return Outcome(measured=measured_flops_per_token_per_parameter(), predicted=TRAINING_FLOPS_PER_TOKEN_PER_PARAMETER)


@check("napkin.training_flops", evidence="measured", quantities=("flops_per_token_per_parameter",))
def total_training_flops(parameters: Number, tokens: Number) -> Outcome:
    """Training FLOPs of N parameters over D tokens: counted FLOPs per token per parameter × N × D."""
    per = measured_flops_per_token_per_parameter()
    return Outcome(measured=per * parameters * tokens, predicted=training_flops(parameters, tokens),
                   quantities={"flops_per_token_per_parameter": per})


@check("napkin.flops_per_day", evidence="arithmetic", quantities=("peak_flops_per_sec", "seconds_per_day"))
def cluster_flops_per_day(devices: int, device: str, dtype: str, mfu: Number, sparse: bool = False) -> Outcome:
    """FLOPs ``devices`` boards do in a day at ``mfu``: datasheet peak × MFU × devices × timedelta(days=1)."""
    peak, day = raw_peak_flops_per_sec(device, dtype, sparse), seconds_in(days=1)
    return Outcome(
        measured=peak * mfu * devices * day,
        predicted=flops_per_day(devices, peak_flops_per_sec(device, dtype, sparse=sparse), mfu),
        quantities={"peak_flops_per_sec": peak, "seconds_per_day": day},
    )


@check("napkin.training_days", evidence="measured", quantities=("training_flops", "peak_flops_per_sec", "seconds_per_day"))
def days_to_train(parameters: Number, tokens: Number, devices: int, device: str, dtype: str, mfu: Number, sparse: bool = False) -> Outcome:
    """Days to train: counted FLOPs/token/parameter × N × D ÷ (datasheet peak × MFU × devices ×
    timedelta(days=1))."""
    total = measured_flops_per_token_per_parameter() * parameters * tokens
    peak, day = raw_peak_flops_per_sec(device, dtype, sparse), seconds_in(days=1)
    predicted = training_days(training_flops(parameters, tokens), devices, peak_flops_per_sec(device, dtype, sparse=sparse), mfu)
    return Outcome(measured=total / (peak * mfu * devices * day), predicted=predicted,
                   quantities={"training_flops": total, "peak_flops_per_sec": peak, "seconds_per_day": day})


@check("napkin.cluster_flops", evidence="arithmetic", quantities=("seconds", "peak_flops_per_sec"))
def flops_over_weeks(devices: int, weeks: Number, device: str, dtype: str, sparse: bool = False, mfu: Number = 1.0) -> Outcome:
    """FLOPs ``devices`` boards do in ``weeks``: devices × timedelta(weeks=…) seconds × datasheet peak × MFU."""
    seconds, peak = seconds_in(weeks=weeks), raw_peak_flops_per_sec(device, dtype, sparse)
    predicted = cluster_flops(devices, weeks * 7 * SECONDS_PER_DAY, peak_flops_per_sec(device, dtype, sparse=sparse), mfu)
    return Outcome(measured=devices * seconds * peak * mfu, predicted=predicted, quantities={"seconds": seconds, "peak_flops_per_sec": peak})


@check("napkin.bytes_per_parameter", evidence="measured")
def bytes_per_parameter(recipe: str) -> Outcome:
    """Bytes held per parameter after one real AdamW step (parameters, gradients, master weights,
    moments — summed from their storages)."""
    return Outcome(measured=measured_bytes_per_parameter(recipe))


@check("napkin.max_parameters", evidence="measured", quantities=("measured_bytes_per_parameter", "memory_bytes_per_device"))
def largest_model(devices: int, device: str, recipe: str, bytes_per_parameter: Number) -> Outcome:
    """Largest model whose training state fits: devices × datasheet HBM ÷ bytes per parameter
    measured for ``recipe``. resacct predicts with the stated ``bytes_per_parameter``."""
    memory, per = raw_memory_bytes(device), measured_bytes_per_parameter(recipe)
    predicted = max_parameters(devices, get_accelerator(device).memory_bytes, bytes_per_parameter)
    return Outcome(measured=devices * memory / per, predicted=predicted,
                   quantities={"measured_bytes_per_parameter": per, "memory_bytes_per_device": memory})


@check("napkin.threshold_ratio", evidence="measured", quantities=("training_flops",))
def threshold_ratio(parameters: Number, tokens: Number, threshold: str, threshold_flops: Number) -> Outcome:
    """A run's training FLOPs (counted per token per parameter × N × D) ÷ the threshold as the
    source states it; resacct predicts with its own threshold table."""
    total = measured_flops_per_token_per_parameter() * parameters * tokens
    comparisons = {comparison.threshold.key: comparison for comparison in compare_to_thresholds(training_flops(parameters, tokens))}
    if threshold not in comparisons:
        raise UnknownNameError("compute threshold", threshold, list(comparisons))
    return Outcome(measured=total / threshold_flops, predicted=comparisons[threshold].ratio, quantities={"training_flops": total})
