"""Measuring sharded training memory on torch's real engines — never a simulation of them.

Two scales, both in child processes (this process never joins a process group):

* **Gloo ranks, real training** (:func:`sharded_training_on_rank`, N = 2 and 4 local
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

Results are cached per configuration, so the claims of one world size share one launch. The
claims' checks, which compare these measurements with :mod:`resacct.formulas.sharding`'s formulas, are in
:mod:`resacct.checks.sharding` (which re-exports the names here).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from jaxtyping import Float, Shaped
from torch import nn

from resacct.measurement.distributed import DistributedError, DistributedUnavailableError, preload_in_ranks
from resacct.measurement.memo import shared_measurement
from resacct.measurement.rank_jobs import shared_rank_launch, shared_started_isolated
from resacct.measurement.memory import distinct_storage_bytes
from resacct.harness.registry import NotMeasurable

preload_in_ranks(__name__)  # the module of what the ranks run

__all__ = [
    "sharded_training_on_rank",
    "paper_scale_state_on_fake_ranks",
    "small_scale_measurements",
    "paper_scale_measurements",
    "MODEL_KINDS",
    "PAPER_TENSOR_SHAPE",
    "PAPER_TENSOR_COUNT",
]

LEARNING_RATE = 1e-2
WEIGHT_DECAY = 0.01
GLOBAL_BATCH = 8
TRAINING_STEPS = 3
#: Tiny models: ``balanced`` has equal tensors whose rows divide by 2 and 4 (sharding is
#: exactly 1/N); ``uneven`` has biases and a 5-row output (partition and padding show).
MODEL_KINDS = ("balanced", "uneven")
#: The paper-scale state: 64 tensors of 9375 × 12500 = 7.5e9 parameters (the ZeRO paper's Ψ).
PAPER_TENSOR_SHAPE = (9375, 12500)
PAPER_TENSOR_COUNT = 64
_LAUNCH_TIMEOUT_SECONDS = 90.0


# --- what a rank holds -------------------------------------------------------------------


def _optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> list[Shaped[torch.Tensor, "..."]]:
    return [value for state in optimizer.state.values() for value in state.values() if isinstance(value, torch.Tensor)]


# --- tiny models, trained for real on gloo ranks --------------------------------------------


def _model(kind: str) -> nn.Sequential:
    torch.manual_seed(0)
    if kind == "balanced":
        layers: list[nn.Module] = []
        for _ in range(8):
            layers += [nn.Linear(32, 32, bias=False), nn.Tanh()]
        return nn.Sequential(*layers[:-1])
    if kind == "uneven":
        return nn.Sequential(nn.Linear(12, 40), nn.Tanh(), nn.Linear(40, 24), nn.Tanh(), nn.Linear(24, 5))
    raise ValueError(f"model kind {kind!r}: expected one of {MODEL_KINDS}")


def _batch(model: nn.Sequential) -> tuple[Float[torch.Tensor, "batch inputs"], Float[torch.Tensor, "batch outputs"]]:
    linears = [module for module in model if isinstance(module, nn.Linear)]
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(GLOBAL_BATCH, linears[0].in_features, generator=generator)
    targets = torch.randn(GLOBAL_BATCH, linears[-1].out_features, generator=generator)
    return inputs, targets


def _adamw(parameters: Any) -> torch.optim.AdamW:
    return torch.optim.AdamW(parameters, lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY)


def _train(model: nn.Module, optimizer: Any, inputs: Float[torch.Tensor, "batch inputs"], targets: Float[torch.Tensor, "batch outputs"]) -> None:
    for _ in range(TRAINING_STEPS):
        optimizer.zero_grad()
        nn.functional.mse_loss(model(inputs), targets).backward()
        optimizer.step()


def _single_process_parameters(kind: str) -> list[Float[torch.Tensor, "..."]]:
    model = _model(kind)
    _train(model, _adamw(model.parameters()), *_batch(model))
    return [parameter.detach() for parameter in model.parameters()]


def _max_abs_difference(parameters: Sequence[Float[torch.Tensor, "..."]], reference: Sequence[Float[torch.Tensor, "..."]]) -> float:
    return max(float((parameter.detach() - expected).abs().max()) for parameter, expected in zip(parameters, reference))


def _rank_slice(rank: int, world_size: int) -> slice:
    per_rank = GLOBAL_BATCH // world_size
    return slice(rank * per_rank, (rank + 1) * per_rank)


def _zero1(kind: str, rank: int, world_size: int, reference: Sequence[Float[torch.Tensor, "..."]]) -> dict[str, Any]:
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    model = _model(kind)
    inputs, targets = _batch(model)
    replicated = DistributedDataParallel(model, gradient_as_bucket_view=True)
    optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY)
    local = _rank_slice(rank, world_size)
    _train(replicated, optimizer, inputs[local], targets[local])
    parameters = list(model.parameters())
    owned = [next(i for i, p in enumerate(parameters) if p is q) for group in optimizer.optim.param_groups for q in group["params"]]
    return {
        "parameters_bytes": distinct_storage_bytes(parameters),
        "gradients_bytes": distinct_storage_bytes([p.grad for p in parameters if p.grad is not None]),
        "optimizer_state_bytes": distinct_storage_bytes(_optimizer_state_tensors(optimizer.optim)),
        "owned_parameter_indices": owned,
        "max_abs_difference": _max_abs_difference(parameters, reference),
    }


def _cpu_mesh() -> Any:
    """The ranks as a CPU device mesh. ``fully_shard``'s default mesh is the accelerator's: on a
    GPU host it moves the parameters to cuda:0 while the gloo ranks' inputs stay on the CPU."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (dist.get_world_size(),))


