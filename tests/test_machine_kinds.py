"""One machine behaving like another: the bf16 claims decided natively and under the AVX2 cap.

Exactly the claims whose ``when:`` names the bf16 kind may change outcome between the two runs, and
where one run skips such a claim it names the condition. On a CPU whose native kind already is
``converted`` (AVX2 only: it cannot emulate upward) the AMX twins are checked for *selection* with
the profile faked — their measurement there would be an AVX2 one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from resacct.harness.loader import load_claims_file
from resacct.measurement.machine_profile import FAKE_MACHINE_VARIABLE

pytestmark = pytest.mark.slow

SPECS = Path(__file__).resolve().parents[1] / "resacct" / "specs"
SELECTION = "cpu and bf16 or lower-precision-less-compute-cpu"
CAPPED = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
BF16_FIELDS = {"cpu_bf16_matmul", "cpu_bf16_units"}


def _verify(tmp_path: Path, name: str, environment: dict[str, str]) -> tuple[int, dict]:
    env = {key: value for key, value in os.environ.items() if key not in CAPPED and key != FAKE_MACHINE_VARIABLE}
    env.update(environment)
    done = subprocess.run([sys.executable, "-m", "resacct", "verify", "--json", "--all", "--no-roofline", "--no-timeline", "-k", SELECTION,
                           "--report-dir", str(tmp_path / name)], capture_output=True, text=True, env=env, timeout=600)
    return done.returncode, json.loads(done.stdout)


def _outcomes(document: dict) -> dict[str, dict]:
    return {record["id"]: record for record in document["claims"]}


def _bf16_claims() -> dict[str, dict]:
    claims = {}
    for path in SPECS.glob("*.claims.yaml"):
        for loaded in load_claims_file(path).claims:
            if set(loaded.claim.when) & BF16_FIELDS:
                claims[loaded.id] = dict(loaded.claim.when)
    return claims


def test_the_bf16_claims_flip_by_their_declared_condition_under_the_avx2_cap(tmp_path):
    native_code, native = _verify(tmp_path, "native", {})
    capped_code, capped = _verify(tmp_path, "capped", CAPPED)
    assert capped_code == 0, [r for r in capped["claims"] if r["outcome"] in ("failed", "invalid")]
    assert capped["environment"]["machine"]["cpu_bf16_matmul"] == "converted"
    native_kind = native["environment"]["machine"]["cpu_bf16_matmul"]
    assert native_code == 0 or native_kind not in ("converted", "emulated", "amx"), native["claims"]

    with_condition = _bf16_claims()
    before, after = _outcomes(native), _outcomes(capped)
    flipped = {claim_id for claim_id in before if before[claim_id]["outcome"] != after[claim_id]["outcome"]}
    assert flipped <= set(with_condition), f"claims without a bf16 when: changed outcome: {flipped - set(with_condition)}"
    for claim_id in flipped:
        skipped = before[claim_id] if before[claim_id]["outcome"] == "skipped" else after[claim_id]
        assert skipped["message"].startswith("about machines where cpu_bf16"), skipped
    if native_kind == "converted":
        assert not flipped  # an AVX2 machine is already what the cap emulates
        return
    # Capped, the converting twin is decided (refuted) and the AMX twin skips; natively the other way.
    assert after["lecture-bf16-actual-flops-higher-cpu"]["outcome"] == "refuted"
    assert after["lecture-bf16-slower-than-fp32-cpu"]["outcome"] == "holds"
    assert after["lecture-bf16-actual-flops-higher-cpu-amx"]["outcome"] == "skipped"
    assert "of fp32's FLOP/s" in after["lecture-bf16-actual-flops-higher-cpu"]["truth"] and "{measured" not in after["lecture-bf16-actual-flops-higher-cpu"]["truth"]
    if native_kind == "amx":
        assert before["lecture-bf16-actual-flops-higher-cpu-amx"]["outcome"] == "holds"
        assert before["lecture-bf16-actual-flops-higher-cpu"]["outcome"] == "skipped"
        assert {"lecture-bf16-actual-flops-higher-cpu", "lecture-bf16-actual-flops-higher-cpu-amx",
                "lecture-lower-precision-less-compute-cpu", "lecture-lower-precision-less-compute-cpu-amx"} <= flipped


def test_a_faked_amx_machine_selects_the_amx_twins(tmp_path):
    """Selection only: whatever this CPU measures, a profile saying AMX decides the AMX twins and skips the others."""
    code, faked = _verify(tmp_path, "faked", {FAKE_MACHINE_VARIABLE: json.dumps({"cpu_bf16_matmul": "amx", "cpu_bf16_units": True})})
    records = _outcomes(faked)
    assert faked["environment"]["machine"]["faked"] == ["cpu_bf16_matmul", "cpu_bf16_units"]
    assert records["lecture-bf16-actual-flops-higher-cpu"]["message"] == (
        "about machines where cpu_bf16_matmul in [converted, emulated] (this machine: amx)")
    for twin in ("lecture-bf16-actual-flops-higher-cpu-amx", "lecture-lower-precision-less-compute-cpu-amx"):
        assert records[twin]["outcome"] != "skipped", records[twin]


def test_the_kinds_script_refuses_an_unknown_kind_and_runs_only_those_named(tmp_path):
    """.ci/run leaves the native kind out (RESACCT_KINDS); a misspelled kind must not silently run nothing."""
    script = Path(__file__).resolve().parents[1] / "tools" / "machine_kinds.sh"
    bad = subprocess.run(["bash", str(script), "/bin/false", str(tmp_path / "a")], capture_output=True, text=True,
                         env={**os.environ, "RESACCT_KINDS": "native avx2"}, timeout=60)
    assert bad.returncode == 2 and "RESACCT_KINDS names 'avx2'; expected some of: native avx2-cap one-thread loaded" in bad.stderr
    none = subprocess.run(["bash", str(script), "/bin/false", str(tmp_path / "b")], capture_output=True, text=True,
                          env={**os.environ, "RESACCT_KINDS": " "}, timeout=60)
    assert none.returncode == 0, none.stderr
    assert [line for line in none.stdout.splitlines() if line.startswith("==")] == [
        f"== {kind}: not run (RESACCT_KINDS)" for kind in ("native", "avx2-cap", "one-thread")]
