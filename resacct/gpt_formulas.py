"""Exact FLOPs and saved-activation bytes of one training step of :mod:`resacct.gpt`'s decoder.

The formulas follow the model matmul by matmul and saved tensor by saved tensor, so that they
equal what PyTorch measures — FlopCounterMode for FLOPs, ``saved_tensors_hooks`` for activations
(checked in ``resacct/specs/account.claims.yaml``). Beside them, the conventions people quote:

- **6N** FLOPs per token (the lecture's rule, :func:`six_n_step_flops`);
- **6N + 12·L·d·T** per token (PaLM appendix B; nanoGPT's ``estimate_mfu``, N without the
  position embedding: :func:`palm_step_flops`);
- **s·b·h·(34 + 5·a·s/h)** bytes of activations per layer (Korthikanti et al. 2022, "Reducing
  Activation Recomputation in Large Transformer Models", §4.1: 16-bit activations, with dropout;
  :func:`korthikanti_layer_activation_bytes`) and where this model differs from it
  (:func:`korthikanti_differences`).

Notation: b batch, s sequence, d model width (Korthikanti's h), a heads, L layers, V vocabulary,
r MLP ratio, T = b·s tokens, E bytes per activation element.

>>> from resacct.gpt import get_gpt_config
>>> small = get_gpt_config("gpt2-small")
>>> flops = predict_gpt_step_flops(small, batch=1, seq=1024)
>>> flops.forward_flops, flops.backward_flops == 2 * flops.forward_flops
(291648307200, True)
>>> korthikanti_layer_activation_bytes(seq=1024, batch=1, hidden=768, heads=12)
89653248
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from resacct.errors import ResacctError
from resacct.flops import MatmulTerm
from resacct.gpt import GPTConfig

__all__ = [
    "ModuleMatmul",
    "GptStepFlops",
    "gpt_matmuls",
    "predict_gpt_step_flops",
    "gpt_matmul_parameter_count",
    "nanogpt_parameter_count",
    "six_n_step_flops",
    "palm_step_flops",
    "SavedTerm",
    "layer_norm_stats_bytes",
    "gpt_saved_terms",
    "predict_gpt_saved_bytes",
    "gpt_layer_saved_bytes",
    "gpt_outside_layers_saved_bytes",
    "korthikanti_layer_activation_bytes",
    "korthikanti_differences",
]


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ResacctError(f"{name} must be a whole number > 0, got {value!r}")
    return value


def _sizes(config: GPTConfig, batch: int, seq: int) -> tuple[int, int]:
    _positive("batch", batch)
    _positive("seq", seq)
    if seq > config.context_length:
        raise ResacctError(f"seq {seq} is longer than the model's context length {config.context_length}; expected seq ≤ {config.context_length}")
    return batch, seq


# ───────────────────────────── FLOPs ─────────────────────────────


@dataclass(frozen=True)
class ModuleMatmul:
    """One matmul of a training step and the module whose forward (or backward) runs it."""

    module: str  # e.g. "blocks.0.attention.qkv", "blocks.0.attention" (scores, values), "lm_head"
    term: MatmulTerm

    @property
    def flops(self) -> int:
        return self.term.flops


def _linear(module: str, tokens: int, width_in: int, width_out: int) -> list[ModuleMatmul]:
    """x @ Wᵀ forward; weight gradient and input gradient backward (every GPT linear needs both:
    its input descends from the embeddings, which require grad)."""
    return [
        ModuleMatmul(module, MatmulTerm("forward", f"{module} output", tokens, width_in, width_out)),
        ModuleMatmul(module, MatmulTerm("backward", f"{module} weight gradient", width_in, tokens, width_out)),
        ModuleMatmul(module, MatmulTerm("backward", f"{module} input gradient", tokens, width_out, width_in)),
    ]


def _attention(module: str, batch: int, heads: int, seq: int, head_dim: int, fused: bool) -> list[ModuleMatmul]:
    """Scores q·kᵀ and mixing weights·v, batched over b·h: each 2·(b·h·s)·e·s FLOPs forward,
    and two matmuls of the same size each in backward (gradients of both operands). The
    causal mask hides half the scores but the matmuls still compute all s² of them. A fused
    (flash) kernel keeps no s² scores: its backward computes q·kᵀ once more."""
    rows = batch * heads * seq
    recomputed = [ModuleMatmul(module, MatmulTerm("backward", f"{module} scores recomputed by the fused kernel", rows, head_dim, seq))]
    return (recomputed if fused else []) + [
        ModuleMatmul(module, MatmulTerm("forward", f"{module} scores q·kᵀ", rows, head_dim, seq)),
        ModuleMatmul(module, MatmulTerm("forward", f"{module} weights·v", rows, seq, head_dim)),
        ModuleMatmul(module, MatmulTerm("backward", f"{module} gradient of q", rows, seq, head_dim)),
        ModuleMatmul(module, MatmulTerm("backward", f"{module} gradient of k", rows, seq, head_dim)),
        ModuleMatmul(module, MatmulTerm("backward", f"{module} gradient of weights", rows, head_dim, seq)),
        ModuleMatmul(module, MatmulTerm("backward", f"{module} gradient of v", rows, seq, head_dim)),
    ]


def gpt_matmuls(config: GPTConfig, batch: int, seq: int, *, fused_attention: bool = False) -> tuple[ModuleMatmul, ...]:
    """Every matmul of one forward + backward of a :class:`resacct.gpt.GPT` on (batch, seq) tokens.

    Per layer: QKV projection d → 3d, scores and values (b·h batched), output projection d → d,
    MLP up d → r·d and down r·d → d; then the LM head d → V (tied to the token embedding, whose
    lookup and its backward are no matmuls). ``fused_attention``: ``attention="sdpa"`` run by a
    fused kernel (CPU, CUDA), whose backward recomputes the scores; on the meta device sdpa
    decomposes into the math path's matmuls.

    >>> from resacct.gpt import get_gpt_config
    >>> [m.term.what for m in gpt_matmuls(get_gpt_config("gpt-nano"), 1, 8)][:4]
    ['blocks.0.attention.qkv output', 'blocks.0.attention.qkv weight gradient', 'blocks.0.attention.qkv input gradient', 'blocks.0.attention scores q·kᵀ']
    """
    batch, seq = _sizes(config, batch, seq)
    tokens, d, hidden = batch * seq, config.d_model, config.mlp_ratio * config.d_model
    terms: list[ModuleMatmul] = []
    for layer in range(config.n_layers):
        prefix = f"blocks.{layer}"
        terms += _linear(f"{prefix}.attention.qkv", tokens, d, 3 * d)
        terms += _attention(f"{prefix}.attention", batch, config.n_heads, seq, config.head_dim, fused_attention)
        terms += _linear(f"{prefix}.attention.out", tokens, d, d)
        terms += _linear(f"{prefix}.mlp.up", tokens, d, hidden)
        terms += _linear(f"{prefix}.mlp.down", tokens, hidden, d)
    terms += _linear("lm_head", tokens, d, config.vocab_size)
    return tuple(terms)


@dataclass(frozen=True)
class GptStepFlops:
    """resacct's exact matmul FLOPs of one GPT training step, by phase and by module."""

    config: GPTConfig
    batch: int
    seq: int
    matmuls: tuple[ModuleMatmul, ...]

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    def phase_flops(self, phase: str) -> int:
        return sum(m.flops for m in self.matmuls if m.term.phase == phase)

    @property
    def forward_flops(self) -> int:
        return self.phase_flops("forward")

    @property
    def backward_flops(self) -> int:
        return self.phase_flops("backward")

    @property
    def step_flops(self) -> int:
        return self.forward_flops + self.backward_flops

    @property
    def attention_flops(self) -> int:
        """FLOPs of the score and value matmuls (forward + backward): 12·L·b·s²·d (math)."""
        return sum(m.flops for m in self.matmuls if m.module.endswith(".attention"))

    def by_module(self, phase: str | None = None) -> dict[str, int]:
        """FLOPs per module (where the matmul runs, children not included), in model order."""
        totals: dict[str, int] = defaultdict(int)
        for matmul in self.matmuls:
            if phase in (None, matmul.term.phase):
                totals[matmul.module] += matmul.flops
        return dict(totals)


