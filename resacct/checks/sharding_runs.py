"""Measuring sharded training memory on torch's real engines — never a simulation of them.

Two scales, both in child processes (this process never joins a process group):

* **Gloo ranks, real training** (:func:`sharded_training_on_rank`, :mod:`resacct.checks.sharding_training`; N = 2 and 4 local
  processes): a tiny model trained a few AdamW steps with ``DistributedDataParallel`` +
  ``ZeroRedundancyOptimizer`` (ZeRO-1), with FSDP2 ``fully_shard`` (ZeRO-3; also computing
  in bf16), and the same model trained in one process. Each rank reports the bytes of the storages behind its
  parameters, gradients and optimizer state (deduplicated by storage), which tensors its
  optimizer owns, and how far its parameters are from the single-process ones.
* **Paper scale on the meta device** (:func:`paper_scale_state_on_fake_ranks`): a 7.5B-parameter
  state built of meta tensors (no memory) and sharded for N = 64 by the same engines under
  torch's fake process group (no communication — only sizes matter). Parameters are sharded
  by ``fully_shard``; optimizer state is allocated by ``torch.optim.AdamW.step()`` itself, on
  the partition ``ZeroRedundancyOptimizer`` chose or on FSDP's sharded DTensors.

A launch measures the parts (model kind, piece, training steps) its claims read (:data:`LAUNCH_PARTS`),
and is cached per world size and parts, so the claims of one world size share one launch. The
claims' checks, which compare these measurements with :mod:`resacct.formulas.sharding`'s formulas, are in
:mod:`resacct.checks.sharding` (which re-exports the names here).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from jaxtyping import Float
from torch import nn

from resacct.measurement.distributed import DistributedError, DistributedUnavailableError, preload_in_ranks
from resacct.measurement.memo import shared_measurement
from resacct.measurement.rank_jobs import shared_rank_launch, shared_started_isolated
from resacct.measurement.memory import distinct_storage_bytes
from resacct.errors import ResacctError
from resacct.harness.registry import NotMeasurable
from resacct.checks.sharding_training import (  # the ranks' program, re-exported
    _EVERY_PART,
    LAUNCH_PARTS,
    MODEL_KINDS,
    PIECES,
    TRAINING_STEPS,
    _check_parts,
    _cpu_mesh,
    _model,
    _optimizer_state_tensors,
    sharded_training_on_rank,
)

preload_in_ranks(__name__)  # the module of what the paper-scale child runs

__all__ = [
    "sharded_training_on_rank",
    "paper_scale_state_on_fake_ranks",
    "small_scale_measurements",
    "paper_scale_measurements",
    "paper_scale_configurations",
    "MODEL_KINDS",
    "PIECES",
    "LAUNCH_PARTS",
    "launch_parts",
    "fsdp2_cpu_gap",
    "FSDP2_PIECES",
    "PAPER_TENSOR_SHAPE",
    "PAPER_TENSOR_COUNT",
]

#: The paper-scale state: 64 tensors of 9375 × 12500 = 7.5e9 parameters (the ZeRO paper's Ψ).
PAPER_TENSOR_SHAPE = (9375, 12500)
PAPER_TENSOR_COUNT = 64
_LAUNCH_TIMEOUT_SECONDS = 90.0
_STAGES = (0, 1, 2, 3)  # the ZeRO stages measured at paper scale (0: nothing sharded)


def _parameter_shapes(kind: str) -> list[list[int]]:
    return [list(parameter.shape) for parameter in _model(kind).parameters()]


def _require_sharding_engines() -> None:
    """Skip (never fake) when this torch lacks the engines measured here: FSDP2's public
    ``torch.distributed.fsdp.fully_shard`` (torch ≥ 2.6) and ZeroRedundancyOptimizer."""
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # noqa: F401
        from torch.distributed.optim import ZeroRedundancyOptimizer  # noqa: F401
    except ImportError as error:
        raise NotMeasurable(f"torch {torch.__version__} lacks a sharding engine measured here (public FSDP2 arrived in torch 2.6): {error}") from None


#: the pieces FSDP2 measures (every piece but ZeroRedundancyOptimizer's)
FSDP2_PIECES = ("fsdp2", "fsdp2_bf16", "after_forward")


def fsdp2_cpu_gap() -> str | None:
    """Why this torch's FSDP2 cannot train CPU tensors, or None. Its collectives record an event on the CPU's stream
    (``torch.cpu.Stream.record_event``), which torch 2.6's lacks ("'Stream' object has no attribute 'record_event'",
    measured on 2.6.0; 2.7.1 has it): the FSDP2 claims skip there, ZeroRedundancyOptimizer's are still measured."""
    if hasattr(torch.cpu, "Stream") and hasattr(torch.cpu.Stream, "record_event"):
        return None
    return (f"torch {torch.__version__}'s FSDP2 cannot train CPU tensors: torch.cpu.Stream has no record_event, which its collectives "
            "call (torch 2.7 has it)")


