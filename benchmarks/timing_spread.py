"""The spread of every timing claim on this machine, beside its margin to its bounds.

    python benchmarks/timing_spread.py                 # every CPU timing claim, 5 runs each
    python benchmarks/timing_spread.py --runs 9 -k roofline
    python benchmarks/timing_spread.py --json spread.json

A timing claim (its check registered with ``timing=True``) is decided in rounds by
``resacct.harness.timing``; its bound must sit far enough from what an idle machine measures that
noise cannot flip it: the standard is **margin ≥ 3 × spread on a log scale**, (1 + margin) ≥
(1 + spread)³ (spread = max ÷ min − 1 of the runs; margin = the factor between the median and the
nearest ``at_least``/``at_most`` bound, − 1; ``ratio`` = ln(1 + margin) ÷ ln(1 + spread)). Each run here is one call of the claim's check with its caches cleared, as a round is.
The table prints both and flags a claim whose margin is under 3 × its spread; run it on an idle
machine and quote its figures in the spec's comment. Claims with a non-numeric statement (a
roofline's "memory"/"compute") print their values only.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from resacct.harness.evaluate import measure_claim  # noqa: E402
from resacct.harness.loader import load_claims_file  # noqa: E402
from resacct.harness.registry import NotMeasurable, get_check  # noqa: E402
from resacct.harness.timing import relative_margin, spread  # noqa: E402
from resacct.measurement.machine_profile import this_machine, unmet_conditions  # noqa: E402

SPECS = Path(__file__).resolve().parents[1] / "resacct" / "specs"


def timing_claims(pattern: str | None) -> list:
    chosen = []
    for path in sorted(SPECS.glob("*.claims.yaml")):
        for loaded in load_claims_file(path).claims:
            claim = loaded.claim
            if not get_check(claim.measure).timing or "gpu" in claim.marks or claim.forall:
                continue
            if pattern and pattern not in claim.id:
                continue
            chosen.append(loaded)
    return chosen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each claim's check (default 5)")
    parser.add_argument("-k", dest="pattern", default=None, help="only claims whose id contains this")
    parser.add_argument("--json", dest="json_path", default=None, help="also write the rows as JSON")
    args = parser.parse_args()
    machine = this_machine()
    print(f"machine: {machine.summary()}")
    print(f"{'claim':<52} {'min':>8} {'median':>8} {'max':>8} {'spread':>7} {'margin':>7} {'ratio':>6}")
    rows = []
    for loaded in timing_claims(args.pattern):
        claim = loaded.claim
        unmet = unmet_conditions(machine, claim.when)
        if unmet:
            print(f"{claim.id:<52} skipped: {'; '.join(unmet)}")
            continue
        check = get_check(claim.measure)
        values = []
        began = time.perf_counter()
        try:
            for _ in range(args.runs):
                check.forget_cached()
                values.append(measure_claim(loaded, dict(claim.given)).outcome.measured)
        except NotMeasurable as reason:
            print(f"{claim.id:<52} not measurable: {reason}")
            continue
        seconds = time.perf_counter() - began
        if not all(isinstance(value, (int, float)) and not isinstance(value, bool) for value in values):
            print(f"{claim.id:<52} values: {', '.join(map(str, values))}")
            rows.append({"id": claim.id, "values": values, "seconds": round(seconds, 2)})
            continue
        middle = statistics.median(values)
        apart = spread(values)
        expect = claim.expect
        margin = relative_margin(middle, at_least=expect.at_least if expect else None, at_most=expect.at_most if expect else None)
        ratio = math.log1p(margin) / math.log1p(apart) if margin is not None and apart else float("inf")
        flag = "  < 3x" if margin is not None and ratio < 3 else ""
        margin_text = f"{margin:7.1%}" if margin is not None else "      —"
        print(f"{claim.id:<52} {min(values):8.3g} {middle:8.3g} {max(values):8.3g} {apart:7.1%} {margin_text} {ratio:6.1f}{flag}")
        rows.append({"id": claim.id, "values": values, "spread": apart, "margin": margin, "seconds": round(seconds, 2)})
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    print(f"load average at the end: {load}")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps({"machine": machine.to_dict(), "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