def predict_gpt_step_flops(config: GPTConfig, batch: int, seq: int, *, fused_attention: bool = False) -> GptStepFlops:
    """Exact FLOPs of one step: forward 2·T·(L·(4 + 2r)·d² + V·d) + 4·L·b·s²·d; backward twice that.

    >>> from resacct.gpt import get_gpt_config
    >>> p = predict_gpt_step_flops(get_gpt_config("gpt-nano"), batch=2, seq=16)
    >>> p.forward_flops, p.backward_flops
    (7602176, 15204352)
    """
    return GptStepFlops(config=config, batch=batch, seq=seq, matmuls=gpt_matmuls(config, batch, seq, fused_attention=fused_attention))


def gpt_matmul_parameter_count(config: GPTConfig) -> int:
    """Parameters that enter a matmul: L·(4 + 2r)·d² weights and the (tied) V·d head — what 6N
    should count. Biases, LayerNorms and the position embedding are added, not multiplied.

    >>> from resacct.gpt import get_gpt_config
    >>> gpt_matmul_parameter_count(get_gpt_config("gpt2-small"))
    123532032
    """
    d = config.d_model
    return config.n_layers * (4 + 2 * config.mlp_ratio) * d * d + config.vocab_size * d


def nanogpt_parameter_count(parameters: int, config: GPTConfig) -> int:
    """nanoGPT's ``get_num_params()``: all parameters but the position embedding (the tied token
    embedding stays, as the LM head uses it).

    >>> from resacct.gpt import get_gpt_config
    >>> nanogpt_parameter_count(124439808, get_gpt_config("gpt2-small"))
    123653376
    """
    return parameters - config.context_length * config.d_model


