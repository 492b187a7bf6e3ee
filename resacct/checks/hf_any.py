"""Any transformers architecture, traced on the meta device, against the same step run for real
on the CPU (issue 33): a tiny config of each architecture — the keys of its published config.json,
sizes shrunk — built twice. **Predicted**: what ``resacct account`` answers for the model on the
meta device (:func:`resacct.account.answers.generic.account_module`: FlopCounterMode's FLOPs, a real
``torch.optim.AdamW``'s state by storage, the saved-tensor hooks' bytes and the whole step's peak on
fake CPU tensors — one traced pass where meta and fake CPU run the same step, docs/account.md "Trace
once"). **Measured**: the same counters over real CPU tensors
(:func:`resacct.account.trace.step_measurements.measure_step_once`) — the arithmetic done, the
storages allocated — and the step's peak by torch's CPU allocator
(:func:`resacct.account.peak.step_peak.measure_step_peak`). Eager attention in both (Gemma-2 and
BLOOM have no sdpa in transformers). A mixture of experts (Qwen3-MoE, DeepSeek-V3) runs
:mod:`resacct.account.load.moe_routing`'s dropless routing on both devices. Skipped without transformers.
"""

from __future__ import annotations

from typing import Any

import torch

from resacct.checks._transformers import require_transformers
from resacct.errors import ResacctError
from resacct.harness.registry import Outcome, check
from resacct.measurement.memo import shared_measurement
from resacct.training.seeding import seed_torch

#: per architecture, the keys of its published config.json (the shipped configs in resacct/hf_configs/known.yaml), sizes shrunk
TINY_CONFIGS: dict[str, dict[str, Any]] = {
    "qwen2": {"model_type": "qwen2", "vocab_size": 128, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64, "hidden_act": "silu", "rms_norm_eps": 1e-6,
              "rope_theta": 1000000.0, "use_sliding_window": False, "tie_word_embeddings": False},
    "qwen3": {"model_type": "qwen3", "vocab_size": 128, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 64, "hidden_act": "silu",
              "rms_norm_eps": 1e-6, "rope_theta": 1000000, "attention_bias": False, "tie_word_embeddings": False},
    "qwen3_moe": {"model_type": "qwen3_moe", "vocab_size": 128, "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32,
                  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 64,
                  "num_experts": 8, "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True,
                  "hidden_act": "silu", "rms_norm_eps": 1e-6, "tie_word_embeddings": False},
    "gemma2": {"model_type": "gemma2", "vocab_size": 128, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "query_pre_attn_scalar": 16, "max_position_embeddings": 64,
               "hidden_activation": "gelu_pytorch_tanh", "sliding_window": 8, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
               "tie_word_embeddings": True},
    "gemma3": {"model_type": "gemma3_text", "vocab_size": 128, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "query_pre_attn_scalar": 16, "max_position_embeddings": 64,
               "hidden_activation": "gelu_pytorch_tanh", "sliding_window": 8, "sliding_window_pattern": 2, "tie_word_embeddings": True},
    "phi3": {"model_type": "phi3", "vocab_size": 128, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 64, "original_max_position_embeddings": 64,
             "hidden_act": "silu", "sliding_window": 63, "pad_token_id": 0, "tie_word_embeddings": False},
    "olmo2": {"model_type": "olmo2", "vocab_size": 128, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 64, "hidden_act": "silu", "rms_norm_eps": 1e-6,
              "rope_theta": 500000, "tie_word_embeddings": False},
    "falcon": {"model_type": "falcon", "vocab_size": 128, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
               "multi_query": True, "parallel_attn": True, "bias": False, "alibi": False, "new_decoder_architecture": False},
    "gpt_neox": {"model_type": "gpt_neox", "vocab_size": 128, "hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2,
                 "num_attention_heads": 4, "max_position_embeddings": 64, "hidden_act": "gelu", "rotary_pct": 0.25,
                 "use_parallel_residual": True, "tie_word_embeddings": False},
    "bloom": {"model_type": "bloom", "vocab_size": 128, "n_embed": 64, "n_layer": 2, "num_attention_heads": 4},
    "deepseek_v3": {"model_type": "deepseek_v3", "vocab_size": 128, "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32,
                    "num_hidden_layers": 3, "first_k_dense_replace": 1, "num_attention_heads": 4, "num_key_value_heads": 4,
                    "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1,
                    "norm_topk_prob": True, "q_lora_rank": 32, "kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
                    "v_head_dim": 16, "max_position_embeddings": 64, "tie_word_embeddings": False},
}
_QUANTITIES = ("parameters", "forward_flops", "backward_flops", "step_flops", "state_at_step_bytes", "saved_activation_bytes", "step_peak_bytes")


