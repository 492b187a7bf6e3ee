"""Mixed-precision recipes as data: which dtype each piece of training state is kept in.

A recipe names the dtype of the parameters, of the compute (matmul outputs, activations and
their gradients in forward and backward), of the parameter gradients, of an optional master
copy of the weights, and of the optimizer states, and whether the loss is scaled. From that,
resacct predicts what torch will hold (checked in ``resacct/specs/train.claims.yaml``) and the
persistent bytes per parameter.

>>> RECIPES["bf16-autocast"].compute_dtype, RECIPES["bf16-autocast"].parameter_dtype
('bfloat16', 'float32')
>>> persistent_bytes_per_parameter("bf16-autocast", optimizer_states=2)  # AdamW: 4 + 4 + 2·4
16
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from resacct.dtypes import dtype_bytes, parse_dtype
from resacct.errors import UnknownNameError

__all__ = [
    "PrecisionRecipe",
    "RECIPES",
    "get_recipe",
    "persistent_bytes_per_parameter",
    "saved_activation_bytes_ratio",
    "autocast_for",
    "grad_scaler_for",
]


@dataclass(frozen=True)
class PrecisionRecipe:
    """Where each dtype goes. ``master_weights_dtype`` is a separate copy the optimizer updates
    (None: the optimizer updates the parameters themselves)."""

    name: str
    parameter_dtype: str
    compute_dtype: str
    gradient_dtype: str
    optimizer_state_dtype: str
    master_weights_dtype: str | None = None
    loss_scaling: bool = False
    description: str = ""

    @property
    def uses_autocast(self) -> bool:
        return self.compute_dtype != self.parameter_dtype

    def as_list(self) -> list[str]:
        """[parameter, forward matmul output, backward matmul output, parameter gradient, optimizer state]."""
        return [self.parameter_dtype, self.compute_dtype, self.compute_dtype, self.gradient_dtype, self.optimizer_state_dtype]


RECIPES: dict[str, PrecisionRecipe] = {
    recipe.name: recipe
    for recipe in (
        PrecisionRecipe("fp32", "float32", "float32", "float32", "float32", description="everything in float32"),
        PrecisionRecipe(
            "bf16-autocast",
            "float32",
            "bfloat16",
            "float32",
            "float32",
            description="torch.autocast(dtype=bfloat16): float32 parameters, gradients and optimizer states; bf16 matmuls",
        ),
        PrecisionRecipe(
            "fp16-autocast-scaled",
            "float32",
            "float16",
            "float32",
            "float32",
            loss_scaling=True,
            description="torch.autocast(dtype=float16) with torch.amp.GradScaler against gradient underflow",
        ),
        PrecisionRecipe(
            "bf16-cast-model",
            "bfloat16",
            "bfloat16",
            "bfloat16",
            "bfloat16",
            description="model.to(bfloat16) with a torch.optim optimizer: its states follow the parameter dtype",
        ),
    )
}


def get_recipe(recipe: str | PrecisionRecipe) -> PrecisionRecipe:
    """The recipe called ``recipe`` (a recipe passes through)."""
    if isinstance(recipe, PrecisionRecipe):
        return recipe
    if recipe not in RECIPES:
        raise UnknownNameError("precision recipe", recipe, list(RECIPES))
    return RECIPES[recipe]


def persistent_bytes_per_parameter(recipe: str | PrecisionRecipe, *, optimizer_states: int) -> int:
    """Bytes per parameter that live through the whole run: parameter + gradient + master copy
    + ``optimizer_states`` states (SGD 0, AdaGrad 1, Adam/AdamW 2). Activations not included."""
    chosen = get_recipe(recipe)
    total = dtype_bytes(chosen.parameter_dtype) + dtype_bytes(chosen.gradient_dtype)
    if chosen.master_weights_dtype is not None:
        total += dtype_bytes(chosen.master_weights_dtype)
    total += optimizer_states * dtype_bytes(chosen.optimizer_state_dtype)
    return int(total)


def saved_activation_bytes_ratio(recipe: str | PrecisionRecipe) -> float:
    """Bytes autograd saves for backward under ``recipe`` relative to float32: compute bytes / 4.

    >>> saved_activation_bytes_ratio("bf16-autocast")
    0.5
    """
    return dtype_bytes(get_recipe(recipe).compute_dtype) / dtype_bytes("float32")


def autocast_for(recipe: str | PrecisionRecipe, device_type: str) -> contextlib.AbstractContextManager:
    """``torch.autocast(device_type, dtype=compute)`` when the recipe computes in a lower
    precision than it stores; otherwise a context that does nothing."""
    chosen = get_recipe(recipe)
    if not chosen.uses_autocast:
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=parse_dtype(chosen.compute_dtype))


def grad_scaler_for(recipe: str | PrecisionRecipe, device_type: str) -> torch.amp.GradScaler | None:
    """A ``torch.amp.GradScaler(device_type)`` when the recipe scales the loss, else None."""
    return torch.amp.GradScaler(device_type) if get_recipe(recipe).loss_scaling else None
