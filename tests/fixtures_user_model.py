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
    """Token ids in (an Embedding first): --seq makes them, or --input-shape with an integer --input-dtype."""
    return nn.Sequential(nn.Embedding(vocab, dim), nn.Linear(dim, vocab))


def not_a_module() -> str:
    return "a string"


NOT_CALLABLE = 3


# ── factories and models that fail inside the user's code: one line naming the frame ──


def raises_in_factory(width: int = 8) -> nn.Module:
    raise ValueError(f"width {width} must be even")


def type_error_in_factory() -> nn.Module:
    return nn.Linear(4, "wide")  # a TypeError inside, not a refused argument


class TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.layer(x) * mask


class ShapeMismatch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(4, 8), nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.up(x))  # 8 features into a Linear of 16


class Detached(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x).detach()


class ReturnsText(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> str:
        return "done"


class _FailingBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def, override]
        return x.clone()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def, override]
        raise ArithmeticError("no gradient for you")


class BackwardRaises(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _FailingBackward.apply(self.layer(x))


def two_inputs() -> nn.Module:
    return TwoInputs()


def shape_mismatch() -> nn.Module:
    return ShapeMismatch()


def detached() -> nn.Module:
    return Detached()


def returns_text() -> nn.Module:
    return ReturnsText()


def backward_raises() -> nn.Module:
    return BackwardRaises()


class MatrixVector(nn.Module):
    """torch.mv, which FlopCounterMode has no formula for: a matmul-class op counted as 0."""

    def __init__(self, width: int = 4) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(torch.mv(self.weight, x.reshape(-1)))


def matrix_vector(width: int = 4) -> nn.Module:
    return MatrixVector(width)


# ── user code that ends the process, contains itself, hangs or allocates a lot (issue 26: guards) ──


def exits_in_factory(code: int | str | None = 0) -> nn.Module:
    import sys

    sys.exit(code)


def raises_system_exit() -> nn.Module:
    raise SystemExit


def interrupted_in_factory() -> nn.Module:
    raise KeyboardInterrupt


class ExitsInForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import sys

        sys.exit(0)


def exits_in_forward() -> nn.Module:
    return ExitsInForward()


def contains_itself() -> nn.Module:
    model = nn.Sequential(nn.Linear(4, 4))
    model.again = model  # nn.Module.__setattr__ registers it as a child: model.modules() would recurse
    return model


def two_module_cycle() -> nn.Module:
    outer, inner = nn.Sequential(nn.Linear(4, 4)), nn.Sequential(nn.Linear(4, 4))
    outer.inner = inner
    inner.outer = outer
    return outer


def shared_module() -> nn.Module:
    """One Linear under two names (tied): a tree with a shared leaf, no cycle."""
    shared = nn.Linear(4, 4)
    return nn.Sequential(shared, nn.Tanh(), shared)


class SleepyForward(nn.Module):
    """A forward that sleeps ``seconds`` (a hanging model)."""

    def __init__(self, seconds: float = 60.0) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 4)
        self.seconds = seconds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import time

        time.sleep(self.seconds)
        return self.layer(x)


def sleepy(seconds: float = 60.0) -> nn.Module:
    return SleepyForward(seconds)


def slow_factory(seconds: float = 60.0) -> nn.Module:
    import time

    time.sleep(seconds)
    return nn.Linear(4, 4)


class HungryForward(nn.Module):
    """A forward that makes a temporary of ``elements`` float32 (4 bytes each), made without a device."""

    def __init__(self, elements: int = 10**9) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 4)
        self.elements = elements

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x) + torch.ones(self.elements).sum()


def hungry(elements: int = 10**9) -> nn.Module:
    return HungryForward(elements)
