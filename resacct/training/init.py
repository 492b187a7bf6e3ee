"""Initialisation: how the scale of weights sets the scale of outputs, and what torch's
initialisers really draw.

Everything is a standard deviation (``_std``) or a root mean square (``_rms``) of numbers that
start with unit variance. With x ~ N(0, 1) of width ``fan_in`` and independent weights of
standard deviation σ, each output of ``x @ w`` sums ``fan_in`` products, so its standard
deviation is √fan_in · σ; through ``depth`` such layers it is (√fan_in · σ)^depth.

>>> matmul_output_std(fan_in=256, weight_std=1.0)
16.0
>>> matmul_output_std(fan_in=256, weight_std=scaled_normal_std(256))
1.0
>>> round(xavier_normal_std(fan_in=256, fan_out=64), 4)  # not 1/√256 = 0.0625
0.0791
>>> round(linear_default_weight_std(fan_in=3), 4)  # nn.Linear: kaiming_uniform_(a=√5) = 1/√(3·fan_in)
0.3333
"""

from __future__ import annotations

import math

import torch
from jaxtyping import Float

from resacct.errors import ResacctError

__all__ = [
    "scaled_normal_std",
    "xavier_normal_std",
    "kaiming_uniform_std",
    "linear_default_weight_std",
    "matmul_output_std",
    "deep_linear_output_rms",
    "truncated_normal_std",
    "truncated_fraction",
    "trunc_normal_init_",
]


def _positive_int(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ResacctError(f"{name} {value!r}: expected a whole number ≥ 1")
    return value


def _positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or not math.isfinite(value):
        raise ResacctError(f"{name} {value!r}: expected a finite number > 0")
    return float(value)


def scaled_normal_std(fan_in: int) -> float:
    """The lecture's rescaling: weights N(0, 1) divided by √fan_in, so std 1/√fan_in.

    >>> scaled_normal_std(64)
    0.125
    """
    return 1.0 / math.sqrt(_positive_int("fan_in", fan_in))


def xavier_normal_std(fan_in: int, fan_out: int, gain: float = 1.0) -> float:
    """Xavier/Glorot normal: gain · √(2 / (fan_in + fan_out)) — what ``xavier_normal_`` draws.

    It equals 1/√fan_in only when fan_in == fan_out.

    >>> xavier_normal_std(64, 64) == scaled_normal_std(64)
    True
    """
    _positive_int("fan_in", fan_in), _positive_int("fan_out", fan_out)
    return _positive("gain", gain) * math.sqrt(2.0 / (fan_in + fan_out))


def kaiming_uniform_std(fan_in: int, a: float = 0.0) -> float:
    """Standard deviation of ``kaiming_uniform_(w, a)`` (fan_in mode, leaky-relu gain).

    gain = √(2 / (1 + a²)); the bound is √3 · gain / √fan_in and a uniform U(−b, b) has std
    b/√3, so std = gain / √fan_in. ``a = 0`` (the function's default) gives √(2/fan_in).

    >>> round(kaiming_uniform_std(2), 6)
    1.0
    """
    if isinstance(a, bool) or not isinstance(a, (int, float)) or not math.isfinite(a):
        raise ResacctError(f"a {a!r}: expected a finite negative slope (0 for ReLU, √5 for nn.Linear)")
    gain = math.sqrt(2.0 / (1.0 + a * a))
    return gain / math.sqrt(_positive_int("fan_in", fan_in))


def linear_default_weight_std(fan_in: int) -> float:
    """``nn.Linear``'s default weight init, ``kaiming_uniform_(w, a=√5)``: std 1/√(3·fan_in).

    >>> round(linear_default_weight_std(12), 6)
    0.166667
    """
    return kaiming_uniform_std(fan_in, a=math.sqrt(5.0))


def matmul_output_std(fan_in: int, weight_std: float, input_std: float = 1.0) -> float:
    """Standard deviation of each output of ``x @ w``: √fan_in · weight_std · input_std.

    >>> matmul_output_std(100, 0.5)
    5.0
    """
    return math.sqrt(_positive_int("fan_in", fan_in)) * _positive("weight_std", weight_std) * _positive("input_std", input_std)


def deep_linear_output_rms(width: int, weight_std: float, depth: int, input_rms: float = 1.0) -> float:
    """RMS after ``depth`` linear layers of ``width`` inputs each: input_rms · (√width · weight_std)^depth.

    >>> deep_linear_output_rms(width=256, weight_std=1.0, depth=2)
    256.0
    """
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
        raise ResacctError(f"depth {depth!r}: expected a whole number ≥ 0")
    per_layer = matmul_output_std(width, weight_std)
    return _positive("input_rms", input_rms) * per_layer**depth


def _normal_pdf(z: float) -> float:
    return math.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)


