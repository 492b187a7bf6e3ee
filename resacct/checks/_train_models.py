"""Small models and measurements both training check modules use (:mod:`resacct.checks.train`,
:mod:`resacct.checks.train_precision`). The leading underscore keeps the claims registry from
loading it as an area of checks."""

from __future__ import annotations

import torch
from torch import nn

from resacct.training.models import Cruncher
from resacct.training.seeding import seed_torch


def _cruncher(seed: int, dim: int = 8, num_layers: int = 2) -> Cruncher:
    with torch.random.fork_rng():
        seed_torch(seed)
        return Cruncher(dim=dim, num_layers=num_layers)


def _dtype(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def _saved_activation_bytes(model: nn.Module, x: torch.Tensor, autocast_dtype: torch.dtype | None = None, include_weights: bool = False) -> int:
    """Bytes of the tensors autograd saves for backward during ``model(x)``, by
    ``saved_tensors_hooks``; parameters themselves are left out unless ``include_weights``."""
    parameter_storages = {parameter.untyped_storage().data_ptr() for parameter in model.parameters()}
    seen: set[int] = set()
    total = [0]

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        pointer = storage.data_ptr()
        if pointer not in seen and (include_weights or pointer not in parameter_storages):
            seen.add(pointer)
            total[0] += storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        with torch.autocast("cpu", dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None):
            output = model(x)
    del output
    return total[0]
