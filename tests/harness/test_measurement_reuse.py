"""A claim is measured once a session: the mutation meta-test judges its wrong statement against
the measurement the claim's own item made (``remember=True``), not a second run of the check."""

from __future__ import annotations

import textwrap

import pytest

from resacct.harness.evaluate import ClaimFailure, evaluate_claim, forget_measurements, remembered_measurement
from resacct.harness.loader import load_claims_file
from resacct.harness.registry import Outcome, check
from tests.harness.test_plugin import outcomes
from tests.harness.test_real_claims_can_fail import mutated

CALLS: list[int] = []


@check("testing.counted")
def counted(value: int) -> Outcome:
    """Measures ``value`` and counts how often it was asked to."""
    CALLS.append(value)
    return Outcome(measured=value, predicted=value)


SPEC = """
area: demo
source: test
claims:
  - id: counted-seven
    says: the counted check measures what it is given.
    measure: testing.counted
    given: {value: 7}
    law: 7
"""


def test_a_remembered_measurement_judges_the_mutation_without_measuring_again(tmp_path):
    forget_measurements()
    path = tmp_path / "demo.claims.yaml"
    path.write_text(textwrap.dedent(SPEC).lstrip(), encoding="utf-8")
    claim = load_claims_file(path).claims[0]
    CALLS.clear()
    assert remembered_measurement(claim) is None
    evaluate_claim(claim, {"value": 7}, remember=True)
    evaluate_claim(claim, {"value": 7}, remember=True)  # measures again; the first one stays remembered
    measurement = remembered_measurement(claim)
    assert CALLS == [7, 7] and measurement is not None and measurement.outcome.measured == 7
    with pytest.raises(ClaimFailure, match="does not hold"):
        evaluate_claim(mutated(claim), {}, measurement=measurement)
    assert CALLS == [7, 7]  # judged, not measured
    forget_measurements()
    assert remembered_measurement(claim) is None


def test_the_plugin_remembers_what_each_claim_item_measured(pytester, write_spec):
    forget_measurements()
    path = write_spec("demo.claims.yaml", SPEC)
    CALLS.clear()
    assert outcomes(pytester.runpytest("-q")) == {"passed": 1}
    claim = load_claims_file(path).claims[0]
    measurement = remembered_measurement(claim)
    assert CALLS == [7] and measurement is not None and measurement.inputs == {"value": 7}
    forget_measurements()
