"""What a claim's JSON record keeps: for a forall claim the number of examples and the worst one
(largest relative deviation of the measurement from the law) with its inputs; for a failed claim
the failing example's law value, prediction and measurement — never only the formula."""

from __future__ import annotations

import json

import pytest

from resacct.harness.registry import Outcome, check
from resacct.harness.report import relative_deviation, remember_example

DRAWN: list[int] = []


@check("testing.recording_echo")
def recording_echo(value: int) -> Outcome:
    """Measures ``value`` and remembers it, so the test knows every example hypothesis drew."""
    DRAWN.append(value)
    return Outcome(measured=value, predicted=value)

SPEC = """
area: demo
source: test — "section"
claims:
  - id: within-one
    says: echo measures what it is given, give or take one.
    measure: testing.recording_echo
    forall: {value: "integers(1, 1000)"}
    examples: 30
    law: value + 1
    tolerance: {abs: 1}
  - id: echo-plus-one-fails
    says: echo measures one more than it is given.
    measure: testing.echo
    given: {value: 7, prediction_offset: 0}
    law: value + 1
"""


def records(pytester: pytest.Pytester) -> dict[str, dict]:
    document = json.loads((pytester.path / "out.json").read_text())
    return {record["id"]: record for record in document["claims"]}


def test_forall_records_the_worst_example_and_a_failure_its_values(pytester, write_spec):
    write_spec("demo.claims.yaml", SPEC)
    DRAWN.clear()
    pytester.runpytest("--claims-json", "out.json", "-p", "no:randomly")
    by_id = records(pytester)
    worst = by_id["within-one"]
    # measured v, law v + 1: the relative deviation 1/(v + 1) is largest for the smallest v drawn
    assert worst["outcome"] == "holds" and 20 <= worst["examples"] <= 30 and worst["example"] == "worst"
    value = worst["inputs"]["value"]
    assert len(DRAWN) == worst["examples"] and value == min(DRAWN)
    assert worst["law_value"] == value + 1 and worst["measured"] == value
    assert worst["deviation"] == pytest.approx(1 / (value + 1))
    failed = by_id["echo-plus-one-fails"]
    assert failed["outcome"] == "failed" and failed["example"] == "failing"
    assert (failed["law_value"], failed["predicted"], failed["measured"], failed["inputs"]) == (8, 7, 7, {"value": 7, "prediction_offset": 0})
    assert "claim 'echo-plus-one-fails' does not hold" in failed["message"]


def test_remember_example_keeps_the_largest_deviation_and_the_first_of_equals():
    record = {"forall": {"x": "dim"}, "expect": None}
    for value, law in ((10, 10), (12, 10), (9, 10), (24, 20)):
        remember_example(record, {"inputs": {"x": value}, "law_value": law, "measured": value}, failing=False)
    assert record["inputs"] == {"x": 12} and record["deviation"] == pytest.approx(0.2)  # 24 vs 20 ties at 0.2: the first stays
    remember_example(record, {"inputs": {"x": 1}, "law_value": 10, "measured": 10}, failing=True)
    remember_example(record, {"inputs": {"x": 99}, "law_value": 1, "measured": 100}, failing=False)
    assert record["inputs"] == {"x": 1} and record["example"] == "failing"  # a failing example is what a failure shows


@pytest.mark.parametrize(("expected", "measured", "deviation"), [
    (100, 114, 0.14), (4, 4, 0.0), ([4, 1], [4, 2], 1.0), (0, 1, None), (True, False, None), ("a", "a", None),
    (float("inf"), 1.0, None), ([1, 2], [1], None),
])
def test_relative_deviation(expected, measured, deviation):
    assert relative_deviation(expected, measured) == (pytest.approx(deviation) if deviation is not None else None)


def test_claims_json_is_strict_even_when_a_spec_or_a_check_gives_nan(tmp_path):
    """`expect: {equals: .nan}` or a check measuring inf: report.json stays strict JSON (the value
    becomes the string "nan"/"inf"), so json.loads in strict mode and other parsers read it."""
    from resacct.harness.report import write_claims_json

    record = {"id": "x", "area": "demo", "path": "specs/demo.claims.yaml", "line": 1, "outcome": "failed",
              "expect": {"equals": float("nan")}, "measured": float("inf"), "law_value": [1.0, float("-inf")]}
    write_claims_json(tmp_path / "report.json", [record])

    def refuse(name: str):
        raise ValueError(name)

    written = json.loads((tmp_path / "report.json").read_text(), parse_constant=refuse)["claims"][0]
    assert (written["expect"], written["measured"], written["law_value"]) == ({"equals": "nan"}, "inf", [1.0, "-inf"])
    assert not list(tmp_path.glob(".*.tmp"))
