"""Judging one claim for one set of inputs: law, prediction and measurement side by side.

The statement of a claim (its law and/or expect) *holds* when it agrees with the measurement.
A claim with ``status: holds`` passes when the statement holds; a ``refuted`` claim passes
when it does not (and fails, saying so, the day it starts to hold). Independently, resacct's
prediction — when the check returns one — must agree with the measurement.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import regex

from resacct.errors import ResacctError
from resacct.harness.loader import LoadedClaim
from resacct.harness.registry import Check, NotMeasurable, Outcome, get_check
from resacct.harness.schema import DEFAULT_TOLERANCE, Claim, Tolerance

__all__ = ["ClaimFailure", "Verdict", "Measurement", "evaluate_claim", "agrees", "remembered_measurement", "forget_measurements",
           "measure_claim", "remember_measurement", "MATCH_TIMEOUT_SECONDS", "is_replayable", "FORALL_EXAMPLES_NOTE", "forall_examples_inputs"]


class ClaimFailure(AssertionError):
    """A claim did not come out as its spec says; ``str()`` is the full side-by-side report."""

    def __init__(self, headline: str, verdict: Verdict):
        self.headline = headline
        self.verdict = verdict
        super().__init__(headline + "\n" + verdict.describe())


@dataclass
class Verdict:
    claim: LoadedClaim
    inputs: dict[str, Any]
    measured: Any = None
    predicted: Any = None
    law_value: Any = None
    quantities: dict[str, Any] = field(default_factory=dict)
    raised: BaseException | None = None
    statement_holds: bool = False
    prediction_agrees: bool | None = None
    notes: list[str] = field(default_factory=list)
    replayed_from: str | None = None  # the measurement judged was stored by an earlier run at this time (resacct.harness.replay)

    @property
    def tolerance(self) -> Tolerance:
        return self.claim.claim.tolerance or DEFAULT_TOLERANCE

    def describe(self) -> str:
        claim = self.claim.claim
        rows = [("says", claim.says)]
        if self.inputs:
            rows.append(("inputs", ", ".join(f"{key}={_short(value)}" for key, value in self.inputs.items())))
        if claim.law is not None:
            rows.append(("law", f"{claim.law} = {_short(self.law_value)}"))
        if claim.expect is not None:
            rows.append(("expect", _describe_expect(claim.expect.model_dump(exclude_none=True))))
        rows.append(("predicted", f"{_short(self.predicted)} (resacct)" if self.predicted is not None else "— (resacct has no formula)"))
        if self.raised is not None:
            rows.append(("measured", f"raised {type(self.raised).__name__}: {_first_line(str(self.raised))} (torch)"))
        else:
            rows.append(("measured", f"{_short(self.measured)} (torch)"))
        if self.quantities:
            rows.append(("quantities", ", ".join(f"{key}={_short(value)}" for key, value in self.quantities.items())))
        tolerance = self.tolerance
        rows.append(("tolerance", f"rel={tolerance.rel:g} abs={tolerance.abs:g}"))
        if claim.truth:
            rows.append(("truth", claim.truth))
        rows += [("note", note) for note in self.notes]
        width = max(len(name) for name, _ in rows)
        return "\n".join(f"  {name.ljust(width)}  {value}" for name, value in rows)


def _describe_expect(expect: dict[str, Any]) -> str:
    return ", ".join(f"{key} {value}" for key, value in expect.items())


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def _short(value: Any) -> str:
    if isinstance(value, int) and value.bit_length() > 1000:  # repr() refuses ints over 4,300 digits
        return f"<integer of about {int(value.bit_length() * math.log10(2))} digits>"
    text = repr(value)
    if isinstance(value, float):
        text = f"{value:.6g}"
    return text if len(text) <= 120 else text[:117] + "..."


def agrees(expected: Any, actual: Any, tolerance: Tolerance) -> bool:
    """True when ``actual`` equals ``expected`` within ``tolerance`` (element-wise for lists)."""
    if isinstance(expected, (list, tuple)) or isinstance(actual, (list, tuple)):
        if not (isinstance(expected, (list, tuple)) and isinstance(actual, (list, tuple))):
            return False
        return len(expected) == len(actual) and all(agrees(e, a, tolerance) for e, a in zip(expected, actual))
    if isinstance(expected, bool) or isinstance(actual, bool) or isinstance(expected, str) or isinstance(actual, str):
        return type(expected) is type(actual) and expected == actual
    if isinstance(expected, (int, float)) and isinstance(actual, (int, float)):
        if isinstance(expected, int) and isinstance(actual, int) and expected == actual:
            return True
        if any(isinstance(value, float) and not math.isfinite(value) for value in (expected, actual)):
            return expected == actual
        try:
            return abs(expected - actual) <= max(tolerance.rel * abs(expected), tolerance.abs)
        except OverflowError:  # an integer beyond float range (a law such as 10**128*10**128*10**128): compare exactly
            difference = abs(Fraction(expected) - Fraction(actual))
            return difference <= max(Fraction(tolerance.rel) * abs(Fraction(expected)), Fraction(tolerance.abs))
    return expected == actual


MATCH_TIMEOUT_SECONDS = 1.0
MAX_MATCHED_CHARS = 10_000


def _exception_matches(error: BaseException, type_name: str, pattern: str | None) -> bool:
    """Type by name (or module.name) anywhere in the MRO, then ``pattern`` searched in the
    message. The search has a time limit (``regex``'s timeout): a pattern such as ``(a+)+b``
    backtracks exponentially and would otherwise hang the run."""
    names = {cls.__name__ for cls in type(error).__mro__} | {f"{cls.__module__}.{cls.__name__}" for cls in type(error).__mro__}
    if type_name not in names:
        return False
    if pattern is None:
        return True
    try:
        return regex.search(pattern, str(error)[:MAX_MATCHED_CHARS], timeout=MATCH_TIMEOUT_SECONDS) is not None
    except TimeoutError:
        raise ResacctError(
            f"expect.raises.match {pattern!r} took more than {MATCH_TIMEOUT_SECONDS:g} s on the message "
            f"(catastrophic backtracking, e.g. a nested repeat such as (a+)+); write a pattern without nested repeats"
        ) from None
    except regex.error as problem:
        raise ResacctError(f"expect.raises.match {pattern!r} cannot be searched: {problem}") from None


@dataclass(frozen=True)
class Measurement:
    """What a check returned (or raised) for one set of inputs: the half of a verdict that costs
    time. Judging a different statement against it (the mutation meta-test) needs no re-run."""

    inputs: dict[str, Any]
    outcome: Outcome | None
    raised: BaseException | None = None
    replayed_from: str | None = None  # when the stored outcome replayed here was measured (resacct.harness.replay), None: measured now


# One measurement per claim (its first) in this process, keyed by (id, measure, given): the
# plugin fills it, the mutation meta-test reads it instead of measuring the same thing again.
_SESSION_MEASUREMENTS: dict[str, Measurement] = {}


def _claim_key(claim: LoadedClaim) -> str:
    spec = claim.claim
    return json.dumps([spec.id, spec.measure, dict(spec.given)], sort_keys=True, default=repr)


def remembered_measurement(claim: LoadedClaim) -> Measurement | None:
    """The first measurement :func:`evaluate_claim` made for this claim (same id, check and
    ``given``) in this process with ``remember=True``, or None."""
    return _SESSION_MEASUREMENTS.get(_claim_key(claim))


def forget_measurements() -> None:
    """Empty the session's remembered measurements."""
    _SESSION_MEASUREMENTS.clear()


def remember_measurement(claim: LoadedClaim, measurement: Measurement) -> None:
    """Keep ``measurement`` as this claim's remembered one (a timing claim's deciding round)."""
    _SESSION_MEASUREMENTS[_claim_key(claim)] = measurement


def is_replayable(check: Check, claim: Claim) -> bool:
    """Whether ``claim``'s measurement by ``check`` may be judged on a stored one (:mod:`resacct.harness.replay`): never a timed
    check's (its value is this moment's), a GPU claim's or a check's declared ``replay=False``; a ``forall`` claim's examples
    only where they repeat from run to run (:func:`~resacct.harness.pytest_settings.examples_repeat`: the derandomised
    ``ci`` profile; ``dev`` draws new ones every run)."""
    if not check.replay or check.timing or "gpu" in claim.marks:
        return False
    if claim.forall:
        from resacct.harness.pytest_settings import examples_repeat

        return examples_repeat()
    return True


#: The check name under which a run notes that a ``forall`` claim's examples ran through on this setup (their measurements
#: are stored one by one under the claim's own check): what lets a later run's scheduling count the claim as replayed.
FORALL_EXAMPLES_NOTE = "harness.forall_examples"


def forall_examples_inputs(claim: Claim) -> dict[str, Any]:
    """What names one ``forall`` claim's run of examples: the claim, its check, fixed inputs, strategies, example count and
    the Hypothesis profile that drew them."""
    from resacct.harness.pytest_settings import hypothesis_profile_name

    return {"claim": claim.id, "measure": claim.measure, "given": dict(claim.given), "forall": dict(claim.forall),
            "examples": claim.examples, "profile": hypothesis_profile_name()}


def measure_claim(claim: LoadedClaim, inputs: Mapping[str, Any]) -> Measurement:
    """Run the claim's check once on ``inputs`` (an exception is the measurement when the claim expects one)."""
    return _measure(claim, inputs)


def _measure(claim: LoadedClaim, inputs: Mapping[str, Any]) -> Measurement:
    spec = claim.claim
    check = get_check(spec.measure)
    expects_raise = spec.expect is not None and spec.expect.raises is not None
    replayable = is_replayable(check, spec)
    if replayable:
        from resacct.harness.replay import stored_measurement

        stored = stored_measurement(spec.measure, check.replay_inputs(inputs))
        if stored is not None and isinstance(stored.outcome, Outcome):
            return Measurement(inputs=dict(inputs), outcome=stored.outcome, replayed_from=stored.measured_at if stored.earlier else None)
    try:
        outcome = check(**inputs)
        if replayable:
            from resacct.harness.replay import store_measurement

            store_measurement(spec.measure, check.replay_inputs(inputs), outcome)
        return Measurement(inputs=dict(inputs), outcome=outcome)
    except NotMeasurable:  # the item turns it into a skip
        raise
    except Exception as error:  # errors are measurements when a claim expects one (resacct's own too)
        if not expects_raise:
            with contextlib.suppress(AttributeError):  # so the failure can say the check raised it
                error.resacct_raised_by_check = spec.measure  # type: ignore[attr-defined]
            raise
        return Measurement(inputs=dict(inputs), outcome=None, raised=error)


def evaluate_claim(claim: LoadedClaim, inputs: Mapping[str, Any], *, measurement: Measurement | None = None,
                   remember: bool = False) -> Verdict:
    """Run the claim's check on ``inputs`` and decide. Raises ClaimFailure when it must fail.

    ``measurement``: judge this earlier measurement (its inputs replace ``inputs``) instead of
    running the check. ``remember``: keep the first measurement of this claim for
    :func:`remembered_measurement`."""
    if measurement is None:
        measurement = _measure(claim, inputs)
        if remember:
            _SESSION_MEASUREMENTS.setdefault(_claim_key(claim), measurement)
    spec = claim.claim
    verdict = Verdict(claim=claim, inputs=dict(measurement.inputs), replayed_from=measurement.replayed_from)
    outcome, verdict.raised = measurement.outcome, measurement.raised
    if outcome is not None:
        verdict.measured, verdict.predicted = outcome.measured, outcome.predicted
        verdict.quantities = dict(outcome.quantities)
    verdict.statement_holds = _statement_holds(verdict, outcome)
    if outcome is not None and outcome.predicted is not None:
        verdict.prediction_agrees = agrees(outcome.predicted, outcome.measured, verdict.tolerance)

    if spec.status == "holds" and not verdict.statement_holds:
        raise ClaimFailure(f"claim '{spec.id}' does not hold", verdict)
    if spec.status == "refuted" and verdict.statement_holds:
        raise ClaimFailure(f"claim '{spec.id}' is marked refuted, but the measurement now agrees with it", verdict)
    if verdict.prediction_agrees is False:
        raise ClaimFailure(f"claim '{spec.id}': resacct's prediction disagrees with the measurement", verdict)
    return verdict


def _statement_holds(verdict: Verdict, outcome: Outcome | None) -> bool:
    spec = verdict.claim.claim
    tolerance = verdict.tolerance
    holds = True
    if spec.law is not None and outcome is not None:
        names = {**_check_defaults(spec.measure), **verdict.inputs, **dict(outcome.quantities)}
        verdict.law_value = verdict.claim.law.evaluate(names)  # type: ignore[union-attr]
        holds = holds and agrees(verdict.law_value, outcome.measured, tolerance)
    expect = spec.expect
    if expect is None:
        return holds
    if expect.raises is not None:
        return verdict.raised is not None and _exception_matches(verdict.raised, expect.raises.type, expect.raises.match)
    measured = outcome.measured if outcome is not None else None
    if expect.equals is not None:
        holds = holds and agrees(expect.equals, measured, tolerance)
    if expect.approx is not None:
        holds = holds and agrees(expect.approx, measured, tolerance)
    if expect.at_least is not None or expect.at_most is not None:
        if isinstance(measured, bool) or not isinstance(measured, (int, float)) or math.isnan(measured):
            verdict.notes.append(f"at_least/at_most need a number; the check measured {measured!r}")
            return False
        if expect.at_least is not None:
            holds = holds and measured >= expect.at_least
        if expect.at_most is not None:
            holds = holds and measured <= expect.at_most
    return holds


def _check_defaults(name: str) -> dict[str, Any]:
    import inspect

    parameters = get_check(name).parameters
    return {key: p.default for key, p in parameters.items() if p.default is not inspect.Parameter.empty}
