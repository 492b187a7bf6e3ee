"""The Python API: one training step of a model, accounted — FLOPs, training state, activations
and peak, resacct's prediction beside torch's measurement — in three lines.

>>> import torch, resacct
>>> model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
>>> report = resacct.account_model(model, batch=8, recipe="fp32")
>>> report.flops.predicted == report.flops.measured == 1_310_720   # forward 2·8·(64·256 + 256·64); backward 1.5× (no input gradient)
True
>>> report.state.measured == 16 * report.parameters + 4 * 4             # AdamW at the step: 16 B/param + 4 step counters
True

Built on :func:`resacct.account.account_gpt` (a :mod:`resacct.training.gpt` config name such as
``"gpt-nano"``) and :func:`resacct.account.answers.generic.account_module` (any ``nn.Module``, or a
``"module:factory"`` string): the same measurements ``resacct account`` prints, and
:meth:`TrainingReport.render` prints the same table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from resacct.errors import ResacctError
from resacct.facts.recipes import Recipe

__all__ = ["Quantity", "TrainingReport", "account_model"]


@dataclass(frozen=True)
class Quantity:
    """resacct's prediction beside torch's measurement (None: no formula, or not measured)."""

    predicted: float | None
    measured: float | None
    unit: str

    @property
    def ratio(self) -> float | None:
        """measured / predicted (1.0 when exact)."""
        if self.predicted in (None, 0) or self.measured is None:
            return None
        return self.measured / self.predicted

    def __str__(self) -> str:
        from resacct.cli.account import format_quantity

        ratio = "—" if self.ratio is None else f"{self.ratio:.3f}"
        return f"predicted {format_quantity(self.predicted, self.unit)}, measured {format_quantity(self.measured, self.unit)} (ratio {ratio})"


@dataclass(frozen=True)
class TrainingReport:
    """One training step of a model: ``flops`` (the step), ``state`` (parameters, gradients and
    optimizer state while ``optimizer.step()`` runs), ``state_between_steps``, ``activations``
    (what autograd saves for backward) and ``peak`` (the allocator's forward + backward peak
    above the parameters; measured on the CPU only). ``account`` is the whole account
    (:class:`resacct.account.StepAccount` or :class:`resacct.account.answers.generic.ModelAccount`)."""

    model: str
    parameters: int
    recipe: str
    optimizer: str
    flops: Quantity
    state: Quantity
    state_between_steps: Quantity
    activations: Quantity
    peak: Quantity
    account: Any
    #: the whole step's peak (forward, backward, optimizer, zero_grad): predicted on fake tensors, measured by the CPU allocator
    step_peak: Quantity = Quantity(None, None, "bytes")

    def render(self, *, per_module: bool = False, width: int | None = None) -> str:
        """The table ``resacct account`` prints for this step, ``width`` columns wide (default:
        ``COLUMNS``, else the terminal's width when stdout is one, else 150)."""
        from resacct.cli.account import render_account

        return render_account(self.account, per_module=per_module, width=width)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values: what ``resacct account --json`` prints."""
        return self.account.to_dict()

    def __str__(self) -> str:
        lines = [f"{self.model}: {self.parameters:,} parameters, {self.recipe} with {self.optimizer}"]
        for name in ("flops", "state", "state_between_steps", "activations", "peak", "step_peak"):
            label = {"peak": "fwd+bwd peak", "step_peak": "step peak"}.get(name, name.replace("_", " "))
            lines.append(f"  {label:<20} {getattr(self, name)}")
        return "\n".join(lines)


def account_model(
    model: nn.Module | str,
    *,
    batch: int = 4,
    seq: int | None = None,
    example_input: Any = None,
    input_shape: tuple[int, ...] | None = None,
    input_dtype: str = "float32",
    recipe: str | Recipe = "fp32",
    optimizer: str | None = None,
    loss: str = "auto",
    measure: bool | None = None,
) -> TrainingReport:
    """Account one training step of ``model``: an ``nn.Module`` (on the CPU or the meta device),
    a :mod:`resacct.training.gpt` config name (``"gpt-nano"``, ``"gpt2-small"`` …) or ``"module:factory"``.

    The input is ``example_input`` if given — a tensor (``model(x)``), a tuple of tensors
    (``model(*xs)``) or a dict of name → tensor (``model(**inputs)``) — else made from ``batch`` and
    ``seq`` (tokens per sequence of a token model: a forward taking ``input_ids``, or an
    ``nn.Embedding`` first; else the middle axis of a Linear's input) or ``input_shape`` (in
    ``input_dtype``, e.g. ``"int64"`` for ids).
    ``recipe`` is a name or alias of :data:`resacct.facts.recipes.RECIPES` (``"mixed"`` is
    ``bf16-fp32-master``); ``optimizer`` defaults to the one the recipe name pins, else AdamW.
    ``measure`` (GPT names and factories): False builds on the meta device (sizes, no
    arithmetic), None decides by the step's FLOPs.
    """
    from resacct.facts.recipes import parse_recipe

    _check_sizes(batch=batch, seq=seq, input_shape=input_shape)
    chosen = parse_recipe(recipe, allow_custom=False)
    chosen_optimizer = chosen.optimizer_for(optimizer)
    if isinstance(model, str):
        account = _account_named(model, batch=batch, seq=seq, input_shape=input_shape, input_dtype=input_dtype, recipe=chosen,
                                 optimizer=chosen_optimizer, loss=loss, measure=measure, has_example=example_input is not None)
    elif isinstance(model, nn.Module):
        account = _account_module(model, batch=batch, seq=seq, example_input=example_input, input_shape=input_shape, input_dtype=input_dtype,
                                  recipe=chosen, optimizer=chosen_optimizer, loss=loss)
    else:
        raise ResacctError(f"model {type(model).__name__}: expected an nn.Module, a resacct.training.gpt config name or 'module:factory'")
    return _report(account)


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _check_sizes(*, batch: Any, seq: Any, input_shape: Any) -> None:
    """One line for a size that is no whole number ≥ 1 (``batch=0`` accounted a step of 0 FLOPs,
    ``batch="8"`` raised a raw TypeError deep inside)."""
    if not _whole(batch):
        raise ResacctError(f"batch {batch!r} ({type(batch).__name__}): expected a whole number ≥ 1 (sequences, or rows, per step)")
    if seq is not None and not _whole(seq):
        raise ResacctError(f"seq {seq!r} ({type(seq).__name__}): expected a whole number ≥ 1 (tokens per sequence), or None")
    if input_shape is not None and (not isinstance(input_shape, (tuple, list)) or not input_shape or not all(map(_whole, input_shape))):
        raise ResacctError(f"input_shape {input_shape!r}: expected a tuple of whole numbers ≥ 1, batch first (e.g. (8, 64)), or None")


def _account_named(name: str, *, batch: int, seq: int | None, input_shape: tuple[int, ...] | None, input_dtype: str, recipe: Recipe,
                   optimizer: str, loss: str, measure: bool | None, has_example: bool) -> Any:
    if has_example:
        raise ResacctError(f"model {name!r}: example_input goes with an nn.Module; a name makes its own input from batch and seq")
    if ":" in name:
        from resacct.account.answers.generic import account_named_model

        return account_named_model(name, batch=batch, seq=seq, input_shape=input_shape, input_dtype=input_dtype, loss=loss, recipe=recipe,
                                   optimizer=optimizer, measure=measure)
    from resacct.account import account_gpt

    return account_gpt(name, batch=batch, seq=seq, recipe=recipe, optimizer=optimizer, measure=measure, time_step=False)


def _account_module(model: nn.Module, *, batch: int, seq: int | None, example_input: Any, input_shape: tuple[int, ...] | None,
                    input_dtype: str, recipe: Recipe, optimizer: str, loss: str) -> Any:
    from resacct.account.answers.generic import account_module
    from resacct.account.load.model_io import default_inputs

    from resacct.account.load.model_factory import check_module_tree

    check_module_tree(model, f"the model {type(model).__name__}")  # a cycle, or too deep for torch's recursive walks: one line
    if not list(model.parameters()):
        raise ResacctError(f"the model {type(model).__name__} has no parameters; expected a model with something to train")
    if example_input is None:
        example_input = default_inputs(model, batch=batch, seq=seq, input_shape=input_shape, input_dtype=input_dtype)
    return account_module(model, example_input, loss=loss, recipe=recipe, optimizer=optimizer)


def _report(account: Any) -> TrainingReport:
    from resacct.account import StepAccount

    state = account.state
    if isinstance(account, StepAccount):
        flops = Quantity(account.predicted_flops.step_flops, account.flops.step_flops, "FLOPs")
        activations = Quantity(account.predicted_saved_bytes, account.saved.activation_bytes, "bytes")
        peak = Quantity(account.predicted_step_peak_bytes, account.step_peak_bytes, "bytes")
        optimizer = state.optimizer
    else:
        flops = Quantity(account.predicted_step_flops, account.flops.step_flops, "FLOPs")  # a Linear stack's or a transformers LM's formula
        activations = Quantity(account.predicted_saved_bytes, account.saved.activation_bytes, "bytes")
        peak = Quantity(account.predicted_forward_backward_peak_bytes, account.step_peak_bytes, "bytes")
        optimizer = account.optimizer
    return TrainingReport(
        model=account.model, parameters=account.parameters, recipe=account.recipe.name, optimizer=optimizer, flops=flops,
        state=Quantity(state.predicted_at_step_bytes, state.at_step_bytes, "bytes"),
        state_between_steps=Quantity(state.predicted_after_backward_bytes, state.after_backward_bytes, "bytes"),
        activations=activations, peak=peak, account=account, step_peak=_step_peak(account),
    )


def _step_peak(account: Any) -> Quantity:
    """The whole step's peak as the account has it (``to_dict()["step_peak"]``): predicted and, on the CPU, measured."""
    peak = getattr(account, "step_peak", None)
    if peak is None:
        return Quantity(None, None, "bytes")
    predicted = None if peak.predicted is None else peak.predicted.peak_bytes
    return Quantity(predicted, None if peak.measured is None else peak.measured.peak_bytes, "bytes")