def six_n_step_flops(parameters: int, tokens: int) -> int:
    """The lecture's rule: 6 · N · tokens for one training step.

    >>> six_n_step_flops(124439808, 1024)
    764558180352
    """
    return 6 * _positive("parameters", parameters) * _positive("tokens", tokens)


def palm_step_flops(parameters: int, config: GPTConfig, batch: int, seq: int) -> int:
    """PaLM appendix B / nanoGPT ``estimate_mfu``: (6·N + 12·L·d·s) FLOPs per token, N without
    the position embedding (nanoGPT's count), over b·s tokens.

    >>> from resacct.gpt import get_gpt_config
    >>> palm_step_flops(124439808, get_gpt_config("gpt2-small"), 1, 1024)
    875690459136
    """
    batch, seq = _sizes(config, batch, seq)
    per_token = 6 * nanogpt_parameter_count(parameters, config) + 12 * config.n_layers * config.d_model * seq
    return per_token * batch * seq


# ───────────────────────────── saved activations ─────────────────────────────


@dataclass(frozen=True)
class SavedTerm:
    """One tensor autograd keeps for backward: where it is saved, what it is, its bytes."""

    module: str
    what: str
    bytes: int


_ATTENTION_KINDS = ("math", "sdpa")


def layer_norm_stats_bytes(element_bytes: int, device_type: str) -> int:
    """Bytes of each mean / rstd element LayerNorm saves: on CPU in the input's dtype, elsewhere
    (CUDA, meta) in float32 (the kernels' accumulation type) — measured on CPU and meta.

    >>> layer_norm_stats_bytes(2, "cpu"), layer_norm_stats_bytes(2, "meta")
    (2, 4)
    """
    return element_bytes if device_type == "cpu" else 4


