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
- **Approach 2** (IsoFLOP profiles) the same way through its projections, Table A3 (Appendix
  D.3, p. 26; nine sizes, FLOPs and tokens): slope 0.490 for N and 0.510 for D, the paper's
  a = 0.49 and b = 0.51 (Table 2). The paper prints no prefactor of its own (Figure 3's fitted
  lines are drawn, not written); the table's rows fix it.

:func:`chinchilla_optimum` picks one by number; approach 1 is the default there and in
``resacct optimal`` because Table 3 is the paper's headline projection and Chinchilla itself
(70B on 1.4T tokens for Gopher's 5.76e23 FLOPs) sits on it, while approach 3 with the printed
constants misses the paper's own projections (32.2B, not 40B, at Gopher's budget).

>>> n, d = chinchilla_approach3_optimum(5.76e23)      # Gopher's budget
>>> round(n / 1e9, 1), round(d / 1e12, 2)            # the paper's Figure 4 says 40B; see the claims
(32.2, 2.98)
>>> round(chinchilla_approach2_optimum(5.76e23)[0] / 1e9, 1)  # Table A3 fit at Gopher's budget
63.4
>>> round(tokens_per_parameter_optimum(5.76e23)[0] / 1e9, 1)
69.3
>>> round(gpu_hours(6.3e24, peak_flops_per_sec=989.5e12, mfu=0.4, goodput=0.9) / 1e6, 2)
4.91
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from resacct.errors import ResacctError
from resacct.formulas.validation import positive_number as _positive