@check("hf.any_architecture", evidence="measured", quantities=("parameters", "tensors", "tokens", "traced"))
def any_architecture(architecture: str, quantity: str, batch: int = 2, seq: int = 16) -> Outcome:
    """One quantity of a tiny ``architecture`` (:data:`TINY_CONFIGS`) — predicted on meta / fake
    tensors, measured on the CPU (see the module doc): ``parameters``, ``forward_flops``,
    ``backward_flops``, ``step_flops``, ``state_at_step_bytes`` (AdamW, fp32), ``saved_activation_bytes``,
    ``step_peak_bytes`` (forward, backward, AdamW step, zero_grad). Quantities: the CPU model's
    ``parameters`` and ``tensors``, ``tokens``, and ``traced`` — the prediction again, for a law
    that has no closed form across architectures (the claim: the meta trace is the CPU step)."""
    require_transformers()
    if architecture not in TINY_CONFIGS or quantity not in _QUANTITIES:
        raise ResacctError(f"architecture {architecture!r} / quantity {quantity!r}: expected one of {', '.join(TINY_CONFIGS)} / {', '.join(_QUANTITIES)}")
    predicted, measured, tensors = _step(architecture, batch, seq)
    return Outcome(measured=measured[quantity], predicted=predicted[quantity],
                   quantities={"parameters": measured["parameters"], "tensors": tensors, "tokens": batch * seq, "traced": predicted[quantity]})


def _loss(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    return model(**inputs).loss


def _adamw(parameters: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.AdamW(parameters, lr=1e-3)


def _figures(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> dict[str, int]:
    from resacct.account.trace.step_measurements import measure_step_once

    step = measure_step_once(model, lambda module: _loss(module, inputs))
    return {"parameters": sum(p.numel() for p in model.parameters()), "forward_flops": step.flops.forward_flops,
            "backward_flops": step.flops.backward_flops, "step_flops": step.flops.step_flops, "state_at_step_bytes": step.state.at_step_bytes,
            "saved_activation_bytes": int(step.saved.activation_bytes)}


@shared_measurement
def _step(architecture: str, batch: int, seq: int) -> tuple[dict[str, int], dict[str, int], int]:
    """(predicted, measured, the CPU model's parameter tensors) for one tiny architecture."""
    from resacct.account.load.hf_models import HfConfigSpec, build_hf_model
    from resacct.account.answers.generic import account_module
    from resacct.account.peak.step_peak import measure_step_peak

    spec = HfConfigSpec(name=f"tiny {architecture}", source="claim inputs", values=dict(TINY_CONFIGS[architecture]))
    meta = build_hf_model(spec, device="meta", attention="eager")
    meta.train()
    meta_ids = torch.zeros(batch, seq, dtype=torch.long, device="meta")
    account = account_module(meta, {"input_ids": meta_ids, "labels": meta_ids}, loss="model", optimizer="adamw", measure_peaks=False)
    predicted = {"parameters": account.parameters, "forward_flops": account.flops.forward_flops, "backward_flops": account.flops.backward_flops,
                 "step_flops": account.flops.step_flops, "state_at_step_bytes": account.state.at_step_bytes,
                 "saved_activation_bytes": int(account.saved.activation_bytes), "step_peak_bytes": account.step_peak.predicted.peak_bytes}
    seed_torch(0)
    cpu = build_hf_model(spec, device="cpu", attention="eager")
    cpu.train()
    ids = torch.randint(0, int(TINY_CONFIGS[architecture]["vocab_size"]), (batch, seq), generator=torch.Generator().manual_seed(0))
    measured = _figures(cpu, {"input_ids": ids, "labels": ids})
    measured["step_peak_bytes"] = measure_step_peak(cpu, {"input_ids": ids, "labels": ids}, _loss, _adamw).peak_bytes
    return predicted, measured, len(list(cpu.parameters()))

