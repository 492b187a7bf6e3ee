"""Trace once (issue 34) for ``resacct lora``: the step's FLOPs are counted on the fake CPU pass that
predicts its peak (:class:`resacct.account.trace.fake_pass.FakeStepRecorder` with no recipe), not on a
pass of their own. They must be what FlopCounterMode counts over the same peft step run for real on the
CPU (resacct's tracer filling sdpa's fused kernel from its shapes, as for every step it counts)."""

from __future__ import annotations

import warnings

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")

from resacct.account.load.hf_models import HfConfigSpec, transformers_config  # noqa: E402
from resacct.account.trace.lora_step import build_lora_model, lora_loss, lora_step_inputs, trace_lora_step  # noqa: E402
from resacct.account.trace.step_measurements import trace_step_flops  # noqa: E402

LLAMA = {"model_type": "llama", "vocab_size": 128, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64, "tie_word_embeddings": False}
MIXTRAL = {"model_type": "mixtral", "vocab_size": 128, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64, "num_local_experts": 4,
           "num_experts_per_tok": 2, "tie_word_embeddings": False}
GPT2 = {"model_type": "gpt2", "vocab_size": 128, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 64}

CASES = [
    pytest.param(LLAMA, ("q_proj", "v_proj"), "fp32", False, id="llama-fp32"),
    pytest.param(LLAMA, ("all-linear",), "bf16", False, id="llama-bf16-all-linear"),
    pytest.param(LLAMA, ("q_proj", "v_proj"), "fp32", True, id="llama-checkpointed"),
    pytest.param(MIXTRAL, ("q_proj", "v_proj"), "fp32", False, id="mixtral"),
    pytest.param(GPT2, ("c_attn",), "fp32", False, id="gpt2"),
]


@pytest.mark.parametrize(("values", "targets", "base", "checkpointed"), CASES)
@pytest.mark.slow  # 5 cases, 4.0 s in the quick tier (-n 2, session 25): the tier's 0.7 s rule (tests/quick_tier.py)
def test_the_lora_steps_flops_are_flopcountermodes_on_the_real_cpu_step(values: dict, targets: tuple[str, ...], base: str,
                                                                         checkpointed: bool) -> None:
    config = transformers_config(HfConfigSpec(name="tiny", source="test", values=dict(values)))
    traced = trace_lora_step(config, rank=4, targets=targets, base=base, batch=2, seq=16, gradient_checkpointing=checkpointed, layers="all")
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = build_lora_model(config, rank=4, targets=targets, base=base, device="cpu", gradient_checkpointing=checkpointed)
        inputs = lora_step_inputs(config, batch=2, seq=16, device="cpu")
        real = trace_step_flops(model, lambda: lora_loss(model, inputs))
    assert real.forward_flops > 0 and real.backward_flops > 0
    assert (traced.forward_flops, traced.backward_flops) == (real.forward_flops, real.backward_flops)
