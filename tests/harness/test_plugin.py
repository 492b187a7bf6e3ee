"""The pytest plugin end to end (pytester): items, node ids, outcomes, messages, marks, summary."""

from __future__ import annotations

import pytest

GOOD = """
area: demo
source: test — "section"
claims:
  - id: square-law
    says: x squared is x times x.
    measure: testing.square
    forall: {x: "integers(-50, 50)"}
    law: x*x
  - id: echo-given
    says: echo measures what it is given.
    measure: testing.echo
    given: {value: 7}
    law: 7
"""


def outcomes(result: pytest.RunResult) -> dict[str, int]:
    """Outcome counts of an inner run; in-process pytester runs warn that already-imported
    plugins cannot be assertion-rewritten, which says nothing about the claims."""
    return {key: value for key, value in result.parseoutcomes().items() if value and key not in {"warnings", "warning"}}


def test_collects_one_item_per_claim_with_file_node_ids(pytester, write_spec):
    write_spec("demo.claims.yaml", GOOD)
    result = pytester.runpytest("--collect-only", "-q")
    result.stdout.fnmatch_lines(["specs/demo.claims.yaml::square-law", "specs/demo.claims.yaml::echo-given"])


def test_holding_claims_pass_and_summary_counts_them(pytester, write_spec):
    write_spec("demo.claims.yaml", GOOD)
    result = pytester.runpytest()
    assert outcomes(result) == {"passed": 2}
    result.stdout.fnmatch_lines(["*resacct claims*", "demo *2 *0 *0 *0 *0 *0", "claims: 2 holds, 0 refuted, 0 skipped, 0 inconclusive, 0 failed, 0 invalid"])


