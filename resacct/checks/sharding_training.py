"""The program the sharding claims' gloo ranks run (:mod:`resacct.checks.sharding_runs` launches it): tiny
models trained for real with ``DistributedDataParallel`` + ``ZeroRedundancyOptimizer`` (ZeRO-1) and FSDP2
``fully_shard`` (ZeRO-3; also computing in bf16), each against the same model trained in one process, and
FSDP2's parameters between forward and backward. A launch measures only the parts its claims read
(:data:`LAUNCH_PARTS`); each rank reports the bytes of the storages behind its parameters, gradients and
optimizer state (deduplicated by storage), which tensors its optimizer owns, and how far its parameters
are from the single-process ones.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from jaxtyping import Float, Shaped
from torch import nn

from resacct.errors import ResacctError
from resacct.measurement.distributed import preload_in_ranks
from resacct.measurement.memory import distinct_storage_bytes
from resacct.training.seeding import seed_torch

preload_in_ranks(__name__)  # the module of what the ranks run

__all__ = ["sharded_training_on_rank", "MODEL_KINDS", "PIECES", "LAUNCH_PARTS", "TRAINING_STEPS"]

LEARNING_RATE = 1e-2
WEIGHT_DECAY = 0.01
GLOBAL_BATCH = 8
TRAINING_STEPS = 3
#: Tiny models: ``balanced`` has equal tensors whose rows divide by 2 and 4 (sharding is
#: exactly 1/N); ``uneven`` has biases and a 5-row output (partition and padding show).
MODEL_KINDS = ("balanced", "uneven")
#: What a rank measures of a model: ZeRO-1 and FSDP2 trained (their state and the difference from one process
#: trained alike; FSDP2's also the parameters it holds between the first forward and backward, resharded),
#: FSDP2 computing in bf16 (its state), FSDP2 keeping its parameters gathered after forward
#: (``reshard_after_forward=False``: what it holds between forward and backward).
PIECES = ("zero1", "fsdp2", "fsdp2_bf16", "after_forward")
#: The parts (kind, piece, training steps) one launch measures, per world size: what sharding.claims.yaml's claims
#: read. The state claims read the bytes held after a step, the same after each (the first step allocates the
#: optimizer state): one step; the matching claims read the difference from one process after TRAINING_STEPS.
#: A check asking for a part not listed adds it to its launch; other world sizes measure every part.
LAUNCH_PARTS = {
    2: (("balanced", "zero1", 1), ("balanced", "fsdp2", 1), ("uneven", "zero1", TRAINING_STEPS), ("uneven", "fsdp2", TRAINING_STEPS)),
    4: (("balanced", "zero1", 1), ("balanced", "fsdp2", 1), ("balanced", "fsdp2_bf16", 1), ("balanced", "after_forward", 0),
        ("uneven", "zero1", TRAINING_STEPS), ("uneven", "fsdp2", TRAINING_STEPS)),
}
_EVERY_PART = tuple((kind, piece, 0 if piece == "after_forward" else TRAINING_STEPS) for kind in MODEL_KINDS for piece in PIECES)


# --- what a rank holds -------------------------------------------------------------------


def _optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> list[Shaped[torch.Tensor, "..."]]:
    return [value for state in optimizer.state.values() for value in state.values() if isinstance(value, torch.Tensor)]


# --- tiny models, trained for real on gloo ranks --------------------------------------------


def _model(kind: str) -> nn.Sequential:
    seed_torch(0)
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


def _train(model: nn.Module, optimizer: Any, inputs: Float[torch.Tensor, "batch inputs"], targets: Float[torch.Tensor, "batch outputs"],
           steps: int, after_first_forward: Callable[[], None] | None = None) -> None:
    for step in range(steps):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(inputs), targets)
        if step == 0 and after_first_forward is not None:
            after_first_forward()
        loss.backward()
        optimizer.step()


def _single_process_parameters(kind: str, steps: int) -> list[Float[torch.Tensor, "..."]]:
    model = _model(kind)
    _train(model, _adamw(model.parameters()), *_batch(model), steps)
    return [parameter.detach() for parameter in model.parameters()]


def _max_abs_difference(parameters: Sequence[Float[torch.Tensor, "..."]], reference: Sequence[Float[torch.Tensor, "..."]]) -> float:
    return max(float((parameter.detach() - expected).abs().max()) for parameter, expected in zip(parameters, reference))


def _rank_slice(rank: int, world_size: int) -> slice:
    per_rank = GLOBAL_BATCH // world_size
    return slice(rank * per_rank, (rank + 1) * per_rank)


def _zero1(kind: str, rank: int, world_size: int, reference: Sequence[Float[torch.Tensor, "..."]], steps: int) -> dict[str, Any]:
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    model = _model(kind)
    inputs, targets = _batch(model)
    replicated = DistributedDataParallel(model, gradient_as_bucket_view=True)
    optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY)
    local = _rank_slice(rank, world_size)
    _train(replicated, optimizer, inputs[local], targets[local], steps)
    parameters = list(model.parameters())
    owned = [next(i for i, p in enumerate(parameters) if p is q) for group in optimizer.optim.param_groups for q in group["params"]]
    return {
        "parameters_bytes": distinct_storage_bytes(parameters),
        "gradients_bytes": distinct_storage_bytes([p.grad for p in parameters if p.grad is not None]),
        "optimizer_state_bytes": distinct_storage_bytes(_optimizer_state_tensors(optimizer.optim)),
        "owned_parameter_indices": owned,
        "max_abs_difference": _max_abs_difference(parameters, reference),
        "training_steps": steps,
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


def _fsdp2(kind: str, rank: int, world_size: int, reference: Sequence[Float[torch.Tensor, "..."]] | None, steps: int,
           compute_dtype: torch.dtype | None = None) -> dict[str, Any]:
    """FSDP2 training; with ``compute_dtype`` under ``MixedPrecisionPolicy(param_dtype=...)``
    (then no comparison with the fp32 reference)."""
    model = _model(kind)
    inputs, targets = _batch(model)
    _fully_shard_linears(model, reshard_after_forward=True, compute_dtype=compute_dtype)
    optimizer = _adamw(model.parameters())
    local, held = _rank_slice(rank, world_size), []
    _train(model, optimizer, inputs[local], targets[local], steps, lambda: held.append(distinct_storage_bytes(list(model.parameters()))))
    parameters = list(model.parameters())
    gradients = [p.grad for p in parameters if p.grad is not None]
    report = {
        "parameters_bytes": distinct_storage_bytes(parameters),
        "gradients_bytes": distinct_storage_bytes(gradients),
        "optimizer_state_bytes": distinct_storage_bytes(_optimizer_state_tensors(optimizer)),
        "local_parameter_numels": [(p.to_local() if hasattr(p, "to_local") else p).numel() for p in parameters],
        "dtypes": sorted({str(t.dtype).removeprefix("torch.") for t in parameters + gradients}),
        "training_steps": steps,
        "parameters_bytes_after_forward": held[0],  # between the first forward and its backward, resharded (ZeRO-3)
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


def _measured_part(rank: int, world_size: int, kind: str, piece: str, steps: int,
                   references: dict[tuple[str, int], list[Float[torch.Tensor, "..."]]]) -> dict[str, Any]:
    if piece == "after_forward":  # resharded after forward: the fsdp2 piece's training holds its shards then (ZeRO-3)
        return {"kept": _parameter_bytes_after_forward(kind, reshard_after_forward=False)}
    if piece == "fsdp2_bf16":  # FSDP2's bf16 mixed precision fails on CPU in some torch versions (2.8: "Found dtype
        try:  # Float but expected BFloat16"); that must not cost the other engines
            return _fsdp2(kind, rank, world_size, None, steps, compute_dtype=torch.bfloat16)
        except RuntimeError as error:
            return {"unavailable": f"{type(error).__name__}: {str(error).strip().splitlines()[0]}"}
    if (kind, steps) not in references:
        references[(kind, steps)] = _single_process_parameters(kind, steps)
    return (_zero1 if piece == "zero1" else _fsdp2)(kind, rank, world_size, references[(kind, steps)], steps)


def sharded_training_on_rank(rank: int, world_size: int, parts: Sequence[tuple[str, str, int]] = _EVERY_PART) -> list[dict[str, Any]]:
    """The program each gloo rank runs: per part (model kind, piece of :data:`PIECES`, training steps), in
    order (bf16 last: where it fails, it fails after the others), ZeRO-1 or FSDP2 after real AdamW steps
    (against one process after as many), FSDP2 in bf16, or FSDP2's parameters between forward and backward."""
    _check_parts(parts)
    references: dict[tuple[str, int], list[Float[torch.Tensor, "..."]]] = {}
    order = sorted(range(len(parts)), key=lambda index: parts[index][1] == "fsdp2_bf16")
    results: dict[int, dict[str, Any]] = {index: _measured_part(rank, world_size, *parts[index], references) for index in order}
    return [results[index] for index in range(len(parts))]


def _check_parts(parts: Sequence[tuple[str, str, int]]) -> None:
    for part in parts:
        kind, piece, steps = part if isinstance(part, tuple) and len(part) == 3 else (None, None, None)
        if kind not in MODEL_KINDS or piece not in PIECES or isinstance(steps, bool) or not isinstance(steps, int) or steps < (piece != "after_forward"):
            raise ResacctError(f"part {part!r}: expected (a model kind of {MODEL_KINDS}, a piece of {PIECES}, training steps ≥ 1, or 0 for after_forward)")
