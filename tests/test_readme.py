"""The README's Python examples run as doctests: what it shows is what resacct prints."""

from __future__ import annotations

import doctest
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_examples_run():
    assert README.read_text(encoding="utf-8").count(">>> ") >= 5
    results = doctest.testfile(str(README), module_relative=False, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert results.attempted >= 5 and results.failed == 0


def test_readme_is_short_and_its_counts_are_the_specs():
    """Issue 21: a newcomer reads the README in five minutes, and the counts it states are today's."""
    import re

    from resacct.harness.loader import load_claims_file

    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150
    stated = re.search(r"\*\*(\d+) claims in (\d+) areas\*\*", text)
    assert stated, "the README states how many claims and areas there are"
    loaded = [load_claims_file(path) for path in sorted((README.parent / "resacct" / "specs").glob("*.claims.yaml"))]
    claims, areas = sum(len(file.claims) for file in loaded), len({file.area for file in loaded})
    assert (int(stated.group(1)), int(stated.group(2))) == (claims, areas), f"the specs hold {claims} claims in {areas} areas"
