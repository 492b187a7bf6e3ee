"""tools/gpu_record.py's step matrix (issue 31): the models it records (configs only: no weights,
no network), each step's recipe, attention kernel, batch and sequence; a step's model is built by
:func:`resacct.account.gpu.records.record_models.build_record_model` (tiny shapes in a dry run), as ``--compare`` rebuilds it.
"""

from __future__ import annotations

from typing import Any

from resacct.account.gpu.records.record_models import TINY  # noqa: F401  (re-exported: the dry run's sizes)

#: meta-llama/Llama-3.2-1B's config.json (https://huggingface.co/meta-llama/Llama-3.2-1B/blob/main/config.json), built without weights
LLAMA_32_1B = {"model_type": "llama", "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
               "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "max_position_embeddings": 131072,
               "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": True, "hidden_act": "silu",
               "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                "original_max_position_embeddings": 8192, "rope_type": "llama3"}}
#: a small grouped-query Llama (4 query heads per key/value head)
GQA_LLAMA = {"model_type": "llama", "vocab_size": 32000, "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 8,
             "num_attention_heads": 16, "num_key_value_heads": 4, "max_position_embeddings": 4096, "tie_word_embeddings": False}
#: Mixtral's shape (8 experts, 2 per token, GQA) scaled down to fit a step in seconds
MIXTRAL_SMALL = {"model_type": "mixtral", "vocab_size": 32000, "hidden_size": 1024, "intermediate_size": 2048, "num_hidden_layers": 4,
                 "num_attention_heads": 16, "num_key_value_heads": 4, "num_local_experts": 8, "num_experts_per_tok": 2,
                 "max_position_embeddings": 4096, "output_router_logits": False}
#: openai-community/gpt2's shape; dropout off (as resacct's GPT: no dropout masks, and the CPU flash kernel has no dropout)
HF_GPT2 = {"model_type": "gpt2", "vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12,
           "attn_pdrop": 0.0, "resid_pdrop": 0.0, "embd_pdrop": 0.0}

#: name → (family, model, recipe, attention, batch, seq, extra). attention: math | flash | efficient | eager (HF's own matmuls)
MATRIX: dict[str, tuple[str, Any, str, str, int, int, dict]] = {
    "gpt2-small/fp32/math": ("resacct", "gpt2-small", "fp32", "math", 4, 1024, {}),
    "gpt2-small/bf16-autocast/flash": ("resacct", "gpt2-small", "bf16-autocast", "flash", 4, 1024, {}),
    "gpt2-small/fp32/efficient/expandable": ("resacct", "gpt2-small", "fp32", "efficient", 4, 1024, {"expandable_segments": True}),
    "hf-gpt2/fp32/efficient": ("hf", HF_GPT2, "fp32", "efficient", 4, 1024, {}),
    "hf-gpt2/bf16-autocast/flash": ("hf", HF_GPT2, "bf16-autocast", "flash", 4, 1024, {}),
    # since session 27: the memory-efficient backward in 16 bits (its kernel computes delta; the grad-query accumulators in
    # float32), which cuda_scratch.efficient_backward_scratch models from the source and no record has checked yet
    "hf-gpt2/bf16-autocast/efficient": ("hf", HF_GPT2, "bf16-autocast", "efficient", 4, 1024, {}),
    "llama-3.2-1b/bf16-fp32-master/flash": ("hf", LLAMA_32_1B, "bf16-fp32-master", "flash", 2, 1024, {}),
    "llama-3.2-1b/bf16-autocast/flash": ("hf", LLAMA_32_1B, "bf16-autocast", "flash", 2, 1024, {}),
    "llama-3.2-1b-lora/bf16/flash": ("lora", LLAMA_32_1B, "bf16", "flash", 2, 1024, {}),
    "gqa-llama/fp32/math": ("hf", GQA_LLAMA, "fp32", "math", 4, 1024, {}),
    "gqa-llama/bf16/flash": ("hf", GQA_LLAMA, "bf16", "flash", 4, 1024, {}),
    "mixtral-small/bf16-autocast/eager-experts": ("hf", MIXTRAL_SMALL, "bf16-autocast", "flash", 4, 512, {"experts": "eager"}),
    "mixtral-small/bf16-autocast/batched_mm-experts": ("hf", MIXTRAL_SMALL, "bf16-autocast", "flash", 1, 256, {"experts": "batched_mm"}),
    # transformers' default on a CUDA board, what the --device answers predict (resacct/account/gpu/tracing/cuda_experts.py): last, the first a spent budget skips.
    # bf16 weights, not autocast: grouped_mm is not autocast-enabled and transformers casts its input to the weight's dtype, so under
    # autocast it is given fp32 operands, which its CUDA kernel (and its meta function) refuse: "Expected inputs of BF16 type"
    "mixtral-small/bf16/grouped_mm-experts": ("hf", MIXTRAL_SMALL, "bf16", "flash", 4, 512, {"experts": "grouped_mm"}),
}

def attention_context(attention: str, dry: bool) -> Any:
    """The sdpa backend a step names (a dry run's CPU has no memory-efficient kernel: its flash kernel instead,
    and the math kernel where the CPU's flash kernel refuses the shapes: torch 2.8's refuses grouped-query attention)."""
    import contextlib

    from torch.nn.attention import SDPBackend, sdpa_kernel
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
    if dry and attention == "efficient":
        attention = "flash"
    if dry and attention == "flash":
        return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.MATH])
    return sdpa_kernel(backends[attention]) if attention in backends else contextlib.nullcontext()


#: name → (model, weights, attention, batch, context, new tokens): a model served as ``resacct infer --device`` predicts it —
#: its weights loaded, the first prefill of batch × context tokens (cache kept), then tokens generated one at a time
SERVING: dict[str, tuple[Any, str, str, int, int, int]] = {
    "llama-3.2-1b/bf16/serve": (LLAMA_32_1B, "bf16", "flash", 1, 1024, 32),
    "gqa-llama/bf16/serve": (GQA_LLAMA, "bf16", "flash", 8, 2048, 32),
    "hf-gpt2/fp32/serve": (HF_GPT2, "fp32", "efficient", 4, 512, 32),
}
