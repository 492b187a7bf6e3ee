"""Checks of sharded training memory: resacct's per-rank formulas (:mod:`resacct.formulas.sharding`)
against what torch's real engines hold — ZeroRedundancyOptimizer, FSDP2 ``fully_shard`` — on
gloo ranks and at paper scale on the meta device. The measuring (child processes, caches) is in
:mod:`resacct.checks.sharding_runs`; its public names are importable from here too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from resacct.checks.sharding_runs import (
    MODEL_KINDS,
    PAPER_TENSOR_COUNT,
    PAPER_TENSOR_SHAPE,
    TRAINING_STEPS,
    paper_scale_measurements,
    paper_scale_state_on_fake_ranks,
    sharded_training_on_rank,
    small_scale_measurements,
)
from resacct.harness.registry import NotMeasurable, Outcome, check
from resacct.formulas.sharding import (
    adam_state_bytes,
    fsdp_padded_shard_numel,
    fsdp_shard_rows,
    get_sharding_recipe,
    per_rank_bytes,
    zero_redundancy_partition,
    zero_redundancy_partition_numels,
)

from resacct.checks import sharding_runs

__all__ = [*sharding_runs.__all__]  # the runs' names, re-exported; the checks register themselves


# --- checks --------------------------------------------------------------------------------


def _parameter_count(shapes: Sequence[Sequence[int]]) -> int:
    return sum(math.prod(shape) for shape in shapes)


def _busiest(ranks: Sequence[dict[str, Any]], engine: str) -> list[int]:
    unavailable = [rank[engine]["unavailable"] for rank in ranks if "unavailable" in rank[engine]]
    if unavailable:
        raise NotMeasurable(f"{engine} does not run on CPU with torch {torch.__version__}: {unavailable[0]}")
    pieces = ("parameters_bytes", "gradients_bytes", "optimizer_state_bytes")
    return [max(rank[engine][piece] for rank in ranks) for piece in pieces]


def _fp32_adamw_prediction(shapes: Sequence[Sequence[int]], engine: str, world_size: int) -> list[float]:
    """resacct's per-rank bytes, counting what the engines round: whole tensors (ZeRO-1),
    padded rows (FSDP2) and AdamW's scalar ``step`` per tensor."""
    numels = [math.prod(shape) for shape in shapes]
    if engine == "zero1":
        owned = max(zero_redundancy_partition(numels, world_size), key=lambda indices: adam_state_bytes([numels[i] for i in indices]))
        state = adam_state_bytes([numels[i] for i in owned])
        return [4.0 * sum(numels), 4.0 * sum(numels), float(state)]
    padded = sum(fsdp_padded_shard_numel(shape, world_size) for shape in shapes)
    local = [fsdp_shard_rows(shape[0], world_size)[0] * math.prod(shape[1:]) for shape in shapes]
    return [4.0 * padded, 4.0 * padded, float(adam_state_bytes(local))]


@check("sharding.per_rank_bytes_gloo", evidence="measured", quantities=("params",))
def per_rank_bytes_on_gloo(engine: str, world_size: int, kind: str = "balanced") -> Outcome:
    """[parameters, gradients, optimizer state] bytes held by the busiest of ``world_size`` gloo
    ranks after real AdamW steps with ``engine`` (``zero1``: DDP + ZeroRedundancyOptimizer;
    ``fsdp2``: fully_shard; ``fsdp2_bf16``: fully_shard computing in bf16), summed from the storages of the real tensors; ``params``: the
    model's parameter count."""
    measurement = small_scale_measurements(world_size, kind, {engine: 1})  # the state the first step allocates, held by every step after
    return Outcome(
        measured=_busiest(measurement["ranks"], engine),
        predicted=_fp32_adamw_prediction(measurement["shapes"], engine, world_size),
        quantities={"params": _parameter_count(measurement["shapes"])},
    )


@check("sharding.zero1_partition_excess", evidence="measured", quantities=("owned_numels",))
def zero1_partition_excess(world_size: int, kind: str = "uneven") -> Outcome:
    """How far ZeroRedundancyOptimizer's busiest rank is above 1/N of the parameters, in units
    of the largest tensor: (max owned − total/N) / largest. ``owned_numels``: each rank's
    owned parameter count, read from its real optimizer."""
    measurement = small_scale_measurements(world_size, kind, {"zero1": 1})
    numels = [math.prod(shape) for shape in measurement["shapes"]]
    owned_numels = [sum(numels[i] for i in rank["zero1"]["owned_parameter_indices"]) for rank in measurement["ranks"]]
    predicted_numels = zero_redundancy_partition_numels(numels, world_size)

    def excess(per_rank: Sequence[int]) -> float:
        return (max(per_rank) - sum(numels) / world_size) / max(numels)

    return Outcome(measured=excess(owned_numels), predicted=excess(predicted_numels), quantities={"owned_numels": owned_numels})


