"""Does it fit? Training state + activations per GPU under a TP × PP × CP × DP × ZeRO layout,
and the largest micro-batch that fits.

Per GPU (the first pipeline stage, the busiest):

- training state: the model's parameters split over TP × PP in proportion to each stage's layers
  (N·ℓᵢ/(L·t); the embeddings on the first and last stage are not singled out), with parameters,
  gradients and optimizer state sharded over the data-parallel ranks by the ZeRO stage
  (:mod:`resacct.formulas.sharding`);
- activations: Korthikanti et al. 2022's per-layer bytes (:mod:`resacct.formulas.parallelism`), with the
  sequence split over the context-parallel ranks (the attention-core term then uses the local
  sequence squared: an underestimate for ring attention, whose local queries score every key —
  selective recomputation has no such term). With grouped-query attention (g key/value heads of
  a query heads) K and V are g/a of Korthikanti's 2sbh each: 4·sbh·(1 − g/a)/t less per layer
  (not with full recomputation, which keeps only the layer's input). Tensor parallelism must
  divide g as it divides a: Megatron-LM splits the key/value groups over the tensor-parallel
  ranks (``divide(num_query_groups, tp)``) and refuses otherwise, so plan refuses too.
- the MLP: Korthikanti's table assumes a 4h GeLU MLP (its input 2sbh, then 2 tensors 4h wide:
  16sbh/t). A model whose MLP is f wide keeps (per element in 16 bits) 2·sbf/t per f-wide tensor:
  2 for GeLU (its input, the second linear's input), **4 for SwiGLU** (gate's output = SiLU's
  input, SiLU's output, up's output, their product = down's input) — measured on a transformers
  Llama layer (``resacct/specs/plan.claims.yaml``). The plan adds the difference per layer
  (not under full recomputation); Llama-2-7B's SwiGLU (f = 2.69h) keeps 21.5sbh/t, not 16sbh/t.
- pipeline stages: ``stage_layers`` splits L layers over p stages — evenly, or unevenly as
  Megatron-LM does with ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``
  (the middle stages share the rest evenly), or as evenly as possible (the first L mod p stages one
  layer more). Under 1F1B stage i (from 0) holds p − i micro-batches in flight: ℓᵢ·(p − i) layers'
  worth of activations (L for the first stage of an even split). The plan reports the stage with
  the most bytes; the largest micro-batch is the one every stage fits.

Activations grow linearly with the micro-batch, so the largest micro-batch is a division.

>>> plan = plan_memory(parameters=70e9, layers=80, hidden=8192, heads=64, seq=4096, micro_batch=1,
...                    layout=ParallelLayout(tensor=8, pipeline=4, data=16, zero_stage=1, sequence_parallel=True),
...                    recipe="mixed-adam", recompute="selective", device_memory_bytes=80e9)
>>> round(plan.state.total_bytes / 1e9, 2), round(plan.activation_bytes / 1e9, 2), plan.fits, plan.largest_micro_batch
(10.39, 11.41, True, 6)
>>> stage_layers(70, 12)                     # as evenly as possible: ten stages of 6, two of 5
(6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 5, 5)
>>> stage_layers(126, 16, first=7, last=7)   # Megatron's first/last stage layers: 14 middle stages of 8
(7, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 7)
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from resacct.errors import ResacctError
from resacct.formulas.hf_formulas import HfArchitecture
from resacct.formulas.parallelism import ParallelLayout, first_stage_activation_bytes, pipeline_activation_factor
from resacct.formulas.validation import whole_number as _whole
from resacct.formulas.sharding import PerRankBytes, ShardingRecipe, get_sharding_recipe, per_rank_bytes

__all__ = ["MemoryPlan", "plan_memory", "megatron_parameter_count", "stage_layers", "gqa_activation_saving_bytes_per_layer",
           "mlp_activation_bytes_per_layer", "mlp_activation_extra_bytes_per_layer", "ParameterBreakdown", "parameter_breakdown"]


def megatron_parameter_count(layers: int, hidden: int, vocab: int, seq: int) -> float:
    """Parameters of a GPT, Narayanan et al. 2021 eq. 2: 12·L·h²·(1 + 13/(12h) + (V + s)/(12·L·h))."""
    # 12·L·h²·(1 + 13/(12h) + (V + s)/(12·L·h)) multiplied out, in whole numbers
    return float(12 * layers * hidden**2 + 13 * layers * hidden + (vocab + seq) * hidden)


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes on the busiest GPU of a layout, and what fits."""

    layout: ParallelLayout
    recipe: ShardingRecipe
    recompute: str
    micro_batch: int
    parameters_per_gpu: float
    state: PerRankBytes
    activation_bytes: float
    activation_bytes_per_sample: float
    device_memory_bytes: float
    reserved_bytes: float
    stage: int = 0
    stage_layers: tuple[int, ...] = ()
    micro_batch_limit: int | None = None  # the largest micro-batch every other stage fits

    @property
    def total_bytes(self) -> float:
        return self.state.total_bytes + self.activation_bytes

    @property
    def fits(self) -> bool:
        return self.total_bytes + self.reserved_bytes <= self.device_memory_bytes

    @property
    def largest_micro_batch(self) -> int:
        """The most sequences per micro-batch whose activations fit beside the state (0: none)."""
        room = self.device_memory_bytes - self.reserved_bytes - self.state.total_bytes
        own = max(0, math.floor(room / self.activation_bytes_per_sample)) if room > 0 else 0
        return own if self.micro_batch_limit is None else min(own, self.micro_batch_limit)


