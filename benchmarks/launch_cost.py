"""Where a gloo launch's time goes, and what issue 34 cut from it: the old way beside the new, in one run.

    python benchmarks/launch_cost.py [--rounds 3]

Both ways run in this one process, one after the other, each with a forkserver of its own:

* old — the forkserver preloads torch only (each child imports the rank programs' resacct modules
  itself), children keep what they inherit under the garbage collector (each ``gc.collect`` in a
  child, made before every measured peak step, walks torch's ~290,000 objects), the peak claims'
  prediction child runs before their ranks, and every tensor-parallel claim launches its own ranks;
* new — resacct as it is: the rank modules preloaded (``preload_in_ranks``), ``gc.freeze`` in
  each child, the prediction's child beside the ranks (``started_isolated``), one launch per
  distinct tensor-parallel layer.

Printed per way: the forkserver's start (the first launch, an all-reduce on 2 ranks, less a warm
one); an all-reduce launch on 2 and on 4 ranks (median of ``--rounds``), split into the time until
the program runs in every rank (fork, unpickling, the gloo rendezvous) and the rest (results and
teardown); in a child, the import of the rank modules and one ``gc.collect``; then the launches the
sharded claims make (peak_sharded 2 and 4 ranks, sharding's gloo and paper-scale runs, parallelism's
tensor-parallel ranks), in seconds, and their total. The same machine, the same load: compare the
columns, and say how busy the machine was.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import statistics
import sys
import time

import resacct.measurement.distributed as distributed

#: The forkserver's preloads before issue 34.
OLD_PRELOAD = ["torch", "torch._dynamo", "torch.optim", "torch.nn.parallel", "torch.distributed", "torch.distributed.optim",
               "torch.distributed.fsdp", "resacct.measurement.distributed"]
RANK_MODULES = ["resacct.checks.peak_sharded", "resacct.account.peak.sharded", "resacct.account.peak.models",
                "resacct.checks.sharding_runs", "resacct.checks.parallelism"]
#: The tensor-parallel claims' layers (resacct/specs/parallelism.claims.yaml): seq, batch, hidden, heads, sequence_parallel.
TENSOR_PARALLEL_CLAIMS = [(16, 2, 64, 4, False), (16, 2, 64, 4, False), (12, 3, 32, 4, False), (16, 2, 64, 4, True), (16, 2, 64, 4, True)]


def probe(rank: int, world_size: int, launched_at: float) -> tuple[float, float]:
    """In a rank: (seconds from the launch to this program, seconds from the launch to its end). One
    barrier: a rank that left before its peers finished connecting would fail their rendezvous."""
    import torch.distributed as dist

    started = time.time() - launched_at
    dist.barrier()
    return started, time.time() - launched_at


def child_costs(modules: list[str]) -> tuple[float, float]:
    """In a child: (seconds to import ``modules``, seconds of one gc.collect)."""
    started = time.perf_counter()
    for name in modules:
        importlib.import_module(name)
    imported = time.perf_counter() - started
    started = time.perf_counter()
    gc.collect()
    return imported, time.perf_counter() - started


def _use(way: str, preloads_of_callers: list[str], new_preload: list[str]) -> None:
    from multiprocessing import forkserver

    forkserver._forkserver._stop()  # the next launch starts a forkserver with this way's preloads
    distributed.FREEZE_INHERITED = way == "new"
    distributed._PRELOAD[:] = new_preload if way == "new" else OLD_PRELOAD
    distributed._preloaded_by_callers[:] = preloads_of_callers if way == "new" else []


def _launch_seconds(world_size: int) -> tuple[float, float, float]:
    """(whole launch, until every rank runs the program, after the last rank's program) of one all-reduce-sized launch."""
    launched_at = time.time()
    started = time.perf_counter()
    stamps = distributed.run_on_ranks(probe, world_size, launched_at)
    whole = time.perf_counter() - started
    return whole, max(stamp[0] for stamp in stamps), whole - max(stamp[1] for stamp in stamps)


def _timed(action) -> float:  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def _claims_launches(way: str) -> dict[str, float]:
    """The launches the sharded claims make, the old way or the new (caches cleared first)."""
    from resacct.account.peak.sharded import predict_sharded_step_peaks_in_process
    from resacct.checks import parallelism, peak_sharded, sharding_runs

    seconds: dict[str, float] = {}
    for world_size in (2, 4):
        engines = peak_sharded.LAUNCH_ENGINES[world_size]
        if way == "new":
            peak_sharded._launched.cache_clear()
            seconds[f"peak_sharded {world_size} ranks"] = _timed(lambda: peak_sharded.sharded_peak_measurements(world_size, "mlp", 16, 1, engines))
        else:
            seconds[f"peak_sharded {world_size} ranks"] = _timed(lambda: (
                distributed.run_isolated(predict_sharded_step_peaks_in_process, engines, "mlp", 16, 1, world_size, tuple(range(world_size)),
                                         timeout_seconds=300),
                distributed.run_on_ranks(peak_sharded.measured_on_rank, world_size, engines, "mlp", 16, 1, timeout_seconds=300)))
    for world_size in (2, 4):
        sharding_runs._small_scale_launch.cache_clear()
        seconds[f"sharding gloo {world_size} ranks"] = _timed(lambda: sharding_runs._small_scale_launch(world_size))
    sharding_runs._paper_scale_launch.cache_clear()
    seconds["sharding paper scale (1 child)"] = _timed(lambda: sharding_runs.paper_scale_measurements(1, "fp32-adamw"))
    parallelism._tensor_parallel_saved_bytes_per_rank.cache_clear()
    if way == "new":
        seconds["parallelism tensor-parallel (5 claims)"] = _timed(lambda: [parallelism._tensor_parallel_saved_bytes_per_rank(s, b, h, a, 2, sp)
                                                                           for s, b, h, a, sp in TENSOR_PARALLEL_CLAIMS])
    else:
        seconds["parallelism tensor-parallel (5 claims)"] = _timed(lambda: [distributed.run_on_ranks(
            parallelism.tensor_parallel_saved_bytes_on_rank, 2, s, b, h, a, sp, timeout_seconds=120) for s, b, h, a, sp in TENSOR_PARALLEL_CLAIMS])
    return seconds


def measure(way: str, rounds: int, preloads_of_callers: list[str], new_preload: list[str]) -> dict[str, float]:
    _use(way, preloads_of_callers, new_preload)
    figures: dict[str, float] = {}
    first = _launch_seconds(2)[0]
    warm = {world_size: [_launch_seconds(world_size) for _ in range(rounds)] for world_size in (2, 4)}
    figures["forkserver start (first launch less a warm one)"] = first - statistics.median(run[0] for run in warm[2])
    for world_size, runs in warm.items():
        figures[f"all-reduce launch, {world_size} ranks"] = statistics.median(run[0] for run in runs)
        figures[f"  {world_size} ranks: until every rank runs it"] = statistics.median(run[1] for run in runs)
        figures[f"  {world_size} ranks: results and teardown"] = statistics.median(run[2] for run in runs)
    imported, collected = distributed.run_isolated(child_costs, RANK_MODULES)
    figures["in a child: import the rank modules"] = imported
    figures["in a child: one gc.collect"] = collected
    claims = _claims_launches(way)
    figures.update(claims)
    figures["the sharded claims' launches, total"] = sum(claims.values())
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="launches per warm figure (the median is printed)")
    rounds = parser.parse_args(argv).rounds
    if rounds < 1:
        parser.error(f"--rounds {rounds}: expected 1 or more")
    for name in RANK_MODULES:  # registers their preloads, as verify's import of the checks does
        importlib.import_module(name)
    preloads_of_callers, new_preload = list(distributed._preloaded_by_callers), list(distributed._PRELOAD)
    rows: dict[str, dict[str, float]] = {}
    for way in ("old", "new"):
        for label, value in measure(way, rounds, preloads_of_callers, new_preload).items():
            rows.setdefault(label, {})[way] = value
    _use("new", preloads_of_callers, new_preload)
    print(f"{'seconds':52s} {'old':>7s} {'new':>7s} {'old/new':>8s}")
    for label, ways in rows.items():
        ratio = f"{ways['old'] / ways['new']:8.1f}" if ways["new"] > 0.0005 else f"{'-':>8s}"
        print(f"{label:52s} {ways['old']:7.2f} {ways['new']:7.2f} {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
