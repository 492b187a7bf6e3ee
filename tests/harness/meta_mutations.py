"""The smallest breaks of a claim, built from one measurement: what the mutation meta-test
(``tests/harness/test_real_claims_can_fail.py``) judges besides its gross ``law × 2 + 1``.

A claim's statement agrees with a measurement within its tolerance (law, ``approx``, numeric
``equals``: |measured − reference| ≤ max(rel·|reference|, abs)) or inside its band
(``at_least``/``at_most``). The smallest break it must catch is a measurement *just outside*
that; *just inside* it must still agree. For a ``refuted`` claim the two swap: moved just inside,
the measurement agrees with the false statement and the item must fail ("now agrees"); just
outside it must stay refuted. A refuted claim's truth is also broken outright: its measurement
replaced by the statement's own value (the law's value, the ``equals``, the ``approx``, a bound).

Every synthetic measurement keeps the real one's inputs and quantities (a law reads them) and
drops resacct's prediction (so only the statement is judged). ``catch_size`` is the smallest
break relative to the value (the tolerance over |reference|; for a band, the measurement's
distance to its nearest bound over |measured|; absolute where that value is 0): docs/mutation.md
counts the shipped claims by it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from resacct.harness.evaluate import Measurement, Verdict
from resacct.harness.loader import LoadedClaim
from resacct.harness.registry import Outcome
from resacct.harness.schema import DEFAULT_TOLERANCE

__all__ = ["Break", "smallest_breaks", "truth_broken", "catch_size", "JUST"]

JUST = 1e-3  # "just": a break 0.1 % beyond the tolerance (or the band's edge), a shift 0.1 % short of it


@dataclass(frozen=True)
class Break:
    """A synthetic measurement and what the claim must do with it."""

    what: str  # e.g. "law + tolerance × 1.001"
    measurement: Measurement
    must_fail: bool


def _is_number(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return isinstance(value, int) or math.isfinite(value)


def _with(measurement: Measurement, measured: Any) -> Measurement:
    outcome = measurement.outcome
    quantities = dict(outcome.quantities) if outcome is not None else {}
    return Measurement(inputs=dict(measurement.inputs), outcome=Outcome(measured=measured, predicted=None, quantities=quantities))


def _first_number_path(value: Any) -> tuple[int, ...] | None:
    """Where the first number sits in a value nested at most two lists deep (() for a number)."""
    if _is_number(value):
        return ()
    if isinstance(value, (list, tuple)):
        for index, element in enumerate(value):
            inner = _first_number_path(element)
            if inner is not None:
                return (index, *inner)
    return None


def _at(value: Any, path: tuple[int, ...]) -> Any:
    for index in path:
        value = value[index]
    return value


def _replaced(value: Any, path: tuple[int, ...], new: Any) -> Any:
    if not path:
        return new
    copy = list(value)
    copy[path[0]] = _replaced(copy[path[0]], path[1:], new)
    return copy


def _shifted(reference: int | float, step: Fraction, sign: int, *, outward: bool) -> int | float:
    """reference + sign·step. An integer reference beyond a float's exact range (or an integral
    step) stays an integer, rounded away from the reference when breaking out, towards it when
    staying inside."""
    if isinstance(reference, int) and (step.denominator == 1 or abs(reference) > 2**52):
        return reference + sign * (math.ceil(step) if outward else math.floor(step))
    return float(Fraction(reference) + sign * step)


def _tolerance_breaks(claim: LoadedClaim, measurement: Measurement, reference: Any, label: str) -> list[Break]:
    """Just outside (must fail) and just inside (must agree) the tolerance around ``reference``,
    each side; for a refuted claim, the opposite."""
    path = _first_number_path(reference)
    if path is None:
        return []
    tolerance = claim.claim.tolerance or DEFAULT_TOLERANCE
    centre = _at(reference, path)
    allowed = max(Fraction(tolerance.rel) * abs(Fraction(centre)), Fraction(tolerance.abs))
    refuted = claim.claim.status == "refuted"
    breaks = []
    for sign in (1, -1):
        if allowed == 0:  # exact: the smallest break is the next value a measurement can take
            outside = centre + sign if isinstance(centre, int) else math.nextafter(float(centre), sign * math.inf)
            inside = centre
        else:
            outside = _shifted(centre, allowed * (1 + Fraction(JUST)), sign, outward=True)
            inside = _shifted(centre, allowed * (1 - Fraction(JUST)), sign, outward=False)
        side = "+" if sign > 0 else "−"
        breaks.append(Break(f"{label} {side} tolerance × {1 + JUST:g}", _with(measurement, _replaced(reference, path, outside)), must_fail=not refuted))
        breaks.append(Break(f"{label} {side} tolerance × {1 - JUST:g}", _with(measurement, _replaced(reference, path, inside)), must_fail=refuted))
    return breaks


def _band_breaks(claim: LoadedClaim, measurement: Measurement) -> list[Break]:
    """Each bound, and a value just past it: on the bound the band holds; past it, it does not."""
    expect = claim.claim.expect
    refuted = claim.claim.status == "refuted"
    breaks = []
    for bound, outward, name in ((expect.at_least, -1, "at_least"), (expect.at_most, 1, "at_most")):
        if bound is None:
            continue
        past = bound + outward * JUST * max(abs(bound), 1e-12)
        breaks.append(Break(f"{name} {bound:g}, just past it ({past:.6g})", _with(measurement, past), must_fail=not refuted))
        breaks.append(Break(f"on {name} {bound:g}", _with(measurement, float(bound)), must_fail=refuted))
    return breaks


def smallest_breaks(claim: LoadedClaim, verdict: Verdict, measurement: Measurement) -> list[Break]:
    """The claim's smallest breaks around its statement, from the verdict its real measurement got.

    A claim with both a law and an expectation is broken at its law only, outward (an inward shift
    could leave the expectation's band). Nothing for ``raises``, non-numeric statements, or a
    measurement that was an exception."""
    spec = claim.claim
    expect = spec.expect
    if measurement.outcome is None or (expect is not None and expect.raises is not None):
        return []
    if spec.law is not None:
        breaks = _tolerance_breaks(claim, measurement, verdict.law_value, "law")
        return [one for one in breaks if one.must_fail] if expect is not None else breaks
    if expect is None:
        return []
    if expect.approx is not None:
        return _tolerance_breaks(claim, measurement, expect.approx, "approx")
    if expect.equals is not None and not isinstance(expect.equals, (bool, str)):
        return _tolerance_breaks(claim, measurement, expect.equals, "equals")
    if expect.at_least is not None or expect.at_most is not None:
        return _band_breaks(claim, measurement)
    return []


def truth_broken(claim: LoadedClaim, verdict: Verdict, measurement: Measurement) -> Break | None:
    """A refuted claim's measurement replaced by what its (false) statement says: it must fail."""
    spec = claim.claim
    expect = spec.expect
    if spec.status != "refuted" or measurement.outcome is None:
        return None
    if spec.law is not None:
        return Break(f"measured := the law's value {verdict.law_value!r}", _with(measurement, verdict.law_value), must_fail=True)
    if expect is None or expect.raises is not None:
        return None
    if expect.equals is not None:
        return Break(f"measured := equals {expect.equals!r}", _with(measurement, expect.equals), must_fail=True)
    if expect.approx is not None:
        return Break(f"measured := approx {expect.approx!r}", _with(measurement, expect.approx), must_fail=True)
    inside = expect.at_least if expect.at_least is not None else expect.at_most
    return Break(f"measured := {inside!r}, inside the band", _with(measurement, float(inside)), must_fail=True)


def catch_size(claim: LoadedClaim, verdict: Verdict) -> tuple[float, bool] | None:
    """The smallest break the claim catches, and whether it is relative: tolerance ÷ |reference|
    (0 for an exact one); for a band the measurement's distance to its nearest bound ÷ |measured|.
    Where the reference (or the measurement) is 0 a relative size means nothing: the absolute one,
    with False. None: nothing numeric to break."""
    spec = claim.claim
    expect = spec.expect
    reference = verdict.law_value if spec.law is not None else (
        expect.approx if expect is not None and expect.approx is not None else
        expect.equals if expect is not None and expect.equals is not None and not isinstance(expect.equals, (bool, str)) else None)
    tolerance = spec.tolerance or DEFAULT_TOLERANCE
    if reference is not None:
        path = _first_number_path(reference)
        if path is None:
            return None
        centre = abs(Fraction(_at(reference, path)))
        allowed = max(Fraction(tolerance.rel) * centre, Fraction(tolerance.abs))
        if allowed == 0:
            return 0.0, True
        return (float(allowed / centre), True) if centre else (float(allowed), False)
    if expect is not None and (expect.at_least is not None or expect.at_most is not None) and _is_number(verdict.measured):
        distance = min(abs(verdict.measured - bound) for bound in (expect.at_least, expect.at_most) if bound is not None)
        return (distance / abs(verdict.measured), True) if verdict.measured else (distance, False)
    return None
