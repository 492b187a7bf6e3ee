"""The meta-test's smallest breaks (tests/harness/meta_mutations.py), on claims whose "measurement"
each test sets (``testing.echo`` measures the value it is given)."""

from __future__ import annotations

import pytest

from resacct.harness import evaluate
from resacct.harness.evaluate import ClaimFailure, evaluate_claim, measure_claim
from resacct.harness.laws import Law
from resacct.harness.loader import LoadedClaim
from resacct.harness.registry import Outcome, check
from resacct.harness.schema import Claim
from tests.harness.meta_mutations import JUST, catch_size, smallest_breaks, truth_broken


@check("testing.echo_pair")
def echo_pair(value: int) -> Outcome:
    """Measures ``[value, 1]``."""
    return Outcome(measured=[value, 1])


def _claim(**fields) -> LoadedClaim:
    if fields.get("status") == "refuted":
        fields.setdefault("truth", "the truth")
    spec = Claim.model_validate({"id": "meta-demo", "says": "a demo", "measure": "testing.echo", **fields})
    return LoadedClaim(claim=spec, path="specs/demo.claims.yaml", line=1, area="demo", source="test",
                       law=Law.parse(spec.law) if spec.law is not None else None)


def _judged(claim: LoadedClaim, value):  # type: ignore[no-untyped-def]
    measurement = measure_claim(claim, {**claim.claim.given, "value": value})
    verdict = evaluate_claim(claim, measurement.inputs, measurement=measurement)
    return verdict, measurement


def _outcomes(claim: LoadedClaim, breaks) -> list[tuple[object, bool]]:  # type: ignore[no-untyped-def]
    """(measured, failed) for each break."""
    results = []
    for one in breaks:
        try:
            evaluate_claim(claim, {}, measurement=one.measurement)
            results.append((one.measurement.outcome.measured, False))
        except ClaimFailure:
            results.append((one.measurement.outcome.measured, True))
    return results


def test_a_law_with_a_relative_tolerance_is_broken_just_outside_and_kept_just_inside():
    claim = _claim(given={"value": 100}, law="value * 0 + 100", tolerance={"rel": 0.1})
    verdict, measurement = _judged(claim, 100)
    breaks = smallest_breaks(claim, verdict, measurement)
    assert [one.must_fail for one in breaks] == [True, False, True, False]
    assert _outcomes(claim, breaks) == [(pytest.approx(110 + 10 * JUST), True), (pytest.approx(110 - 10 * JUST), False),
                                        (pytest.approx(90 - 10 * JUST), True), (pytest.approx(90 + 10 * JUST), False)]
    assert catch_size(claim, verdict) == (pytest.approx(0.1), True)


def test_an_exact_integer_law_is_broken_by_one():
    claim = _claim(given={"value": 128}, law="4 * 8 * 4", tolerance={"rel": 0})
    verdict, measurement = _judged(claim, 128)
    assert _outcomes(claim, smallest_breaks(claim, verdict, measurement)) == [(129, True), (128, False), (127, True), (128, False)]


def test_a_list_law_is_broken_at_its_first_number():
    claim = _claim(measure="testing.echo_pair", given={"value": 3}, law="[value, 1]")
    verdict, measurement = _judged(claim, 3)
    failed = _outcomes(claim, smallest_breaks(claim, verdict, measurement))
    assert [measured for measured, _ in failed][0] == pytest.approx([3 + 3e-9 * (1 + JUST), 1])
    assert [did for _, did in failed] == [True, False, True, False]


def test_a_band_is_broken_just_past_each_bound_and_holds_on_it():
    claim = _claim(given={"value": 5}, expect={"at_least": 2, "at_most": 8})
    verdict, measurement = _judged(claim, 5)
    assert _outcomes(claim, smallest_breaks(claim, verdict, measurement)) == [(2 - 2 * JUST, True), (2.0, False), (8 + 8 * JUST, True), (8.0, False)]
    assert catch_size(claim, verdict) == (pytest.approx(3 / 5), True)


def test_a_refuted_claim_fails_when_its_measurement_becomes_the_laws_value():
    claim = _claim(given={"value": 7}, law="value * 2", status="refuted")
    verdict, measurement = _judged(claim, 7)
    broken = truth_broken(claim, verdict, measurement)
    assert broken is not None and broken.measurement.outcome.measured == 14
    with pytest.raises(ClaimFailure, match="is marked refuted, but the measurement now agrees"):
        evaluate_claim(claim, {}, measurement=broken.measurement)


