"""Exact saved-activation bytes of one training step of :mod:`resacct.training.gpt`'s decoder, saved
tensor by saved tensor (equal to what ``saved_tensors_hooks`` records; checked in
``resacct/specs/account.claims.yaml``), and Korthikanti et al.'s s·b·h·(34 + 5·a·s/h) per layer
beside them (:func:`korthikanti_layer_activation_bytes`, :func:`korthikanti_differences`).
Notation and examples: :mod:`resacct.formulas.gpt_formulas`, which re-exports everything here.
"""

from __future__ import annotations

from dataclasses import dataclass

from resacct.errors import ResacctError
from resacct.training.gpt import GPTConfig
from resacct.formulas.gpt_flop_formulas import _positive, _sizes  # the same argument checks as the FLOPs

__all__ = [
    "SavedTerm",
    "layer_norm_stats_bytes",
    "gpt_saved_terms",
    "predict_gpt_saved_bytes",
    "gpt_layer_saved_bytes",
    "gpt_outside_layers_saved_bytes",
    "korthikanti_layer_activation_bytes",
    "korthikanti_differences",
]


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

    >>> from resacct.training.gpt import get_gpt_config
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

    >>> from resacct.training.gpt import get_gpt_config
    >>> predict_gpt_saved_bytes(get_gpt_config("gpt-nano"), 2, 16, element_bytes=2)
    161538
    """
    return sum(term.bytes for term in gpt_saved_terms(config, batch, seq, **options))  # type: ignore[arg-type]


def gpt_layer_saved_bytes(config: GPTConfig, batch: int, seq: int, *, element_bytes: int = 4, attention: str = "math", device_type: str = "cpu") -> int:
    """Bytes one transformer layer saves. For math attention:
    E·((8 + 2r)·b·s·d + a·b·s²) + 4·b·s·E_stats + s² (r = 4: 16·b·s·d, Korthikanti's "sbh").

    >>> from resacct.training.gpt import get_gpt_config
    >>> gpt_layer_saved_bytes(get_gpt_config("gpt2-small"), 1, 1024)
    101728256
    """
    terms = gpt_saved_terms(config, batch, seq, element_bytes=element_bytes, attention=attention, device_type=device_type, with_loss=False)
    return sum(term.bytes for term in terms if term.module.startswith("blocks.0."))


def gpt_outside_layers_saved_bytes(config: GPTConfig, batch: int, seq: int, *, element_bytes: int = 4, device_type: str = "cpu") -> int:
    """Bytes saved outside the layers: token ids, positions, final norm, LM head input, loss.

    >>> from resacct.training.gpt import get_gpt_config
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
    """Where resacct.training.gpt's layer (math attention, no dropout, exact GELU) departs from the
    published formula, in bytes per layer; the formula plus these terms is resacct's count.

    >>> from resacct.training.gpt import get_gpt_config
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
