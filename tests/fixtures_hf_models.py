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


def tiny_bert():
    """A BertForMaskedLM: a transformers model of an architecture resacct has no formula for."""
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, max_position_embeddings=32)
    return BertForMaskedLM._from_config(config)


def tiny_mistral(sliding_window: int = 8):
    """A MistralForCausalLM with grouped-query attention and a sliding window of ``sliding_window`` tokens."""
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, max_position_embeddings=64, sliding_window=sliding_window)
    return MistralForCausalLM._from_config(config, attn_implementation="sdpa")


def tiny_mixtral(experts_implementation: str = "batched_mm"):
    """A MixtralForCausalLM, 4 experts, 2 per token (``experts_implementation``: transformers' kernel)."""
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           max_position_embeddings=64, num_local_experts=4, num_experts_per_tok=2)
    return MixtralForCausalLM._from_config(config, attn_implementation="sdpa", experts_implementation=experts_implementation)


def tiny_llama_classifier():
    """A LlamaForSequenceClassification with input_ids of 2 × 8: Llama's layers under another head."""
    import torch
    from transformers import LlamaConfig, LlamaForSequenceClassification

    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0)
    return LlamaForSequenceClassification._from_config(config), {"input_ids": torch.ones(2, 8, dtype=torch.long)}
