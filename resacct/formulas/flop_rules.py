"""The lecture's rule of thumb for training FLOPs — forward 2·tokens·params, backward 4·tokens·params,
step 6·tokens·params (``6ND``) — and how far an exact count lies from it (:func:`rule_deviation`).
:mod:`resacct.formulas.flops` has the exact counts these are compared with.
"""

from __future__ import annotations

from dataclasses import dataclass

from resacct.errors import ResacctError

__all__ = ["forward_flops_rule", "backward_flops_rule", "step_flops_rule", "RuleDeviation", "rule_deviation"]


def forward_flops_rule(tokens: int, params: int) -> int:
    """The lecture's forward pass: 2 × tokens × params.

    >>> forward_flops_rule(tokens=16384, params=32768 * 8192) == 2 * 16384 * 32768 * 8192
    True
    """
    return 2 * tokens * params


def backward_flops_rule(tokens: int, params: int) -> int:
    """The lecture's backward pass: 4 × tokens × params (a weight and an input gradient per matmul)."""
    return 4 * tokens * params


def step_flops_rule(tokens: int, params: int) -> int:
    """The lecture's training step: 6 × tokens × params (``6ND``).

    >>> step_flops_rule(tokens=15 * 10**12, params=70 * 10**9)
    6300000000000000000000000
    """
    return 6 * tokens * params


@dataclass(frozen=True)
class RuleDeviation:
    """How far an exact FLOP count is from the 2/4/6 rule."""

    phase: str
    rule_flops: int
    actual_flops: int

    @property
    def shortfall_flops(self) -> int:
        """rule − actual: FLOPs the rule counts that are never computed (negative if it under-counts)."""
        return self.rule_flops - self.actual_flops

    @property
    def ratio(self) -> float:
        """actual / rule (1.0 when the rule is exact)."""
        return self.actual_flops / self.rule_flops if self.rule_flops else float("nan")


_RULE_FACTORS = {"forward": 2, "backward": 4, "step": 6}


def rule_deviation(phase: str, actual_flops: int, tokens: int, params: int) -> RuleDeviation:
    """Compare an exact (predicted or traced) count with the 2/4/6 rule for ``phase``.

    >>> deviation = rule_deviation("step", actual_flops=368, tokens=2, params=45)
    >>> deviation.rule_flops, deviation.shortfall_flops, round(deviation.ratio, 3)
    (540, 172, 0.681)
    """
    if phase not in _RULE_FACTORS:
        raise ResacctError(f"phase {phase!r}: expected one of {', '.join(_RULE_FACTORS)}")
    return RuleDeviation(phase=phase, rule_flops=_RULE_FACTORS[phase] * tokens * params, actual_flops=actual_flops)
