"""Models of the lecture, written to be read top to bottom, and how to count what they hold.

- :class:`Linear` — a weight and a bias built on ``nn.Parameter`` (``x @ weight + bias``).
- :class:`Cruncher` — the lecture's deep linear model: ``num_layers`` D×D layers, then one D×1 final.
- :class:`TwoLayerNetwork` — x → w1 → h1 → w2 → h2, the network of the backward-FLOPs derivation.

resacct's :class:`Linear` stores its weight as (in, out), as the lecture does, so the final
layer's weight is D×1 (``nn.Linear`` would store 1×D: the same D elements).

>>> Cruncher(dim=64, num_layers=2).parameter_count() == 2 * 64 * 64 + 2 * 64 + 64 + 1
True
>>> cruncher_state_dict_sizes(dim=4, num_layers=1)
[('layers.0.weight', 16), ('layers.0.bias', 4), ('final.weight', 4), ('final.bias', 1)]
"""

from __future__ import annotations

import math

import torch
from jaxtyping import Float
from torch import nn

from resacct.errors import ResacctError

__all__ = [
    "Linear",
    "Cruncher",
    "TwoLayerNetwork",
    "cruncher_parameter_count",
    "cruncher_parameter_tensor_count",
    "cruncher_linear_layer_count",
    "cruncher_state_dict_sizes",
    "count_parameters",
    "count_parameter_tensors",
]


class Linear(nn.Module):
    """``y = x @ weight + bias`` with weight (in, out) initialised N(0, 1/in).

    >>> Linear(3, 2).weight.shape
    torch.Size([3, 2])
    """

    def __init__(self, in_features: int, out_features: int, *, bias: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(in_features, out_features) / math.sqrt(in_features))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None

    def forward(self, x: Float[torch.Tensor, "*batch in_features"]) -> Float[torch.Tensor, "*batch out_features"]:
        y = x @ self.weight  # (*batch, out_features)
        return y + self.bias if self.bias is not None else y


class Cruncher(nn.Module):
    """The lecture's deep linear model: ``num_layers`` Linear(D, D), then one Linear(D, 1).

    The final layer comes once, after all the D×D layers (not after each of them).

    >>> Cruncher(dim=8, num_layers=3)(torch.randn(5, 8)).shape
    torch.Size([5, 1])
    """

    def __init__(self, dim: int, num_layers: int):
        super().__init__()
        self.dim = dim
        self.layers = nn.ModuleList([Linear(dim, dim) for _ in range(num_layers)])
        self.final = Linear(dim, 1)

    def forward(self, x: Float[torch.Tensor, "batch dim"]) -> Float[torch.Tensor, "batch 1"]:
        for layer in self.layers:
            x = layer(x)  # (batch, dim)
        return self.final(x)  # (batch, 1)

    def parameter_count(self) -> int:
        return cruncher_parameter_count(self.dim, len(self.layers))


def _check_cruncher_shape(dim: int, num_layers: int) -> None:
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
        raise ResacctError(f"dim {dim!r}: expected a whole number ≥ 1")
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 0:
        raise ResacctError(f"num_layers {num_layers!r}: expected a whole number ≥ 0")


def cruncher_parameter_count(dim: int, num_layers: int) -> int:
    """D²·layers + D·layers + D + 1 (weights and biases of the layers, then of the final).

    >>> cruncher_parameter_count(4, 2)
    45
    """
    _check_cruncher_shape(dim, num_layers)
    return dim * dim * num_layers + dim * num_layers + dim + 1


def cruncher_parameter_tensor_count(num_layers: int) -> int:
    """Parameter tensors of a Cruncher: a weight and a bias per layer, plus the final's two.

    >>> cruncher_parameter_tensor_count(2)
    6
    """
    _check_cruncher_shape(1, num_layers)
    return 2 * num_layers + 2


def cruncher_linear_layer_count(num_layers: int) -> int:
    """Linear modules in a Cruncher: ``num_layers`` D×D layers and one final D×1 layer.

    >>> cruncher_linear_layer_count(2)
    3
    """
    _check_cruncher_shape(1, num_layers)
    return num_layers + 1


def cruncher_state_dict_sizes(dim: int, num_layers: int) -> list[tuple[str, int]]:
    """(name, numel) of every entry of a Cruncher's ``state_dict()``, in order.

    >>> cruncher_state_dict_sizes(2, 1)[-2:]
    [('final.weight', 2), ('final.bias', 1)]
    """
    _check_cruncher_shape(dim, num_layers)
    sizes: list[tuple[str, int]] = []
    for layer in range(num_layers):
        sizes += [(f"layers.{layer}.weight", dim * dim), (f"layers.{layer}.bias", dim)]
    return sizes + [("final.weight", dim), ("final.bias", 1)]


def count_parameters(module: nn.Module) -> int:
    """Elements of all the module's parameters (each shared parameter counted once).

    >>> count_parameters(Linear(3, 2))
    8
    """
    return sum(parameter.numel() for parameter in module.parameters())


def count_parameter_tensors(module: nn.Module) -> int:
    """How many parameter tensors the module holds (each shared parameter counted once).

    >>> count_parameter_tensors(Cruncher(dim=4, num_layers=2))
    6
    """
    return sum(1 for _ in module.parameters())


class TwoLayerNetwork(nn.Module):
    """x (B×D) → w1 (D×D) → h1 → w2 (D×K) → h2 (B×K), no biases, as in the lecture's derivation."""

    def __init__(self, dim: int, outputs: int):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(dim, dim) / math.sqrt(dim))
        self.w2 = nn.Parameter(torch.randn(dim, outputs) / math.sqrt(dim))

    def forward(self, x: Float[torch.Tensor, "batch dim"]) -> Float[torch.Tensor, "batch outputs"]:
        h1 = x @ self.w1  # (batch, dim)
        return h1 @ self.w2  # (batch, outputs)
