"""The training state of a model some of whose parameters are frozen (``requires_grad=False``:
a peft LoRA model's base, a frozen embedding): a frozen parameter holds its weight in the
recipe's parameter dtype and nothing else — no gradient, no master copy, no optimizer state, no
step counter (``torch.optim`` makes state only for parameters that get a gradient). Every route
that predicts a state (``account``, the API, ``lora``, ``fit``'s peak) counts it this way.

>>> from torch import nn
>>> model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
>>> model[0].requires_grad_(False)                                       # doctest: +ELLIPSIS
Linear(...)
>>> split = parameter_split(model)
>>> split.trainable_parameters, split.trainable_tensors, split.frozen_parameters
(10, 2, 20)
>>> predict_state_bytes(model, "fp32", "adamw", "at_step")               # 16·10 + 4·2 counters + 4·20 frozen
248
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from resacct.errors import ResacctError
from resacct.facts.dtypes import parse_dtype
from resacct.facts.recipes import Moment, Recipe
from resacct.measurement.memory import get_state_recipe, training_state_bytes

__all__ = ["ParameterSplit", "parameter_split", "predict_state_bytes", "trainable_parameters"]


@dataclass(frozen=True)
class ParameterSplit:
    """Elements and tensors of a model's parameters that train and that are frozen (shared ones once)."""

    trainable_parameters: int
    trainable_tensors: int
    frozen_parameters: int
    frozen_tensors: int

    @property
    def parameters(self) -> int:
        return self.trainable_parameters + self.frozen_parameters


def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters an optimizer steps: those that require a gradient; refuses a model with none."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    if not trainable:
        raise ResacctError(f"the model {type(model).__name__} has no parameter with requires_grad=True; expected something to train")
    return trainable


def parameter_split(model: nn.Module) -> ParameterSplit:
    """Count ``model``'s parameters by whether they require a gradient."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    frozen = [p for p in model.parameters() if not p.requires_grad]
    return ParameterSplit(trainable_parameters=sum(p.numel() for p in trainable), trainable_tensors=len(trainable),
                          frozen_parameters=sum(p.numel() for p in frozen), frozen_tensors=len(frozen))


def predict_state_bytes(model: nn.Module | ParameterSplit, recipe: str | Recipe, optimizer: str, moment: Moment) -> int:
    """The training state's bytes: the trainable parameters' as
    :func:`~resacct.measurement.memory.training_state_bytes` counts them (weights, gradients,
    master copies, optimizer state, step counters), plus the frozen parameters' weights in the
    recipe's parameter dtype (``optimizer`` as :func:`~resacct.account.load.optimizers.memory_optimizer_name` names it)."""
    split = model if isinstance(model, ParameterSplit) else parameter_split(model)
    chosen = get_state_recipe(recipe)
    frozen = split.frozen_parameters * parse_dtype(chosen.parameter_dtype).itemsize
    return training_state_bytes(split.trainable_parameters, split.trainable_tensors, chosen, optimizer, moment) + frozen