def test_other_yaml_files_are_not_collected(pytester, write_spec):
    write_spec("notes.yaml", "claims: [1, 2]\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED


def test_claims_files_glob_is_configurable(pytester, write_spec):
    write_spec("demo.facts.yml", GOOD)
    pytester.makeini("[pytest]\nclaims_files = *.facts.yml\n")
    assert outcomes(pytester.runpytest()) == {"passed": 2}


def test_wrong_law_fails_with_law_prediction_and_measurement(pytester, write_spec):
    write_spec(
        "demo.claims.yaml",
        """
        area: demo
        source: test
        claims:
          - id: wrong-law
            says: echo of 7 is 8.
            measure: testing.echo
            given: {value: 7}
            law: 8
        """,
    )
    result = pytester.runpytest()
    assert outcomes(result) == {"failed": 1}
    result.stdout.fnmatch_lines(
        [
            "specs/demo.claims.yaml:4: claim 'wrong-law' does not hold",
            "*says*echo of 7 is 8.",
            "*inputs*value=7",
            "*law*8 = 8",
            "*predicted*7 (resacct)",
            "*measured*7 (torch)",
        ]
    )


def test_forall_claim_finds_a_counterexample(pytester, write_spec):
    write_spec(
        "demo.claims.yaml",
        """
        area: demo
        source: test
        claims:
          - id: square-is-double
            says: x squared is 2x (false unless x is 0 or 2).
            measure: testing.square
            forall: {x: "integers(0, 100)"}
            law: 2*x
        """,
    )
    result = pytester.runpytest()
    assert outcomes(result) == {"failed": 1}
    result.stdout.fnmatch_lines(["*claim 'square-is-double' does not hold*", "*inputs*x=*"])


def test_refuted_claim_passes_while_false(pytester, write_spec):
    write_spec(
        "demo.claims.yaml",
        """
        area: demo
        source: test
        claims:
          - id: seven-is-eight
            says: echo of 7 is 8.
            measure: testing.echo
            given: {value: 7}
            law: 8
            status: refuted
            truth: it is 7
        """,
    )
    result = pytester.runpytest()
    assert outcomes(result) == {"passed": 1}
    result.stdout.fnmatch_lines(["claims: 0 holds, 1 refuted, 0 skipped, 0 inconclusive, 0 failed, 0 invalid"])


def test_refuted_claim_fails_once_it_holds(pytester, write_spec):
    write_spec(
        "demo.claims.yaml",
        """
        area: demo
        source: test
        claims:
          - id: seven-is-seven
            says: echo of 7 is 7.
            measure: testing.echo
            given: {value: 7}
            law: 7
            status: refuted
            truth: it was not, once
        """,
    )
    result = pytester.runpytest()
    assert outcomes(result) == {"failed": 1}
    result.stdout.fnmatch_lines(["*claim 'seven-is-seven' is marked refuted, but the measurement now agrees with it*"])


def test_wrong_prediction_fails_even_when_the_law_holds(pytester, write_spec):
    write_spec(
        "demo.claims.yaml",
        """
        area: demo
        source: test
        claims:
          - id: bad-prediction
            says: echo of 7 is 7.
            measure: testing.echo
            given: {value: 7, prediction_offset: 1}
            law: 7
        """,
    )
    result = pytester.runpytest()
    assert outcomes(result) == {"failed": 1}
    result.stdout.fnmatch_lines(["*resacct's prediction disagrees with the measurement*", "*predicted*8 (resacct)*"])


def test_law_may_use_measured_quantities(pytester, write_spec):
    write_spec(
        "demo.claims.yaml",
        """
        area: demo
        source: test
        claims:
          - id: twice
            says: twice of v is measured v times 2.
            measure: testing.echo
            forall: {value: dim}
            law: twice / 2
        """,
    )
    assert outcomes(pytester.runpytest()) == {"passed": 1}


@pytest.mark.parametrize(
    ("expect", "passes"),
    [
        ("{equals: 7}", True),
        ("{equals: 6}", False),
        ("{at_least: 7}", True),
        ("{at_least: 7.5}", False),
        ("{at_most: 7, at_least: 1}", True),
        ("{at_most: 6.9}", False),
        ("{approx: 7.3}", False),
    ],
)
def test_expectations(pytester, write_spec, expect, passes):
    write_spec(
        "demo.claims.yaml",
        f"""
        area: demo
        source: test
        claims:
          - id: expectation
            says: echo of 7.
            measure: testing.echo
            given: {{value: 7}}
            expect: {expect}
            tolerance: {{abs: 0.2}}
        """,
    )
    assert outcomes(pytester.runpytest()) == ({"passed": 1} if passes else {"failed": 1})


@pytest.mark.parametrize(
    ("match", "passes"),
    [("boom \\d+", True), ("bang", False)],
)
def test_expect_raises_matches_type_and_message(pytester, write_spec, match, passes):
    write_spec(
        "demo.claims.yaml",
        f"""
        area: demo
        source: test
        claims:
          - id: raises
            says: it raises.
            measure: testing.fails_with
            given: {{message: "boom 42"}}
            expect: {{raises: {{type: RuntimeError, match: '{match}'}}}}
        """,
    )
    assert outcomes(pytester.runpytest()) == ({"passed": 1} if passes else {"failed": 1})


def test_unexpected_exception_in_a_check_fails_the_item(pytester, write_spec):
    write_spec(
        "demo.claims.yaml",
        """
        area: demo
        source: test
        claims:
          - id: crashes
            says: it does not raise.
            measure: testing.fails_with
            given: {message: "boom"}
            expect: {equals: 1}
        """,
    )
    result = pytester.runpytest()
    assert outcomes(result) == {"failed": 1}
    result.stdout.fnmatch_lines(["*RuntimeError: boom*"])


GPU_SPEC = """
area: demo
source: test
claims:
  - id: needs-gpu
    says: a GPU claim.
    measure: testing.echo
    given: {value: 1}
    law: 1
    marks: [gpu]
"""


def test_gpu_claims_skip_without_cuda_with_a_reason(pytester, write_spec, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("RESACCT_REQUIRE_GPU", raising=False)
    write_spec("demo.claims.yaml", GPU_SPEC)
    result = pytester.runpytest("-rs")
    assert outcomes(result) == {"skipped": 1}
    result.stdout.fnmatch_lines(["*needs a CUDA GPU; torch * sees none*"])


def test_require_gpu_turns_the_skip_into_a_failure(pytester, write_spec, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("RESACCT_REQUIRE_GPU", "1")
    write_spec("demo.claims.yaml", GPU_SPEC)
    result = pytester.runpytest()
    assert outcomes(result) == {"failed": 1}
    result.stdout.fnmatch_lines(["*RESACCT_REQUIRE_GPU is set, but this claim needs a CUDA GPU*"])


def test_marks_are_real_pytest_marks(pytester, write_spec):
    write_spec("demo.claims.yaml", GPU_SPEC)
    result = pytester.runpytest("-m", "not gpu")
    assert outcomes(result) == {"deselected": 1}


def test_claims_json_records_every_claim(pytester, write_spec):
    import json

    write_spec("demo.claims.yaml", GOOD)
    result = pytester.runpytest("--claims-json", "out/claims.json")
    assert result.ret == 0
    document = json.loads((pytester.path / "out" / "claims.json").read_text())
    by_id = {record["id"]: record for record in document["claims"]}
    assert by_id["echo-given"]["outcome"] == "holds"
    assert by_id["echo-given"]["measured"] == 7 and by_id["echo-given"]["predicted"] == 7
    assert by_id["square-law"]["examples"] >= 1
    assert "torch" in document["environment"]


def test_reportinfo_points_at_the_claims_line(pytester, write_spec):
    write_spec("demo.claims.yaml", GOOD)
    items, _ = pytester.inline_genitems()
    locations = {item.name: item.location for item in items}
    assert locations["square-law"][1] == 3  # 0-based line of "- id: square-law"
    assert locations["echo-given"][1] == 8


def test_requires_torch_skips_other_versions(pytester, write_spec):
    write_spec(
        "demo.claims.yaml",
        """
        area: demo
        source: test
        claims:
          - id: future
            says: true from torch 99 on.
            measure: testing.echo
            given: {value: 1}
            law: 1
            requires_torch: ">=99"
          - id: present
            says: true from torch 2 on.
            measure: testing.echo
            given: {value: 1}
            law: 1
            requires_torch: ">=2"
        """,
    )
    result = pytester.runpytest("-rs")
    assert outcomes(result) == {"passed": 1, "skipped": 1}
    result.stdout.fnmatch_lines(["*claim is about torch >=99; this is torch *"])


def test_requires_transformers_skips_other_versions(pytester, write_spec, monkeypatch):
    import importlib.metadata

    real_version = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "5.17.0" if name == "transformers" else real_version(name))
    write_spec(
        "demo.claims.yaml",
        """
        area: demo
        source: test
        claims:
          - id: newer
            says: true from transformers 5.19 on.
            measure: testing.echo
            given: {value: 1}
            law: 1
            requires_transformers: ">=5.19"
          - id: older
            says: true up to transformers 5.18.
            measure: testing.echo
            given: {value: 1}
            law: 1
            requires_transformers: "<5.19"
        """,
    )
    result = pytester.runpytest_inprocess("-rs")
    assert outcomes(result) == {"passed": 1, "skipped": 1}
    result.stdout.fnmatch_lines(["*claim is about transformers >=5.19; this is transformers 5.17.0*"])


def test_requires_transformers_skips_where_transformers_is_missing(pytester, write_spec, monkeypatch):
    import importlib.metadata

    real_version = importlib.metadata.version

    def version(name: str) -> str:
        if name == "transformers":
            raise importlib.metadata.PackageNotFoundError(name)
        return real_version(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    write_spec(
        "demo.claims.yaml",
        """
        area: demo
        source: test
        claims:
          - id: needs-transformers
            says: true with transformers.
            measure: testing.echo
            given: {value: 1}
            law: 1
            requires_transformers: ">=5"
        """,
    )
    result = pytester.runpytest_inprocess("-rs")
    assert outcomes(result) == {"skipped": 1}
    result.stdout.fnmatch_lines(["*claim is about transformers >=5; transformers is not installed*"])


def test_a_claim_may_expect_resacct_errors(pytester, write_spec):
    import resacct.errors
    from resacct.harness.registry import Outcome, check

    @check("testing.refuses")
    def refuses(value: int) -> Outcome:
        raise resacct.errors.ResacctError(f"value {value} refused")

    write_spec(
        "demo.claims.yaml",
        """
        area: demo
        source: test
        claims:
          - id: refused
            says: resacct refuses 3.
            measure: testing.refuses
            given: {value: 3}
            expect: {raises: {type: ResacctError, match: "value 3 refused"}}
        """,
    )
    assert outcomes(pytester.runpytest()) == {"passed": 1}


def test_a_broken_checks_module_only_breaks_its_own_claims(monkeypatch):
    from resacct.errors import ResacctError
    from resacct.harness import registry

    monkeypatch.setitem(registry._BROKEN_MODULES, "resacct.checks.imaginary", "ImportError: no module named 'nowhere'")
    with pytest.raises(ResacctError, match=r"check 'imaginary.thing' is unavailable: resacct.checks.imaginary failed to import \(ImportError"):
        registry.get_check("imaginary.thing")
    assert registry.get_check("dtypes.bits").name == "dtypes.bits"
