"""Measuring initialisation with torch: the spread of ``x @ w`` and of deep linear stacks, and
what ``torch.nn.init`` (trunc_normal_, xavier_normal_, kaiming_uniform_, normal_) really draws.

Every measurement draws from a ``torch.Generator`` seeded by the claim, on sizes large enough
that sampling noise sits well inside the claim's tolerance (tens of thousands of numbers)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from hypothesis import strategies as st
from jaxtyping import Float
from torch import nn

from resacct.harness.registry import Outcome, check
from resacct.harness.strategies import strategy
from resacct.training.init import (
    deep_linear_output_rms,
    kaiming_uniform_std,
    linear_default_weight_std,
    matmul_output_std,
    scaled_normal_std,
    truncated_normal_std,
    xavier_normal_std,
)


@strategy("init_fan")
def _fans() -> st.SearchStrategy:
    return st.sampled_from([16, 64, 256, 1024])


@strategy("init_width")
def _widths() -> st.SearchStrategy:
    return st.sampled_from([64, 128, 256])


@strategy("init_xavier_fan")
def _xavier_fans() -> st.SearchStrategy:
    return st.sampled_from([64, 128, 256, 512])  # ≥ 4096 weights: the std is measured within ~1%


@strategy("init_depth")
def _depths() -> st.SearchStrategy:
    return st.integers(1, 8)


@strategy("init_std")
def _stds() -> st.SearchStrategy:
    return st.sampled_from([0.02, 0.1, 0.5, 1.0, 2.0, 4.0])


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


_WEIGHT_STD: dict[str, Callable[[int], float]] = {
    "unit": lambda fan_in: 1.0,
    "scaled": scaled_normal_std,  # 1/√fan_in
}


@check("init.matmul_output_std", evidence="measured")
def matmul_output_spread(fan_in: int, weights: str, seed: int, batch: int = 256, fan_out: int = 256) -> Outcome:
    """``y.std()`` of y = x @ w with x ~ N(0, 1) of shape (batch, fan_in) and w ~ N(0, σ²):
    σ = 1 (weights: unit) or 1/√fan_in (weights: scaled)."""
    generator = _generator(seed)
    weight_std = _WEIGHT_STD[weights](fan_in)
    x = torch.randn(batch, fan_in, generator=generator)  # (batch, fan_in)
    w = torch.randn(fan_in, fan_out, generator=generator) * weight_std  # (fan_in, fan_out)
    y = x @ w  # (batch, fan_out)
    return Outcome(measured=y.std().item(), predicted=matmul_output_std(fan_in, weight_std))


def _normal(weight: Float[torch.Tensor, "out in"], generator: torch.Generator) -> None:
    nn.init.normal_(weight, generator=generator)  # mean 0, std 1: the function's defaults


def _scaled_normal(weight: Float[torch.Tensor, "out in"], generator: torch.Generator) -> None:
    nn.init.normal_(weight, std=scaled_normal_std(weight.shape[1]), generator=generator)


def _kaiming_uniform(weight: Float[torch.Tensor, "out in"], generator: torch.Generator) -> None:
    nn.init.kaiming_uniform_(weight, generator=generator)  # the function's defaults: a=0, leaky_relu


def _linear_default(weight: Float[torch.Tensor, "out in"], generator: torch.Generator) -> None:
    nn.init.kaiming_uniform_(weight, a=math.sqrt(5), generator=generator)  # as nn.Linear.reset_parameters


_INITIALISERS: dict[str, tuple[Callable[[torch.Tensor, torch.Generator], None], Callable[[int], float]]] = {
    "normal": (_normal, lambda fan_in: 1.0),
    "scaled_normal": (_scaled_normal, scaled_normal_std),
    "kaiming_uniform": (_kaiming_uniform, kaiming_uniform_std),
    "linear_default": (_linear_default, linear_default_weight_std),
}


@check("init.deep_variance_ratio", evidence="measured", threads_matter=True)  # a wide matmul's sums follow the threads: the last bits move
def deep_variance_ratio(init: str, width: int, depth: int, seed: int, batch: int = 256) -> Outcome:
    """mean(h²) / mean(x²) after ``depth`` bias-free linear layers (width×width, weights stored
    (out, in) as in nn.Linear, filled by the named torch.nn.init function), x ~ N(0, 1)."""
    fill, std_of = _INITIALISERS[init]
    generator = _generator(seed)
    x = torch.randn(batch, width, generator=generator)  # (batch, width)
    h = x.double()
    for _ in range(depth):
        weight = torch.empty(width, width)  # (out, in)
        fill(weight, generator)
        h = h @ weight.double().T  # (batch, width)
    ratio = (h.pow(2).mean() / x.double().pow(2).mean()).item()
    return Outcome(measured=ratio, predicted=deep_linear_output_rms(width, std_of(width), depth) ** 2)


@check("init.trunc_normal", evidence="measured")
def trunc_normal(statistic: str, std: float, a: float, b: float, seed: int = 0, numel: int = 65536) -> Outcome:
    """A statistic of ``torch.nn.init.trunc_normal_(x, mean=0, std=std, a=a, b=b)`` over
    ``numel`` draws: ``std_ratio`` (x.std() / std), ``max_abs`` (max |x|) or
    ``max_abs_in_stds`` (max |x| / std)."""
    x = nn.init.trunc_normal_(torch.empty(numel), mean=0.0, std=std, a=a, b=b, generator=_generator(seed))
    statistics = {
        "std_ratio": (lambda: x.std().item() / std, lambda: truncated_normal_std(std, a, b) / std),
        "max_abs": (lambda: x.abs().max().item(), lambda: None),
        "max_abs_in_stds": (lambda: x.abs().max().item() / std, lambda: None),
    }
    measure, predict = statistics[statistic]
    return Outcome(measured=measure(), predicted=predict())


@check("init.xavier_normal_std", evidence="measured", quantities=("xavier_std",))
def xavier_normal_spread(fan_in: int, seed: int, fan_out: int | None = None) -> Outcome:
    """``w.std()`` of ``torch.nn.init.xavier_normal_(w)`` for w stored (fan_out, fan_in) as in
    nn.Linear (fan_out defaults to fan_in)."""
    fan_out = fan_in if fan_out is None else fan_out
    weight = nn.init.xavier_normal_(torch.empty(fan_out, fan_in), generator=_generator(seed))
    predicted = xavier_normal_std(fan_in, fan_out)
    return Outcome(measured=weight.std().item(), predicted=predicted, quantities={"xavier_std": predicted})


@check("init.shape0_fix_output_std", evidence="measured")
def shape0_fix_output_std(layout: str, fan_in: int, fan_out: int, seed: int = 0, batch: int = 512) -> Outcome:
    """``y.std()`` for x ~ N(0, 1) through one bias-free layer whose weight was filled with
    ``normal_(w, std=1/√w.shape[0])`` — seed 004's fix. ``layout``: ``nn.Linear`` (weight stored
    (out, in), y = x @ w.T) or ``x@w`` (weight stored (in, out), as resacct's Linear)."""
    generator = _generator(seed)
    if layout == "nn.Linear":
        layer = nn.Linear(fan_in, fan_out, bias=False)
        weight, forward = layer.weight, layer
    elif layout == "x@w":
        weight = nn.Parameter(torch.empty(fan_in, fan_out))
        forward = lambda x: x @ weight  # noqa: E731
    else:
        raise ValueError(f"layout {layout!r}: expected nn.Linear or x@w")
    with torch.no_grad():
        nn.init.normal_(weight, std=1.0 / math.sqrt(weight.shape[0]), generator=generator)
        y = forward(torch.randn(batch, fan_in, generator=generator))
    return Outcome(measured=y.std().item(), predicted=matmul_output_std(fan_in, 1.0 / math.sqrt(weight.shape[0])))