def launch_parts(world_size: int, kind: str = "balanced", needs: dict[str, int] | None = None) -> tuple[tuple[str, str, int], ...]:
    """The parts the launch of ``world_size`` ranks measures (:data:`LAUNCH_PARTS`), with each piece of ``needs``
    ({piece: least training steps}) of ``kind`` not among them added; FSDP2's left out where it cannot train CPU tensors
    (:func:`fsdp2_cpu_gap`)."""
    parts = list(LAUNCH_PARTS.get(world_size, _EVERY_PART))
    for piece, steps in (needs or {}).items():
        if not any(part[:2] == (kind, piece) and part[2] >= steps for part in parts):
            parts.append((kind, piece, steps))
    _check_parts(parts)
    if fsdp2_cpu_gap() is not None:
        parts = [part for part in parts if part[1] not in FSDP2_PIECES]
    return tuple(parts)


@shared_measurement(switchable=False)
def _small_scale_launch(world_size: int, parts: tuple[tuple[str, str, int], ...]) -> tuple[list[dict[str, Any]], ...]:
    _require_sharding_engines()
    try:  # with the run's other launches of world_size ranks, when planned (resacct.measurement.rank_jobs)
        return tuple(shared_rank_launch(sharded_training_on_rank, world_size, parts, timeout_seconds=_LAUNCH_TIMEOUT_SECONDS))
    except DistributedUnavailableError as error:
        raise NotMeasurable(str(error)) from None


def small_scale_measurements(world_size: int, kind: str, needs: dict[str, int] | None = None) -> dict[str, Any]:
    """Every rank's report for model ``kind`` from :func:`sharded_training_on_rank` — per piece of ``needs``
    ({piece: least training steps}; every piece after TRAINING_STEPS when not given): ``zero1``, ``fsdp2``,
    ``fsdp2_bf16``; ``parameters_bytes_after_forward_kept`` (the ``after_forward`` piece) and ``_resharded``
    (the ``fsdp2`` piece's first forward) — with the model's parameter shapes.
    One launch per world size serves the claims (cached): a piece is read from its launch's part of that
    kind with the fewest steps that are enough."""
    if kind not in MODEL_KINDS:
        raise ValueError(f"model kind {kind!r}: expected one of {MODEL_KINDS}")
    if needs is None:
        needs = {piece: 0 if piece == "after_forward" else TRAINING_STEPS for piece in PIECES}
    if (gap := fsdp2_cpu_gap()) is not None and any(piece in FSDP2_PIECES for piece in needs):
        raise NotMeasurable(gap)
    parts = launch_parts(world_size, kind, needs)
    ranks = _small_scale_launch(world_size, parts)
    chosen = {piece: min((part[2], index) for index, part in enumerate(parts) if part[:2] == (kind, piece) and part[2] >= steps)[1]
              for piece, steps in needs.items()}
    reports = []
    for results in ranks:
        report = {piece: results[index] for piece, index in chosen.items() if piece != "after_forward"}
        if "after_forward" in chosen:
            report["parameters_bytes_after_forward_kept"] = results[chosen["after_forward"]]["kept"]
        if "fsdp2" in chosen:
            report["parameters_bytes_after_forward_resharded"] = results[chosen["fsdp2"]]["parameters_bytes_after_forward"]
        reports.append(report)
    return {"ranks": reports, "shapes": _parameter_shapes(kind)}


# --- the ZeRO paper's scale, on the meta device under a fake process group ------------------

_PAPER_DTYPES = {  # recipe → (dtype of parameters and gradients, dtype of a master copy or None)
    "mixed-adam": (torch.float16, torch.float32),
    "fp32-adamw": (torch.float32, None),
    "bf16-adamw": (torch.bfloat16, None),
}


def _meta_step(optimizer: Any, targets: Sequence[Float[torch.Tensor, "..."]]) -> None:
    for target in targets:
        target.grad = torch.empty_like(target)
    optimizer.step()


