"""Deciding a timing claim on a noisy machine: in rounds, or *inconclusive* — never a guess.

A timing check (registered with ``timing=True``) already samples its kernels in turn and takes
best-ofs. The harness adds rounds on top: one round is one run of the check, with the share of
a CPU this process got meanwhile (process CPU seconds ÷ wall seconds: a loaded machine takes the
core away and the share drops).

- A round is **quiet** when the process had ≥ 85 % of a core and the machine was not crowded — fewer
  tasks runnable elsewhere than it has cores, read when the round began and when it ended
  (:func:`runnable_elsewhere`: a round of a few milliseconds fits in one scheduler slice and gets
  all of a core whatever the load, while the other tasks evict its caches) — and **clear** when its value lies
  at least a factor 1.1 away from every ``at_least``/``at_most`` bound (non-numeric statements, such as a
  roofline's "memory"/"compute", are clear).
- One quiet, clear round decides, either way — but a failing *first* round is confirmed by a second: the first is
  also the process's first use of its kernels (a JIT, a page-fault storm the CPU-share probe cannot see: the warm-up
  claim measured 1.45 against ``at_most`` 1.25 once, in the AVX2-capped kind of a gate), and a check that keeps state
  between calls (``forget=``: the runtime model's rates, shared by its claims) may have measured it before the round;
  the second round (``forget=`` caches cleared) decides as any round does.
- Otherwise more rounds run: up to ``MAX_ROUNDS`` (3), or ``PAIRED_MAX_ROUNDS`` (9) while the
  sign test below can still decide.
  Rounds that all pass, with their spread (max ÷ min − 1) smaller than the median's margin to the
  bound, decide *holds* (a load cannot make them agree by chance). A claim **fails only on quiet
  rounds taken alone** (no other task runnable at their start or end: :attr:`Round.alone`): load only ever adds
  time, and a time measured under load is the load's, not the machine's.
- **Sign test** (checks registered ``paired=True``: their value compares timings taken in turn, so
  load slows both sides and pushes a round's value up as often as down): rounds that come out as
  the spec says decide, quiet or not, once so many agree that the binomial tail is at most
  ``SIGN_TEST_ALPHA`` (1/32): 5 of 5, or 8 of 9. Were the truth on the other side of the bound,
  each round would land on the spec's side with a chance of at most ½ — a test, not a guess. A
  passing value near its bound under load (the warm-up claim: 1.08, 1.20, 1.13 against ``at_most``
  1.25, spread 11 % ≥ margin 10.6 %) decides this way; rounds stop as soon as the test can no
  longer reach 1/32 within 9 rounds (two disagreeing rounds).
- Anything else is **inconclusive (noisy)**: the message says what the claim measured in each
  round (its CPU share, pass or fail), the band, the spread and the margin, why that does not
  decide, and the load average. ``RESACCT_REQUIRE_TIMING=1`` makes the item fail with that message.

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

import math
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
           "MAX_ROUNDS", "PAIRED_MAX_ROUNDS", "SIGN_TEST_ALPHA", "QUIET_CPU_SHARE", "CLEAR_MARGIN", "sign_test_p_value", "runnable_elsewhere"]

REQUIRE_TIMING_VARIABLE = "RESACCT_REQUIRE_TIMING"
INCONCLUSIVE_PREFIX = "inconclusive (noisy): "
MAX_ROUNDS = 3
SIGN_TEST_ALPHA = 2**-5  # at most 3.1 % that the rounds agree this often with the truth across the bound
PAIRED_MAX_ROUNDS = 9  # 5 of 5 agreeing decide; one disagreeing round costs up to 4 more (8 of 9)
QUIET_CPU_SHARE = 0.85
CLEAR_MARGIN = 0.10


class Inconclusive(Exception):
    """A timing claim the machine was too noisy to decide; ``str()`` says why, with the numbers;
    ``verdict`` is the last round's."""

    def __init__(self, message: str, verdict: Verdict, *, reason: str = "", rounds_text: str = ""):
        super().__init__(message)
        self.verdict = verdict
        self.reason = reason  # why the rounds do not decide, in one sentence
        self.rounds_text = rounds_text  # every round's value, pass or fail, share of a core


