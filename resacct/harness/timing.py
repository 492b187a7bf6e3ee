"""Deciding a timing claim on a noisy machine: in rounds, or *inconclusive* — never a guess.

A timing check (registered with ``timing=True``) already samples its kernels in turn and takes
best-ofs. The harness adds rounds on top: one round is one run of the check, with the share of
a CPU this process got meanwhile (process CPU seconds ÷ wall seconds: a loaded machine takes the
core away and the share drops).

- A round is **quiet** when the process had ≥ 85 % of a core, and **clear** when its value lies
  at least a factor 1.1 away from every ``at_least``/``at_most`` bound (non-numeric statements, such as a
  roofline's "memory"/"compute", are clear).
- One quiet, clear round decides, either way.
- Otherwise up to three rounds run. Rounds that all pass, with their spread (max ÷ min − 1)
  smaller than the median's margin to the bound, decide *holds* (a load cannot make them agree by
  chance). A claim **fails only on quiet rounds**: load only ever adds time, and a time measured
  under load is the load's, not the machine's.
- Anything else is **inconclusive (noisy)**: the message gives every round's value, its CPU share,
  the spread, the margin and the load average. ``RESACCT_REQUIRE_TIMING=1`` turns it into a failure.

Spread and margin are both factors (timings and their ratios are positive): the spread of rounds
0.9 and 1.2 is 1.2 ÷ 0.9 − 1 = 33 %; a median of 1.0 under ``at_most: 1.5`` has a margin of
1.5 ÷ 1.0 − 1 = 50 %. A spec's bound should sit at least the cube of its idle spread away
((1 + margin) ≥ (1 + spread)³, "3× the spread" on a log scale; ``benchmarks/timing_spread.py``
prints both).

>>> relative_margin(1.2, at_least=1.0, at_most=None)
0.2
>>> relative_margin(0.96, at_least=0.4, at_most=1.5)
0.5625
>>> spread([0.9, 1.2, 1.0])
0.333333
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from resacct.harness.evaluate import ClaimFailure, Measurement, Verdict, evaluate_claim, measure_claim, remember_measurement
from resacct.harness.loader import LoadedClaim
from resacct.harness.registry import get_check

__all__ = ["Inconclusive", "Round", "decide_timing_claim", "measure_with_cpu_share", "relative_margin", "spread", "INCONCLUSIVE_PREFIX", "REQUIRE_TIMING_VARIABLE",
           "MAX_ROUNDS", "QUIET_CPU_SHARE", "CLEAR_MARGIN"]

REQUIRE_TIMING_VARIABLE = "RESACCT_REQUIRE_TIMING"
INCONCLUSIVE_PREFIX = "inconclusive (noisy): "
MAX_ROUNDS = 3
QUIET_CPU_SHARE = 0.85
CLEAR_MARGIN = 0.10


class Inconclusive(Exception):
    """A timing claim the machine was too noisy to decide; ``str()`` says why, with the numbers;
    ``verdict`` is the last round's."""

    def __init__(self, message: str, verdict: Verdict):
        super().__init__(message)
        self.verdict = verdict


@dataclass(frozen=True)
class Round:
    measurement: Measurement
    verdict: Verdict
    failure: ClaimFailure | None
    cpu_share: float
    seconds: float

    @property
    def passed(self) -> bool:
        return self.failure is None

    @property
    def quiet(self) -> bool:
        return self.cpu_share >= QUIET_CPU_SHARE

    @property
    def value(self) -> Any:
        return self.verdict.measured


def _factor_apart(one: float, other: float) -> float:
    """larger ÷ smaller − 1 for two positive numbers; else their difference relative to the larger magnitude."""
    if one > 0 and other > 0:
        return max(one, other) / min(one, other) - 1
    return abs(one - other) / max(abs(one), abs(other), 1e-12)


