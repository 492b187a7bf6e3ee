"""How small a break each shipped claim catches: the numbers docs/mutation.md quotes.

For every claim of the named areas (default: all) that this machine can measure in one process
(not gpu, not distributed; slow ones only with --slow), measure it once (its ``given`` and one
derandomised draw of its ``forall``), judge it, then judge the meta-test's breaks against the same
measurement (tests/harness/meta_mutations.py): the smallest break just outside its tolerance or
band must fail, just inside must pass (reversed for refuted claims), and a refuted claim given its
statement's own value must fail. Prints the catch sizes (the smallest break relative to the
value) by bucket, the claims whose smallest break is over 50 %, and every break judged wrongly.

    .venv/bin/python tools/mutation/tolerance_coverage.py [--slow] [--json OUT] [AREA ...]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import warnings
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

BUCKETS = [(0.0, "exact (0)"), (1e-9, "≤ 1e-9"), (1e-6, "≤ 1e-6"), (1e-3, "≤ 0.1 %"), (1e-2, "≤ 1 %"), (1e-1, "≤ 10 %"),
           (0.5, "≤ 50 %"), (math.inf, "> 50 %")]


def bucket(size: float) -> str:
    return next(name for limit, name in BUCKETS if size <= limit)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("areas", nargs="*")
    parser.add_argument("--slow", action="store_true", help="measure slow-marked claims too")
    parser.add_argument("--json", type=Path, help="write every claim's result here")
    arguments = parser.parse_args(argv)

    from resacct.harness.evaluate import ClaimFailure, evaluate_claim, measure_claim
    from resacct.harness.registry import NotMeasurable, all_checks
    from resacct.measurement.machine_profile import this_machine, unmet_conditions
    from tests.harness.meta_mutations import catch_size, smallest_breaks, truth_broken
    from tests.harness.test_real_claims_can_fail import all_claims, first_example, measurable_here

    all_checks()
    began = time.perf_counter()
    counts: Counter[str] = Counter()
    sizes: Counter[str] = Counter()
    absolute: Counter[str] = Counter()
    wide: list[tuple[str, float]] = []
    wrong: list[str] = []
    records = []
    for claim in all_claims():
        if arguments.areas and claim.area not in arguments.areas:
            continue
        if not measurable_here(claim) or ("slow" in claim.claim.marks and not arguments.slow):
            counts["not measured here (gpu, distributed or slow)"] += 1
            continue
        if claim.claim.when and unmet_conditions(this_machine(), claim.claim.when):
            counts["about another kind of machine"] += 1
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                measurement = measure_claim(claim, first_example(claim))
                verdict = evaluate_claim(claim, measurement.inputs, measurement=measurement)
        except NotMeasurable:
            counts["not measurable here"] += 1
            continue
        except ClaimFailure:
            counts["the claim itself fails here"] += 1
            continue
        except Exception as error:  # a check that raises: its own item reports it
            counts[f"check raised {type(error).__name__}"] += 1
            print(f"  {claim.id}: check raised {type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"[:300])
            continue
        counts["measured"] += 1
        breaks = smallest_breaks(claim, verdict, measurement)
        broken = truth_broken(claim, verdict, measurement)
        judged = breaks + ([broken] if broken is not None else [])
        if broken is not None:
            counts["refuted: truth broken"] += 1
        elif claim.claim.status == "refuted":
            counts["refuted: truth not breakable (raises)"] += 1
        for one in judged:
            try:
                evaluate_claim(claim, {}, measurement=one.measurement)
                failed = False
            except ClaimFailure:
                failed = True
            counts["breaks judged"] += 1
            if failed != one.must_fail:
                wrong.append(f"{claim.id}: {one.what} {'failed' if failed else 'passed'}")
        caught = catch_size(claim, verdict)
        if caught is None:
            counts["no numeric statement (text, bool, raises)"] += 1
        elif not caught[1]:
            absolute[bucket(caught[0])] += 1
        else:
            sizes[bucket(caught[0])] += 1
            if caught[0] > 0.5:
                wide.append((claim.id, caught[0]))
        records.append({"id": claim.id, "status": claim.claim.status, "catch_size": caught, "breaks": len(judged)})
    print(f"{counts['measured']} claims measured in {time.perf_counter() - began:.0f} s; {counts['breaks judged']} breaks judged, "
          f"{len(wrong)} wrongly")
    for name, value in sorted(counts.items()):
        print(f"  {name}: {value}")
    print("smallest break caught, relative to the value:")
    for _, name in BUCKETS:
        print(f"  {name}: {sizes[name]}")
    print("around a reference of 0, the smallest break caught (absolute):")
    for _, name in BUCKETS:
        if absolute[name]:
            print(f"  {name}: {absolute[name]}")
    for claim_id, size in sorted(wide, key=lambda item: -item[1]):
        print(f"  wide: {claim_id} {size:.3g}")
    for line in wrong:
        print(f"  WRONG: {line}")
    if arguments.json:
        arguments.json.write_text(json.dumps(records, indent=1), encoding="utf-8")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
