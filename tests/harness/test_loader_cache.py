"""load_claims_file parses the same bytes once per process and never serves stale claims."""

from __future__ import annotations

import os
from pathlib import Path

from resacct.harness import loader

CLAIM = """area: dtypes
source: test
claims:
  - id: {id}
    says: a float32 element is 4 bytes
    measure: dtypes.element_size
    given: {{dtype: float32}}
    law: "4"
"""


def test_the_same_bytes_are_parsed_once_and_each_caller_gets_its_own_lists(tmp_path: Path, monkeypatch):
    path = tmp_path / "a.claims.yaml"
    path.write_text(CLAIM.format(id="first"))
    parses = []
    real_load = loader._load
    monkeypatch.setattr(loader, "_load", lambda *args: parses.append(1) or real_load(*args))
    one, two = loader.load_claims_file(path), loader.load_claims_file(path)
    assert len(parses) == 1
    assert [c.id for c in one.claims] == [c.id for c in two.claims] == ["first"]
    one.claims.clear()
    assert [c.id for c in loader.load_claims_file(path).claims] == ["first"]


def test_a_rewrite_with_the_same_size_and_mtime_is_parsed_again(tmp_path: Path):
    path = tmp_path / "b.claims.yaml"
    path.write_text(CLAIM.format(id="alpha"))
    stamp = path.stat()
    assert [c.id for c in loader.load_claims_file(path).claims] == ["alpha"]
    path.write_text(CLAIM.format(id="gamma"))
    os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert [c.id for c in loader.load_claims_file(path).claims] == ["gamma"]


def test_the_same_bytes_under_another_display_path_name_that_path(tmp_path: Path):
    path = tmp_path / "c.claims.yaml"
    path.write_text(CLAIM.format(id="c") + "  - id: broken\n")
    first = loader.load_claims_file(path, display_path="specs/one.claims.yaml")
    second = loader.load_claims_file(path, display_path="specs/two.claims.yaml")
    assert first.errors and second.errors
    assert str(first.errors[0]).startswith("specs/one.claims.yaml") and str(second.errors[0]).startswith("specs/two.claims.yaml")