def _attention_terms(module: str, config: GPTConfig, batch: int, seq: int, element: int, attention: str, device_type: str) -> list[SavedTerm]:
    d_bytes = batch * seq * config.d_model * element
    if attention == "math":
        return [
            SavedTerm(module, "q (copied by reshape for bmm)", d_bytes),
            SavedTerm(module, "kᵀ (copied by reshape for bmm)", d_bytes),
            SavedTerm(module, "causal mask (bool, s²)", seq * seq),
            SavedTerm(module, "softmax output (b·a·s²), reused by weights·v", batch * config.n_heads * seq * seq * element),
            SavedTerm(module, "v (copied by reshape for bmm)", d_bytes),
        ]
    if device_type != "cpu":
        raise ResacctError(f"attention='sdpa' on {device_type!r}: resacct predicts the fused CPU kernel only; use attention='math' or device 'cpu'")
    return [
        SavedTerm(module, "qkv projection output (q, k, v views)", 3 * d_bytes),
        SavedTerm(module, "attention output, laid out (b, s, a, e): also the output projection's input", d_bytes),
        SavedTerm(module, "logsumexp (b·a·s, float32)", batch * config.n_heads * seq * 4),
    ]


def gpt_saved_terms(
    config: GPTConfig,
    batch: int,
    seq: int,
    *,
    element_bytes: int = 4,
    attention: str = "math",
    device_type: str = "cpu",
    with_loss: bool = True,
) -> tuple[SavedTerm, ...]:
    """Every tensor a GPT forward (+ cross-entropy loss) saves for backward, parameters excluded.

    ``element_bytes`` is the activations' dtype (4 float32, 2 bfloat16). Token ids and positions
    are int64; the causal mask is bool; the CPU flash kernel's logsumexp is float32.

    >>> from resacct.gpt import get_gpt_config
    >>> terms = gpt_saved_terms(get_gpt_config("gpt-nano"), batch=2, seq=16)
    >>> sum(term.bytes for term in terms)
    321924
    """
    batch, seq = _sizes(config, batch, seq)
    if attention not in _ATTENTION_KINDS:
        raise ResacctError(f"attention {attention!r}: expected one of {', '.join(_ATTENTION_KINDS)}")
    element = _positive("element_bytes", element_bytes)
    tokens, d = batch * seq, config.d_model
    x_bytes = tokens * d * element
    stats = 2 * tokens * layer_norm_stats_bytes(element_bytes, device_type)  # mean and rstd
    terms = [
        SavedTerm("token_embedding", "token ids (int64)", tokens * 8),
        SavedTerm("position_embedding", "positions (int64)", seq * 8),
    ]
    for layer in range(config.n_layers):
        p = f"blocks.{layer}"
        hidden_bytes = config.mlp_ratio * x_bytes
        terms += [
            SavedTerm(f"{p}.attention_norm", "input", x_bytes),
            SavedTerm(f"{p}.attention_norm", "mean and rstd", stats),
            SavedTerm(f"{p}.attention.qkv", "input (normalised x)", x_bytes),
            *_attention_terms(f"{p}.attention", config, batch, seq, element, attention, device_type),
            *([SavedTerm(f"{p}.attention.out", "input (heads merged: a copy)", x_bytes)] if attention == "math" else []),
            SavedTerm(f"{p}.mlp_norm", "input", x_bytes),
            SavedTerm(f"{p}.mlp_norm", "mean and rstd", stats),
            SavedTerm(f"{p}.mlp.up", "input (normalised x)", x_bytes),
            SavedTerm(f"{p}.mlp", "GELU input (r·d wide)", hidden_bytes),
            SavedTerm(f"{p}.mlp.down", "GELU output (r·d wide)", hidden_bytes),
        ]
    terms += [
        SavedTerm("final_norm", "input", x_bytes),
        SavedTerm("final_norm", "mean and rstd", stats),
        SavedTerm("lm_head", "input (normalised x)", x_bytes),
    ]
    if with_loss:
        terms += [
            SavedTerm("(loss)", "log-softmax of the logits (b·s·V)", tokens * config.vocab_size * element),
            SavedTerm("(loss)", "targets (int64)", tokens * 8),
            SavedTerm("(loss)", "total weight (0-dim)", element),
        ]
    return tuple(terms)


