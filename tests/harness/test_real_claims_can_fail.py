"""No claim whose check cannot fail: change a real claim's law or expectation and it must fail.

Three breaks per claim, all judged against one measurement (``tests/harness/meta_mutations.py``):
the gross one (``(law) * 2 + 1``, an expectation turned round) must fail a holding claim; a
refuted claim whose measurement is replaced by its statement's own value (the law's value, the
``equals``, a bound) must fail as "now agrees"; and every tolerance and band meets its smallest
break — the measurement just outside it (0.1 % beyond the tolerance, or past the bound) must fail,
just inside must pass (for a refuted claim the reverse). GPU and multi-process claims are judged
only against the measurement their own item made on this worker (never measured again here).

Cost: a mutated claim is judged against the measurement its claim item already made in this
session (``resacct.harness.evaluate.remembered_measurement``): in the README's ``pytest`` the
claims run first, so the sweep covers every claim at almost no cost. A claim with no remembered
measurement (this file run on its own, or under xdist on another worker) is measured again only
when it is in today's sample — about a quarter of the claims, chosen by a hash of the id and the
UTC date (``RESACCT_META_SEED`` overrides the date) — or in a spec file changed against ``main``;
the others skip, saying so. ``RESACCT_FULL_META=1`` (as ``RESACCT_CI_FULL_META=1 .ci/run`` sets) measures every claim.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import subprocess
import warnings
from functools import cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from resacct.harness.evaluate import ClaimFailure, evaluate_claim, remembered_measurement
from resacct.harness.laws import Law
from resacct.harness.loader import LoadedClaim, load_claims_file
from resacct.harness.plugin import spec_group
from resacct.harness.registry import NotMeasurable
from resacct.harness.strategies import get_strategy
from tests.harness.meta_mutations import smallest_breaks, truth_broken
from tests.harness.test_plugin import outcomes

SPECS = Path(__file__).resolve().parents[2] / "resacct" / "specs"
FULL_SWEEP_VARIABLE = "RESACCT_FULL_META"
SEED_VARIABLE = "RESACCT_META_SEED"
SAMPLE_ONE_IN = 4


def full_sweep() -> bool:
    return os.environ.get(FULL_SWEEP_VARIABLE, "") not in {"", "0"}


def sample_seed() -> str:
    return os.environ.get(SEED_VARIABLE) or datetime.datetime.now(datetime.timezone.utc).date().isoformat()


def in_todays_sample(claim_id: str, seed: str) -> bool:
    """About one claim in SAMPLE_ONE_IN, a different set each seed (a date), the same within it."""
    digest = hashlib.sha256(f"{seed}:{claim_id}".encode()).digest()
    return int.from_bytes(digest[:4], "big") % SAMPLE_ONE_IN == 0


@cache
def changed_spec_files() -> frozenset[str]:
    """Names of spec files that differ from ``main`` (committed on this branch, or not yet
    committed); empty when git or ``main`` is not at hand."""
    root = SPECS.parents[1]
    names: set[str] = set()
    for command in (["git", "diff", "--name-only", "main", "--", "resacct/specs"],
                    ["git", "ls-files", "--others", "--exclude-standard", "--", "resacct/specs"]):
        try:
            done = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            continue
        if done.returncode == 0:
            names |= {Path(line).name for line in done.stdout.splitlines() if line.strip()}
    return frozenset(names)


def all_claims() -> list[LoadedClaim]:
    claims = []
    for path in sorted(SPECS.glob("*.claims.yaml")):
        loaded = load_claims_file(path, display_path=f"resacct/specs/{path.name}")  # as the plugin shows it: one parse serves both
        claims += loaded.claims
    return claims


def mutated(claim: LoadedClaim) -> LoadedClaim:
    """The same claim with a statement that cannot agree with the same measurement."""
    spec = claim.claim
    update: dict = {}
    if spec.law is not None:
        text = f"({spec.law}) * 2 + 1" if not spec.law.strip().startswith("[") else f"{spec.law[:-1]}, 1]"
        update["law"] = text
    elif spec.expect is not None and spec.expect.approx is not None:
        update["expect"] = spec.expect.model_copy(update={"approx": spec.expect.approx * 2 + 1})
    elif spec.expect is not None and spec.expect.equals is not None:
        value = spec.expect.equals
        update["expect"] = spec.expect.model_copy(update={"equals": (not value) if isinstance(value, bool) else f"not {value!r}"})
    elif spec.expect is not None and (spec.expect.at_least is not None or spec.expect.at_most is not None):
        update["expect"] = spec.expect.model_copy(
            update={"at_least": None if spec.expect.at_most is not None else -1e300, "at_most": -1e300 if spec.expect.at_least is not None else 1e300}
            if spec.expect.at_least is not None
            else {"at_least": 1e300, "at_most": None}
        )
    elif spec.expect is not None and spec.expect.raises is not None:
        update["expect"] = spec.expect.model_copy(update={"raises": spec.expect.raises.model_copy(update={"type": "KeyboardInterrupt"})})
    new_spec = spec.model_copy(update=update)
    law = Law.parse(new_spec.law) if new_spec.law is not None else None
    return LoadedClaim(claim=new_spec, path=claim.path, line=claim.line, area=claim.area, source=claim.source, law=law)


def skip_unless_for_this_torch(claim: LoadedClaim) -> None:
    """Skip, as the plugin does, a claim whose ``requires_torch`` (``requires_transformers``) excludes the installed version."""
    if claim.claim.requires_torch:
        import torch
        from packaging.specifiers import SpecifierSet
        from packaging.version import Version

        if Version(torch.__version__.split("+")[0]) not in SpecifierSet(claim.claim.requires_torch):
            pytest.skip(f"claim is about torch {claim.claim.requires_torch}")
    if claim.claim.requires_transformers:
        import importlib.metadata

        from packaging.specifiers import SpecifierSet
        from packaging.version import Version

        try:
            installed = importlib.metadata.version("transformers")
        except importlib.metadata.PackageNotFoundError:
            pytest.skip(f"claim is about transformers {claim.claim.requires_transformers}; none is installed")
        if Version(installed) not in SpecifierSet(claim.claim.requires_transformers):
            pytest.skip(f"claim is about transformers {claim.claim.requires_transformers}")


def skip_unless_for_this_machine(claim: LoadedClaim) -> None:
    """Skip, as the plugin does, a claim whose ``when:`` is about another kind of machine."""
    if claim.claim.when:
        from resacct.measurement.machine_profile import this_machine, unmet_conditions

        unmet = unmet_conditions(this_machine(), claim.claim.when)
        if unmet:
            pytest.skip(f"about machines where {'; '.join(unmet)}")


def measurable_here(claim: LoadedClaim) -> bool:
    """Not a GPU claim, and not one that spawns ranks (measured afresh, each would start a process
    group): those are judged only against their own item's measurement."""
    return not (set(claim.claim.marks) & {"gpu", "distributed"})