def _normal_cdf(z: float) -> float:
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


def _standard_bounds(std: float, a: float, b: float, mean: float) -> tuple[float, float]:
    std = _positive("std", std)
    if not (isinstance(a, (int, float)) and isinstance(b, (int, float)) and a < b):
        raise ResacctError(f"bounds a={a!r}, b={b!r}: expected numbers with a < b (absolute values, not multiples of std)")
    return (a - mean) / std, (b - mean) / std


def truncated_fraction(std: float, a: float, b: float, mean: float = 0.0) -> float:
    """Probability that N(mean, std²) falls outside [a, b] — the share ``trunc_normal_`` redraws.

    ``a`` and ``b`` are absolute values, as in ``torch.nn.init.trunc_normal_``:

    >>> truncated_fraction(std=0.02, a=-2.0, b=2.0)  # 100 std away: nothing is cut
    0.0
    >>> round(truncated_fraction(std=1.0, a=-2.0, b=2.0), 4)
    0.0455
    """
    alpha, beta = _standard_bounds(std, a, b, mean)
    return max(0.0, 1.0 - (_normal_cdf(beta) - _normal_cdf(alpha)))


def truncated_normal_std(std: float, a: float, b: float, mean: float = 0.0) -> float:
    """Standard deviation of N(mean, std²) truncated to the absolute interval [a, b].

    >>> round(truncated_normal_std(std=1.0, a=-2.0, b=2.0), 4)
    0.8796
    >>> round(truncated_normal_std(std=0.02, a=-2.0, b=2.0) / 0.02, 6)
    1.0
    """
    alpha, beta = _standard_bounds(std, a, b, mean)
    kept = _normal_cdf(beta) - _normal_cdf(alpha)
    if kept <= 0.0:
        raise ResacctError(f"[{a}, {b}] holds no probability of N({mean}, {std}²); expected bounds around the mean")
    alpha_pdf = _normal_pdf(alpha) if math.isfinite(alpha) else 0.0
    beta_pdf = _normal_pdf(beta) if math.isfinite(beta) else 0.0
    alpha_term = alpha * alpha_pdf if math.isfinite(alpha) else 0.0
    beta_term = beta * beta_pdf if math.isfinite(beta) else 0.0
    variance = 1.0 + (alpha_term - beta_term) / kept - ((alpha_pdf - beta_pdf) / kept) ** 2
    return std * math.sqrt(max(variance, 0.0))


def trunc_normal_init_(
    weight: Float[torch.Tensor, "fan_in fan_out"],
    *,
    sigmas: float = 3.0,
    generator: torch.Generator | None = None,
) -> Float[torch.Tensor, "fan_in fan_out"]:
    """Fill a (fan_in, fan_out) weight in place with N(0, 1/fan_in) cut at ±``sigmas`` std.

    ``torch.nn.init.trunc_normal_`` takes absolute bounds, so the cut is passed as
    ``a = −sigmas·std, b = sigmas·std`` (passing ``a=-3, b=3`` with std 1/√fan_in cuts nothing).

    >>> w = trunc_normal_init_(torch.empty(64, 8))
    >>> bool(w.abs().max() <= 3 * scaled_normal_std(64))
    True
    """
    std = scaled_normal_std(weight.shape[0])
    bound = _positive("sigmas", sigmas) * std
    with torch.no_grad():
        return torch.nn.init.trunc_normal_(weight, mean=0.0, std=std, a=-bound, b=bound, generator=generator)
