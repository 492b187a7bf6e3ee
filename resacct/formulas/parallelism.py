"""Activation memory under tensor, sequence and pipeline parallelism and recomputation
(Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
§4–5, eq. 1–6, Table 2), in bytes, for a GPT layer stored in 16-bit with 1-byte dropout masks.

Per transformer layer, s sequence, b micro-batch, h hidden, a heads, t tensor-parallel size:

=========================================  ==============================
no parallelism                             sbh·(34 + 5as/h)
tensor parallel                            sbh·(10 + 24/t + 5as/(ht))
tensor + sequence parallel                 sbh·(34/t + 5as/(ht))
tensor parallel + selective recompute      sbh·(10 + 24/t)
tensor + sequence + selective recompute    sbh·34/t
full recomputation                         sbh·2
=========================================  ==============================

Under a 1F1B pipeline schedule the first stage holds p micro-batches of L/p layers: L layers'
worth whatever p is (eq. 5); an interleaved schedule with m chunks per stage multiplies that by
1 + (p−1)/(p·m).

What the formulas leave out (their authors say so): LayerNorm's mean and variance (2sb values a
norm), the embeddings' dropout and the output layer (< 0.01% for their 22B model), allocator
fragmentation, and the temporaries of the backward pass.

>>> activation_bytes_per_layer(seq=2048, micro_batch=1, hidden=12288, heads=96) / (2048 * 12288)   # GPT-3: 34 + 80
114.0
>>> activation_bytes_per_layer(2048, 1, 12288, 96, tensor_parallel=8, sequence_parallel=True, recompute="selective") / (2048 * 12288)
4.25
"""

from __future__ import annotations

from dataclasses import dataclass

from resacct.errors import ResacctError
from resacct.formulas.validation import whole_number as _whole
from resacct.formulas.utilization import RECOMPUTE_MODES

__all__ = [
    "activation_bytes_per_layer",
    "pipeline_activation_factor",
    "first_stage_activation_bytes",
    "selective_recompute_memory_saving",
    "torch_layer_saved_bytes",
    "zero_paper_activation_bytes",
    "ParallelLayout",
]


def activation_bytes_per_layer(seq: int, micro_batch: int, hidden: int, heads: int, *, tensor_parallel: int = 1,
                               sequence_parallel: bool = False, recompute: str = "none") -> float:
    """Bytes of activations one transformer layer keeps for its backward pass on one
    tensor-parallel rank (Korthikanti et al. 2022, Table 2). ``recompute`` is "none",
    "selective" (the attention core — QKᵀ, softmax, its dropout, attention·V — is recomputed) or
    "full" (only the layer's input is kept)."""
    s, b, h, a, t = (_whole(name, value) for name, value in
                     (("seq", seq), ("micro_batch", micro_batch), ("hidden", hidden), ("heads", heads), ("tensor_parallel", tensor_parallel)))
    if recompute not in RECOMPUTE_MODES:
        raise ResacctError(f"recompute is {recompute!r}; expected one of {', '.join(RECOMPUTE_MODES)}")
    sbh = s * b * h
    if recompute == "full":
        return 2.0 * sbh
    replicated = 10 / t if sequence_parallel else 10  # LayerNorm inputs, dropout masks, the inputs of QKV and h→4h
    attention_core = 0.0 if recompute == "selective" else 5 * a * s / (h * t)
    return sbh * (replicated + 24 / t + attention_core)


def pipeline_activation_factor(pipeline_parallel: int = 1, interleaved_chunks: int = 1) -> float:
    """How many layers' worth of activations the first pipeline stage holds, per layer of the
    model: 1 for 1F1B (p micro-batches × L/p layers), 1 + (p−1)/(p·m) for the interleaved
    schedule with m model chunks per stage (Korthikanti et al. 2022 §4.2.3)."""
    p, m = _whole("pipeline_parallel", pipeline_parallel), _whole("interleaved_chunks", interleaved_chunks)
    return 1.0 if m == 1 else 1 + (p - 1) / (p * m)


