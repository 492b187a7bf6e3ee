"""resacct's closed-form formulas for Hugging Face decoder architectures — GPT-2, Llama (and
Mistral, the same shapes), Mixtral (mixture of experts): parameters (total and active per
token), parameter tensors, and the matmul FLOPs of one training step. Pure arithmetic on an
:class:`HfArchitecture`; the measurements they are compared with (FlopCounterMode, storages on
the meta device) live in :mod:`resacct.account.answers.hf`.

Notation: V vocabulary, d hidden size, L layers, h query heads, g key/value heads (grouped-query
attention: g < h), e head size (d / h), f MLP width, E experts, k experts per token, P learned
positions, T = b·s tokens.

- **GPT-2**: token and position embeddings (V·d + P·d); per layer two LayerNorms (2·2d), the fused
  QKV projection d → 3d and the output projection d → d with biases, MLP d → f → d with biases
  (f = 4d unless ``n_inner``); a final LayerNorm; the LM head tied to the token embedding (no
  parameters of its own).
- **Llama / Mistral**: token embedding V·d; per layer q d → h·e, k and v d → g·e (GQA), o h·e → d,
  SwiGLU MLP (gate and up d → f, down f → d), two RMSNorms (d each); a final RMSNorm; an untied
  LM head d → V. RoPE has no parameters (its inverse frequencies are a non-persistent buffer).
- **Mixtral**: Llama's attention; per layer a router d → E and E SwiGLU experts of width f; each
  token runs k of them, so the active parameters are the total less L·(E − k)·3·d·f.

FLOPs (what FlopCounterMode counts: matmuls): forward 2·T·(every projection's in·out) plus
attention's q·kᵀ and weights·v, 4·b·h·s²·e per layer (all s² scores: the causal mask hides half,
the matmuls compute them); Mixtral's experts 2·(T·k)·3·d·f and the router 2·T·d·E per layer; the
LM head 2·T·d·V. Every weight gets its gradient and every input its gradient (the embeddings
require grad), so backward is twice forward.

>>> llama = HfArchitecture(family="llama", vocab=32000, hidden=4096, layers=32, heads=32, kv_heads=32, head_dim=128, mlp=11008, positions=4096)
>>> predict_parameters(llama)          # Llama-2-7B: 6.74 B
6738415616
>>> predict_step_flops(llama, batch=1, seq=4096).step_flops == 3 * predict_step_flops(llama, batch=1, seq=4096).forward_flops
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from resacct.errors import ResacctError

__all__ = ["FAMILIES", "HfArchitecture", "architecture_of", "predict_parameters", "predict_active_parameters", "predict_parameter_tensors",
           "HfStepFlops", "predict_step_flops"]

#: transformers ``model_type`` → resacct's formula family
FAMILIES = {"gpt2": "gpt2", "llama": "llama", "mistral": "llama", "mixtral": "mixtral"}


@dataclass(frozen=True)
class HfArchitecture:
    """The shapes resacct's formulas need, read once from a transformers config."""

    family: str  # gpt2, llama, mixtral
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    mlp: int
    positions: int  # context length (GPT-2: learned position embeddings of this many rows)
    tied_head: bool = False
    experts: int = 0
    experts_per_token: int = 0
    attention_bias: bool = False
    mlp_bias: bool = False
    activation: str = ""  # "" = the family's own (gelu_new for GPT-2, silu for Llama)
    attention_dropout: float = 0.0
    residual_dropout: float = 0.0  # GPT-2's resid_pdrop
    embedding_dropout: float = 0.0  # GPT-2's embd_pdrop
    sliding_window: int | None = None

    def __post_init__(self) -> None:
        if self.family not in set(FAMILIES.values()):
            raise ResacctError(f"architecture family {self.family!r}: expected one of {', '.join(sorted(set(FAMILIES.values())))}")
        if self.heads % self.kv_heads:
            raise ResacctError(f"{self.heads} query heads are not a multiple of {self.kv_heads} key/value heads")
        if not self.activation:
            object.__setattr__(self, "activation", "gelu_new" if self.family == "gpt2" else "silu")


def architecture_of(config: Any) -> HfArchitecture | None:
    """An :class:`HfArchitecture` from a transformers ``PretrainedConfig`` (its defaults filled
    in), or None for a ``model_type`` resacct has no formula for."""
    family = FAMILIES.get(getattr(config, "model_type", ""))
    if family is None:
        return None
    if family == "gpt2":
        d = config.n_embd
        return HfArchitecture(family="gpt2", vocab=config.vocab_size, hidden=d, layers=config.n_layer, heads=config.n_head, kv_heads=config.n_head,
                              head_dim=d // config.n_head, mlp=config.n_inner or 4 * d, positions=config.n_positions,
                              tied_head=bool(getattr(config, "tie_word_embeddings", True)), activation=config.activation_function,
                              attention_dropout=float(config.attn_pdrop), residual_dropout=float(config.resid_pdrop),
                              embedding_dropout=float(config.embd_pdrop))
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return HfArchitecture(
        family=family, vocab=config.vocab_size, hidden=config.hidden_size, layers=config.num_hidden_layers, heads=heads,
        kv_heads=getattr(config, "num_key_value_heads", None) or heads, head_dim=head_dim, mlp=config.intermediate_size,
        positions=config.max_position_embeddings, tied_head=bool(getattr(config, "tie_word_embeddings", False)),
        experts=getattr(config, "num_local_experts", 0) if family == "mixtral" else 0,
        experts_per_token=getattr(config, "num_experts_per_tok", 0) if family == "mixtral" else 0,
        # only Llama builds the biases these keys ask for; a Mistral or Mixtral config.json may carry them
        # (transformers keeps unknown keys) and its model has none
        attention_bias=config.model_type == "llama" and bool(getattr(config, "attention_bias", False)),
        mlp_bias=config.model_type == "llama" and bool(getattr(config, "mlp_bias", False)),
        activation=str(getattr(config, "hidden_act", "silu")), attention_dropout=float(getattr(config, "attention_dropout", 0.0) or 0.0),
        sliding_window=getattr(config, "sliding_window", None),
    )


