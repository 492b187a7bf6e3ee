"""Where each gloo launch of `resacct verify`'s phase alone spends its time (issue 34), one launch of each kind split into parts.

    python benchmarks/launch_profile.py [--rounds 3]

Printed, in seconds, in this one process with the forkserver verify uses (preloads as verify's):
the forkserver's start (first launch); an empty launch on 2 and 4 ranks split into fork + unpickling +
gloo rendezvous (until every rank runs the program) and results + teardown; an empty child; then
each launch the sharded claims make, alone: its ranks' work and the rest; sharding's rank program
split by part (resacct.checks.sharding_training.LAUNCH_PARTS), peak_sharded's by engine (allocator
record, census), each prediction child and the paper-scale child alone; sharding's launch measuring
the parts its claims read against every part (as it did before LAUNCH_PARTS: both model kinds, four
pieces, three steps), taking turns, with the ranks' CPU seconds; and the 2-rank programs in one launch against each in its own
(resacct.measurement.rank_jobs), taking turns, the median of ``--rounds``. Say how busy the machine was: on a shared machine the parts are
the load's as much as resacct's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

TENSOR_PARALLEL_LAYERS = [(16, 2, 64, 4, False), (12, 3, 32, 4, False), (16, 2, 64, 4, True)]  # parallelism.claims.yaml's three


def probe(rank: int, world_size: int, launched_at: float) -> tuple[float, float]:
    """(seconds from the launch to this program, to its end): one barrier, as every launch makes."""
    import torch.distributed as dist

    started = time.time() - launched_at
    dist.barrier()
    return started, time.time() - launched_at


def timed(rank: int, world_size: int, launched_at: float, program: Any, *args: Any) -> tuple[float, float, float]:
    """(seconds from the launch to the program, to its end, this rank's CPU seconds in the program)."""
    import resource

    started, cpu = time.time() - launched_at, resource.getrusage(resource.RUSAGE_SELF)
    program(rank, world_size, *args)
    end = resource.getrusage(resource.RUSAGE_SELF)
    return started, time.time() - launched_at, end.ru_utime + end.ru_stime - cpu.ru_utime - cpu.ru_stime


def timed_child(launched_at: float, program: Any, *args: Any) -> tuple[float, float]:
    started = time.time() - launched_at
    program(*args)
    return started, time.time() - launched_at


def split_program(rank: int, world_size: int, what: str) -> dict[str, float]:
    """Sharding's rank program (what="sharding") or peak_sharded's ("peak") with a time stamp after each part."""
    from resacct.checks import sharding_runs as runs

    stamps, last = {}, time.perf_counter()

    def stamp(name: str) -> None:
        nonlocal last
        stamps[name] = stamps.get(name, 0.0) + time.perf_counter() - last
        last = time.perf_counter()

    if what == "sharding":  # each part the launch measures (LAUNCH_PARTS), its one-process reference with it
        from resacct.checks.sharding_training import _measured_part

        references: dict = {}
        for kind, piece, steps in runs.launch_parts(world_size):
            _measured_part(rank, world_size, kind, piece, steps, references); stamp(f"{kind} {piece} {steps} steps")
        return stamps
    from resacct.account.peak.sharded import build_peak_model, engine_mesh
    from resacct.account.peak.sharded_measure import allocator_summary, first_complete
    from resacct.checks.peak_sharded import LAUNCH_CENSUS, LAUNCH_ENGINES, _census, _state

    model, inputs, loss_fn = build_peak_model("mlp", 16, 1); stamp("build the model")
    for engine in LAUNCH_ENGINES[world_size]:
        allocator_summary(engine, model, inputs, loss_fn, world_size); stamp(f"{engine} allocator record")
        mesh = engine_mesh(engine, world_size)
        if engine in LAUNCH_CENSUS[world_size]:
            first_complete(lambda: _census(engine, model, inputs, loss_fn, world_size, mesh), "census"); stamp(f"{engine} census")
        else:
            _state(engine, model, inputs, loss_fn, world_size, mesh); stamp(f"{engine} state (no census)")
    return stamps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the shared-against-own comparison (the median is printed)")
    rounds = parser.parse_args(argv).rounds
    if rounds < 1:
        parser.error(f"--rounds {rounds}: expected 1 or more")
    import launch_profile as me  # by its module name: the ranks unpickle the programs above from it

    import resacct.measurement.distributed as distributed
    from resacct.account.peak.sharded import predict_sharded_step_peaks_in_process
    from resacct.checks import parallelism, peak_sharded, sharding_runs
    from resacct.measurement.rank_jobs import run_rank_jobs

    distributed.preload_in_ranks("launch_profile")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    first = time.time()
    distributed.run_on_ranks(me.probe, 2, first)
    print(f"forkserver start + first empty launch (2 ranks)      {time.time() - first:6.2f}")
    for size in (2, 4):
        launched = time.time()
        stamps = distributed.run_on_ranks(me.probe, size, launched)
        whole = time.time() - launched
        print(f"empty launch, {size} ranks: {whole:5.2f} = fork+unpickle+rendezvous {max(s[0] for s in stamps):.2f}"
              f" + barrier {max(s[1] for s in stamps) - max(s[0] for s in stamps):.2f} + results+teardown {whole - max(s[1] for s in stamps):.2f}")
    launched = time.time()
    started = distributed.run_isolated(me.timed_child, launched, time.sleep, 0)[0]
    print(f"empty child: {time.time() - launched:5.2f} (start {started:.2f})")
    launches = [(f"sharding {size} ranks", size, sharding_runs.sharded_training_on_rank, (sharding_runs.launch_parts(size),)) for size in (2, 4)]
    launches += [(f"peak_sharded {size} ranks", size, peak_sharded.measured_on_rank, (peak_sharded.LAUNCH_ENGINES[size], "mlp", 16, 1, peak_sharded.LAUNCH_CENSUS[size]))
                 for size in (2, 4)]
    launches += [(f"parallelism {layer}", 2, parallelism.tensor_parallel_saved_bytes_on_rank, layer) for layer in TENSOR_PARALLEL_LAYERS]
    for name, size, program, args in launches:
        launched = time.time()
        stamps = distributed.run_on_ranks(me.timed, size, launched, program, *args, timeout_seconds=300)
        whole = time.time() - launched
        print(f"{name:40s} {whole:5.2f} = start {max(s[0] for s in stamps):.2f} + work {max(s[1] - s[0] for s in stamps):.2f}"
              f" + end {whole - max(s[1] for s in stamps):.2f}")
    for size in (2, 4):
        for what in ("sharding", "peak"):
            parts = distributed.run_on_ranks(me.split_program, size, what, timeout_seconds=300)[0]
            print(f"  {what} {size} ranks, rank 0: " + ", ".join(f"{part} {seconds:.2f}" for part, seconds in parts.items()))
    children = [(f"peak_sharded prediction child, {size} ranks", predict_sharded_step_peaks_in_process,
                 (peak_sharded.LAUNCH_ENGINES[size], "mlp", 16, 1, size, tuple(range(size)), peak_sharded.LAUNCH_CENSUS[size]))
                for size in (2, 4)]  # the census predicted only where the launch measures it, as verify's plan asks
    children.append(("sharding paper-scale child", sharding_runs.paper_scale_state_on_fake_ranks,
                     (sharding_runs._paper_scale_runs(sharding_runs.PAPER_SCALE_CONFIGURATIONS),)))
    for name, program, args in children:
        launched = time.time()
        started, ended = distributed.run_isolated(me.timed_child, launched, program, *args, timeout_seconds=300)
        print(f"{name:40s} {time.time() - launched:5.2f} = start {started:.2f} + work {ended - started:.2f}")
    for size in (2, 4):  # sharding's launch: the parts its claims read against every part (its launch before LAUNCH_PARTS), taking turns
        walls: dict[str, list[float]] = {"every part": [], "claims' parts": []}
        cpus: dict[str, list[float]] = {"every part": [], "claims' parts": []}
        for _ in range(rounds):
            for name, parts in (("every part", sharding_runs._EVERY_PART), ("claims' parts", sharding_runs.launch_parts(size))):
                launched = time.time()
                stamps = distributed.run_on_ranks(me.timed, size, launched, sharding_runs.sharded_training_on_rank, parts, timeout_seconds=300)
                walls[name].append(time.time() - launched)
                cpus[name].append(sum(stamp[2] for stamp in stamps))
        print(f"sharding {size} ranks, every part (2 kinds x 4 pieces, 3 steps) against the claims' parts (LAUNCH_PARTS): "
              + ", ".join(f"{name} {statistics.median(walls[name]):.2f} s wall, {statistics.median(cpus[name]):.2f} CPU s in the ranks"
                          for name in walls) + f" (medians of {rounds})")
    for size in (2, 4):  # each world size's programs in one launch against each in its own, taking turns
        jobs = tuple((program, args, 300.0) for _, world_size, program, args in launches if world_size == size)
        shared, own = [], []
        for _ in range(rounds):
            launched = time.time()
            distributed.run_on_ranks(run_rank_jobs, size, jobs, timeout_seconds=600)
            shared.append(time.time() - launched)
            launched = time.time()
            for program, args, _ in jobs:
                distributed.run_on_ranks(program, size, *args, timeout_seconds=300)
            own.append(time.time() - launched)
        print(f"the {len(jobs)} {size}-rank programs: in one launch {statistics.median(shared):.2f}, each in its own "
              f"{statistics.median(own):.2f} (medians of {rounds}; ratio {statistics.median(shared) / statistics.median(own):.2f})")
    print(f"load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
