"""The quick tier (``tests/quick_tier.py``): plain ``pytest`` leaves out what is marked slow and says
so; ``--run-slow``, ``RESACCT_RUN_SLOW=1``, a named file, ``-m`` or ``-k`` run it."""

from __future__ import annotations

import pytest

from tests.quick_tier import RUN_SLOW_VARIABLE

TWO_TESTS = """
import pytest

def test_quick():
    pass

@pytest.mark.slow
def test_slow():
    pass
"""


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.delenv(RUN_SLOW_VARIABLE, raising=False)
    pytester.makeini("[pytest]\ntestpaths = suite\nmarkers =\n    slow: slow\n")
    pytester.mkpydir("suite").joinpath("test_two.py").write_text(TWO_TESTS)
    return pytester


def test_plain_pytest_leaves_the_slow_tier_out_and_says_how_to_run_it(project: pytest.Pytester) -> None:
    result = project.runpytest("-p", "tests.quick_tier", "-v")
    result.assert_outcomes(passed=1, deselected=1)
    result.stdout.fnmatch_lines(["*test_quick PASSED*", "quick tier: 1 tests and claims marked slow were not run; `pytest --run-slow` runs them too*"])
    assert "test_slow" not in result.stdout.str()


@pytest.mark.parametrize("arguments", [["--run-slow"], ["suite/test_two.py"], ["-m", "slow or not slow"], ["-k", "test"]])
def test_asking_for_more_runs_the_slow_tier(project: pytest.Pytester, arguments: list[str]) -> None:
    result = project.runpytest("-p", "tests.quick_tier", *arguments)
    result.assert_outcomes(passed=2)
    assert "quick tier:" not in result.stdout.str()


def test_the_environment_variable_runs_the_slow_tier(project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RUN_SLOW_VARIABLE, "1")
    project.runpytest("-p", "tests.quick_tier").assert_outcomes(passed=2)


def test_a_claim_marked_slow_and_its_meta_test_share_the_slow_tier() -> None:
    from tests.harness.test_real_claims_can_fail import CLAIMS, with_its_claims_tier

    slow_claims = [claim for claim in CLAIMS if "slow" in claim.claim.marks]
    assert slow_claims, "no claim is marked slow: the quick tier would run every claim"
    for claim in slow_claims:
        assert any(mark.name == "slow" for mark in with_its_claims_tier(claim)), claim.id
    quick = next(claim for claim in CLAIMS if "slow" not in claim.claim.marks)
    assert not any(mark.name == "slow" for mark in with_its_claims_tier(quick))
