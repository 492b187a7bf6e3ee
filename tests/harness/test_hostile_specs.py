"""The hostile-spec corpus (tests/hostile_specs/*.hostile.yaml): every broken spec gives exactly
the one-line message in expected.yaml — file, line and claim — in bounded time and memory, as a
failing item, and never runs code from the spec."""

from __future__ import annotations

import re
import shutil
import time
import tracemalloc
from pathlib import Path

import pytest
import yaml

from resacct.harness.loader import load_claims_file
from tests.harness.test_plugin import outcomes

CORPUS = Path(__file__).resolve().parents[1] / "hostile_specs"
EXPECTED: dict[str, str] = yaml.safe_load((CORPUS / "expected.yaml").read_text(encoding="utf-8"))
CASES = sorted(path.name.removesuffix(".hostile.yaml") for path in CORPUS.glob("*.hostile.yaml"))


def matches(line: str, expected: str) -> bool:
    """Exact match, where '*' alone stands for any text (a count that grows with the project)."""
    return re.fullmatch(".*".join(re.escape(part) for part in expected.split("*")), line) is not None


def test_the_corpus_is_complete():
    assert len(CASES) >= 25
    assert sorted(EXPECTED) == CASES, "every hostile spec needs its expected message, and only those"


@pytest.mark.parametrize("name", CASES)
def test_hostile_spec_gives_its_exact_message(pytester, name, monkeypatch):
    monkeypatch.chdir(pytester.path)
    (pytester.path / "specs").mkdir()
    shutil.copy(CORPUS / f"{name}.hostile.yaml", pytester.path / "specs" / f"{name}.claims.yaml")
    result = pytester.runpytest("-q", "-p", "no:randomly")
    assert outcomes(result).get("failed", 0) >= 1, result.stdout.str()
    assert any(matches(line, EXPECTED[name]) for line in result.stdout.lines), (
        f"expected line not found:\n{EXPECTED[name]}\n---\n{result.stdout.str()}"
    )
    assert "Traceback" not in result.stdout.str()
    assert not (pytester.path / "pwned").exists()


@pytest.mark.parametrize("name", CASES)
def test_loading_is_bounded_in_time_and_memory(name):
    tracemalloc.start()
    started = time.perf_counter()
    load_claims_file(CORPUS / f"{name}.hostile.yaml")
    elapsed_seconds = time.perf_counter() - started
    _, peak_bytes = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert elapsed_seconds < 2.0
    assert peak_bytes < 20 * 2**20


def test_a_10_megabyte_file_is_refused_without_reading_it(tmp_path):
    path = tmp_path / "huge.claims.yaml"
    with path.open("w") as handle:
        handle.write("area: huge\nsource: s\nclaims:\n")
        handle.write(("  - id: c\n    says: " + "x" * 100 + "\n") * 90_000)
    assert path.stat().st_size > 10_000_000
    tracemalloc.start()
    loaded = load_claims_file(path, display_path="specs/huge.claims.yaml")
    _, peak_bytes = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert [str(error) for error in loaded.errors] == [f"specs/huge.claims.yaml: file is {path.stat().st_size} bytes; claims files may be at most 1000000"]
    assert peak_bytes < 2**20
