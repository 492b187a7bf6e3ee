"""Exact FLOPs of one training step of :mod:`resacct.training.gpt`'s decoder, matmul by matmul (equal to
what FlopCounterMode measures; checked in ``resacct/specs/account.claims.yaml``), and the
conventions people quote beside them: 6N per token (:func:`six_n_step_flops`) and PaLM's
6N + 12·L·d·T (:func:`palm_step_flops`). Notation and examples: :mod:`resacct.formulas.gpt_formulas`,
which re-exports everything here.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from resacct.errors import ResacctError
from resacct.formulas.flops import MatmulTerm
from resacct.training.gpt import GPTConfig

__all__ = [
    "ModuleMatmul",
    "GptStepFlops",
    "gpt_matmuls",
    "predict_gpt_step_flops",
    "gpt_matmul_parameter_count",
    "nanogpt_parameter_count",
    "six_n_step_flops",
    "palm_step_flops",
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
    """Every matmul of one forward + backward of a :class:`resacct.training.gpt.GPT` on (batch, seq) tokens.

    Per layer: QKV projection d → 3d, scores and values (b·h batched), output projection d → d,
    MLP up d → r·d and down r·d → d; then the LM head d → V (tied to the token embedding, whose
    lookup and its backward are no matmuls). ``fused_attention``: ``attention="sdpa"`` run by a
    fused kernel (CPU, CUDA), whose backward recomputes the scores; on the meta device sdpa
    decomposes into the math path's matmuls.

    >>> from resacct.training.gpt import get_gpt_config
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

    >>> from resacct.training.gpt import get_gpt_config
    >>> p = predict_gpt_step_flops(get_gpt_config("gpt-nano"), batch=2, seq=16)
    >>> p.forward_flops, p.backward_flops
    (7602176, 15204352)
    """
    return GptStepFlops(config=config, batch=batch, seq=seq, matmuls=gpt_matmuls(config, batch, seq, fused_attention=fused_attention))


def gpt_matmul_parameter_count(config: GPTConfig) -> int:
    """Parameters that enter a matmul: L·(4 + 2r)·d² weights and the (tied) V·d head — what 6N
    should count. Biases, LayerNorms and the position embedding are added, not multiplied.

    >>> from resacct.training.gpt import get_gpt_config
    >>> gpt_matmul_parameter_count(get_gpt_config("gpt2-small"))
    123532032
    """
    d = config.d_model
    return config.n_layers * (4 + 2 * config.mlp_ratio) * d * d + config.vocab_size * d


def nanogpt_parameter_count(parameters: int, config: GPTConfig) -> int:
    """nanoGPT's ``get_num_params()``: all parameters but the position embedding (the tied token
    embedding stays, as the LM head uses it).

    >>> from resacct.training.gpt import get_gpt_config
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

    >>> from resacct.training.gpt import get_gpt_config
    >>> palm_step_flops(124439808, get_gpt_config("gpt2-small"), 1, 1024)
    875690459136
    """
    batch, seq = _sizes(config, batch, seq)
    per_token = 6 * nanogpt_parameter_count(parameters, config) + 12 * config.n_layers * config.d_model * seq
    return per_token * batch * seq