def predict_gpt_saved_bytes(config: GPTConfig, batch: int, seq: int, **options: object) -> int:
    """Bytes of everything a GPT step saves for backward (see :func:`gpt_saved_terms`).

    >>> from resacct.gpt import get_gpt_config
    >>> predict_gpt_saved_bytes(get_gpt_config("gpt-nano"), 2, 16, element_bytes=2)
    161538
    """
    return sum(term.bytes for term in gpt_saved_terms(config, batch, seq, **options))  # type: ignore[arg-type]


def gpt_layer_saved_bytes(config: GPTConfig, batch: int, seq: int, *, element_bytes: int = 4, attention: str = "math", device_type: str = "cpu") -> int:
    """Bytes one transformer layer saves. For math attention:
    E·((8 + 2r)·b·s·d + a·b·s²) + 4·b·s·E_stats + s² (r = 4: 16·b·s·d, Korthikanti's "sbh").

    >>> from resacct.gpt import get_gpt_config
    >>> gpt_layer_saved_bytes(get_gpt_config("gpt2-small"), 1, 1024)
    101728256
    """
    terms = gpt_saved_terms(config, batch, seq, element_bytes=element_bytes, attention=attention, device_type=device_type, with_loss=False)
    return sum(term.bytes for term in terms if term.module.startswith("blocks.0."))


def gpt_outside_layers_saved_bytes(config: GPTConfig, batch: int, seq: int, *, element_bytes: int = 4, device_type: str = "cpu") -> int:
    """Bytes saved outside the layers: token ids, positions, final norm, LM head input, loss.

    >>> from resacct.gpt import get_gpt_config
    >>> gpt_outside_layers_saved_bytes(get_gpt_config("gpt-nano"), 2, 16)
    50052
    """
    terms = gpt_saved_terms(config, batch, seq, element_bytes=element_bytes, device_type=device_type)
    return sum(term.bytes for term in terms if not term.module.startswith("blocks."))


def korthikanti_layer_activation_bytes(seq: int, batch: int, hidden: int, heads: int) -> int:
    """Korthikanti et al. 2022, eq. (1): s·b·h·(34 + 5·a·s/h) = 34·s·b·h + 5·a·s²·b bytes per
    transformer layer, for 16-bit activations with dropout (1-byte masks), no recomputation.

    >>> korthikanti_layer_activation_bytes(seq=2048, batch=1, hidden=12288, heads=96)
    2868903936
    """
    for name, value in (("seq", seq), ("batch", batch), ("hidden", hidden), ("heads", heads)):
        _positive(name, value)
    return 34 * seq * batch * hidden + 5 * heads * seq * seq * batch


def korthikanti_differences(config: GPTConfig, batch: int, seq: int, *, element_bytes: int = 2, device_type: str = "cpu") -> dict[str, int]:
    """Where resacct.gpt's layer (math attention, no dropout, exact GELU) departs from the
    published formula, in bytes per layer; the formula plus these terms is resacct's count.

    >>> from resacct.gpt import get_gpt_config
    >>> config = get_gpt_config("gpt-nano")
    >>> differences = korthikanti_differences(config, batch=2, seq=16)
    >>> korthikanti_layer_activation_bytes(16, 2, 64, 2) + sum(differences.values()) == gpt_layer_saved_bytes(config, 2, 16, element_bytes=2)
    True
    """
    batch, seq = _sizes(config, batch, seq)
    s, b, h, a = seq, batch, config.d_model, config.n_heads
    element = _positive("element_bytes", element_bytes)
    return {
        "no attention-dropout mask (a·s²·b)": -a * s * s * b,
        "no attention-dropout output (2·a·s²·b)": -2 * a * s * s * b,
        "no residual-dropout masks (2·s·b·h)": -2 * s * b * h,
        "activations of E bytes, not 2 ((E−2)·(16·s·b·h + a·s²·b))": (element - 2) * (16 * s * b * h + a * s * s * b),
        "MLP ratio r ≠ 4 ((r−4)·2·E·s·b·h)": (config.mlp_ratio - 4) * 2 * element * s * b * h,
        "LayerNorm mean and rstd (4·s·b·E_stats)": 4 * s * b * layer_norm_stats_bytes(element, device_type),
        "causal mask, bool (s²)": s * s,
    }
