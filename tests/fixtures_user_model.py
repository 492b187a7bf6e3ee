"""A user's own models for ``resacct account --model tests.fixtures_user_model:FACTORY`` tests:
a factory returning (model, example input), one with an ``example_input`` method, one resacct
has no formula for (a convolution), and factories that break the contract."""

from __future__ import annotations

import torch
from torch import nn


class TinyConv(nn.Module):
    """A 1-D convolution then a Linear head: no resacct formula, measured only."""

    def __init__(self, channels: int = 4, length: int = 16):
        super().__init__()
        self.length = length
        self.conv = nn.Conv1d(1, channels, kernel_size=3, padding=1)
        self.head = nn.Linear(channels * length, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.conv(x)).flatten(1))

    def example_input(self, batch: int) -> torch.Tensor:
        return torch.randn(batch, 1, self.length)


def build_with_example(width: int = 8) -> tuple[nn.Module, torch.Tensor]:
    """An MLP and the batch it trains on."""
    return nn.Sequential(nn.Linear(width, 2 * width), nn.Tanh(), nn.Linear(2 * width, 3)), torch.randn(5, width)


def build_conv(channels: int = 4) -> nn.Module:
    return TinyConv(channels=channels)


def build_embedding(vocab: int = 10, dim: int = 4) -> nn.Module:
    """Integer input: needs --input-shape with an integer --input-dtype."""
    return nn.Sequential(nn.Embedding(vocab, dim), nn.Linear(dim, vocab))


def not_a_module() -> str:
    return "a string"


NOT_CALLABLE = 3