@dataclass(frozen=True)
class Round:
    measurement: Measurement
    verdict: Verdict
    failure: ClaimFailure | None
    cpu_share: float
    seconds: float
    runnable_elsewhere: int | None = None  # the most tasks runnable besides this process's, at the round's start and end

    @property
    def passed(self) -> bool:
        return self.failure is None

    @property
    def crowded(self) -> bool:
        """Whether other tasks could fill every core meanwhile (this process then shared one)."""
        return self.runnable_elsewhere is not None and self.runnable_elsewhere >= (os.cpu_count() or 1)

    @property
    def quiet(self) -> bool:
        return self.cpu_share >= QUIET_CPU_SHARE and not self.crowded

    @property
    def alone(self) -> bool:
        """Whether no other task was runnable at the round's start or end (unknown: taken as alone). A *failure* needs
        it: on a VM whose two CPUs are not two whole cores (round four, session 16: two processes did 1.3-2.0 × one
        CPU's work) a neighbour slows a round that keeps its whole core — a gate's floor tier, two workers, once
        measured a bf16/fp32 ratio of 0.89 twice that comes out at 1.23-1.88 alone."""
        return self.runnable_elsewhere is None or self.runnable_elsewhere == 0

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


def _task_running(task_stat_path: str) -> bool:
    try:
        with open(task_stat_path) as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "R"  # the state follows the command's closing parenthesis
    except (OSError, IndexError):
        return False


def runnable_elsewhere() -> int | None:
    """Tasks runnable on this machine now besides this process's own threads: ``/proc/loadavg``'s
    running count (the kernel's instant count, not an average) less this process's tasks in state R.
    None where it cannot be read (not Linux)."""
    try:
        with open("/proc/loadavg") as loadavg:
            running = int(loadavg.read().split()[3].split("/")[0])
        own = sum(_task_running(f"{task.path}/stat") for task in os.scandir("/proc/self/task"))
    except (OSError, ValueError, IndexError):
        return None
    return max(0, running - own)


def _most_runnable(*counts: int | None) -> int | None:
    known = [count for count in counts if count is not None]
    return max(known) if known else None


def _one_round(claim: LoadedClaim, inputs: Mapping[str, Any]) -> Round:
    before = runnable_elsewhere()
    measurement, share, seconds = measure_with_cpu_share(claim, inputs)
    elsewhere = _most_runnable(before, runnable_elsewhere())
    try:
        verdict, failure = evaluate_claim(claim, inputs, measurement=measurement), None
    except ClaimFailure as failed:
        verdict, failure = failed.verdict, failed
    return Round(measurement, verdict, failure, round(share, 3), round(seconds, 3), elsewhere)


def spread(values: list[Any]) -> float | None:
    """How far apart the rounds lie: max ÷ min − 1 (None for non-numeric values)."""
    if any(isinstance(value, bool) or not isinstance(value, (int, float)) for value in values):
        return None
    return round(_factor_apart(min(values), max(values)), 6)


def sign_test_p_value(agreeing: int, rounds: int) -> float:
    """The chance of at least ``agreeing`` of ``rounds`` rounds landing on one side of a bound when
    each does so with a chance of ½ (one-sided binomial tail).

    >>> sign_test_p_value(5, 5)
    0.03125
    >>> round(sign_test_p_value(4, 5), 4)
    0.1875
    """
    return sum(math.comb(rounds, k) for k in range(agreeing, rounds + 1)) / 2 ** rounds


def _sign_test_decides(claim: LoadedClaim, rounds: list[Round]) -> bool:
    agreeing = sum(one.passed for one in rounds)
    return (get_check(claim.claim.measure).paired and rounds[-1].passed
            and sign_test_p_value(agreeing, len(rounds)) <= SIGN_TEST_ALPHA)


def _sign_test_reachable(rounds: list[Round], limit: int) -> bool:
    """Whether more rounds, all agreeing, could still bring the sign test to SIGN_TEST_ALPHA within ``limit``."""
    disagreeing = sum(not one.passed for one in rounds)
    return any(sign_test_p_value(total - disagreeing, total) <= SIGN_TEST_ALPHA for total in range(len(rounds) + 1, limit + 1))


def _decided(claim: LoadedClaim, rounds: list[Round]) -> Round | None:
    """The round that decides the claim, or None while undecided."""
    last = rounds[-1]
    if _sign_test_decides(claim, rounds):
        return last
    margin = _margin(claim, last.value)
    if last.quiet and (margin is None or margin >= CLEAR_MARGIN):
        if last.failure is not None and (len(rounds) == 1 or not last.alone):
            return None  # a failure is confirmed by a second round (the first is the process's first use of its kernels, or read state measured before it), taken alone
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
    return last if all(one.quiet and one.alone for one in rounds) else None


