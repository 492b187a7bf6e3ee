"""A claim's ``when:``: the kind of machine it is about. Twins split by a condition — every machine
decides one and skips the other naming the condition; a bad condition is a spec error at its line;
a truth quotes this run's measurement."""

from __future__ import annotations

import json

import pytest

from resacct.measurement import machine_profile
from resacct.measurement.machine_profile import DetectionInputs, profile_from
from tests.harness.test_plugin import outcomes

AMX = profile_from(DetectionInputs(system="Linux", machine="x86_64", torch_cpu_capability="AVX512",
                                   cpuinfo_text="model name : Test Xeon\nflags : avx2 avx512f avx512bw avx512vl avx512dq avx512_bf16 amx_bf16 amx_tile\n"))
CONVERTS = profile_from(DetectionInputs(system="Linux", machine="x86_64", torch_cpu_capability="AVX2",
                                        cpuinfo_text="model name : Test Xeon\nflags : avx2\n"))

TWINS = """
area: demo
source: test
claims:
  - id: fast-with-units
    says: with bf16 units, 3 is at least 1
    measure: testing.echo
    given: {value: 3}
    when: {cpu_bf16_units: true}
    expect: {at_least: 1}
  - id: fast-without-units
    says: without bf16 units, 3 is at least 10 (refuted)
    measure: testing.echo
    given: {value: 3}
    when: {cpu_bf16_matmul: [converted, emulated]}
    expect: {at_least: 10}
    status: refuted
    truth: "measured {measured} ({twice:,d} twice over), not 10"
"""


@pytest.fixture
def machine(monkeypatch):
    def use(profile):
        monkeypatch.setattr(machine_profile, "this_machine", lambda: profile)

    return use


@pytest.mark.parametrize(("profile", "decided", "skipped", "reason"), [
    (AMX, "fast-with-units", "fast-without-units", "about machines where cpu_bf16_matmul in [converted, emulated] (this machine: amx)"),
    (CONVERTS, "fast-without-units", "fast-with-units", "about machines where cpu_bf16_units = true (this machine: false)"),
], ids=["amx", "converts"])
def test_each_machine_decides_one_twin_and_names_the_others_condition(pytester, write_spec, machine, profile, decided, skipped, reason):
    machine(profile)
    write_spec("demo.claims.yaml", TWINS)
    result = pytester.runpytest("--claims-json", "claims.json")
    assert outcomes(result) == {"passed": 1, "skipped": 1}
    records = {record["id"]: record for record in json.loads((pytester.path / "claims.json").read_text())["claims"]}
    assert records[decided]["outcome"] in ("holds", "refuted")
    assert records[skipped]["outcome"] == "skipped" and records[skipped]["message"] == reason
    assert records["fast-without-units"]["when"] == {"cpu_bf16_matmul": ["converted", "emulated"]}


def test_a_truth_quotes_this_runs_measurement(pytester, write_spec, machine):
    machine(CONVERTS)
    write_spec("demo.claims.yaml", TWINS)
    pytester.runpytest("--claims-json", "claims.json")
    record = next(r for r in json.loads((pytester.path / "claims.json").read_text())["claims"] if r["id"] == "fast-without-units")
    assert record["truth"] == "measured 3 (6 twice over), not 10"


@pytest.mark.parametrize(("when", "problem"), [
    ("{cpu_bf16_unitz: true}", "unknown machine field 'cpu_bf16_unitz'; known: os, architecture"),
    ("{cpu_bf16_units: maybe}", "cpu_bf16_units: expected true or false, got 'maybe'"),
    ("{cpu_bf16_matmul: [converted, tiles]}", "cpu_bf16_matmul: expected one of converted, emulated, avx512_bf16, amx, arm_bf16"),
    ("{torch_threads: {at_least: two}}", "torch_threads: expected a whole number"),
    ("[cpu_bf16_units]", "when: Input should be a valid dictionary"),
])
def test_a_bad_condition_is_a_spec_error_at_its_line(pytester, write_spec, when, problem):
    write_spec("demo.claims.yaml", f"""
        area: demo
        source: test
        claims:
          - id: good
            says: fine
            measure: testing.echo
            given: {{value: 1}}
            law: 1
          - id: bad-when
            says: a claim about a machine that cannot be
            measure: testing.echo
            given: {{value: 1}}
            when: {when}
            law: 1
        """)
    result = pytester.runpytest()
    assert outcomes(result) == {"passed": 1, "failed": 1}
    result.stdout.fnmatch_lines([f"*specs/demo.claims.yaml:13: claim 'bad-when': *{problem}*"])


def test_a_truth_field_that_names_nothing_measured_is_a_spec_error(pytester, write_spec):
    write_spec("demo.claims.yaml", """
        area: demo
        source: test
        claims:
          - id: bad-truth
            says: s
            measure: testing.echo
            given: {value: 1}
            law: 2
            status: refuted
            truth: "measured {measured}, quoting {nothing}"
        """)
    result = pytester.runpytest()
    result.stdout.fnmatch_lines(["*claims.yaml:10: claim 'bad-truth': truth quotes {nothing}, which is neither 'measured'*"])


def test_the_shipped_bf16_twins_cover_every_kind_of_x86_cpu_once_at_most():
    """No machine decides both twins of a lecture claim; the AMX and the converting kinds each decide one."""
    from pathlib import Path

    from resacct.harness.loader import load_claims_file
    from resacct.measurement.machine_profile import BF16_MATMUL_PATHS, condition_holds

    claims = {loaded.id: loaded.claim for loaded in load_claims_file(Path("resacct/specs/lecture.claims.yaml")).claims}
    for base in ("lecture-bf16-actual-flops-higher-cpu", "lecture-lower-precision-less-compute-cpu"):
        twins = [claims[base], claims[f"{base}-amx"]]
        for path in BF16_MATMUL_PATHS:
            profile = machine_profile.MachineProfile(**{**AMX.to_dict(), "faked": (), "cpu_bf16_matmul": path})
            deciding = [twin for twin in twins if all(condition_holds(profile, key, value) for key, value in twin.when.items())]
            assert len(deciding) <= 1, (base, path)
            if path in ("converted", "emulated", "amx"):
                assert len(deciding) == 1, (base, path)
