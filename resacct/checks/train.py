"""Measuring the training loop with torch: zero_grad, loop order, gradient accumulation, the
learning-rate schedule, clipping. The mixed-precision checks (autocast dtypes, loss scaling) are
in :mod:`resacct.checks.train_precision`, re-exported here."""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
from torch import nn

from resacct.harness.registry import Outcome, check
from resacct.training.models import Cruncher
from resacct.training.train import clipped_grad_norm, cosine_lr, global_grad_norm
from resacct.checks._train_models import _cruncher, _saved_activation_bytes
from resacct.checks.train_precision import (  # noqa: F401  (re-exported: they were defined here)
    training_dtypes,
    measured_persistent_bytes_per_parameter,
    saved_bytes_ratio,
    cuda_amp_entry_point,
    fp16_gradient_kept_fraction,
    grad_scaler_dynamics,
)

__all__: list[str] = []


def _regression_batches(seed: int, count: int, batch_size: int, dim: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch_size, dim, generator=generator), torch.randn(batch_size, 1, generator=generator)) for _ in range(count)]


# --- zero_grad -----------------------------------------------------------------------------


@check("train.zero_grad_frees", evidence="measured", quantities=("grads_none",))
def zero_grad_frees(mode: str) -> Outcome:
    """After a backward pass, call ``optimizer.zero_grad(...)`` (``mode``: ``set_to_none`` →
    ``set_to_none=True``, ``zeros`` → ``set_to_none=False``, ``default`` → no argument) and
    measure the fraction of gradient tensors that are freed (their weak references die: the
    last reference is gone, so the memory is back with the allocator)."""
    model = _cruncher(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    (x, y), = _regression_batches(0, 1, 4, 8)
    F.mse_loss(model(x), y).backward()
    references = [weakref.ref(parameter.grad) for parameter in model.parameters()]
    if mode == "set_to_none":
        optimizer.zero_grad(set_to_none=True)
    elif mode == "zeros":
        optimizer.zero_grad(set_to_none=False)
    elif mode == "default":
        optimizer.zero_grad()
    else:
        raise ValueError(f"mode {mode!r}: expected set_to_none, zeros or default")
    freed = sum(reference() is None for reference in references) / len(references)
    grads_none = all(parameter.grad is None for parameter in model.parameters())
    return Outcome(measured=freed, quantities={"grads_none": grads_none})


# --- loop order ----------------------------------------------------------------------------


def _run_loop(order: str, steps: int, seed: int) -> list[torch.Tensor]:
    model = _cruncher(seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for x, y in _regression_batches(seed + 1, steps, 4, 8):
        if order == "zero_grad_first":  # seed 001
            optimizer.zero_grad(set_to_none=True)
            F.mse_loss(model(x), y).backward()
            optimizer.step()
        elif order == "step_then_zero_grad":  # seed 003
            F.mse_loss(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        elif order == "no_zero_grad":
            F.mse_loss(model(x), y).backward()
            optimizer.step()
        else:
            raise ValueError(f"order {order!r}: expected zero_grad_first, step_then_zero_grad or no_zero_grad")
    return [parameter.detach().clone() for parameter in model.parameters()]


@check("train.loop_order_same_parameters", evidence="measured")
def loop_order_same_parameters(order: str, steps: int = 5, seed: int = 0) -> Outcome:
    """Train a Cruncher with SGD+momentum for ``steps`` steps with the loop ``order`` and with the
    lecture-001 order (zero_grad, backward, step); measure whether every parameter ends
    bit-identical (``torch.equal``)."""
    reference = _run_loop("zero_grad_first", steps, seed)
    other = _run_loop(order, steps, seed)
    return Outcome(measured=all(torch.equal(a, b) for a, b in zip(reference, other)))


# --- gradient accumulation -----------------------------------------------------------------


def _gradients(model: nn.Module) -> list[torch.Tensor]:
    return [parameter.grad.detach().clone() for parameter in model.parameters()]  # type: ignore[union-attr]


@check("train.accumulated_gradient_difference", evidence="measured")
def accumulated_gradient_difference(micro_batches: int, micro_batch_size: int, seed: int = 0, dim: int = 8) -> Outcome:
    """Largest relative difference between the gradients of one batch of
    ``micro_batches × micro_batch_size`` rows (mean loss) and the gradients accumulated over the
    micro-batches, each loss divided by ``micro_batches``: ``max |g_acc − g| / max |g|``."""
    model = _cruncher(seed, dim=dim)
    (x, y), = _regression_batches(seed, 1, micro_batches * micro_batch_size, dim)
    F.mse_loss(model(x), y).backward()
    large = _gradients(model)
    model.zero_grad(set_to_none=True)
    for x_micro, y_micro in zip(x.split(micro_batch_size), y.split(micro_batch_size)):
        (F.mse_loss(model(x_micro), y_micro) / micro_batches).backward()
    accumulated = _gradients(model)
    scale = max(float(g.abs().max()) for g in large)
    difference = max(float((a - g).abs().max()) for a, g in zip(accumulated, large))
    return Outcome(measured=difference / scale)


@check("train.micro_batch_activation_fraction", evidence="measured")
def micro_batch_activation_fraction(micro_batches: int, micro_batch_size: int, dim: int = 16, num_layers: int = 3) -> Outcome:
    """Bytes autograd saves for backward (``saved_tensors_hooks``, parameters excluded) for one
    micro-batch, divided by those for the whole ``micro_batches × micro_batch_size`` batch."""
    model = _cruncher(0, dim=dim, num_layers=num_layers)
    whole = torch.randn(micro_batches * micro_batch_size, dim)
    micro = whole[:micro_batch_size].clone()  # a slice would keep the whole batch's storage
    return Outcome(measured=_saved_activation_bytes(model, micro) / _saved_activation_bytes(model, whole))


# --- learning-rate schedule ----------------------------------------------------------------


def _torch_warmup_cosine(max_lr: float, min_lr: float, warmup_steps: int, total_steps: int) -> list[float]:
    """The learning rate torch's ``LinearLR`` (from ~0) → ``CosineAnnealingLR`` sets at steps 0 … total."""
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=max_lr)
    schedulers: list[torch.optim.lr_scheduler.LRScheduler] = []
    if warmup_steps:
        schedulers.append(torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=1e-12, end_factor=1.0, total_iters=warmup_steps))
    schedulers.append(torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_steps - warmup_steps, eta_min=min_lr))
    schedule = schedulers[0] if len(schedulers) == 1 else torch.optim.lr_scheduler.SequentialLR(optimizer, schedulers, milestones=[warmup_steps])
    learning_rates = []
    for _ in range(total_steps + 1):
        learning_rates.append(float(optimizer.param_groups[0]["lr"]))
        optimizer.step()
        schedule.step()
    return learning_rates