def _check_divides(part: int, whole: int, what: str, by: str) -> None:
    if whole % part:
        raise ResacctError(f"{what} {whole} is not divisible by {by} {part}; choose a {by} that divides it")


def stage_layers(layers: int, pipeline: int, *, first: int | None = None, last: int | None = None) -> tuple[int, ...]:
    """Layers on each of ``pipeline`` stages (see the module doc); refused when a stage would get none
    or the middle stages cannot share the rest evenly."""
    if pipeline > layers:
        raise ResacctError(f"{layers} layers over {pipeline} pipeline stages leave a stage without layers; choose a pipeline size ≤ {layers}")
    if first is None and last is None:
        base, extra = divmod(layers, pipeline)
        return tuple(base + (1 if stage < extra else 0) for stage in range(pipeline))
    if pipeline < 2:
        raise ResacctError("first/last pipeline-stage layers need a pipeline size ≥ 2")
    ends = [value for value in (first, last) if value is not None]
    if any(value < 1 for value in ends):
        raise ResacctError(f"first/last pipeline-stage layers {ends}: expected whole numbers ≥ 1")
    middle_stages = pipeline - len(ends)
    rest = layers - sum(ends)
    if middle_stages == 0 and rest != 0 or middle_stages and (rest < middle_stages or rest % middle_stages):
        raise ResacctError(f"{layers} layers with {ends} on the end stage(s) leave {rest} for {middle_stages} middle stages; "
                           "they must share them evenly (as Megatron-LM requires)")
    middle = [rest // middle_stages] * middle_stages if middle_stages else []
    return tuple(([first] if first is not None else []) + middle + ([last] if last is not None else []))


def gqa_activation_saving_bytes_per_layer(seq: int, micro_batch: int, hidden: int, heads: int, kv_heads: int, *, tensor_parallel: int = 1,
                                          recompute: str = "none") -> float:
    """Bytes per layer Korthikanti's table over-counts for g = ``kv_heads`` < a = ``heads``: K and V are
    2·s·b·h·g/a bytes each, not 2sbh — 4·sbh·(1 − g/a)/t (0 under full recomputation)."""
    if kv_heads < 1 or heads % kv_heads:
        raise ResacctError(f"{heads} query heads are not a multiple of {kv_heads} key/value heads")
    if recompute == "full":
        return 0.0
    return 4.0 * seq * micro_batch * hidden * (1 - kv_heads / heads) / tensor_parallel


def mlp_activation_bytes_per_layer(seq: int, micro_batch: int, hidden: int, mlp: int, *, gated: bool, tensor_parallel: int = 1,
                                   sequence_parallel: bool = False, element_bytes: int = 2) -> float:
    """Bytes an MLP keeps for backward on one of t ranks: its input (E·sbh, read by the first
    linear — gate and up share it; split over t with sequence parallelism) and its f-wide tensors,
    E·sbf/t each: 2 for GeLU, 4 for SwiGLU (see the module doc). Dropout masks apart.

    >>> mlp_activation_bytes_per_layer(1, 1, 4096, 4 * 4096, gated=False) / 4096     # Korthikanti: 2 + 16 (sbh)
    18.0
    >>> mlp_activation_bytes_per_layer(1, 1, 4096, 11008, gated=True) / 4096         # Llama-2-7B: 2 + 8·f/h
    23.5
    """
    s, b, h, f, t = (_whole(name, value) for name, value in (("seq", seq), ("micro_batch", micro_batch), ("hidden", hidden), ("mlp", mlp),
                                                              ("tensor_parallel", tensor_parallel)))
    tensors = 4 if gated else 2
    return float(element_bytes * s * b * h / (t if sequence_parallel else 1) + tensors * element_bytes * s * b * f / t)


def mlp_activation_extra_bytes_per_layer(seq: int, micro_batch: int, hidden: int, mlp: int, *, gated: bool, tensor_parallel: int = 1,
                                         recompute: str = "none") -> float:
    """Bytes per layer an f-wide MLP keeps beyond Korthikanti's 4h GeLU MLP (negative: fewer);
    0 under full recomputation (only the layer's input is kept)."""
    if recompute == "full":
        return 0.0
    common = dict(tensor_parallel=tensor_parallel)
    return (mlp_activation_bytes_per_layer(seq, micro_batch, hidden, mlp, gated=gated, **common)
            - mlp_activation_bytes_per_layer(seq, micro_batch, hidden, 4 * hidden, gated=False, **common))


def plan_memory(*, parameters: float, layers: int, hidden: int, heads: int, seq: int, micro_batch: int, layout: ParallelLayout,
                recipe: str | ShardingRecipe, recompute: str, device_memory_bytes: float, reserved_bytes: float = 0.0, kv_heads: int | None = None,
                first_stage_layers: int | None = None, last_stage_layers: int | None = None, mlp: int | None = None,
                gated_mlp: bool = False) -> MemoryPlan:
    """Training state and activations on the busiest pipeline stage's GPU (see the module doc);
    ``mlp``: the MLP's width when it is not Korthikanti's 4h GeLU (``gated_mlp``: SwiGLU)."""
    chosen = get_sharding_recipe(recipe)
    if isinstance(parameters, bool) or not isinstance(parameters, (int, float)) or not math.isfinite(parameters) or parameters <= 0:
        raise ResacctError(f"parameters is {parameters!r}; expected a number > 0 such as 70e9")
    if not math.isfinite(device_memory_bytes) or device_memory_bytes <= 0:
        raise ResacctError(f"device memory is {device_memory_bytes!r} bytes; expected a number > 0")
    if not math.isfinite(reserved_bytes) or reserved_bytes < 0:
        raise ResacctError(f"reserved memory is {reserved_bytes!r} bytes; expected 0 or more")
    _check_divides(layout.tensor, heads, "heads", "tensor-parallel size")
    if kv_heads is not None and kv_heads % layout.tensor:
        raise ResacctError(f"tensor-parallel size {layout.tensor} does not divide {kv_heads} key/value heads: Megatron-LM splits the key/value "
                           f"groups over the tensor-parallel ranks and refuses this; choose a tensor-parallel size that divides {kv_heads}")
    _check_divides(layout.context, seq, "sequence length", "context-parallel size")
    stages = stage_layers(layers, layout.pipeline, first=first_stage_layers, last=last_stage_layers)
    if layout.interleaved_chunks > 1 and len(set(stages)) > 1:
        raise ResacctError(f"an interleaved schedule needs an even pipeline split; {layers} layers over {layout.pipeline} stages is {list(stages)}")
    if layout.interleaved_chunks > 1 and stages[0] % layout.interleaved_chunks:
        raise ResacctError(f"an interleaved schedule of {layout.interleaved_chunks} chunks per stage splits each stage's {stages[0]} layers "
                           f"into equal chunks (Megatron-LM's layers per virtual stage); {stages[0]} is not a multiple of "
                           f"{layout.interleaved_chunks}: choose chunks that divide {stages[0]}")
    local_seq = seq // layout.context
    common = dict(tensor_parallel=layout.tensor, sequence_parallel=layout.sequence_parallel, recompute=recompute)
    saving = gqa_activation_saving_bytes_per_layer(local_seq, 1, hidden, heads, kv_heads or heads, tensor_parallel=layout.tensor, recompute=recompute)
    saving -= 0.0 if mlp is None else mlp_activation_extra_bytes_per_layer(local_seq, 1, hidden, mlp, gated=gated_mlp, tensor_parallel=layout.tensor,
                                                                        recompute=recompute)
    plans = []
    for index, held in enumerate(stages):
        # 1F1B: stage i keeps p − i micro-batches in flight (the interleaved factor for an even split)
        held_layers = layers if len(set(stages)) == 1 else held * (layout.pipeline - index)
        per_sample = first_stage_activation_bytes(held_layers, local_seq, 1, hidden, heads, pipeline_parallel=layout.pipeline,
                                                  interleaved_chunks=layout.interleaved_chunks, **common)
        per_sample -= saving * held_layers * pipeline_activation_factor(layout.pipeline, layout.interleaved_chunks)
        parameters_per_gpu = parameters * held / layers / layout.tensor
        plans.append(MemoryPlan(layout=layout, recipe=chosen, recompute=recompute, micro_batch=int(micro_batch), parameters_per_gpu=parameters_per_gpu,
                                state=per_rank_bytes(parameters_per_gpu, chosen, layout.zero_stage, layout.data),
                                activation_bytes=per_sample * micro_batch, activation_bytes_per_sample=per_sample,
                                device_memory_bytes=float(device_memory_bytes), reserved_bytes=float(reserved_bytes), stage=index, stage_layers=stages))
    busiest = max(plans, key=lambda plan: plan.total_bytes)
    limit = min(plan.largest_micro_batch for plan in plans)
    return dataclasses.replace(busiest, micro_batch_limit=limit)


@dataclass(frozen=True)
class ParameterBreakdown:
    """Parameters by component, as a model card states them: the embeddings (token, and learned
    positions for GPT-2), each layer's attention (q, k, v, o and their biases), MLP (a mixture of
    experts: its router and every expert) and norms, the final norm, and the LM head (0 when tied
    to the token embedding: one tensor, counted once)."""

    embeddings: int
    attention_per_layer: int
    mlp_per_layer: int
    norms_per_layer: int
    layers: int
    final_norm: int
    lm_head: int
    tied_head: bool

    @property
    def per_layer(self) -> int:
        return self.attention_per_layer + self.mlp_per_layer + self.norms_per_layer

    @property
    def total(self) -> int:
        return self.embeddings + self.layers * self.per_layer + self.final_norm + self.lm_head

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "per_layer": self.per_layer, "total": self.total}


