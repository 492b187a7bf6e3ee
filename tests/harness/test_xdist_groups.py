"""``--dist loadgroup`` really keeps a group on one worker (tests/xdist_groups.py): without it, on
pytest 9.2 with pytest-xdist 3.8, a spec file's claims and their meta-tests are spread over the
workers and the meta-tests lose the remembered measurement."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

GROUPED = """
import pytest

@pytest.mark.xdist_group("together")
@pytest.mark.parametrize("i", range(6))
def test_grouped(i):
    pass

@pytest.mark.parametrize("i", range(6))
def test_free(i):
    pass
"""


def workers_by_test(output: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for worker, name in re.findall(r"\[(gw\d+)\].*?::(test_\w+)\[", output):
        found.setdefault(name, set()).add(worker)
    return found


@pytest.mark.slow
def test_a_group_runs_on_one_worker(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")])))
    pytester.makepyfile(test_a=GROUPED, test_b=GROUPED)
    result = pytester.runpytest_subprocess("-p", "tests.xdist_groups", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup", "-v")
    result.assert_outcomes(passed=24)
    workers = workers_by_test(result.stdout.str())
    assert len(workers["test_grouped"]) == 1, workers
    assert "@together" in result.stdout.str()