def _fully_shard_linears(model: nn.Sequential, reshard_after_forward: bool, compute_dtype: torch.dtype | None = None) -> None:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy, mesh = MixedPrecisionPolicy(param_dtype=compute_dtype), _cpu_mesh()
    for module in model:
        if isinstance(module, nn.Linear):
            fully_shard(module, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=policy)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=policy)


def _fsdp2(kind: str, rank: int, world_size: int, reference: Sequence[Float[torch.Tensor, "..."]] | None,
           compute_dtype: torch.dtype | None = None) -> dict[str, Any]:
    """FSDP2 training; with ``compute_dtype`` under ``MixedPrecisionPolicy(param_dtype=...)``
    (then no comparison with the fp32 reference)."""
    model = _model(kind)
    inputs, targets = _batch(model)
    _fully_shard_linears(model, reshard_after_forward=True, compute_dtype=compute_dtype)
    optimizer = _adamw(model.parameters())
    local = _rank_slice(rank, world_size)
    _train(model, optimizer, inputs[local], targets[local])
    parameters = list(model.parameters())
    gradients = [p.grad for p in parameters if p.grad is not None]
    report = {
        "parameters_bytes": distinct_storage_bytes(parameters),
        "gradients_bytes": distinct_storage_bytes(gradients),
        "optimizer_state_bytes": distinct_storage_bytes(_optimizer_state_tensors(optimizer)),
        "local_parameter_numels": [(p.to_local() if hasattr(p, "to_local") else p).numel() for p in parameters],
        "dtypes": sorted({str(t.dtype).removeprefix("torch.") for t in parameters + gradients}),
    }
    if reference is not None:
        report["max_abs_difference"] = _max_abs_difference([p.full_tensor() for p in parameters], reference)
    return report


def _parameter_bytes_after_forward(kind: str, reshard_after_forward: bool) -> int:
    """Bytes of the parameters a rank holds between forward and backward: FSDP2 with
    ``reshard_after_forward=False`` keeps them gathered (ZeRO-2 style), ``True`` frees them
    back to the shard (ZeRO-3)."""
    model = _model(kind)
    inputs, targets = _batch(model)
    _fully_shard_linears(model, reshard_after_forward=reshard_after_forward)
    loss = nn.functional.mse_loss(model(inputs), targets)
    held = distinct_storage_bytes(list(model.parameters()))
    loss.backward()  # finish the step so FSDP's state is clean
    return held


def _training_report(rank: int, world_size: int, kind: str) -> dict[str, Any]:
    reference = _single_process_parameters(kind)
    report = {
        "zero1": _zero1(kind, rank, world_size, reference),
        "fsdp2": _fsdp2(kind, rank, world_size, reference),
        "parameters_bytes_after_forward_kept": _parameter_bytes_after_forward(kind, reshard_after_forward=False),
        "parameters_bytes_after_forward_resharded": _parameter_bytes_after_forward(kind, reshard_after_forward=True),
    }
    # Last, and isolated: FSDP2's bf16 mixed precision fails on CPU in some torch versions
    # (2.8: "Found dtype Float but expected BFloat16"); that must not cost the other engines.
    try:
        report["fsdp2_bf16"] = _fsdp2(kind, rank, world_size, None, compute_dtype=torch.bfloat16)
    except RuntimeError as error:
        report["fsdp2_bf16"] = {"unavailable": f"{type(error).__name__}: {str(error).strip().splitlines()[0]}"}
    return report


def sharded_training_on_rank(rank: int, world_size: int, kinds: Sequence[str] = MODEL_KINDS) -> dict[str, dict[str, Any]]:
    """The program each gloo rank runs, per model kind: ZeRO-1, FSDP2 (both after real
    training), FSDP2's parameters between forward and backward, against one process."""
    return {kind: _training_report(rank, world_size, kind) for kind in kinds}


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


