"""peft's false "rank_pattern keys ... were ignored" on a fused-experts MoE (issue seen under `resacct lora --hf-config
deepseek-v3`: two RuntimeWarnings from peft/tuners/tuners_utils.py reached the user). peft converts DeepSeek-V3's fused
``experts.gate_up_proj`` (a 3-D parameter) into ``target_parameters`` with ``rank_pattern {".*\\.gate_up_proj": 2r}``, then
checks the pattern against targeted *modules* only and warns it was ignored. It was applied: measured here, gate_up_proj's
lora_A holds 2r rows per expert and down_proj's r. resacct's builder filters that one warning and nothing else."""

from __future__ import annotations

import warnings

import pytest

pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

from resacct.account.trace.lora_step import build_lora_model  # noqa: E402

RANK = 4
EXPERTS = 4


def _tiny_deepseek_v3():
    return transformers.AutoConfig.for_model(
        "deepseek_v3", hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, n_routed_experts=EXPERTS, num_experts_per_tok=2, first_k_dense_replace=1, vocab_size=128, q_lora_rank=16,
        kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, n_group=1, topk_group=1)


def test_the_fused_experts_get_their_pattern_rank_and_no_false_warning_reaches_the_user():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = build_lora_model(_tiny_deepseek_v3(), rank=RANK, targets=("all-linear",), base="fp32")
    assert not [w for w in caught if "pattern keys did not match" in str(w.message)], [str(w.message) for w in caught]
    shapes = {name: tuple(parameter.shape) for name, parameter in model.named_parameters() if "layers.1.mlp.experts" in name and "lora_A" in name}
    rows = sorted(shape[0] for shape in shapes.values())
    if rows != sorted([2 * RANK * EXPERTS, RANK * EXPERTS]):  # another peft may wrap the experts otherwise: say what it did
        pytest.skip(f"this peft wraps the fused experts otherwise ({shapes}); the pattern's rank is not what this test reads")
    assert rows == [RANK * EXPERTS, 2 * RANK * EXPERTS]  # down_proj r per expert, gate_up_proj 2r per expert: the pattern applied


def test_another_warning_of_peft_still_reaches_the_user(monkeypatch: pytest.MonkeyPatch):
    """The filter names peft's one message: peft stubbed to warn it and another RuntimeWarning, only the other one passes."""
    import peft

    real = peft.get_peft_model

    def warning_get_peft_model(model, config, *args, **kwargs):  # type: ignore[no-untyped-def]
        warnings.warn("The following rank_pattern keys did not match any targeted module and were ignored: ['x'].", RuntimeWarning)
        warnings.warn("target_modules=['no_such_proj'] were set but no module was matched.", RuntimeWarning)
        return real(model, config, *args, **kwargs)

    monkeypatch.setattr(peft, "get_peft_model", warning_get_peft_model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build_lora_model(_tiny_deepseek_v3(), rank=RANK, targets=("q_a_proj",), base="fp32")
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert any("no_such_proj" in message for message in messages) and not any("rank_pattern" in message for message in messages), messages
