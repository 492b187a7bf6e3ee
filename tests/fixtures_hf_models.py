"""Raw ``transformers`` models from tiny configs (no weights, no hub) for ``resacct account
--model tests.fixtures_hf_models:FACTORY``: no wrapper, the model's own outputs and loss."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def tiny_llama(attention: str = "sdpa", layers: int = 2):
    """A LlamaForCausalLM with grouped-query attention (4 query heads, 2 key/value heads)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM._from_config(config, attn_implementation=attention)


def tiny_gpt2(attention: str = "sdpa"):
    """A GPT2LMHeadModel (Conv1D layers, tied head, learned positions)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=2, n_head=4)
    return GPT2LMHeadModel._from_config(config, attn_implementation=attention)
