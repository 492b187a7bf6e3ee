"""The launches the sharding claims will ask for, planned when they are collected
(:mod:`resacct.measurement.rank_jobs`): the gloo launch of :func:`~resacct.checks.sharding_runs._small_scale_launch`
per world size, and the paper-scale child (:func:`~resacct.checks.sharding_runs.paper_scale_measurements`)
beside the launch of :data:`PAPER_SCALE_BESIDE_WORLD_SIZE` ranks."""

from __future__ import annotations

import functools
from typing import Any

from resacct.checks.sharding_runs import (
    _LAUNCH_TIMEOUT_SECONDS,
    _PAPER_DTYPES,
    _paper_scale_runs,
    _require_sharding_engines,
    launch_parts,
    paper_scale_configurations,
    paper_scale_state_on_fake_ranks,
    sharded_training_on_rank,
)
from resacct.harness.registry import NotMeasurable
from resacct.measurement.rank_jobs import PlannedLaunch, plans_rank_jobs

__all__ = ["PAPER_SCALE_BESIDE_WORLD_SIZE"]


@plans_rank_jobs("sharding.per_rank_bytes_gloo", "sharding.zero1_partition_excess", "sharding.fsdp2_padding_excess",
                 "sharding.sharded_matches_single_process", "sharding.parameters_held_between_forward_and_backward")
def _planned_small_scale_launch(world_size: int, **_: Any) -> list[PlannedLaunch]:
    """:func:`~resacct.checks.sharding_runs._small_scale_launch`'s launch, the parts of :data:`~resacct.checks.sharding_training.LAUNCH_PARTS`
    its claims read (none where this torch lacks the engines: the claim skips)."""
    try:
        _require_sharding_engines()
    except NotMeasurable:
        return []
    return [PlannedLaunch(world_size, sharded_training_on_rank, (launch_parts(world_size),), _LAUNCH_TIMEOUT_SECONDS)]


#: The gloo launch whose ranks the paper-scale child runs beside, when one is planned.
PAPER_SCALE_BESIDE_WORLD_SIZE = 2
#: Per check asking for the paper-scale child: the input that names its world size, and its default recipe.
_PAPER_SCALE_CHECKS = {"sharding.paper_scale_per_rank_bytes": ("world_size", "mixed-adam"),
                       "sharding.largest_model_on_devices": ("devices", "fp32-adamw"), "sharding.training_state_bytes_per_parameter": (None, "fp32-adamw")}


def _planned_paper_scale_child(size_input: str | None, default_recipe: str, **inputs: Any) -> list[PlannedLaunch]:
    """The paper-scale child a claim asks for (:func:`~resacct.checks.sharding_runs.paper_scale_measurements`), beside the planned
    launch of :data:`PAPER_SCALE_BESIDE_WORLD_SIZE` ranks (none where this torch lacks the engines)."""
    wanted = (inputs[size_input] if size_input else 1, inputs.get("recipe", default_recipe))
    try:
        _require_sharding_engines()
    except NotMeasurable:
        return []
    configurations = paper_scale_configurations(*wanted, (inputs.get("zero_stage", 0),))
    return [PlannedLaunch(PAPER_SCALE_BESIDE_WORLD_SIZE, paper_scale_state_on_fake_ranks, (_paper_scale_runs(configurations),),
                          _LAUNCH_TIMEOUT_SECONDS, isolated=True)] if wanted[1] in _PAPER_DTYPES else []


for _check_name, (_size_input, _default_recipe) in _PAPER_SCALE_CHECKS.items():
    plans_rank_jobs(_check_name)(functools.partial(_planned_paper_scale_child, _size_input, _default_recipe))
