"""docs/coverage.md maps the lecture's code to claims: every id it names must exist, and every
claim of the lecture*.claims.yaml files must appear in it (so the table cannot drift)."""

from __future__ import annotations

import functools
import re
from pathlib import Path

from resacct.facts.yaml_text import safe_load_text

ROOT = Path(__file__).resolve().parents[1]
SPECS = ROOT / "resacct" / "specs"
COVERAGE = ROOT / "docs" / "coverage.md"


@functools.cache
def _claims_of(path: Path) -> list[dict]:
    """A spec file's claims, parsed once a process with libyaml where PyYAML has it (5-10× faster than
    the pure-Python parser on the shipped tables: benchmarks/parse_costs.py; each test here read them all)."""
    return safe_load_text(path.read_text(encoding="utf-8"))["claims"]


def _claim_ids(pattern: str) -> set[str]:
    return {claim["id"] for path in SPECS.glob(pattern) for claim in _claims_of(path)}


def _table_cells() -> list[str]:
    rows = [line for line in COVERAGE.read_text(encoding="utf-8").splitlines() if line.startswith("| L") or line.startswith("| facts")]
    return [line.rsplit("|", 2)[1] for line in rows]


def test_every_id_named_in_the_table_is_a_claim():
    known = _claim_ids("*.claims.yaml")
    named = {token for cell in _table_cells() for token in re.findall(r"\b[a-z0-9][a-z0-9._]*(?:-[a-z0-9._]+)+\b", cell)}
    named = {token for token in named if not re.fullmatch(r"[0-9.e+-]+", token)}  # numbers such as 4e-34
    assert named, "the coverage table names no claim"
    assert sorted(named - known) == []


def test_every_lecture_claim_appears_in_the_table():
    text = "\n".join(_table_cells())
    missing = sorted(claim_id for claim_id in _claim_ids("lecture*.claims.yaml") if not re.search(rf"(?<![\w.-]){re.escape(claim_id)}(?![\w-])", text))
    assert missing == []


def test_both_years_have_rows():
    text = COVERAGE.read_text(encoding="utf-8")
    assert "## lecture_02.py, spring 2025" in text and "## lecture_02.py, spring 2024" in text


def test_claim_ids_are_unique_across_the_shipped_specs():
    """A claim id reused in another file is invalid at collection — caught here in a second,
    without running the claims (the lecture files once reused an id of memory.claims.yaml)."""
    seen: dict[str, str] = {}
    duplicates = []
    for path in sorted(SPECS.glob("*.claims.yaml")):
        for claim in _claims_of(path):
            if claim["id"] in seen:
                duplicates.append(f"{claim['id']}: {seen[claim['id']]} and {path.name}")
            seen.setdefault(claim["id"], path.name)
    assert duplicates == []
