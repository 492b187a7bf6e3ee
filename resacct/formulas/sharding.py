"""Memory per rank of sharded data-parallel training: ZeRO stages 0–3.

Training state is three pieces per parameter: the **parameters** used for compute, their
**gradients**, and the **optimizer state** (for Adam: first and second moments, plus the
fp32 master copy of the weights when compute runs in 16 bits). A *recipe* says how many
bytes per parameter each piece takes. ZeRO (Rajbhandari et al. 2020, "ZeRO: Memory
Optimizations Toward Training Trillion Parameter Models", §5) shards them over N
data-parallel ranks:

========  =====================  ==========================
stage     sharded over N ranks   bytes per rank (Ψ params)
========  =====================  ==========================
0 (DDP)   nothing                (w + g + k)·Ψ
1         optimizer state        (w + g)·Ψ + k·Ψ/N
2         + gradients            w·Ψ + (g + k)·Ψ/N
3         + parameters           (w + g + k)·Ψ/N
========  =====================  ==========================

The paper's mixed-precision Adam is w = 2, g = 2, k = K = 12 (fp32 master, momentum and
variance). Its example, Ψ = 7.5B on N = 64:

>>> [round(per_rank_bytes(7.5e9, "mixed-adam", stage, 64).total_bytes / 1e9, 1) for stage in range(4)]
[120.0, 31.4, 16.6, 1.9]

The lecture's "largest model on 8 H100s" (80 GB each, 16 bytes/parameter) is 40B only when
all 16 bytes are sharded; plain data parallelism holds all of them on every GPU:

>>> largest_model_parameters(80e9, 8, "fp32-adamw", zero_stage=3) / 1e9
40.0
>>> largest_model_parameters(80e9, 8, "fp32-adamw", zero_stage=0) / 1e9
5.0

Real engines add rounding: ``torch.distributed.optim.ZeroRedundancyOptimizer`` assigns whole
parameter tensors to ranks (:func:`zero_redundancy_partition` predicts its assignment) and
FSDP pads each tensor's first dimension to a multiple of N (:func:`fsdp_padded_shard_numel`).
Activations, temporary buffers and communication buckets are not counted here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from resacct.errors import ResacctError
from resacct.facts.recipes import RECIPE_NAMES, Moment, Recipe, parse_recipe

__all__ = [
    "ZERO_STAGES",
    "SHARDED_PIECES",
    "ShardingRecipe",
    "SHARDING_RECIPES",
    "get_sharding_recipe",
    "sharding_recipe_from_state_recipe",
    "PerRankBytes",
    "per_rank_bytes",
    "per_rank_bytes_per_parameter",
    "largest_model_parameters",
    "fits_in_memory",
    "zero_redundancy_partition",
    "zero_redundancy_partition_numels",
    "adam_state_bytes",
    "fsdp_shard_rows",
    "fsdp_padded_shard_numel",
]

ZERO_STAGES = (0, 1, 2, 3)
#: What each ZeRO stage shards across the data-parallel ranks.
SHARDED_PIECES: dict[int, tuple[str, ...]] = {
    0: (),
    1: ("optimizer_state",),
    2: ("optimizer_state", "gradients"),
    3: ("optimizer_state", "gradients", "parameters"),
}


@dataclass(frozen=True)
class ShardingRecipe:
    """Bytes per parameter of each piece of training state, at one moment of a step: a
    :class:`resacct.facts.recipes.Recipe` with its optimizer, split as ZeRO shards it.

    ``optimizer_state_bytes_per_parameter`` is the ZeRO paper's K: everything only the
    optimizer needs (moments, the fp32 master weights of a mixed-precision recipe, and at the
    step that master's gradients).

    >>> get_sharding_recipe("fp32-adamw").total_bytes_per_parameter
    16.0
    """

    name: str
    parameter_bytes_per_parameter: float
    gradient_bytes_per_parameter: float
    optimizer_state_bytes_per_parameter: float
    description: str = ""
    optimizer: str | None = None
    moment: Moment = "after_backward"

    @property
    def total_bytes_per_parameter(self) -> float:
        return self.parameter_bytes_per_parameter + self.gradient_bytes_per_parameter + self.optimizer_state_bytes_per_parameter


def get_sharding_recipe(recipe: str | Recipe | ShardingRecipe, optimizer: str | None = None, moment: Moment = "after_backward") -> ShardingRecipe:
    """A recipe of :data:`resacct.facts.recipes.RECIPES` (a name or alias) with ``optimizer`` (default:
    the one the name pins, else AdamW) at ``moment``, or ``"w+g+k"`` bytes per parameter.

    >>> get_sharding_recipe("2+2+12").optimizer_state_bytes_per_parameter
    12.0
    >>> get_sharding_recipe("mixed-adam", moment="at_step").optimizer_state_bytes_per_parameter  # + the master's fp32 gradients
    16.0
    """
    if isinstance(recipe, ShardingRecipe):
        return recipe
    if not isinstance(recipe, (str, Recipe)):
        raise ResacctError(f"recipe {recipe!r}: expected a name such as 'fp32-adamw' or bytes per parameter 'w+g+k' such as '2+2+12'")
    chosen = parse_recipe(recipe)
    chosen_optimizer = None if chosen.is_custom else chosen.optimizer_for(optimizer)
    pieces = chosen.state_bytes(chosen_optimizer, moment)
    return ShardingRecipe(chosen.name, float(pieces.parameters), float(pieces.gradients), float(pieces.optimizer_state),
                          chosen.description, optimizer=chosen_optimizer, moment=moment)


def sharding_recipe_from_state_recipe(state_recipe: str | Recipe, optimizer: str = "adamw") -> ShardingRecipe:
    """A precision recipe (``fp32``, ``bf16-fp32-master`` …) with ``optimizer``, split as ZeRO
    shards it, between steps (``moment="after_backward"``).

    >>> recipe = sharding_recipe_from_state_recipe("bf16-fp32-master")   # the ZeRO paper's 2 + 2 + 12
    >>> recipe.parameter_bytes_per_parameter, recipe.gradient_bytes_per_parameter, recipe.optimizer_state_bytes_per_parameter
    (2.0, 2.0, 12.0)
    """
    return get_sharding_recipe(state_recipe, optimizer)


def __getattr__(name: str) -> dict[str, ShardingRecipe]:
    """``SHARDING_RECIPES``: every recipe name and alias as bytes between steps (built when first
    asked for: bytes need torch's dtypes, and importing this module must not)."""
    if name == "SHARDING_RECIPES":
        return {recipe: get_sharding_recipe(recipe) for recipe in RECIPE_NAMES}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class PerRankBytes:
    """Bytes one rank holds of each piece of training state."""

    parameters_bytes: float
    gradients_bytes: float
    optimizer_state_bytes: float

    @property
    def total_bytes(self) -> float:
        return self.parameters_bytes + self.gradients_bytes + self.optimizer_state_bytes

    def as_list(self) -> list[float]:
        """[parameters, gradients, optimizer state] bytes."""
        return [self.parameters_bytes, self.gradients_bytes, self.optimizer_state_bytes]


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_stage(zero_stage: int) -> None:
    if isinstance(zero_stage, bool) or not isinstance(zero_stage, int) or zero_stage not in ZERO_STAGES:
        raise ResacctError(f"ZeRO stage {zero_stage!r}: expected 0, 1, 2 or 3 (0 = plain data parallel, 3 = parameters sharded too)")


def _check_world_size(world_size: int, what: str = "world size") -> None:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ResacctError(f"{what} {world_size!r}: expected a whole number of ranks ≥ 1")


def _check_positive(value: float, what: str) -> None:
    if not _is_number(value) or not math.isfinite(value) or value <= 0:
        raise ResacctError(f"{what} {value!r}: expected a finite number greater than 0")


def _check_parameter_count(parameter_count: float, world_size: int) -> None:
    _check_positive(parameter_count, "parameter count")
    if parameter_count < world_size:
        raise ResacctError(
            f"parameter count {parameter_count!r} is smaller than world size {world_size}: "
            "every rank needs at least one parameter to shard; use fewer ranks or more parameters"
        )


def per_rank_bytes(parameter_count: float, recipe: str | ShardingRecipe, zero_stage: int, world_size: int) -> PerRankBytes:
    """Bytes of parameters, gradients and optimizer state on each of ``world_size`` ranks.

    >>> per_rank_bytes(1e9, "fp32-adamw", 1, 4).as_list()
    [4000000000.0, 4000000000.0, 2000000000.0]
    """
    chosen = get_sharding_recipe(recipe)
    _check_stage(zero_stage)
    _check_world_size(world_size)
    _check_parameter_count(parameter_count, world_size)
    return _per_rank_bytes(parameter_count, chosen, zero_stage, world_size)


def _per_rank_bytes(parameter_count: float, recipe: ShardingRecipe, zero_stage: int, world_size: int) -> PerRankBytes:
    sharded = SHARDED_PIECES[zero_stage]
    return PerRankBytes(
        parameters_bytes=_share("parameters", recipe.parameter_bytes_per_parameter, sharded, parameter_count, world_size),
        gradients_bytes=_share("gradients", recipe.gradient_bytes_per_parameter, sharded, parameter_count, world_size),
        optimizer_state_bytes=_share("optimizer_state", recipe.optimizer_state_bytes_per_parameter, sharded, parameter_count, world_size),
    )


def _share(piece: str, bytes_per_parameter: float, sharded: tuple[str, ...], parameter_count: float, world_size: int) -> float:
    """One rank's bytes of ``piece``: a module-level function, not a def in :func:`_per_rank_bytes`, so the
    type-checking hook decorates it once (docs/suite_time.md, session 7)."""
    divisor = world_size if piece in sharded else 1
    return bytes_per_parameter * parameter_count / divisor


def per_rank_bytes_per_parameter(recipe: str | ShardingRecipe, zero_stage: int, world_size: int) -> float:
    """Bytes each rank holds per parameter of the model.

    >>> per_rank_bytes_per_parameter("mixed-adam", 2, 64)   # 2 + (2 + 12)/64
    2.21875
    """
    return per_rank_bytes(float(world_size), recipe, zero_stage, world_size).total_bytes / world_size


def largest_model_parameters(device_memory_bytes: float, devices: int, recipe: str | ShardingRecipe, zero_stage: int) -> float:
    """The most parameters whose training state fits ``devices`` devices of
    ``device_memory_bytes`` each (activations not counted), rounded down to a whole number.

    >>> largest_model_parameters(80e9, 8, "fp32-adamw", zero_stage=1) / 1e9   # 80 GB / (4 + 4 + 8/8)
    8.888888888
    """
    _check_positive(device_memory_bytes, "device memory (bytes)")
    _check_world_size(devices, "device count")
    chosen = get_sharding_recipe(recipe)
    largest = float(math.floor(device_memory_bytes / per_rank_bytes_per_parameter(chosen, zero_stage, devices)))
    for _ in range(8):  # floating-point rounding can leave the quotient a parameter or two too high
        if _per_rank_bytes(largest, chosen, zero_stage, devices).total_bytes <= device_memory_bytes:
            break
        largest -= max(1.0, math.ulp(largest))
    return largest


def fits_in_memory(parameter_count: float, device_memory_bytes: float, recipe: str | ShardingRecipe, zero_stage: int, world_size: int) -> bool:
    """Whether each rank's training state fits in ``device_memory_bytes``.

    >>> fits_in_memory(40e9, 80e9, "fp32-adamw", 3, 8), fits_in_memory(40e9, 80e9, "fp32-adamw", 2, 8)
    (True, False)
    """
    _check_positive(device_memory_bytes, "device memory (bytes)")
    return per_rank_bytes(parameter_count, recipe, zero_stage, world_size).total_bytes <= device_memory_bytes


def _check_numels(parameter_numels: Sequence[int]) -> list[int]:
    numels = list(parameter_numels)
    for numel in numels:
        if isinstance(numel, bool) or not isinstance(numel, int) or numel < 0:
            raise ResacctError(f"parameter size {numel!r} in {numels[:8]}: expected whole numbers of elements ≥ 0")
    return numels


def zero_redundancy_partition(parameter_numels: Sequence[int], world_size: int) -> list[list[int]]:
    """Which parameter tensors (indices into ``parameter_numels``) each rank's
    ``ZeroRedundancyOptimizer`` owns: largest first (a stable sort), each to the rank with the
    fewest elements so far (the lowest rank on ties) — torch's ``_partition_parameters``.

    >>> zero_redundancy_partition([512, 32, 1024, 32, 128, 4], 2)
    [[2], [0, 4, 1, 3, 5]]
    """
    numels = _check_numels(parameter_numels)
    _check_world_size(world_size)
    owned: list[list[int]] = [[] for _ in range(world_size)]
    loads = [0] * world_size
    for index in sorted(range(len(numels)), key=lambda i: numels[i], reverse=True):
        rank = loads.index(min(loads))
        owned[rank].append(index)
        loads[rank] += numels[index]
    return owned


def zero_redundancy_partition_numels(parameter_numels: Sequence[int], world_size: int) -> list[int]:
    """Elements of optimizer state (per state tensor) each rank holds under ``ZeroRedundancyOptimizer``.

    >>> zero_redundancy_partition_numels([512, 32, 1024, 32, 128, 4], 2)
    [1024, 708]
    """
    numels = _check_numels(parameter_numels)
    return [sum(numels[i] for i in indices) for indices in zero_redundancy_partition(numels, world_size)]


def adam_state_bytes(parameter_numels: Sequence[int], moment_bytes: int = 4, step_bytes: int = 4) -> int:
    """Bytes of ``torch.optim.Adam``/``AdamW`` state for these parameter tensors: two moments
    per element and one scalar ``step`` tensor (float32) per parameter tensor.

    >>> adam_state_bytes([1024, 32])   # 2·4·1056 + 2·4
    8456
    """
    numels = _check_numels(parameter_numels)
    return 2 * moment_bytes * sum(numels) + step_bytes * len(numels)


def fsdp_shard_rows(rows: int, world_size: int) -> list[int]:
    """Rows of a tensor's first dimension each rank keeps under FSDP (``torch.chunk``:
    ⌈rows/N⌉ each until they run out).

    >>> fsdp_shard_rows(5, 4), fsdp_shard_rows(3, 4)
    ([2, 2, 1, 0], [1, 1, 1, 0])
    """
    _check_world_size(world_size)
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
        raise ResacctError(f"rows {rows!r}: expected a whole number ≥ 0")
    chunk = -(-rows // world_size)
    return [max(0, min(chunk, rows - rank * chunk)) for rank in range(world_size)]


def fsdp_padded_shard_numel(shape: Sequence[int], world_size: int) -> int:
    """Elements of the storage behind each rank's FSDP shard of a tensor of ``shape``: the first
    dimension padded to ⌈rows/N⌉ on every rank.

    >>> fsdp_padded_shard_numel((5, 24), 4)   # 2 rows of 24 on every rank, 3 rows of them padding
    48
    """
    dims = _check_numels(list(shape))
    if not dims:
        return 1
    rest = math.prod(dims[1:])
    return fsdp_shard_rows(dims[0], world_size)[0] * rest if dims[0] else 0