def first_stage_activation_bytes(layers: int, seq: int, micro_batch: int, hidden: int, heads: int, *, tensor_parallel: int = 1,
                                 sequence_parallel: bool = False, recompute: str = "none", pipeline_parallel: int = 1,
                                 interleaved_chunks: int = 1) -> float:
    """Activation bytes on the busiest GPU: the first pipeline stage (eq. 5 and 6)."""
    per_layer = activation_bytes_per_layer(seq, micro_batch, hidden, heads, tensor_parallel=tensor_parallel,
                                           sequence_parallel=sequence_parallel, recompute=recompute)
    return per_layer * _whole("layers", layers) * pipeline_activation_factor(pipeline_parallel, interleaved_chunks)


def selective_recompute_memory_saving(seq: int, hidden: int, heads: int) -> float:
    """Fraction of a layer's activations that selective recomputation frees: (5as/h)/(34 + 5as/h)
    (Korthikanti et al. 2022 §5: 70% for GPT-3, 65% for MT-NLG)."""
    keep = activation_bytes_per_layer(seq, 1, hidden, heads, recompute="selective")
    return 1 - keep / activation_bytes_per_layer(seq, 1, hidden, heads)


def torch_layer_saved_bytes(seq: int, micro_batch: int, hidden: int, heads: int, *, recompute: str = "none", tensor_parallel: int = 1,
                            sequence_parallel: bool = False, gathered_inputs_kept: int = 0, dropout_mask_bytes: int = 1,
                            layernorm_statistic_bytes: int = 0, causal_mask_bytes: int = 0) -> float:
    """What an eager PyTorch GPT layer (16-bit activations, dropout on, no tensor parallelism)
    saves for backward: Korthikanti's terms with the three dropout masks at
    ``dropout_mask_bytes`` an element (Korthikanti: 1; PyTorch's CPU dropout keeps its mask in
    the input's dtype: 2 for bf16), the two LayerNorms' mean and reciprocal std (2 × 2·s·b
    values at ``layernorm_statistic_bytes``; Korthikanti leaves them out) and a causal mask of
    s² elements kept by ``masked_fill`` (``causal_mask_bytes`` each; none in a fused kernel).
    With ``recompute="selective"`` the attention core is not kept (nor its dropout mask and
    causal mask). On one of ``tensor_parallel`` ranks (Megatron's column/row split, no sequence
    parallelism) the LayerNorm and linear inputs, the two residual-branch dropout masks, the
    statistics and the causal mask stay whole; the rest is divided by t. With the defaults this
    is Table 2's first row (or sbh·34 when selective); with t > 1, its second (or fourth).
    With ``sequence_parallel`` the LayerNorms, their statistics and the residual-branch dropout
    masks are split over the sequence too; Korthikanti keeps the column-parallel linears' inputs
    as sequence shards (re-gathered in the backward pass: Table 2's third row), whereas an
    implementation that keeps each all-gathered input whole adds ``gathered_inputs_kept`` × 2sbh.

    >>> torch_layer_saved_bytes(64, 2, 128, 4, dropout_mask_bytes=2, layernorm_statistic_bytes=2, causal_mask_bytes=1)
    791552.0
    """
    s, b, h, a, t = (_whole(name, value) for name, value in
                     (("seq", seq), ("micro_batch", micro_batch), ("hidden", hidden), ("heads", heads), ("tensor_parallel", tensor_parallel)))
    if recompute not in ("none", "selective"):
        raise ResacctError(f"recompute is {recompute!r}; a single eager layer is measured with none or selective")
    sbh = s * b * h
    norms_and_masks = 4 + 2 * dropout_mask_bytes  # LayerNorm inputs 2+2, the two residual-branch masks
    linear_inputs = 4  # the QKV and h→4h inputs, 2+2
    split = 24  # Q, K, V 6; projection input 2; GELU input 8; 4h→h input 8
    statistics = 4 * s * b * layernorm_statistic_bytes
    if sequence_parallel:
        whole = 2 * gathered_inputs_kept
        kept = sbh * ((norms_and_masks + split + (0 if gathered_inputs_kept else linear_inputs)) / t + whole) + statistics / t
    else:
        kept = sbh * (norms_and_masks + linear_inputs + split / t) + statistics
    if recompute == "none":
        kept += a * s * s * b * (4 + dropout_mask_bytes) / t + s * s * causal_mask_bytes
    return float(kept)


