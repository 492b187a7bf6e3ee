"""A training loop with the production checklist of the lecture, every piece switchable.

One step: set the learning rate from the schedule, ``zero_grad(set_to_none=True)``, then for
each of ``grad_accumulation_steps`` micro-batches forward, loss / accumulation steps and
backward (under the precision recipe's autocast and loss scaler), then clip the global
gradient norm, step the optimizer, and — on their cadences — log, evaluate and checkpoint.

>>> from resacct.training.models import Cruncher
>>> _ = torch.manual_seed(0)
>>> model = Cruncher(dim=4, num_layers=1)
>>> optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
>>> batch = lambda: (torch.randn(8, 4), torch.zeros(8, 1))
>>> result = train(model, optimizer, batch, torch.nn.functional.mse_loss, steps=3, log_every=1)
>>> [record.step for record in result.records], result.final_step
([1, 2, 3], 3)
>>> cosine_lr(0, 1.0, 0.1, 10, 100), cosine_lr(10, 1.0, 0.1, 10, 100), round(cosine_lr(100, 1.0, 0.1, 10, 100), 12)
(0.0, 1.0, 0.1)
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from torch import nn

from resacct.training.checkpoint import SupportsStateDict, load_checkpoint, save_checkpoint
from resacct.errors import ResacctError
from resacct.facts.precision import RECIPES, PrecisionRecipe, autocast_for, get_recipe, grad_scaler_for

__all__ = [
    "StepRecord",
    "EvalRecord",
    "TrainResult",
    "cosine_lr",
    "cosine_schedule",
    "global_grad_norm",
    "clipped_grad_norm",
    "train",
]

Batch = tuple[Any, Any]
LossFunction = Callable[[Any, Any], Float[torch.Tensor, ""]]


@dataclass(frozen=True)
class StepRecord:
    """What the loop logs after ``step`` optimizer steps: the loss (mean over the micro-batches),
    the learning rate used, the global gradient norm before clipping (None without clipping;
    infinite when a scaled step overflowed), the loss scale after the step (None without loss
    scaling; it halves when the step was skipped) and the seconds since training started."""

    step: int
    loss: float
    learning_rate: float
    grad_norm: float | None
    loss_scale: float | None
    elapsed_seconds: float


@dataclass(frozen=True)
class EvalRecord:
    step: int
    eval_loss: float


@dataclass
class TrainResult:
    records: list[StepRecord] = field(default_factory=list)
    evaluations: list[EvalRecord] = field(default_factory=list)
    checkpoints: list[Path] = field(default_factory=list)
    start_step: int = 0
    final_step: int = 0


def cosine_lr(step: int, max_lr: float, min_lr: float, warmup_steps: int, total_steps: int) -> float:
    """Linear warm-up from 0 to ``max_lr`` over ``warmup_steps``, cosine decay to ``min_lr`` at
    ``total_steps``, then ``min_lr``:

    - ``step < warmup_steps``: ``max_lr · step / warmup_steps``
    - ``warmup_steps ≤ step ≤ total_steps``: ``min_lr + ½(1 + cos(π·(step − warmup)/(total − warmup)))·(max_lr − min_lr)``
    - ``step > total_steps``: ``min_lr``

    >>> cosine_lr(5, 1.0, 0.0, 10, 20), cosine_lr(15, 1.0, 0.0, 10, 20), cosine_lr(25, 1.0, 0.0, 10, 20)
    (0.5, 0.5, 0.0)
    """
    if step < 0:
        raise ResacctError(f"step {step}: expected ≥ 0")
    if not 0 <= warmup_steps < total_steps:
        raise ResacctError(f"warmup_steps {warmup_steps}, total_steps {total_steps}: expected 0 ≤ warmup_steps < total_steps")
    if min_lr > max_lr or min_lr < 0:
        raise ResacctError(f"min_lr {min_lr}, max_lr {max_lr}: expected 0 ≤ min_lr ≤ max_lr")
    if step < warmup_steps:
        return max_lr * step / warmup_steps
    if step > total_steps:
        return min_lr
    progress = (step - warmup_steps) / (total_steps - warmup_steps)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (max_lr - min_lr)


def cosine_schedule(max_lr: float, min_lr: float, warmup_steps: int, total_steps: int) -> Callable[[int], float]:
    """``lr_schedule`` for :func:`train`: step → :func:`cosine_lr` with these settings."""
    cosine_lr(0, max_lr, min_lr, warmup_steps, total_steps)  # validate now

    def schedule(step: int) -> float:
        return cosine_lr(step, max_lr, min_lr, warmup_steps, total_steps)

    return schedule


def _gradients(parameters: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    return [parameter.grad for parameter in parameters if parameter.grad is not None]


def global_grad_norm(parameters: Iterable[torch.Tensor]) -> float:
    """√(Σ over every gradient element of g²) — the norm that clipping bounds (in float64)."""
    return math.sqrt(sum(float(grad.double().pow(2).sum()) for grad in _gradients(parameters)))


def clipped_grad_norm(norm_before: float, max_norm: float) -> float:
    """The global norm after ``clip_grad_norm_(…, max_norm)``: unchanged below ``max_norm``,
    ``max_norm`` above it (torch divides by norm + 1e-6, so a hair under)."""
    if max_norm <= 0:
        raise ResacctError(f"max_norm {max_norm}: expected > 0")
    return norm_before if norm_before <= max_norm else max_norm * norm_before / (norm_before + 1e-6)


def _device_type(model: nn.Module) -> str:
    for parameter in model.parameters():
        return parameter.device.type
    raise ResacctError(f"{type(model).__name__} has no parameters to train")


def _check_recipe_fits(model: nn.Module, recipe: PrecisionRecipe) -> None:
    if recipe.master_dtype is not None or recipe.is_custom:
        runnable = [name for name, known in RECIPES.items() if known.master_dtype is None]
        raise ResacctError(f"precision {recipe.alias or recipe.name!r}: train() keeps no master copy of the weights; expected one of {', '.join(runnable)}")
    dtypes = sorted({str(parameter.dtype).removeprefix("torch.") for parameter in model.parameters()})
    if dtypes != [recipe.parameter_dtype]:
        raise ResacctError(
            f"precision {recipe.alias or recipe.name!r} keeps parameters in {recipe.parameter_dtype}, but the model's are {', '.join(dtypes)}; "
            f"cast the model first or choose another recipe"
        )


def _validate(
    steps: int,
    grad_accumulation_steps: int,
    grad_clip_norm: float | None,
    eval_every: int | None,
    eval_fn: Callable | None,
    log_every: int | None,
    checkpoint_every: int | None,
    checkpoint_path: str | os.PathLike | None,
) -> None:
    if steps < 0:
        raise ResacctError(f"steps {steps}: expected ≥ 0 optimizer steps")
    if grad_accumulation_steps < 1:
        raise ResacctError(f"grad_accumulation_steps {grad_accumulation_steps}: expected ≥ 1 micro-batches per step")
    if grad_clip_norm is not None and not grad_clip_norm > 0:
        raise ResacctError(f"grad_clip_norm {grad_clip_norm}: expected > 0 (or None for no clipping)")
    for name, every in (("eval_every", eval_every), ("log_every", log_every), ("checkpoint_every", checkpoint_every)):
        if every is not None and every < 1:
            raise ResacctError(f"{name} {every}: expected ≥ 1 steps (or None)")
    if eval_every is not None and eval_fn is None:
        raise ResacctError(f"eval_every {eval_every} needs eval_fn (model → loss) to know what to evaluate")
    if checkpoint_every is not None and checkpoint_path is None:
        raise ResacctError(f"checkpoint_every {checkpoint_every} needs checkpoint_path: where should checkpoints go?")


@contextlib.contextmanager
def _progress_bar(progress: bool | Console, total_steps: int, start_step: int) -> Iterator[Callable[[str], None]]:
    """Yields ``advance(description)``; shows a rich bar only on a terminal and when asked."""
    console = progress if isinstance(progress, Console) else Console(stderr=True)
    enabled = bool(progress) and console.is_terminal
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, disable=not enabled, transient=False) as bar:
        task = bar.add_task("training", total=total_steps, completed=start_step)

        def advance(description: str) -> None:
            bar.update(task, advance=1, description=description)

        yield advance


def _evaluate(model: nn.Module, eval_fn: Callable[[nn.Module], Any]) -> float:
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return float(eval_fn(model))
    finally:
        model.train(was_training)


def _set_learning_rate(optimizer: torch.optim.Optimizer, lr_schedule: Callable[[int], float] | None, step: int) -> float:
    if lr_schedule is None:
        return float(optimizer.param_groups[0]["lr"])
    learning_rate = float(lr_schedule(step))
    for group in optimizer.param_groups:
        group["lr"] = learning_rate
    return learning_rate


def train(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    get_batch: Callable[[], Batch],
    loss_fn: LossFunction,
    *,
    steps: int,
    grad_clip_norm: float | None = None,
    lr_schedule: Callable[[int], float] | None = None,
    eval_every: int | None = None,
    eval_fn: Callable[[nn.Module], Any] | None = None,
    grad_accumulation_steps: int = 1,
    log_every: int | None = 1,
    on_log: Callable[[StepRecord | EvalRecord], None] | None = None,
    progress: bool | Console = False,
    checkpoint_every: int | None = None,
    checkpoint_path: str | os.PathLike | None = None,
    resume_from: str | os.PathLike | None = None,
    precision: str | PrecisionRecipe = "fp32",
) -> TrainResult:
    """Train until ``steps`` optimizer steps are done; returns the logged records.

    - ``get_batch()`` → ``(x, y)``; ``loss_fn(model(x), y)`` → a scalar (mean-reduced, so that
      accumulating ``grad_accumulation_steps`` equal micro-batches equals one large batch).
      If ``get_batch`` has ``state_dict``/``load_state_dict`` (like
      :class:`resacct.training.data.TokenBatchSampler`), its data position goes into checkpoints.
    - ``grad_clip_norm``: clip the global gradient norm (``clip_grad_norm_``); records it.
    - ``lr_schedule``: step index → learning rate for every param group (e.g. :func:`cosine_schedule`).
    - ``eval_every`` + ``eval_fn(model)`` → loss, under ``no_grad`` and ``model.eval()``;
      ``eval_fn`` without ``eval_every`` evaluates once at the end.
    - ``log_every``: a :class:`StepRecord` every so many steps (None: none); ``on_log`` is
      called with each record and evaluation.
    - ``progress``: a rich progress bar (True: on stderr, only if it is a terminal; or a Console).
    - ``checkpoint_every`` + ``checkpoint_path``: atomic checkpoints; ``checkpoint_path`` alone
      saves once at the end. ``resume_from``: continue exactly from that checkpoint.
    - ``precision``: a recipe of :mod:`resacct.facts.precision` (autocast and loss scaling).
    """
    _validate(steps, grad_accumulation_steps, grad_clip_norm, eval_every, eval_fn, log_every, checkpoint_every, checkpoint_path)
    recipe = get_recipe(precision)
    device_type = _device_type(model)
    _check_recipe_fits(model, recipe)
    scaler = grad_scaler_for(recipe, device_type)
    data_state = get_batch if isinstance(get_batch, SupportsStateDict) else None
    parameters = [parameter for parameter in model.parameters() if parameter.requires_grad]

    result = TrainResult()
    if resume_from is not None:
        result.start_step = load_checkpoint(resume_from, model=model, optimizer=optimizer, data=data_state, grad_scaler=scaler)
        if result.start_step > steps:
            raise ResacctError(f"{resume_from}: the checkpoint is at step {result.start_step}, past steps={steps}")

    def save(step: int) -> None:
        path = save_checkpoint(checkpoint_path, model=model, optimizer=optimizer, step=step, data=data_state, grad_scaler=scaler)  # type: ignore[arg-type]
        result.checkpoints.append(path)

    def record(entry: StepRecord | EvalRecord) -> None:
        (result.records if isinstance(entry, StepRecord) else result.evaluations).append(entry)  # type: ignore[arg-type]
        if on_log is not None:
            on_log(entry)

    started = time.perf_counter()
    model.train()
    with _progress_bar(progress, steps, result.start_step) as advance:
        for step in range(result.start_step, steps):
            learning_rate = _set_learning_rate(optimizer, lr_schedule, step)
            optimizer.zero_grad(set_to_none=True)
            micro_losses = []
            for _ in range(grad_accumulation_steps):
                x, y = get_batch()
                with autocast_for(recipe, device_type):
                    loss = loss_fn(model(x), y) / grad_accumulation_steps
                (scaler.scale(loss) if scaler is not None else loss).backward()
                micro_losses.append(loss.detach())
            grad_norm = None
            if grad_clip_norm is not None:
                if scaler is not None:
                    scaler.unscale_(optimizer)
                grad_norm = float(torch.nn.utils.clip_grad_norm_(parameters, grad_clip_norm))
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            done = step + 1
            if log_every is not None and done % log_every == 0:
                loss_value = float(torch.stack(micro_losses).sum())  # the only host sync of the step
                loss_scale = float(scaler.get_scale()) if scaler is not None else None
                record(StepRecord(done, loss_value, learning_rate, grad_norm, loss_scale, time.perf_counter() - started))
                advance(f"step {done} loss {loss_value:.4g}")
            else:
                advance(f"step {done}")
            if eval_every is not None and done % eval_every == 0:
                record(EvalRecord(done, _evaluate(model, eval_fn)))  # type: ignore[arg-type]
            if checkpoint_every is not None and done % checkpoint_every == 0:
                save(done)
            result.final_step = done
    result.final_step = max(result.final_step, result.start_step)
    if eval_fn is not None and eval_every is None:
        record(EvalRecord(result.final_step, _evaluate(model, eval_fn)))
    if checkpoint_path is not None and checkpoint_every is None:
        save(result.final_step)
    return result
