"""Models of the lecture, written to be read top to bottom.

- :class:`Linear` — a weight and a bias built on ``nn.Parameter`` (``x @ weight + bias``).
- :class:`Cruncher` — the lecture's deep linear model: ``num_layers`` D×D layers, then a D×1 final.
- :class:`TwoLayerNetwork` — x → w1 → h1 → w2 → h2, the network of the backward-FLOPs derivation.

>>> Cruncher(dim=64, num_layers=2).parameter_count() == 2 * 64 * 64 + 2 * 64 + 64 + 1
True
"""

from __future__ import annotations

import math

import torch
from jaxtyping import Float
from torch import nn

__all__ = ["Linear", "Cruncher", "TwoLayerNetwork", "cruncher_parameter_count"]


class Linear(nn.Module):
    """``y = x @ weight + bias`` with weight (in, out) initialised N(0, 1/in)."""

    def __init__(self, in_features: int, out_features: int, *, bias: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(in_features, out_features) / math.sqrt(in_features))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None

    def forward(self, x: Float[torch.Tensor, "*batch in_features"]) -> Float[torch.Tensor, "*batch out_features"]:
        y = x @ self.weight  # (*batch, out_features)
        return y + self.bias if self.bias is not None else y


class Cruncher(nn.Module):
    """The lecture's deep linear model: ``num_layers`` Linear(D, D), then Linear(D, 1)."""

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


def cruncher_parameter_count(dim: int, num_layers: int) -> int:
    """D²·layers + D·layers + D + 1 (weights and biases of the layers, then of the final)."""
    return dim * dim * num_layers + dim * num_layers + dim + 1


class TwoLayerNetwork(nn.Module):
    """x (B×D) → w1 (D×D) → h1 → w2 (D×K) → h2 (B×K), no biases, as in the lecture's derivation."""

    def __init__(self, dim: int, outputs: int):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(dim, dim) / math.sqrt(dim))
        self.w2 = nn.Parameter(torch.randn(dim, outputs) / math.sqrt(dim))

    def forward(self, x: Float[torch.Tensor, "batch dim"]) -> Float[torch.Tensor, "batch outputs"]:
        h1 = x @ self.w1  # (batch, dim)
        return h1 @ self.w2  # (batch, outputs)