def zero_paper_activation_bytes(layers: int, seq: int, micro_batch: int, hidden: int, *, recompute: str = "none",
                                element_bytes: int = 2) -> float | None:
    """A GPT-2-like model's activations as the ZeRO paper estimates them (Rajbhandari et al. 2020,
    arXiv:1910.02054), for the whole model, no model parallelism; None for ``recompute="selective"``
    (the paper has no such estimate).

    - ``"none"`` (§3.2, footnote 3): "the total activations is about 12 × hidden_dim × batch ×
      seq_length × transformer_layers". The footnote prints no unit; the paper's own example (the
      1.5B GPT-2 — 48 layers, hidden 1600, Table 4 — at sequence 1K and batch 32 "requires about
      60 GB") holds with 16-bit values (2 bytes: 60.4 GB), not with bytes (30.2 GB): 12·h·b·s·L
      values × ``element_bytes``.
    - ``"full"`` (§8: "we checkpoint the input activation for each transformer block"): one
      layer input of b·s·h values per layer, L·b·s·h × ``element_bytes`` — Korthikanti's sbh·2 per layer.

    >>> zero_paper_activation_bytes(48, 1024, 32, 1600) / 1e9          # §3.2: "about 60 GB"
    60.3979776
    >>> zero_paper_activation_bytes(48, 1024, 32, 1600, recompute="full") / 1e9
    5.0331648
    """
    L, s, b, h, e = (_whole(name, value) for name, value in
                     (("layers", layers), ("seq", seq), ("micro_batch", micro_batch), ("hidden", hidden), ("element_bytes", element_bytes)))
    if recompute not in RECOMPUTE_MODES:
        raise ResacctError(f"recompute is {recompute!r}; expected one of {', '.join(RECOMPUTE_MODES)}")
    if recompute == "selective":
        return None
    values_per_layer_per_token = 1 if recompute == "full" else 12
    return float(values_per_layer_per_token * h * b * s * L * e)


@dataclass(frozen=True)
class ParallelLayout:
    """How a run splits over GPUs: tensor (TP) × pipeline (PP) × context (CP) × data (DP), with a
    ZeRO stage over the data-parallel ranks.

    >>> ParallelLayout(tensor=8, pipeline=16, data=64).world_size   # Llama 3 405B, 8K GPUs
    8192
    """

    tensor: int = 1
    pipeline: int = 1
    data: int = 1
    context: int = 1
    zero_stage: int = 0
    sequence_parallel: bool = False
    interleaved_chunks: int = 1

    def __post_init__(self) -> None:
        for name in ("tensor", "pipeline", "data", "context", "interleaved_chunks"):
            _whole(name, getattr(self, name))
        if self.zero_stage not in (0, 1, 2, 3) or isinstance(self.zero_stage, bool):
            raise ResacctError(f"zero_stage is {self.zero_stage!r}; expected 0, 1, 2 or 3")
        if self.sequence_parallel and self.tensor == 1:
            raise ResacctError("sequence parallelism splits the tensor-parallel group's replicated activations: it needs tensor > 1")

    @property
    def world_size(self) -> int:
        return self.tensor * self.pipeline * self.data * self.context

    @property
    def model_parallel(self) -> int:
        """GPUs that share one copy of the model: TP × PP (× CP, which splits the sequence)."""
        return self.tensor * self.pipeline * self.context
