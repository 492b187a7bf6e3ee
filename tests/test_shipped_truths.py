"""The shipped claims' truths quote this run's numbers where they mean to: a doubled brace is a literal brace
(``{{measured}}`` prints ``{measured}``), so a truth that doubles the braces of a field it could fill prints the
placeholder in every report instead of the number. Nineteen of gpu_recorded's did until session 27 (report.json:
"the median step took {measured:.4g} s on the board")."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from resacct.harness.loader import load_claims_file
from resacct.harness.registry import get_check
from resacct.harness.schema import fill_truth

SPECS = sorted((Path(__file__).resolve().parent.parent / "resacct" / "specs").glob("*.claims.yaml"))
ESCAPED_FIELD = re.compile(r"\{\{([A-Za-z_][A-Za-z0-9_]*)(?::[^{}]*)?\}\}")


@pytest.mark.parametrize("path", SPECS, ids=[path.name for path in SPECS])
def test_no_shipped_truth_escapes_a_field_it_could_fill(path: Path) -> None:
    escaped = []
    for loaded in load_claims_file(path).claims:
        claim = loaded.claim
        if not claim.truth:
            continue
        fillable = {"measured", *claim.given, *claim.forall, *get_check(claim.measure).quantities}
        escaped += [f"{loaded.id}: {match.group(0)}" for match in ESCAPED_FIELD.finditer(claim.truth) if match.group(1) in fillable]
    assert escaped == []


def test_a_recorded_time_claims_truth_prints_the_boards_number() -> None:
    path = next(path for path in SPECS if path.name == "gpu_recorded.claims.yaml")
    claim = next(loaded.claim for loaded in load_claims_file(path).claims if loaded.id == "recorded-h200-hf-gpt2-fp32-serve-decode-time-predicted")
    assert claim.truth is not None
    filled = fill_truth(claim.truth, {"measured": 0.003726637, "predicted_token_sec": 0.002312894})
    assert "0.003727 s" in filled and "0.002313 s" in filled and "{" not in filled, filled