def _attention_projection_weights(a: HfArchitecture) -> int:
    """q, k, v, o weights: d·h·e + 2·d·g·e + h·e·d."""
    return a.hidden * a.heads * a.head_dim * 2 + 2 * a.hidden * a.kv_heads * a.head_dim


def _per_layer_parameters(a: HfArchitecture, *, active: bool) -> int:
    d, f = a.hidden, a.mlp
    if a.family == "gpt2":
        return 2 * 2 * d + (3 * d * d + 3 * d) + (d * d + d) + (d * f + f) + (f * d + d)
    attention = _attention_projection_weights(a) + (a.heads * a.head_dim + 2 * a.kv_heads * a.head_dim + d if a.attention_bias else 0)
    swiglu = 3 * d * f + (2 * f + d if a.mlp_bias else 0)
    if a.family == "mixtral":
        experts = a.experts_per_token if active else a.experts
        return attention + d * a.experts + experts * 3 * d * f + 2 * d
    return attention + swiglu + 2 * d


def predict_parameters(a: HfArchitecture) -> int:
    """Every parameter, shared ones once (GPT-2's head is its token embedding).

    >>> gpt2 = HfArchitecture(family="gpt2", vocab=50257, hidden=768, layers=12, heads=12, kv_heads=12, head_dim=64, mlp=3072, positions=1024, tied_head=True)
    >>> predict_parameters(gpt2)      # V·d + P·d + L·(12d² + 13d) + 2d
    124439808
    """
    return _parameters(a, active=False)


def predict_active_parameters(a: HfArchitecture) -> int:
    """Parameters one token runs through: all of them for a dense model; a mixture of experts
    counts k of its E experts per layer (the router included)."""
    return _parameters(a, active=True)


def _parameters(a: HfArchitecture, *, active: bool) -> int:
    d, v = a.hidden, a.vocab
    if a.family == "gpt2":
        return v * d + a.positions * d + a.layers * _per_layer_parameters(a, active=active) + 2 * d + (0 if a.tied_head else v * d)
    return v * d + a.layers * _per_layer_parameters(a, active=active) + d + (0 if a.tied_head else v * d)


def predict_parameter_tensors(a: HfArchitecture) -> int:
    """Parameter tensors (torch.optim keeps one step counter per tensor).

    GPT-2: 2 embeddings + 12 per layer + 2 (final LayerNorm); Llama: 1 + 9 per layer (+ biases) + 1
    + 1 untied head; Mixtral: 1 + 9 per layer (4 projections, router, gate-up and down expert
    banks, 2 norms) + 1 + 1.
    """
    if a.family == "gpt2":
        return 2 + 12 * a.layers + 2 + (0 if a.tied_head else 1)
    per_layer = 9 + (4 if a.attention_bias else 0) + (3 if a.mlp_bias and a.family == "llama" else 0)
    return 1 + a.layers * per_layer + 1 + (0 if a.tied_head else 1)


@dataclass(frozen=True)
class HfStepFlops:
    """resacct's matmul FLOPs of one step, by part (forward); backward is twice forward."""

    forward_by_part: dict[str, int]

    @property
    def forward_flops(self) -> int:
        return sum(self.forward_by_part.values())

    @property
    def backward_flops(self) -> int:
        return 2 * self.forward_flops

    @property
    def step_flops(self) -> int:
        return 3 * self.forward_flops


def predict_step_flops(a: HfArchitecture, *, batch: int, seq: int) -> HfStepFlops:
    """Matmul FLOPs of one forward and backward on ``batch`` × ``seq`` tokens (all positions scored).

    >>> tiny = HfArchitecture(family="llama", vocab=128, hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, mlp=128, positions=64)
    >>> predict_step_flops(tiny, batch=2, seq=16).forward_by_part["attention scores and values"]   # 2 layers · 4·b·h·s²·e
    262144
    """
    for label, value in (("batch", batch), ("seq", seq)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ResacctError(f"{label} {value!r}: expected a whole number ≥ 1")
    tokens, d, f, layers = batch * seq, a.hidden, a.mlp, a.layers
    parts: dict[str, int] = {}
    if a.family == "gpt2":
        parts["attention projections"] = layers * 2 * tokens * 4 * d * d
        parts["MLP"] = layers * 2 * tokens * 2 * d * f
    else:
        parts["attention projections"] = layers * 2 * tokens * _attention_projection_weights(a)
        if a.family == "mixtral":
            parts["router"] = layers * 2 * tokens * d * a.experts
            parts["experts (k per token)"] = layers * 2 * tokens * a.experts_per_token * 3 * d * f
        else:
            parts["MLP"] = layers * 2 * tokens * 3 * d * f
    parts["attention scores and values"] = layers * 4 * batch * a.heads * seq * seq * a.head_dim
    parts["LM head"] = 2 * tokens * d * a.vocab
    return HfStepFlops(forward_by_part=parts)