def with_its_claims_tier(claim: LoadedClaim) -> list:
    """A claim's meta-test goes where its claim goes: its spec file's xdist group (the remembered
    measurement lives in that worker) and, for a claim marked slow, the slow tier."""
    marks = [pytest.mark.xdist_group(spec_group(claim))]
    return marks + ([pytest.mark.slow] if "slow" in claim.claim.marks else [])


CLAIMS = all_claims()


def first_example(claim: LoadedClaim) -> dict:
    """The claim's ``given`` inputs, with one (derandomised) draw of its ``forall`` inputs."""
    inputs = dict(claim.claim.given)
    if claim.claim.forall:
        strategies = {name: get_strategy(spec) for name, spec in claim.claim.forall.items()}

        found: list[dict] = []

        @settings(max_examples=1, database=None, suppress_health_check=list(HealthCheck), derandomize=True)
        @given(st.fixed_dictionaries(strategies))
        def draw(example):
            found.append(example)

        draw()
        inputs.update(found[0])
    return inputs


@pytest.mark.parametrize("claim", [pytest.param(claim, id=claim.id, marks=with_its_claims_tier(claim)) for claim in CLAIMS])
def test_every_claim_fails_when_its_statement_is_changed(claim):
    """Holding claims must fail with a wrong statement; refuted ones are already false, so their
    mutation must stay false (and the original must pass) — either way the check decides."""
    skip_unless_for_this_torch(claim)
    skip_unless_for_this_machine(claim)
    measurement = remembered_measurement(claim)  # the claim's own item measured it earlier in this session
    if measurement is None and not measurable_here(claim):
        pytest.skip(f"{'a GPU' if 'gpu' in claim.claim.marks else 'a multi-process'} claim is judged only against its own item's "
                    "measurement on this worker, and there is none")
    if measurement is None and not (full_sweep() or in_todays_sample(claim.id, sample_seed())
                                    or Path(claim.path).name in changed_spec_files()):
        pytest.skip(f"not measured in this session and not in the sample of {sample_seed()}; {FULL_SWEEP_VARIABLE}=1 checks every claim")
    try:
        if measurement is None:
            from resacct.harness.evaluate import measure_claim

            measurement = measure_claim(claim, first_example(claim))
    except NotMeasurable as reason:
        pytest.skip(f"not measurable here: {reason}")
    try:
        verdict = evaluate_claim(claim, measurement.inputs, measurement=measurement)  # as its own item judged it
    except ClaimFailure as failure:
        pytest.skip(f"the claim itself fails here (its own item reports it as failed, or a timing claim as inconclusive): {failure.headline}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if claim.claim.status == "holds":
            with pytest.raises(ClaimFailure):
                evaluate_claim(mutated(claim), measurement.inputs, measurement=measurement)
        broken = truth_broken(claim, verdict, measurement)
        if broken is not None:
            with pytest.raises(ClaimFailure, match="is marked refuted, but the measurement now agrees"):
                evaluate_claim(claim, {}, measurement=broken.measurement)
        for one in smallest_breaks(claim, verdict, measurement):
            _judge_break(claim, one)


def _judge_break(claim: LoadedClaim, one) -> None:  # type: ignore[no-untyped-def]
    measured = one.measurement.outcome.measured
    try:
        evaluate_claim(claim, {}, measurement=one.measurement)
    except ClaimFailure:
        if not one.must_fail:
            pytest.fail(f"claim {claim.id!r} fails at {one.what} (measured {measured!r}): its tolerance or band is narrower than it says")
        return
    if one.must_fail:
        pytest.fail(f"claim {claim.id!r} does not catch its smallest break, {one.what} (measured {measured!r})")


def test_the_sample_rotates_and_covers_about_a_quarter():
    ids = [claim.id for claim in CLAIMS]
    monday = {claim_id for claim_id in ids if in_todays_sample(claim_id, "2026-11-23")}
    tuesday = {claim_id for claim_id in ids if in_todays_sample(claim_id, "2026-11-24")}
    assert monday != tuesday
    assert monday == {claim_id for claim_id in ids if in_todays_sample(claim_id, "2026-11-23")}
    assert len(ids) / (2 * SAMPLE_ONE_IN) < len(monday) < 2 * len(ids) / SAMPLE_ONE_IN


def test_there_are_enough_claims_to_mean_something():
    claims = all_claims()
    assert len(claims) >= 40
    assert sum(1 for claim in claims if claim.claim.forall) >= 10
    assert any(claim.claim.status == "refuted" for claim in claims)


@pytest.mark.parametrize(
    ("claim_id", "wrong_law"),
    [
        ("bytes-numel-times-element-size", "numel * element_size + 1"),
        ("strides-2d-row-major", "[d0, 1]"),
        ("zeros-4x8-float32-is-128-bytes", "4 * 8 * 2"),
    ],
)
@pytest.mark.slow
def test_a_deliberately_wrong_law_makes_a_real_item_fail(pytester, claim_id, wrong_law):
    """Through pytest: copy a real claim, break its law, watch the item fail."""
    import yaml

    for path in sorted(SPECS.glob("*.claims.yaml")):
        document = yaml.safe_load(path.read_text())
        for entry in document["claims"]:
            if entry["id"] == claim_id:
                entry["law"] = wrong_law
                document["claims"] = [entry]
                target = pytester.path / "specs" / path.name
                target.parent.mkdir(exist_ok=True)
                target.write_text(yaml.safe_dump(document, sort_keys=False, allow_unicode=True))
                result = pytester.runpytest("-q")
                assert outcomes(result) == {"failed": 1}
                result.stdout.fnmatch_lines([f"*claim '{claim_id}' does not hold*"])
                return
    pytest.fail(f"no claim {claim_id!r} in specs/")


def test_every_shipped_law_leaves_room_for_its_mutation():
    """The meta-test breaks a law as ``(law) * 2 + 1`` (10 characters more): a shipped law within 10
    characters of the length limit could not be broken, and its meta-test would fail on the limit
    instead of on the measurement (it did, at 501 of 500, for a LoRA claim)."""
    from resacct.harness.laws import MAX_LAW_CHARS

    room = len("() * 2 + 1")
    too_long = [(loaded.claim.id, len(loaded.claim.law)) for path in sorted(SPECS.glob("*.claims.yaml"))
                for loaded in load_claims_file(path).claims if loaded.claim.law and len(loaded.claim.law) + room > MAX_LAW_CHARS]
    assert not too_long, f"laws too long to mutate (limit {MAX_LAW_CHARS} characters): {too_long}"


def test_the_meta_test_takes_every_claim_refuted_gpu_and_multi_process_ones_too():
    """Issue 36: 193 claims (refuted, gpu, distributed) were never mutated."""
    ids = {claim.id for claim in CLAIMS}
    assert ids == {claim.id for claim in all_claims()}
    for kind in ("gpu", "distributed"):
        assert any(kind in claim.claim.marks for claim in CLAIMS), kind
    assert sum(claim.claim.status == "refuted" for claim in CLAIMS) >= 100


def test_a_refuted_claim_that_could_never_hold_is_caught(monkeypatch):
    """Through the real meta-test function: a refuted claim judged sound passes it; were its
    statement never able to hold (here: a harness that finds every statement false), the broken
    truth — the measurement set to the law's value — would still pass, and the meta-test fails."""
    from resacct.harness import evaluate
    from resacct.harness.evaluate import Measurement, forget_measurements, remember_measurement
    from resacct.harness.registry import Outcome
    from tests.harness.test_meta_mutations import _claim

    claim = _claim(given={"value": 7}, law="value * 2", status="refuted")
    forget_measurements()
    try:
        remember_measurement(claim, Measurement(inputs={"value": 7}, outcome=Outcome(measured=7)))
        test_every_claim_fails_when_its_statement_is_changed(claim)
        monkeypatch.setattr(evaluate, "_statement_holds", lambda verdict, outcome: False)
        with pytest.raises(pytest.fail.Exception):
            test_every_claim_fails_when_its_statement_is_changed(claim)
    finally:
        forget_measurements()
