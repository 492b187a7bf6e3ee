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
