"""Seconds of `resacct verify` per area with claims sharing their measurements, and without (issue 34).

    python benchmarks/claim_sharing.py                      # hf, peak, account, finetune; memo on vs RESACCT_MEMO=0
    python benchmarks/claim_sharing.py --area peak --rounds 3 --threads 1  # CPU seconds on a busy machine
    python benchmarks/claim_sharing.py --baseline 3828694   # also the tree of that commit (git archive into a temporary folder)

Each configuration runs `resacct verify --area A` for every area A in a fresh process, the
configurations taking turns round by round (load moves them alike), and prints per area the
median wall seconds (verify's own ``seconds_by_area``) and the child's CPU seconds, the ratio to
the shared run, and the verdict counts — which must be equal in every configuration (exit 1 if
not). ``RESACCT_MEMO=0`` turns :mod:`resacct.measurement.memo` off: every claim measures for
itself, as if no two claims asked the same thing.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AREAS = ("hf", "peak", "account", "finetune")


def run_area(area: str, tree: Path, memo: bool, threads: int | None) -> tuple[float, float, dict[str, str]]:
    """(verify's seconds for the area, the child's CPU seconds, claim id → outcome)."""
    env = {**os.environ, "CI": "true", "RESACCT_MEMO": "1" if memo else "0", "PYTHONPATH": str(tree)}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    with tempfile.TemporaryDirectory() as report_dir:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        completed = subprocess.run([sys.executable, "-m", "resacct", "verify", "--area", area, "--quiet", "--no-roofline", "--no-timeline",
                                    "--report-dir", report_dir], cwd=tree, env=env, capture_output=True, text=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        report_file = Path(report_dir) / "report.json"
        if completed.returncode not in (0, 1) or not report_file.exists():
            raise SystemExit(f"verify --area {area} in {tree} exited {completed.returncode}: {completed.stderr.strip()[-400:]}")
        report = json.loads(report_file.read_text())
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return float(report["run"]["seconds_by_area"][area]), cpu, {claim["id"]: claim["outcome"] for claim in report["claims"]}


def export(revision: str, into: Path) -> Path:
    archive = subprocess.run(["git", "archive", "--format=tar", revision], cwd=ROOT, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--area", action="append", help=f"an area (repeatable; default {', '.join(AREAS)})")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each configuration, taken in turn (the median is printed)")
    parser.add_argument("--threads", type=int, help="OMP_NUM_THREADS for the runs (1: CPU seconds barely move with the load of other jobs)")
    parser.add_argument("--baseline", metavar="REV", help="also run the tree of this git revision (e.g. the commit before the memo)")
    args = parser.parse_args(argv)
    areas = tuple(args.area or AREAS)
    with tempfile.TemporaryDirectory() as folder:
        configurations = [("shared (memo on)", ROOT, True), ("RESACCT_MEMO=0", ROOT, False)]
        if args.baseline:
            configurations.append((f"tree of {args.baseline}", export(args.baseline, Path(folder)), True))
        results: dict[tuple[str, str], list[tuple[float, float, dict[str, str]]]] = {}
        for _ in range(args.rounds):
            for area in areas:
                for name, tree, memo in configurations:
                    run = run_area(area, tree, memo, args.threads)
                    results.setdefault((name, area), []).append(run)
                    print(f"  ran {area} {name}: {run[0]:.2f} s, {run[1]:.2f} CPU s", file=sys.stderr, flush=True)
    same = True
    print(f"{'area':10} {'configuration':22} {'wall s':>8} {'cpu s':>8} {'÷ shared':>9}  verdicts")
    totals: Counter[str] = Counter()
    for area in areas:
        shared_wall = statistics.median(r[0] for r in results[(configurations[0][0], area)])
        reference = results[(configurations[0][0], area)][0][2]
        for name, _, _ in configurations:
            runs = results[(name, area)]
            wall, cpu = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
            totals[name] += wall
            verdicts = Counter(runs[0][2].values())
            agree = all(r[2] == reference for r in runs)
            same &= agree
            print(f"{area:10} {name:22} {wall:8.2f} {cpu:8.2f} {wall / shared_wall:9.2f}  "
                  f"{', '.join(f'{count} {outcome}' for outcome, count in sorted(verdicts.items()))}{'' if agree else '  DIFFERENT VERDICTS'}")
    for name, _, _ in configurations:
        print(f"{'all':10} {name:22} {totals[name]:8.2f}")
    print(f"verdicts equal in every configuration: {'yes' if same else 'NO'}  ({args.rounds} round(s); os.cpu_count()={os.cpu_count()}, "
          f"load average {os.getloadavg()[0]:.1f})")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