def relative_margin(value: Any, *, at_least: float | None, at_most: float | None) -> float | None:
    """How far ``value`` lies from the nearest bound, as a factor − 1 (None: no numeric bound)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    distances = [_factor_apart(value, bound) for bound in (at_least, at_most) if bound is not None]
    return round(min(distances), 6) if distances else None


def _margin(claim: LoadedClaim, value: Any) -> float | None:
    expect = claim.claim.expect
    if expect is None:
        return None
    return relative_margin(value, at_least=expect.at_least, at_most=expect.at_most)


def measure_with_cpu_share(claim: LoadedClaim, inputs: Mapping[str, Any]) -> tuple[Measurement, float, float]:
    """One run of the claim's check: (measurement, share of a core this process had, wall seconds)."""
    began_wall, began_cpu = time.perf_counter(), time.process_time()
    measurement = measure_claim(claim, inputs)
    seconds = max(time.perf_counter() - began_wall, 1e-9)
    return measurement, (time.process_time() - began_cpu) / seconds, seconds


def _one_round(claim: LoadedClaim, inputs: Mapping[str, Any]) -> Round:
    measurement, share, seconds = measure_with_cpu_share(claim, inputs)
    try:
        verdict, failure = evaluate_claim(claim, inputs, measurement=measurement), None
    except ClaimFailure as failed:
        verdict, failure = failed.verdict, failed
    return Round(measurement, verdict, failure, round(share, 3), round(seconds, 3))


def spread(values: list[Any]) -> float | None:
    """How far apart the rounds lie: max ÷ min − 1 (None for non-numeric values)."""
    if any(isinstance(value, bool) or not isinstance(value, (int, float)) for value in values):
        return None
    return round(_factor_apart(min(values), max(values)), 6)


def _decided(claim: LoadedClaim, rounds: list[Round]) -> Round | None:
    """The round that decides the claim, or None while undecided."""
    last = rounds[-1]
    margin = _margin(claim, last.value)
    if last.quiet and (margin is None or margin >= CLEAR_MARGIN):
        return last
    if len(rounds) < 2 or len({one.passed for one in rounds}) > 1:
        return None
    values = [one.value for one in rounds]
    apart = spread(values)
    median_margin = _margin(claim, statistics.median(values)) if apart is not None else None
    agree = apart is None or median_margin is None or apart < median_margin
    if not agree:
        return None
    if last.passed:
        return last
    return last if all(one.quiet for one in rounds) else None


def _describe(claim: LoadedClaim, rounds: list[Round], load_start: float | None) -> str:
    values = ", ".join(f"{_number(one.value)} ({'passes' if one.passed else 'fails'}, {one.cpu_share:.0%} of a core)" for one in rounds)
    expect = claim.claim.expect
    bounds = []
    if expect is not None and expect.at_least is not None:
        bounds.append(f"at_least {expect.at_least:g}")
    if expect is not None and expect.at_most is not None:
        bounds.append(f"at_most {expect.at_most:g}")
    apart = spread([one.value for one in rounds])
    spread_text = f"; spread {apart:.0%}" if apart is not None else ""
    margin = _margin(claim, statistics.median([one.value for one in rounds])) if apart is not None else None
    margin_text = f", margin to the bound {margin:.0%}" if margin is not None else ""
    load_end = _load_average()
    load = f"load average {_number(load_start)} → {_number(load_end)} on {os.cpu_count()} CPUs"
    return (f"{INCONCLUSIVE_PREFIX}{len(rounds)} rounds measured {values}"
            f"{' against ' + ' and '.join(bounds) if bounds else ''}{spread_text}{margin_text}; {load}. "
            f"A timing claim fails only on rounds with ≥ {QUIET_CPU_SHARE:.0%} of a core; "
            f"rerun on a quieter machine, or set {REQUIRE_TIMING_VARIABLE}=1 to count this as failed")


def _number(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return "?" if value is None else str(value)


def _load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def decide_timing_claim(claim: LoadedClaim, inputs: Mapping[str, Any], *, max_rounds: int = MAX_ROUNDS) -> Verdict:
    """Run a timing claim in rounds (see the module docstring). Returns the deciding verdict,
    raises its ClaimFailure, or raises :class:`Inconclusive`."""
    check = get_check(claim.claim.measure)
    load_start = _load_average()
    rounds: list[Round] = []
    for index in range(max_rounds):
        if index:
            check.forget_cached()
        rounds.append(_one_round(claim, inputs))
        deciding = _decided(claim, rounds)
        if deciding is not None:
            remember_measurement(claim, deciding.measurement)
            if deciding.failure is not None:
                raise deciding.failure
            return deciding.verdict
    remember_measurement(claim, rounds[-1].measurement)
    raise Inconclusive(_describe(claim, rounds, load_start), rounds[-1].verdict)