@check("train.warmup_cosine_endpoints", evidence="measured")
def warmup_cosine_endpoints(max_lr: float, min_lr: float, warmup_steps: int, total_steps: int) -> Outcome:
    """Torch's warm-up + cosine learning rate at step 0, at the end of warm-up and at the last
    step; resacct's :func:`cosine_lr` predicts them."""
    torch_rates = _torch_warmup_cosine(max_lr, min_lr, warmup_steps, total_steps)
    points = (0, warmup_steps, total_steps)
    return Outcome(
        measured=[torch_rates[step] for step in points],
        predicted=[cosine_lr(step, max_lr, min_lr, warmup_steps, total_steps) for step in points],
    )


@check("train.warmup_cosine_largest_deviation", evidence="measured")
def warmup_cosine_largest_deviation(max_lr: float, min_lr_fraction: float, warmup_steps: int, decay_steps: int) -> Outcome:
    """Largest |torch − resacct| learning rate over every step of a warm-up + cosine schedule
    (``min_lr = min_lr_fraction · max_lr``, ``total = warmup + decay``)."""
    total_steps = warmup_steps + decay_steps
    min_lr = min_lr_fraction * max_lr
    torch_rates = _torch_warmup_cosine(max_lr, min_lr, warmup_steps, total_steps)
    return Outcome(measured=max(abs(rate - cosine_lr(step, max_lr, min_lr, warmup_steps, total_steps)) for step, rate in enumerate(torch_rates)))


# --- clipping ------------------------------------------------------------------------------


def _model_with_gradients(seed: int, gradient_scale: float) -> Cruncher:
    model = _cruncher(seed)
    (x, y), = _regression_batches(seed, 1, 4, 8)
    (gradient_scale * F.mse_loss(model(x), y)).backward()
    return model


def _torch_total_norm(model: nn.Module) -> float:
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in model.parameters()])))  # type: ignore[arg-type]


@check("train.clipped_norm_fraction", evidence="measured", quantities=("norm_before",))
def clipped_norm_fraction(max_norm: float, gradient_scale: float, seed: int = 0) -> Outcome:
    """Global gradient norm after ``clip_grad_norm_(parameters, max_norm)``, measured with
    ``torch.linalg.vector_norm`` and divided by ``max_norm``; the norm before is a quantity."""
    model = _model_with_gradients(seed, gradient_scale)
    before = _torch_total_norm(model)
    predicted_after = clipped_grad_norm(global_grad_norm(model.parameters()), max_norm)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    return Outcome(
        measured=_torch_total_norm(model) / max_norm,
        predicted=predicted_after / max_norm,
        quantities={"norm_before": before},
    )


@check("train.clip_return_value", evidence="measured", quantities=("norm_before", "norm_after"))
def clip_return_value(max_norm: float, gradient_scale: float, seed: int = 0) -> Outcome:
    """What ``clip_grad_norm_`` returns; the global norms before and after clipping (measured
    with ``torch.linalg.vector_norm``) are quantities. resacct predicts the norm before."""
    model = _model_with_gradients(seed, gradient_scale)
    before = _torch_total_norm(model)
    predicted = global_grad_norm(model.parameters())
    returned = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))
    return Outcome(measured=returned, predicted=predicted, quantities={"norm_before": before, "norm_after": _torch_total_norm(model)})


@check("train.clip_below_threshold_untouched", evidence="measured")
def clip_below_threshold_untouched(seed: int = 0) -> Outcome:
    """Whether ``clip_grad_norm_`` leaves gradients bit-identical when their norm is half of
    ``max_norm``."""
    model = _model_with_gradients(seed, 1.0)
    before = _gradients(model)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 2 * _torch_total_norm(model))
    return Outcome(measured=all(torch.equal(a, b) for a, b in zip(before, _gradients(model))), predicted=True)
