"""Measuring what models hold — parameters, ``state_dict`` entries, layers — with torch itself."""

from __future__ import annotations

import torch
from torch import nn

from resacct.harness.registry import Outcome, check
from resacct.training.models import (
    Cruncher,
    cruncher_linear_layer_count,
    cruncher_parameter_count,
    cruncher_parameter_tensor_count,
    cruncher_state_dict_sizes,
)
from resacct.training.seeding import seed_torch


def _cruncher(dim: int, num_layers: int, seed: int = 0) -> Cruncher:
    seed_torch(seed)
    return Cruncher(dim=dim, num_layers=num_layers)


@check("models.cruncher_parameters", evidence="measured", quantities=("parameter_tensors",))
def cruncher_parameters(dim: int, num_layers: int) -> Outcome:
    """Σ numel over ``model.parameters()`` of a real Cruncher, with how many parameter tensors."""
    model = _cruncher(dim, num_layers)
    parameters = list(model.parameters())
    return Outcome(
        measured=sum(parameter.numel() for parameter in parameters),
        predicted=cruncher_parameter_count(dim, num_layers),
        quantities={"parameter_tensors": len(parameters)},
    )


@check("models.cruncher_state_dict_numel", evidence="measured", quantities=("entries",))
def cruncher_state_dict_numel(dim: int, num_layers: int) -> Outcome:
    """Σ numel over the values of a real Cruncher's ``state_dict()``, with its number of entries."""
    state = _cruncher(dim, num_layers).state_dict()
    return Outcome(
        measured=sum(tensor.numel() for tensor in state.values()),
        predicted=cruncher_parameter_count(dim, num_layers),
        quantities={"entries": len(state)},
    )


@check("models.cruncher_state_dict_entries", evidence="measured")
def cruncher_state_dict_entries(dim: int, num_layers: int) -> Outcome:
    """How many entries a real Cruncher's ``state_dict()`` has."""
    return Outcome(
        measured=len(_cruncher(dim, num_layers).state_dict()),
        predicted=cruncher_parameter_tensor_count(num_layers),
    )


@check("models.cruncher_state_dict_sizes", evidence="measured")
def cruncher_state_dict_sizes_measured(dim: int, num_layers: int) -> Outcome:
    """``[[name, numel], …]`` of a real Cruncher's ``state_dict()``, in order."""
    state = _cruncher(dim, num_layers).state_dict()
    return Outcome(
        measured=[[name, tensor.numel()] for name, tensor in state.items()],
        predicted=[[name, size] for name, size in cruncher_state_dict_sizes(dim, num_layers)],
    )


@check("models.cruncher_entry_shape", evidence="measured")
def cruncher_entry_shape(dim: int, num_layers: int, entry: str) -> Outcome:
    """``list(shape)`` of one named ``state_dict()`` entry of a real Cruncher."""
    return Outcome(measured=list(_cruncher(dim, num_layers).state_dict()[entry].shape))


@check("models.cruncher_linear_layers", evidence="measured", quantities=("final_layers",))
def cruncher_linear_layers(dim: int, num_layers: int) -> Outcome:
    """How many modules with a ``weight`` parameter a real Cruncher holds, with how many of them
    sit under ``final`` (the output layer)."""
    model = _cruncher(dim, num_layers)
    linear = [name for name, module in model.named_modules() if isinstance(getattr(module, "weight", None), nn.Parameter)]
    return Outcome(
        measured=len(linear),
        predicted=cruncher_linear_layer_count(num_layers),
        quantities={"final_layers": sum(1 for name in linear if name.startswith("final"))},
    )


@check("models.cruncher_output_shape", evidence="measured")
def cruncher_output_shape(batch: int, dim: int, num_layers: int) -> Outcome:
    """``list(model(x).shape)`` for a real Cruncher and x of shape (batch, dim)."""
    model = _cruncher(dim, num_layers)
    return Outcome(measured=list(model(torch.randn(batch, dim)).shape), predicted=[batch, 1])


@check("models.parameter_is_tensor", evidence="measured")
def parameter_is_tensor(rows: int = 2, cols: int = 3) -> Outcome:
    """``[isinstance(p, torch.Tensor), p.requires_grad]`` for ``p = nn.Parameter(torch.randn(rows, cols))``."""
    parameter = nn.Parameter(torch.randn(rows, cols))
    return Outcome(measured=[isinstance(parameter, torch.Tensor), parameter.requires_grad])


class _Holder(nn.Module):
    def __init__(self, as_parameter: bool):
        super().__init__()
        weight = torch.randn(3, 2) * 0.02
        self.weight = nn.Parameter(weight) if as_parameter else weight


@check("models.registered_parameters", evidence="measured")
def registered_parameters(attribute: str) -> Outcome:
    """How many tensors ``module.parameters()`` yields after ``self.weight = …`` is assigned
    an ``nn.Parameter`` (attribute: parameter) or a plain tensor (attribute: tensor)."""
    module = _Holder(as_parameter={"parameter": True, "tensor": False}[attribute])
    return Outcome(measured=len(list(module.parameters())))
