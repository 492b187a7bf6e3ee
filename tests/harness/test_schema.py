"""The JSON schema for editors is committed and current; the pydantic schema forbids unknown keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from resacct.harness.schema import Claim, json_schema

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "resacct" / "specs" / "claims.schema.json"


def test_committed_json_schema_is_current():
    assert json.loads(SCHEMA_FILE.read_text()) == json_schema(), "run: python -m resacct.harness.schema > specs/claims.schema.json"


def test_unknown_keys_are_forbidden():
    with pytest.raises(ValidationError):
        Claim.model_validate({"id": "a", "says": "s", "measure": "m", "law": "1", "lawz": "2"})


def test_a_number_is_a_law():
    assert Claim.model_validate({"id": "a", "says": "s", "measure": "m", "law": 128}).law == "128"


def test_approx_needs_a_tolerance():
    with pytest.raises(ValidationError, match="needs a 'tolerance'"):
        Claim.model_validate({"id": "a", "says": "s", "measure": "m", "expect": {"approx": 1.0}})


def test_refuted_claims_need_a_concrete_counterexample():
    with pytest.raises(ValidationError, match="concrete counterexample"):
        Claim.model_validate({"id": "a", "says": "s", "measure": "m", "law": "1", "forall": {"x": "dim"}, "status": "refuted", "truth": "t"})
