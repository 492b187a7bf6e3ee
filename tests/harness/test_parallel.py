"""The claims give the same outcomes under pytest-xdist (-n 2) as in one process.

The one-process run is in-process (torch is already imported: about a second); only the xdist
run pays for fresh interpreters, since that is what it tests.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

SPECS = Path(__file__).resolve().parents[2] / "resacct" / "specs"
NAMES = ("storage.claims.yaml", "devices.claims.yaml")


def _outcomes(report: Path) -> dict[str, str]:
    return {record["id"]: record["outcome"] for record in json.loads(report.read_text())["claims"]}


@pytest.mark.slow
def test_xdist_gives_the_same_outcomes(pytester):
    for name in NAMES:  # copies: the repository's pytest.ini (jaxtyping's import hook) stays out of both runs
        (pytester.path / name).write_text((SPECS / name).read_text(encoding="utf-8"), encoding="utf-8")
    files = list(NAMES)
    sequential_report, parallel_report = pytester.path / "sequential.json", pytester.path / "parallel.json"
    result = pytester.runpytest_inprocess(*files, "-p", "no:cacheprovider", "--claims-json", str(sequential_report))
    assert result.ret == 0, result.stdout.str()
    result = pytester.runpytest_subprocess(*files, "-p", "no:cacheprovider", "--claims-json", str(parallel_report), "-n", "2")
    assert result.ret == 0, result.stdout.str()
    sequential, parallel = _outcomes(sequential_report), _outcomes(parallel_report)
    assert parallel == sequential
    assert {"holds", "refuted", "skipped"} <= set(sequential.values())
    assert "2 workers" in result.stdout.str()
