"""What decides each claim (issue 26, "claims weaker than they look"): every check declares its
evidence — ``measured`` (PyTorch ran it), ``published`` (a printed figure) or ``arithmetic``
(resacct's own arithmetic) — and the declaration is checked against what the check does: run on
every shipped claim that uses it, under a profiler that notices any call into torch, a check
declared ``published`` or ``arithmetic`` never touches torch, and a sample of ``measured`` checks
do (which also shows that the profiler sees torch when it is there)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from resacct.errors import ResacctError
from resacct.harness.registry import EVIDENCE_KINDS, Check, Outcome, all_checks, check

REPO = Path(__file__).resolve().parents[1]

# Measured checks whose torch work the profiler can see (tensors, FlopCounterMode, optimizers,
# modules; a check that only reads torch.finfo fields would be seen through the patched finfo).
MEASURED_SAMPLE = ("flops.matmul", "tensors.storage_bytes", "dtypes.element_size", "dtypes.bits", "optim.adam_matches_torch",
                   "napkin.flops_per_token_per_parameter", "napkin.training_days", "memory.training_state", "lecture.tensor",
                   "seeding.same_seed_same_draws", "perf.achieved_flops_per_sec", "scale.counted_training_flops")


def undeclared(checks: dict[str, Check]) -> list[str]:
    """The checks of ``resacct.checks`` whose evidence is not one of the kinds."""
    return sorted(name for name, one in checks.items()
                  if one.function.__module__.startswith("resacct.checks") and one.evidence not in EVIDENCE_KINDS)


def test_every_shipped_check_declares_its_evidence():
    checks = all_checks()
    assert len(checks) > 200
    assert undeclared(checks) == [], "add evidence= (measured, published or arithmetic) to these @check(...) decorators"
    declared = {one.evidence for name, one in checks.items() if one.function.__module__.startswith("resacct.checks")}
    assert declared == set(EVIDENCE_KINDS)


def test_the_guard_names_a_check_registered_without_evidence():
    def bare() -> Outcome:
        return Outcome(measured=1)

    bare.__module__ = "resacct.checks.example"
    assert undeclared({"example.bare": Check("example.bare", bare, (), "", False, (), None)}) == ["example.bare"]
    assert undeclared({"example.bare": Check("example.bare", bare, (), "", False, (), "measured")}) == []


def test_an_unknown_kind_or_a_timing_check_that_is_not_measured_is_refused():
    with pytest.raises(ResacctError, match="evidence='guessed'; expected one of measured, published, arithmetic"):
        check("testing.evidence_guessed", evidence="guessed")
    with pytest.raises(ResacctError, match="a timing check measures a time, so its evidence is 'measured'"):
        check("testing.evidence_timed", evidence="arithmetic", timing=True)
    assert "testing.evidence_guessed" not in all_checks() and "testing.evidence_timed" not in all_checks()


def test_timing_checks_are_measured():
    """The shipped ones (tests register their own timing checks in the same process under xdist)."""
    shipped = [one for one in all_checks().values() if one.timing and one.function.__module__.startswith("resacct.checks")]
    assert len(shipped) >= 5 and {one.evidence for one in shipped} == {"measured"}


_WORKER = r'''
import functools, json, os, sys, warnings
warnings.filterwarnings("ignore")
from pathlib import Path
import torch
from resacct.harness.loader import load_claims_file
from resacct.harness.registry import NotMeasurable, all_checks
from resacct.harness.strategies import get_strategy

TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
seen = []

def profiler(frame, event, arg):
    """The first call into torch: a Python frame in torch's files, or a C function of torch's."""
    if event == "call" and frame.f_code.co_filename.startswith(TORCH_DIR):
        seen.append(f"{frame.f_code.co_filename[len(TORCH_DIR):]}:{frame.f_code.co_name}")
    elif event == "c_call":
        owner = getattr(arg, "__self__", None)
        if (getattr(arg, "__module__", None) or "").startswith("torch") or isinstance(owner, torch.Tensor) \
                or (getattr(type(owner), "__module__", None) or "").startswith("torch"):
            seen.append(getattr(arg, "__qualname__", repr(arg)))
    if seen:
        sys.setprofile(None)

finfo, iinfo = torch.finfo, torch.iinfo
def seen_finfo(*args, **kwargs):
    seen.append("torch.finfo")
    return finfo(*args, **kwargs)
def seen_iinfo(*args, **kwargs):
    seen.append("torch.iinfo")
    return iinfo(*args, **kwargs)

def touched(check, inputs):
    """What of torch the check touched on these inputs (None: nothing)."""
    seen.clear()
    torch.finfo, torch.iinfo = seen_finfo, seen_iinfo
    sys.setprofile(profiler)
    try:
        check(**inputs)
    except (NotMeasurable, Exception):  # a check that raises still ran: what it touched before counts
        pass
    finally:
        sys.setprofile(None)
        torch.finfo, torch.iinfo = finfo, iinfo
    return seen[0] if seen else None

def clear_caches():
    for name, module in list(sys.modules.items()):
        if name.startswith("resacct") and module is not None:
            for value in list(vars(module).values()):
                if isinstance(value, functools._lru_cache_wrapper):
                    value.cache_clear()

checks = all_checks()
claims = {}
for path in sorted(Path(sys.argv[1]).glob("*.claims.yaml")):
    for loaded in load_claims_file(path).claims:
        claims.setdefault(loaded.claim.measure, []).append(loaded)

def inputs_of(loaded):
    inputs = dict(loaded.claim.given)
    for key, spec in loaded.claim.forall.items():
        inputs[key] = get_strategy(spec).example()
    return inputs

result = {"not_measured": {}, "sample": {}}
for name, one in sorted(checks.items()):  # a fresh process: nothing torch measured is cached yet
    if one.evidence in ("published", "arithmetic"):
        runs = [loaded for loaded in claims.get(name, []) if "gpu" not in loaded.claim.marks]
        result["not_measured"][name] = [[loaded.id, touched(one, inputs_of(loaded))] for loaded in runs]
for name in json.loads(sys.argv[2]):
    clear_caches()
    loaded = next(loaded for loaded in claims[name] if "gpu" not in loaded.claim.marks)
    result["sample"][name] = [checks[name].evidence, touched(checks[name], inputs_of(loaded))]
print(json.dumps(result))
'''


@pytest.fixture(scope="module")
def torch_touches() -> dict:
    """Run in a fresh process, so that nothing a measured check cached can hide a call into torch."""
    completed = subprocess.run([sys.executable, "-c", _WORKER, str(REPO / "resacct" / "specs"), json.dumps(MEASURED_SAMPLE)],
                               capture_output=True, text=True, cwd=REPO, timeout=600,
                               env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore"})
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # 5.09 s idle on 2026-11-28: its module fixture runs every claim in a fresh process
@pytest.mark.xdist_group("evidence-kind-torch-touches")  # both tests on one worker: the fixture's process runs once a tier
def test_checks_declared_published_or_arithmetic_never_touch_torch(torch_touches):
    not_measured = torch_touches["not_measured"]
    declared = {name for name, one in all_checks().items() if one.evidence in ("published", "arithmetic")}
    assert set(not_measured) == declared and len(declared) >= 30
    unexercised = sorted(name for name, runs in not_measured.items() if not runs)
    assert unexercised == [], "a published or arithmetic check that no shipped claim uses is not shown to be one"
    touching = {name: [run for run in runs if run[1]] for name, runs in not_measured.items() if any(run[1] for run in runs)}
    assert touching == {}, "these checks call into torch: their evidence is 'measured' (claim, first torch call)"


@pytest.mark.slow  # the same fresh-process fixture as the test above
@pytest.mark.xdist_group("evidence-kind-torch-touches")
def test_a_sample_of_measured_checks_do_touch_torch(torch_touches):
    sample = torch_touches["sample"]
    assert set(sample) == set(MEASURED_SAMPLE)
    assert {evidence for evidence, _ in sample.values()} == {"measured"}
    assert [name for name, (_, touched) in sample.items() if not touched] == []


# Issue 36's sample of weak claims: a constant against a constant carries the kind it is, and says so.
ISSUE_36_SAMPLE = {
    "tpu-v4-peak-275-tflops": ("published", "prints"),
    "deepseek-v3-fp8-doubles-the-bf16-peak-on-hopper": ("arithmetic", "datasheet"),
    "mfu-bf16-worked-0.276": ("arithmetic", "arithmetic on two printed figures"),
    "napkin-70b-15t-below-us-executive-order": ("measured", "FlopCounterMode"),
    "matrix-vector-memory-bound-h100": ("measured", "FLOPs and bytes from torch"),
    "lecture-lower-precision-less-compute-cpu-amx": ("measured", "gets more done per second"),
}


def test_the_weak_claims_of_issue_36_carry_their_kind_and_say_what_is_checked():
    from resacct.harness.loader import load_claims_file

    found = {}
    for path in sorted((REPO / "resacct" / "specs").glob("*.claims.yaml")):
        for loaded in load_claims_file(path).claims:
            if loaded.id in ISSUE_36_SAMPLE:
                found[loaded.id] = (all_checks()[loaded.claim.measure].evidence, loaded.claim.says)
    assert set(found) == set(ISSUE_36_SAMPLE)
    for claim_id, (kind, words) in ISSUE_36_SAMPLE.items():
        evidence, says = found[claim_id]
        assert evidence == kind and words in says, (claim_id, evidence, says)
