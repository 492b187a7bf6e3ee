"""The hostile-spec corpus (tests/hostile_specs/*.hostile.yaml): every broken spec gives exactly
the one-line message in expected.yaml — file, line and claim — in bounded time and memory, as a
failing item, never runs code from the spec, and never stops the other claims of the run.

All hostile specs run together in ONE inner pytest run beside a bystander file of good claims
(one run instead of ~95 keeps this module fast); each case then asserts its own line, its own
failing record, and that the bystander's claims held in that same run.
"""

from __future__ import annotations

import json
import re
import shutil
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import yaml

from resacct.harness.loader import load_claims_file
from resacct.harness.registry import get_check
from tests.harness.test_plugin import outcomes

CORPUS = Path(__file__).resolve().parents[1] / "hostile_specs"
EXPECTED: dict[str, str] = yaml.safe_load((CORPUS / "expected.yaml").read_text(encoding="utf-8"))
CASES = sorted(path.name.removesuffix(".hostile.yaml") for path in CORPUS.glob("*.hostile.yaml"))

BYSTANDER = """\
area: bystander
source: tests — the good claims that must still run beside the hostile specs
claims:
  - id: bystander-given
    says: float32 has 32 bits.
    measure: dtypes.bits
    given: {dtype: float32}
    law: 32
  - id: bystander-forall
    says: a matmul of m×k by k×n does 2mkn flops.
    measure: flops.matmul
    forall: {m: small_dim, k: small_dim, n: small_dim}
    law: 2*m*k*n
"""

_CORPUS_RUN: dict[str, Any] = {}
CORPUS_RUN_GROUP = "hostile-corpus-run"


def matches(line: str, expected: str) -> bool:
    """Exact match, where '*' alone stands for any text (a count that grows with the project)."""
    return re.fullmatch(".*".join(re.escape(part) for part in expected.split("*")), line) is not None


def _refuse_constant(name: str) -> None:
    raise ValueError(f"report holds {name}, which is not JSON")


@pytest.fixture
def corpus_run(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The whole corpus plus the bystander, run once per process (inner pytest, in-process)."""
    if not _CORPUS_RUN:
        # pytester drops modules first imported in the inner run; flops.matmul's first call imports
        # ~800 torch modules (FlopCounterMode), which must not be imported twice: import them here.
        get_check("flops.matmul")(m=1, k=1, n=1)
        pytester: pytest.Pytester = request.getfixturevalue("pytester")
        monkeypatch: pytest.MonkeyPatch = request.getfixturevalue("monkeypatch")
        monkeypatch.chdir(pytester.path)
        specs = pytester.path / "specs"
        specs.mkdir()
        for name in CASES:
            shutil.copy(CORPUS / f"{name}.hostile.yaml", specs / f"{name}.claims.yaml")
        (specs / "bystander.claims.yaml").write_text(BYSTANDER, encoding="utf-8")
        report = pytester.path / "claims.json"
        started = time.perf_counter()
        result = pytester.runpytest("-q", "-p", "no:randomly", "--claims-json", str(report))
        document = json.loads(report.read_text(encoding="utf-8"), parse_constant=_refuse_constant)
        _CORPUS_RUN.update(
            seconds=time.perf_counter() - started,
            lines=result.stdout.lines,
            text=result.stdout.str(),
            outcomes=outcomes(result),
            records=document["claims"],
            pwned=(pytester.path / "pwned").exists(),
        )
    return _CORPUS_RUN


def test_the_corpus_is_complete():
    assert len(CASES) >= 90
    assert sorted(EXPECTED) == CASES, "every hostile spec needs its expected message, and only those"


# One xdist worker runs every test of the corpus run, so the run (2.7 CPU s, loaded) is paid once, not once per worker
@pytest.mark.xdist_group(CORPUS_RUN_GROUP)
@pytest.mark.parametrize("name", CASES)
def test_hostile_spec_gives_its_exact_message_and_the_rest_still_runs(corpus_run, name):
    assert any(matches(line, EXPECTED[name]) for line in corpus_run["lines"]), (
        f"expected line not found:\n{EXPECTED[name]}\n---\n{corpus_run['text']}"
    )
    own = [record for record in corpus_run["records"] if record["path"] == f"specs/{name}.claims.yaml"]
    assert any(record["outcome"] in {"invalid", "failed"} for record in own), own
    bystanders = {record["id"]: record["outcome"] for record in corpus_run["records"] if record["area"] == "bystander"}
    assert bystanders == {"bystander-given": "holds", "bystander-forall": "holds"}


@pytest.mark.xdist_group(CORPUS_RUN_GROUP)
def test_the_corpus_run_is_one_line_per_problem_without_tracebacks(corpus_run):
    assert corpus_run["outcomes"] == {"failed": len(CASES), "passed": 3}  # the bystander's 2 and duplicate-id's first claim
    assert "Traceback" not in corpus_run["text"]
    assert not corpus_run["pwned"]
    assert corpus_run["seconds"] < 60


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
