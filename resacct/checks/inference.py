"""Inference memory measured on a real transformers ``generate`` loop on the CPU: a tiny
Llama-like model built from a config (no weights downloaded), greedy decoding, and the keys and
values its cache holds when the loop returns, counted by storage — beside
:mod:`resacct.formulas.kv_cache`. Skipped (not measurable) when transformers is not installed.
"""

from __future__ import annotations

import functools

import torch

from resacct.checks._transformers import require_transformers
from resacct.errors import ResacctError
from resacct.harness.registry import Outcome, check
from resacct.training.seeding import seed_torch

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_CACHES = ("dynamic", "static")


_QUANTITIES = ("kv_cache_bytes", "weight_bytes")


@check("inference.generate_kv_cache", evidence="measured", quantities=("heads", "tokens_held", "element_bytes", "parameters"))
def generate_kv_cache(layers: int, kv_heads: int, groups: int, head_dim: int, batch: int, prompt: int, new_tokens: int,
                      dtype: str = "bfloat16", cache: str = "dynamic", quantity: str = "kv_cache_bytes") -> Outcome:
    """One quantity of a real transformers ``generate`` loop (greedy, exactly ``new_tokens`` new
    tokens, ``cache`` = dynamic or static) on a tiny LlamaForCausalLM in ``dtype`` with
    ``kv_heads`` key/value heads each shared by ``groups`` query heads: ``kv_cache_bytes``, the
    distinct storages of every layer's keys and values when the loop returns (predicted:
    resacct's KV-cache formula at ``prompt + new_tokens − 1`` tokens), or ``weight_bytes``, the
    model's parameter storages (predicted: resacct's bytes for its format). Quantities: the query
    heads, the tokens the cache's tensors hold, bytes per element, the parameters by storage."""
    require_transformers()
    if dtype not in _DTYPES or cache not in _CACHES or quantity not in _QUANTITIES:
        raise ResacctError(f"dtype {dtype!r} / cache {cache!r} / quantity {quantity!r}: expected one of {', '.join(_DTYPES)} / "
                           f"{', '.join(_CACHES)} / {', '.join(_QUANTITIES)}")
    outcomes = _generate_kv_cache(layers, kv_heads * groups, kv_heads, head_dim, batch, prompt, new_tokens, dtype, cache)
    return outcomes[quantity]


@functools.lru_cache(maxsize=8)
def _generate_kv_cache(layers: int, heads: int, kv_heads: int, head_dim: int, batch: int, prompt: int, new_tokens: int, dtype: str,
                       cache: str) -> dict[str, Outcome]:
    from transformers import LlamaConfig, LlamaForCausalLM

    from resacct.formulas.kv_cache import generate_cache_tokens, kv_cache_bytes, weight_bytes
    from resacct.measurement.memory import distinct_storage_bytes

    config = LlamaConfig(vocab_size=64, hidden_size=heads * head_dim, head_dim=head_dim, intermediate_size=2 * heads * head_dim,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         max_position_embeddings=prompt + new_tokens + 8, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    seed_torch(0)
    model = LlamaForCausalLM._from_config(config, dtype=_DTYPES[dtype]).eval()
    ids = torch.randint(3, 64, (batch, prompt), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             do_sample=False, return_dict_in_generate=True, cache_implementation=cache)
    held = getattr(out, "cache", None) or out.past_key_values
    tensors = [t for layer in held.layers for t in (layer.keys, layer.values)]
    element = tensors[0].element_size()
    parameters = list(model.parameters())
    predicted = kv_cache_bytes(batch=batch, tokens=generate_cache_tokens(prompt=prompt, new_tokens=new_tokens), layers=layers,
                               kv_heads=kv_heads, head_dim=head_dim, element_bytes=element)
    count = sum(p.numel() for p in parameters)
    quantities = {"heads": heads, "tokens_held": int(tensors[0].shape[-2]), "element_bytes": element, "parameters": count}
    return {"kv_cache_bytes": Outcome(measured=distinct_storage_bytes(tensors), predicted=predicted, quantities=quantities),
            "weight_bytes": Outcome(measured=distinct_storage_bytes(parameters), predicted=weight_bytes(count, dtype), quantities=quantities)}
