"""Seconds Python's cyclic collector takes in one ``resacct verify``: Python's defaults beside the
claims run's tuning (issue 34; resacct/harness/collector.py: the imports frozen after collection
and before the workers fork, full collections 100 middle collections apart).

    python benchmarks/collector_time.py [--rounds 2] [--workers 1] [--area hf ...]

Each run is ``resacct verify`` in a fresh process (CI=true, report in a temporary folder) with a
``gc.callbacks`` hook that sums, per generation, the collections and their wall seconds, written
when the process exits. ``default`` runs it with the tuning switched off (nothing frozen, Python's
thresholds), ``tuned`` as shipped; the two take turns round by round. With ``--workers 1`` (the
default here) every claim runs in that one process, so its collections are all counted; with more
workers only the parent's are. Printed per run: the collections and seconds of each generation,
their total, and the verify process's CPU seconds; then the medians of both.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Run in the child: the hook, the tuning switched off for "default", then resacct verify as the console script runs it.
_CHILD = r"""
import atexit, gc, json, sys, time
mode, out = sys.argv[1], sys.argv[2]
per_generation = {}
began = [0.0]
def hook(phase, info):
    if phase == "start":
        began[0] = time.perf_counter()
    else:
        count, seconds = per_generation.get(info["generation"], (0, 0.0))
        per_generation[info["generation"]] = (count + 1, seconds + time.perf_counter() - began[0])
gc.callbacks.append(hook)
def write():
    with open(out, "w") as file:
        json.dump({"generations": per_generation, "cpu_seconds": time.process_time()}, file)
atexit.register(write)
if mode == "default":
    import resacct.harness.collector as collector
    collector.freeze_alive = lambda: None
    collector.FULL_COLLECTION_THRESHOLD = 0
    import resacct.harness.workers
    resacct.harness.workers.freeze_alive = collector.freeze_alive
sys.argv = ["resacct", *sys.argv[3:]]
from resacct.cli import main
status = main()
write()
sys.exit(status)
"""


def _run(mode: str, verify_args: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "gc.json"
        command = [sys.executable, "-c", _CHILD, mode, str(out), "verify", "--quiet", "--report-dir", str(Path(folder) / "reports"), *verify_args]
        subprocess.run(command, cwd=REPO, env={**os.environ, "CI": "true"}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        if not out.exists():
            raise SystemExit(f"{mode}: the verify child wrote no figures (run `resacct verify` alone to see why)")
        return json.loads(out.read_text())


def _line(mode: str, figures: dict) -> str:
    generations = {int(generation): value for generation, value in figures["generations"].items()}
    parts = [f"gen{generation} {count} × = {seconds:.2f} s" for generation, (count, seconds) in sorted(generations.items())]
    total = sum(seconds for _, seconds in generations.values())
    return f"{mode:8s} {', '.join(parts)}; collector {total:.2f} s of {figures['cpu_seconds']:.1f} CPU s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--area", action="append", default=[])
    args = parser.parse_args()
    if args.rounds < 1 or args.workers < 1:
        parser.error(f"--rounds {args.rounds} / --workers {args.workers}: expected 1 or more")
    verify_args = ["--workers", str(args.workers), *[part for area in args.area for part in ("--area", area)]]
    totals: dict[str, list[float]] = {"default": [], "tuned": []}
    for _ in range(args.rounds):
        for mode in ("default", "tuned"):
            figures = _run(mode, verify_args)
            totals[mode].append(sum(seconds for _, seconds in figures["generations"].values()))
            print(_line(mode, figures), flush=True)
    default, tuned = statistics.median(totals["default"]), statistics.median(totals["tuned"])
    print(f"median seconds in the collector: default {default:.2f}, tuned {tuned:.2f} (ratio {tuned / default:.2f})")


if __name__ == "__main__":
    main()