@check("sharding.fsdp2_padding_excess", evidence="measured", quantities=("local_numels",))
def fsdp2_padding_excess(world_size: int, kind: str = "uneven") -> Outcome:
    """How far FSDP2's per-rank parameter storage is above 1/N of the parameters, in units of
    one row of every tensor: (stored elements − total/N) / Σ row sizes. ``local_numels``:
    each rank's unpadded shard sizes."""
    measurement = small_scale_measurements(world_size, kind, {"fsdp2": 1})
    shapes = measurement["shapes"]
    numels = [math.prod(shape) for shape in shapes]
    row_elements = sum(math.prod(shape[1:]) for shape in shapes)
    stored = max(rank["fsdp2"]["parameters_bytes"] for rank in measurement["ranks"]) // 4
    predicted_stored = sum(fsdp_padded_shard_numel(shape, world_size) for shape in shapes)

    def excess(elements: int) -> float:
        return (elements - sum(numels) / world_size) / row_elements

    local_numels = [sum(rank["fsdp2"]["local_parameter_numels"]) for rank in measurement["ranks"]]
    return Outcome(measured=excess(stored), predicted=excess(predicted_stored), quantities={"local_numels": local_numels})


@check("sharding.sharded_matches_single_process", evidence="measured")
def sharded_matches_single_process(engine: str, world_size: int, kind: str = "uneven") -> Outcome:
    """Largest |parameter difference| over all ranks between ``engine`` training on
    ``world_size`` ranks (each with its slice of the batch) and one process training on the
    whole batch, after the same AdamW steps from the same seed."""
    ranks = small_scale_measurements(world_size, kind, {engine: TRAINING_STEPS})["ranks"]
    return Outcome(measured=max(rank[engine]["max_abs_difference"] for rank in ranks))


@check("sharding.parameters_held_between_forward_and_backward", evidence="measured", quantities=("params",))
def parameters_held_between_forward_and_backward(reshard_after_forward: bool, world_size: int, kind: str = "balanced") -> Outcome:
    """Bytes of parameters the busiest FSDP2 rank holds right after forward, before backward,
    with ``fully_shard(reshard_after_forward=...)``; ``params``: the parameter count."""
    measurement = small_scale_measurements(world_size, kind, {"fsdp2": 1} if reshard_after_forward else {"after_forward": 0})
    key = "parameters_bytes_after_forward_resharded" if reshard_after_forward else "parameters_bytes_after_forward_kept"
    shapes = measurement["shapes"]
    predicted = 4 * (sum(fsdp_padded_shard_numel(shape, world_size) for shape in shapes) if reshard_after_forward else _parameter_count(shapes))
    return Outcome(
        measured=max(rank[key] for rank in measurement["ranks"]),
        predicted=predicted,
        quantities={"params": _parameter_count(shapes)},
    )


@check("sharding.paper_scale_per_rank_bytes", evidence="measured", quantities=("params", "parameters_bytes", "gradients_bytes", "optimizer_state_bytes"))
def paper_scale_per_rank_bytes(zero_stage: int, world_size: int, recipe: str = "mixed-adam") -> Outcome:
    """Total bytes the busiest of ``world_size`` ranks holds at ``zero_stage`` for a
    7.5B-parameter state (64 tensors of 9375×12500) in ``recipe``, summed from meta tensors
    sharded by ZeroRedundancyOptimizer (stages 1–2: its partition; stage 2 keeps the owned
    gradients) or fully_shard (stage 3), with AdamW's state allocated by its own step()."""
    pieces = paper_scale_measurements(world_size, recipe, (zero_stage,))[zero_stage]
    params = PAPER_TENSOR_COUNT * math.prod(PAPER_TENSOR_SHAPE)
    predicted = per_rank_bytes(params, recipe, zero_stage, world_size).total_bytes
    return Outcome(
        measured=sum(pieces),
        predicted=predicted,
        quantities={"params": params, "parameters_bytes": pieces[0], "gradients_bytes": pieces[1], "optimizer_state_bytes": pieces[2]},
    )


@check("sharding.largest_model_on_devices", evidence="measured", quantities=("bytes_per_parameter_per_rank",))
def largest_model_on_devices(zero_stage: int, devices: int, device_memory_bytes: float, recipe: str = "fp32-adamw") -> Outcome:
    """The most parameters whose training state fits ``devices`` devices of
    ``device_memory_bytes``: device memory ÷ the bytes per parameter the busiest rank holds,
    measured on the 7.5B meta state sharded over ``devices`` ranks."""
    from resacct.formulas.sharding import largest_model_parameters

    params = PAPER_TENSOR_COUNT * math.prod(PAPER_TENSOR_SHAPE)
    per_parameter = sum(paper_scale_measurements(devices, recipe, (zero_stage,))[zero_stage]) / params
    return Outcome(
        measured=device_memory_bytes / per_parameter,
        predicted=largest_model_parameters(device_memory_bytes, devices, get_sharding_recipe(recipe), zero_stage),
        quantities={"bytes_per_parameter_per_rank": per_parameter},
    )


@check("sharding.training_state_bytes_per_parameter", evidence="measured", quantities=("params",))
def training_state_bytes_per_parameter(recipe: str = "fp32-adamw") -> Outcome:
    """Bytes per parameter of parameters + gradients + optimizer state (+ masters) of the
    7.5B meta state, unsharded, after a real AdamW step; ``params``: its parameter count."""
    params = PAPER_TENSOR_COUNT * math.prod(PAPER_TENSOR_SHAPE)
    total = sum(paper_scale_measurements(1, recipe, (0,))[0])
    return Outcome(measured=total / params, predicted=get_sharding_recipe(recipe).total_bytes_per_parameter, quantities={"params": params})