def _unsharded_state(compute_dtype: torch.dtype, master_dtype: torch.dtype | None) -> list[int]:
    with torch.device("meta"):
        parameters = [torch.empty(PAPER_TENSOR_SHAPE, dtype=compute_dtype) for _ in range(PAPER_TENSOR_COUNT)]
    gradients = [torch.empty_like(p) for p in parameters]
    targets = [p.to(master_dtype) for p in parameters] if master_dtype else parameters
    optimizer = torch.optim.AdamW(targets, foreach=False)
    _meta_step(optimizer, targets)
    masters = targets if master_dtype else []
    optimizer_bytes = distinct_storage_bytes(masters) + distinct_storage_bytes(_optimizer_state_tensors(optimizer))
    return [distinct_storage_bytes(parameters), distinct_storage_bytes(gradients), optimizer_bytes]


def _zero_partitioned_state(compute_dtype: torch.dtype, master_dtype: torch.dtype | None, shard_gradients: bool) -> list[int]:
    from torch.distributed.optim import ZeroRedundancyOptimizer

    with torch.device("meta"):
        parameters = [torch.empty(PAPER_TENSOR_SHAPE, dtype=compute_dtype) for _ in range(PAPER_TENSOR_COUNT)]
    gradients = [torch.empty_like(p) for p in parameters]
    targets = [p.to(master_dtype) for p in parameters] if master_dtype else parameters
    optimizer = ZeroRedundancyOptimizer(targets, optimizer_class=torch.optim.AdamW, foreach=False)
    _meta_step(optimizer, targets)
    owned = [next(i for i, t in enumerate(targets) if t is q) for group in optimizer.optim.param_groups for q in group["params"]]
    owned_masters = [targets[i] for i in owned] if master_dtype else []
    kept_gradients = [gradients[i] for i in owned] if shard_gradients else gradients
    optimizer_bytes = distinct_storage_bytes(owned_masters) + distinct_storage_bytes(_optimizer_state_tensors(optimizer.optim))
    return [distinct_storage_bytes(parameters), distinct_storage_bytes(kept_gradients), optimizer_bytes]


def _fully_sharded_state(compute_dtype: torch.dtype, master_dtype: torch.dtype | None) -> list[int]:
    from torch.distributed.fsdp import fully_shard

    with torch.device("meta"):
        rows, columns = PAPER_TENSOR_SHAPE
        model = nn.Sequential(*[nn.Linear(columns, rows, bias=False, dtype=compute_dtype) for _ in range(PAPER_TENSOR_COUNT)])
    mesh = _cpu_mesh()
    for layer in model:
        fully_shard(layer, mesh=mesh)
    parameters = list(model.parameters())  # DTensors: the rank's shard, padded to ⌈rows/N⌉
    gradients = [torch.empty_like(p) for p in parameters]  # FSDP's reduce-scattered gradient has the parameter's sharding
    targets = [p.detach().to(master_dtype) for p in parameters] if master_dtype else parameters
    optimizer = torch.optim.AdamW(targets, foreach=False)
    _meta_step(optimizer, targets)
    masters = targets if master_dtype else []
    optimizer_bytes = distinct_storage_bytes(masters) + distinct_storage_bytes(_optimizer_state_tensors(optimizer))
    return [distinct_storage_bytes(parameters), distinct_storage_bytes(gradients), optimizer_bytes]


