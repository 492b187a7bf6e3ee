"""The claims give the same outcomes under pytest-xdist (-n 2) as in one process."""

from __future__ import annotations

import json
from pathlib import Path

SPECS = Path(__file__).resolve().parents[2] / "resacct" / "specs"


def outcomes_by_id(pytester, *extra: str) -> dict[str, str]:
    report = pytester.path / f"report{len(extra)}.json"
    files = [str(SPECS / name) for name in ("storage.claims.yaml", "devices.claims.yaml")]
    result = pytester.runpytest_subprocess(*files, "-p", "no:cacheprovider", "--claims-json", str(report), *extra)
    assert result.ret == 0, result.stdout.str()
    return {record["id"]: record["outcome"] for record in json.loads(report.read_text())["claims"]}


def test_xdist_gives_the_same_outcomes(pytester):
    sequential = outcomes_by_id(pytester)
    parallel = outcomes_by_id(pytester, "-n", "2")
    assert parallel == sequential
    assert {"holds", "refuted", "skipped"} <= set(sequential.values())