__all__ = [
    "ParametricLossFit",
    "CHINCHILLA_APPROACH3",
    "CHINCHILLA_EXPONENTS",
    "CHINCHILLA_TOKENS_PER_PARAMETER",
    "CHINCHILLA_TABLE3",
    "chinchilla_approach1_fit",
    "chinchilla_approach1_optimum",
    "CHINCHILLA_TABLE_A3_APPROACH2",
    "CHINCHILLA_TABLE_A3_APPROACH3",
    "CHINCHILLA_APPROACHES",
    "DEFAULT_CHINCHILLA_APPROACH",
    "chinchilla_approach2_fit",
    "chinchilla_approach2_optimum",
    "chinchilla_optimum",
    "chinchilla_loss",
    "chinchilla_approach3_optimum",
    "tokens_per_parameter_optimum",
    "gpu_hours",
    "CHINCHILLA_FITTED_PARAMETERS",
    "CHINCHILLA_FITTED_TOKENS",
    "CHINCHILLA_FITTED_MIN_FLOPS",
    "CHINCHILLA_PROJECTED_MAX_FLOPS",
    "chinchilla_budget_warning",
    "check_whole_optimum",
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


#: Table A3 of Hoffmann et al. 2022 (Appendix D.3, p. 26), approach 2's projections: (parameters,
#: FLOPs, tokens) as printed.
CHINCHILLA_TABLE_A3_APPROACH2: tuple[tuple[float, float, float], ...] = (
    (400e6, 1.84e19, 7.7e9), (1e9, 1.20e20, 20.0e9), (10e9, 1.32e22, 219.5e9), (67e9, 6.88e23, 1.7e12),
    (175e9, 4.54e24, 4.3e12), (280e9, 1.18e25, 7.1e12), (520e9, 4.19e25, 13.4e12), (1e12, 1.59e26, 26.5e12),
    (10e12, 1.75e28, 292.0e12),
)

#: Table A3, approach 3's projections, as printed — the 175B row's 1.26e+24 FLOPs included, although
#: its own 12.0T tokens need 6·N·D = 1.26e25 (a claim keeps that erratum).
CHINCHILLA_TABLE_A3_APPROACH3: tuple[tuple[float, float, float], ...] = (
    (400e6, 2.21e19, 9.2e9), (1e9, 1.62e20, 27.1e9), (10e9, 2.46e22, 410.1e9), (67e9, 1.71e24, 4.1e12),
    (175e9, 1.26e24, 12.0e12), (280e9, 3.52e25, 20.1e12), (520e9, 1.36e26, 43.5e12), (1e12, 5.65e26, 94.1e12),
    (10e12, 8.55e28, 1425.5e12),
)

#: The runs the paper fitted (Hoffmann et al. 2022, abstract and §3): "over 400 language models
#: ranging from 70 million to over 16 billion parameters on 5 to 500 billion tokens".
CHINCHILLA_FITTED_PARAMETERS = (70e6, 16e9)
CHINCHILLA_FITTED_TOKENS = (5e9, 500e9)
#: The smallest budget of a fitted run, 6 × 70M × 5B = 2.1e18 FLOPs: below it every optimum is
#: an extrapolation downwards, which the paper never makes.
CHINCHILLA_FITTED_MIN_FLOPS = 6 * CHINCHILLA_FITTED_PARAMETERS[0] * CHINCHILLA_FITTED_TOKENS[0]
#: The largest budget the paper projects to itself (Table 3's and Table A3's last rows: 10T parameters).
CHINCHILLA_PROJECTED_MAX_FLOPS = max(row[1] for row in (*CHINCHILLA_TABLE3, *CHINCHILLA_TABLE_A3_APPROACH2))

#: The approaches ``resacct optimal --approach`` offers, and its default (see the module docstring).
CHINCHILLA_APPROACHES = (1, 2, 3)
DEFAULT_CHINCHILLA_APPROACH = 1


def _log_fit(pairs: list[tuple[float, float]]) -> tuple[float, float]:
    """(slope, e^intercept) of the least-squares line of log y on log x."""
    xs = [math.log(x) for x, _ in pairs]
    ys = [math.log(y) for _, y in pairs]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum((x - mean_x) ** 2 for x in xs)
    return slope, math.exp(mean_y - slope * mean_x)


def chinchilla_approach1_fit(rows: tuple[tuple[float, float, float], ...] = CHINCHILLA_TABLE3) -> tuple[float, float]:
    """(a, k) of N_opt = k·C^a, least squares of log N on log C through Table 3's rows.

    >>> a, k = chinchilla_approach1_fit()
    >>> round(a, 3)
    0.498
    """
    return _log_fit([(flops, parameters) for parameters, flops, _ in rows])


def chinchilla_approach2_fit(tokens: bool = False) -> tuple[float, float]:
    """(a, k) of N_opt = k·C^a through Table A3's approach-2 rows; with ``tokens``, (b, k') of
    D_opt = k'·C^b through the same rows.

    >>> round(chinchilla_approach2_fit()[0], 3), round(chinchilla_approach2_fit(tokens=True)[0], 3)
    (0.49, 0.51)
    """
    column = 2 if tokens else 0
    return _log_fit([(row[1], row[column]) for row in CHINCHILLA_TABLE_A3_APPROACH2])


def chinchilla_approach2_optimum(compute_flops: float) -> tuple[float, float]:
    """(N_opt, D_opt) by approach 2 (IsoFLOP profiles), through Table A3 (D = C/(6N))."""
    a, k = chinchilla_approach2_fit()
    parameters = k * _positive("compute_flops", compute_flops) ** a
    return parameters, compute_flops / (6 * parameters)


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


def chinchilla_optimum(compute_flops: float, approach: int = DEFAULT_CHINCHILLA_APPROACH) -> tuple[float, float]:
    """(N_opt, D_opt) for ``compute_flops`` by Chinchilla's approach 1, 2 or 3.

    >>> [round(chinchilla_optimum(5.76e23, k)[0] / 1e9, 1) for k in (1, 2, 3)]
    [67.8, 63.4, 32.2]
    >>> chinchilla_optimum(1e24, 4)
    Traceback (most recent call last):
    ...
    resacct.errors.ResacctError: Chinchilla approach 4 is not one of 1, 2, 3 (1: Table 3, 2: IsoFLOP profiles / Table A3, 3: parametric loss)
    """
    if isinstance(approach, bool) or approach not in CHINCHILLA_APPROACHES:
        raise ResacctError(f"Chinchilla approach {approach!r} is not one of 1, 2, 3 "
                           "(1: Table 3, 2: IsoFLOP profiles / Table A3, 3: parametric loss)")
    if approach == 1:
        return chinchilla_approach1_optimum(compute_flops)
    if approach == 2:
        return chinchilla_approach2_optimum(compute_flops)
    return chinchilla_approach3_optimum(compute_flops)


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


def chinchilla_budget_warning(compute_flops: float) -> str | None:
    """One line when ``compute_flops`` lies outside what the Chinchilla fits rest on, else None.

    >>> chinchilla_budget_warning(5.76e23) is None
    True
    >>> chinchilla_budget_warning(1e10)[:62]
    '1e+10 FLOPs is below the smallest budget the Chinchilla fits r'
    """
    flops = _positive("compute_flops", compute_flops)
    fitted = (f"the paper fitted runs of 70M-16B parameters on 5B-500B tokens ({CHINCHILLA_FITTED_MIN_FLOPS:.2g} FLOPs and up) "
              f"and projected up to {CHINCHILLA_PROJECTED_MAX_FLOPS:.3g} FLOPs (10T parameters, Tables 3 and A3)")
    if flops < CHINCHILLA_FITTED_MIN_FLOPS:
        return f"{flops:.4g} FLOPs is below the smallest budget the Chinchilla fits rest on: an extrapolation; {fitted}"
    if flops > CHINCHILLA_PROJECTED_MAX_FLOPS:
        return f"{flops:.4g} FLOPs is beyond the paper's own projections: an extrapolation; {fitted}"
    return None


def check_whole_optimum(compute_flops: float, parameters: float, tokens: float, what: str, remedy: str = "") -> None:
    """Refuse an optimum of fewer than one parameter or one token: no fit means anything there.

    >>> check_whole_optimum(1.0, 0.099, 1.68, "approach 1")
    Traceback (most recent call last):
    ...
    resacct.errors.ResacctError: a budget of 1 FLOPs gives approach 1 0.099 parameters × 1.68 tokens, fewer than one; expected a budget of at least 2.1e+18 FLOPs, where the Chinchilla fits rest on runs of 70M-16B parameters on 5B-500B tokens
    """
    if parameters < 1 or tokens < 1:
        raise ResacctError(f"a budget of {compute_flops:.4g} FLOPs gives {what} {parameters:.3g} parameters × {tokens:.3g} tokens, fewer than one; "
                           f"expected {remedy or 'a budget'} of at least {CHINCHILLA_FITTED_MIN_FLOPS:.2g} FLOPs, where the Chinchilla fits rest on runs of "
                           "70M-16B parameters on 5B-500B tokens")