def _paper_scale_state(world_size: int, rank: int, recipe: str, stages: Sequence[int] = _STAGES, stand_in_broadcasts: bool = False) -> dict[int, list[int]]:
    """``stand_in_broadcasts``: a meta broadcast returns as the fake group's does even where torch runs it (else only where
    torch cannot: :mod:`resacct.measurement.fake_group_broadcast`)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from resacct.measurement.fake_group_broadcast import meta_broadcasts_as_the_fake_group_does

    compute_dtype, master_dtype = _PAPER_DTYPES[recipe]
    measure = {0: lambda: _unsharded_state(compute_dtype, master_dtype),
               1: lambda: _zero_partitioned_state(compute_dtype, master_dtype, shard_gradients=False),
               2: lambda: _zero_partitioned_state(compute_dtype, master_dtype, shard_gradients=True),
               3: lambda: _fully_sharded_state(compute_dtype, master_dtype)}
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        with meta_broadcasts_as_the_fake_group_does(force=stand_in_broadcasts):  # ZeroRedundancyOptimizer's, on torch <= 2.10
            return {stage: measure[stage]() for stage in stages}
    finally:
        dist.destroy_process_group()


def paper_scale_state_on_fake_ranks(configurations: Sequence[tuple[int, int, str, tuple[int, ...]]],
                                    stand_in_broadcasts: bool = False) -> list[dict[int, list[int]]]:
    """In a child process, for each (world size, rank, recipe, ZeRO stages): the bytes [parameters,
    gradients, optimizer state] that rank holds at each of those stages for the 7.5B meta state.
    ``stand_in_broadcasts``: see :func:`_paper_scale_state` (the test beside torch's own path)."""
    try:
        import torch.testing._internal.distributed.fake_pg  # noqa: F401 - registers the "fake" backend
    except ImportError as error:  # an internal module: it may move between torch versions
        raise DistributedUnavailableError(f"torch's fake process group is not importable here: {error}") from None
    return [_paper_scale_state(world_size, rank, recipe, stages, stand_in_broadcasts) for world_size, rank, recipe, stages in configurations]


#: The configurations the claims use, measured together in one child process: (world size, recipe, the ZeRO
#: stages the claims read). On one rank they read stage 0 only (the state per parameter, nothing sharded).
PAPER_SCALE_CONFIGURATIONS = ((1, "fp32-adamw", (0,)), (1, "mixed-adam", (0,)), (8, "fp32-adamw", _STAGES), (64, "mixed-adam", _STAGES))


def paper_scale_configurations(world_size: int, recipe: str, stages: Sequence[int] = _STAGES) -> tuple[tuple[int, str, tuple[int, ...]], ...]:
    """What the child that measures ``stages`` of (``world_size``, ``recipe``) measures: every configuration of
    :data:`PAPER_SCALE_CONFIGURATIONS` when one of them reads those stages, else that one alone, every stage."""
    if not stages or any(stage not in _STAGES for stage in stages):
        raise ResacctError(f"stages {stages!r}: expected ZeRO stages among {_STAGES}")
    covered = any((size, name) == (world_size, recipe) and set(stages) <= set(read) for size, name, read in PAPER_SCALE_CONFIGURATIONS)
    return PAPER_SCALE_CONFIGURATIONS if covered else ((world_size, recipe, _STAGES),)


def paper_scale_measurements(world_size: int, recipe: str, stages: Sequence[int] = _STAGES) -> dict[int, list[int]]:
    """Per stage of ``stages``, the element-wise largest [parameters, gradients, optimizer state] bytes over
    the first and the last rank (rank 0 gets the full ⌈rows/N⌉ rows and the first pick).
    A configuration of :data:`PAPER_SCALE_CONFIGURATIONS` is measured with all of them, in one child."""
    _require_sharding_engines()
    if recipe not in _PAPER_DTYPES:
        raise NotMeasurable(f"recipe {recipe!r} has no paper-scale construction (known: {sorted(_PAPER_DTYPES)})")
    configurations = paper_scale_configurations(world_size, recipe, stages)
    read = next(configuration for configuration in configurations
                if configuration[:2] == (world_size, recipe) and set(stages) <= set(configuration[2]))
    return _paper_scale_launch(configurations)[read]


def _paper_scale_runs(configurations: tuple[tuple[int, str, tuple[int, ...]], ...]) -> tuple[tuple[int, int, str, tuple[int, ...]], ...]:
    """(world size, rank, recipe, stages) of each child run that measures ``configurations``: the first and the last rank."""
    return tuple((size, rank, name, stages) for size, name, stages in configurations for rank in sorted({0, size - 1}))


@shared_measurement(switchable=False)
def _paper_scale_launch(configurations: tuple[tuple[int, str, tuple[int, ...]], ...]) -> dict[tuple[int, str, tuple[int, ...]], dict[int, list[int]]]:
    _require_sharding_engines()
    runs = _paper_scale_runs(configurations)
    try:  # or the child a planned gloo launch ran beside its ranks (resacct.measurement.rank_jobs)
        with shared_started_isolated(paper_scale_state_on_fake_ranks, runs, timeout_seconds=_LAUNCH_TIMEOUT_SECONDS) as started:
            reports = started()
    except DistributedError as error:
        if isinstance(error, DistributedUnavailableError) or "fake process group is not importable" in str(error):
            raise NotMeasurable(str(error).splitlines()[0]) from None
        if "with Meta tensors" in str(error):  # a collective other than the broadcast stood in for on torch <= 2.10
            raise NotMeasurable(f"torch {torch.__version__} cannot run collectives on meta tensors under the fake "
                                f"process group: {str(error).splitlines()[0][:160]}") from None
        raise
    measured = {}
    for configuration in configurations:
        mine = [report for (size, _, name, stages), report in zip(runs, reports) if (size, name, stages) == configuration]
        measured[configuration] = {stage: [max(report[stage][piece] for report in mine) for piece in range(3)] for stage in configuration[2]}
    return measured
