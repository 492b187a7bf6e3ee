"""The README's Python examples run as doctests: what it shows is what resacct prints."""

from __future__ import annotations

import doctest
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_examples_run():
    assert README.read_text(encoding="utf-8").count(">>> ") >= 5
    results = doctest.testfile(str(README), module_relative=False, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert results.attempted >= 5 and results.failed == 0