def _band(claim: LoadedClaim) -> str:
    expect = claim.claim.expect
    bounds = []
    if expect is not None and expect.at_least is not None:
        bounds.append(f"at least {expect.at_least:g}")
    if expect is not None and expect.at_most is not None:
        bounds.append(f"at most {expect.at_most:g}")
    return " and ".join(bounds) if bounds else "its statement"


def _why_undecided(claim: LoadedClaim, rounds: list[Round]) -> str:
    """One sentence: why these rounds decide nothing (the rules of the module docstring)."""
    passed = sum(one.passed for one in rounds)
    quiet = sum(one.quiet for one in rounds)
    values = [one.value for one in rounds]
    apart = spread(values)
    margin = _margin(claim, statistics.median(values)) if apart is not None else None
    closeness = (f"; their spread {apart:.1%} is not below the median's margin {margin:.1%} to the bound"
                 if apart is not None and margin is not None and apart >= margin else "")
    if 0 < passed < len(rounds):
        return f"the rounds disagree: {passed} of {len(rounds)} came out as the spec says{closeness}{_sign_text(claim, rounds)}"
    if passed == 0:
        alone = sum(one.quiet and one.alone for one in rounds)
        return (f"every round came out against the spec, but only {alone} of {len(rounds)} had ≥ {QUIET_CPU_SHARE:.0%} of a core "
                f"with nothing else runnable, and a timing fails only on such quiet rounds taken alone (load only adds time){closeness}")
    quiet_note = "none was quiet and clear of the bound by ≥ " if quiet == 0 else "no quiet round lay clear of the bound by ≥ "
    return f"every round came out as the spec says, but {quiet_note}{CLEAR_MARGIN:.0%}{closeness}{_sign_text(claim, rounds)}"


def _sign_text(claim: LoadedClaim, rounds: list[Round]) -> str:
    if not get_check(claim.claim.measure).paired:
        return ""
    agreeing = sum(one.passed for one in rounds)
    return (f"; the sign test needs agreeing rounds with p ≤ {SIGN_TEST_ALPHA:.1%} (5 of 5, 8 of 9), "
            f"these are {agreeing} of {len(rounds)} (p = {sign_test_p_value(agreeing, len(rounds)):.1%})")


def _rounds_text(rounds: list[Round]) -> str:
    return ", ".join(f"{_number(one.value)} ({'as the spec says' if one.passed else 'against the spec'}, {one.cpu_share:.0%} of a core"
                     f"{f', {one.runnable_elsewhere} tasks runnable elsewhere on {os.cpu_count()} CPUs' if one.crowded else ''})"
                     for one in rounds)


def _describe(claim: LoadedClaim, rounds: list[Round], load_start: float | None, reason: str) -> str:
    load = f"load average {_number(load_start)} → {_number(_load_average())} on {os.cpu_count()} CPUs"
    return (f"{INCONCLUSIVE_PREFIX}claim '{claim.id}' measured {_rounds_text(rounds)} in {len(rounds)} rounds, "
            f"against {_band(claim)}: {reason}; {load}. "
            f"Rerun on a quieter machine, or set {REQUIRE_TIMING_VARIABLE}=1 to count this as failed")


def _number(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return "?" if value is None else str(value)


def _load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def decide_timing_claim(claim: LoadedClaim, inputs: Mapping[str, Any], *, max_rounds: int | None = None) -> Verdict:
    """Run a timing claim in rounds (see the module docstring). Returns the deciding verdict,
    raises its ClaimFailure, or raises :class:`Inconclusive`."""
    check = get_check(claim.claim.measure)
    load_start = _load_average()
    rounds: list[Round] = []
    limit = max_rounds if max_rounds is not None else (PAIRED_MAX_ROUNDS if check.paired else MAX_ROUNDS)
    for index in range(limit):
        if index:
            check.forget_cached()
        rounds.append(_one_round(claim, inputs))
        deciding = _decided(claim, rounds)
        if deciding is not None:
            remember_measurement(claim, deciding.measurement)
            if deciding.failure is not None:
                raise deciding.failure
            return deciding.verdict
        if len(rounds) >= MAX_ROUNDS and not (check.paired and _sign_test_reachable(rounds, limit)):
            break  # only the sign test could still decide, and it cannot (or does not apply)
    remember_measurement(claim, rounds[-1].measurement)
    reason = _why_undecided(claim, rounds)
    verdict = rounds[-1].verdict
    verdict.notes.append(f"rounds: {_rounds_text(rounds)}")
    verdict.notes.append(f"undecided: {reason}")
    raise Inconclusive(_describe(claim, rounds, load_start, reason), verdict, reason=reason, rounds_text=_rounds_text(rounds))