def parameter_breakdown(a: HfArchitecture) -> ParameterBreakdown:
    """The components of :func:`resacct.formulas.hf_formulas.predict_parameters` (they sum to it).

    >>> from resacct.formulas.hf_formulas import HfArchitecture
    >>> llama3_8b = HfArchitecture(family="llama", vocab=128256, hidden=4096, layers=32, heads=32, kv_heads=8, head_dim=128, mlp=14336, positions=8192)
    >>> b = parameter_breakdown(llama3_8b)
    >>> b.embeddings, b.attention_per_layer, b.mlp_per_layer, b.norms_per_layer, b.lm_head, b.total
    (525336576, 41943040, 176160768, 8192, 525336576, 8030261248)
    """
    d, f, v = a.hidden, a.mlp, a.vocab
    head = 0 if a.tied_head else v * d
    if a.family == "gpt2":
        return ParameterBreakdown(embeddings=v * d + a.positions * d, attention_per_layer=3 * d * d + 3 * d + d * d + d,
                                  mlp_per_layer=d * f + f + f * d + d, norms_per_layer=2 * 2 * d, layers=a.layers, final_norm=2 * d,
                                  lm_head=head, tied_head=a.tied_head)
    q, kv = a.heads * a.head_dim, a.kv_heads * a.head_dim
    attention = 2 * d * q + 2 * d * kv + (q + 2 * kv + d if a.attention_bias else 0)
    if a.family == "mixtral":
        mlp = d * a.experts + a.experts * 3 * d * f
    else:
        mlp = 3 * d * f + (2 * f + d if a.mlp_bias else 0)
    return ParameterBreakdown(embeddings=v * d, attention_per_layer=attention, mlp_per_layer=mlp, norms_per_layer=2 * d, layers=a.layers,
                              final_norm=d, lm_head=head, tied_head=a.tied_head)
