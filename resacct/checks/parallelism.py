"""Measuring activation memory of a transformer layer against Korthikanti et al. 2022.

The layer is Megatron's (Korthikanti et al. 2022, Figure 2): LayerNorm → QKV → QKᵀ → causal
mask → softmax → dropout → ·V → projection → dropout → residual → LayerNorm → h→4h → GELU →
4h→h → dropout → residual, in bfloat16 with dropout on, activations laid out (s, b, h). What
autograd saves for its backward is recorded with ``torch.autograd.graph.saved_tensors_hooks``
(:func:`resacct.measurement.activations.record_saved_activations`, one count per storage, parameters
apart). "Selective" wraps the attention core in ``torch.utils.checkpoint`` (non-reentrant), as
Megatron's selective recomputation does.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import nn
from torch.utils.checkpoint import checkpoint

from resacct.measurement.activations import record_saved_activations
from resacct.harness.registry import Outcome, check
from resacct.formulas.parallelism import torch_layer_saved_bytes
from resacct.training.seeding import preserved_global_rng, seed_torch
from resacct.measurement.distributed import preload_in_ranks
from resacct.measurement.memo import shared_measurement
from resacct.measurement.rank_jobs import PlannedLaunch, plans_rank_jobs, shared_rank_launch

preload_in_ranks(__name__)  # the module of what the tensor-parallel ranks run


class MegatronLayer(nn.Module):
    """One GPT layer as Korthikanti et al. count it, inputs (seq, batch, hidden)."""

    def __init__(self, hidden: int, heads: int, dropout: float, selective: bool):
        super().__init__()
        self.heads, self.dropout, self.selective = heads, dropout, selective
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv, self.proj = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
        self.fc1, self.fc2 = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

    def _core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        seq = q.shape[1]
        scores = torch.bmm(q, k.transpose(1, 2)) * q.shape[-1] ** -0.5  # (b·a, s, s)
        causal = torch.ones(seq, seq, dtype=torch.bool, device=q.device).triu(1)
        probs = F.dropout(torch.softmax(scores.masked_fill(causal, float("-inf")), dim=-1), self.dropout, self.training)
        return torch.bmm(probs, v)  # (b·a, s, d)

    def forward(self, x: Float[torch.Tensor, "seq batch hidden"]) -> Float[torch.Tensor, "seq batch hidden"]:
        seq, batch, hidden = x.shape
        width = hidden // self.heads
        q, k, v = (t.reshape(seq, batch * self.heads, width).transpose(0, 1) for t in self.qkv(self.ln1(x)).split(hidden, dim=-1))
        core = checkpoint(self._core, q, k, v, use_reentrant=False) if self.selective else self._core(q, k, v)
        context = core.transpose(0, 1).reshape(seq, batch, hidden)
        x = x + F.dropout(self.proj(context), self.dropout, self.training)
        return x + F.dropout(self.fc2(F.gelu(self.fc1(self.ln2(x)))), self.dropout, self.training)


def saved_activation_bytes(seq: int, batch: int, hidden: int, heads: int, recompute: str) -> tuple[int, int, int]:
    """(activation bytes, LayerNorm-statistics bytes, causal-mask bytes) autograd saved in one
    forward of a bfloat16 MegatronLayer on the CPU."""
    with preserved_global_rng():
        seed_torch(0)
        layer = MegatronLayer(hidden, heads, dropout=0.1, selective=recompute == "selective").to(torch.bfloat16)
        x = torch.randn(seq, batch, hidden, dtype=torch.bfloat16, requires_grad=True)
        with record_saved_activations(layer) as saved:
            layer(x)
    activations = [entry for entry in saved.entries if not entry.is_parameter]
    statistics = sum(entry.bytes for entry in activations if entry.module in ("ln1", "ln2") and entry.shape[-1] == 1)
    mask = sum(entry.bytes for entry in activations if entry.dtype == "bool")
    return saved.activation_bytes, statistics, mask


@check("parallelism.layer_saved_bytes", evidence="measured", quantities=("layernorm_statistics_bytes", "causal_mask_bytes"))
def layer_saved_bytes(seq: int, batch: int, hidden: int, heads: int, recompute: str = "none") -> Outcome:
    """Bytes a bfloat16 Megatron-style layer saves for backward (saved-tensor hooks, CPU);
    resacct predicts it with Korthikanti's terms plus what eager PyTorch adds (2-byte dropout
    masks on the CPU, LayerNorm statistics, the causal mask)."""
    measured, statistics, mask = saved_activation_bytes(seq, batch, hidden, heads, recompute)
    predicted = torch_layer_saved_bytes(seq, batch, hidden, heads, recompute=recompute, dropout_mask_bytes=2,
                                        layernorm_statistic_bytes=2, causal_mask_bytes=1)
    return Outcome(measured=measured, predicted=predicted, quantities={"layernorm_statistics_bytes": statistics, "causal_mask_bytes": mask})


class TensorParallelLayer(nn.Module):
    """The same layer with separate Q, K, V projections, so that Megatron's column split
    (``ColwiseParallel``) gives each rank whole heads; projection and 4h→h are row-split."""

    def __init__(self, hidden: int, heads: int, dropout: float):
        super().__init__()
        self.width, self.dropout = hidden // heads, dropout
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.q, self.k, self.v, self.proj = (nn.Linear(hidden, hidden) for _ in range(4))
        self.fc1, self.fc2 = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

    def forward(self, x: Float[torch.Tensor, "seq batch hidden"]) -> Float[torch.Tensor, "seq batch hidden"]:
        normed = self.ln1(x)  # x: (s, b, h), or (s/t, b, h) under sequence parallelism
        q, k, v = (projection(normed) for projection in (self.q, self.k, self.v))  # (s, b, h/t) on each rank
        seq, batch, local_heads = q.shape[0], q.shape[1], q.shape[-1] // self.width
        q, k, v = (t.reshape(seq, batch * local_heads, self.width).transpose(0, 1) for t in (q, k, v))
        scores = torch.bmm(q, k.transpose(1, 2)) * self.width ** -0.5
        causal = torch.ones(seq, seq, dtype=torch.bool).triu(1)
        probs = F.dropout(torch.softmax(scores.masked_fill(causal, float("-inf")), dim=-1), self.dropout, self.training)
        context = torch.bmm(probs, v).transpose(0, 1).reshape(seq, batch, local_heads * self.width)
        x = x + F.dropout(self.proj(context), self.dropout, self.training)
        return x + F.dropout(self.fc2(F.gelu(self.fc1(self.ln2(x)))), self.dropout, self.training)


def _dtensor_module():  # type: ignore[no-untyped-def]
    """``torch.distributed.tensor``, public from torch 2.5; torch 2.4 has the same classes
    (``DTensor``, ``Shard``) only under ``torch.distributed._tensor``."""
    try:
        import torch.distributed.tensor as dtensor

        dtensor.Shard  # noqa: B018 -- torch 2.4's torch.distributed.tensor is only the parallel package's parent
    except (ImportError, AttributeError):
        import torch.distributed._tensor as dtensor
    return dtensor


def _unwrapped(tensor: torch.Tensor) -> torch.Tensor:
    """The plain tensor holding a DTensor's local shard (or a functional collective's result)."""
    DTensor = _dtensor_module().DTensor

    while True:
        if isinstance(tensor, DTensor):
            tensor = tensor._local_tensor
        elif isinstance(getattr(tensor, "elem", None), torch.Tensor):  # AsyncCollectiveTensor
            tensor = tensor.elem
        else:
            return tensor


def tensor_parallel_saved_bytes_on_rank(rank: int, world_size: int, seq: int, batch: int, hidden: int, heads: int,
                                        sequence_parallel: bool = False) -> int:
    """On one gloo rank: parallelize the layer over all ranks with DTensor (``parallelize_module``:
    Q, K, V, h→4h column-split, projection and 4h→h row-split), run one forward and return the
    bytes of the distinct local storages autograd saved (DTensors unwrapped to their local
    shard; parameters apart)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module

    Shard = _dtensor_module().Shard
    seed_torch(0)
    layer = TensorParallelLayer(hidden, heads, dropout=0.1).to(torch.bfloat16)
    if sequence_parallel:  # LayerNorms on sequence shards; column-parallel inputs all-gathered, row-parallel outputs reduce-scattered
        column, row = ColwiseParallel(input_layouts=Shard(0)), RowwiseParallel(output_layouts=Shard(0))
        plan = {"ln1": SequenceParallel(sequence_dim=0), "ln2": SequenceParallel(sequence_dim=0)}
    else:
        column, row, plan = ColwiseParallel(), RowwiseParallel(), {}
    plan.update({"q": column, "k": column, "v": column, "proj": row, "fc1": column, "fc2": row})
    parallelize_module(layer, init_device_mesh("cpu", (world_size,)), plan)
    local = _unwrapped

    parameters = {local(p).untyped_storage().data_ptr() for p in layer.parameters()}
    saved: list[torch.Tensor] = []
    x = torch.randn(seq // world_size if sequence_parallel else seq, batch, hidden, dtype=torch.bfloat16, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        layer(x)
    storages = {}
    for tensor in saved:
        storage = local(tensor).untyped_storage()
        if storage.data_ptr() not in parameters:
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


_TENSOR_PARALLEL_TIMEOUT_SECONDS = 120.0


@shared_measurement(switchable=False)
def _tensor_parallel_saved_bytes_per_rank(seq: int, batch: int, hidden: int, heads: int, tensor_parallel: int, sequence_parallel: bool) -> tuple[int, ...]:
    """:func:`tensor_parallel_saved_bytes_on_rank` on ``tensor_parallel`` gloo ranks, once per layer and
    layout in a process: the claims that ask the same (the Korthikanti term, eager PyTorch's) share one launch."""
    return tuple(shared_rank_launch(tensor_parallel_saved_bytes_on_rank, tensor_parallel, seq, batch, hidden, heads, sequence_parallel,
                                    timeout_seconds=_TENSOR_PARALLEL_TIMEOUT_SECONDS))


@plans_rank_jobs("parallelism.tensor_parallel_layer_saved_bytes")
def _planned_tensor_parallel_launch(seq: int, batch: int, hidden: int, heads: int, tensor_parallel: int = 2,
                                    sequence_parallel: bool = False) -> list[PlannedLaunch]:
    """The launch :func:`tensor_parallel_layer_saved_bytes` asks for with these inputs."""
    return [PlannedLaunch(tensor_parallel, tensor_parallel_saved_bytes_on_rank, (seq, batch, hidden, heads, sequence_parallel),
                          _TENSOR_PARALLEL_TIMEOUT_SECONDS)]


@check("parallelism.tensor_parallel_layer_saved_bytes", evidence="measured", quantities=("min_rank_bytes",))
def tensor_parallel_layer_saved_bytes(seq: int, batch: int, hidden: int, heads: int, tensor_parallel: int = 2,
                                      sequence_parallel: bool = False) -> Outcome:
    """Bytes one rank of a ``tensor_parallel``-way DTensor layer (gloo, CPU, bfloat16, dropout
    on) saves for backward: the largest over the ranks (``min_rank_bytes`` the smallest);
    resacct predicts it with Korthikanti's tensor-parallel terms plus eager PyTorch's extras."""
    per_rank = _tensor_parallel_saved_bytes_per_rank(seq, batch, hidden, heads, tensor_parallel, sequence_parallel)
    # with sequence parallelism, DTensor keeps each column-parallel linear's all-gathered input
    # whole: Q, K and V gather separately (3), h→4h once (1)
    predicted = torch_layer_saved_bytes(seq, batch, hidden, heads, tensor_parallel=tensor_parallel, sequence_parallel=sequence_parallel,
                                        gathered_inputs_kept=4 if sequence_parallel else 0, dropout_mask_bytes=2,
                                        layernorm_statistic_bytes=2, causal_mask_bytes=1)
    return Outcome(measured=max(per_rank), predicted=predicted, quantities={"min_rank_bytes": min(per_rank)})


# ───────────────────────── full recomputation: resacct's GPT, every layer checkpointed ─────────────────────────


def _bf16_gpt(layers: int, seq: int, batch: int, heads: int, head_dim: int, vocab: int) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """resacct's GPT in bfloat16 (seeded), with token ids and targets of one (batch, seq) step."""
    from resacct.training.gpt import GPT, GPTConfig

    config = GPTConfig(vocab_size=vocab, context_length=seq, n_layers=layers, n_heads=heads, d_model=heads * head_dim)
    seed_torch(0)
    return GPT(config).to(torch.bfloat16), torch.randint(0, vocab, (batch, seq)), torch.randint(0, vocab, (batch, seq))


def full_recompute_census(layers: int, seq: int, batch: int, heads: int, head_dim: int, vocab: int) -> dict[str, int]:
    """What autograd keeps for backward in one bfloat16 GPT forward + loss (CPU), seen
    by saved-tensor hooks outside ``torch.utils.checkpoint`` (one count per storage):

    - ``full_bytes``: every layer under ``checkpoint(use_reentrant=False)``. Inside a segment
      checkpoint's own hooks replace each saved tensor by a placeholder; what it really keeps
      — the segment's input, saved by its ``_NoopSaveInputs`` node before its hooks go on —
      passes through the outer hooks and is counted here;
    - ``layer_input_bytes``: the part of it saved outside every module (the checkpoints' inputs);
    - ``outside_bytes``: what the same model saves outside its layers without recomputation
      (embeddings, final norm, LM head, loss), attributed by module.
    """
    from resacct.measurement.activation_checkpointing import gpt_loss

    with preserved_global_rng():
        model, tokens, targets = _bf16_gpt(layers, seq, batch, heads, head_dim, vocab)
        with record_saved_activations(model) as plain:
            gpt_loss(model, tokens, targets)
        with record_saved_activations(model) as full:
            gpt_loss(model, tokens, targets, checkpoint_segments=layers)
    plain_activations = [entry for entry in plain.entries if not entry.is_parameter]
    full_activations = [entry for entry in full.entries if not entry.is_parameter]
    return {
        "full_bytes": full.activation_bytes,
        "layer_input_bytes": sum(entry.bytes for entry in full_activations if entry.module == "(model)"),
        "outside_bytes": sum(entry.bytes for entry in plain_activations if not entry.module.startswith("blocks.")),
    }


@check("parallelism.full_recompute_saved_bytes", evidence="measured", quantities=("outside_bytes", "layer_input_bytes"))
def full_recompute_saved_bytes(layers: int, seq: int, batch: int, heads: int, head_dim: int, vocab: int = 64) -> Outcome:
    """Bytes a bfloat16 GPT keeps for backward with every layer checkpointed
    (:func:`full_recompute_census`); resacct predicts L × Korthikanti's full-recomputation bytes
    per layer plus its own count of what lies outside the layers."""
    from resacct.training.gpt import GPTConfig
    from resacct.formulas.gpt_formulas import gpt_outside_layers_saved_bytes
    from resacct.formulas.parallelism import activation_bytes_per_layer

    census = full_recompute_census(layers, seq, batch, heads, head_dim, vocab)
    hidden = heads * head_dim
    config = GPTConfig(vocab_size=vocab, context_length=seq, n_layers=layers, n_heads=heads, d_model=hidden)
    predicted = (layers * activation_bytes_per_layer(seq, batch, hidden, heads, recompute="full")
                 + gpt_outside_layers_saved_bytes(config, batch, seq, element_bytes=2))
    return Outcome(measured=census["full_bytes"], predicted=predicted,
                   quantities={"outside_bytes": census["outside_bytes"], "layer_input_bytes": census["layer_input_bytes"]})


@check("parallelism.full_recompute_held_bytes", evidence="measured", quantities=("saved_bytes", "rng_state_bytes"))
def full_recompute_held_bytes(layers: int, seq: int, batch: int, heads: int, head_dim: int, vocab: int = 64) -> Outcome:
    """Bytes the CPU allocator holds after a bfloat16 GPT forward + loss with every
    layer checkpointed, above what existed before it (``torch.profiler`` memory events: every
    allocation, whether autograd's hooks see it or not); ``saved_bytes`` is the saved-tensor
    census of the same forward, ``rng_state_bytes`` the size of ``torch.get_rng_state()``.
    resacct predicts it with :func:`resacct.measurement.activation_checkpointing.predict_gpt_held_after_forward_bytes`."""
    from resacct.measurement.activation_checkpointing import gpt_loss, predict_gpt_held_after_forward_bytes
    from resacct.measurement.activation_recording import trace_allocations

    census = full_recompute_census(layers, seq, batch, heads, head_dim, vocab)
    with preserved_global_rng():
        model, tokens, targets = _bf16_gpt(layers, seq, batch, heads, head_dim, vocab)
        with trace_allocations() as trace:
            loss = gpt_loss(model, tokens, targets, checkpoint_segments=layers)
        del loss
    predicted = predict_gpt_held_after_forward_bytes(model.config, batch, seq, layers, element_bytes=2)
    return Outcome(measured=trace.end_bytes, predicted=predicted,
                   quantities={"saved_bytes": census["full_bytes"], "rng_state_bytes": torch.get_rng_state().numel()})


# ─────────── the ZeRO paper's estimate (Rajbhandari et al. 2020, §3.2 footnote 3 and §8) beside torch ───────────


def gpt_layers_saved_bytes(layers: int, seq: int, batch: int, heads: int, head_dim: int, vocab: int) -> dict[str, int]:
    """What autograd keeps for backward in one bfloat16 GPT forward + loss on the CPU without
    recomputation (saved-tensor hooks, one count per storage, parameters apart): ``layers_bytes``
    saved inside the transformer layers (``blocks.*``), ``whole_model_bytes`` everything."""
    from resacct.measurement.activation_checkpointing import gpt_loss

    with preserved_global_rng():
        model, tokens, targets = _bf16_gpt(layers, seq, batch, heads, head_dim, vocab)
        with record_saved_activations(model) as saved:
            gpt_loss(model, tokens, targets)
    activations = [entry for entry in saved.entries if not entry.is_parameter]
    return {"layers_bytes": sum(entry.bytes for entry in activations if entry.module.startswith("blocks.")),
            "whole_model_bytes": saved.activation_bytes}


@check("parallelism.zero_paper_gpt_saved_bytes", evidence="measured", quantities=("whole_model_bytes", "zero_paper_bytes"))
def zero_paper_gpt_saved_bytes(layers: int, seq: int, batch: int, heads: int, head_dim: int, vocab: int = 64,
                               recompute: str = "none") -> Outcome:
    """Bytes resacct's bfloat16 GPT keeps for backward on the CPU, where the ZeRO paper estimates
    it: with ``recompute="none"`` what its layers save (resacct predicts L × its per-layer count,
    :func:`resacct.formulas.gpt_formulas.gpt_layer_saved_bytes`); with ``"full"`` (every layer under
    ``checkpoint``) the checkpoints' inputs (resacct predicts L × Korthikanti's sbh·2).
    ``whole_model_bytes``: everything the forward + loss keeps; ``zero_paper_bytes``:
    :func:`resacct.formulas.parallelism.zero_paper_activation_bytes` for the same model."""
    from resacct.errors import ResacctError
    from resacct.formulas.gpt_formulas import gpt_layer_saved_bytes
    from resacct.formulas.parallelism import activation_bytes_per_layer, zero_paper_activation_bytes
    from resacct.training.gpt import GPTConfig

    hidden = heads * head_dim
    zero = zero_paper_activation_bytes(layers, seq, batch, hidden, recompute=recompute)
    if recompute == "full":
        census = full_recompute_census(layers, seq, batch, heads, head_dim, vocab)
        measured, whole = census["layer_input_bytes"], census["full_bytes"]
        predicted = layers * activation_bytes_per_layer(seq, batch, hidden, heads, recompute="full")
    elif recompute == "none":
        saved = gpt_layers_saved_bytes(layers, seq, batch, heads, head_dim, vocab)
        measured, whole = saved["layers_bytes"], saved["whole_model_bytes"]
        config = GPTConfig(vocab_size=vocab, context_length=seq, n_layers=layers, n_heads=heads, d_model=hidden)
        predicted = layers * gpt_layer_saved_bytes(config, batch, seq, element_bytes=2)
    else:
        raise ResacctError(f"recompute is {recompute!r}; the ZeRO paper estimates none (§3.2) and full (§8) only")
    return Outcome(measured=measured, predicted=predicted, quantities={"whole_model_bytes": whole, "zero_paper_bytes": zero})


@check("parallelism.zero_paper_estimate", evidence="arithmetic")
def zero_paper_estimate(layers: int, seq: int, batch: int, hidden: int, element_bytes: int, recompute: str = "none") -> Outcome:
    """The ZeRO paper's activation estimate for a shape it prints, as plain arithmetic over the
    inputs — 12·h·b·s·L values (1·h·b·s·L, the layer inputs, with ``recompute="full"``) of
    ``element_bytes`` each — against :func:`resacct.formulas.parallelism.zero_paper_activation_bytes`."""
    from resacct.formulas.parallelism import zero_paper_activation_bytes

    values = (1 if recompute == "full" else 12) * hidden * batch * seq * layers
    return Outcome(measured=values * element_bytes,
                   predicted=zero_paper_activation_bytes(layers, seq, batch, hidden, recompute=recompute, element_bytes=element_bytes))
