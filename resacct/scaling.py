"""Compute-optimal sizing for a FLOP budget (Hoffmann et al. 2022, "Training Compute-Optimal
Large Language Models" — Chinchilla) and GPU-hours with a stated goodput.

Three ways to size a model for a budget C (training FLOPs, C ≈ 6·N·D):

- **20 tokens per parameter** (the rule of thumb drawn from the paper's Table 3, e.g. 1B → 20.2B
  tokens, 10B → 205.1B): D = 20·N, so N = √(C/120).
- **Approach 3, the parametric loss** L̂(N, D) = E + A/N^α + B/D^β with the paper's fitted
  E = 1.69, A = 406.4, B = 410.7, α = 0.34, β = 0.28 (§3.3, eq. 2 and Appendix D.2), minimised
  under C = 6ND (eq. 4): N_opt = G·(C/6)^a, D_opt = G⁻¹·(C/6)^b with G = (αA/(βB))^(1/(α+β)),
  a = β/(α+β), b = α/(α+β).
- **Approach 1** through the paper's own projections: Table 3 lists, for nine model sizes, the
  FLOPs and tokens approach 1 calls compute-optimal; a least-squares line through log N against
  log C (slope 0.498, the paper's a = 0.50) interpolates between them.
  Approach 2's prefactor is not published (only its exponent, Table 2: a = 0.49).

>>> n, d = chinchilla_approach3_optimum(5.76e23)      # Gopher's budget
>>> round(n / 1e9, 1), round(d / 1e12, 2)            # the paper's Figure 4 says 40B; see the claims
(32.2, 2.98)
>>> round(tokens_per_parameter_optimum(5.76e23)[0] / 1e9, 1)
69.3
>>> round(gpu_hours(6.3e24, peak_flops_per_sec=989.5e12, mfu=0.4, goodput=0.9) / 1e6, 2)
4.91
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from resacct.errors import ResacctError
from resacct.validation import positive_number as _positive

__all__ = [
    "ParametricLossFit",
    "CHINCHILLA_APPROACH3",
    "CHINCHILLA_EXPONENTS",
    "CHINCHILLA_TOKENS_PER_PARAMETER",
    "CHINCHILLA_TABLE3",
    "chinchilla_approach1_fit",
    "chinchilla_approach1_optimum",
    "chinchilla_loss",
    "chinchilla_approach3_optimum",
    "tokens_per_parameter_optimum",
    "gpu_hours",
]


@dataclass(frozen=True)
class ParametricLossFit:
    """L̂(N, D) = E + A/N^α + B/D^β, and where it came from."""

    E: float
    A: float
    B: float
    alpha: float
    beta: float
    source: str

    @property
    def parameter_exponent(self) -> float:
        """a in N_opt ∝ C^a: β/(α+β)."""
        return self.beta / (self.alpha + self.beta)

    @property
    def token_exponent(self) -> float:
        """b in D_opt ∝ C^b: α/(α+β)."""
        return self.alpha / (self.alpha + self.beta)

    @property
    def G(self) -> float:
        return (self.alpha * self.A / (self.beta * self.B)) ** (1 / (self.alpha + self.beta))


CHINCHILLA_APPROACH3 = ParametricLossFit(
    E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28,
    source="Hoffmann et al. 2022, §3.3 and Appendix D.2 (the constants as printed, two to four significant figures)",
)

#: Table 2 of Hoffmann et al. 2022: (a, b) with N_opt ∝ C^a and D_opt ∝ C^b, as printed.
CHINCHILLA_EXPONENTS: dict[str, tuple[float, float]] = {
    "approach 1 (minimum over training curves)": (0.50, 0.50),
    "approach 2 (IsoFLOP profiles)": (0.49, 0.51),
    "approach 3 (parametric loss)": (0.46, 0.54),
    "Kaplan et al. 2020": (0.73, 0.27),
}

CHINCHILLA_TOKENS_PER_PARAMETER = 20.0

#: Table 3 of Hoffmann et al. 2022 (approach 1's projections): (parameters, FLOPs, tokens) as printed.
CHINCHILLA_TABLE3: tuple[tuple[float, float, float], ...] = (
    (400e6, 1.92e19, 8.0e9), (1e9, 1.21e20, 20.2e9), (10e9, 1.23e22, 205.1e9), (67e9, 5.76e23, 1.5e12),
    (175e9, 3.85e24, 3.7e12), (280e9, 9.90e24, 5.9e12), (520e9, 3.43e25, 11.0e12), (1e12, 1.27e26, 21.2e12),
    (10e12, 1.30e28, 216.2e12),
)


def chinchilla_approach1_fit(rows: tuple[tuple[float, float, float], ...] = CHINCHILLA_TABLE3) -> tuple[float, float]:
    """(a, k) of N_opt = k·C^a, least squares of log N on log C through Table 3's rows.

    >>> a, k = chinchilla_approach1_fit()
    >>> round(a, 3)
    0.498
    """
    xs = [math.log(flops) for _, flops, _ in rows]
    ys = [math.log(parameters) for parameters, _, _ in rows]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum((x - mean_x) ** 2 for x in xs)
    return slope, math.exp(mean_y - slope * mean_x)


def chinchilla_approach1_optimum(compute_flops: float) -> tuple[float, float]:
    """(N_opt, D_opt) by approach 1, interpolated through Table 3 (D = C/(6N))."""
    a, k = chinchilla_approach1_fit()
    parameters = k * _positive("compute_flops", compute_flops) ** a
    return parameters, compute_flops / (6 * parameters)


def _fraction(name: str, value: object) -> float:
    number = _positive(name, value)
    if number > 1:
        raise ResacctError(f"{name} is {value!r}; expected a fraction in (0, 1], e.g. 0.9 for 90%")
    return number


def chinchilla_loss(parameters: float, tokens: float, fit: ParametricLossFit = CHINCHILLA_APPROACH3) -> float:
    """The fitted loss L̂(N, D) in nats per token (on MassiveText, the paper's data)."""
    return fit.E + fit.A / _positive("parameters", parameters) ** fit.alpha + fit.B / _positive("tokens", tokens) ** fit.beta


def chinchilla_approach3_optimum(compute_flops: float, fit: ParametricLossFit = CHINCHILLA_APPROACH3) -> tuple[float, float]:
    """(N_opt, D_opt) that minimise L̂ for ``compute_flops`` = 6·N·D (Hoffmann et al. 2022 eq. 4)."""
    sixth = _positive("compute_flops", compute_flops) / 6
    return fit.G * sixth ** fit.parameter_exponent, sixth ** fit.token_exponent / fit.G


def tokens_per_parameter_optimum(compute_flops: float, tokens_per_parameter: float = CHINCHILLA_TOKENS_PER_PARAMETER) -> tuple[float, float]:
    """(N, D) with D = r·N and 6·N·D = C: N = √(C/(6r))."""
    ratio = _positive("tokens_per_parameter", tokens_per_parameter)
    parameters = math.sqrt(_positive("compute_flops", compute_flops) / (6 * ratio))
    return parameters, ratio * parameters


def gpu_hours(compute_flops: float, *, peak_flops_per_sec: float, mfu: float, goodput: float = 1.0) -> float:
    """Device-hours to do ``compute_flops`` at ``mfu`` of the peak, when only ``goodput`` of the
    reserved time makes progress (failures, restarts, checkpoint stalls, evaluation)."""
    useful = _positive("peak_flops_per_sec", peak_flops_per_sec) * _fraction("mfu", mfu) * _fraction("goodput", goodput)
    return _positive("compute_flops", compute_flops) / useful / 3600
