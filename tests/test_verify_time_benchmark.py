"""benchmarks/verify_time.py refuses what it cannot run, in one line (the script itself runs whole verifies:
a benchmark, not a test): a Python without torch (its children run ``python -m resacct``) and ``--rounds 0``."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from tests.script_modules import load_script


def _script():  # type: ignore[no-untyped-def]
    return load_script("benchmarks/verify_time.py")


def test_a_python_without_torch_is_named_with_the_one_to_use(monkeypatch) -> None:
    script = _script()
    assert script.python_without_resacct() is None  # this test's Python runs resacct
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *rest: None if name == "torch" else real(name, *rest))
    problem = script.python_without_resacct()
    assert problem is not None and problem.startswith(f"{sys.executable} has no torch:") and ".venv/bin/python benchmarks/verify_time.py" in problem


@pytest.mark.parametrize("rounds", ["0", "-1", "two"])
def test_rounds_that_are_no_runs_are_a_usage_error(rounds, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        _script().main(["--rounds", rounds])
    assert exited.value.code == 2 and "--rounds" in capsys.readouterr().err


def test_each_phase_gets_the_samples_that_fell_in_it_and_its_idle_cpu_seconds() -> None:
    script = _script()
    samples = [(0.5, 0.5), (1.0, 0.5), (1.5, 1.0), (2.0, 1.0), (3.5, 0.25)]
    rows = script.busy_by_phase(samples, {"start": 1.0, "claims in parallel": 1.0, "figures": 2.0}, 2)
    assert [row[0] for row in rows] == ["start", "claims in parallel", "figures"]
    assert rows[0][1:] == (1.0, 1.0, 1.0)  # half the machine busy for 1 s of 2 CPUs: 1 CPU-second idle
    assert rows[1][1:] == (1.0, 2.0, 0.0)
    assert rows[2][1:] == (2.0, 0.5, 3.0)


def test_a_phase_too_short_for_a_sample_takes_the_nearest_one() -> None:
    rows = _script().busy_by_phase([(0.25, 1.0), (2.0, 0.5)], {"start": 0.1, "claims report": 0.1, "figures": 2.0}, 2)
    assert rows[1][2] == 2.0  # nothing fell in 0.1-0.2 s: the sample at 0.25 s is the nearest
    assert _script().busy_by_phase([], {"start": 1.0}, 2) == [("start", 1.0, 0.0, 2.0)]


@pytest.mark.parametrize("option", ["--baseline", "--commit"])
def test_a_commit_that_is_none_is_a_usage_error_naming_it(option, capsys) -> None:
    with pytest.raises(SystemExit) as stopped:
        _script().main([option, "no-such-commit-31", "--no-core-probe"])
    assert stopped.value.code == 2
    assert f"{option} 'no-such-commit-31' is not a commit of" in capsys.readouterr().err
    assert _script().commit_problem("HEAD") is None
