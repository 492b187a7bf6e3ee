"""A small decoder-only transformer (GPT-2 shaped), written to be read top to bottom.

Token + position embeddings, ``n_layers`` pre-norm blocks of causal self-attention and an MLP,
a final LayerNorm and a language-model head tied to the token embedding. Built on the meta
device it costs no memory, so GPT-2-small-sized accounting is free::

    >>> model = build_gpt("gpt2-small", device="meta")
    >>> parameter_count(model)
    124439808

``attention="math"`` spells attention out as matmuls (what FlopCounterMode can count and
saved-tensor hooks can see); ``attention="sdpa"`` uses ``F.scaled_dot_product_attention``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

import torch
import torch.nn.functional as F
from einops import rearrange
from jaxtyping import Float, Int
from torch import nn

from resacct.errors import ResacctError, UnknownNameError
from resacct.training.models import count_parameters
from resacct.training.seeding import seed_torch

__all__ = ["GPTConfig", "GPT_CONFIGS", "GPT", "build_gpt", "get_gpt_config", "parameter_count", "gpt_parameter_count"]

Attention = Literal["math", "sdpa"]


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int
    context_length: int
    n_layers: int
    n_heads: int
    d_model: int
    mlp_ratio: int = 4
    attention: Attention = "math"

    def __post_init__(self) -> None:
        for name in ("vocab_size", "context_length", "n_layers", "n_heads", "d_model", "mlp_ratio"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ResacctError(f"GPTConfig.{name} must be a whole number > 0, got {value!r}")
        if self.d_model % self.n_heads:
            raise ResacctError(f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}")
        if self.attention not in ("math", "sdpa"):
            raise ResacctError(f"attention must be 'math' or 'sdpa', got {self.attention!r}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


GPT_CONFIGS: dict[str, GPTConfig] = {
    "gpt-nano": GPTConfig(vocab_size=256, context_length=64, n_layers=2, n_heads=2, d_model=64),
    "gpt-tiny": GPTConfig(vocab_size=1024, context_length=128, n_layers=4, n_heads=4, d_model=128),
    "gpt-small-cpu": GPTConfig(vocab_size=8192, context_length=256, n_layers=6, n_heads=6, d_model=384),
    "gpt2-small": GPTConfig(vocab_size=50257, context_length=1024, n_layers=12, n_heads=12, d_model=768),
    "gpt2-medium": GPTConfig(vocab_size=50257, context_length=1024, n_layers=24, n_heads=16, d_model=1024),
    "gpt2-large": GPTConfig(vocab_size=50257, context_length=1024, n_layers=36, n_heads=20, d_model=1280),
    "gpt2-xl": GPTConfig(vocab_size=50257, context_length=1024, n_layers=48, n_heads=25, d_model=1600),
}


def get_gpt_config(name: str) -> GPTConfig:
    try:
        return GPT_CONFIGS[name]
    except KeyError:
        raise UnknownNameError("model config", name, list(GPT_CONFIGS)) from None


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.out = nn.Linear(config.d_model, config.d_model)

    def forward(self, x: Float[torch.Tensor, "batch seq d_model"]) -> Float[torch.Tensor, "batch seq d_model"]:
        heads = self.config.n_heads
        q, k, v = rearrange(self.qkv(x), "b s (three h e) -> three b h s e", three=3, h=heads)  # each (b, h, s, e)
        if self.config.attention == "sdpa":
            mixed = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (b, h, s, e)
        else:
            scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (b, h, s, s)
            seq = x.shape[1]
            causal = torch.ones(seq, seq, dtype=torch.bool, device=x.device).tril()  # (s, s)
            weights = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)  # (b, h, s, s)
            mixed = weights @ v  # (b, h, s, e)
        return self.out(rearrange(mixed, "b h s e -> b s (h e)"))  # (b, s, d_model)


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.up = nn.Linear(config.d_model, config.mlp_ratio * config.d_model)
        self.down = nn.Linear(config.mlp_ratio * config.d_model, config.d_model)

    def forward(self, x: Float[torch.Tensor, "batch seq d_model"]) -> Float[torch.Tensor, "batch seq d_model"]:
        return self.down(F.gelu(self.up(x)))  # (b, s, 4d) → (b, s, d)


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.attention_norm = nn.LayerNorm(config.d_model)
        self.attention = CausalSelfAttention(config)
        self.mlp_norm = nn.LayerNorm(config.d_model)
        self.mlp = MLP(config)

    def forward(self, x: Float[torch.Tensor, "batch seq d_model"]) -> Float[torch.Tensor, "batch seq d_model"]:
        x = x + self.attention(self.attention_norm(x))  # (b, s, d)
        return x + self.mlp(self.mlp_norm(x))  # (b, s, d)


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.token_embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.position_embedding = nn.Embedding(config.context_length, config.d_model)
        self.blocks = nn.ModuleList([Block(config) for _ in range(config.n_layers)])
        self.final_norm = nn.LayerNorm(config.d_model)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.lm_head.weight = self.token_embedding.weight  # tied: one (vocab, d_model) matrix

    def forward(self, tokens: Int[torch.Tensor, "batch seq"]) -> Float[torch.Tensor, "batch seq vocab"]:
        seq = tokens.shape[1]
        if seq > self.config.context_length:
            raise ResacctError(f"sequence of {seq} tokens is longer than the context length {self.config.context_length}")
        positions = torch.arange(seq, device=tokens.device)  # (s,)
        x = self.token_embedding(tokens) + self.position_embedding(positions)  # (b, s, d)
        for block in self.blocks:
            x = block(x)  # (b, s, d)
        return self.lm_head(self.final_norm(x))  # (b, s, vocab)


def build_gpt(config: GPTConfig | str, *, device: str | torch.device = "cpu", attention: Attention | None = None,
              seed: int | None = 0) -> GPT:
    """A GPT for ``config`` (a GPTConfig or a name from GPT_CONFIGS) on ``device`` (``"meta"``: no memory)."""
    resolved = get_gpt_config(config) if isinstance(config, str) else config
    if attention is not None:
        resolved = replace(resolved, attention=attention)
    if seed is not None and str(device) != "meta":
        seed_torch(seed)
    with torch.device(device):
        return GPT(resolved)


#: Parameters of a model, each shared tensor (the tied LM head) counted once.
parameter_count = count_parameters


def gpt_parameter_count(config: GPTConfig) -> int:
    """The formula: embeddings + L·(12d² + 13d) + final norm (2d); the LM head is tied.

    Per block: LayerNorms 2·2d, QKV 3d² + 3d, output d² + d, MLP 8d² + 5d (ratio 4)."""
    d, r = config.d_model, config.mlp_ratio
    per_block = 4 * d + (3 * d * d + 3 * d) + (d * d + d) + (2 * r * d * d + r * d + d)
    return config.vocab_size * d + config.context_length * d + config.n_layers * per_block + 2 * d
