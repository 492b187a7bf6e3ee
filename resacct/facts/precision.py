"""Mixed-precision recipes as data: which dtype each piece of training state is kept in.

The recipes are :data:`resacct.facts.recipes.RECIPES`, the one table every command reads. A recipe
names the dtype of the parameters, of the compute (matmul outputs, activations and their
gradients in forward and backward), of the parameter gradients, of an optional master
copy of the weights, and of the optimizer states, and whether the loss is scaled. From that,
resacct predicts what torch will hold (checked in ``resacct/specs/train.claims.yaml``) and the
persistent bytes per parameter.

>>> RECIPES["bf16-autocast"].computes_in, RECIPES["bf16-autocast"].parameter_dtype
('bfloat16', 'float32')
>>> persistent_bytes_per_parameter("bf16-autocast", optimizer_states=2)  # AdamW: 4 + 4 + 2·4
16
"""

from __future__ import annotations

import contextlib

import torch

from resacct.facts.dtypes import dtype_bytes, parse_dtype
from resacct.facts.recipes import RECIPES, Recipe, get_recipe

__all__ = [
    "PrecisionRecipe",
    "RECIPES",
    "get_recipe",
    "persistent_bytes_per_parameter",
    "saved_activation_bytes_ratio",
    "autocast_for",
    "grad_scaler_for",
]


# The recipes are resacct.facts.recipes' one table (names and aliases); these names stay for the code that uses them.
PrecisionRecipe = Recipe


def persistent_bytes_per_parameter(recipe: str | Recipe, *, optimizer_states: int) -> int:
    """Bytes per parameter that live through the whole run: parameter + gradient + master copy
    + ``optimizer_states`` states (SGD 0, AdaGrad 1, Adam/AdamW 2). Activations not included."""
    chosen = get_recipe(recipe)
    total = dtype_bytes(chosen.parameter_dtype) + dtype_bytes(chosen.gradient_dtype)
    if chosen.master_dtype is not None:
        total += dtype_bytes(chosen.master_dtype)
    total += optimizer_states * dtype_bytes(chosen.optimizer_state_dtype)
    return int(total)


def saved_activation_bytes_ratio(recipe: str | Recipe) -> float:
    """Bytes autograd saves for backward under ``recipe`` relative to float32: compute bytes / 4.

    >>> saved_activation_bytes_ratio("bf16-autocast")
    0.5
    """
    return dtype_bytes(get_recipe(recipe).computes_in) / dtype_bytes("float32")


def autocast_for(recipe: str | Recipe, device_type: str) -> contextlib.AbstractContextManager:
    """``torch.autocast(device_type, dtype=compute)`` when the recipe computes in a lower
    precision than it stores; otherwise a context that does nothing."""
    chosen = get_recipe(recipe)
    if not chosen.uses_autocast:
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=parse_dtype(chosen.computes_in))


def grad_scaler_for(recipe: str | Recipe, device_type: str) -> torch.amp.GradScaler | None:
    """A ``torch.amp.GradScaler(device_type)`` when the recipe scales the loss, else None."""
    return torch.amp.GradScaler(device_type) if get_recipe(recipe).loss_scaling else None
