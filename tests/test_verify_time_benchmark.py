"""benchmarks/verify_time.py refuses what it cannot run, in one line (the script itself runs whole verifies:
a benchmark, not a test): a Python without torch (its children run ``python -m resacct``) and ``--rounds 0``."""

from __future__ import annotations

import importlib.util
import subprocess
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


def test_head_names_a_commit_in_a_git_checkout() -> None:
    """HEAD is a commit where the tree is a git checkout; a tree without git (a release tarball, a ``git archive``
    copy: benchmarks/quick_tier_time.py's baseline) has none to name, and says so."""
    script = _script()
    in_checkout = subprocess.run(["git", "rev-parse", "--verify", "--quiet", "HEAD"], cwd=script.ROOT, capture_output=True).returncode == 0
    problem = script.commit_problem("HEAD")
    assert (problem is None) if in_checkout else ("'HEAD' is not a commit of" in str(problem))


def _quick_tier_script():  # type: ignore[no-untyped-def]
    return load_script("benchmarks/quick_tier_time.py")


@pytest.mark.parametrize(("argv", "named"), [(["--rounds", "0"], "--rounds"), (["--baseline", "no-such-commit-32"], "no-such-commit-32"),
                                              (["--commit", "no-such-commit-32"], "--commit")])
def test_the_quick_tier_benchmark_refuses_what_it_cannot_run(argv, named, capsys) -> None:
    with pytest.raises(SystemExit) as stopped:
        _quick_tier_script().main(argv)
    assert stopped.value.code == 2 and named in capsys.readouterr().err


@pytest.mark.parametrize(("output", "summary"), [
    ("....\n4880 passed, 67 skipped in 104.93s (0:01:44)\n", "4880 passed, 67 skipped"),
    ("F.\n=== 2 failed, 4877 passed, 67 skipped in 113.19s (0:01:53) ===\n", "2 failed, 4877 passed, 67 skipped"),
    ("no tests ran in 0.01s\n", "(no summary)"),
])
def test_the_quick_tier_benchmark_reads_pytests_summary_line(output, summary) -> None:
    assert _quick_tier_script().pytest_summary(output) == summary
