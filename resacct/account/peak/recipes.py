"""The training step of a precision recipe (:mod:`resacct.facts.recipes`) as one program — the same
for the predicted peak (fake tensors, :func:`resacct.account.peak.step_peak.predict_step_peak`) and for the
CPU allocator's measurement — so a recipe's peak is predicted by running what a recipe does:

- **parameters in the recipe's dtype** (``model.to(bfloat16)`` for bf16 and the master recipes);
- **autocast** (``compute_dtype``): the loss is computed under ``torch.autocast(device, dtype)``;
  autocast's cast of each float32 weight lives until the autocast region ends (its weight cache);
- **master weights** (``master_dtype``): :class:`MasterWeightsOptimizer` keeps a copy of the
  parameters in the master's dtype and steps the real ``torch.optim`` optimizer on it. At
  ``step()`` each model gradient is copied to a master gradient (and freed at once with
  ``frees_model_gradients``), the inner optimizer steps the masters, and the masters are copied
  back into the model's parameters; ``zero_grad`` drops both kinds of gradients.

Loss scaling (``fp16-autocast-scaled``) is refused: ``GradScaler.step`` reads whether a gradient
overflowed (``.item()``), a value fake tensors do not have.

>>> import torch
>>> from resacct.facts.recipes import parse_recipe
>>> model = torch.nn.Linear(8, 4)
>>> step = recipe_step(parse_recipe("bf16-fp32-master"), model, torch.ones(2, 8), lambda m, x: m(x).float().mean(), "adamw")
>>> optimizer = step.make_optimizer(list(step.model.parameters()))
>>> step.model.weight.dtype, [m.dtype for m in optimizer.master_parameters], type(optimizer.inner).__name__
(torch.bfloat16, [torch.float32, torch.float32], 'AdamW')
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from resacct.errors import ResacctError

__all__ = ["MasterWeightsOptimizer", "RecipeStep", "recipe_step", "optimizer_state_tensors", "master_parameters_of"]

LossFn = Callable[[nn.Module, Any], torch.Tensor]


class MasterWeightsOptimizer(torch.optim.Optimizer):
    """An optimizer over a model's (low-precision) parameters that keeps master copies in
    ``master_dtype`` and steps ``make_inner(masters)`` on them (mixed precision with master weights).

    >>> weight = nn.Parameter(torch.ones(3, dtype=torch.bfloat16))
    >>> optimizer = MasterWeightsOptimizer([weight], lambda p: torch.optim.SGD(p, lr=0.5), torch.float32)
    >>> weight.grad = torch.ones(3, dtype=torch.bfloat16)
    >>> optimizer.step(); weight.tolist(), optimizer.master_parameters[0].grad.dtype
    ([0.5, 0.5, 0.5], torch.float32)
    >>> optimizer.zero_grad(); weight.grad, optimizer.master_parameters[0].grad
    (None, None)
    """

    def __init__(self, parameters: Iterable[torch.Tensor], make_inner: Callable[[list[nn.Parameter]], torch.optim.Optimizer],
                 master_dtype: torch.dtype, *, frees_model_gradients: bool = False) -> None:
        model_parameters = list(parameters)
        super().__init__(model_parameters, {})
        self.model_parameters = model_parameters
        self.master_parameters = [nn.Parameter(p.detach().to(master_dtype)) for p in model_parameters]  # (shape of p) each, in master_dtype
        self.inner = make_inner(self.master_parameters)
        self.frees_model_gradients = frees_model_gradients
        self.on_master_gradient: Callable[[torch.Tensor], None] | None = None  # told of each master gradient made (the peak's breakdown)

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        for parameter, master in zip(self.model_parameters, self.master_parameters):
            if parameter.grad is None:
                continue
            master.grad = parameter.grad.to(master.dtype)
            if self.on_master_gradient is not None:
                self.on_master_gradient(master.grad)
            if self.frees_model_gradients:
                parameter.grad = None
        self.inner.step()
        for parameter, master in zip(self.model_parameters, self.master_parameters):
            parameter.copy_(master)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.inner.zero_grad(set_to_none=set_to_none)
        for parameter in self.model_parameters:
            parameter.grad = None


def optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> list[Any]:
    """The optimizer's state values (an inner optimizer's for :class:`MasterWeightsOptimizer`)."""
    owner = getattr(optimizer, "inner", optimizer)
    return [value for state in owner.state.values() for value in state.values()]


def master_parameters_of(optimizer: torch.optim.Optimizer) -> list[nn.Parameter]:
    """The master copies an optimizer keeps (none for a plain ``torch.optim`` optimizer)."""
    return list(getattr(optimizer, "master_parameters", ()))


@dataclass(frozen=True)
class RecipeStep:
    """What a recipe's step runs: the model in its parameter dtype, the inputs (floating ones cast
    to it), the loss (under autocast when the recipe has one) and the optimizer factory."""

    model: nn.Module
    inputs: Any
    loss_fn: LossFn
    make_optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer]
    description: str


def _cast_floating(inputs: Any, dtype: torch.dtype) -> Any:
    from resacct.measurement.memory_timeline import copy_inputs

    return copy_inputs(inputs, lambda t: t.to(dtype) if t.is_floating_point() and t.dtype != dtype else t)


def model_in_dtype(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """``model`` itself when its parameters are all ``dtype``, else a copy converted (``nn.Module.to``
    converts in place: the caller's model keeps its dtype; on meta a copy costs nothing)."""
    return model if all(p.dtype == dtype for p in model.parameters()) else copy.deepcopy(model).to(dtype)


def recipe_step(recipe: Any, model: nn.Module, inputs: Any, loss_fn: LossFn, optimizer: str) -> RecipeStep:
    """The step of ``recipe`` (a :class:`~resacct.facts.recipes.Recipe`) for ``model``: ``loss_fn``
    as the float32 model would compute it, ``optimizer`` a name of
    :func:`resacct.account.load.optimizers.build_optimizer`. The model is copied only when its dtype changes."""
    from resacct.account.load.optimizers import build_optimizer
    from resacct.facts.dtypes import parse_dtype

    if recipe.is_custom:
        raise ResacctError(f"recipe {recipe.name}: bytes per parameter have no dtypes to run a step with; expected a named recipe")
    if recipe.loss_scaling:
        raise ResacctError(f"recipe {recipe.alias or recipe.name}: GradScaler reads whether a gradient overflowed (.item()), which fake tensors "
                           "cannot know; the step peak is predicted for fp32, bf16, bf16-autocast and the master-weight recipes")
    dtype = parse_dtype(recipe.parameter_dtype)
    work = model_in_dtype(model, dtype)
    work_inputs = _cast_floating(inputs, dtype) if dtype != torch.float32 else inputs
    parts = [f"parameters in {recipe.parameter_dtype}"]
    step_loss = loss_fn
    if recipe.uses_autocast:
        compute = parse_dtype(recipe.computes_in)
        parts.append(f"torch.autocast({recipe.computes_in})")

        def autocast_loss(module: nn.Module, step_inputs: Any) -> torch.Tensor:
            device = next((p.device.type for p in module.parameters()), "cpu")
            with torch.autocast(device, dtype=compute):
                return loss_fn(module, step_inputs)

        step_loss = autocast_loss

    if recipe.master_dtype is None:
        def make_optimizer(parameters: list[nn.Parameter]) -> torch.optim.Optimizer:
            return build_optimizer(optimizer, parameters)
    else:
        master = parse_dtype(recipe.master_dtype)
        parts.append(f"{recipe.master_dtype} master weights" + (", each model gradient freed as it is copied" if recipe.frees_model_gradients else ""))

        def make_optimizer(parameters: list[nn.Parameter]) -> torch.optim.Optimizer:
            return MasterWeightsOptimizer(parameters, lambda masters: build_optimizer(optimizer, masters), master,
                                          frees_model_gradients=recipe.frees_model_gradients)

    return RecipeStep(model=work, inputs=work_inputs, loss_fn=step_loss, make_optimizer=make_optimizer, description=", ".join(parts))
