"""`resacct verify`'s two shared gloo launches (issue 34), as its plan makes them: wall and the ranks' CPU seconds.

    python benchmarks/shared_launches.py [--rounds 3]
    git archive b628a3e | tar -x -C /tmp/old && python benchmarks/shared_launches.py --baseline /tmp/old --rounds 3

The launches the fixed-input claims of the sharding, peak_sharded and parallelism areas plan (one per
world size: resacct.measurement.rank_jobs), each program of a world size after the other in one
launch as verify's shared launch runs them (without the children verify starts beside them). Printed
per launch: its wall seconds, the CPU seconds of all its ranks (getrusage in each, from the first
program to the last) and rank 0's seconds per program; with ``--baseline`` (a tree of resacct, e.g. a
`git archive` of an older commit) the two trees take turns round by round, each in a fresh process,
and the medians are compared. On a shared machine say how busy it was: the ratio is the figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any


def timed_programs(rank: int, world_size: int, jobs: tuple[tuple[Any, tuple[Any, ...]], ...]) -> dict[str, Any]:
    """What each rank runs: every program in turn, as rank_jobs.run_rank_jobs; its seconds per program and its CPU."""
    import gc
    import resource

    before, seconds = resource.getrusage(resource.RUSAGE_SELF), []
    for program, args in jobs:
        started = time.perf_counter()
        program(rank, world_size, *args)
        seconds.append((program.__qualname__, round(time.perf_counter() - started, 2)))
        gc.collect()
    after = resource.getrusage(resource.RUSAGE_SELF)
    return {"seconds": seconds, "cpu": after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime}


def one_round() -> dict[str, dict[str, Any]]:
    """This process's tree: the planned launches, each world size once."""
    from pathlib import Path

    import yaml

    import resacct
    import shared_launches as me  # by its module name: the ranks unpickle timed_programs from it
    from resacct.harness.registry import all_checks
    from resacct.measurement import distributed, rank_jobs

    all_checks()  # every check module, with its planners
    claims = []
    for area in ("parallelism", "peak_sharded", "sharding"):
        for claim in yaml.safe_load((Path(resacct.__file__).parent / "specs" / f"{area}.claims.yaml").read_text())["claims"]:
            if claim.get("given") and not claim.get("forall"):
                claims.append((claim["measure"], dict(claim["given"])))
    rank_jobs.plan_claims(claims)
    planned = [launch for launch in rank_jobs.planned_rank_jobs() if not launch[3]]
    distributed.preload_in_ranks("shared_launches")
    distributed.run_on_ranks(distributed.all_reduce_rank_sum, 2)  # the forkserver's start, not counted
    measured = {}
    for size in sorted({launch[0] for launch in planned}):
        jobs = tuple((program, args) for world_size, program, args, _ in planned if world_size == size)
        started = time.time()
        ranks = distributed.run_on_ranks(me.timed_programs, size, jobs, timeout_seconds=600)
        measured[f"{size} ranks"] = {"wall": time.time() - started, "cpu": sum(rank["cpu"] for rank in ranks), "rank 0": ranks[0]["seconds"]}
    return measured


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1, help="rounds (each tree once a round, taking turns)")
    parser.add_argument("--baseline", metavar="TREE", help="a resacct tree to run beside this one (PYTHONPATH=TREE)")
    parser.add_argument("--one-round", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.one_round:
        print(json.dumps(one_round()))
        return 0
    if options.rounds < 1:
        parser.error(f"--rounds {options.rounds}: expected 1 or more")
    if options.baseline and not os.path.isdir(os.path.join(options.baseline, "resacct")):
        parser.error(f"--baseline {options.baseline!r}: expected a folder holding resacct/ (e.g. a git archive of a commit)")
    trees = {"baseline": options.baseline, "this tree": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    trees = {name: tree for name, tree in trees.items() if tree}
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    for _ in range(options.rounds):
        for name, tree in trees.items():
            environment = {**os.environ, "PYTHONPATH": tree}
            done = subprocess.run([sys.executable, os.path.abspath(__file__), "--one-round"], env=environment, cwd=tree, capture_output=True, text=True,
                                  check=True)  # in the tree: the ranks' forkserver imports from there too
            runs[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
            for launch, figures in runs[name][-1].items():
                print(f"{name:10s} {launch}: {figures['wall']:.2f} s wall, {figures['cpu']:.2f} CPU s in the ranks; rank 0: "
                      + ", ".join(f"{program} {seconds}" for program, seconds in figures["rank 0"]), flush=True)
    medians = {name: {launch: {what: statistics.median(run[launch][what] for run in rounds) for what in ("wall", "cpu")} for launch in rounds[0]}
               for name, rounds in runs.items()}
    for launch in medians["this tree"]:
        line = ", ".join(f"{name} {median[launch]['wall']:.2f} s wall / {median[launch]['cpu']:.2f} CPU s" for name, median in medians.items())
        if options.baseline:
            line += (f" (ratio {medians['this tree'][launch]['wall'] / medians['baseline'][launch]['wall']:.2f} wall, "
                     f"{medians['this tree'][launch]['cpu'] / medians['baseline'][launch]['cpu']:.2f} CPU)")
        print(f"{launch}, medians of {options.rounds}: {line}")
    print(f"load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
