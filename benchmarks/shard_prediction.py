"""Each rank's step peak under FSDP2: resacct's prediction (the engine on fake tensors under the fake
process group, resacct.account.peak.sharded) beside the CPU allocators of real gloo ranks and
beside torch's own FSDPMemTracker (``torch.distributed._tools.fsdp2_mem_tracker``) over the same
step on fake tensors under the same fake process group — the same models, inputs and steady AdamW
step, in one run.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/shard_prediction.py
    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/shard_prediction.py --cases mlp:fsdp2   # a subset

Columns: rank 0's peak measured by its allocator (torch.profiler, profile_memory=True; the first
complete record); resacct's prediction and its ratio; FSDPMemTracker's peak ("peak" snapshot,
summed over its devices) and its ratio; each predictor's wall time for rank 0 (in its own child
process, from joining the fake process group: the wrap, the optimizer state and the step; the
process's start and the model's build left out).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# (model, batch, seq)
MODELS = {"mlp": ("mlp", 16, 1), "gpt-math": ("gpt-math", 2, 32), "llama-sdpa": ("llama-sdpa", 2, 16)}
ENGINES = ("fsdp2", "zero2", "fsdp2-bf16")
WORLD_SIZE = 2


def fsdp_memtracker_peak(engine: str, model_name: str, batch: int, seq: int, world_size: int) -> tuple[int, float]:
    """FSDPMemTracker's peak on rank 0 over the steady step, in a child process (the fake process group)."""
    from resacct.measurement.distributed import run_isolated

    return run_isolated(_memtracker_in_child, engine, model_name, batch, seq, world_size, timeout_seconds=600)


def _memtracker_in_child(engine: str, model_name: str, batch: int, seq: int, world_size: int) -> tuple[int, float]:
    import torch
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from resacct.account.peak.sharded import _wrap, build_peak_model, engine_mesh, step_copies
    from resacct.measurement.memory_timeline import gc_paused, make_optimizer_state

    model, inputs, loss_fn = build_peak_model(model_name, batch, seq)
    started = time.perf_counter()  # as resacct's: from joining the fake group, the wrap and the optimizer state included
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        mesh = engine_mesh(engine, world_size)
        with gc_paused(), FakeTensorMode(allow_non_fake_inputs=True):
            work, work_inputs = step_copies(model, inputs, fake=True)
            wrapped, optimizer = _wrap(engine, work, None, mesh, fake=True, backend=None)
            make_optimizer_state(wrapped, optimizer)
            tracker = FSDPMemTracker(wrapped, optimizer)
            tracker.track_inputs(tuple(work_inputs) if isinstance(work_inputs, tuple) else (work_inputs,))
            with tracker:
                loss_fn(wrapped, work_inputs).backward()
                optimizer.step()
                optimizer.zero_grad()
            seconds = time.perf_counter() - started
            peak = sum(snapshot.get("Total", 0) for snapshot in tracker.get_tracker_snapshot("peak").values())
    finally:
        dist.destroy_process_group()
    return int(peak), seconds


def resacct_peak(engine: str, model_name: str, batch: int, seq: int, world_size: int) -> tuple[int, float]:
    """resacct's predicted peak of rank 0 (what the CPU allocator counts), in a child process."""
    from resacct.measurement.distributed import run_isolated

    return run_isolated(_resacct_in_child, engine, model_name, batch, seq, world_size, timeout_seconds=600)


def _resacct_in_child(engine: str, model_name: str, batch: int, seq: int, world_size: int) -> tuple[int, float]:
    from resacct.account.peak.sharded import build_peak_model, predict_rank_summaries

    model, inputs, loss_fn = build_peak_model(model_name, batch, seq)
    started = time.perf_counter()
    (summary,) = predict_rank_summaries(model, inputs, loss_fn, engine, world_size, (0,))
    return summary["allocator"]["peak_bytes"], time.perf_counter() - started


def main() -> None:
    from resacct.checks.peak_sharded import sharded_peak_measurements

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="*", default=None, metavar="MODEL:ENGINE", help="e.g. mlp:fsdp2 (default: every model × engine)")
    args = parser.parse_args()
    cases = [tuple(case.split(":")) for case in args.cases] if args.cases else [(m, e) for m in MODELS for e in ENGINES]
    print(f"{'model':11} {'engine':11} {'measured (rank 0)':>18} {'resacct':>10} {'ratio':>7} {'FSDPMemTracker':>15} {'ratio':>7} "
          f"{'resacct s':>10} {'tracker s':>10}")
    for model_name in dict.fromkeys(model for model, _ in cases):
        engines = tuple(engine for model, engine in cases if model == model_name)
        name, batch, seq = MODELS[model_name]
        runs = sharded_peak_measurements(WORLD_SIZE, name, batch, seq, engines)
        for engine in engines:
            measured = runs[engine]["measured"][0]["allocator"]["peak_bytes"]
            predicted, resacct_seconds = resacct_peak(engine, name, batch, seq, WORLD_SIZE)
            tracked, tracker_seconds = fsdp_memtracker_peak(engine, name, batch, seq, WORLD_SIZE)
            print(f"{model_name:11} {engine:11} {measured:>18,} {predicted:>10,} {predicted / measured:>7.4f} {tracked:>15,} {tracked / measured:>7.4f} "
                  f"{resacct_seconds:>10.2f} {tracker_seconds:>10.2f}", flush=True)


if __name__ == "__main__":
    main()
