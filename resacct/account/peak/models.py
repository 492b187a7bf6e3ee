"""Small models whose training-step peak resacct predicts and the CPU allocator measures — the
set the peak claims (``resacct/specs/peak.claims.yaml``) and ``benchmarks/peak_prediction.py``
run: resacct's own GPT (math or sdpa attention; checkpointed in segments, selectively by an op policy,
or only its first block), a GPT-2-small-shaped
``GPT2LMHeadModel`` at a small width, a Llama with grouped-query attention, a Mixtral with
``batched_mm`` experts, an MLP (its output's mean, or ``mse_loss``), and a non-Hugging-Face block calling
``F.scaled_dot_product_attention``. transformers models need ``resacct[hf]``.

>>> model, inputs, loss_fn = peak_model("mlp", batch=4, seq=1)
>>> tuple(inputs.shape), loss_fn(model, inputs).shape
((4, 64), torch.Size([]))
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import nn

from resacct.errors import ResacctError

__all__ = ["PEAK_MODELS", "CausalSelfAttentionBlock", "SAVED_BY_SELECTIVE_POLICY", "gpt_loss_checkpointing", "peak_model", "selective_checkpointing_missing"]

#: Model names :func:`peak_model` builds, each with what it is.
PEAK_MODELS = {
    "gpt-math": "resacct.training.gpt gpt-nano, attention as matmuls",
    "gpt-sdpa": "resacct.training.gpt gpt-nano, F.scaled_dot_product_attention",
    "gpt-checkpointed": "resacct.training.gpt gpt-nano, math attention, layers checkpointed in 2 segments",
    "gpt-checkpointed-selective": "gpt-nano, math attention, each block checkpointed with a selective policy: matmul outputs saved, the rest recomputed",
    "gpt-checkpointed-first-block": "gpt-nano, math attention, only the first of its 2 blocks checkpointed",
    "gpt2-eager": "transformers GPT2LMHeadModel (GPT-2 small's shape at width 64, 2 layers, dropout 0.1), eager attention",
    "gpt2-sdpa": "the same GPT2LMHeadModel with sdpa (dropout sends the CPU to the math kernel)",
    "llama-sdpa": "transformers LlamaForCausalLM, GQA 4/2 heads, sdpa (CPU flash kernel)",
    "llama-eager": "the same Llama with eager attention",
    "mixtral-batched-mm": "transformers MixtralForCausalLM, 4 experts, 2 per token, batched_mm experts",
    "mlp": "resacct.account.answers.generic:mlp, dim 64, hidden 256, GELU",
    "mlp-mse": "the same MLP, F.mse_loss of its output against zeros",
    "sdpa-block": "a causal self-attention block of nn.Linear and F.scaled_dot_product_attention (no transformers)",
}

LossFn = Callable[[nn.Module, Any], torch.Tensor]


class CausalSelfAttentionBlock(nn.Module):
    """Causal self-attention of ``heads`` heads over width ``dim``: QKV projection, sdpa, output projection."""

    def __init__(self, dim: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.qkv, self.out, self.heads = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim), heads

    def forward(self, x: Float[torch.Tensor, "batch seq dim"]) -> Float[torch.Tensor, "batch seq dim"]:
        batch, seq, dim = x.shape
        q, k, v = self.qkv(x).view(batch, seq, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)  # 3 × (b, h, s, e)
        mixed = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (b, h, s, e)
        return self.out(mixed.transpose(1, 2).reshape(batch, seq, dim))


#: The ops a selective checkpoint policy saves (the matmuls, costly to recompute); the rest is recomputed.
SAVED_BY_SELECTIVE_POLICY = frozenset({"aten.mm.default", "aten.addmm.default", "aten.bmm.default"})


def _selective_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
    from torch.utils.checkpoint import CheckpointPolicy

    return CheckpointPolicy.MUST_SAVE if str(op) in SAVED_BY_SELECTIVE_POLICY else CheckpointPolicy.PREFER_RECOMPUTE


def selective_checkpointing_missing() -> str | None:
    """Why this torch cannot checkpoint selectively (a policy per op), or None: torch 2.4 has no
    public ``torch.utils.checkpoint.create_selective_checkpoint_contexts``."""
    import torch.utils.checkpoint as checkpointing

    if hasattr(checkpointing, "create_selective_checkpoint_contexts"):
        return None
    return f"torch {torch.__version__} has no torch.utils.checkpoint.create_selective_checkpoint_contexts (selective activation checkpointing)"


def gpt_loss_checkpointing(model: nn.Module, tokens: torch.Tensor, targets: torch.Tensor, *, blocks: str) -> torch.Tensor:
    """Mean next-token cross-entropy of a :mod:`resacct.training.gpt` model whose blocks are
    checkpointed (``torch.utils.checkpoint``, non-reentrant): ``blocks="selective"`` every block under
    :data:`SAVED_BY_SELECTIVE_POLICY` (``create_selective_checkpoint_contexts``), ``"first"`` only the first block."""
    import functools

    from torch.utils.checkpoint import checkpoint

    positions = torch.arange(tokens.shape[1], device=tokens.device)  # (s,)
    x = model.token_embedding(tokens) + model.position_embedding(positions)  # (b, s, d)
    for index, block in enumerate(model.blocks):
        if blocks == "selective":
            from torch.utils.checkpoint import create_selective_checkpoint_contexts

            x = checkpoint(block, x, use_reentrant=False, context_fn=functools.partial(create_selective_checkpoint_contexts, _selective_policy))
        elif blocks == "first" and index == 0:
            x = checkpoint(block, x, use_reentrant=False)
        else:
            x = block(x)
    logits = model.lm_head(model.final_norm(x))  # (b, s, vocab)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def _hf_model(name: str) -> nn.Module:
    from resacct.measurement.torch_limits import transformers_unusable

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if problem := transformers_unusable():
        raise ResacctError(f"model {name!r}: {problem}")
    try:
        import transformers
    except ImportError:
        raise ResacctError(f"model {name!r} needs transformers (pip install 'resacct[hf]')") from None
    transformers.logging.set_verbosity_error()
    family, attention = name.split("-", 1)
    if family == "gpt2":
        config = transformers.GPT2Config(vocab_size=256, n_positions=128, n_embd=64, n_layer=2, n_head=4, eos_token_id=0, bos_token_id=0)
        return transformers.GPT2LMHeadModel._from_config(config, attn_implementation=attention)
    shared = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "max_position_embeddings": 128}
    if family == "llama":
        return transformers.LlamaForCausalLM._from_config(transformers.LlamaConfig(**shared), attn_implementation=attention)
    config = transformers.MixtralConfig(**shared, num_local_experts=4, num_experts_per_tok=2)
    return transformers.MixtralForCausalLM._from_config(config, attn_implementation="sdpa", experts_implementation="batched_mm")


def peak_model(name: str, *, batch: int, seq: int, seed: int = 0) -> tuple[nn.Module, Any, LossFn]:
    """(model on the CPU in training mode, its inputs, ``loss_fn(model, inputs)``) for a name of :data:`PEAK_MODELS`."""
    from resacct.account.answers.generic import mlp
    from resacct.measurement.activations import gpt_loss
    from resacct.training.gpt import build_gpt

    if name not in PEAK_MODELS:
        raise ResacctError(f"peak model {name!r}: expected one of {', '.join(PEAK_MODELS)}")
    generator = torch.Generator().manual_seed(seed)
    if name.startswith("gpt-"):
        model: nn.Module = build_gpt("gpt-nano", attention="sdpa" if name == "gpt-sdpa" else "math", seed=seed)
        tokens = torch.randint(0, 256, (batch, seq), generator=generator)
        if name.startswith("gpt-checkpointed-"):
            blocks = "selective" if name.endswith("selective") else "first"
            if blocks == "selective" and selective_checkpointing_missing():
                raise ResacctError(f"peak model {name!r}: {selective_checkpointing_missing()}")
            return model, (tokens, tokens.roll(-1, 1)), lambda m, i: gpt_loss_checkpointing(m, i[0], i[1], blocks=blocks)
        segments = 2 if name == "gpt-checkpointed" else 0
        return model, (tokens, tokens.roll(-1, 1)), lambda m, i: gpt_loss(m, i[0], i[1], checkpoint_segments=segments)
    if name == "mlp":
        return mlp(dim=64, hidden=256).train(), torch.randn(batch, 64, generator=generator), lambda m, x: m(x).mean()
    if name == "mlp-mse":
        return mlp(dim=64, hidden=256).train(), torch.randn(batch, 64, generator=generator), lambda m, x: F.mse_loss(m(x), torch.zeros_like(x))
    if name == "sdpa-block":
        return CausalSelfAttentionBlock().train(), torch.randn(batch, seq, 64, generator=generator), lambda m, x: m(x).pow(2).mean()
    model = _hf_model(name).train()
    ids = torch.randint(0, 256, (batch, seq), generator=generator)
    return model, {"input_ids": ids, "labels": ids}, lambda m, i: m(**i).loss
