"""The sharded step measured on real gloo ranks: each rank's CPU allocator over one steady step
(``torch.profiler``, ``profile_memory=True``), the record kept only when complete — used by the
per-rank claims (:mod:`resacct.checks.peak_sharded`) and by ``resacct shard --measure``.

A gloo worker thread sometimes drops the last reference to a collective's buffer after the caller
has; that free happens outside the profiler's thread-local state and is never recorded, so such a
record keeps the buffer to its end. A steady step ends holding what it started with: every rank
keeps its first record that does, all ranks re-running in step (they share collectives).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch

from resacct.errors import ResacctError

__all__ = ["MAX_ATTEMPTS", "allocator_record", "first_complete", "allocator_summary", "measure_source_on_rank"]

MAX_ATTEMPTS = 12


def allocator_record(engine: str, model: Any, inputs: Any, loss_fn: Any, world_size: int, mesh: Any) -> tuple[Any, int]:
    """The CPU allocator's timeline of one steady step on this rank, and the bytes it ends above its start."""
    from resacct.account.peak.sharded import sharded_step, step_copies
    from resacct.measurement.memory_timeline import _timeline_of, allocator_recording

    with allocator_recording() as (mark, events):
        work, work_inputs = step_copies(model, inputs, fake=False)
        sharded_step(engine, work, work_inputs, loss_fn, world_size, None, mesh, fake=False, mark=mark)
    del work, work_inputs  # freed before the next record starts (that free would count in it)
    timeline = _timeline_of(events)
    return timeline, timeline.bytes_held[-1] - timeline.start_bytes


def first_complete(attempt: Callable[[], tuple[Any, int]], what: str) -> tuple[Any, int, int]:
    """Run ``attempt`` (→ its result and the bytes that make it incomplete) until every rank has a
    complete one; (this rank's first complete result, attempts, the largest incompleteness seen)."""
    import torch.distributed as dist

    kept, attempts, worst = None, 0, 0
    while attempts < MAX_ATTEMPTS:
        attempts += 1
        result, excess = attempt()
        if excess == 0 and kept is None:
            kept = result
        worst = max(worst, excess)
        done = torch.tensor([0 if kept is None else 1])
        dist.all_reduce(done, op=dist.ReduceOp.MIN)
        if int(done.item()):  # every rank has one (the minimum over ranks)
            return kept, attempts, worst
    raise ResacctError(f"rank {dist.get_rank()}: no complete {what} in {attempts} attempts ({worst} bytes off at most); "
                       "expected a gloo worker to release its buffers before the caller at least once")


def allocator_summary(engine: str, model: Any, inputs: Any, loss_fn: Any, world_size: int) -> dict[str, Any]:
    """This rank's first complete allocator record of ``engine``'s step: peak, phase, start, each
    phase's peak, the attempts it took and the most an incomplete record was off."""
    from resacct.account.peak.sharded import engine_mesh
    from resacct.measurement.memory_timeline import STEP_PHASES

    mesh = engine_mesh(engine, world_size)
    record, attempts, lost = first_complete(lambda: allocator_record(engine, model, inputs, loss_fn, world_size, mesh),
                                            f"allocator record of the {engine} step")
    return {"peak_bytes": record.peak_bytes, "phase": record.peak_phase, "start_bytes": record.start_bytes,
            "phase_peak_bytes": {phase: record.peak_of_phase(phase) for phase in STEP_PHASES}, "attempts": attempts, "lost_free_bytes": lost}


def measure_source_on_rank(rank: int, world_size: int, source: Any, engine: str, batch: int, seq: int | None) -> dict[str, Any]:
    """What each gloo rank runs for ``resacct shard --measure``: the model of ``source``
    (:class:`~resacct.account.fit.search.ModelSource`) built on meta, then made real on the CPU
    (uninitialised: the values change no allocation; token inputs are zeros), and its step's
    allocator summary (:func:`allocator_summary`)."""
    from resacct.measurement.memory_timeline import copy_inputs

    target = source.target()
    model = copy.deepcopy(target.model).to_empty(device="cpu")
    inputs = copy_inputs(target.make_inputs(batch, seq if seq is not None else target.seq_limit), lambda t: torch.zeros(t.shape, dtype=t.dtype))
    return allocator_summary(engine, model, inputs, target.loss_fn(), world_size)
