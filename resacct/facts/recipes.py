"""Precision recipes: the one table every command and module reads.

A recipe says in which dtype each piece of training state lives: the model's parameters, the
matmuls (``compute_dtype``, under ``torch.autocast`` when it differs from the parameters'),
the gradients backward writes, an optional master copy of the weights the optimizer updates,
and the optimizer's states; and whether the loss is scaled (fp16). ``resacct memory``,
``fit``, ``plan``, ``account`` and ``train`` all take these names (and their aliases), parsed
once into a :class:`Recipe` at the edge.

Bytes per parameter depend on the **moment** of a step. Between steps (``after_backward``)
a master-weight recipe holds bf16 parameters and gradients, the fp32 master and the fp32
moments (2 + 2 + 12 = 16 with AdamW, the ZeRO paper's mixed precision); at the optimizer step
(``at_step``) the fp32 gradients of the master exist too (+ 4 = 20):

>>> recipe = get_recipe("mixed")              # an alias of bf16-fp32-master
>>> recipe.name, recipe.bytes_per_parameter("adamw", "after_backward"), recipe.bytes_per_parameter("adamw", "at_step")
('bf16-fp32-master', 16, 20)
>>> parse_recipe("2+2+12").state_bytes("adamw", "at_step").total_bytes   # custom bytes: the same at both moments
16.0

Aliases that name an optimizer pin it (``mixed-adam`` is bf16-fp32-master with Adam,
``fp32-sgd-momentum`` is fp32 with SGD momentum); other names take the command's
``--optimizer`` (default AdamW).
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Literal

from resacct.errors import ResacctError, UnknownNameError

__all__ = [
    "Moment",
    "MOMENTS",
    "MOMENT_WORDS",
    "DEFAULT_OPTIMIZER",
    "OPTIMIZER_CHOICES",
    "DEFAULT_ZERO_STAGE",
    "StateBytes",
    "Recipe",
    "RECIPES",
    "ALIASES",
    "RECIPE_NAMES",
    "get_recipe",
    "parse_recipe",
]

Moment = Literal["after_backward", "at_step"]
MOMENTS: tuple[Moment, ...] = ("after_backward", "at_step")
#: How output names each moment.
MOMENT_WORDS = {"after_backward": "between steps", "at_step": "at the optimizer step"}
DEFAULT_OPTIMIZER = "adamw"
#: The optimizers a command's --optimizer takes (resacct.account.load.optimizers builds them).
OPTIMIZER_CHOICES = ("adamw", "adam", "sgd", "sgd-momentum", "adagrad", "rmsprop")
#: The ZeRO stage every command assumes unless told: plain data parallelism, nothing sharded.
DEFAULT_ZERO_STAGE = 0


def _element_bytes(dtype: str) -> int:
    from resacct.facts.dtypes import dtype_bits  # torch only when bytes are asked for: the CLI starts without it

    bits = dtype_bits(dtype)
    if bits % 8:
        raise ResacctError(f"dtype {dtype!r} has {bits} bits; training state needs whole bytes per element")
    return bits // 8


@dataclass(frozen=True)
class StateBytes:
    """Bytes per parameter of the three pieces ZeRO shards: the model's parameters, their
    gradients, and everything only the optimizer needs (its moments, a master copy of the
    weights, and at the step that master's gradients)."""

    parameters: float
    gradients: float
    optimizer_state: float

    @property
    def total_bytes(self) -> float:
        return self.parameters + self.gradients + self.optimizer_state


@dataclass(frozen=True)
class Recipe:
    """Which training-state tensors exist, and in which dtype.

    ``parameter_dtype`` is the model's own parameters (what forward and backward read) and
    ``gradient_dtype`` the ``.grad`` backward writes into them. ``master_dtype`` is a separate
    copy of the weights the optimizer updates (None: it updates the parameters); the optimizer
    then needs gradients of the master's dtype, which exist while it steps.
    ``frees_model_gradients``: the model's gradients are dropped as they are copied to the
    master's. ``compute_dtype``: the matmuls' dtype under ``torch.autocast`` (None: the
    parameters' dtype, no autocast). ``optimizer``: the optimizer a name pins (None: the
    command's). ``custom_bytes``: a ``w+g+k`` recipe given as bytes, without dtypes. ``alias``:
    the other name it was asked for by, if any.
    """

    name: str
    parameter_dtype: str = "float32"
    gradient_dtype: str = "float32"
    optimizer_state_dtype: str = "float32"
    master_dtype: str | None = None
    frees_model_gradients: bool = False
    compute_dtype: str | None = None
    loss_scaling: bool = False
    description: str = ""
    optimizer: str | None = None
    custom_bytes: tuple[float, float, float] | None = None
    alias: str | None = None

    def __str__(self) -> str:
        """The recipe's name: records keep the typed recipe, text shows ``bf16-fp32-master``."""
        return self.name

    @property
    def is_custom(self) -> bool:
        return self.custom_bytes is not None

    @property
    def uses_autocast(self) -> bool:
        return self.compute_dtype is not None and self.compute_dtype != self.parameter_dtype

    @property
    def computes_in(self) -> str:
        """The dtype of the matmuls: ``compute_dtype`` under autocast, else the parameters'."""
        return self.compute_dtype or self.parameter_dtype

    @property
    def master_weights_dtype(self) -> str | None:
        return self.master_dtype

    def as_list(self) -> list[str]:
        """[parameter, forward matmul output, backward matmul output, parameter gradient, optimizer state]."""
        return [self.parameter_dtype, self.computes_in, self.computes_in, self.gradient_dtype, self.optimizer_state_dtype]

    def optimizer_for(self, requested: str | None = None) -> str:
        """The optimizer to account: ``requested`` (a command's ``--optimizer``), else the one the
        name pins, else AdamW. A request that contradicts the name is refused."""
        requested = requested.replace("_", "-") if requested is not None else None  # resacct.training.optim writes sgd_momentum
        if requested is not None and self.optimizer is not None and requested != self.optimizer:
            raise ResacctError(f"recipe {self.alias or self.name!r} is trained with {self.optimizer}, but the optimizer given is {requested!r}; "
                               f"drop one, or use the recipe's plain name")
        return requested or self.optimizer or DEFAULT_OPTIMIZER

    def state_bytes(self, optimizer: str | None = None, moment: Moment = "after_backward") -> StateBytes:
        """Bytes per parameter of parameters, gradients and optimizer-only state at ``moment``."""
        if moment not in MOMENTS:
            raise ResacctError(f"moment {moment!r}: expected one of {', '.join(MOMENTS)}")
        if self.custom_bytes is not None:
            return StateBytes(*self.custom_bytes)
        from resacct.facts.optimizer_state import state_tensors_per_parameter

        chosen = self.optimizer_for(optimizer)
        optimizer_only = state_tensors_per_parameter(chosen.replace("-", "_")) * _element_bytes(self.optimizer_state_dtype)
        gradients = _element_bytes(self.gradient_dtype)
        if self.master_dtype is not None:
            optimizer_only += _element_bytes(self.master_dtype)
            if moment == "at_step":
                optimizer_only += _element_bytes(self.master_dtype)  # the master's gradients, made for the step
                if self.frees_model_gradients:
                    gradients = 0
        return StateBytes(_element_bytes(self.parameter_dtype), gradients, optimizer_only)

    def bytes_per_parameter(self, optimizer: str | None = None, moment: Moment = "at_step") -> int:
        """Bytes each parameter costs in this recipe at ``moment`` (activations aside)."""
        return int(self.state_bytes(optimizer, moment).total_bytes)


RECIPES: dict[str, Recipe] = {
    recipe.name: recipe
    for recipe in (
        Recipe("fp32", description="everything in float32: 4 param + 4 grad + 4 per optimizer state"),
        Recipe("bf16-autocast", compute_dtype="bfloat16",
               description="torch.autocast(dtype=bfloat16): float32 state, bf16 matmuls (the bf16 weight casts are transient)"),
        Recipe("fp16-autocast-scaled", compute_dtype="float16", loss_scaling=True,
               description="torch.autocast(dtype=float16) with torch.amp.GradScaler against gradient underflow"),
        Recipe("bf16", parameter_dtype="bfloat16", gradient_dtype="bfloat16", optimizer_state_dtype="bfloat16",
               description="model.to(bfloat16): torch.optim keeps its state in the parameters' dtype"),
        Recipe("bf16-fp32-master", parameter_dtype="bfloat16", gradient_dtype="bfloat16", master_dtype="float32",
               description="bf16 params and grads, fp32 master weights and moments; fp32 grads made for the step (ZeRO's 2 + 2 + 12)"),
        Recipe("bf16-fp32-master-free-bf16-grads", parameter_dtype="bfloat16", gradient_dtype="bfloat16", master_dtype="float32",
               frees_model_gradients=True, description="as bf16-fp32-master, but each bf16 grad is freed as it is copied to fp32"),
    )
}

#: Other names for the same recipes: ``alias -> (recipe, pinned optimizer or None)``.
ALIASES: dict[str, tuple[str, str | None]] = {
    "fp32-adamw": ("fp32", "adamw"),
    "fp32-sgd-momentum": ("fp32", "sgd-momentum"),
    "bf16-cast-model": ("bf16", None),
    "bf16-adamw": ("bf16", "adamw"),
    "mixed": ("bf16-fp32-master", None),
    "mixed-adam": ("bf16-fp32-master", "adam"),
}

RECIPE_NAMES: tuple[str, ...] = (*RECIPES, *ALIASES)

_CUSTOM = re.compile(r"^\s*([^+\s]+)\s*\+\s*([^+\s]+)\s*\+\s*([^+\s]+)\s*$")


def get_recipe(recipe: str | Recipe) -> Recipe:
    """The recipe called ``recipe`` (a name or an alias; a :class:`Recipe` passes through).

    >>> get_recipe("mixed-adam").optimizer, get_recipe("bf16-cast-model").name
    ('adam', 'bf16')
    """
    if isinstance(recipe, Recipe):
        return recipe
    if not isinstance(recipe, str):
        raise ResacctError(f"recipe {recipe!r}: expected a name such as 'fp32' or 'mixed'")
    if recipe in RECIPES:
        return RECIPES[recipe]
    if recipe in ALIASES:
        name, optimizer = ALIASES[recipe]
        return dataclasses.replace(RECIPES[name], optimizer=optimizer, alias=recipe)
    raise UnknownNameError("precision recipe", recipe, list(RECIPE_NAMES))


def parse_recipe(text: str | Recipe, *, allow_custom: bool = True) -> Recipe:
    """A recipe name or alias, or (``allow_custom``) ``"w+g+k"`` bytes per parameter of
    parameters, gradients and optimizer-only state.

    >>> parse_recipe("2+2+12").custom_bytes
    (2.0, 2.0, 12.0)
    """
    if isinstance(text, Recipe) or not isinstance(text, str) or not _CUSTOM.match(text):
        if not allow_custom or not isinstance(text, str) or text in RECIPE_NAMES:
            return get_recipe(text)
        raise UnknownNameError("precision recipe", text, [*RECIPE_NAMES, "w+g+k (e.g. 2+2+12)"])
    if not allow_custom:
        raise ResacctError(f"recipe {text!r}: bytes per parameter have no dtypes to run with; expected a name: {', '.join(RECIPE_NAMES)}")
    parts = []
    for part in _CUSTOM.match(text).groups():  # type: ignore[union-attr]
        try:
            value = float(part)
        except ValueError:
            raise ResacctError(f"recipe {text!r}: {part!r} is not a number of bytes") from None
        if not math.isfinite(value) or value < 0:
            raise ResacctError(f"recipe {text!r}: {part!r} bytes must be a finite number ≥ 0")
        parts.append(value)
    if sum(parts) <= 0:
        raise ResacctError(f"recipe {text!r}: a parameter must cost more than 0 bytes in all (e.g. 2+2+12)")
    return Recipe(text.replace(" ", ""), custom_bytes=(parts[0], parts[1], parts[2]),
                  description="custom: parameters + gradients + optimizer state bytes per parameter")