@shared_measurement(switchable=False)
def _small_scale_launch(world_size: int) -> tuple[dict[str, dict[str, Any]], ...]:
    _require_sharding_engines()
    try:  # with the run's other launches of world_size ranks, when planned (resacct.measurement.rank_jobs)
        return tuple(shared_rank_launch(sharded_training_on_rank, world_size, MODEL_KINDS, timeout_seconds=_LAUNCH_TIMEOUT_SECONDS))
    except DistributedUnavailableError as error:
        raise NotMeasurable(str(error)) from None


def small_scale_measurements(world_size: int, kind: str) -> dict[str, Any]:
    """Every rank's report for model ``kind`` from :func:`sharded_training_on_rank`, with the
    model's parameter shapes. One launch per world size serves every kind (cached)."""
    if kind not in MODEL_KINDS:
        raise ValueError(f"model kind {kind!r}: expected one of {MODEL_KINDS}")
    ranks = _small_scale_launch(world_size)
    return {"ranks": [report[kind] for report in ranks], "shapes": _parameter_shapes(kind)}


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


def _paper_scale_state(world_size: int, rank: int, recipe: str) -> dict[int, list[int]]:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    compute_dtype, master_dtype = _PAPER_DTYPES[recipe]
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        return {
            0: _unsharded_state(compute_dtype, master_dtype),
            1: _zero_partitioned_state(compute_dtype, master_dtype, shard_gradients=False),
            2: _zero_partitioned_state(compute_dtype, master_dtype, shard_gradients=True),
            3: _fully_sharded_state(compute_dtype, master_dtype),
        }
    finally:
        dist.destroy_process_group()


def paper_scale_state_on_fake_ranks(configurations: Sequence[tuple[int, int, str]]) -> list[dict[int, list[int]]]:
    """In a child process, for each (world size, rank, recipe): the bytes [parameters,
    gradients, optimizer state] that rank holds at each ZeRO stage for the 7.5B meta state."""
    try:
        import torch.testing._internal.distributed.fake_pg  # noqa: F401 - registers the "fake" backend
    except ImportError as error:  # an internal module: it may move between torch versions
        raise DistributedUnavailableError(f"torch's fake process group is not importable here: {error}") from None
    return [_paper_scale_state(world_size, rank, recipe) for world_size, rank, recipe in configurations]


#: The configurations the claims use, measured together in one child process.
PAPER_SCALE_CONFIGURATIONS = ((1, "fp32-adamw"), (1, "mixed-adam"), (8, "fp32-adamw"), (64, "mixed-adam"))


def paper_scale_measurements(world_size: int, recipe: str) -> dict[int, list[int]]:
    """Per stage, the element-wise largest [parameters, gradients, optimizer state] bytes over
    the first and the last rank (rank 0 gets the full ⌈rows/N⌉ rows and the first pick).
    A configuration of :data:`PAPER_SCALE_CONFIGURATIONS` is measured with all of them, in one child."""
    _require_sharding_engines()
    if recipe not in _PAPER_DTYPES:
        raise NotMeasurable(f"recipe {recipe!r} has no paper-scale construction (known: {sorted(_PAPER_DTYPES)})")
    wanted = (world_size, recipe)
    return _paper_scale_launch(PAPER_SCALE_CONFIGURATIONS if wanted in PAPER_SCALE_CONFIGURATIONS else (wanted,))[wanted]


def _paper_scale_runs(configurations: tuple[tuple[int, str], ...]) -> tuple[tuple[int, int, str], ...]:
    """(world size, rank, recipe) of each child run that measures ``configurations``: the first and the last rank."""
    return tuple((size, rank, name) for size, name in configurations for rank in sorted({0, size - 1}))


@shared_measurement(switchable=False)
def _paper_scale_launch(configurations: tuple[tuple[int, str], ...]) -> dict[tuple[int, str], dict[int, list[int]]]:
    _require_sharding_engines()
    runs = _paper_scale_runs(configurations)
    try:  # or the child a planned gloo launch ran beside its ranks (resacct.measurement.rank_jobs)
        with shared_started_isolated(paper_scale_state_on_fake_ranks, runs, timeout_seconds=_LAUNCH_TIMEOUT_SECONDS) as started:
            reports = started()
    except DistributedError as error:
        if isinstance(error, DistributedUnavailableError) or "fake process group is not importable" in str(error):
            raise NotMeasurable(str(error).splitlines()[0]) from None
        if "with Meta tensors" in str(error):  # torch 2.8's fake process group cannot broadcast meta tensors
            raise NotMeasurable(f"torch {torch.__version__} cannot run collectives on meta tensors under the fake "
                                f"process group: {str(error).splitlines()[0][:160]}") from None
        raise
    measured = {}
    for size, name in configurations:
        mine = [report for (s, _, n), report in zip(runs, reports) if (s, n) == (size, name)]
        measured[(size, name)] = {stage: [max(report[stage][piece] for report in mine) for piece in range(3)] for stage in range(4)}
    return measured
