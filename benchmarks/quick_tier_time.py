"""Wall and CPU seconds of the quick tier — the README's test command — this tree beside an older one (issue 34: ≤ 60 s).

    .venv/bin/python benchmarks/quick_tier_time.py --baseline HEAD~1 --rounds 2
    .venv/bin/python benchmarks/quick_tier_time.py --baseline HEAD~1 --rounds 4 -- -k lecture-tensor-literal-is-float32   # start-up alone

Runs ``python -m pytest -n auto --dist loadgroup -q -p no:cacheprovider`` as the README's reader does (``CI``
unset: the plain quick tier, the type-checking hook off), each tree on its own ``PYTHONPATH`` (an older commit
is ``git archive``d into a temporary folder). Each tree first starts its workers once, untimed, selecting no item
(``-k`` of a name no item has: xdist's ``--collect-only`` starts no worker), which fills what a run keeps for the
next (tests/run_bytecode.py's ``.bytecode/``), so every timed round
finds the caches of a working checkout; then the trees take turns, round by round (the machine's speed drifts
over minutes: a pair measured in one turn is the fair comparison). Prints each run's wall seconds, the CPU
seconds of pytest and its workers, and pytest's own summary line; then the medians' ratio and the bar.
Compare commits with ``--commit HEAD`` beside ``--baseline``: the working tree carries what a fresh copy has not
(its own ``.hypothesis/`` examples, reports): beside the same baseline it ran slower than it (1.05 ×), where a copy of its
commit ran faster (0.93 ×; docs/suite_time.md, session 32).
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from verify_time import ROOT, refuse_unknown_commits, tree_of  # noqa: E402

BAR_SECONDS = 60.0
README_TEST_OPTIONS = ["-n", "auto", "--dist", "loadgroup", "-q", "-p", "no:cacheprovider"]
NO_ITEM = "resacct_quick_tier_time_selects_no_item"
_SUMMARY = re.compile(r"^=*\s*(\d+ (passed|failed|skipped|error).*) in [\d.]+s")


def pytest_summary(output: str) -> str:
    """pytest's last summary line (``4880 passed, 67 skipped``), without its time; "(no summary)" where none."""
    for line in reversed(output.splitlines()):
        if found := _SUMMARY.match(line.strip()):
            return found.group(1)
    return "(no summary)"


def run_quick_tier(tree: Path, extra: list[str]) -> dict[str, object]:
    """One run of the README's test command in ``tree``: wall and CPU seconds (pytest and every child it waited for)."""
    environment = {key: value for key, value in os.environ.items() if key != "CI"}
    environment["PYTHONPATH"] = str(tree)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    completed = subprocess.run([sys.executable, "-m", "pytest", *README_TEST_OPTIONS, *extra], cwd=tree, env=environment,
                               capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall": wall, "cpu": cpu, "exit": completed.returncode, "summary": pytest_summary(completed.stdout)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", metavar="COMMIT", help="also run that commit's tree (git archive), taking turns")
    parser.add_argument("--commit", metavar="COMMIT", help="run that commit's tree as 'this tree' instead of the working tree")
    parser.add_argument("--rounds", type=int, default=2, help="timed runs of each tree (default 2)")
    parser.add_argument("pytest_args", nargs="*", metavar="-- PYTEST_ARGS",
                        help="more pytest options for every timed run, after --: e.g. -- -k ONE_CLAIM times the workers' start and collection alone")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be 1 or more (timed runs of each tree), got {args.rounds}")
    refuse_unknown_commits(parser, baseline=args.baseline, commit=args.commit)
    print(f"load average before: {' '.join(f'{value:.1f}' for value in os.getloadavg())}  ({os.cpu_count()} CPUs)", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        trees = {"this tree": tree_of(args.commit, Path(folder) / "this") if args.commit else ROOT}
        if args.baseline:
            trees = {args.baseline: tree_of(args.baseline, Path(folder) / "baseline"), **trees}
        for name, tree in trees.items():
            warm = run_quick_tier(tree, ["-k", NO_ITEM])
            print(f"{name:>12}  (workers started once, no item run, untimed: {warm['wall']:.1f} s)", flush=True)
        runs: dict[str, list[dict[str, object]]] = {name: [] for name in trees}
        for round_number in range(1, args.rounds + 1):
            for name, tree in trees.items():
                run = run_quick_tier(tree, args.pytest_args)
                runs[name].append(run)
                print(f"{name:>12}  round {round_number}: {run['wall']:6.1f} s wall {run['cpu']:6.1f} CPU s  "
                      f"{run['summary']} (exit {run['exit']})", flush=True)
    print(f"load average after:  {' '.join(f'{value:.1f}' for value in os.getloadavg())}")
    medians = {name: statistics.median(float(run["wall"]) for run in done) for name, done in runs.items()}  # type: ignore[arg-type]
    if args.baseline:
        cpu = {name: statistics.median(float(run["cpu"]) for run in done) for name, done in runs.items()}  # type: ignore[arg-type]
        print(f"this tree / {args.baseline}: wall {medians['this tree'] / medians[args.baseline]:.2f}, "
              f"CPU {cpu['this tree'] / cpu[args.baseline]:.2f} (medians of {args.rounds})")
    if args.pytest_args:
        print(f"a part of the quick tier ({' '.join(args.pytest_args)}): the {BAR_SECONDS:.0f} s bar is the whole tier's")
    else:
        met = "met" if medians["this tree"] <= BAR_SECONDS else "not met"
        print(f"bar {BAR_SECONDS:.0f} s wall (idle, 2 cores): {met} here (median {medians['this tree']:.1f} s)")
    return 0 if all(run["exit"] == 0 for done in runs.values() for run in done) else 1  # a failing run is no suite's time


if __name__ == "__main__":
    sys.exit(main())