def test_a_refuted_claims_tolerance_is_tested_the_other_way_round():
    """Just inside its law's tolerance a refuted claim now agrees (must fail); just outside it stays refuted."""
    claim = _claim(given={"value": 7}, law="value * 0 + 10", tolerance={"rel": 0.1}, status="refuted")
    verdict, measurement = _judged(claim, 7)
    breaks = smallest_breaks(claim, verdict, measurement)
    assert [one.must_fail for one in breaks] == [False, True, False, True]
    assert [did for _, did in _outcomes(claim, breaks)] == [False, True, False, True]


@pytest.mark.parametrize(("expect", "inside"), [({"equals": 3}, 3), ({"approx": 2.5}, 2.5), ({"at_least": 9}, 9.0), ({"at_most": 1}, 1.0)])
def test_a_refuted_expectation_fails_when_the_measurement_takes_its_value(expect, inside):
    claim = _claim(given={"value": 5}, expect=expect, status="refuted", **({"tolerance": {"rel": 0.01}} if "approx" in expect else {}))
    verdict, measurement = _judged(claim, 5)
    broken = truth_broken(claim, verdict, measurement)
    assert broken is not None and broken.measurement.outcome.measured == inside
    with pytest.raises(ClaimFailure, match="now agrees"):
        evaluate_claim(claim, {}, measurement=broken.measurement)


def test_the_breaks_keep_the_quantities_a_law_reads_and_drop_the_prediction():
    claim = _claim(given={"value": 4, "prediction_offset": 1}, law="twice / 2")
    measurement = measure_claim(claim, {"value": 4, "prediction_offset": 1})
    verdict = evaluate.Verdict(claim=claim, inputs=measurement.inputs, measured=4, law_value=4)
    for one in smallest_breaks(claim, verdict, measurement):
        assert one.measurement.outcome.quantities == {"twice": 8} and one.measurement.outcome.predicted is None


def test_an_evaluator_that_ignored_the_tolerance_would_be_caught(monkeypatch):
    """What the smallest breaks exist for: were the declared tolerance not the one applied (here
    ten times wider), a break just outside it would pass, and the meta-test says so."""
    claim = _claim(given={"value": 100}, law="value * 0 + 100", tolerance={"rel": 0.01})
    verdict, measurement = _judged(claim, 100)
    real_agrees = evaluate.agrees
    monkeypatch.setattr(evaluate, "agrees", lambda expected, actual, tolerance: real_agrees(
        expected, actual, tolerance.model_copy(update={"rel": tolerance.rel * 10})))
    outside = [one for one in smallest_breaks(claim, verdict, measurement) if one.must_fail]
    assert [did for _, did in _outcomes(claim, outside)] == [False, False]


def test_a_law_beyond_float_range_is_broken_in_integers():
    claim = _claim(given={"value": 10**400}, law="value")
    verdict, measurement = _judged(claim, 10**400)
    breaks = smallest_breaks(claim, verdict, measurement)
    assert all(isinstance(one.measurement.outcome.measured, int) for one in breaks)
    assert [did for _, did in _outcomes(claim, breaks)] == [True, False, True, False]
    assert catch_size(claim, verdict) == (pytest.approx(1e-9), True)


def test_a_zero_reference_has_an_absolute_catch_size():
    claim = _claim(given={"value": 0}, law="value * 0", tolerance={"abs": 1e-5})
    verdict, _ = _judged(claim, 0)
    assert catch_size(claim, verdict) == (1e-5, False)


def test_nothing_to_break_in_a_raises_or_a_text_statement():
    claim = _claim(given={"value": 1}, expect={"raises": {"type": "ValueError"}})
    assert smallest_breaks(claim, evaluate.Verdict(claim=claim, inputs={}), evaluate.Measurement({}, None, ValueError())) == []
    text = _claim(measure="testing.text", given={"value": "x"}, expect={"equals": "x"})
    verdict, measurement = _judged(text, "x")
    assert smallest_breaks(text, verdict, measurement) == [] and catch_size(text, verdict) is None
