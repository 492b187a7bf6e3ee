"""``resacct shard`` on a deep stack of identical layers: each rank's step from the step at depths 3, 4 and 5.

As ``account``, ``fit`` and ``lora`` do (:mod:`resacct.account.peak.layer_segments`): the model is
built at depths 3, 4 and 5, each rank's sharded step is predicted on fake tensors with its layers'
segments marked (:func:`resacct.account.peak.sharded.predict_rank_summaries` inside
:func:`~resacct.account.peak.layer_segments.segmenting`), and every number of each rank's peak is
fitted through two depths and checked on the third
(:func:`~resacct.account.peak.layer_segments.extrapolate_peak`).

Only the FSDP engines are sampled (:data:`SAMPLED_ENGINES`): ``fully_shard`` shards each layer's
parameters on its own, the same at any depth. ZeRO-1 is traced whole: ``ZeroRedundancyOptimizer``
hands whole parameters to the ranks greedily by size over the whole model, and DDP fills its
gradient buckets over the whole model, so what one rank holds need not follow a line in the depth.
"""

from __future__ import annotations

from typing import Any

from resacct.account.peak.layer_segments import SAMPLE_DEPTHS, NotRepeating, extrapolate_peak, segmenting
from resacct.measurement.memory_timeline import STEP_PHASES

__all__ = ["SAMPLED_ENGINES", "sampled_rank_summaries", "summary_of_prediction"]

#: the engines whose step is traced at three depths for a deep stack (see the module doc)
SAMPLED_ENGINES = ("fsdp2", "zero2", "fsdp2-bf16")


def summary_of_prediction(predicted: Any) -> dict[str, Any]:
    """:func:`resacct.account.peak.sharded.step_summary`'s dict from a
    :class:`~resacct.account.peak.step_peak.PredictedStepPeak` (an extrapolated one)."""
    timeline, peak = predicted.timeline, predicted.peak
    start = timeline.start_bytes
    phase_peaks = {phase: max((held for name, held in zip(timeline.phases, timeline.bytes_held) if name == phase), default=start)
                   for phase in STEP_PHASES}
    return {"peak_bytes": peak.bytes, "phase": peak.phase, "op": peak.op, "where": peak.where, "bytes_by_kind": dict(peak.bytes_by_kind),
            "start_bytes": start, "phase_peak_bytes": phase_peaks, "unprobed_matmuls": predicted.unprobed_matmuls}


def sampled_rank_summaries(shallow: Any, make_inputs: Any, loss_fn: Any, engine: str, world_size: int, ranks: tuple[int, ...],
                           batch: int, seq: int | None) -> list[dict[str, Any]]:
    """Each of ``ranks``' ``{"allocator": summary}`` at ``shallow.depth`` layers (``shallow``: the model
    at the sample depths, :class:`~resacct.account.fit.sampled_layers.ShallowCopies`), extrapolated
    from the three; :class:`~resacct.account.peak.layer_segments.NotRepeating` where it does not repeat
    or the engine is not sampled."""
    from resacct.account.peak.sharded import predict_rank_summaries

    if engine not in SAMPLED_ENGINES:
        raise NotRepeating(f"{engine} hands out whole parameters and gradient buckets over the whole model: not sampled")
    # Every depth is traced alike: DTensor's sharding propagation, which ran at the first depth only (84 more
    # empty_strided calls there, torch 2.13), is not the step's and goes unrecorded (dtensor_propagation).
    per_depth = []
    for repeated, model in zip(SAMPLE_DEPTHS, shallow.models):
        with segmenting(repeated, shallow.prefix, shallow.period):
            per_depth.append(predict_rank_summaries(model, make_inputs(batch, seq), loss_fn, engine, world_size, ranks))
    return [{"allocator": summary_of_prediction(extrapolate_peak([reports[index]["predictions"]["allocator"] for reports in per_depth],
                                                                  shallow.depth))}
            for index in range(len(ranks))]
