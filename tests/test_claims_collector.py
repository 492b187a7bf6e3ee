"""The cyclic collector during a claims run (resacct.harness.collector): what the imports and the
collection left is frozen before the claims run (on workers too), full collections are spaced
:data:`FULL_COLLECTION_THRESHOLD` middle collections apart, and the thresholds come back after."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest

from resacct.harness import registry
from resacct.harness.collector import FULL_COLLECTION_THRESHOLD, claims_collector
from resacct.harness.registry import Check, Outcome


def test_full_collections_are_spaced_inside_the_block_and_restored_after() -> None:
    before = gc.get_threshold()
    with claims_collector():
        assert gc.get_threshold() == (before[0], before[1], max(before[2], FULL_COLLECTION_THRESHOLD))
    assert gc.get_threshold() == before


def test_the_thresholds_come_back_after_an_error() -> None:
    before = gc.get_threshold()
    with pytest.raises(RuntimeError), claims_collector():
        raise RuntimeError("a claim run stopped")
    assert gc.get_threshold() == before


@pytest.mark.slow  # 0.73-0.78 CPU s on 2026-11-29 (tools/slow_audit.py: over the 0.7 s line)
@pytest.mark.parametrize("workers", [1, 2])
def test_a_claim_runs_with_the_imports_frozen_and_full_collections_spaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                          workers: int) -> None:
    from resacct.harness.run import run_claims

    log = tmp_path / "log.jsonl"

    def collector_state(size: int) -> Outcome:
        with log.open("a") as file:
            file.write(json.dumps({"frozen": gc.get_freeze_count(), "threshold": gc.get_threshold()}) + "\n")
        return Outcome(measured=size)

    monkeypatch.setitem(registry._REGISTRY, "collector.state", Check("collector.state", collector_state, (), "", timing=False, evidence="measured"))
    specs = tmp_path / "specs"
    specs.mkdir()
    for area in ("alpha", "beta"):
        lines = [f"area: {area}", 'source: test — "collector"', "claims:"]
        for index in range(3):
            lines += [f"  - id: {area}-{index}", "    says: the collector's state.", "    measure: collector.state",
                      f"    given: {{size: {index}}}", "    expect: {at_least: 0}"]
        (specs / f"{area}.claims.yaml").write_text("\n".join(lines) + "\n")
    gc.unfreeze()  # whatever an earlier test froze goes back to the oldest generation: the run must freeze its own
    assert gc.get_freeze_count() == 0
    before = gc.get_threshold()
    run = run_claims(sorted(specs.glob("*.claims.yaml")), tmp_path / "reports", workers=workers, show_progress=False)
    assert {record["outcome"] for record in run.document["claims"]} == {"holds"}
    states = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(states) == 6
    assert all(state["frozen"] > 0 for state in states)  # the imports and the collected claims: not scanned again
    assert all(state["threshold"][2] >= FULL_COLLECTION_THRESHOLD for state in states)
    assert gc.get_threshold() == before
